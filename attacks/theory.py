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

from privfed.errors import InputError

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


def effective_dimension(cov: np.ndarray) -> float:
    """d_eff = (tr Sigma)^2 / tr(Sigma^2) of a covariance matrix."""
    S = np.asarray(cov, dtype=np.float64)
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
    S = np.asarray(cov, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if np.any(n < 1):
        raise InputError("n must be >= 1")
    tr, tr2 = float(np.trace(S)), float(np.sum(S * S.T))
    extra = 0.0
    if offset is not None:
        dlt = np.asarray(offset, dtype=np.float64)
        q = float(dlt @ S @ dlt)
        extra = q + q / n + tau**2 * float(dlt @ dlt)
    return (tr / n) / np.sqrt(tr2 / n + tau**2 * tr + extra)


def tracing_auc(cov: np.ndarray, n, tau: float = 0.0, offset=None):
    """Predicted AUC Phi(SNR / sqrt 2) of the inner-product test."""
    return norm.cdf(tracing_snr(cov, n, tau, offset) / math.sqrt(2.0))


def tracing_tpr(cov: np.ndarray, n, fpr: float, tau: float = 0.0, offset=None):
    """Predicted TPR Phi(SNR + Phi^-1(fpr)) of the inner-product test at false-positive rate ``fpr``."""
    return norm.cdf(tracing_snr(cov, n, tau, offset) + norm.ppf(fpr))


def gdp_auc_bound(mu: float) -> float:
    """Largest AUC of any membership test against a mu-GDP release: Phi(mu / sqrt 2)."""
    return float(norm.cdf(mu / math.sqrt(2.0)))


def gdp_tpr_bound(mu: float, fpr: float) -> float:
    """Largest TPR at ``fpr`` against a mu-GDP release: Phi(Phi^-1(fpr) + mu)."""
    return float(norm.cdf(norm.ppf(fpr) + mu))


def pure_dp_auc_bound(epsilon: float) -> float:
    """Largest AUC against an eps-DP release: e^eps / (1 + e^eps)."""
    return float(1.0 / (1.0 + math.exp(-epsilon)))


def approx_dp_tpr_bound(epsilon: float, delta: float, fpr: float) -> float:
    """Largest TPR at ``fpr`` against an (eps, delta)-DP release: min(1, e^eps fpr + delta)."""
    return float(min(1.0, math.exp(epsilon) * fpr + delta))
