"""Calibration of the Gaussian mechanism: exact (analytic) and classic.

A Gaussian mechanism adding N(0, sigma^2 I) to a statistic of L2 sensitivity
Delta is mu-GDP with mu = Delta / sigma (Dong, Roth & Su 2019, Thm. 2.7) and
(eps, delta)-DP exactly when (Balle & Wang 2018, Thm. 8)

    delta(eps) = Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta).

:func:`analytic_sigma` inverts this exactly (the "analytic Gaussian"
mechanism, via ``dp_accounting.get_sigma_gaussian``); :func:`classic_sigma`
is the textbook bound sigma = Delta sqrt(2 ln(1.25/delta)) / eps (Dwork &
Roth 2014, Thm. A.1), valid only for eps < 1 and loose there; it is kept to
reproduce the FedLog paper (Yu et al., Theorem 3.1).

Composition of Gaussian releases without subsampling is exact in GDP:
mu = sqrt(sum_i (Delta_i / sigma_i)^2), so :func:`gdp_epsilon` /
:func:`gdp_mu` convert between mu and (eps, delta).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.special import log_ndtr

from privfed._validation import is_integer
from privfed.errors import ConfigError

__all__ = [
    "MAX_EPSILON",
    "analytic_sigma",
    "as_real",
    "check_budget",
    "check_nonnegative",
    "check_real",
    "classic_sigma",
    "gaussian_delta",
    "gdp_epsilon",
    "gdp_mu",
]


#: The largest finite epsilon a release takes: the accounting of a larger one leaves float64's range (the
#: classic calibration's mu is about eps / 4.8 and the accountant squares it; near 1e154 mu^2 overflows),
#: and such a budget protects nothing; inf asks for no noise.
MAX_EPSILON = 1e150


def as_real(value) -> float:
    """``float(value)`` of a real number (numpy's included); a bool, a string or bytes is a TypeError (True
    is no epsilon of 1 and "30" no clip of 30: a caller who meant a number gives one)."""
    if isinstance(value, (bool, np.bool_, str, bytes, bytearray)) or (
        isinstance(value, np.ndarray) and value.dtype.kind not in "iuf"
    ):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def check_real(value, name: str) -> float:
    """``float(value)`` of a real number (:func:`as_real`), else a ConfigError naming ``name``: a bool, a
    string, None or an array of several values is no number (NaN and inf pass: the caller bounds them)."""
    try:
        return as_real(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {name}={value!r}") from None


def check_nonnegative(value, name: str) -> float:
    """``value`` as a finite float >= 0 (a noise scale, a secure sum's ``noise_std`` or ``value_bound``), else a ConfigError
    naming ``name``: a string, a bool, NaN, inf or a negative number is refused, never cast."""
    try:
        out = as_real(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not (np.isfinite(out) and out >= 0):
        raise ConfigError(f"{name} must be finite and >= 0, got {value!r}")
    return out


#: Largest count (rounds, records, dimensions) a release is accounted with: float64 holds every integer up to it.
MAX_COUNT = 2**53


def check_count(value, name: str, *, low: int = 1) -> int:
    """``value`` as an int in [low, 2**53], else a ConfigError naming ``name``: 2.5 or True is no count, and
    10**400 overflowed float64 in the accounting (an OverflowError)."""
    if not is_integer(value) or not low <= value <= MAX_COUNT:
        raise ConfigError(f"{name} must be an integer in [{low}, 2**53], got {name}={value!r}")
    return int(value)


def check_rounds(rounds) -> int:
    """``rounds`` (releases composed) as an int >= 1 (:func:`check_count`): 2.5 was 2.5 rounds to one
    accountant and 2 to another."""
    return check_count(rounds, "rounds")


def check_delta(delta) -> float:
    """``delta`` of an accounting question as a float in [0, 1), else a ConfigError naming it (NaN read as a
    number gave an epsilon near 0, a delta of 0 an epsilon of 38.9 where none is finite)."""
    try:
        d = as_real(delta)
    except (TypeError, ValueError):
        raise ConfigError(f"delta must be a number in [0, 1), got delta={delta!r}") from None
    if not 0 <= d < 1:
        raise ConfigError(f"delta must lie in [0, 1), got delta={delta!r}")
    return d


def check_budget(epsilon: float, delta: float, *, allow_inf: bool = True) -> tuple[float, float]:
    """Validate a privacy budget; return it as floats.

    Raises
    ------
    ConfigError
        If ``epsilon <= 0`` (or NaN, or inf when not allowed, or finite above :data:`MAX_EPSILON`) or
        ``delta`` is not in the open interval (0, 1).
    """
    try:
        eps = as_real(epsilon)
        dl = as_real(delta)
    except (TypeError, ValueError):
        raise ConfigError(
            f"epsilon and delta must be numbers, got epsilon={epsilon!r}, delta={delta!r}"
        ) from None
    if math.isnan(eps) or eps <= 0:
        raise ConfigError(f"epsilon must be > 0, got epsilon={epsilon!r}; use float('inf') for no noise")
    if math.isinf(eps) and not allow_inf:
        raise ConfigError("epsilon must be finite here, got epsilon=inf")
    if math.isfinite(eps) and eps > MAX_EPSILON:
        raise ConfigError(
            f"epsilon={epsilon!r} is beyond {MAX_EPSILON:g}: the noise it calls for and its accounting leave "
            "float64's range (such a budget protects nothing); use an epsilon of inf for no noise"
        )
    if math.isnan(dl) or not 0.0 < dl < 1.0:
        raise ConfigError(
            f"delta must lie in the open interval (0, 1), got delta={delta!r}; "
            "a common choice is delta < 1/N for N records"
        )
    return eps, dl


def _log_sub_exp(a: float, b: float) -> float:
    """log(e^a - e^b) for a >= b."""
    if b == -math.inf:
        return a
    return a + math.log1p(-math.exp(b - a)) if b < a else -math.inf


def gaussian_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """Exact delta(eps) of one Gaussian release (Balle & Wang 2018, Thm. 8).

    Parameters
    ----------
    epsilon : float
        eps >= 0.
    sigma : float
        Noise standard deviation (> 0).
    sensitivity : float
        L2 sensitivity Delta (> 0).
    """
    epsilon = check_real(epsilon, "epsilon")
    sigma = check_real(sigma, "sigma")
    sensitivity = check_real(sensitivity, "sensitivity")
    # NaN fails these comparisons too
    if not (sigma > 0 and sensitivity > 0):
        raise ConfigError(f"sigma and sensitivity must be > 0, got sigma={sigma}, sensitivity={sensitivity}")
    if not epsilon >= 0:
        raise ConfigError(f"epsilon must be >= 0, got epsilon={epsilon}")
    if math.isinf(epsilon) or math.isinf(sigma):
        return 0.0
    return _gdp_delta(epsilon, sensitivity / sigma)


def _gdp_delta(epsilon: float, mu: float) -> float:
    """delta(eps) of mu-GDP: Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), computed in logs."""
    if mu == 0:
        return 0.0
    a = float(log_ndtr(mu / 2 - epsilon / mu))
    b = float(epsilon + log_ndtr(-mu / 2 - epsilon / mu))
    if b >= a:
        return 0.0
    return float(math.exp(_log_sub_exp(a, b)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest eps with mu-GDP implying (eps, delta)-DP (exact, by bisection).

    Returns 0 when ``delta`` is already reached at eps = 0 and ``inf`` for mu = inf.
    """
    mu = check_real(mu, "mu")
    if mu < 0 or math.isnan(mu):
        raise ConfigError(f"mu must be >= 0, got mu={mu}")
    delta = check_delta(delta)
    if mu == 0:
        return 0.0
    if math.isinf(mu) or delta == 0:  # no Gaussian release meets delta = 0 at a finite epsilon
        return math.inf
    if _gdp_delta(0.0, mu) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while _gdp_delta(hi, mu) > delta:
        lo, hi = hi, 2 * hi
        if math.isinf(hi):  # the epsilon lies beyond float64 (mu near 1e154 or more): no finite answer
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _gdp_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return hi


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu such that mu-GDP is (eps, delta)-DP (exact, by bisection).

    The Gaussian mechanism with sigma = Delta / mu is then exactly
    (eps, delta)-DP; ``1 / gdp_mu(eps, delta)`` equals
    ``dp_accounting.get_sigma_gaussian(eps, delta)``.
    """
    eps, dl = check_budget(epsilon, delta)
    if math.isinf(eps):
        return math.inf
    lo, hi = 0.0, 1.0
    while _gdp_delta(eps, hi) < dl:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _gdp_delta(eps, mid) <= dl:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    return lo


def analytic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma making one Gaussian release (eps, delta)-DP (analytic Gaussian).

    Uses ``dp_accounting.get_sigma_gaussian`` (Balle & Wang 2018); eps = 1,
    delta = 1e-5, Delta = 1 gives 3.7306.  ``epsilon = inf`` gives 0.
    """
    eps, dl = check_budget(epsilon, delta)
    sensitivity = _check_sensitivity(sensitivity)
    if math.isinf(eps):
        return 0.0
    import dp_accounting

    with np.errstate(
        divide="ignore"
    ):  # its bracket search takes log1p(-1) = -inf at huge epsilon, harmlessly
        return sensitivity * float(dp_accounting.get_sigma_gaussian(eps, dl))


