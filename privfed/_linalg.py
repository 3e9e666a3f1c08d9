"""Shared server-side linear algebra (float64)."""

from __future__ import annotations

import numpy as np

__all__ = ["normalise_rows", "project_psd", "symmetrise", "safe_counts"]


def normalise_rows(W: np.ndarray, *others: np.ndarray, eps: float = 1e-300):
    """Divide each row of W (and the same entries of ``others``) by the row's L2 norm.

    Rows with zero norm are left at zero.  Returns W (and the rescaled others).
    """
    norms = np.linalg.norm(W, axis=1)
    scale = np.where(norms > eps, 1.0 / np.where(norms > eps, norms, 1.0), 0.0)
    out = W * scale[:, None]
    if not others:
        return out
    return (out, *(o * scale for o in others))


def symmetrise(A: np.ndarray) -> np.ndarray:
    return 0.5 * (A + np.swapaxes(A, -1, -2))


def project_psd(A: np.ndarray, floor: float = 0.0) -> tuple[np.ndarray, int]:
    """Nearest (Frobenius) symmetric matrix with eigenvalues >= floor.

    Returns the projection and the number of eigenvalues that were raised.
    """
    w, V = np.linalg.eigh(symmetrise(A))
    raised = int(np.count_nonzero(w < floor))
    return (V * np.maximum(w, floor)) @ V.T, raised


def safe_counts(counts: np.ndarray) -> tuple[np.ndarray, int]:
    """Counts with non-positive entries set to 0 (the drop rule for noisy counts).

    Returns the repaired counts and how many entries were dropped.
    """
    bad = counts <= 0
    return np.where(bad, 0.0, counts), int(np.count_nonzero(bad & (counts != 0)))
