"""Count noise (FedCOF App. I.1): distributions, the clip-and-drop rule, honest reports."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import privfed
from mechanisms import (
    GaussianCountNoise,
    GeometricCountNoise,
    LaplaceCountNoise,
    UniformCountNoiseNoDP,
    analytic_sigma,
)
from mechanisms.dp.count_noise import drop_clipped
from privfed.errors import ConfigError
from privfed.stats import ClientStats

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(4), 60)
    F = rng.normal(size=(y.size, 5)) + 2.0 * np.eye(4, 5)[y]
    k = rng.integers(0, 6, size=y.size)
    return F, y, k


def _moments_ok(x, var):
    # mean within 5 standard errors; variance within 5 sd of the sample variance
    # (relative sd sqrt((kurtosis - 1)/n) <= sqrt(5/n) for these laws; Laplace kurtosis 6).
    n = x.size
    return abs(x.mean()) < 5 * math.sqrt(var / n) and abs(x.var() / var - 1) < 5 * math.sqrt(5 / n)


def test_noise_laws():
    rng = np.random.default_rng(0)
    z = np.zeros(200000)
    lap = LaplaceCountNoise(epsilon=0.5).perturb(z, rng)
    assert _moments_ok(lap, 2 * (1 / 0.5) ** 2)
    geo = GeometricCountNoise(epsilon=0.5).perturb(z, rng)
    assert np.all(geo == np.round(geo))
    a = math.exp(-0.5)
    assert _moments_ok(geo, 2 * a / (1 - a) ** 2)  # two-sided geometric variance
    # P(0) = (1 - a) / (1 + a); binomial sd of the frequency, 5 sd
    p0 = (1 - a) / (1 + a)
    assert abs(np.mean(geo == 0) - p0) < 5 * math.sqrt(p0 * (1 - p0) / z.size)
    g = GaussianCountNoise(epsilon=1.0, delta=1e-5)
    assert g.sigma == pytest.approx(analytic_sigma(1.0, 1e-5), rel=1e-12)
    assert _moments_ok(g.perturb(z, rng), g.sigma**2)
    n = np.full(200000, 40.0)
    u = UniformCountNoiseNoDP(epsilon=0.25).perturb(n, rng) - n
    assert np.all(np.abs(u) <= 0.75 * 40)
    assert _moments_ok(u, (2 * 0.75 * 40) ** 2 / 12)
    assert np.all(UniformCountNoiseNoDP(epsilon=0.25).perturb(np.zeros(10), rng) == 0)  # 0 stays 0


def test_clip_at_zero_and_drop_keeps_exact_means():
    stats = ClientStats(
        counts=np.array([[4.0, 2.0, 0.0]]), sums=np.array([[[4.0, 8.0], [2.0, -2.0], [0.0, 0.0]]])
    )
    out, dropped = drop_clipped(stats, np.array([[6.0, -1.0, 3.0]]))
    # the class without data keeps its positive noisy count: survival depends on the noise only
    np.testing.assert_array_equal(out.counts, [[6.0, 0.0, 3.0]])
    np.testing.assert_array_equal(out.sums[0, 0], [6.0, 12.0])  # n~ times the exact mean (1, 2)
    np.testing.assert_array_equal(out.sums[0, 1:], 0.0)  # dropped; no mean to send
    assert dropped == 1


def test_released_counts_do_not_reveal_absent_classes():
    # An absent class (n = 0) and a singleton (n = 1) must be released with overlapping laws:
    # the fraction of positive noisy counts differs by at most the eps-DP factor.
    eps = 1.0
    rng = np.random.default_rng(3)
    K = 20000
    counts = np.tile([[0.0, 1.0]], (K, 1))
    stats = ClientStats(counts=counts, sums=np.ones((K, 2, 2)) * counts[..., None])
    mech = LaplaceCountNoise(epsilon=eps)
    out = mech.before_upload(stats, None, rng)
    p0, p1 = np.mean(out.counts[:, 0] > 0), np.mean(out.counts[:, 1] > 0)
    # Laplace(1): P(n~ > 0) = 0.5 for n = 0 and 1 - 0.5 e^-1 = 0.816 for n = 1; binomial sd ~0.0035, 5 sd.
    assert p0 == pytest.approx(0.5, abs=0.018) and p1 == pytest.approx(1 - 0.5 * math.exp(-1), abs=0.018)
    assert p1 <= math.exp(eps) * p0


@pytest.mark.parametrize(
    "mech",
    [
        LaplaceCountNoise(epsilon=0.5),
        GeometricCountNoise(epsilon=0.5),
        GaussianCountNoise(epsilon=1.0, delta=1e-5),
    ],
)
def test_dp_count_noise_in_fit_reports_scope(mech):
    F, y, k = _data()
    head = privfed.fit("fedcof", F, y, k, num_classes=4, num_clients=6, privacy=mech, random_state=0)
    assert np.all(np.isfinite(head.weight))
    rep = head.privacy
    assert "class counts only" in rep.guarantee and "NO DP GUARANTEE for the class means" in rep.guarantee
    assert rep.epsilon == pytest.approx(mech.epsilon, rel=1e-6)
    json.dumps(rep.as_dict())


def test_uniform_count_noise_says_no_dp_everywhere():
    F, y, k = _data()
    mech = UniformCountNoiseNoDP(epsilon=0.1)
    assert "no DP guarantee" in mech.name
    head = privfed.fit("fedcof", F, y, k, num_classes=4, num_clients=6, privacy=mech, random_state=0)
    rep = head.privacy
    assert rep.guarantee.startswith("NO DP GUARANTEE")
    assert rep.epsilon == math.inf and not rep.is_private
    assert "no DP guarantee" in rep.mechanism
    assert "NO DP GUARANTEE" in json.dumps(rep.as_dict())


def test_count_noise_refusals():
    F, y, k = _data()
    with pytest.raises(ConfigError, match="epsilon must be > 0"):
        LaplaceCountNoise(epsilon=0)
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        UniformCountNoiseNoDP(epsilon=1.5)
    with pytest.raises(ConfigError, match="delta"):
        GaussianCountNoise(epsilon=1.0, delta=0.0)
    with pytest.raises(ConfigError, match="leaves exact"):
        privfed.fit("fed3r", F, y, k, num_classes=4, num_clients=6, privacy=LaplaceCountNoise(epsilon=1.0))
    with pytest.raises(ConfigError, match="whole numbers"):
        LaplaceCountNoise(epsilon=1.0).release(np.array([1.5]), np.random.default_rng(0))


@pytest.mark.parametrize("eps", [1e-300, 1e-20, 1e-10, 0.99e-9])
def test_geometric_count_noise_below_its_floor_is_refused(eps):
    """numpy's geometric sampler saturates at 2**63 - 1: at 1e-300 every count came out unchanged under a
    reported (1e-300, 0)-DP guarantee, at 1e-20 84 % of them."""
    from mechanisms.dp.count_noise import GEOMETRIC_MIN_EPSILON, GeometricCountNoise

    assert GEOMETRIC_MIN_EPSILON == 1e-9
    with pytest.raises(ConfigError, match=r"geometric count noise needs epsilon >= 1e-09"):
        GeometricCountNoise(epsilon=eps)


def test_geometric_count_noise_at_its_floor_is_drawn_at_the_right_scale():
    """At eps = 1e-9 the two-sided geometric is Laplace-like with scale 1e9: P(noise = 0) = (1 - a) / (1 + a) with
    a = e^-eps (5e-10 here), and the median of |noise| is ln 2 / eps up to O(1)."""
    import math

    from mechanisms.dp.count_noise import GeometricCountNoise

    noise = GeometricCountNoise(epsilon=1e-9, backend="numpy")
    counts = np.arange(20000, dtype=float) % 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = noise.perturb(counts, np.random.default_rng(0))
    assert np.all(out == np.round(out))  # integers, exactly
    assert np.count_nonzero(out == counts) == 0  # expected 20000 x 5e-10 = 1e-5 unchanged counts
    med = np.median(np.abs(out - counts))
    # |noise| is close to Exponential(rate eps): the sample median's standard error is 1 / (2 f(m) sqrt(n)) with
    # f(m) = eps / 2 at the median, i.e. (1 / eps) / sqrt(n) (0.7 % of the scale); 5 standard errors
    assert abs(med - math.log(2) / 1e-9) < 5 / math.sqrt(20000) * 1e9


def test_count_noise_at_its_edges_is_refused_or_taken_as_a_number():
    """Laplace at epsilon 1e-320 had scale inf and released inf counts, inf counts were released, geometric noise
    at epsilon 1e-18 in the attacks' sampler was numpy's "p <= 0", and np.float32(1) was no number there."""
    from attacks.noise_spec import count_noise
    from mechanisms.dp.count_noise import LaplaceCountNoise

    rng = np.random.default_rng(0)
    for eps in (1e-320, 6e-309):  # 6e-309: a finite scale whose draws still overflowed to inf counts
        with pytest.raises(ConfigError, match=r"is below 1e-300: its noise \(scale 1/epsilon\) overflows"):
            LaplaceCountNoise(epsilon=eps)
    with pytest.raises(ConfigError, match="counts must be finite"):
        LaplaceCountNoise(epsilon=1.0).release(np.array([np.inf, 1.0]), rng)
    with pytest.raises(ConfigError, match="geometric count noise needs epsilon >= 1e-09, got 1e-18"):
        count_noise(np.ones(3), "geometric", epsilon=1e-18, rng=rng)
    with pytest.raises(ConfigError, match="got epsilon='1'"):
        count_noise(np.ones(3), "laplace", epsilon="1", rng=rng)
    a = count_noise(np.ones(3), "laplace", epsilon=np.float32(1), rng=np.random.default_rng(1))
    np.testing.assert_array_equal(
        a, count_noise(np.ones(3), "laplace", epsilon=1.0, rng=np.random.default_rng(1))
    )


def test_a_seeded_count_noise_release_says_simulation_in_its_guarantee():
    """Before: .simulation was True and the notes said so, but the guarantee line users print did not."""
    import privfed
    from mechanisms.dp.count_noise import LaplaceCountNoise

    rng = np.random.default_rng(0)
    F, y, k = rng.normal(size=(40, 3)), np.arange(40) % 2, np.arange(40) % 4
    seeded = privfed.fit("fedncm", F, y, k, num_classes=2, num_clients=4, privacy=LaplaceCountNoise(epsilon=1),
                         random_state=0).privacy  # fmt: skip
    assert seeded.simulation and seeded.guarantee.startswith("NO DP GUARANTEE for the class means")
    assert seeded.guarantee.endswith(
        "SIMULATION (seeded noise, replayable): the counts' noise came from a seed"
    )
