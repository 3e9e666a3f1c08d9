"""Feature scale: statistics that neither overflow nor underflow, and FedLog's scale.

Float64 statistics of features of magnitude 1e160 overflow (second moments
reach 1e320) and those of magnitude 1e-170 underflow (their squares are
below 1e-308), which used to give all-zero or non-finite heads without a
word.  :func:`prepare` runs before the statistics are computed:

* a **scale-invariant** method (its predictions do not change when every
  feature is multiplied by the same s > 0: FedNCM, FedCGS, FedLog with
  ``feature_scale="auto"``) gets its features multiplied by an exact power
  of two 2^-e that brings the largest magnitude into [0.5, 1) (lower, when a
  class's largest feature would fall out of float64's range); power-of-two
  scaling is exact in floating point, so the head is the same function of
  the features, and the returned head applies the same factor to the
  features it scores (``feature_transform``) and says so in ``notes``;
* any other method (its ``lam``, ``gamma`` or prior is in absolute units)
  gets one :class:`~privfed.errors.InputError` saying how far the range is
  exceeded and what to do;
* under a privacy mechanism nothing is rescaled (the clip bound is in the
  features' units); an infinite clip with finite epsilon (infinite noise)
  or clipped statistics that would overflow are refused.

Features in the safe band (about 1e-145 to 1e147 for a thousand samples)
are left alone, so ordinary runs are bit for bit what they were.

FedLog (:func:`fedlog_scale`, :func:`fedlog_scale_note`): its augmented
feature [1, f] puts a constant 1 beside the features, so the MAP of Eq. 15
is the normalised class-mean classifier only when the class means are long
against that 1.  With short means (features of norm 1e-3, or L2-normalised
ones) the class-frequency bias dominates and accuracy collapses.  The
``feature_scale`` parameter divides the features by a constant inside the
model ([1, f / s]; the returned head is for the original features), and
``"auto"`` picks s from the summed statistics (post-processing of the
release, no privacy cost) so that the median class mean has norm 30.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privfed._validation import scratch_rows
from privfed.errors import ConfigError, InputError

__all__ = [
    "FEDLOG_TARGET_NORM",
    "ScaleInfo",
    "fedlog_scale",
    "fedlog_scale_from",
    "fedlog_scale_note",
    "fedlog_scale_note_from",
    "finish",
    "median_mean_norm",
    "prepare",
]

_FMAX = np.finfo(np.float64).max
_TINY = np.finfo(np.float64).tiny

#: Median class-mean norm FedLog's ``feature_scale="auto"`` aims at (the digits default's, where the
#: MAP equals the normalised class-mean classifier).
FEDLOG_TARGET_NORM = 30.0
#: Below this median class-mean norm (in units of ``feature_scale``) FedLog's MAP is dominated by the
#: constant feature: ||[1, mu]|| differs from ||mu|| by more than 0.5 %.
FEDLOG_MIN_NORM = 10.0


def _is_invariant(method) -> bool:
    """The method says whether a common feature scale changes its predictions (``Method.scale_invariant``)."""
    flag = getattr(method, "scale_invariant", None)
    return bool(flag()) if callable(flag) else bool(flag)


def safe_band(n: int, d: int) -> tuple[float, float]:
    """Largest-magnitude range whose statistics are exact in float64 for n samples of dimension d.

    Upper: n^2 d peak^2 (FedLog's |a|^2, the largest statistic formed) stays 2^20 below the
    largest float.  Lower: peak^2 stays 2^60 above the smallest normal float.
    """
    hi = math.sqrt(_FMAX / 2.0**20 / (float(max(n, 1)) ** 2 * max(d, 1)))
    lo = math.sqrt(_TINY) * 2.0**30
    return lo, hi


class ScaleInfo:
    """What :func:`prepare` did: the power of two applied (``None``: nothing) and why."""

    def __init__(self, exponent: int | None = None, peak: float = 0.0) -> None:
        self.exponent = exponent
        self.peak = peak

    def transform(self, features: np.ndarray) -> np.ndarray:
        return features if self.exponent is None else np.ldexp(features, -self.exponent)


#: Bytes of feature rows read at once by :func:`peak_magnitude` and :func:`peak_row_norm` (no N x d temporary),
#: and at most this share of the input (:func:`privfed._validation.scratch_rows`).
_BLOCK_BYTES = 8 * 2**20
_BLOCK_SHARE = 1 / 32


def _row_blocks(F: np.ndarray):
    step = scratch_rows(F.nbytes, F.itemsize * F.shape[1], _BLOCK_BYTES, _BLOCK_SHARE)
    for a in range(0, F.shape[0], step):
        yield F[a : a + step]


def peak_magnitude(F: np.ndarray) -> float:
    """max |F|, from each block's max and min: no |F| copy of the input."""
    hi, lo = -np.inf, np.inf
    for blk in _row_blocks(F):
        hi, lo = max(hi, float(blk.max())), min(lo, float(blk.min()))
    return max(hi, -lo) if F.size else 0.0


def least_class_peak(F: np.ndarray, labels: np.ndarray) -> tuple[float, int | None]:
    """(the least over the classes of their largest |x|, that class), over the classes with a nonzero feature;
    one block of rows at a time.  A row far smaller than its class's largest adds nothing its class's
    statistics can hold beside them, so only a whole class can be lost to a common scale."""
    y = np.asarray(labels).reshape(-1)
    top = np.zeros(int(y.max()) + 1 if y.size else 0)
    a = 0
    for blk in _row_blocks(F):
        b = a + blk.shape[0]
        np.maximum.at(top, y[a:b], np.maximum(blk.max(axis=1), -blk.min(axis=1)))
        a = b
    held = np.flatnonzero(top > 0)
    if not held.size:
        return 0.0, None
    c = int(held[np.argmin(top[held])])
    return float(top[c]), c


def peak_row_norm(F: np.ndarray, peak: float) -> float:
    """Largest row norm, each block divided by ``peak`` first (no overflow), one block at a time."""
    best = 0.0
    for blk in _row_blocks(F):
        x = blk / peak
        best = max(best, float(np.max(np.einsum("ij,ij->i", x, x))))
    return math.sqrt(best) * peak


def prepare(
    method,
    features: np.ndarray,
    privacy: Any = None,
    *,
    owned: bool = False,
    labels: np.ndarray | None = None,
) -> tuple[np.ndarray, ScaleInfo]:
    """Features whose statistics are exact in float64, or one clear error (see the module docstring).

    ``labels`` (the class of each row): a rescaling keeps every class's largest feature inside float64's
    range (the power of two is then chosen by the least class when the largest magnitude alone would flush
    it), or refuses classes further apart than any common scale holds.

    No temporary of the input's size is made: the peak magnitude is read block by block, and a
    rescaling (only for features outside the safe band) is done in place when ``owned`` says the
    array is a private copy (e.g. converted from another dtype), else into one new array.
    """
    F = features
    n, d = F.shape
    peak = peak_magnitude(F)
    lo, hi = safe_band(n, d)
    name = getattr(method, "name", "method")
    if privacy is not None:
        clipping = getattr(privacy, "clipping", None)
        bound = None
        if clipping is not None and hasattr(clipping, "l2_bound"):
            bound = float(clipping.l2_bound(d))
        eps = getattr(privacy, "epsilon", None)
        if bound is not None and not math.isfinite(bound) and eps is not None and math.isfinite(float(eps)):
            raise ConfigError(
                f"clip=inf with epsilon={eps} means infinite noise (sigma is proportional to the clip); "
                "pass a finite clip, e.g. the median feature norm of public data"
            )
        row = peak_row_norm(F, peak) if peak > 0 else 0.0
        reach = row if bound is None or not math.isfinite(bound) else min(row, bound)
        if reach > hi:
            raise InputError(
                f"features reach norm {reach:.3g} under the privacy mechanism (clip {bound}); their statistics "
                f"would overflow float64 (safe up to about {hi:.3g} for {n} samples); pass a finite, smaller clip"
            )
        return F, ScaleInfo()
    if peak == 0.0 or lo <= peak <= hi:
        return F, ScaleInfo()
    if _is_invariant(method):
        e = math.frexp(peak)[1]  # peak * 2^-e in [0.5, 1)
        low, cls = least_class_peak(F, labels) if labels is not None else (0.0, None)
        if low > 0 and math.ldexp(low, -e) < lo:  # a class 2^-e would flush toward zero: exact no more
            e = math.frexp(low / lo)[1] - 1  # that class's peak to at least lo, if the largest stays below hi
            if math.ldexp(peak, -e) > hi:
                raise InputError(
                    f"class {cls}'s features reach magnitude {low:.3g} at most, others {peak:.3g}: more than "
                    f"float64 statistics hold at any common scale (about {lo:.3g} to {hi:.3g} for {n} samples of "
                    f"dimension {d}), so rescaling them for method {name!r} would lose that class's statistics; "
                    "bring the classes to comparable magnitudes (e.g. divide each row by its norm)"
                )
        return (np.ldexp(F, -e, out=F) if owned else np.ldexp(F, -e)), ScaleInfo(e, peak)
    side = "large" if peak > hi else "small"
    what = "overflow" if peak > hi else "underflow"
    raise InputError(
        f"features reach magnitude {peak:.3g}, too {side} for float64 statistics (the safe range is about "
        f"{lo:.3g} to {hi:.3g} for {n} samples of dimension {d}: outside it they {what}); method {name!r} "
        "depends on the features' scale (its regulariser or prior is in absolute units), so they cannot be "
        "rescaled for you: divide the features by a constant (e.g. their median row norm) and choose the "
        "method's parameters for that scale"
        + (
            "; or pass feature_scale='auto' (on the command line: --param fedlog.feature_scale=auto), which makes "
            "FedLog scale-invariant"
            if name == "fedlog"
            else ""
        )
    )


def finish(head, info: ScaleInfo):
    """Make a head fitted on rescaled features score the original ones, and say so.

    Also: a head whose weight is all zero, or the same for every class, never goes without a note.
    """
    W = np.asarray(head.weight)
    if not np.any(W) and not any("zero" in n for n in head.notes):
        head.notes.append(
            "the head's weight is all zero: the statistics carry no signal to separate the classes "
            "(e.g. all-zero or constant features, or, under privacy, features so small that their squares "
            "underflow float64: rescale them by a public constant); it predicts from the bias alone"
        )
    elif (
        W.ndim == 2
        and W.shape[0] > 1
        and np.allclose(W, W[:1], rtol=1e-9, atol=0.0)  # equal up to the rounding of a normalisation
        and not any("same weight" in n for n in head.notes)
    ):
        head.notes.append(
            "every class has the same weight row (to 1e-9): the scores differ by the bias alone, so the head predicts "
            "one class whatever the features (e.g. one feature under normalise=True, which leaves each class "
            "mean only its sign); use more features or normalise=False"
        )
    if info.exponent is None:
        return head
    e = info.exponent
    head.feature_transform = info.transform
    head.extras["feature_exponent"] = e  # the head scores f 2^-e: its weight over f itself is weight 2^-e
    head.notes.append(
        f"features reach magnitude {info.peak:.3g}, outside the range where float64 statistics are exact; "
        f"they were multiplied by 2^{-e} (exact) before aggregation, which leaves this scale-invariant "
        "method's predictions unchanged; weight and bias apply to the rescaled features, and "
        "predict/score rescale the features they get"
    )
    return head


# -- FedLog ---------------------------------------------------------------------------------------
def check_feature_scale(value) -> float | str:
    """FedLog's ``feature_scale``: a finite float > 0 or ``"auto"``."""
    if isinstance(value, str):
        if value != "auto":
            raise ConfigError(
                f"method 'fedlog': feature_scale must be a positive number or 'auto', got {value!r}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(
            f"method 'fedlog': feature_scale must be a positive number or 'auto', got {value!r}"
        )
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"method 'fedlog': feature_scale must be a finite number > 0, got {value!r}")
    return v


