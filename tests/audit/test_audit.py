"""Empirical DP audits: every block of the real mechanisms passes, broken variants are caught.

Recipe of ``spec/privacy.md``: D0 = 50 records, D1 = D0 + a canary 100x the
clip along e1; 20k draws per side (vectorised); Clopper-Pearson with a
Bonferroni correction over thresholds and blocks (alpha = 0.05).  Power:
N ~ 55 / ((k - 1) mu_c)^2 draws per side catch a true/claimed ratio k; with
split="equal" each block's claim mu_c is >= 0.15 at eps >= 1, so a ratio of
2 needs ~2.5k draws and 20k leave a wide margin.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms import GaussianMechanism, GeometricCountNoise, LaplaceCountNoise
from privfed.audit import audit, audit_gaussian_blocks, audit_scores

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'", "ignore:calibration='classic'")

SECOND = ("sums", "counts", "second")
DRAWS = 20000


class HalvedNoise(GaussianMechanism):
    """Broken: adds half the noise it claims."""

    def _add_noise(self, arr, block, sigma, rng):
        return super()._add_noise(arr, block, sigma / 2, rng)


class NoClipping(GaussianMechanism):
    """Broken: claims clipping but releases raw features."""

    def clip(self, features):
        super().clip(features)
        return np.asarray(features, dtype=np.float64)


class SecondWithC(GaussianMechanism):
    """Broken: second moment calibrated with sensitivity c instead of c^2."""

    def _add_noise(self, arr, block, sigma, rng):
        return super()._add_noise(arr, block, sigma / self.clip_bound if block == "second" else sigma, rng)


class CountsInClear(GaussianMechanism):
    """Broken: counts left un-noised."""

    def _add_noise(self, arr, block, sigma, rng):
        return super()._add_noise(arr, block, 0.0 if block == "counts" else sigma, rng)


def _run(cls, eps, seed, **kw):
    params = dict(epsilon=eps, delta=1e-5, clip=3.0, blocks=SECOND, split="equal")
    params.update(kw)
    return audit_gaussian_blocks(lambda: cls(**params), rng=np.random.default_rng(seed), draws=DRAWS)


@pytest.mark.parametrize("eps", [1.0, 4.0])
@pytest.mark.parametrize("split", ["equal", "joint"])
def test_real_mechanism_passes_every_block(eps, split):
    res = _run(GaussianMechanism, eps, seed=int(eps * 10), split=split)
    assert set(res) == set(SECOND)
    for block, r in res.items():
        assert r.mu_lb <= r.claimed_mu, (block, r)
        assert not r.refutes


def test_audit_has_power_on_the_real_mechanism():
    # The canary attains the sensitivity, so the bound comes close to the claim (power, not only validity).
    res = _run(GaussianMechanism, 4.0, seed=3)
    for r in res.values():
        assert r.mu_lb > 0.75 * r.claimed_mu


def test_fedlog_coordinate_clipped_statistic_passes():
    params = dict(
        epsilon=2.0, delta=0.01, clip=2.0, clip_norm="coordinate", calibration="classic", split="joint"
    )
    res = audit_gaussian_blocks(
        lambda: GaussianMechanism(**params), rng=np.random.default_rng(8), draws=DRAWS
    )
    for r in res.values():
        assert not r.refutes
    broken = audit_gaussian_blocks(lambda: HalvedNoise(**params), rng=np.random.default_rng(9), draws=DRAWS)
    assert broken["sums"].refutes and broken["counts"].refutes


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_halved_noise_caught(eps):
    res = _run(HalvedNoise, eps, seed=11)
    assert all(r.refutes for r in res.values())


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_skipped_clipping_caught(eps):
    res = _run(NoClipping, eps, seed=12)
    assert res["sums"].refutes and res["second"].refutes


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_second_moment_with_c_instead_of_c2_caught(eps):
    res = _run(SecondWithC, eps, seed=13)
    assert res["second"].refutes
    assert not res["sums"].refutes and not res["counts"].refutes


def test_counts_in_clear_caught():
    res = _run(CountsInClear, 1.0, seed=14, blocks=("sums", "counts"))
    assert res["counts"].refutes and res["counts"].mu_lb > 3


def test_auditor_on_a_known_gaussian():
    # Scores N(0,1) vs N(mu,1): a valid bound stays below mu; with 20k draws it lands near it.
    rng = np.random.default_rng(21)
    for mu in (0.5, 1.0, 2.0):
        r = audit_scores(rng.normal(size=DRAWS), rng.normal(mu, size=DRAWS), claimed_mu=mu)
        assert 0.75 * mu < r.mu_lb <= mu


def test_generic_audit_of_a_user_mechanism():
    sigma, shift = 2.0, 1.0

    def release(side, n, rng):
        return rng.normal(size=(n, 3)) * sigma + np.array([shift * side, 0.0, 0.0])

    r = audit(
        release,
        reference=np.zeros(3),
        direction=[1, 0, 0],
        scale=sigma,
        draws=DRAWS,
        rng=np.random.default_rng(1),
        claimed_mu=shift / sigma,
    )
    assert not r.refutes and r.mu_lb > 0.3
    lie = audit(
        release,
        reference=np.zeros(3),
        direction=[1, 0, 0],
        scale=sigma,
        draws=DRAWS,
        rng=np.random.default_rng(2),
        claimed_mu=0.5 * shift / sigma,
    )
    assert lie.refutes


def _count_audit(mech_factory, eps, seed, halve=False, clear=False):
    counts0 = np.array([20.0, 13.0, 7.0])
    counts1 = counts0 + np.array([1.0, 0.0, 0.0])
    claimed_scale = 1.0 / eps

    def release(side, n, rng):
        m = mech_factory()
        base = np.repeat((counts1 if side else counts0)[None], n, axis=0)
        if clear:
            return base
        noisy = m.perturb(base, rng)
        return base + (noisy - base) / 2 if halve else noisy

    return audit(
        release,
        reference=counts0,
        direction=[1, 0, 0],
        scale=claimed_scale,
        draws=DRAWS,
        rng=np.random.default_rng(seed),
        claimed_eps=eps,
    )


@pytest.mark.parametrize("cls", [LaplaceCountNoise, GeometricCountNoise])
@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_pure_count_noise_audited(cls, eps):
    r = _count_audit(lambda: cls(epsilon=eps), eps, seed=int(eps * 7))
    assert r.eps_lb <= eps and not r.refutes
    assert r.eps_lb > 0.5 * eps  # the audit is not vacuous
    assert _count_audit(lambda: cls(epsilon=eps), eps, seed=5, clear=True).refutes


@pytest.mark.parametrize("cls", [LaplaceCountNoise, GeometricCountNoise])
def test_halved_count_noise_caught(cls):
    assert _count_audit(lambda: cls(epsilon=1.0), 1.0, seed=6, halve=True).refutes


def test_audit_input_errors():
    from privfed.errors import ConfigError

    with pytest.raises(ConfigError, match="same positive number"):
        audit_scores(np.zeros(3), np.zeros(4))
    with pytest.raises(ConfigError, match="scale must be finite and > 0"):
        audit(
            lambda s, n, r: np.zeros((n, 1)),
            reference=[0.0],
            direction=[1.0],
            scale=0.0,
            rng=np.random.default_rng(0),
        )
    assert math.isfinite(audit_scores(np.zeros(10), np.ones(10)).mu_lb)


def test_gaussian_count_noise_audited():
    from mechanisms import GaussianCountNoise

    eps = 2.0
    g = GaussianCountNoise(epsilon=eps, delta=1e-5)
    counts0 = np.array([20.0, 13.0, 7.0])

    def release(side, n, rng, scale=1.0):
        base = np.repeat((counts0 + np.array([side, 0, 0]))[None], n, axis=0)
        return base + (g.perturb(base, rng) - base) * scale

    claim = 1.0 / g.sigma
    r = audit(
        release,
        reference=counts0,
        direction=[1, 0, 0],
        scale=g.sigma,
        draws=DRAWS,
        rng=np.random.default_rng(31),
        claimed_mu=claim,
    )
    assert not r.refutes
    half = audit(
        lambda s, n, rng: release(s, n, rng, 0.5),
        reference=counts0,
        direction=[1, 0, 0],
        scale=g.sigma,
        draws=DRAWS,
        rng=np.random.default_rng(32),
        claimed_mu=claim,
    )
    assert half.refutes


class NoClientBound(GaussianMechanism):
    """Broken: claims client-level bounding but uploads every client's full statistics."""

    def _bound_clients(self, stats):
        return stats


