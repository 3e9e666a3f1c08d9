"""Every guarantee privfed prints is true: one test per way a report could overstate its release.

Each test builds the release a user would run (``privfed.fit`` with a mechanism and, where it
matters, a secure-aggregation protocol) and checks the fact the report rests on: what is refused,
what the noise actually present gives, and that nothing returned depends on the raw data beyond
the noisy release and public parameters.  Exact quantities are compared to an independent
computation (``gdp_epsilon`` of the noise present) to 1e-9.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import privfed
from mechanisms import (
    GaussianMechanism,
    LaplaceCountNoise,
    UniformCountNoiseNoDP,
    gdp_epsilon,
    gdp_mu,
)
from mechanisms.dp.ledger import NEIGHBOURING
from mechanisms.secagg.masking import KeySource, ProtocolAbort, masked_sum
from mechanisms.secagg.masking.node import MaskingNode
from mechanisms.secagg.masking.server import MaskingServer
from mechanisms.secagg.noise import DistributedGaussian
from mechanisms.secagg.protection import PairwiseMasking
from privfed.errors import ConfigError, InputError

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")


def _data(n=80, K=4, C=3, d=5, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % C
    F = rng.normal(size=(n, d)) + 2 * rng.normal(size=(C, d))[y]
    k = np.arange(n) % K
    return F, y, k


def _mech(**kw):
    params = dict(epsilon=1.0, delta=1e-5, clip=1.0)
    params.update(kw)
    return GaussianMechanism(**params)


# -- 1. FedCOF multi-mean chunking depends on the count -----------------------------------------
def test_multi_mean_is_refused_under_dp():
    F, y, k = _data()
    with pytest.raises(ConfigError, match="means_per_client=2"):
        privfed.fit("fedcof", F, y, k, num_classes=3, num_clients=4, privacy=_mech(), means_per_client=2)
    with pytest.raises(ConfigError, match="means_per_client=3"):
        privfed.fit(
            "fedcof",
            F,
            y,
            k,
            num_classes=3,
            num_clients=4,
            privacy=LaplaceCountNoise(epsilon=1.0),
            means_per_client=3,
        )
    # M = 1 is the plain method and runs.
    assert np.all(
        np.isfinite(privfed.fit("fedcof", F, y, k, num_classes=3, num_clients=4, privacy=_mech()).weight)
    )


# -- 2. Poisson client sampling: carried out where it amplifies, refused where it does not -------------
Q = 0.01  # the rate of the finding: q = 0.01 at epsilon = 1


def _sampled(cls=GaussianMechanism, q=Q, **kw):
    params = dict(
        epsilon=1.0,
        delta=1e-5,
        clip=1.0,
        level="client",
        max_records=20,
        trusted_aggregator=True,
        sampling_rate=q,
    )
    params.update(kw)
    return cls(**params)


def _independent_epsilon(mech, releases):
    """dp-accounting built up directly: Poisson-sampled Gaussian events through its PLD accountant."""
    import dp_accounting

    z = 1.0 / math.sqrt(sum((mech.sensitivity[b] / mech.sigma[b]) ** 2 for b in mech.blocks))
    event = dp_accounting.PoissonSampledDpEvent(mech.sampling_rate, dp_accounting.GaussianDpEvent(z))
    acc = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(event, releases)
    return acc.get_epsilon(mech.delta)


def test_sampled_release_reports_the_dp_accounting_epsilon_of_what_ran():
    F, y, k = _data()
    mech = _sampled()
    head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=mech)
    rep = head.privacy
    assert rep.epsilon == pytest.approx(_independent_epsilon(mech, 1), abs=1e-9)
    assert rep.epsilon <= 1.0 + 1e-9 and rep.sampling_rate == Q and rep.placement == "central"
    assert "Poisson-sampled at rate 0.01" in rep.guarantee and not rep.simulation
    assert any("OS entropy" in n and "not released" in n for n in rep.notes)
    # Without amplification the same noise is far weaker: the (6.96, 1e-5).
    assert gdp_epsilon(mech.mu, 1e-5) == pytest.approx(6.96, abs=0.05)
    # A second release composes (two Poisson-sampled events), again exactly as dp-accounting says.
    privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=mech)
    assert mech.report().epsilon == pytest.approx(_independent_epsilon(mech, 2), abs=1e-9)


class _CountingAggregator(GaussianMechanism):
    """Test tap: the number of records in the sum before the aggregator's noise (1 per client here)."""

    seen: list[int] = []  # noqa: RUF012 (reset by the test before use)

    def after_aggregate(self, total, method, rng):
        self.seen.append(round(float(total.counts.sum())))
        return super().after_aggregate(total, method, rng)