def median_mean_norm(counts: np.ndarray, sums: np.ndarray, squares: np.ndarray | None = None) -> float:
    """Median over the classes with count > 0 of the class-mean norm ||s_c|| / N_c (0.0 when none).

    ``squares`` (optional) are the rows' sums of squares ||s_c||^2 when the caller has them (one BLAS
    dot per row, :func:`privfed._linalg.row_squares`): then no (C, d) array is read or formed here.
    Rows whose square overflows or underflows are measured divided by their largest |entry| first.
    """
    rows = np.flatnonzero(counts > 0)
    if not rows.size:
        return 0.0
    N = counts[rows]
    sq = (np.einsum("ij,ij->i", sums, sums) if squares is None else squares)[rows]  # no copy of sums
    norms = np.sqrt(sq) / N
    bad = np.flatnonzero(~((sq > 2.0**-900) & (sq < np.inf)))
    if bad.size:  # overflow- and underflow-safe: each such row divided by its largest |entry| first
        means = sums[rows[bad]] / N[bad, None]
        peak = np.max(np.abs(means), axis=1) if means.shape[1] else np.zeros(bad.size)
        good = peak > 0
        norms[bad] = 0.0
        norms[bad[good]] = peak[good] * np.linalg.norm(means[good] / peak[good, None], axis=1)
    return float(np.median(norms))