def _client_level_audit(cls, seed):
    """D1 = D0 plus one client holding 2 n_max canary records (so the bounding must act)."""
    from privfed.methods import get
    from privfed.stats import ClientStats, compute_client_stats

    n_max, c, d = 20, 2.0, 3
    params = dict(epsilon=2.0, delta=1e-5, clip=c, level="client", max_records=n_max, trusted_aggregator=True)
    data = np.random.default_rng(0)
    F0 = data.normal(size=(60, d))
    y0 = data.integers(0, 2, size=60)
    k0 = np.arange(60) % 3
    canary = np.zeros((2 * n_max, d))
    canary[:, 0] = 100 * c
    F1, y1, k1 = (
        np.vstack([F0, canary]),
        np.append(y0, np.zeros(2 * n_max, int)),
        np.append(k0, np.full(2 * n_max, 3)),
    )
    method = get("fedncm")
    ref_mech = cls(**params)

    def release(side, n, rng):
        m = cls(**params)
        m.check(method, None)
        F, y, k = (F1, y1, k1) if side else (F0, y0, k0)
        stats = compute_client_stats(m.clip(F), y, k, num_classes=2)
        total = m.before_upload(stats, method, rng).total()
        rep = ClientStats(**{f: np.repeat(v, n, axis=0) for f, v in total.arrays().items()})
        return m.after_aggregate(rep, method, rng).sums.reshape(n, -1)

    ref_sums = compute_client_stats(ref_mech.clip(F0), y0, k0, num_classes=2).total().sums.ravel()
    direction = np.zeros_like(ref_sums)
    direction[0] = 1.0  # class 0, coordinate e1
    return audit(
        release,
        reference=ref_sums,
        direction=direction,
        scale=ref_mech.sigma["sums"],
        draws=DRAWS,
        rng=np.random.default_rng(seed),
        claimed_mu=ref_mech.sensitivity["sums"] / ref_mech.sigma["sums"],
    )