def test_number_of_sampled_clients_is_binomial():
    # K clients of one record each: the records in the sum count the sampled clients, Binomial(K, q).
    from scipy.stats import chi2

    K, q, n = 40, 0.3, 300
    rng = np.random.default_rng(5)
    F, y, k = rng.normal(size=(K, 3)), np.arange(K) % 2, np.arange(K)
    _CountingAggregator.seen = []
    for seed in range(n):
        privfed.fit(
            "fedncm",
            F,
            y,
            k,
            num_classes=2,
            num_clients=40,
            privacy=_sampled(_CountingAggregator, q=q, max_records=1),
            random_state=seed,
        )
    x = np.array(_CountingAggregator.seen, dtype=float)
    assert x.size == n
    # The mean of n Binomial(K, q): within 4 standard errors of Kq.
    assert abs(x.mean() - K * q) < 4 * math.sqrt(K * q * (1 - q) / n)
    # Dispersion: sum (x - Kq)^2 / (Kq(1-q)) is ~ chi^2_n (normal approximation of each count).
    stat = float(((x - K * q) ** 2).sum() / (K * q * (1 - q)))
    assert chi2.ppf(1e-4, n) < stat < chi2.ppf(1 - 1e-4, n)
    # Seeded runs are simulations and say so; the sampling itself is seeded then.
    head = privfed.fit(
        "fedncm", F, y, k, num_classes=2, num_clients=40, privacy=_sampled(q=q, max_records=1), random_state=1
    )
    assert head.privacy.simulation and any("seeded simulation" in n for n in head.privacy.notes)


def test_sampled_set_is_hidden_from_what_the_run_returns():
    # Bytes, shapes and the report are the same whoever was sampled (every client uploads to the
    # trusted aggregator, which keeps the sample to itself).
    F, y, k = _data()
    seen = set()
    for s in range(6):
        head = privfed.fit(
            "fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_sampled(q=0.5), random_state=s
        )
        seen.add(
            (
                head.weight.shape,
                tuple(sorted(head.upload_bytes.items())),
                head.privacy.guarantee,
                head.privacy.notes,
            )
        )
    assert len(seen) == 1
    assert dict(next(iter(seen))[1])["M"] == 4 * 3


@pytest.mark.parametrize(
    "kw, secure, method, why",
    [
        (dict(level="record", max_records=None), False, "fedncm", "only client-level"),
        (dict(trusted_aggregator=False, level="record", max_records=None), False, "fedncm", "local noise"),
        (dict(level="record", max_records=None), False, "fedcof", "local noise"),
        (dict(trusted_aggregator=False), True, "fedncm", "secure aggregation"),
    ],
)
def test_sampling_is_refused_where_the_server_sees_who_uploads(kw, secure, method, why):
    F, y, k = _data()
    with pytest.raises(ConfigError, match=why):
        privfed.fit(
            method,
            F,
            y,
            k,
            num_classes=3,
            num_clients=4,
            privacy=_sampled(**kw),
            secure_agg=PairwiseMasking() if secure else None,
        )


def test_sampling_rate_is_refused_where_no_sampling_happens():
    F, y, k = _data()
    mech = _sampled()
    with pytest.raises(ConfigError, match="does not subsample"):
        mech.release(F[:5], y[:5], rng=np.random.default_rng(0), num_classes=3)
    # A sum noised without the aggregator's sampling first (another driver of the hooks) is refused too.
    from privfed.methods import get
    from privfed.stats import compute_client_stats

    mech.check(get("fedncm"), None)
    total = compute_client_stats(mech.clip(F), y, k, num_classes=3).total()
    with pytest.raises(ConfigError, match="no client sampling preceded"):
        mech.after_aggregate(total, get("fedncm"), np.random.default_rng(0))
    assert mech.report().num_events == 0


# -- 3. nothing returned depends on the raw data beyond the noisy release --------------------------
def _outputs(head):
    return {
        "shape": head.weight.shape,
        "bytes": head.upload_bytes,
        "guarantee": head.privacy.guarantee,
        "notes": tuple(head.notes),
        "privacy_notes": head.privacy.notes,
    }