def _median_mean_norm(Phi: np.ndarray) -> float:
    return median_mean_norm(Phi[:, 0], Phi[:, 1:])


def fedlog_scale_from(median: float, feature_scale) -> float:
    """The divisor s of the features inside FedLog's model ([1, f / s]) from the median class-mean norm."""
    if feature_scale != "auto":
        return float(feature_scale)
    return median / FEDLOG_TARGET_NORM if median > 0 and math.isfinite(median) else 1.0


def fedlog_scale(Phi: np.ndarray, feature_scale) -> float:
    """The divisor s of the features inside FedLog's model ([1, f / s])."""
    if feature_scale != "auto":
        return float(feature_scale)
    return fedlog_scale_from(_median_mean_norm(Phi), feature_scale)


def fedlog_scale_note(Phi: np.ndarray, scale: float, feature_scale) -> str | None:
    """A note when FedLog's MAP is dominated by its constant feature (short class means), else ``None``."""
    return fedlog_scale_note_from(_median_mean_norm(Phi), scale)


def fedlog_scale_note_from(median: float, scale: float) -> str | None:
    """:func:`fedlog_scale_note` from the median class-mean norm (in the features' units)."""
    m = median / scale
    if not (m < FEDLOG_MIN_NORM):
        return None
    head = (
        f"the class means are short against FedLog's constant feature (median norm {m:.3g} in units of "
        f"feature_scale={scale:.3g}, below {FEDLOG_MIN_NORM:g}): the MAP of Eq. 15 is then dominated by the "
        "class-frequency bias instead of being the normalised class-mean classifier, and accuracy can collapse"
    )
    if not (median > 0 and math.isfinite(median)):  # no scale makes a zero mean longer
        return (
            f"{head}; at least half the class means are zero (their median is), and no feature_scale lengthens "
            "a zero mean: those classes carry no signal in these features"
        )
    target = median / FEDLOG_TARGET_NORM
    return (
        f"{head}; pass feature_scale={target:.3g} (or 'auto') so the median class mean has norm "
        f"{FEDLOG_TARGET_NORM:g}"
    )
