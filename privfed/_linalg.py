"""Shared server-side linear algebra (float64).

Every method ends with the same step: a symmetric d x d matrix ``G`` (ridge
Gram matrix, within-class scatter, covariance) and a right-hand side ``B``;
:func:`solve_head` solves ``G X = B`` after checking that ``G`` is positive
semi-definite (noisy statistics can make it indefinite) and reports every
repair it made, so methods can put it in the head's ``notes``.
"""

from __future__ import annotations

import sys

import numpy as np
import scipy.linalg

from privfed.notes import Note

__all__ = [
    "SOLVERS",
    "check_choice",
    "check_flag",
    "check_real",
    "minus_between",
    "normalise_rows",
    "one_blas_thread",
    "project_psd",
    "row_squares",
    "safe_counts",
    "solve_head",
    "try_cholesky_solve",
    "symmetrise",
    "symmetrised",
]

#: Accepted values of the ``solver`` parameter of the methods.
SOLVERS = ("solve", "pinv")


#: Row sums of squares above this are exact to rounding (an entry's square that underflows adds at most
#: d x 2.2e-308 to them, far below their last bit); zero, underflowing or overflowing rows take the
#: peak-scaled path.
_SQUARES_SAFE = 2.0**-900

_vecdot = getattr(np, "vecdot", None)  # numpy >= 2


def row_squares(W: np.ndarray) -> np.ndarray:
    """sum_j W_ij^2 for each row: one BLAS dot per row (``np.vecdot``; ``einsum`` on numpy < 2), no temporary."""
    with np.errstate(over="ignore", under="ignore"):  # such rows are the callers' to redo, scaled
        if _vecdot is not None and W.shape[1]:
            return _vecdot(W, W)
        return np.einsum("ij,ij->i", W, W)


def _peak_scaled(W: np.ndarray, eps: float):
    """(W's rows each divided by its largest |entry| then by its norm, peak, norm, kept, every peak finite):
    the safe path.  A row holding NaN or inf has a NaN or inf peak (max and min propagate both)."""
    if W.shape[1]:
        peak = np.maximum(W.max(axis=1), -W.min(axis=1))  # largest |entry| of each row, no |W| copy
    else:
        peak = np.zeros(W.shape[0])
    keep = peak > eps
    safe_peak = np.where(keep, peak, 1.0)
    out = W / safe_peak[:, None]
    norms = np.sqrt(row_squares(out))  # in [1, sqrt(d)] for kept rows
    safe_norm = np.where(keep, norms, 1.0)
    out /= safe_norm[:, None]
    out[~keep] = 0.0
    return out, safe_peak, safe_norm, keep, bool(np.isfinite(peak).all())


def normalise_rows(W: np.ndarray, *others: np.ndarray, eps: float = 0.0, certify: bool = False):
    """Scale each row of W (and the same entries of ``others``) by the reciprocal of the row's L2 norm.

    Overflow- and underflow-safe: a row whose sum of squares overflows or
    underflows (entries of 1e160 or 1e-170) is first divided by its largest
    absolute entry, so it is normalised as exactly as a row of 1; every other
    row is divided by the square root of its sum of squares (one BLAS dot per
    row, then one pass multiplying by its reciprocal and writing the output:
    W is read about once and a half, no (C, d) temporary).  Each row's result depends on that row alone.
    Rows that are zero (or whose largest entry is at most ``eps``) are left at
    zero.  Returns a new W (and the rescaled others).

    With ``certify=True`` it returns ``(result, finite)``: ``finite`` is True
    when the computation itself proves every entry of the new W finite, read
    from the C per-row numbers it already has (no pass over W).  A row divided
    by a finite norm (or peak) with squares in range has entries of magnitude
    at most 1 (|w_ij| <= ||w_i||), and a finite sum of squares (or peak) means
    the row held no NaN or inf.  ``False`` proves nothing: check the result.
    """
    out, rest, finite = _normalise(np.asarray(W, dtype=np.float64), others, eps)
    result = out if not others else (out, *rest)
    return (result, finite) if certify else result


def _normalise(W: np.ndarray, others, eps: float):
    """normalise_rows' work: (new W, rescaled others, whether every entry of the new W is proved finite)."""
    if eps != 0.0 or not W.size:
        out, peak, norm, keep, finite = _peak_scaled(W, eps)
        rest = [np.where(keep, (np.asarray(o, dtype=np.float64) / peak) / norm, 0.0) for o in others]
        return out, rest, finite
    sq = row_squares(W)
    fast = (sq > _SQUARES_SAFE) & (sq < np.inf)  # False for NaN: such a row takes the peak-scaled path
    norms = np.sqrt(sq)
    if fast.all():
        # one multiply by each row's reciprocal norm (within an ulp of dividing; a division per entry
        # costs half again as much as the whole pass where the rows stay in cache); ``others`` alike
        inv = 1.0 / norms
        return W * inv[:, None], [np.asarray(o, dtype=np.float64) * inv for o in others], True
    slow = np.flatnonzero(~fast)
    norms[slow] = 1.0
    inv = 1.0 / norms
    out = W * inv[:, None]  # as the fast path: each row's bits do not depend on its neighbours
    sub, peak, norm, keep, finite = _peak_scaled(W[slow], eps)
    out[slow] = sub
    rest = []
    for o in others:
        o = np.asarray(o, dtype=np.float64) * inv
        o[slow] = np.where(keep, (o[slow] / peak) / norm, 0.0)
        rest.append(o)
    return out, rest, finite