@pytest.mark.parametrize("method", ["fedncm", "fed3r", "fedcof", "fedlog"])
def test_a_record_in_a_class_its_client_lacked_changes_no_metadata(method):
    F, y, k = _data()
    keep = ~((k == 0) & (y == 2))  # client 0 holds no record of class 2
    F0, y0, k0 = F[keep], y[keep], k[keep]
    F1 = np.vstack([F0, 5 * np.ones(F.shape[1])])
    y1, k1 = np.append(y0, 2), np.append(k0, 0)
    blocks = ("sums", "counts", "second") if method == "fed3r" else ("sums", "counts")
    out = []
    for Fi, yi, ki in ((F0, y0, k0), (F1, y1, k1)):
        head = privfed.fit(
            method, Fi, yi, ki, num_classes=3, num_clients=4, privacy=_mech(blocks=blocks), random_state=3
        )
        out.append(_outputs(head))
    assert out[0]["bytes"] == out[1]["bytes"]
    assert out[0]["bytes"]["M"] == 4 * 3  # every client sends every class under DP
    assert out[0]["shape"] == out[1]["shape"]
    assert out[0]["guarantee"] == out[1]["guarantee"]
    assert out[0]["privacy_notes"] == out[1]["privacy_notes"]


def test_an_absent_class_or_an_empty_client_is_not_refused_from_raw_data():
    F, y, k = _data()
    # Class 2's only record, and client 1's only record.
    only = np.flatnonzero(y == 2)[0]
    keep = (y != 2) | (np.arange(y.size) == only)
    F1, y1, k1 = F[keep], y[keep], k[keep]
    k1 = np.where(np.arange(k1.size) == np.flatnonzero(y1 == 2)[0], 1, np.where(k1 == 1, 2, k1))
    F0, y0, k0 = F1[y1 != 2], y1[y1 != 2], k1[y1 != 2]
    assert np.bincount(k0, minlength=4)[1] == 0 and np.bincount(k1, minlength=4)[1] == 1
    shapes = []
    for Fi, yi, ki in ((F0, y0, k0), (F1, y1, k1)):
        head = privfed.fit(
            "fedncm", Fi, yi, ki, num_classes=3, num_clients=4, privacy=_mech(), random_state=1
        )
        shapes.append((head.weight.shape, head.upload_bytes))
    assert shapes[0] == shapes[1]
    # Without privacy the same inputs are still refused (nothing to hide, and an empty class is a mistake).
    with pytest.raises(InputError, match="no sample"):
        privfed.fit("fedncm", F0, y0, np.minimum(k0, 1), num_classes=3)


def test_client_level_keeps_the_client_set_public():
    F, y, k = _data()
    F0, y0, k0 = F, y, k
    F1, y1, k1 = F[k != 3], y[k != 3], k[k != 3]  # client 3's data zeroed out: it still takes part
    reps = []
    for Fi, yi, ki in ((F0, y0, k0), (F1, y1, k1)):
        mech = _mech(level="client", max_records=30, trusted_aggregator=True)
        head = privfed.fit("fedncm", Fi, yi, ki, num_classes=3, num_clients=4, privacy=mech, random_state=1)
        reps.append((head.upload_bytes, [(e.block, e.sensitivity, e.scale) for e in mech.ledger.events]))
    assert reps[0] == reps[1]
    assert "zero-out" in NEIGHBOURING["client"]


# -- 4. dropouts beyond the tolerance --------------------------------------------------------------
def test_dropouts_beyond_tolerance_lower_the_reported_guarantee():
    rng = np.random.default_rng(0)
    K = 10
    F = rng.normal(size=(200, 4))
    y = np.arange(200) % 2
    k = np.arange(200) % K
    mech = _mech()
    sa = PairwiseMasking(dropouts=4, dropout_phase="before_upload")
    head = privfed.fit(
        "fedncm", F, y, k, num_classes=2, num_clients=10, privacy=mech, secure_agg=sa, random_state=2
    )
    # 6 of 10 shares of sigma^2 / 10 reached the sums: 0.6 sigma^2 present.
    expected = gdp_epsilon(gdp_mu(1.0, 1e-5) / math.sqrt(0.6), 1e-5)
    assert head.privacy.epsilon == pytest.approx(expected, rel=1e-9)
    assert head.privacy.epsilon > 1.3
    assert any("only 6 of 10" in n for n in head.privacy.notes)
    # Issue 12 item 8: the head says whose data it holds.
    assert any("holds the data of 6 of 10 clients" in n for n in head.notes)


