"""Checks shared by the attacks' parameters and inputs: one-line errors that name the argument and the fix.

A parameter (a count, a tolerance, the FPRs a metric reads) is refused with a
:class:`privfed.errors.ConfigError` when the attack is built; an index into
the view or the truth (a class label, a released row, a record id) with an
:class:`privfed.errors.InputError` when it is passed.  A bool is never a
number (True is no count of 1), a fraction never an index (0.5 is no row 0),
and a negative index never counts from the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mechanisms.dp.calibration import as_real
from privfed._validation import as_int_vector, check_features
from privfed.errors import ConfigError, InputError

__all__ = ["check_fpr", "check_fprs", "check_params", "check_targets", "index_vector", "secure_agg_of"]


def check_params(
    params: dict, *, positive=(), nonnegative=(), counts: dict[str, int] | None = None, optional=()
) -> None:
    """Refuse, naming it, a parameter that is not the number it must be: ``positive`` a finite number > 0,
    ``nonnegative`` a finite number >= 0, ``counts`` an int of at least its value (``{name: least}``); a name in
    ``optional`` may be None.  A bool is no number, and NaN, inf or text never reach torch or scipy."""
    counts = counts or {}
    for name in [*positive, *nonnegative, *counts]:
        v = params[name]
        if isinstance(v, np.ndarray) and v.ndim == 0:  # np.array(0.1) is 0.1
            v = v.item()
        if v is None and name in optional:
            continue
        if name in counts:
            least = counts[name]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
                kind = "a positive int" if least == 1 else f"an int >= {least}"
                raise ConfigError(
                    f"{name} must be {kind}{' or None' if name in optional else ''}, got {name}={v!r}"
                )
        elif (
            isinstance(v, bool)
            or not isinstance(v, (int, float, np.number))
            or not np.isfinite(v)
            or v < 0
            or (v == 0 and name in positive)
        ):
            rule = "> 0" if name in positive else ">= 0"
            raise ConfigError(f"{name} must be a finite number {rule}, got {name}={v!r}")


def check_fpr(value, name: str = "fpr") -> float:
    """A false-positive rate: a number in [0, 1] (no bool, string or NaN), else a ConfigError naming ``name``."""
    try:
        f = as_real(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= f <= 1.0:  # NaN fails too
        raise ConfigError(f"{name} must be a number in [0, 1] (a false-positive rate), got {value!r}")
    return f


def check_fprs(value, name: str = "fprs") -> tuple[float, ...]:
    """A non-empty sequence of false-positive rates in [0, 1] (e.g. ``(0.01, 0.001)``), as a tuple of floats."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not len(value):
        raise ConfigError(
            f"{name} must be a non-empty sequence of rates in [0, 1], e.g. (0.01, 0.001); got {value!r}"
        )
    return tuple(check_fpr(f, f"{name}[{i}]") for i, f in enumerate(value))


def index_vector(values, name: str, stop: int, *, low: int = 0, what: str = "") -> np.ndarray:
    """``values`` as a 1-D int64 array of indices in ``low..stop - 1``, else an InputError naming ``name`` and the
    valid range (``what`` says what the indices count); a fraction, a bool, NaN or an index out of range is refused,
    never cast or read from the end."""
    if isinstance(values, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in values):
        raise InputError(f"{name} holds a bool; True is no index: pass integers")  # [True, 2] casts to [1, 2]
    arr = as_int_vector(np.atleast_1d(np.asarray(values)) if np.ndim(values) == 0 else values, name)
    bad = arr[(arr < low) | (arr >= stop)]
    if bad.size:
        span = f"{low}..{stop - 1}" if stop > low else "none (there is nothing to index)"
        raise InputError(f"{name} holds {int(bad[0])}, out of range: valid {what or 'values'} are {span}")
    return arr


def check_targets(view, targets, target_labels, target_ids):
    """``(Y, labels, ids)`` of a membership attack's targets, refused with one line naming the argument: finite
    (n, d) features, labels that are classes of the view (``None`` if not given), ids -1 (a non-member) or
    >= 0, one per target."""
    Y = np.atleast_2d(np.asarray(targets)) if np.ndim(targets) == 1 else targets
    Y = check_features(Y, "targets")  # NaN/inf targets scored NaN and passed silently
    if Y.shape[1] != view.stats.dim:
        raise InputError(f"targets must have {view.stats.dim} columns (the view's d), got shape {Y.shape}")
    n, C = Y.shape[0], view.num_classes
    yl = None
    if target_labels is not None:  # -1 read the last class, 1.7 class 1
        yl = index_vector(target_labels, "target_labels", C, what=f"classes of this view (num_classes={C})")
        if yl.shape != (n,):
            raise InputError(f"target_labels must have one class per target, shape ({n},), got {yl.shape}")
    if target_ids is None:
        return Y, yl, np.arange(n)
    ids = index_vector(
        target_ids, "target_ids", 2**62, low=-1, what="ids (-1: a non-member; i >= 0: truth row i)"
    )
    if ids.shape != (n,):
        raise InputError(f"target_ids must have one id per target, shape ({n},), got {ids.shape}")
    return Y, yl, ids


def secure_agg_of(value: Any) -> Any:
    """``secure_agg`` as the view reads it: False, True (the ideal functionality) or a secure-sum object; the
    command's words "none", "mask" and "ckks" as it reads them ("none" was truthy: a secure sum, exposure 0)."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value in ("none", "mask", "ckks"):
        from privfed.release.settings import make_secure_agg

        return make_secure_agg(value) or False
    if isinstance(value, str) or not hasattr(value, "secure_sum"):
        raise ConfigError(
            f"secure_agg must be True, False, 'none', 'mask', 'ckks' or a secure sum, got {value!r}"
        )
    return value