def test_client_level_bounding_audited():
    ok = _client_level_audit(GaussianMechanism, 41)
    assert not ok.refutes and ok.mu_lb > 0.5 * ok.claimed_mu
    assert _client_level_audit(NoClientBound, 42).refutes


# ============================================================================ release-level audits
# Black-box audits of the public paths (privfed.audit.audit_release): a battery of worst-case
# neighbours, deterministic differences fail at once, otherwise a Clopper-Pearson lower bound with
# a threshold chosen on held-out draws against the report's composed claim.  Power: at eps = 4 the
# claimed mu is 0.925; a halved noise doubles it, and 200 fresh draws per side bound mu within ~0.5.
from privfed.audit import audit_release, fit_release, neighbour_battery  # noqa: E402

EPS = 4.0
RECORD = neighbour_battery("record")
CLIENT = neighbour_battery("client")
CANARY = [RECORD[1]]  # class 1 along e2: neither class 0 nor coordinate 0
DIAGONAL = [RECORD[4]]  # class 1 along (1, ..., 1): moves the off-diagonal second moment


class DiagOnlySecond(GaussianMechanism):
    """Broken: noise only on the diagonal of the second moment."""

    def _add_noise(self, arr, block, sigma, rng):
        if block != "second" or sigma == 0:
            return super()._add_noise(arr, block, sigma, rng)
        d = arr.shape[-1]
        return arr + np.eye(d) * rng.normal(0.0, sigma, size=arr.shape[:-1])[..., None]


class ClassZeroOnly(GaussianMechanism):
    """Broken: only class 0's row is noised."""

    def _add_noise(self, arr, block, sigma, rng):
        out = np.array(arr, dtype=np.float64)
        out[:, 0] = super()._add_noise(arr[:, 0], block, sigma, rng)
        return out


class CoordinateZeroOnly(GaussianMechanism):
    """Broken: only coordinate 0 of the sums is noised."""

    def _add_noise(self, arr, block, sigma, rng):
        if block != "sums":
            return super()._add_noise(arr, block, sigma, rng)
        out = np.array(arr, dtype=np.float64)
        out[..., 0] = super()._add_noise(arr[..., 0], block, sigma, rng)
        return out


def _release(cls, method="fedncm", blocks=("sums", "counts"), **kw):
    params = dict(epsilon=EPS, delta=1e-5, clip=3.0, blocks=blocks)
    params.update(kw)
    return fit_release(method, lambda: cls(**params))


@pytest.mark.parametrize(
    "cls, method, blocks",
    [
        (DiagOnlySecond, "fed3r", SECOND),
        (ClassZeroOnly, "fedncm", ("sums", "counts")),
        (CoordinateZeroOnly, "fedncm", ("sums", "counts")),
        (HalvedNoise, "fedncm", ("sums", "counts")),
        (NoClipping, "fedncm", ("sums", "counts")),
        (SecondWithC, "fed3r", SECOND),
        (CountsInClear, "fedncm", ("sums", "counts")),
    ],
)
def test_release_audit_flags_broken_mechanisms(cls, method, blocks):
    pairs = DIAGONAL if cls is DiagOnlySecond else CANARY
    res = audit_release(_release(cls, method, blocks), pairs, draws=200, heldout=100)
    assert res[0].flagged, res[0]


