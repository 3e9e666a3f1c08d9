"""Noise-aware estimation: remove the known effect of calibrated noise on second-order statistics.

Noise is zero-mean, so sums, counts and the second moment G stay unbiased,
but every *quadratic* function of a noisy statistic picks up a bias equal to
the noise variance (none of the papers corrects for it):

* FedCOF's spread of client means (Goswami et al., Eq. 6).  With iid noise
  of per-coordinate variance s2 on each uploaded class sum s_kc (counts
  exact), mu~_kc = mu_kc + e_kc / n_kc and mu~_c = mu_c + sum_k e_kc / N_c,
  so E[1/(K_c - 1) sum_k n_kc (mu~_kc - mu~_c)(mu~_kc - mu~_c)^T] gains
  s2 / (K_c - 1) * (sum_k 1/n_kc - K_c / N_c) I (about s2/(K_c - 1) sum_k 1/n_kc
  for large N_c): :func:`fedcof_spread_bias`.
* Outer products of noisy sums (N mu mu^T in Fed3R-within / FedCGS):
  E[s~ s~^T] / N = s s^T / N + s2 I / N: :func:`outer_product_bias`.
* A noisy symmetric G (noise drawn on the upper triangle and mirrored) is
  unbiased but may be indefinite: :func:`repair_psd` projects it to the PSD
  cone (nearest in Frobenius norm).

The mechanism states the variance it added
(:meth:`mechanisms.GaussianMechanism.upload_noise_variance`); FedCOF takes
it as ``noise_var``.
"""

from __future__ import annotations

import numpy as np

from mechanisms.dp.calibration import as_real
from privfed._linalg import project_psd
from privfed._validation import check_real_dtype, is_integer
from privfed.errors import InputError

__all__ = [
    "debias_covariances",
    "drop_small_counts",
    "fedcof_spread_bias",
    "outer_product_bias",
    "repair_psd",
]


def _number(value, name: str, *, positive: bool = False) -> float:
    """``value`` as a finite float >= 0 (> 0 with ``positive``), else an InputError naming ``name`` (NaN gave NaN
    biases, strings a TypeError)."""
    try:
        v = as_real(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {value!r}") from None
    if not (np.isfinite(v) and (v > 0 if positive else v >= 0)):
        raise InputError(f"{name} must be a finite number {'>' if positive else '>='} 0, got {value!r}")
    return v


def _finite_matrix(value, name: str) -> np.ndarray:
    a = np.asarray(value)
    check_real_dtype(a, name)  # a complex matrix lost its imaginary part with a warning
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise InputError(f"{name} holds NaN/inf values; repair the statistics before debiasing them")
    return a


def fedcof_spread_bias(counts: np.ndarray, noise_var: float) -> np.ndarray:
    """Per-class, per-coordinate bias of FedCOF's Eq. 6 spread from sum noise of variance ``noise_var``.

    Parameters
    ----------
    counts : array, shape (K, C)
        Counts of the shared means (only n_kc > 0 enter).
    noise_var : float
        Per-coordinate variance of the noise on each shared class sum.

    Returns
    -------
    ndarray, shape (C,)
        s2 / (K_c - 1) * (sum_k 1/n_kc - K_c / N_c); 0 for classes with K_c < 2.
    """
    n = _finite_matrix(counts, "counts")
    if n.ndim != 2:
        raise InputError(f"counts must have shape (K, C), got {n.shape}")
    noise_var = _number(noise_var, "noise_var")
    mask = n > 0
    Kc = mask.sum(axis=0).astype(np.float64)
    N = np.where(mask, n, 0.0).sum(axis=0)
    with np.errstate(over="ignore", divide="ignore"):
        inv = np.where(mask, 1.0 / np.where(mask, n, 1.0), 0.0).sum(axis=0)
    if not np.isfinite(inv).all():  # a count of 1e-320 (noisy): its mean is noise alone
        raise InputError("counts this close to 0 make the bias overflow; drop them first (drop_small_counts)")
    ok = Kc >= 2
    return np.where(ok, noise_var * (inv - Kc / np.where(N > 0, N, 1.0)) / np.where(ok, Kc - 1.0, 1.0), 0.0)


def outer_product_bias(noise_var: float, total_count: float, dim: int) -> np.ndarray:
    """E[s~ s~^T] / N - s s^T / N = noise_var / N * I (shape (d, d))."""
    total_count = _number(total_count, "total_count", positive=True)
    if not is_integer(dim) or dim < 0:  # -1 raised numpy's error, 2.5 and True were read as dimensions
        raise InputError(f"dim must be an integer >= 0, got dim={dim!r}")
    return _number(noise_var, "noise_var") / total_count * np.eye(dim)


def debias_covariances(covs: np.ndarray, bias: np.ndarray, floor: float = 0.0) -> tuple[np.ndarray, int]:
    """Subtract ``bias[c] * I`` from each class covariance and project it to the PSD cone.

    Returns the repaired covariances (C, d, d) and how many eigenvalues were raised.
    """
    S, b = _finite_matrix(covs, "covs"), _finite_matrix(bias, "bias")
    floor = _number(floor, "floor")
    if S.ndim != 3 or S.shape[1] != S.shape[2] or b.shape != (S.shape[0],):
        raise InputError(f"covs must be (C, d, d) and bias (C,), got {S.shape} and {b.shape}")
    out = S - b[:, None, None] * np.eye(S.shape[1])
    raised = 0
    for c in range(out.shape[0]):
        out[c], r = project_psd(out[c], floor)
        raised += r
    return out, raised


def repair_psd(G: np.ndarray, floor: float = 0.0) -> tuple[np.ndarray, int]:
    """Nearest symmetric matrix with eigenvalues >= floor; returns it and the count raised."""
    A = _finite_matrix(G, "G")
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise InputError(f"G must be a square matrix, got shape {A.shape}")
    return project_psd(A, _number(floor, "floor"))


def drop_small_counts(stats, min_count: float):
    """Post-processing: treat (client, class) pairs whose noisy count is below ``min_count`` as absent.

    A mean s~ / n~ with n~ of the order of the count noise is mostly noise
    (and n~ (mu~ - mu)(mu~ - mu)^T explodes as n~ -> 0); a threshold of a few
    count-noise standard deviations removes those pairs.  Uses only released
    values, so the guarantee is unchanged.

    Returns
    -------
    (ClientStats, int)
        The statistics with those pairs' counts and sums set to 0, and how
        many pairs with a positive count were dropped.
    """
    min_count = _number(min_count, "min_count")  # "3" raised a TypeError, NaN dropped nothing
    keep = stats.counts >= min_count
    dropped = int(np.count_nonzero(~keep & (stats.counts > 0)))
    return stats.with_arrays(
        counts=np.where(keep, stats.counts, 0.0), sums=np.where(keep[..., None], stats.sums, 0.0)
    ), dropped