# -- 5. client level under secure aggregation with a tolerance -------------------------------------
def test_client_level_secure_agg_noise_does_not_depend_on_who_holds_data():
    F, y, k = _data()
    variances = []
    for Fi, yi, ki in ((F, y, k), (F[k != 3], y[k != 3], k[k != 3])):
        mech = _mech(level="client", max_records=30, dropout_tolerance=1)
        head = privfed.fit(
            "fedncm",
            Fi,
            yi,
            ki,
            num_classes=3,
            num_clients=4,
            privacy=mech,
            secure_agg=PairwiseMasking(),
            random_state=1,
        )
        variances.append([e.scale for e in mech.ledger.events])
        assert head.privacy.placement == "distributed"
        assert any("zero-out" in n for n in head.privacy.notes)
    # The same K clients add the same shares in both neighbours: the sum's noise is identical.
    assert variances[0] == variances[1]
    # K = 4 shares of sigma^2 / 3 each: 4/3 sigma^2 present, epsilon computed from it.
    mech = _mech(level="client", max_records=30, dropout_tolerance=1)
    head = privfed.fit(
        "fedncm",
        F,
        y,
        k,
        num_classes=3,
        num_clients=4,
        privacy=mech,
        secure_agg=PairwiseMasking(),
        random_state=1,
    )
    assert head.privacy.epsilon == pytest.approx(gdp_epsilon(mech.mu / math.sqrt(4 / 3), 1e-5), rel=1e-9)


# -- 6. randomness --------------------------------------------------------------------------------
def test_unseeded_noise_is_fresh_and_seeded_runs_say_they_are_simulations():
    F, y, k = _data()
    a = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_mech())
    b = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_mech())
    assert not np.array_equal(a.weight, b.weight)  # not seed 0 twice
    assert not a.privacy.simulation and not any("SIMULATION" in n for n in a.privacy.notes)
    s = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_mech(), random_state=5)
    assert s.privacy.simulation and s.privacy.guarantee.startswith("SIMULATION")
    assert any("can be replayed" in n for n in s.privacy.notes)
    t = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_mech(), random_state=5)
    assert np.array_equal(s.weight, t.weight)  # a simulation is reproducible
    # Without privacy, None still means seed 0 (multi-mean sampling is reproducible).
    p = [privfed.fit("fedcof", F, y, k, means_per_client=3).weight for _ in range(2)]
    assert np.array_equal(p[0], p[1])


def test_secagg_plus_graph_comes_from_key_material_not_the_run_rng():
    X = np.arange(40.0).reshape(10, 4)
    graphs = []
    for _ in range(2):
        res = masked_sum(X, neighbours=2, rng=np.random.default_rng(0))
        graphs.append(frozenset(res.view.encrypted_shares))
        assert np.allclose(res.total, X.sum(axis=0))
    assert graphs[0] != graphs[1]  # same rng, different graph: it is not derived from the rng
    # A key seed (tests only) reproduces it.
    same = [frozenset(masked_sum(X, neighbours=2, key_seed=7).view.encrypted_shares) for _ in range(2)]
    assert same[0] == same[1]


# -- 7. distributed noise never trusts a default sensitivity ---------------------------------------
def test_distributed_gaussian_needs_an_enforced_sensitivity():
    F, y, k = _data()
    with pytest.raises(ConfigError, match="sensitivity="):
        DistributedGaussian(sigma=1.0)
    noise = DistributedGaussian(sigma=1.0, sensitivity=1.0)
    with pytest.raises(ConfigError, match="clips the records"):
        privfed.fit("fedncm", F, y, k, secure_agg=PairwiseMasking(noise=noise))
    with pytest.raises(ConfigError, match="drop noise="):
        privfed.fit(
            "fedncm",
            F,
            y,
            k,
            num_classes=3,
            num_clients=4,
            privacy=_mech(),
            secure_agg=PairwiseMasking(noise=noise),
        )


# -- 8. secure-aggregation edges -------------------------------------------------------------------
def _clients(K=4, seed=1):
    """K node state machines and their server, run through key advertisement and share distribution."""
    keys = KeySource(seed)
    t = K // 2 + 1
    server = MaskingServer(num_nodes=K, threshold=t, length=3, session=keys(16), active=False)
    nodes = [MaskingNode(u, num_nodes=K, threshold=t, keys=keys) for u in range(K)]
    for _ in ("keys", "shares"):
        for u, msg in server.requests().items():
            server.receive(u, nodes[u].handle(msg))
        server.close()
    return server, nodes


