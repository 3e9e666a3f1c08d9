"""GaussianMechanism: calibration pinned, hook behaviour in fit(), exact no-noise limit, refusals."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import privfed
from mechanisms import (
    GaussianMechanism,
    analytic_sigma,
    classic_sigma,
    clip_coordinates,
    clip_l2,
    fedcof_spread_bias,
    gaussian_delta,
    gdp_mu,
)
from privfed.errors import ConfigError, InputError

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

SECOND = ("sums", "counts", "second")
METHOD_BLOCKS = {
    "fedncm": ("sums", "counts"),
    "fed3r": SECOND,
    "fed3r-within": SECOND,
    "fedcgs": SECOND,
    "fedcof": ("sums", "counts"),
    "fedlog": ("sums", "counts"),
}


def _data(seed=0, n=300, d=6, C=3, K=5):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(C), n // C)
    F = rng.normal(size=(y.size, d)) + 3.0 * np.eye(C, d)[y]
    k = rng.permutation(np.arange(y.size) % K)
    return F, y, k


# -- calibration pinned ----------------------------------------------------------------
def test_analytic_and_classic_pinned():
    assert analytic_sigma(1.0, 1e-5) == pytest.approx(3.7306, abs=1e-3)
    assert classic_sigma(1.0, 1e-5) == pytest.approx(4.8448, abs=1e-3)
    # privacy.md: eps = 0.1 -> 48.4 classic vs 30.7 exact.
    assert classic_sigma(0.1, 1e-5) == pytest.approx(48.45, abs=0.05)
    assert analytic_sigma(0.1, 1e-5) == pytest.approx(30.7, abs=0.05)
    assert analytic_sigma(1.0, 1e-5, sensitivity=3.0) == pytest.approx(
        3 * analytic_sigma(1.0, 1e-5), rel=1e-12
    )


def test_gdp_mu_inverts_dp_accounting_and_exact_delta():
    for eps, delta in [(0.3, 1e-6), (1.0, 1e-5), (4.0, 1e-5), (8.0, 1e-3)]:
        s = analytic_sigma(eps, delta)
        assert 1.0 / gdp_mu(eps, delta) == pytest.approx(s, rel=1e-6)
        assert gaussian_delta(eps, s) == pytest.approx(delta, rel=1e-4)


def test_mechanism_sigma_joint_equal_and_weights():
    # joint: one sigma for sums and counts, the Gaussian on the concatenation with sensitivity sqrt(c^2 + 1)
    c = 2.0
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=c, split="joint")
    assert m.sigma["sums"] == pytest.approx(math.sqrt(c * c + 1) * analytic_sigma(1.0, 1e-5), rel=1e-9)
    assert m.sigma["counts"] == pytest.approx(m.sigma["sums"], rel=1e-12)
    m3 = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=c, blocks=SECOND, split="joint")
    assert m3.sensitivity == {"sums": c, "counts": 1.0, "second": c * c}
    assert m3.sigma["second"] == pytest.approx(
        math.sqrt(c**2 + 1 + c**4) * analytic_sigma(1.0, 1e-5), rel=1e-9
    )
    # weights: mu^2 split, sum_b (Delta_b / sigma_b)^2 = mu^2 exactly
    w = GaussianMechanism(
        epsilon=2.0, delta=1e-6, clip=c, blocks=SECOND, split={"sums": 2, "counts": 1, "second": 1}
    )
    mu2 = sum((w.sensitivity[b] / w.sigma[b]) ** 2 for b in SECOND)
    assert math.sqrt(mu2) == pytest.approx(gdp_mu(2.0, 1e-6), rel=1e-9)
    assert (w.sensitivity["sums"] / w.sigma["sums"]) ** 2 == pytest.approx(mu2 / 2, rel=1e-9)
    e = GaussianMechanism(epsilon=2.0, delta=1e-6, clip=c)  # default: equal shares of mu^2
    for b in ("sums", "counts"):
        assert e.sensitivity[b] / e.sigma[b] == pytest.approx(gdp_mu(2.0, 1e-6) / math.sqrt(2), rel=1e-9)


def test_rounds_compose_exactly_in_gdp():
    one = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    for T in (4, 9, 100):
        many = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, rounds=T)
        assert many.sigma["sums"] == pytest.approx(math.sqrt(T) * one.sigma["sums"], rel=1e-9)


def test_fedlog_classic_reproduces_theorem_3_1():
    # FedLog code: d = 100 features plus the constant (m = 101), b = 2, delta = 0.01 -> sigma = 62.23 / eps.
    b, d, delta = 2.0, 100, 0.01
    with pytest.warns(UserWarning, match="classic"):
        m = GaussianMechanism(
            epsilon=2.0,
            delta=delta,
            clip=b,
            clip_norm="coordinate",
            calibration="classic",
            dim=d,
            split="joint",
        )
    paper = math.sqrt(2 * (1 + d * b * b) * math.log(1.25 / delta)) / 2.0
    assert m.sigma["sums"] == pytest.approx(paper, rel=1e-12)
    assert m.sigma["counts"] == pytest.approx(paper, rel=1e-12)
    assert paper * 2.0 == pytest.approx(62.23, abs=0.01)
    assert m.sensitivity["sums"] == pytest.approx(b * math.sqrt(d))


def test_coordinate_clip_needs_dimension():
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=2.0, clip_norm="coordinate")
    with pytest.raises(ConfigError, match="dim="):
        m.sigma
    m.clip(np.zeros((3, 7)))
    assert m.sensitivity["sums"] == pytest.approx(2.0 * math.sqrt(7))
    with pytest.raises(InputError, match="d=5"):
        m.clip(np.zeros((3, 5)))


def test_clipping_functions():
    rng = np.random.default_rng(1)
    F = rng.normal(size=(100, 5)) * 3
    G = clip_l2(F, 2.0)
    norms = np.linalg.norm(F, axis=1)
    assert np.all(np.linalg.norm(G, axis=1) <= 2.0 + 1e-12)
    inside = norms <= 2.0
    np.testing.assert_array_equal(G[inside], F[inside])
    np.testing.assert_allclose(G[~inside], F[~inside] * (2.0 / norms[~inside])[:, None], rtol=1e-12)
    H = clip_coordinates(F, 1.5)
    np.testing.assert_array_equal(H, np.minimum(np.maximum(F, -1.5), 1.5))


# -- invalid parameters --------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(epsilon=0.0), "epsilon must be > 0"),
        (dict(epsilon=-1.0), "epsilon must be > 0"),
        (dict(epsilon=float("nan")), "epsilon must be > 0"),
        (dict(delta=0.0), r"delta must lie in the open interval \(0, 1\)"),
        (dict(delta=1.0), r"delta must lie in the open interval \(0, 1\)"),
        (dict(delta=-1e-5), r"delta must lie"),
        (dict(clip=0.0), "clip must be > 0"),
        (dict(clip=-1.0), "clip must be > 0"),
        (dict(level="sample"), "level must be one of"),
        (dict(blocks=("sums",)), "must include 'sums' and 'counts'"),
        (dict(blocks=("sums", "counts", "scatter")), "blocks must be distinct names"),
        (dict(calibration="rdp"), "calibration must be one of"),
        (dict(rounds=0), r"rounds must be an integer in \[1, 2\*\*53\]"),
        (dict(sampling_rate=0.0), "sampling_rate"),
        (dict(level="client", trusted_aggregator=True), "max_records"),
        (dict(split={"sums": 1.0}), "split weights must name exactly"),
        (dict(backend="gpu"), "unknown noise backend"),
        (dict(calibration="classic", sampling_rate=0.5), "no subsampled version"),
    ],
)
def test_invalid_parameters_refused(kwargs, match):
    base = dict(epsilon=1.0, delta=1e-5, clip=1.0)
    with pytest.raises(ConfigError, match=match):
        GaussianMechanism(**{**base, **kwargs})


def test_privacy_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        GaussianMechanism(1.0, 1e-5, 1.0)  # noqa


def test_hook_refusals_in_fit():
    F, y, k = _data()
    client = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, level="client", max_records=100)
    with pytest.raises(ConfigError, match="trusted_aggregator=True"):
        privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=5, privacy=client)
    with pytest.raises(ConfigError, match=r"blocks=\('sums', 'counts', 'second'\)"):
        privfed.fit(
            "fed3r",
            F,
            y,
            k,
            num_classes=3,
            num_clients=5,
            privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0),
        )
    with pytest.raises(ConfigError, match="does not use the second moment"):
        privfed.fit(
            "fedncm",
            F,
            y,
            k,
            num_classes=3,
            num_clients=5,
            privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, blocks=SECOND),
        )
    with pytest.raises(ConfigError, match="per-class second moments"):
        privfed.fit(
            "fedcof-oracle",
            F,
            y,
            k,
            num_classes=3,
            num_clients=5,
            privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0),
        )
    trusted_client = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=1.0, level="client", max_records=100, trusted_aggregator=True
    )
    with pytest.raises(ConfigError, match="individual statistics"):
        privfed.fit("fedcof", F, y, k, num_classes=3, num_clients=5, privacy=trusted_client)


# -- the no-noise limit is exact ---------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(METHOD_BLOCKS))
def test_infinite_epsilon_reproduces_non_private_fit(method):
    F, y, k = _data(seed=3)
    norm = "coordinate" if method == "fedlog" else "l2"
    clip = 1.5 if norm == "coordinate" else 2.0
    mech = GaussianMechanism(
        epsilon=math.inf, delta=1e-5, clip=clip, blocks=METHOD_BLOCKS[method], clip_norm=norm
    )
    private = privfed.fit(method, F, y, k, num_classes=3, num_clients=5, privacy=mech, random_state=4)
    Fc = clip_coordinates(F, clip) if norm == "coordinate" else clip_l2(F, clip)
    clear = privfed.fit(method, Fc, y, k, random_state=4)
    np.testing.assert_allclose(private.weight, clear.weight, rtol=0, atol=1e-12)
    np.testing.assert_allclose(private.bias, clear.bias, rtol=0, atol=1e-12)
    assert private.privacy.guarantee.startswith("NO DP GUARANTEE")
    assert not private.privacy.is_private
    # test features go through the same clipping
    np.testing.assert_array_equal(private.predict(F), clear.predict(Fc))
    # a clip that never binds gives the plain non-private head
    big = GaussianMechanism(
        epsilon=math.inf, delta=1e-5, clip=1e6, blocks=METHOD_BLOCKS[method], clip_norm=norm
    )
    plain = privfed.fit(method, F, y, k, num_classes=3, num_clients=5, privacy=big, random_state=4)
    np.testing.assert_allclose(plain.weight, privfed.fit(method, F, y, k, random_state=4).weight, atol=1e-12)


@pytest.mark.parametrize("method", ["fedlog", "fedcof", "fed3r-within", "fedcgs"])
def test_noisy_heads_stay_finite_and_say_what_they_repaired(method):
    F, y, k = _data(seed=5, n=90, K=6)
    norm = "coordinate" if method == "fedlog" else "l2"
    mech = GaussianMechanism(epsilon=0.05, delta=1e-5, clip=2.0, blocks=METHOD_BLOCKS[method], clip_norm=norm)
    head = privfed.fit(method, F, y, k, num_classes=3, num_clients=6, privacy=mech, random_state=0)
    assert np.all(np.isfinite(head.weight)) and np.all(np.isfinite(head.bias))
    assert head.notes, "strong noise must force a repair that the head reports"
    assert head.privacy.epsilon == pytest.approx(0.05, rel=1e-6)


# -- who adds the noise -----------------------------------------------------------------------------
def _zero_stats(K, C=10, d=50, second=False):
    from privfed.stats import ClientStats

    return ClientStats(
        counts=np.ones((K, C)), sums=np.zeros((K, C, d)), second=np.zeros((K, d, d)) if second else None
    )


def _var_ok(values, expected):
    # Sample variance of n iid normals has relative sd sqrt(2/n); allow 5 sd.
    n = values.size
    return abs(values.var() / expected - 1) < 5 * math.sqrt(2 / n)


def test_record_level_noise_placement():
    from privfed.methods import get

    rng = np.random.default_rng(0)
    method = get("fedncm")
    K = 4
    local = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    local.check(method, None)
    up = local.before_upload(_zero_stats(K), method, rng)
    total = local.after_aggregate(up.total(), method, rng)
    s2 = local.sigma["sums"] ** 2
    assert _var_ok(total.sums, K * s2)  # every client noises with the full sigma
    central = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, trusted_aggregator=True)
    central.check(method, None)
    up = central.before_upload(_zero_stats(K), method, rng)
    assert np.all(up.sums == 0)
    assert _var_ok(central.after_aggregate(up.total(), method, rng).sums, s2)
    split = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    split.check(method, object())  # any secure_agg object: clients split the noise
    up = split.before_upload(_zero_stats(K), method, rng)
    assert _var_ok(up.sums, s2 / K)
    assert _var_ok(up.total().sums, s2)
    assert "secure aggregation" in " ".join(split.report().notes)
    for m in (local, central, split):
        assert m.report().epsilon == pytest.approx(1.0, rel=1e-6)


def test_second_moment_noise_is_symmetric_with_claimed_variance():
    from privfed.methods import get

    rng = np.random.default_rng(2)
    m = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=1.0, blocks=SECOND)
    m.check(get("fed3r"), None)
    out = m.before_upload(_zero_stats(2, d=40, second=True), get("fed3r"), rng)
    np.testing.assert_array_equal(out.second, np.swapaxes(out.second, 1, 2))
    iu = np.triu_indices(40)
    assert _var_ok(out.second[:, iu[0], iu[1]], m.sigma["second"] ** 2)


def test_client_level_bounds_each_client():
    from privfed.methods import get
    from privfed.stats import ClientStats

    m = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=1.0, level="client", max_records=10, trusted_aggregator=True
    )
    assert m.sensitivity == {"sums": 10.0, "counts": 10.0}
    m.check(get("fedncm"), None)
    stats = ClientStats(counts=np.array([[4.0, 16.0], [3.0, 2.0]]), sums=np.ones((2, 2, 3)))
    out = m.before_upload(stats, get("fedncm"), np.random.default_rng(0))
    np.testing.assert_allclose(out.counts, [[2.0, 8.0], [3.0, 2.0]], rtol=1e-15)
    np.testing.assert_allclose(out.sums[0], 0.5 * np.ones((2, 3)), rtol=1e-15)
    np.testing.assert_array_equal(out.sums[1], stats.sums[1])
    F, y, k = _data()
    head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=5, privacy=m)
    assert "client level" in head.privacy.guarantee


def test_release_one_client():
    F, y, _ = _data(n=30)
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, blocks=SECOND)
    out = m.release(F, y, rng=np.random.default_rng(0), num_classes=3)
    assert out.num_clients == 1 and out.second is not None
    many = m.release(F, y, rng=np.random.default_rng(0), num_classes=3, draws=7)
    assert many.num_clients == 7
    # eight releases so far in the ledger: exact GDP composition of 1 + 7
    one = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, blocks=SECOND)
    from mechanisms import gdp_epsilon

    assert m.report().epsilon == pytest.approx(gdp_epsilon(math.sqrt(8) * one.mu, 1e-5), rel=1e-9)
    with pytest.raises(ConfigError, match="Generator"):
        m.release(F, y, rng=0)


def test_report_is_computed_from_ledger_and_serialises():
    F, y, k = _data()
    m = GaussianMechanism(epsilon=2.0, delta=1e-6, clip=1.0)
    assert m.report().guarantee == "nothing released yet"
    head = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=5, privacy=m)
    rep = head.privacy
    assert rep.epsilon == pytest.approx(2.0, rel=1e-6) and rep.delta == 1e-6
    assert rep.guarantee.startswith("(2, 1e-06)-DP at record level")
    assert rep.sigma == m.sigma and rep.rounds == 1 and rep.level == "record"
    json.dumps(rep.as_dict())
    with pytest.raises(Exception):
        rep.epsilon = 1.0  # frozen
    privfed.fit(
        "fedncm", F, y, k, num_classes=3, num_clients=5, privacy=m
    )  # a second release of the same data composes
    assert m.report().epsilon > 2.0


def test_classic_report_states_the_exact_epsilon():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = GaussianMechanism(epsilon=0.5, delta=1e-5, clip=1.0, calibration="classic")
    F, y, k = _data()
    rep = privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=5, privacy=m).privacy
    assert rep.epsilon < 0.5  # classic is loose below eps = 1: the exact epsilon is smaller


def test_upload_noise_variance_feeds_fedcof():
    from privfed.methods import get
    from privfed.methods.fedcof import noise_bias

    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    m.check(get("fedcof"), None)
    assert m.upload_noise_variance(get("fedcof"))["sums"] == pytest.approx(m.sigma["sums"] ** 2)
    counts = np.array([[3.0, 0.0, 5.0], [4.0, 2.0, 1.0], [10.0, 7.0, 0.0]])
    mask = counts > 0
    np.testing.assert_allclose(fedcof_spread_bias(counts, 2.5), noise_bias(counts, mask, 2.5), rtol=1e-12)


def test_fedcof_spread_bias_monte_carlo():
    # Eq. 6 spread of noisy means minus clean spread averages to bias * I.
    rng = np.random.default_rng(7)
    K, d, s2 = 5, 3, 4.0
    n = np.array([3.0, 5.0, 8.0, 2.0, 6.0])
    sums = rng.normal(size=(K, d)) * n[:, None]

    def spread(S):
        mu_k = S / n[:, None]
        mu = S.sum(0) / n.sum()
        D = mu_k - mu
        return (n[:, None, None] * D[:, :, None] * D[:, None, :]).sum(0) / (K - 1)

    noisy = sums[None] + rng.normal(scale=math.sqrt(s2), size=(2000, K, d))
    mean_diag = np.mean([np.trace(spread(S)) for S in noisy]) / d
    bias = fedcof_spread_bias(n[:, None], s2)[0]
    # The per-draw trace/d has sd ~0.87 here (chi-square-like), so the mean of 2000 draws has
    # standard error ~0.02; 0.12 is 6 standard errors.
    assert mean_diag - np.trace(spread(sums)) / d == pytest.approx(bias, abs=0.12)


def test_dropout_tolerance_keeps_sigma_after_t_dropouts():
    from privfed.methods import get

    method = get("fedncm")
    K, t = 5, 2
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dropout_tolerance=t)
    m.check(method, object())
    up = m.before_upload(_zero_stats(K), method, np.random.default_rng(4))
    s2 = m.sigma["sums"] ** 2
    assert _var_ok(up.sums, s2 / (K - t))
    assert _var_ok(up.clients(np.arange(K - t)).total().sums, s2)  # K - t survivors still carry sigma^2
    assert "sigma^2/(K - 2)" in " ".join(m.report().notes)
    with pytest.raises(ConfigError, match="dropout_tolerance"):
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dropout_tolerance=-1)
    few = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, dropout_tolerance=5)
    few.check(method, object())
    with pytest.raises(ConfigError, match="more than that many clients"):
        few.before_upload(_zero_stats(K), method, np.random.default_rng(0))


@pytest.mark.parametrize("level", ["record", "client"])
def test_with_pairwise_masking(level):
    from mechanisms import make_secure_agg

    F, y, k = _data(seed=2)
    m = GaussianMechanism(
        epsilon=4.0,
        delta=1e-5,
        clip=2.0,
        blocks=SECOND,
        level=level,
        max_records=100 if level == "client" else None,
    )
    head = privfed.fit(
        "fed3r-within",
        F,
        y,
        k,
        num_classes=3,
        num_clients=5,
        privacy=m,
        secure_agg=make_secure_agg("mask"),
        random_state=0,
    )
    assert np.all(np.isfinite(head.weight))
    assert head.privacy.epsilon == pytest.approx(4.0, rel=1e-6)
    assert f"at {level} level" in head.privacy.guarantee
    with pytest.raises(ConfigError, match="secure protocol is not supported"):
        privfed.fit(
            "fedcof",
            F,
            y,
            k,
            num_classes=3,
            num_clients=5,
            privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0),
            secure_agg=make_secure_agg("mask"),
        )


def test_noise_aware_helpers_exact():
    from mechanisms import debias_covariances, outer_product_bias, repair_psd
    from mechanisms.dp.noise_aware import drop_small_counts
    from privfed.stats import ClientStats

    rng = np.random.default_rng(11)
    A = rng.normal(size=(4, 4))
    S = np.stack([A @ A.T, np.eye(4) * 0.5])
    out, raised = debias_covariances(S, np.array([0.0, 2.0]))
    np.testing.assert_allclose(out[0], S[0], atol=1e-9)  # PSD and no bias: unchanged
    np.testing.assert_allclose(out[1], 0.0, atol=1e-12)  # 0.5 I - 2 I projects to 0
    assert raised == 4
    G = np.diag([3.0, -1.0, 2.0])
    R, r = repair_psd(G)
    np.testing.assert_allclose(R, np.diag([3.0, 0.0, 2.0]), atol=1e-12)
    assert r == 1
    np.testing.assert_array_equal(outer_product_bias(2.0, 4.0, 3), 0.5 * np.eye(3))
    st = ClientStats(counts=np.array([[0.4, 3.0], [5.0, -1.0]]), sums=np.ones((2, 2, 2)))
    kept, dropped = drop_small_counts(st, 1.0)
    np.testing.assert_array_equal(kept.counts, [[0.0, 3.0], [5.0, 0.0]])
    np.testing.assert_array_equal(kept.sums[0, 0], 0.0)
    assert dropped == 1


# -- issue 23: printing rounds up; the PLD accountant calibrates without sampling ------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False))
def test_format_up_never_prints_below_the_value(x):
    from decimal import Decimal

    from mechanisms.dp.ledger import format_up

    text = format_up(x)
    printed, exact = Decimal(text), Decimal(repr(x))
    assert printed >= exact * (1 - Decimal("1e-12"))  # at most the accountants' resolution below
    assert printed <= exact * Decimal("1.001") + Decimal("1e-320")  # four significant figures
    assert float(text) == pytest.approx(x, rel=1e-3)


def test_format_up_examples():
    from mechanisms.dp.ledger import format_up

    assert format_up(1.00005) == "1.001"  # "%.4g" prints 1: below the true epsilon
    assert format_up(3.14159) == "3.142" and format_up(1.23449) == "1.235"
    assert format_up(1e-5) == "1e-05" and format_up(9.99999) == "10" and format_up(math.inf) == "inf"


@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0])
def test_pld_accountant_calibrates_without_sampling(eps):
    from mechanisms.dp.calibration import gdp_mu

    mech = GaussianMechanism(epsilon=eps, delta=1e-5, clip=1.0, accountant="pld")
    # The PLD's pessimistic discretisation asks for slightly more noise than the exact GDP calibration.
    assert gdp_mu(eps, 1e-5) * 0.995 <= mech.mu <= gdp_mu(eps, 1e-5)
    rng = np.random.default_rng(0)
    mech.release(rng.normal(size=(5, 3)), np.arange(5) % 2, rng=rng)
    assert mech.report().epsilon <= eps * (1 + 1e-9)


# -- issue 23: no bare exception from a mechanism or accountant for any accepted parameter ---------
import os  # noqa: E402

from privfed.errors import PrivfedError  # noqa: E402

_budgets = st.tuples(
    st.one_of(st.floats(min_value=1e-3, max_value=20.0), st.just(math.inf)),
    st.floats(min_value=1e-12, max_value=0.5),
)


@settings(
    max_examples=int(os.environ.get("PRIVFED_HYPOTHESIS_EXAMPLES", 60)),
    deadline=None,
    derandomize=True,
    database=None,
)
@given(
    budget=_budgets,
    clip=st.floats(min_value=1e-6, max_value=1e6),
    level=st.sampled_from(["record", "client"]),
    second=st.booleans(),
    calibration=st.sampled_from(["analytic", "classic"]),
    clip_norm=st.sampled_from(["l2", "coordinate"]),
    rounds=st.integers(min_value=1, max_value=50),
    q=st.one_of(st.just(1.0), st.floats(min_value=1e-3, max_value=1.0)),
    split=st.sampled_from(["equal", "joint"]),
    accountant=st.sampled_from(["auto", "gdp", "pld", "prv", "rdp"]),
    max_records=st.integers(min_value=1, max_value=10_000),
)
def test_mechanism_accepts_or_refuses_clearly(
    budget, clip, level, second, calibration, clip_norm, rounds, q, split, accountant, max_records
):
    import warnings

    eps, delta = budget
    kw = dict(
        epsilon=eps,
        delta=delta,
        clip=clip,
        level=level,
        calibration=calibration,
        clip_norm=clip_norm,
        rounds=rounds,
        sampling_rate=q,
        split=split,
        accountant=accountant,
        dim=4,
        blocks=("sums", "counts", "second") if second else ("sums", "counts"),
        trusted_aggregator=level == "client",
    )
    if level == "client":
        kw["max_records"] = max_records
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mech = GaussianMechanism(**kw)
        except PrivfedError:
            return  # refused with a named, user-facing error
        assert all(math.isfinite(s) and s >= 0 for s in mech.sigma.values())
        rng = np.random.default_rng(0)
        if q == 1.0 and level == "record":
            mech.release(rng.normal(size=(6, 4)), np.arange(6) % 2, rng=rng)
            rep = mech.report()
            assert rep.epsilon >= 0 and (
                math.isinf(eps) or rep.epsilon <= eps * (1 + 1e-6) or calibration == "classic"
            )
            assert isinstance(rep.guarantee, str) and rep.guarantee


def test_noise_aware_estimators_refuse_what_would_give_nan_or_a_wrong_bias():
    """NaN variances, counts and floors gave NaN biases and matrices, a negative variance a bias of -I, a complex
    G lost its imaginary part with a warning, counts of 1e-320 overflowed the bias, a string was a TypeError."""
    import warnings

    from mechanisms.dp.noise_aware import (
        debias_covariances,
        fedcof_spread_bias,
        outer_product_bias,
        repair_psd,
    )
    from privfed.errors import InputError

    nan = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cases = [
            (lambda: repair_psd(np.full((2, 2), nan)), "G holds NaN/inf"),
            (lambda: repair_psd(np.eye(2) * 1j), "G is complex"),
            (lambda: outer_product_bias(nan, 1.0, 2), "noise_var must be a finite number >= 0"),
            (lambda: outer_product_bias(-1.0, 1.0, 2), "noise_var must be a finite number >= 0"),
            (lambda: outer_product_bias(1.0, nan, 2), "total_count must be a finite number > 0"),
            (lambda: fedcof_spread_bias(np.ones((3, 2)), nan), "noise_var must be a finite number"),
            (lambda: fedcof_spread_bias(np.ones((3, 2)), "1"), "noise_var must be a number"),
            (lambda: fedcof_spread_bias([[1e-320, 1], [1e-320, 1]], 1.0), "drop them first"),
            (
                lambda: debias_covariances(np.eye(2)[None], np.zeros(1), floor=nan),
                "floor must be a finite number",
            ),
        ]
        for call, match in cases:
            with pytest.raises(InputError, match=match):
                call()
        # K_c = 3 shares of n = 1 each, N = 3: s2 / 2 * (3 - 1) = s2
        np.testing.assert_allclose(fedcof_spread_bias(np.ones((3, 2)), 2.0), [2.0, 2.0], rtol=1e-15)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"split": {"sums": "1", "counts": 1}}, "split weights must be numbers"),  # "1" was a weight of 1
        ({"blocks": None}, "blocks must be distinct names"),  # a TypeError
        ({"rounds": 10**400}, r"rounds must be an integer in \[1, 2\*\*53\]"),  # OverflowError
        ({"level": "client", "max_records": 10**400}, r"max_records must be an integer in \[1, 2\*\*53\]"),
        ({"clip_norm": "coordinate", "dim": 10**400}, r"dim must be an integer in \[1, 2\*\*53\]"),
        ({"clip_norm": "coordinate", "dim": True}, r"dim must be an integer"),  # was a dim of 1
    ],
)
def test_mechanism_parameters_the_accounting_would_misread_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, **kw)


def test_split_weights_near_the_float_limit_give_the_equal_split():
    """Weights of 1e308 each summed to inf and divided to 0 (a ZeroDivisionError)."""
    big = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, split={"sums": 1e308, "counts": 1e308})
    assert big.sigma == GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, split="equal").sigma