def classic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0, *, warn: bool = True) -> float:
    """The classic bound sigma = Delta sqrt(2 ln(1.25/delta)) / eps (Dwork & Roth, Thm. A.1).

    Valid only for eps < 1 (and loose there); for eps >= 1 it is not a proof
    of (eps, delta)-DP and for eps >~ 8 it under-protects: a warning is issued.
    Kept to reproduce FedLog (Yu et al., Theorem 3.1).
    """
    eps, dl = check_budget(epsilon, delta)
    sensitivity = _check_sensitivity(sensitivity)
    if math.isinf(eps):
        return 0.0
    if eps > 1 and warn:
        warnings.warn(
            f"calibration='classic' is only proven for epsilon <= 1 (got epsilon={eps}); the reported "
            "epsilon is recomputed exactly from sigma and may exceed the target; use calibration='analytic'",
            UserWarning,
            stacklevel=2,
        )
    sigma = sensitivity * math.sqrt(2.0 * math.log(1.25 / dl)) / eps
    if not math.isfinite(sigma):
        raise ConfigError(
            f"epsilon={epsilon!r} is too small for the classic calibration: its sigma (sensitivity "
            f"{sensitivity:g} x sqrt(2 ln(1.25/delta)) / epsilon) overflows float64; use a larger epsilon"
        )
    return sigma


def _check_sensitivity(sensitivity: float) -> float:
    try:  # a string was a numpy TypeError, True a sensitivity of 1
        v = as_real(sensitivity)
    except (TypeError, ValueError):
        v = math.nan
    if not (np.isfinite(v) and v > 0):
        raise ConfigError(f"sensitivity must be a finite number > 0, got sensitivity={sensitivity!r}")
    return v