def test_a_client_never_reveals_both_shares_of_a_peer():
    server, nodes = _clients()
    for u, msg in server.requests().items():
        server.receive(u, nodes[u].handle(msg, ring_input=lambda: np.zeros(3, np.uint64)))
    server.close()
    first = nodes[0].handle({"stage": "unmask", "session": server.session, "uploaded": [0, 1, 2, 3]})
    assert first["kind"][first["about"].index(3)] == "b"
    # Now "3 dropped": a second request would ask for its mask key; the node has answered once and stops.
    with pytest.raises(ProtocolAbort, match="out-of-order"):
        nodes[0].handle({"stage": "unmask", "session": server.session, "uploaded": [0, 1, 2]})


def test_a_tampered_share_aborts():
    server, nodes = _clients()
    msg = server.requests()[0]
    i = msg["from"].index(2)
    ct = bytearray(msg["ct"][i])
    ct[-1] ^= 1
    msg["ct"][i] = bytes(ct)
    with pytest.raises(ProtocolAbort, match="from node 2 fails authentication"):
        nodes[0].handle(msg, ring_input=lambda: np.zeros(3, np.uint64))


def test_threshold_and_minimum_inputs():
    X = np.ones((5, 3))
    with pytest.raises(ConfigError, match="more than half"):
        masked_sum(X, threshold=1, key_seed=1)
    with pytest.raises(ConfigError, match="more than half"):
        masked_sum(X, threshold=2, key_seed=1)
    assert np.allclose(masked_sum(X, threshold=3, key_seed=1).total, 5.0)
    with pytest.raises(ProtocolAbort):
        masked_sum(np.ones((2, 3)), dropped_before_upload=[1], key_seed=1)


def test_value_bound_is_enforced_by_the_clients():
    X = np.zeros((3, 2))
    X[1, 0] = 2.0**29
    with pytest.raises(InputError, match=r"client\(s\) \[1\]"):
        masked_sum(X, value_bound=1.0, key_seed=1)
    assert np.allclose(masked_sum(np.ones((3, 2)), value_bound=1.0, key_seed=1).total, 3.0)


def test_ckks_release_grid_stays_above_the_decryption_error():
    from mechanisms.secagg.ckks import ckks_sum
    from mechanisms.secagg.ckks.scheme import CKKSParams

    # Measured: a sum of 20 fresh encryptions at N = 8192, scale 2^40 errs by up to 2^-24.8, so a
    # 2^-30 grid would release key-dependent bits; the default 2^-20 keeps a margin up to 256 clients.
    with pytest.raises(ConfigError, match="precision_bits"):
        CKKSParams(precision_bits=30)
    assert CKKSParams().max_precision_bits(256) >= 20 > CKKSParams().max_precision_bits(300)
    with pytest.raises(ConfigError, match="key-dependent"):
        ckks_sum(np.full((300, 3), 0.5), params=CKKSParams())
    with pytest.raises(InputError, match="agreed bound"):
        ckks_sum(np.array([[0.5, 2.0**29], [0.1, 0.2]]), value_bound=1.0)


# -- 9. count noise with the means in clear --------------------------------------------------------
def test_count_noise_reports_lead_with_the_unprotected_means():
    F, y, k = _data()
    head = privfed.fit(
        "fedcof", F, y, k, num_classes=3, num_clients=4, privacy=LaplaceCountNoise(epsilon=1.0)
    )
    rep = head.privacy
    assert rep.guarantee.startswith("NO DP GUARANTEE for the class means")
    assert not rep.is_private
    assert rep.delta == 0.0 and rep.epsilon == pytest.approx(1.0)  # pure DP for the counts alone
    assert rep.protects.startswith("class counts only")
    uni = privfed.fit(
        "fedcof", F, y, k, num_classes=3, num_clients=4, privacy=UniformCountNoiseNoDP(epsilon=0.5)
    ).privacy
    assert uni.epsilon == math.inf and math.isnan(uni.target_epsilon) and not uni.is_private


# -- 10. smaller facts ------------------------------------------------------------------------------
def test_each_fit_books_one_release_of_a_multi_round_budget():
    F, y, k = _data()
    mech = _mech(rounds=4)
    eps = [
        privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=mech).privacy.epsilon
        for _ in range(4)
    ]
    mu = gdp_mu(1.0, 1e-5)
    for i, e in enumerate(eps, start=1):
        assert e == pytest.approx(gdp_epsilon(mu * math.sqrt(i / 4), 1e-5), rel=1e-9)
    assert eps[-1] == pytest.approx(1.0, rel=1e-9)


