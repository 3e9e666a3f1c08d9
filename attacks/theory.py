"""Closed-form predictions and privacy bounds the attacks are measured against.

* Inner-product tracing (Dwork, Smith, Steinke, Ullman & Vadhan, "Robust
  traceability from trace amounts", FOCS 2015): features ~ N(mu, Sigma), a
  released mean of n records plus per-coordinate noise of variance tau^2,
  T = <y - mu, m - mu>.  Member minus non-member mean of T is tr(Sigma)/n,
  its standard deviation sqrt(tr(Sigma^2)/n + tau^2 tr(Sigma)), so
  SNR = (tr Sigma / n) / sqrt(tr(Sigma^2)/n + tau^2 tr Sigma),
  AUC = Phi(SNR / sqrt 2), TPR(a) = Phi(SNR + Phi^-1(a)) (attacks.md).
  Noise-free: SNR = sqrt(d_eff / n), d_eff = (tr Sigma)^2 / tr(Sigma^2).
  A reference mean off by delta adds delta^T Sigma delta (1 + 1/n) to the
  variance: it dominates at large n.
* Any test against a mu-GDP release (Dong, Roth & Su 2022, Gaussian
  differential privacy): AUC <= Phi(mu / sqrt 2), TPR(a) <= Phi(Phi^-1(a) + mu);
  for a Gaussian mechanism mu = Delta / sigma.  Pure eps-DP: AUC <= e^eps / (1 + e^eps);
  (eps, delta)-DP: TPR <= e^eps FPR + delta.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm

from attacks.params import check_fpr
from mechanisms.dp.calibration import as_real, check_delta
from privfed._validation import check_real_dtype, finite_reals
from privfed.errors import ConfigError, InputError

__all__ = [
    "effective_dimension",
    "gdp_auc_bound",
    "gdp_tpr_bound",
    "pure_dp_auc_bound",
    "approx_dp_tpr_bound",
    "tracing_snr",
    "tracing_auc",
    "tracing_tpr",
]


def _covariance(cov) -> np.ndarray:
    """``cov`` as a finite square float matrix with a non-negative diagonal, else one line naming cov."""
    S = np.asarray(cov)
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.size == 0:
        raise InputError(f"cov must be a square (d, d) covariance matrix, got shape {S.shape}")
    S = finite_reals(S, "cov", "pass a finite covariance matrix")
    # a negative variance would give a negative SNR (an AUC below one half) or a made-up d_eff
    if (np.diagonal(S) < 0).any():
        raise InputError("cov has a negative variance on its diagonal; pass a covariance matrix")
    return S


def check_budget_value(value, name: str) -> float:
    """``value`` as a number >= 0 (inf: no privacy), else a ConfigError naming ``name``: NaN, text, a bool or a
    negative budget is refused (a negative mu bounded the AUC below one half)."""
    try:
        v = as_real(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number >= 0 (inf: no privacy), got {name}={value!r}") from None
    if not v >= 0:
        raise ConfigError(f"{name} must be a number >= 0 (inf: no privacy), got {name}={value!r}")
    return v


def _real_array(value, name: str) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype.kind == "b":
        raise InputError(f"{name} must hold numbers, got booleans")
    check_real_dtype(a, name)
    return np.asarray(a, dtype=np.float64)


def effective_dimension(cov: np.ndarray) -> float:
    """d_eff = (tr Sigma)^2 / tr(Sigma^2) of a covariance matrix."""
    S = _covariance(cov)
    t2 = float(np.sum(S * S.T))
    if t2 <= 0:
        raise InputError("covariance has zero trace; d_eff is undefined")
    return float(np.trace(S) ** 2 / t2)


def tracing_snr(cov: np.ndarray, n, tau: float = 0.0, offset=None):
    """SNR of the inner-product test on a mean of ``n`` records with noise std ``tau`` per coordinate.

    ``offset`` is delta = mu - mu_ref when the attacker's reference mean is
    off (e.g. estimated on public data): T then carries <y - mu, delta>, the
    same under both hypotheses, whose variance delta^T Sigma delta does not
    shrink with n, and <m - mu, delta> with variance delta^T Sigma delta / n
    (plus tau^2 ||delta||^2); both add to the denominator.
    """
    S = _covariance(cov)
    n = _real_array(n, "n")
    # NaN or inf records would give a NaN SNR
    if not (np.isfinite(n).all() and np.all(n >= 1)):
        raise InputError("n must be >= 1 and finite (the number of records in the mean)")
    tau_a = _real_array(tau, "tau")
    if np.isnan(tau_a).any() or np.any(tau_a < 0):
        raise InputError(f"tau must be >= 0 (the noise std per coordinate), got tau={tau!r}")
    try:  # a tau of another shape than n gave numpy's broadcast error at the last line
        np.broadcast_shapes(np.shape(n), tau_a.shape)
    except ValueError:
        raise InputError(
            f"tau must be a number or match n's shape {np.shape(n)}, got shape {tau_a.shape}"
        ) from None
    tau = tau_a if tau_a.ndim else float(tau_a)
    tr, tr2 = float(np.trace(S)), float(np.sum(S * S.T))
    if not tr > 0:
        raise InputError(
            "cov has zero trace (no variance): the test has no signal; pass the features' covariance"
        )
    extra = 0.0
    if offset is not None:
        dlt = _real_array(offset, "offset")
        if dlt.shape != (S.shape[0],) or not np.isfinite(dlt).all():
            raise InputError(
                f"offset must be a finite vector of the covariance's dimension ({S.shape[0]},), got shape {dlt.shape}"
            )
        q = float(dlt @ S @ dlt)
        extra = q + q / n + tau**2 * float(dlt @ dlt)
    return (tr / n) / np.sqrt(tr2 / n + tau**2 * tr + extra)


def tracing_auc(cov: np.ndarray, n, tau: float = 0.0, offset=None):
    """Predicted AUC Phi(SNR / sqrt 2) of the inner-product test."""
    return norm.cdf(tracing_snr(cov, n, tau, offset) / math.sqrt(2.0))


def tracing_tpr(cov: np.ndarray, n, fpr: float, tau: float = 0.0, offset=None):
    """Predicted TPR Phi(SNR + Phi^-1(fpr)) of the inner-product test at false-positive rate ``fpr``."""
    fpr = check_fpr(fpr)
    return norm.cdf(tracing_snr(cov, n, tau, offset) + norm.ppf(fpr))


def gdp_auc_bound(mu: float) -> float:
    """Largest AUC of any membership test against a mu-GDP release: Phi(mu / sqrt 2)."""
    mu = check_budget_value(mu, "mu")
    return float(norm.cdf(mu / math.sqrt(2.0)))


def gdp_tpr_bound(mu: float, fpr: float) -> float:
    """Largest TPR at ``fpr`` against a mu-GDP release: Phi(Phi^-1(fpr) + mu)."""
    mu, fpr = check_budget_value(mu, "mu"), check_fpr(fpr)
    if math.isinf(mu):
        return 1.0
    return float(norm.cdf(norm.ppf(fpr) + mu))


def pure_dp_auc_bound(epsilon: float) -> float:
    """Largest AUC against an eps-DP release: e^eps / (1 + e^eps)."""
    epsilon = check_budget_value(epsilon, "epsilon")
    return float(1.0 / (1.0 + math.exp(-epsilon)))


def approx_dp_tpr_bound(epsilon: float, delta: float, fpr: float) -> float:
    """Largest TPR at ``fpr`` against an (eps, delta)-DP release: min(1, e^eps fpr + delta)."""
    epsilon, fpr = check_budget_value(epsilon, "epsilon"), check_fpr(fpr)
    delta = check_delta(delta)
    if math.isinf(epsilon):
        return 1.0
    if fpr == 0:
        lead = 0.0
    elif epsilon > 700:
        # e^eps alone overflows float64 beyond eps = 709: take e^eps fpr in logs there
        lead = math.exp(min(epsilon + math.log(fpr), 0.0))
    else:
        lead = math.exp(epsilon) * fpr
    return float(min(1.0, lead + delta))
