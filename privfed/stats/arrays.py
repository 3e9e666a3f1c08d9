"""The array rules of every statistic: float64, read-only, no dense view over DENSE_VIEW_LIMIT."""

from __future__ import annotations

import numpy as np

from privfed._validation import check_real_dtype, env_byte_size, refuse_masked
from privfed.errors import ConfigError, InputError

__all__ = ["DENSE_VIEW_LIMIT", "as_f64", "check_dense", "dense_view_limit", "readonly"]

_DEFAULT_DENSE_VIEW_LIMIT = 2 * 2**30
#: Largest dense view (bytes) :class:`ClientStats` builds on demand; bigger ones raise InputError.
#: Set the environment variable ``PRIVFED_DENSE_VIEW_LIMIT`` (bytes: ``4294967296``, ``4G``, ``512M``) or
#: assign this attribute to change it.  A malformed variable (``abc``, ``nan``, ``inf``, ``-1``) does not
#: break ``import privfed``: the first use of the limit raises a ConfigError naming it.
DENSE_VIEW_LIMIT, _ENV_LIMIT_ERROR = env_byte_size("PRIVFED_DENSE_VIEW_LIMIT", _DEFAULT_DENSE_VIEW_LIMIT)


def dense_view_limit() -> int:
    """The dense-view limit in bytes; a malformed ``$PRIVFED_DENSE_VIEW_LIMIT`` or attribute is a ConfigError."""
    limit = DENSE_VIEW_LIMIT
    if _ENV_LIMIT_ERROR is not None and limit == _DEFAULT_DENSE_VIEW_LIMIT:
        raise ConfigError(str(_ENV_LIMIT_ERROR))
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise ConfigError(f"privfed.stats.DENSE_VIEW_LIMIT must be a positive number of bytes, got {limit!r}")
    return int(limit)


def check_dense(name: str, shape: tuple[int, ...]) -> None:
    nbytes = 8 * int(np.prod(shape, dtype=np.float64))
    limit = dense_view_limit()
    if nbytes > limit:
        raise InputError(
            f"the dense view ClientStats.{name} of shape {shape} needs {nbytes / 2**30:.3g} GiB, over the "
            f"{limit / 2**30:.3g} GiB limit; use the pair layout (pair_client, pair_class, "
            "pair_counts, pair_sums, gram()), or raise privfed.stats.DENSE_VIEW_LIMIT (the commands: "
            "$PRIVFED_DENSE_VIEW_LIMIT), or run fewer clients, fewer features, or a method that does not "
            "upload this statistic"
        )


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view (the caller's array keeps its flags; nothing is copied)."""
    v = a.view()
    v.setflags(write=False)
    return v


def as_f64(a, name: str) -> np.ndarray:
    """``a`` as float64, if that changes no value: complex, object, bool and text arrays are refused."""
    refuse_masked(a, name)
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError) as exc:  # ragged nested lists and the like
        raise InputError(f"ClientStats.{name} is not an array of numbers ({exc})") from None
    if arr.dtype != np.float64:
        check_real_dtype(arr, f"ClientStats.{name}")
        arr = arr.astype(np.float64)
    return arr