def test_fedcof_with_trusted_aggregator_says_its_noise_is_local():
    F, y, k = _data()
    head = privfed.fit(
        "fedcof", F, y, k, num_classes=3, num_clients=4, privacy=_mech(trusted_aggregator=True)
    )
    assert head.privacy.placement == "local"
    assert not any("trusted aggregator" in n for n in head.privacy.notes)
    central = privfed.fit(
        "fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_mech(trusted_aggregator=True)
    ).privacy
    assert central.placement == "central" and any("trusted aggregator" in n for n in central.notes)


def test_opendp_slack_is_calibrated_on_the_coordinates_that_move():
    F, y, k = _data(n=30, d=4)
    mech = _mech(epsilon=2.0, backend="opendp", trusted_aggregator=True)
    head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=mech)
    grid = mech.backend.grid
    sens = {e.block: e.sensitivity for e in mech.ledger.events}
    assert sens["sums"] == pytest.approx(1.0 + grid * math.sqrt(4), rel=1e-12)  # d coordinates, not C d
    assert sens["counts"] == pytest.approx(1.0 + grid, rel=1e-12)
    assert head.privacy.epsilon == pytest.approx(2.0, rel=1e-9)  # calibrated for the slack
    # OpenDP draws from the OS CSPRNG: a seed does not make its noise replayable.
    seeded = privfed.fit(
        "fedncm",
        F,
        y,
        k,
        num_classes=3,
        random_state=0,
        num_clients=4,
        privacy=_mech(epsilon=2.0, backend="opendp", trusted_aggregator=True),
    )
    assert not seeded.privacy.simulation


# -- mechanism arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, match",
    [
        ({"sampling_rate": "a"}, "sampling_rate"),
        ({"max_records": "x", "level": "client"}, "max_records"),
        ({"max_records": -5}, "max_records"),
        ({"max_records": 0}, "max_records"),
        ({"max_records": 10}, "level='client' only"),
    ],
)
def test_mechanism_arguments_are_validated(kw, match):
    with pytest.raises(ConfigError, match=match):
        _mech(**kw)


def test_sizes_are_public_parameters_under_dp_never_taken_from_the_data():
    """Under DP C and K are public: a fit that leaves them to the data is refused, naming what is missing."""
    rng = np.random.default_rng(5)
    F = np.abs(rng.normal(size=(40, 4)))
    y, k = np.arange(40) % 3, np.arange(40) % 4
    mech = lambda: GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)  # noqa: E731
    with pytest.raises(
        ConfigError,
        match=r"num_classes and num_clients must be given.*num_classes=\.\.\., "
        r"num_clients=\.\.\.",
    ):
        privfed.fit("fedncm", F, y, k, privacy=mech(), random_state=0)
    with pytest.raises(ConfigError, match=r"num_classes must be given.*pass num_classes=\.\.\. to fit"):
        privfed.fit("fedncm", F, y, k, num_clients=4, privacy=mech(), random_state=0)
    with pytest.raises(ConfigError, match=r"num_clients must be given.*pass num_clients=\.\.\. to fit"):
        privfed.fit("fedncm", F, y, k, num_classes=3, privacy=mech(), random_state=0)
    # without clients every record is on one client: only num_classes is needed
    assert privfed.fit("fedncm", F, y, num_classes=3, privacy=mech(), random_state=0).weight.shape == (3, 4)
    # given, they fix the release's shape: a neighbour with one record of a new class keeps it
    y2 = y.copy()
    y2[0] = 3
    shapes = {
        privfed.fit(
            "fedncm", F, yi, k, num_classes=4, num_clients=4, privacy=mech(), random_state=0
        ).weight.shape
        for yi in (y, y2)
    }
    assert shapes == {(4, 4)}
    # nothing in the report says a size came from the data
    head = privfed.fit("fedncm", F, y2, k, num_classes=4, num_clients=4, privacy=mech(), random_state=0)
    assert not any("taken from the data" in n for n in (*head.notes, *head.privacy.notes))