def minus_between(gram: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """gram - sum_c s_c s_c^T / n_c (the total second moment less the between-class part), a new array.

    ``sums`` (C, d) and ``counts`` (C,) > 0.  The C rows are scaled by
    1/sqrt(n_c) so the product is X^T X of one array, which numpy computes as a
    symmetric rank-k update (half the flops of a general product); its result
    is reused as the output (no other d x d temporary).
    """
    X = sums / np.sqrt(counts)[:, None]
    out = X.T @ X
    return np.subtract(gram, out, out=out)


def symmetrise(A: np.ndarray) -> np.ndarray:
    return 0.5 * (A + np.swapaxes(A, -1, -2))


#: Side of the tiles :func:`symmetrised` adds to their mirror images (128 x 128 doubles: 128 KiB a pair).
_SYM_TILE = 128


def symmetrised(A: np.ndarray) -> np.ndarray:
    """(A + A^T) / 2 for a square matrix, as a new array, a cache-sized tile and its mirror at a time.

    The same numbers as ``0.5 * (A + A.T)``; adding the transpose in one sweep reads it a column at a
    time (a stride of d doubles), three times slower at d = 1,280 than these tiles.
    """
    d = A.shape[0]
    out = np.empty((d, d))
    t = _SYM_TILE
    for i in range(0, d, t):
        for j in range(0, d, t):
            blk = out[i : i + t, j : j + t]
            np.add(A[i : i + t, j : j + t], A[j : j + t, i : i + t].T, out=blk)
            blk *= 0.5
    return out


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


def _psd_tolerance(w: np.ndarray) -> float:
    """Eigenvalues above ``-tol`` are rounding error of ``eigh`` on a PSD matrix."""
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    return 10.0 * w.size * np.finfo(np.float64).eps * scale


def try_cholesky_solve(G: np.ndarray, B: np.ndarray, *, overwrite: bool = False):
    """G^-1 B by Cholesky when G is numerically positive definite and well conditioned.

    ``G`` must be symmetric (it is read through its transpose, a column-major view, so LAPACK
    makes no copy); ``overwrite=True`` lets the factor overwrite it (when it is a private copy).
    Returns the solution, or a string saying why Cholesky was not used.  The
    LAPACK 1-norm condition estimate must clear ``3 d^2 eps``: then the
    2-norm reciprocal condition exceeds ``d eps``, the pseudo-inverse
    threshold, so pinv(G) = G^-1 and no eigenvalue would have been cut.
    """
    d = G.shape[0]
    if d == 0:
        return "empty matrix"
    Gf = G.T  # = G; Fortran-ordered when G is C-ordered
    anorm = float(scipy.linalg.lapack.dlange("1", Gf))  # the 1-norm (inf or nan with a non-finite entry)
    if not np.isfinite(anorm):
        return "non-finite entries"
    try:
        c, lower = scipy.linalg.cho_factor(Gf, lower=False, check_finite=False, overwrite_a=overwrite)
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        return "not positive definite"
    rcond, info = scipy.linalg.lapack.dpocon(c, anorm, uplo="U")
    if info != 0 or not rcond > 3.0 * d * d * np.finfo(np.float64).eps:
        return f"ill-conditioned, reciprocal condition number about {float(rcond):.3g}"
    return scipy.linalg.cho_solve((c, lower), B, check_finite=False)


def solve_head(
    G: np.ndarray,
    B: np.ndarray,
    *,
    solver: str = "solve",
    name: str = "G",
    notes: list[str] | None = None,
) -> np.ndarray:
    """Solve ``G X = B`` for a symmetric matrix ``G`` that should be PSD.

    Parameters
    ----------
    G : ndarray, shape (d, d)
        Symmetric matrix (symmetrised here).
    B : ndarray, shape (d, C)
    solver : {"solve", "pinv"}
        Both start with a Cholesky factorisation (O(d^3 / 3)) and use it when
        ``G`` is positive definite and far from the pseudo-inverse cut-off
        (then both solvers' answers are ``G^-1 B``).  Otherwise (noted in
        ``notes``) an eigendecomposition: ``"solve"`` solves the (projected)
        system and falls back to the pseudo-inverse when it is singular;
        ``"pinv"`` is the Moore-Penrose pseudo-inverse (the FedCOF code's
        choice), eigenvalues below ``d * eps * max eigenvalue`` counting as zero.
    name : str
        How ``G`` is called in notes.
    notes : list of str, optional
        Repairs are appended here: negative eigenvalues (from noise) raised to
        zero (projection to the PSD cone), singular matrices solved by pinv.

    Returns
    -------
    ndarray, shape (d, C)
    """
    if solver not in SOLVERS:  # pragma: no cover - validated by the methods
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    notes = [] if notes is None else notes
    G0 = np.asarray(G, dtype=np.float64)
    G = symmetrised(G0)  # the one d x d copy
    B = np.asarray(B, dtype=np.float64)
    # Cholesky first: a positive-definite G whose condition number is far from the
    # pseudo-inverse cut-off has pinv(G) = G^-1, so both solvers give G^-1 B.
    reason = try_cholesky_solve(G, B, overwrite=True)
    if isinstance(reason, np.ndarray):
        return reason
    G = symmetrised(G0)  # the factorisation may have overwritten the copy
    notes.append(f"Cholesky of {name} failed ({reason}); solved by eigendecomposition instead")
    w, V = np.linalg.eigh(G)
    tol = _psd_tolerance(w)
    neg = w < -tol
    if neg.any():
        notes.append(
            Note(
                f"{name} had {int(neg.sum())} negative eigenvalue(s) (min {w.min():.3g}); "
                "projected to the PSD cone (negative eigenvalues set to 0)",
                "psd_projection",
                int(neg.sum()),
            )
        )
    w = np.maximum(w, 0.0)
    if w.size == 0 or w.max() <= 0:
        notes.append(f"{name} is zero; the head is zero")
        return np.zeros_like(B, dtype=np.float64)
    singular = w.min() <= w.size * np.finfo(np.float64).eps * w.max()
    if solver == "solve":
        if not singular:
            A = G if not neg.any() else (V * w) @ V.T
            try:
                return scipy.linalg.solve(A, B, assume_a="pos", check_finite=False)
            except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):  # pragma: no cover - guarded above
                pass
        notes.append(
            Note(
                f"{name} is singular (smallest eigenvalue {w.min():.3g}, largest {w.max():.3g}); "
                "solved with the pseudo-inverse instead",
                "pseudo_inverse",
                1,
            )
        )
    keep = w > w.size * np.finfo(np.float64).eps * w.max()
    inv = np.where(keep, 1.0 / np.where(keep, w, 1.0), 0.0)
    return (V * inv) @ (V.T @ B)