@pytest.mark.parametrize(
    "method, blocks, kw",
    [
        ("fedncm", ("sums", "counts"), {}),
        ("fed3r", SECOND, {}),
        ("fedncm", ("sums", "counts"), {"trusted_aggregator": True}),
        ("fedcof", ("sums", "counts"), {}),
    ],
)
def test_release_audit_passes_the_real_mechanism(method, blocks, kw):
    res = audit_release(_release(GaussianMechanism, method, blocks, **kw), CANARY, draws=200, heldout=100)
    assert res[0].verdict == "statistical" and not res[0].flagged, res[0]


def test_release_audit_flags_metadata_from_raw_data():
    # An old behaviour re-created: bytes computed from the raw statistics (pairs with data).
    import privfed

    def leaky(data, seed):
        head = privfed.fit(
            "fedncm", random_state=seed, privacy=GaussianMechanism(epsilon=EPS, delta=1e-5, clip=3.0), **data
        )
        raw = int(np.count_nonzero(np.bincount(data["clients"] * 3 + data["labels"], minlength=12)))
        return {"arrays": [head.weight], "meta": (raw,), "report": head.privacy}

    res = audit_release(leaky, [RECORD[3]], draws=0, meta_draws=6)
    assert res[0].verdict == "deterministic difference"


_METHODS = {
    "fedncm": ("sums", "counts"),
    "fed3r": SECOND,
    "fed3r-within": SECOND,
    "fedcgs": SECOND,
    "fedlog": ("sums", "counts"),
    "fedcof": ("sums", "counts"),
    "fedcof-oracle": ("sums", "counts"),
}


#: Client level has no local placement (its noise goes on a sum), so that pair is not a configuration;
#: Poisson client sampling ("sampled") runs at client level with a trusted aggregator and is refused
#: elsewhere (record level is audited to show the refusal is the same on both sides).
_CONFIGURATIONS = [
    (p, lv)
    for lv in ("record", "client")
    for p in ("local", "central", "mask", "sampled")
    if (p, lv) != ("local", "client")
]


@pytest.mark.parametrize("method", sorted(_METHODS))
@pytest.mark.parametrize("placement, level", _CONFIGURATIONS)
def test_every_public_configuration_shows_no_deterministic_difference(method, placement, level):
    from mechanisms.secagg.protection import PairwiseMasking

    kw = dict(epsilon=EPS, delta=1e-5, clip=3.0, blocks=_METHODS[method], level=level)
    if level == "client":
        kw["max_records"] = 20
    if placement in ("central", "sampled"):
        kw["trusted_aggregator"] = True
    if placement == "sampled":
        kw["sampling_rate"] = 0.5
    run = fit_release(
        method, lambda: GaussianMechanism(**kw), (lambda: PairwiseMasking()) if placement == "mask" else None
    )
    pairs = CLIENT if level == "client" else RECORD
    for r in audit_release(run, pairs, draws=0):
        assert not r.flagged, r
        if placement == "sampled" and level == "record":
            # record level: only client-level guarantees are amplified (FedCOF: its noise is local;
            # fedcof-oracle is refused under this mechanism whatever the sampling)
            why = {"fedcof": "amplification does not hold", "fedcof-oracle": "per-class second moments"}.get(
                method, "only client-level"
            )
            assert r.verdict == "refused" and why in r.reason, r


@pytest.mark.slow
@pytest.mark.parametrize("level", ["record", "client"])
def test_ckks_configurations_show_no_deterministic_difference(level):
    # CKKS costs about a second per release; the masking configurations above cover the same hooks.
    from mechanisms.secagg.protection import CKKSAggregation

    kw = dict(
        epsilon=EPS, delta=1e-5, clip=3.0, level=level, **({"max_records": 20} if level == "client" else {})
    )
    run = fit_release("fedncm", lambda: GaussianMechanism(**kw), CKKSAggregation)
    for r in audit_release(run, (CLIENT if level == "client" else RECORD)[:1], draws=0):
        assert r.verdict == "metadata only" and not r.flagged, r


def _sweep_block(readme: str) -> str | None:
    start, end = "<!-- readme-numbers:audit-sweep tol=0 -->", "<!-- /readme-numbers:audit-sweep -->"
    if start not in readme:
        return None
    return readme.split(start, 1)[1].split(end, 1)[0].strip()