def _big_client_data(n_max=5, seed=3):
    """Four clients, client 0 holding far more than n_max records (so the bound scales it)."""
    rng = np.random.default_rng(seed)
    sizes = [40, 3, 4, 6]
    k = np.repeat(np.arange(4), sizes)
    y = np.arange(k.size) % 3
    F = rng.normal(size=(k.size, 4)) * 0.7
    return F, y, k


def _protection(name):
    if name == "mask":
        return dict(secure_agg=PairwiseMasking()), dict(level="client", max_records=5)
    if name == "ckks":
        pytest.importorskip("tenseal")
        from mechanisms.secagg.protection import CKKSAggregation

        return dict(secure_agg=CKKSAggregation()), dict(level="client", max_records=5)
    return {}, dict(level="client", max_records=5, trusted_aggregator=True, sampling_rate=0.5)


@pytest.mark.parametrize("method", ["fed3r", "fed3r-within", "fedcgs"])
@pytest.mark.parametrize("protection", ["mask", "ckks", "sampling"])
def test_client_level_second_moment_methods_run_whatever_a_client_holds(method, protection):
    F, y, k = _big_client_data()
    fit_kw, mech_kw = _protection(protection)
    reports = []
    for data in ((F, y, k), (F[k != 0], y[k != 0], k[k != 0])):  # zero-out neighbour of the big client
        mech = _mech(epsilon=8.0, blocks=("sums", "counts", "second"), **mech_kw)
        head = privfed.fit(
            method, *data, num_classes=3, num_clients=4, privacy=mech, random_state=2, **fit_kw
        )
        assert head.privacy.level == "client" and math.isfinite(head.privacy.epsilon)
        reports.append((head.privacy.guarantee, head.privacy.notes, np.shape(head.weight), head.upload_bytes))
    assert reports[0] == reports[1]  # nothing deterministic tells the neighbours apart


@pytest.mark.parametrize("protection", ["mask", "sampling"])
def test_client_bound_scales_each_clients_second_moment_before_the_sum(protection):
    from privfed.methods import get
    from privfed.stats import compute_client_stats

    F, y, k = _big_client_data()
    fit_kw, mech_kw = _protection(protection)
    mech = _mech(
        epsilon=float("inf"), blocks=("sums", "counts", "second"), **{**mech_kw, "sampling_rate": 1.0}
    )
    method = get("fed3r")
    mech.check(method, fit_kw.get("secure_agg"))
    Fc = mech.clip(F)
    stats = compute_client_stats(Fc, y, k, num_classes=3, fields=("counts", "sums", "second"))
    up = mech.before_upload(stats, method, np.random.default_rng(0))
    for c in range(4):  # independent: each client's clipped records, scaled by min(1, n_max / n_k)
        Fk = Fc[k == c]
        f = min(1.0, 5 / Fk.shape[0])
        np.testing.assert_allclose(up.second[c], f * Fk.T @ Fk, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(up.counts[c].sum(), f * Fk.shape[0], rtol=1e-12)
        np.testing.assert_allclose(up.sums[c].sum(axis=0), f * Fk.sum(axis=0), rtol=1e-12, atol=1e-12)
        # The bounded contribution meets the client-level sensitivities (n_max c^2, n_max c, n_max).
        assert np.linalg.norm(up.second[c]) <= 5 * mech.clip_bound**2 * (1 + 1e-12)


# -- issue 23: every seed that touches a release labels it a simulation ----------------------------
def test_seeded_masking_keys_make_the_release_a_labelled_simulation():
    F, y, k = _data()
    head = privfed.fit(
        "fedncm",
        F,
        y,
        k,
        num_classes=3,
        num_clients=4,
        privacy=_mech(),
        secure_agg=PairwiseMasking(key_seed=1),
    )
    rep = head.privacy
    assert rep.simulation and rep.guarantee.startswith("SIMULATION (seeded noise, replayable)")
    assert any("key_seed=1" in n for n in rep.notes)
    fresh = privfed.fit(
        "fedncm", F, y, k, num_classes=3, num_clients=4, privacy=_mech(), secure_agg=PairwiseMasking()
    )
    assert not fresh.privacy.simulation and "SIMULATION" not in fresh.privacy.guarantee


def test_printed_epsilon_is_never_below_the_computed_one():
    from decimal import Decimal

    # 10 releases at mu chosen so that eps has many digits: the printed value rounds up.
    F, y, k = _data()
    mech = _mech(epsilon=1.23456789, rounds=3)
    head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=mech)
    eps = head.privacy.epsilon
    printed = head.privacy.guarantee.split("(")[1].split(",")[0]
    assert Decimal(printed) >= Decimal(repr(eps)) and float(printed) <= eps * 1.001


