"""Accountants agree with each other and with exact GDP; calibration never overshoots the target."""

from __future__ import annotations

import math
import threading
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms import GaussianMechanism, analytic_sigma, calibrate_round_mu, gdp_epsilon, ledger_epsilon
from mechanisms.dp.ledger import ReleaseEvent
from privfed.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")


def exact_delta(eps: float, sigma: float, sens: float) -> float:
    """Balle & Wang (2018) Thm. 8, in 50-digit arithmetic (independent of the library code)."""
    mpmath.mp.dps = 50
    D, s, e = mpmath.mpf(sens), mpmath.mpf(sigma), mpmath.mpf(eps)
    return float(mpmath.ncdf(D / (2 * s) - e * s / D) - mpmath.exp(e) * mpmath.ncdf(-D / (2 * s) - e * s / D))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    eps=st.floats(0.05, 10.0),
    log_delta=st.floats(-10.0, -1.5),
    sens=st.floats(0.1, 10.0),
)
def test_analytic_sigma_never_overshoots_target(eps, log_delta, sens):
    delta = 10.0**log_delta
    sigma = analytic_sigma(eps, delta, sens)
    assert exact_delta(eps, sigma, sens) <= delta * (1 + 1e-6)
    # and it is tight: 1% less noise breaks the target
    assert exact_delta(eps, 0.99 * sigma, sens) > delta


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(eps=st.floats(0.1, 8.0), log_delta=st.floats(-9.0, -2.0), rounds=st.integers(1, 50))
def test_mechanism_never_overshoots_target(eps, log_delta, rounds):
    delta = 10.0**log_delta
    m = GaussianMechanism(
        epsilon=eps, delta=delta, clip=1.7, rounds=rounds, blocks=("sums", "counts", "second")
    )
    mu = math.sqrt(rounds * sum((m.sensitivity[b] / m.sigma[b]) ** 2 for b in m.blocks))
    # mu-GDP at (eps, delta): the Gaussian with sensitivity mu and sigma 1
    assert exact_delta(eps, 1.0, mu) <= delta * (1 + 1e-6)


def test_accountants_agree_at_one_release():
    sigma = analytic_sigma(1.0, 1e-5)
    ev = [ReleaseEvent("gaussian", "sums", 1.0, sigma)]
    gdp, _ = ledger_epsilon(ev, 1e-5, "gdp")
    pld, _ = ledger_epsilon(ev, 1e-5, "pld")
    prv, _ = ledger_epsilon(ev, 1e-5, "prv")
    rdp, _ = ledger_epsilon(ev, 1e-5, "rdp")
    assert gdp == pytest.approx(1.0, rel=1e-6)
    # PLD is pessimistic at discretisation 1e-4: above the exact value by at most ~1e-3 here.
    assert gdp - 1e-9 <= pld <= gdp + 2e-3
    # PRV's error bound at opacus' default eps_error=0.01 (measured 1.0101).
    assert gdp - 0.01 <= prv <= gdp + 0.02
    # RDP is a valid upper bound, known to be loose at one release (~1.09).
    assert gdp < rdp < 1.15 * gdp


@pytest.mark.parametrize("T", [4, 25])
def test_pld_matches_exact_gdp_composition(T):
    ev = [
        ReleaseEvent("gaussian", "sums", 2.0, 7.0, rounds=T),
        ReleaseEvent("gaussian", "counts", 1.0, 3.0, rounds=T),
    ]
    mu = math.sqrt(T * ((2 / 7) ** 2 + (1 / 3) ** 2))
    gdp, name = ledger_epsilon(ev, 1e-6)
    assert name.startswith("gdp") and gdp == pytest.approx(gdp_epsilon(mu, 1e-6), rel=1e-12)
    pld, _ = ledger_epsilon(ev, 1e-6, "pld")
    assert gdp - 1e-9 <= pld <= gdp + 5e-3