def test_audit_sweep_results_cover_every_configuration_and_back_the_readme_table():
    # The committed results of `python -m experiments.audit_sweep` (see its docstring for the command):
    # complete, every public configuration on every pair of its battery, nothing flagged, every bound
    # below its claim; the README's table is rendered from them.
    import json
    from pathlib import Path

    from experiments import audit_sweep as S

    root = Path(__file__).resolve().parents[2]
    res = json.loads((root / "experiments" / "audit_sweep_results.json").read_text())
    assert res["complete"] and res["rows"]
    by_config: dict = {}
    for r in res["rows"]:
        by_config.setdefault(r["configuration"], []).append(r)
        assert not r["flagged"], r
        if r["verdict"] == "statistical":
            if r["claimed_mu"] is not None:
                assert r["mu_lb"] <= r["claimed_mu"], r
            else:
                assert r["eps_lb"] <= r["claimed_eps"], r
    ckks = set(S.METHODS) & {"fedncm", "fed3r"}
    expected = [
        (name, level, placement)
        for name, level, placement, _ in S.configurations(
            res["eps"], res["clip"], S.METHODS, S.PLACEMENTS, ["numpy"], sampling=res["sampling"]
        )
        if placement != "ckks" or name.split()[1] in ckks
    ]
    assert {n for n, _, _ in expected} == set(by_config)
    for name, level, placement in expected:
        pairs = [p.name for p in neighbour_battery(level)]
        assert [r["pair"] for r in by_config[name]] == (pairs[:1] if placement == "ckks" else pairs), name
    # Every verdict the sweep can give is reasoned: refusals are the same error on both sides.
    assert {r["verdict"] for r in res["rows"]} <= {"statistical", "metadata only", "refused", "no claim"}
    block = _sweep_block((root / "docs" / "privacy.md").read_text(encoding="utf-8"))
    assert block is not None, (
        "docs/privacy.md has no audit-sweep block; `python -m experiments.readme_numbers --write`"
    )
    assert block == S.readme_table(res).strip()


def test_tradeoff_path_is_audited_too():
    from privfed.audit import tradeoff_release
    from privfed.tradeoff import TradeoffConfig

    res = audit_release(
        tradeoff_release(TradeoffConfig(level="record"), "fedncm", EPS, 3.0), CANARY, draws=200, heldout=100
    )
    assert res[0].verdict == "statistical" and not res[0].flagged, res[0]
    # Count noise leaves the means in clear: its report claims nothing for the release, and says so.
    cnt = TradeoffConfig(level="record", count_noise="laplace")
    res = audit_release(
        tradeoff_release(cnt, "fedcof", EPS, None), [RECORD[0]], draws=20, heldout=10, meta_draws=4
    )
    assert res[0].verdict == "no claim" and "NO DP GUARANTEE" in res[0].reason


class UnboundedClients(GaussianMechanism):
    """Broken: claims max_records but never scales a larger client down."""

    def _bound_clients(self, stats):
        return stats


def test_client_level_release_audit():
    # A client of 20 canaries moves the sums by exactly the calibrated sensitivity (max_records c).
    pairs = [neighbour_battery("client", max_records=20)[1]]
    kw = dict(epsilon=EPS, delta=1e-5, clip=3.0, level="client", max_records=20, trusted_aggregator=True)
    res = audit_release(fit_release("fedncm", lambda: GaussianMechanism(**kw)), pairs, draws=200, heldout=100)
    assert res[0].verdict == "statistical" and not res[0].flagged, res[0]
    # The same client with 100 canaries against a mechanism that does not bound clients.
    pairs = [neighbour_battery("client", max_records=100)[1]]
    res = audit_release(fit_release("fedncm", lambda: UnboundedClients(**kw)), pairs, draws=200, heldout=100)
    assert res[0].flagged, res[0]


def test_a_refused_configuration_audits_as_refused():
    # FedCOF multi-mean under DP is refused on both neighbours with the same error: nothing is released.
    run = fit_release(
        "fedcof", lambda: GaussianMechanism(epsilon=EPS, delta=1e-5, clip=3.0), means_per_client=2
    )
    chunking = [p for p in RECORD if p.name == "a record that changes chunking"]
    res = audit_release(run, chunking, draws=10, heldout=5)
    assert res[0].pair == "a record that changes chunking"
    assert res[0].verdict == "refused" and "means_per_client=2" in res[0].reason and not res[0].flagged


class AmplificationWithoutSampling(GaussianMechanism):
    """Broken: credits Poisson client sampling (q < 1) but keeps every client in the sum."""

    def _poisson_sample(self, stats, rng):
        self._sampled_pending += 1
        return stats


