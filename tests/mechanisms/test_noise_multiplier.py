"""A Gaussian mechanism given a noise multiplier (as Opacus users give it) reports the epsilon it spends.

The noise of one round is ``noise_multiplier`` times the sensitivity of the released statistic, so one
round is (1 / z)-GDP and T rounds are (sqrt(T) / z)-GDP; the epsilon at delta is computed here
independently, from the Gaussian's privacy profile (Balle & Wang 2018, Thm. 8), by bisection with scipy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from mechanisms import GaussianMechanism
from privfed.errors import ConfigError


def _epsilon(mu: float, delta: float) -> float:
    profile = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return brentq(profile, 0.0, 100.0, xtol=1e-14, rtol=1e-15)


@pytest.mark.parametrize("z, rounds", [(1.0, 1), (0.7, 1), (2.5, 4), (1.1, 10)])
def test_noise_multiplier_gives_the_noise_and_the_exact_epsilon(z, rounds):
    mech = GaussianMechanism(noise_multiplier=z, delta=1e-5, clip=10.0, split="joint", rounds=rounds)
    # one sigma for the joint statistic: z times its L2 sensitivity (sqrt(c^2 + 1) at record level)
    assert mech.joint_sensitivity == pytest.approx(math.sqrt(10.0**2 + 1), rel=1e-15)
    for b in mech.blocks:
        assert mech.sigma[b] == pytest.approx(z * mech.joint_sensitivity, rel=1e-12)
    assert mech.noise_multiplier == pytest.approx(z, rel=1e-15)
    assert mech.epsilon == pytest.approx(_epsilon(math.sqrt(rounds) / z, 1e-5), abs=1e-9)
    # the report, computed from the ledger after the releases, states the same epsilon
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        mech.release(rng.normal(size=(6, 3)), np.arange(6) % 2, rng=rng, num_classes=2)
    assert mech.report().epsilon == pytest.approx(_epsilon(math.sqrt(rounds) / z, 1e-5), abs=1e-9)


def test_epsilon_and_noise_multiplier_describe_the_same_mechanism():
    """Equal shares of mu^2 ("equal" split): sigma_b = z Delta_b sqrt(B); the budget it spends, given as
    epsilon, calibrates back to the same noise."""
    by_z = GaussianMechanism(noise_multiplier=1.3, delta=1e-6, clip=5.0, blocks=("sums", "counts", "second"))
    for b in by_z.blocks:
        assert by_z.sigma[b] == pytest.approx(1.3 * by_z.sensitivity[b] * math.sqrt(3), rel=1e-12)
    by_eps = GaussianMechanism(
        epsilon=by_z.epsilon, delta=1e-6, clip=5.0, blocks=("sums", "counts", "second")
    )
    for b in by_z.blocks:
        assert by_eps.sigma[b] == pytest.approx(by_z.sigma[b], rel=1e-9)
    assert by_eps.noise_multiplier == pytest.approx(1.3, rel=1e-9)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"epsilon": 1.0, "noise_multiplier": 1.0}, "not both"),
        ({"noise_multiplier": 0.0}, "finite number > 0"),
        ({"noise_multiplier": float("nan")}, "finite number > 0"),
        ({"noise_multiplier": True}, "number > 0"),
        ({"noise_multiplier": 1.0, "calibration": "classic"}, "calibration='analytic'"),
        ({}, "needs a budget"),
    ],
)
def test_bad_budgets_are_one_clear_error(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        GaussianMechanism(delta=1e-5, clip=1.0, **kwargs)