# -- parameter checks shared by the methods -------------------------------------
#: Largest regulariser a method takes (ridge lam, shrinkage gamma, FedCOF's noise_var): it is added to and
#: multiplied by sample counts and squared statistics, and far below this the head is already its limit
#: (the class biases alone).
MAX_REGULARISER = 1e100


def check_real(
    method: str,
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """``value`` as a finite float in the given range, else ConfigError naming ``method`` and ``name``."""
    from privfed.errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"method {method!r}: {name} must be a real number, got {value!r}")
    v = float(value)
    if not np.isfinite(v):
        raise ConfigError(f"method {method!r}: {name} must be finite, got {value!r}")
    if low is not None and (v <= low if low_open else v < low):
        op = ">" if low_open else ">="
        raise ConfigError(f"method {method!r}: {name} must be {op} {low:g}, got {name}={value!r}")
    if high is not None and v > high:
        raise ConfigError(f"method {method!r}: {name} must be <= {high:g}, got {name}={value!r}")
    return v


def check_choice(method: str, name: str, value, choices) -> str:
    """``value`` if it is one of ``choices``, else ConfigError listing them."""
    from privfed.errors import ConfigError

    if value not in choices:
        raise ConfigError(f"method {method!r}: {name} must be one of {list(choices)}, got {value!r}")
    return value


def check_flag(method: str, name: str, value) -> bool:
    from privfed.errors import ConfigError

    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"method {method!r}: {name} must be True or False, got {value!r}")
    return bool(value)


#: The threadpoolctl controller :func:`one_blas_thread` limits with, and the number of modules loaded when it
#: scanned the process's libraries.
_BLAS_CONTROL: dict = {"modules": -1, "controller": None}


def one_blas_thread():
    """A context manager running its block on one BLAS thread (threadpoolctl), restoring the limits after.

    A block of small products (Shamir sharing, d x d algebra at small d) only gains spinning threads from a
    multithreaded BLAS.  ``threadpool_limits`` scans every loaded library on each entry (about 2 ms once
    scipy and scikit-learn are loaded, more than some blocks it guards), so the scan is kept and redone
    only when modules were imported since (a BLAS library arrives with the module that loads it).
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # threadpoolctl < 3.0 (scikit-learn asks for less): the scan on every entry
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=1, user_api="blas")
    loaded = len(sys.modules)
    if _BLAS_CONTROL["controller"] is None or _BLAS_CONTROL["modules"] != loaded:
        _BLAS_CONTROL.update(controller=ThreadpoolController(), modules=loaded)
    return _BLAS_CONTROL["controller"].limit(limits=1, user_api="blas")