def test_sampled_release_audit_against_the_amplified_claim():
    # q = 0.01 at eps = 1: the noise alone gives mu = 1.48 (eps 6.96), so only real sampling meets the claim.
    pairs = [neighbour_battery("client", max_records=20)[1]]
    kw = dict(
        epsilon=1.0,
        delta=1e-5,
        clip=3.0,
        level="client",
        max_records=20,
        trusted_aggregator=True,
        sampling_rate=0.01,
    )
    res = audit_release(fit_release("fedncm", lambda: GaussianMechanism(**kw)), pairs, draws=600, heldout=300)
    assert res[0].verdict == "statistical" and not res[0].flagged, res[0]
    assert res[0].claimed_eps <= 1.0 and math.isnan(res[0].claimed_mu)  # the PLD claim, compared in epsilon
    res = audit_release(
        fit_release("fedncm", lambda: AmplificationWithoutSampling(**kw)), pairs, draws=600, heldout=300
    )
    assert res[0].flagged, res[0]


def _with_coin_note(run, p_small, p_large):
    """A release whose metadata carries a random note: "heads" with probability p_small on the smaller
    dataset of a pair and p_large on the larger (the coin depends on the draw's seed and the data size)."""

    def wrapped(data, seed):
        out = dict(run(data, seed))
        n = len(data["labels"])
        p = p_large if n > len(RECORD[1].d0["labels"]) else p_small
        heads = np.random.default_rng([seed, n, 77]).random() < p
        out["meta"] = tuple(out["meta"]) + ("coin: heads" if heads else "coin: tails",)
        return out

    return wrapped


def test_random_metadata_with_the_same_law_on_both_sides_is_not_flagged():
    from privfed.audit import MIN_META_DRAWS, deterministic_differences, output_atoms, run_once

    run = _with_coin_note(_release(GaussianMechanism), 0.5, 0.5)
    seed = 763  # its first 4 draws: heads on every draw of one side, tails on every draw of the other
    base = seed * 1_000_003
    first4 = [
        [output_atoms(run_once(run, d, base + i)) for i in range(4)] for d in (CANARY[0].d0, CANARY[0].d1)
    ]
    assert any("coin" in a for a in deterministic_differences(first4))  # 4 draws would call it deterministic
    res = audit_release(run, CANARY, draws=200, heldout=100, meta_draws=4, seed=seed)  # raised to 16 draws
    assert MIN_META_DRAWS >= 16
    assert res[0].verdict == "statistical" and not res[0].flagged, res[0]
    assert "random metadata atom" in res[0].reason


def test_random_metadata_with_different_laws_is_caught_by_the_statistical_test():
    # A note far likelier with the canary than without: random, so not a deterministic difference, but
    # it goes to the statistical test with the released values, whose bound exceeds the claim.
    run = _with_coin_note(_release(GaussianMechanism), 0.1, 0.9)
    res = audit_release(run, CANARY, draws=200, heldout=100)
    assert res[0].verdict == "statistical" and res[0].flagged, res[0]


@pytest.mark.parametrize(
    "method, entry", [("fedncm", "fold_local_upload"), ("fedcof", "local_upload_stream")]
)
def test_fit_release_audits_the_streamed_local_path(method, entry, monkeypatch):
    """With local noise privfed.fit streams the uploads; the audit's tap takes that same path and
    records each client's noisy upload (counts (K, C), sums (K, C, d)), not a one-call substitute."""
    calls = []
    inner = getattr(GaussianMechanism, entry)

    def counting(self, *args, **kwargs):
        calls.append(entry)
        return inner(self, *args, **kwargs)

    monkeypatch.setattr(GaussianMechanism, entry, counting)
    monkeypatch.setattr(
        GaussianMechanism, "before_upload", lambda *a, **k: pytest.fail("one-call path taken")
    )
    data = RECORD[0].d0
    out = _release(GaussianMechanism, method)(data, 3)
    K, C = int(data["num_clients"]), int(data["num_classes"])
    assert calls == [entry]
    counts, sums = out["arrays"]
    assert counts.shape == (K, C) and sums.shape == (K, C, np.shape(data["features"])[1])
    assert np.all(counts != np.rint(counts))  # noised, every cell


# ============================================================================ issue 23: what the auditor must flag
# Each broken variant is a mis-calibrated or leaky release that the auditor must catch: they are the test of
# the auditor (defined once in experiments.audit_broken, whose --broken record the docs quote).  The real
# mechanism passes the same audits.
from experiments.audit_broken import ClipAfterSum, CountInNote, ScaledNoise08, seed_zero_without_a_seed  # noqa: E402