def test_subsampled_accountants_agree():
    ev = [ReleaseEvent("gaussian", "sums", 1.0, 1.0, rounds=20, sampling_rate=0.1)]
    pld, name = ledger_epsilon(ev, 1e-5)
    assert name.startswith("pld")
    prv, _ = ledger_epsilon(ev, 1e-5, "prv")
    rdp, _ = ledger_epsilon(ev, 1e-5, "rdp")
    assert prv == pytest.approx(pld, rel=0.02)  # measured 3.601 vs 3.591
    assert pld < rdp < 1.3 * pld  # RDP looser (measured 4.22)
    # subsampling amplifies: far below the un-subsampled composition
    assert pld < gdp_epsilon(math.sqrt(20), 1e-5)
    with pytest.raises(ConfigError, match="gdp"):
        ledger_epsilon(ev, 1e-5, "gdp")


def test_subsampled_calibration_meets_target_and_accountants_agree():
    mu_pld, _ = calibrate_round_mu(1.0, 1e-5, rounds=20, sampling_rate=0.1)
    mu_prv, _ = calibrate_round_mu(1.0, 1e-5, rounds=20, sampling_rate=0.1, accountant="prv")
    assert mu_prv == pytest.approx(mu_pld, rel=0.03)
    m = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, rounds=20, sampling_rate=0.1)
    assert m.mu == pytest.approx(mu_pld, rel=1e-12)
    # The calibration is for an accountant only: no release path subsamples, so none may use it.
    with pytest.raises(ConfigError, match="sampling_rate"):
        m.release(np.ones((3, 2)), np.array([0, 1, 0]), rng=np.random.default_rng(0), num_classes=2)
    eps = ledger_epsilon(
        [ReleaseEvent("gaussian", "sums", 1.0, 1.0 / m.mu, rounds=20, sampling_rate=0.1)], 1e-5
    )[0]
    assert eps <= 1.0 + 1e-9
    assert eps > 0.98  # calibrated to 0.1% in sigma
    # without subsampling the same budget needs much more noise
    assert m.mu > GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, rounds=20).mu * 2


def test_pure_and_mixed_ledgers():
    lap = [ReleaseEvent("laplace", "counts", 1.0, 0.5, rounds=3)]
    eps, name = ledger_epsilon(lap, 0.0)
    assert eps == pytest.approx(6.0) and name.startswith("pure")
    geo = [ReleaseEvent("geometric", "counts", 1.0, 0.7)]
    assert ledger_epsilon(geo, 0.0)[0] == pytest.approx(0.7)
    mixed = lap + [ReleaseEvent("gaussian", "sums", 1.0, 5.0)]
    e_mixed, name = ledger_epsilon(mixed, 1e-5)
    assert name.startswith("pld") and e_mixed > ledger_epsilon([mixed[-1]], 1e-5)[0]
    assert ledger_epsilon([ReleaseEvent("uniform", "counts", 1.0, 0.5)], 1e-5)[0] == math.inf
    assert ledger_epsilon([ReleaseEvent("none", "sums", 1.0, 0.0)], 1e-5)[0] == math.inf


def test_gdp_epsilon_edge_cases():
    assert gdp_epsilon(0.0, 1e-5) == 0.0
    assert gdp_epsilon(math.inf, 1e-5) == math.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # delta(0) = 2 Phi(mu/2) - 1 ~ 0.4 mu = 4e-7 < 1e-5: reached at eps = 0
        assert gdp_epsilon(1e-6, 1e-5) == 0.0
        assert exact_delta(gdp_epsilon(1e-3, 1e-5), 1.0, 1e-3) <= 1e-5 * (1 + 1e-6)


