"""Multi-round FedLog's release runs the release plan: one ReleasePlan per round, one trace per round,
the guarantee composed from the traces' events.

Each round's sigma, noise placement and released values are checked against an independent
computation: the exact GDP calibration of the augmented statistic, and the seeded generator's draws
where the placement puts them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms.dp.calibration import gdp_mu
from privfed.release import ReleaseTrace
from privfed.rounds.release import AugmentedFedLog, RoundRelease, RoundsDP, augmented, noise_generator

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, C, d, R = 5, 3, 6, 3
m = d + 1
B = 1.5  # coordinate clip


def _stack(seed: int = 0) -> np.ndarray:
    """Per-client augmented statistics of clipped features: counts in column 0, sums in [-n b, n b]."""
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 40, size=(K, C)).astype(np.float64)
    A = np.empty((K, C, m))
    A[..., 0] = n
    A[..., 1:] = rng.uniform(-B, B, size=(K, C, d)) * n[..., None]
    return A


CASES = {
    "central-theorem": dict(placement="central", bodies_trained=False),
    "central-upload": dict(placement="central", max_records=20),
    "local-upload": dict(placement="local", max_records=20),
    "local-theorem": dict(placement="local", bodies_trained=False),
    "client-central": dict(level="client", placement="central", max_records=20),
    "paper": dict(calibration="paper", record_bound="theorem", bodies_trained=False),
    "distributed": dict(placement="distributed", max_records=20, tolerate=1),
}


def _dp(kw, **more) -> RoundsDP:
    return RoundsDP(epsilon=2.0, delta=1e-5, clip=B, clip_norm="coordinate", rounds=R, dim=d, **kw, **more)


def _factor(kw) -> float:
    if kw.get("level") == "client":
        return kw["max_records"]
    return (
        1.0
        if kw.get("bodies_trained") is False or kw.get("record_bound") == "theorem"
        else 2.0 * kw["max_records"]
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigma_is_the_exact_calibration_of_the_augmented_statistic(case):
    kw = CASES[case]
    dp = _dp(kw)
    delta_1 = math.sqrt(1 + d * B * B)  # one record: phi (x) e_y with phi = [1, f], |f_j| <= b
    assert dp.sensitivity == pytest.approx(_factor(kw) * delta_1, rel=1e-15)
    if kw.get("calibration") == "paper":
        expect = dp.sensitivity * math.sqrt(2 * math.log(1.25 / 1e-5)) / 2.0  # classic sigma, per release
    else:
        expect = dp.sensitivity * math.sqrt(R) / gdp_mu(2.0, 1e-5)  # R releases compose to the budget in GDP
    assert dp.sigma == pytest.approx(expect, rel=1e-12)
    assert dp.mechanism.sigma == {"sums": dp.sigma, "counts": dp.sigma}


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if c != "distributed"])
def test_seeded_release_puts_the_draws_where_the_placement_says(case):
    kw = CASES[case]
    dp = _dp(kw)
    dp.declare_randomness(seeded=True, noise_seed=4)
    release = RoundRelease(dp, "none", num_clients=K)
    A = _stack()
    bounded = A * dp.upload_factors(A)[:, None, None]
    if kw.get("max_records") and kw.get("bodies_trained") is not False:
        assert (dp.upload_factors(A) < 1).any()  # the bound is exercised
    for r in range(R):
        rng, ref = noise_generator(4, r), noise_generator(4, r)
        out = release(A, rng)
        if dp.placement == "central":  # one draw on the (C, m) sum
            expect = bounded.sum(0) + ref.normal(0.0, dp.sigma, size=(C, m))
        else:  # every client draws on its own (C, m) upload, in client order
            expect = (bounded + ref.normal(0.0, dp.sigma, size=(K, C, m))).sum(0)
        np.testing.assert_allclose(out, expect, rtol=1e-13, atol=1e-12 * np.abs(expect).max())
    # one trace per round, each one release of the augmented statistic at the calibrated sigma
    assert len(dp.traces) == R and all(isinstance(t, ReleaseTrace) for t in dp.traces)
    for t in dp.traces:
        (e,) = t.events
        assert e["block"] == "augmented" and e["scale"] == dp.sigma and e["sensitivity"] == dp.sensitivity
        assert t.randomness == "seeded"
        assert t.server_view().kind == "uploads"
    rep = dp.report()
    assert rep.releases == R and rep.simulation
    mu = dp.sensitivity / dp.sigma * math.sqrt(R)
    assert rep.mu_total == pytest.approx(mu, rel=1e-12)


def test_the_server_view_of_a_central_round_is_the_uploads_and_the_release_is_the_noisy_sum():
    dp = _dp(CASES["central-upload"])
    release = RoundRelease(dp, "none", num_clients=K)
    A = _stack(1)
    head = release.release(A, np.random.default_rng(0))
    t = head.trace
    assert t.server_view().kind == "uploads" and t.release_view().kind == "noisy-sum"
    np.testing.assert_array_equal(augmented(t.server_view().stats), A * dp.upload_factors(A)[:, None, None])
    assert [r.stage for r in t.records] == ["client-release", "sum", "central-noise", "method", "report"]
    assert t.stage("report").values["bytes"]["total"] == 4 * K * (m * C + 1)


def test_unseeded_rounds_draw_from_os_entropy_and_say_so():
    dp = _dp(CASES["central-theorem"])
    dp.declare_randomness(seeded=False)
    release = RoundRelease(dp, "none", num_clients=K)
    a, b = release(_stack(), noise_generator(None, 0)), release(_stack(), noise_generator(None, 0))
    assert not np.array_equal(a, b)
    assert all(t.randomness == "os-entropy" for t in dp.traces)
    rep = dp.report()
    assert not rep.simulation and "SIMULATION" not in rep.guarantee


def test_distributed_shares_under_masking_are_charged_from_the_shares_present():
    K6, drop = 6, 2
    dp = RoundsDP(
        epsilon=1.0, delta=1e-5, clip=B, rounds=2, placement="distributed", dim=d, max_records=20, tolerate=1
    )
    release = RoundRelease(dp, "mask", num_clients=K6, dropouts=drop)
    rng = np.random.default_rng(0)
    A = np.concatenate([_stack(2), _stack(3)])[:K6]
    for _ in range(2):
        release(A, rng)
    for t, call in zip(dp.traces, release.calls):
        assert call["uploaded"] == K6 - drop
        (e,) = t.events
        assert e["scale"] == pytest.approx(dp.sigma * math.sqrt((K6 - drop) / (K6 - 1)), rel=1e-12)
        assert t.server_view().kind == "secure-sums" and len(t.server_view().arrays) == 1
    rep = dp.report()
    assert rep.mu_total == pytest.approx(
        math.sqrt(2) * dp.sensitivity / (dp.sigma * math.sqrt((K6 - drop) / (K6 - 1))), rel=1e-12
    )


# ---------------------------------------------------------------- the mechanism's model of the bound
def test_the_sensitivity_object_gives_each_bound_its_factor():
    from mechanisms import StatisticSensitivity

    c = 3.0
    blocks = ("sums", "counts", "second")
    for kw, f in (
        (dict(level="record"), 1.0),
        (dict(level="client", max_records=7), 7.0),
        (dict(level="record", record_bound="upload", max_records=7), 14.0),
    ):
        s = StatisticSensitivity(clip_l2=c, **kw)
        assert s.per_block(blocks) == {"sums": f * c, "counts": f, "second": f * c * c}
        assert s.joint() == pytest.approx(f * math.hypot(1.0, c), rel=1e-15)
        assert s.bounds_uploads == (f != 1.0)
    with pytest.raises(Exception, match="max_records"):
        StatisticSensitivity(clip_l2=c, record_bound="upload")


def test_the_upload_bound_scales_each_client_and_books_twice_n_max():
    from mechanisms import GaussianMechanism
    from privfed.errors import ConfigError
    from privfed.stats import ClientStats

    mech = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=B, clip_norm="coordinate", dim=d, record_bound="upload", max_records=20
    )
    assert mech.sensitivity == {"sums": 40.0 * B * math.sqrt(d), "counts": 40.0}
    A = _stack(5)
    n_k = A[..., 0].sum(-1)
    assert (n_k > 20).any()
    stats = ClientStats(counts=A[..., 0], sums=A[..., 1:])
    # the bound before the noise: with an infinite budget the upload is the bounded statistic itself
    free = GaussianMechanism(
        epsilon=math.inf,
        delta=1e-5,
        clip=B,
        clip_norm="coordinate",
        dim=d,
        record_bound="upload",
        max_records=20,
    )
    free.check(AugmentedFedLog(), None)
    out = free.before_upload(stats, AugmentedFedLog(), np.random.default_rng(0))
    np.testing.assert_allclose(augmented(out), A * np.minimum(1.0, 20 / n_k)[:, None, None], rtol=1e-15)
    with pytest.raises(ConfigError, match="max_records"):
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=B, record_bound="upload")
    with pytest.raises(ConfigError, match="record-level"):
        GaussianMechanism(
            epsilon=1.0, delta=1e-5, clip=B, level="client", max_records=5, record_bound="upload"
        )
    with pytest.raises(ConfigError, match="augmented"):
        GaussianMechanism(
            epsilon=1.0, delta=1e-5, clip=B, blocks=("sums", "counts", "second"), split="augmented"
        )