def test_power_formula_draws_catch_noise_scaled_by_0_8_at_eps_1():
    from privfed.audit import draws_for_power

    params = dict(epsilon=1.0, delta=1e-5, clip=3.0, blocks=SECOND, split="equal")
    mech = GaussianMechanism(**params)
    claim = mech.sensitivity["sums"] / mech.sigma["sums"]  # equal shares: every block claims the same mu
    n = draws_for_power(claim, ratio=1.25, power=0.99, comparisons=3)
    assert n > 37_000 > DRAWS  # the 20k draws of the fixed recipe are under the power formula's ask
    broken = audit_gaussian_blocks(lambda: ScaledNoise08(**params), rng=np.random.default_rng(81))
    assert {r.draws for r in broken.values()} == {n}
    assert any(r.refutes for r in broken.values()), broken
    real = audit_gaussian_blocks(lambda: GaussianMechanism(**params), rng=np.random.default_rng(82))
    assert not any(r.refutes for r in real.values()), real


@pytest.mark.parametrize("seed", range(5))
def test_release_audit_catches_halved_noise_at_eps_1(seed):
    # At eps = 1 the statistical bound has little power against a halved noise (claimed mu 0.27); the
    # noise-scale check compares the spread of the released values with the sigma the ledger books.
    run = fit_release("fedncm", lambda: HalvedNoise(epsilon=1.0, delta=1e-5, clip=3.0))
    res = audit_release(run, CANARY, draws=0, seed=seed)
    assert res[0].verdict == "noise below the reported scale" and res[0].flagged, res[0]


@pytest.mark.parametrize("placement", ["local", "central", "mask"])
def test_real_mechanism_passes_the_noise_scale_and_freshness_checks_at_eps_1(placement):
    from mechanisms.secagg.protection import PairwiseMasking

    kw = dict(epsilon=1.0, delta=1e-5, clip=3.0, trusted_aggregator=placement == "central")
    run = fit_release(
        "fedncm", lambda: GaussianMechanism(**kw), PairwiseMasking if placement == "mask" else None
    )
    res = audit_release(run, CANARY, draws=0, seed=3)
    assert res[0].verdict == "metadata only" and not res[0].flagged, res[0]


def test_seed_zero_when_no_seed_was_given_is_caught():
    # Broken: the library draws from seed 0 when the caller gives no seed, and reports a fresh-entropy release.
    run = _release(GaussianMechanism)
    assert not audit_release(run, CANARY, draws=0)[0].flagged  # the real library: fresh noise
    with seed_zero_without_a_seed():
        res = audit_release(run, CANARY, draws=0)
    assert res[0].verdict == "noise not fresh" and res[0].flagged, res[0]


def test_a_raw_count_in_a_note_is_caught():
    res = audit_release(_release(CountInNote, trusted_aggregator=True), CANARY, draws=0)
    assert res[0].verdict == "deterministic difference" and "aggregate of # records" in res[0].reason, res[0]
    assert not audit_release(_release(GaussianMechanism, trusted_aggregator=True), CANARY, draws=0)[0].flagged


def test_clipping_after_the_sum_is_caught_at_eps_1():
    kw = dict(epsilon=1.0, trusted_aggregator=True)
    res = audit_release(_release(ClipAfterSum, **kw), CANARY, draws=200, heldout=100)
    assert res[0].verdict == "statistical" and res[0].flagged, res[0]
    ok = audit_release(_release(GaussianMechanism, **kw), CANARY, draws=200, heldout=100)
    assert ok[0].verdict == "statistical" and not ok[0].flagged, ok[0]


def test_a_bare_exception_is_a_failure():
    def crashing(data, seed):
        raise ZeroDivisionError("division by zero")

    res = audit_release(crashing, CANARY, draws=0)
    assert res[0].verdict == "bare exception" and res[0].flagged


# -- rare deterministic neighbour differences (issue 23) -------------------------------------------
def test_a_record_whose_squared_norm_overflows_is_clipped_like_any_other():
    from privfed.audit import edge_battery

    huge = [p for p in edge_battery() if "overflows" in p.name]
    for method, blocks in (("fedncm", ("sums", "counts")), ("fed3r", SECOND)):
        res = audit_release(_release(GaussianMechanism, method, blocks), huge, draws=0)
        assert res[0].verdict == "metadata only" and not res[0].flagged, res[0]


def test_a_clip_that_would_overflow_is_refused_from_the_configuration():
    from privfed.errors import ConfigError

    for clip in (7e149, math.inf):
        with pytest.raises(ConfigError, match="clip"):
            GaussianMechanism(epsilon=1.0, delta=1e-5, clip=clip)


@pytest.mark.parametrize("pair", ["empty dataset", "data-derived num_classes"])
def test_empty_data_and_data_derived_classes_show_no_difference(pair):
    from privfed.audit import edge_battery

    pairs = [p for p in edge_battery() if pair.split()[0] in p.name]
    res = audit_release(_release(GaussianMechanism), pairs, draws=0)
    assert not res[0].flagged, res[0]