def test_a_delta_outside_its_range_is_refused_not_read_as_a_number():
    """delta = NaN gave epsilon 5.7e-14 ("perfectly private"), delta = 0 an epsilon of 38.9 where no Gaussian
    release has a finite one, delta = 1 an epsilon of 0; gaussian_delta took NaN and a negative epsilon."""
    import math

    from mechanisms.dp.accounting import ReleaseEvent, ledger_epsilon
    from mechanisms.dp.calibration import gaussian_delta, gdp_epsilon

    ev = [ReleaseEvent("gaussian", "sums", 1.0, 1.0)]
    for bad in (float("nan"), -1.0, 1.0, 2.0, "1e-5", True):
        with pytest.raises(ConfigError, match="delta must"):
            ledger_epsilon(ev, bad)
        with pytest.raises(ConfigError, match="delta must"):
            gdp_epsilon(1.0, bad)
    assert ledger_epsilon(ev, 0.0)[0] == math.inf and gdp_epsilon(1.0, 0.0) == math.inf
    assert ledger_epsilon(ev, 1e-5)[0] == pytest.approx(gdp_epsilon(1.0, 1e-5), rel=1e-12)
    for eps, sigma in ((float("nan"), 1.0), (-1.0, 1.0), (1.0, float("nan"))):
        with pytest.raises(ConfigError, match="must be"):
            gaussian_delta(eps, sigma)
    assert gaussian_delta(math.inf, 1.0) == 0.0  # an infinite epsilon: delta 0, without a numpy warning


def test_a_sampling_rate_not_above_delta_is_refused_not_searched_for_ever():
    """At sampling_rate <= delta a subsampled release is (0, delta)-DP with no noise: the PLD calibration halved
    the noise for ever looking for an epsilon above the target."""
    import time

    from mechanisms import GaussianMechanism
    from mechanisms.dp.accounting import calibrate_round_mu

    t = time.monotonic()
    got: list = []

    def calibrate() -> None:
        try:
            calibrate_round_mu(1.0, 1e-5, sampling_rate=1e-6)
        except ConfigError as exc:
            got.append(exc)

    worker = threading.Thread(target=calibrate, daemon=True)  # a regression searches for ever: fail, go on
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the calibration at sampling_rate <= delta did not return"
    assert got and "sampling_rate=1e-06 is not above delta=1e-05" in str(got[0])
    with pytest.raises(ConfigError, match=r"is not above delta"):
        GaussianMechanism(
            epsilon=1.0, delta=1e-5, clip=1.0, sampling_rate=1e-5, level="client", max_records=1,
            trusted_aggregator=True,
        )  # fmt: skip
    assert time.monotonic() - t < 5


def test_rounds_and_event_numbers_are_checked_where_accountants_would_read_them_apart():
    """rounds=2.5 was 2.5 rounds to the GDP accountant and 2 to the PLD one (7.51 against 6.57), rounds=2.9
    calibrated 2 rounds, rounds=True one; a 0-d array epsilon failed as unhashable."""
    for bad in (2.5, True, "3", 0):
        with pytest.raises(ConfigError, match=r"rounds must be an integer in \[1, 2\*\*53\]"):
            ReleaseEvent("gaussian", "sums", 1.0, 1.0, rounds=bad)
        with pytest.raises(ConfigError, match=r"rounds must be an integer in \[1, 2\*\*53\]"):
            calibrate_round_mu(1.0, 1e-5, rounds=bad)
    with pytest.raises(ConfigError, match="must be numbers"):
        ReleaseEvent("gaussian", "sums", "1", 1.0)
    assert ReleaseEvent("gaussian", "sums", 1.0, 1.0, rounds=np.int64(2)).rounds == 2
    assert calibrate_round_mu(np.array(1.0), 1e-5) == calibrate_round_mu(1.0, 1e-5)


def test_sigma_calibration_takes_a_number_sensitivity_and_leaks_no_warning():
    """sensitivity="1" was a numpy TypeError and True a sensitivity of 1; epsilon 1e12 leaked dp-accounting's
    "divide by zero in log1p" warning."""
    from mechanisms import analytic_sigma
    from mechanisms.dp.calibration import classic_sigma

    for bad in ("1", True, 0.0, float("nan")):
        with pytest.raises(ConfigError, match="sensitivity must be a finite number > 0"):
            analytic_sigma(1.0, 1e-5, bad)
        with pytest.raises(ConfigError, match="sensitivity must be a finite number > 0"):
            classic_sigma(0.5, 1e-5, bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert 0 < analytic_sigma(1e12, 1e-5) < 1e-6
    assert analytic_sigma(1.0, 1e-5, np.float32(2.0)) == pytest.approx(
        2 * analytic_sigma(1.0, 1e-5), rel=1e-12
    )