# -- issue 23: every method x level x protection x sampling the API accepts keeps its printed epsilon ---------
_GRID_METHODS = {
    "fedncm": ("sums", "counts"),
    "fed3r": ("sums", "counts", "second"),
    "fed3r-within": ("sums", "counts", "second"),
    "fedcgs": ("sums", "counts", "second"),
    "fedlog": ("sums", "counts"),
    "fedcof": ("sums", "counts"),
    "fedcof-oracle": ("sums", "counts"),
}
#: (protection, sampling rate): local noise, a trusted aggregator, masking, CKKS; Poisson sampling by the aggregator.
_PROTECTIONS = [("local", 1.0), ("central", 1.0), ("mask", 1.0), ("ckks", 1.0), ("central", 0.5)]
#: Statistical bounds only where a release costs a few ms (the deterministic checks run everywhere).
_CHEAP = {("fedncm", "central", 1.0), ("fedncm", "local", 1.0), ("fed3r", "central", 1.0)}


def _grid():
    for method in sorted(_GRID_METHODS):
        for level in ("record", "client"):
            for protection, q in _PROTECTIONS:
                marks = (
                    [pytest.mark.slow] if protection == "ckks" else []
                )  # ~1 s a release; masking covers the hooks
                yield pytest.param(
                    method, level, protection, q, marks=marks, id=f"{method}-{level}-{protection}-q{q:g}"
                )


@pytest.mark.parametrize("method, level, protection, q", list(_grid()))
def test_every_accepted_combination_keeps_its_printed_epsilon(method, level, protection, q):
    from decimal import Decimal

    from privfed.audit import audit_release, fit_release, neighbour_battery

    kw = dict(
        epsilon=2.0,
        delta=1e-5,
        clip=3.0,
        blocks=_GRID_METHODS[method],
        level=level,
        sampling_rate=q,
        trusted_aggregator=protection == "central",
    )
    if level == "client":
        kw["max_records"] = 5
    proto = None
    if protection == "mask":
        proto = PairwiseMasking
    elif protection == "ckks":
        from mechanisms.secagg.protection import CKKSAggregation as proto
    run = fit_release(method, lambda: GaussianMechanism(**kw), proto)
    # The worst pairs: a canary moving every coordinate (record level); a client over max_records (client level).
    battery = neighbour_battery(level, max_records=5, oversized=True)
    pair = battery[4] if level == "record" else battery[2]
    cheap = (method, protection, q) in _CHEAP
    res = audit_release(run, [pair], draws=200 if cheap else 0, heldout=100)[0]
    assert not res.flagged, res
    if res.verdict == "refused":  # refused from the configuration alone: the same error on both sides
        with pytest.raises(ConfigError):
            privfed.fit(method, **pair.d0, privacy=GaussianMechanism(**kw), secure_agg=proto and proto())
        return
    assert res.verdict == ("statistical" if cheap else "metadata only"), res
    from privfed.audit import run_once

    # A method may refuse noisy statistics it cannot use (fedcgs with a sampled, nearly empty sum): that is
    # post-processing of the release; the printed epsilon is checked on a run that returns a head.
    outs = [run_once(run, pair.d1, None) for _ in range(5)]
    out = next(o for o in outs if o["error"] is None)
    rep = out["report"]
    assert rep.is_private and rep.epsilon <= 2.0 * (1 + 1e-9)
    printed = (
        rep.guarantee.split("(", 2)[-1].split(",")[0] if rep.simulation else rep.guarantee.split(",")[0][1:]
    )
    assert Decimal(printed) >= Decimal(repr(rep.epsilon)) * (1 - Decimal("1e-12")), (printed, rep.epsilon)


def test_tradeoff_command_runs_fed3r_at_client_level_under_masking(tmp_path, digits_cache):
    # The command of issue 23: a client over --max-records is bounded before masking, not refused.
    import json

    from privfed.tradeoff import main

    out = tmp_path / "tr"
    rc = main(
        [
            "--method",
            "fed3r",
            "--level",
            "client",
            "--secure-agg",
            "mask",
            "--max-records",
            "5",
            "--eps",
            "1",
            "--seeds",
            "1",
            "--clients",
            "10",
            "--no-plot",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads((out / "results.json").read_text())["records"]
    assert rows and all(r["level"] == "client" for r in rows)