# -- the multi-round release path ---------------------------------------------------------------------
@pytest.mark.parametrize("placement, secure", [("central", "none"), ("distributed", "mask")])
def test_rounds_release_is_audited(placement, secure):
    from privfed.audit import rounds_release

    run = rounds_release(epsilon=EPS, clip=3.0, rounds=3, placement=placement, secure=secure)
    res = audit_release(run, CANARY, draws=200 if secure == "none" else 0, heldout=100)
    assert not res[0].flagged, res[0]
    assert res[0].verdict == ("statistical" if secure == "none" else "metadata only")


def test_rounds_release_with_halved_noise_is_caught(monkeypatch):
    from mechanisms.dp.backends import NumpyNoise
    from privfed.audit import rounds_release

    inner = NumpyNoise.add_gaussian
    monkeypatch.setattr(
        NumpyNoise, "add_gaussian", lambda self, x, sigma, rng: inner(self, x, sigma / 2, rng)
    )
    res = audit_release(rounds_release(epsilon=1.0, clip=3.0, rounds=3), CANARY, draws=0)
    assert res[0].verdict == "noise below the reported scale", res[0]


# -- privfed.testing: auditing a budget in a user's own tests ---------------------------------------------
def test_testing_audit_passes_a_true_claim_and_refutes_false_ones():
    import privfed
    from privfed.testing import audit as check
    from privfed.testing import fit_release as tap

    mech = dict(epsilon=EPS, delta=1e-5, clip=3.0)
    pairs = RECORD[:3]
    res = check(
        tap("fedncm", lambda: GaussianMechanism(**mech)),
        epsilon=EPS,
        delta=1e-5,
        neighbours=pairs,
        draws=200,
        heldout=100,
    )
    assert [r.verdict for r in res] == ["statistical", "metadata only", "metadata only"]
    assert res[0].eps_lb <= EPS

    # A head returned by privfed.fit is audited too (post-processing of the release).
    def head_fn(data, seed):
        return privfed.fit("fedncm", **data, privacy=GaussianMechanism(**mech), random_state=seed)

    check(head_fn, epsilon=EPS, delta=1e-5, neighbours=pairs[:1], draws=200, heldout=100)
    # Claiming less than the report states fails; so does a release with half its noise.
    with pytest.raises(AssertionError, match="report states epsilon"):
        check(head_fn, epsilon=1.0, delta=1e-5, neighbours=pairs[:1], draws=200, heldout=100)
    with pytest.raises(AssertionError, match="noise below the reported scale"):
        check(
            tap("fedncm", lambda: HalvedNoise(**mech)), epsilon=EPS, delta=1e-5, neighbours=pairs[:1], draws=0
        )


def test_testing_audit_of_a_plain_function_compares_with_the_callers_claim():
    from privfed.testing import audit as check

    def gaussian_mean(data, seed, sigma):  # the mean of clipped first coordinates, Gaussian noise
        x = np.clip(np.asarray(data["features"])[:, 0], -1, 1)
        return np.array([x.sum() + np.random.default_rng(seed).normal(0, sigma)])

    # Sensitivity 1 and sigma 1: mu = 1, which is (4.38, 1e-5)-DP (analytic Gaussian); claiming 0.2 is false.
    ok = check(
        lambda d, s: gaussian_mean(d, s, 1.0),
        epsilon=4.4,
        delta=1e-5,
        neighbours=RECORD[:1],
        draws=2000,
        heldout=500,
    )
    assert ok[0].verdict == "statistical" and ok[0].eps_lb <= 4.4
    with pytest.raises(AssertionError, match="lower bound"):
        check(
            lambda d, s: gaussian_mean(d, s, 1.0),
            epsilon=0.2,
            delta=1e-5,
            neighbours=RECORD[:1],
            draws=2000,
            heldout=500,
        )


def test_broken_variant_record_backs_the_docs():
    # The committed record of `python -m experiments.audit_sweep --broken` (the docs quote it): every broken
    # variant flagged and every real release passing, in every seed, and the variants are those of the catalogue.
    import json
    from pathlib import Path

    from experiments import audit_sweep as S

    root = Path(__file__).resolve().parents[2]
    res = json.loads((root / "experiments" / "audit_broken_results.json").read_text())
    assert res["complete"] and res["seeds"] >= 5
    names = [name for name, _, _ in S.broken_catalogue(res["eps"], res["clip"])]
    assert sorted({r["variant"] for r in res["rows"]}) == sorted(names)
    for r in res["rows"]:
        assert r["ok"] and r["flagged"] == r["broken"], r
