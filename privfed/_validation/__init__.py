"""Input validation shared by every entry point: features, labels, clients, input files and sizes (seeds:
:mod:`privfed._validation.seeds`).

An input file is opened only if it is a regular file, so a FIFO, a device
or a socket is refused at once, never waited on (:func:`open_regular`); work whose estimated
memory exceeds :data:`MEMORY_MARGIN` of what the machine has available is refused before any
allocation (:func:`check_memory`, :func:`available_memory`).
"""

from __future__ import annotations

import math
import os

import numpy as np

from privfed._files import open_regular, read_regular_text
from privfed.errors import ConfigError, InputError

__all__ = [
    "overflows_float64",
    "MEMORY_MARGIN",
    "available_memory",
    "check_memory",
    "check_real_dtype",
    "open_regular",
    "read_regular_text",
    "check_release_size",
    "finite_reals",
    "release_cost_note",
    "env_byte_size",
    "parse_byte_size",
    "refuse_masked",
    "as_int_vector",
    "is_integer",
    "memory_limit",
    "check_clients",
    "check_dataset",
    "check_features",
    "check_labels",
    "check_num_classes",
    "scratch_rows",
]

_INT64_MAX = np.iinfo(np.int64).max

#: Statistics larger than this many bytes, and 64 times the features' own size, are refused
#: before they are allocated (a label or class count far beyond what the data can hold).
_MIN_STATS_LIMIT = 1 << 30


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def overflows_float64(text: str) -> bool:
    """Whether ``text`` reads as an infinite float64 without spelling infinity: 1e999 is too large, not inf."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return False
    return math.isinf(v) and str(text).strip().lstrip("+-").lower() not in ("inf", "infinity")


def parse_byte_size(text, source: str) -> int:
    """A positive number of bytes from ``'1073741824'``, ``'2e9'``, ``'512M'`` or ``'2G'`` (powers of 1024).

    NaN, inf, zero, negative numbers and words are refused with a
    :class:`ConfigError` naming ``source`` and showing a valid value.
    """
    t = str(text).strip().upper()
    t = t[:-2] if t.endswith("IB") else t[:-1] if t.endswith("B") else t
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and value >= 1):
        raise ConfigError(
            f"{source} must be a positive number of bytes (e.g. 2147483648 or 2G), got {text!r}"
        )
    return int(value)


def env_byte_size(name: str, default: int) -> tuple[int, ConfigError | None]:
    """``$name`` parsed by :func:`parse_byte_size`: (value, None), or (default, the error) when malformed.

    Read at import time, a malformed value must not crash ``import privfed``:
    the caller raises the error where the value is used.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default, None
    try:
        return parse_byte_size(raw, f"${name}"), None
    except ConfigError as exc:
        return default, exc


def is_integer(value) -> bool:
    """Whether ``value`` is an integer, Python's or numpy's, and not a bool (True is no count, 2.5 no index)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def refuse_masked(value, name: str) -> None:
    """numpy masked arrays are refused: their masks would be silently ignored by the arithmetic."""
    if isinstance(value, np.ma.MaskedArray):
        raise InputError(
            f"{name} is a numpy masked array; its mask would be ignored: fill or drop the masked "
            f"entries first (e.g. {name}.filled(...) or {name}.compressed())"
        )


# ---------------------------------------------------------------- memory
#: Fraction of the available memory (:func:`available_memory`) one estimated piece of work may plan to use.
MEMORY_MARGIN = 0.8
#: Environment variable that sets the memory a run may use (bytes: ``8G``, ``512M``), instead of measuring it.
MEMORY_ENV = "PRIVFED_MEMORY_LIMIT"


def _system_available() -> list[int]:
    """Free memory as /proc/meminfo (else sysconf) says, the room left under a cgroup v2 limit and under the
    process's address-space limit."""
    found = []
    try:
        with open("/proc/meminfo", "rb") as fh:
            found += [int(ln.split()[1]) * 1024 for ln in fh if ln.startswith(b"MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    if not found and hasattr(os, "sysconf"):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    try:  # a container's limit: /proc/meminfo shows the host's memory
        with (
            open("/sys/fs/cgroup/memory.max", "rb") as top,
            open("/sys/fs/cgroup/memory.current", "rb") as cur,
        ):
            limit = top.read().strip()
            if limit != b"max":
                found.append(max(0, int(limit) - int(cur.read().strip())))
    except (OSError, ValueError):
        pass
    try:  # ulimit -v: what is left of this process's address space
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if 0 <= soft != resource.RLIM_INFINITY:
            with open("/proc/self/status", "rb") as fh:
                found += [max(0, soft - int(ln.split()[1]) * 1024) for ln in fh if ln.startswith(b"VmSize:")]
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return found


def memory_limit() -> int | None:
    """``$PRIVFED_MEMORY_LIMIT`` in bytes (a ConfigError when malformed), or None when it is not set."""
    raw = os.environ.get(MEMORY_ENV)
    return parse_byte_size(raw, f"${MEMORY_ENV}") if raw is not None and raw.strip() else None


def available_memory() -> int | None:
    """Bytes a run may use: ``$PRIVFED_MEMORY_LIMIT`` if set, else what the system and its cgroup have free
    (``None`` when the platform does not say: then nothing is refused for memory)."""
    if (limit := memory_limit()) is not None:
        return limit
    found = _system_available()
    return min(found) if found else None


def _size(n: float) -> str:
    units = (("TiB", 40), ("GiB", 30), ("MiB", 20))
    return next((f"{n / 2.0**p:.3g} {u}" for u, p in units if n >= 2**p), f"{n / 1024:.3g} KiB")


def check_memory(need: float, what: str, fix: str) -> None:
    """Refuse, before any allocation, work estimated to need ``need`` bytes when the machine cannot spare them.

    The limit is :data:`MEMORY_MARGIN` of :func:`available_memory`; the :class:`InputError` names
    ``what`` needs the size, the limit and ``fix`` (the option that lowers the size).
    """
    avail = available_memory()
    if avail is None or need <= MEMORY_MARGIN * avail:
        return
    raise InputError(
        f"{what} needs about {_size(need)} of memory, over the {_size(MEMORY_MARGIN * avail)} this run may use "
        f"({MEMORY_MARGIN:.0%} of the {_size(avail)} available; ${MEMORY_ENV} sets it); {fix}"
    )


# ---------------------------------------------------------------- dtypes
def check_real_dtype(arr: np.ndarray, name: str) -> None:
    """Refuse a dtype whose conversion to float64 would change or invent values, naming ``name``.

    Accepted: float16/32/64, and integers of at most 2**53 in magnitude (float64 holds them exactly).
    Refused: complex (the imaginary part would be dropped), object, bool, text, dates and times,
    extended precision (rounded to float64) and larger integers.
    """
    dt, why = arr.dtype, None
    if dt.kind == "c":
        why = f"is complex ({dt}); the imaginary part would be lost: pass real values (e.g. its .real part)"
    elif dt.kind == "f" and dt.itemsize > 8:
        why = f"has dtype {dt}, which float64 would round; convert it to float64 first if that is acceptable"
    elif dt.kind in "iu" and arr.size and max(abs(int(arr.min())), abs(int(arr.max()))) > 2**53:
        why = "holds integers beyond 2**53, which float64 would round; scale or convert them first"
    elif dt.kind not in "iuf":
        why = f"must hold real numbers, got dtype {dt}" + (" (Python objects)" if dt.kind == "O" else "")
    if why:
        raise InputError(f"{name} {why}")


def finite_reals(value, name: str, fix: str) -> np.ndarray:
    """``value`` as a float64 array of real, finite numbers (itself when it is one: no copy, and no mask the size
    of it: min and max propagate NaN and reach inf); else one line naming ``name`` (with ``fix`` for NaN or inf
    values)."""
    a = np.asarray(value)
    check_real_dtype(a, name)
    a = np.asarray(a, dtype=np.float64)
    if a.size and not (np.isfinite(a.min()) and np.isfinite(a.max())):
        raise InputError(f"{name} contains NaN or inf values; {fix}")
    return a


#: Most noise values one private release may draw (K clients x C classes x (d + 1) under local noise):
#: 2**36, about 69 billion draws, hours of work and 550 GB if ever materialised.
MAX_RELEASE_VALUES = 1 << 36


def check_release_size(
    K: int, C: int, d: int, N: int, *, local: bool = True, classes: str = "num_classes"
) -> None:
    """Refuse a private release whose size would exhaust memory or run for hours, before any allocation.

    Under DP, C and K are public parameters that need no data: every client
    uploads every class, so local noise draws K x C x (d + 1) values.  The
    class statistics (C x (d + 1) float64) follow the same limit as without
    privacy (over 64 times the features and over 1 GiB: refused).  ``classes`` is the name the caller
    gave C (the estimator's ``classes=``), used in the refusal.
    """
    need = C * (d + 1) * 8
    if need > max(_MIN_STATS_LIMIT, 64 * N * d * 8):
        raise InputError(
            f"{classes}={C} would need {need / 2**30:.3g} GiB of class statistics for {N} samples "
            f"of dimension {d}; pass the number of classes the labels use"
        )
    cells = K * C * 8  # a (K, C) float64 table of counts
    if cells > max(_MIN_STATS_LIMIT, 64 * N * d * 8):
        raise InputError(
            f"num_clients={K} x {classes}={C} would need {cells / 2**30:.3g} GiB for the clients' "
            f"class counts alone ({N} samples of dimension {d}); pass the number of clients and "
            "classes the release really has"
        )
    values = (K if local else 1) * C * (d + 1)
    if values > MAX_RELEASE_VALUES:
        raise InputError(
            f"num_clients={K} x {classes}={C} x (d + 1)={d + 1} is {values:.3g} noise values to "
            f"draw (limit {MAX_RELEASE_VALUES:.3g}: hours of work, {values * 8 / 2**30:.3g} GiB if "
            "materialised); pass the number of clients and classes the release really has"
        )


#: Noise values a private release draws per second, and the fixed cost per client, for the estimate fit prints
#: (conservative; measured 2-4 microseconds a client with C=3, d=4 on one core).
NOISE_VALUES_PER_S = 2e7
SECONDS_PER_CLIENT = 4e-6


def release_cost_note(K: int, C: int, d: int, *, local: bool = True, above_s: float = 60.0) -> str | None:
    """A warning text when a private release's predicted time is over ``above_s`` seconds, else None.

    The estimate: at most K x (C (d + 1) + d^2) noise values under local
    noise (C (d + 1) + d^2 once on the sum otherwise) at
    :data:`NOISE_VALUES_PER_S`, plus :data:`SECONDS_PER_CLIENT` per client.
    """
    values = (K if local else 1) * (C * (d + 1) + d * d)
    seconds = values / NOISE_VALUES_PER_S + K * SECONDS_PER_CLIENT
    if seconds <= above_s:
        return None
    return (
        f"this private release is large: num_clients={K}, num_classes={C}, d={d}, up to {values:.3g} noise "
        f"values{'' if local else ' (once, on the sum)'}; expect about {seconds / 60:.0f} minute(s) before "
        "it finishes"
    )


def scratch_rows(input_bytes: int, row_bytes: int, cap_bytes: int, share: float) -> int:
    """Rows of a reusable scratch buffer (a chunk, a row buffer, a check block) sized from the input it serves.

    At most ``cap_bytes`` (the size that runs at full speed on a large input) and at most ``share`` of
    ``input_bytes``, so that a fit on a small input keeps within the same allowance above its input
    (25 %) as one on a large input; at least one row of ``row_bytes``.
    """
    budget = min(int(cap_bytes), int(float(share) * max(int(input_bytes), 0)))
    return max(1, budget // max(int(row_bytes), 1))


#: The finiteness check's one boolean block: at most this many bytes (16 Mi values) ...
_CHECK_BLOCK_BYTES = 16 * 2**20
#: ... and at most this share of the input's bytes (a 1-byte flag per value of 4 or 8 bytes).
_CHECK_SHARE = 1 / 64


def check_features(
    features,
    name: str = "features",
    dim: int | None = None,
    *,
    keep_float32: bool = False,
    dim_of: str = "the model was fitted with d",
) -> np.ndarray:
    """Return ``features`` as a finite 2-D float64 array or raise :class:`InputError`.

    ``keep_float32=True`` returns float32 input as it is (no N x d float64
    copy) for callers that convert block by block and accumulate in float64
    (:func:`privfed.release.pipeline.fold_statistics`); other dtypes become float64.
    Finiteness is checked in blocks of rows into one reused boolean block sized from the
    input (:func:`scratch_rows`).
    """
    refuse_masked(features, name)
    import scipy.sparse as sp

    if sp.issparse(features):  # np.asarray makes a 0-d object array of it
        raise InputError(
            f"{name} is a scipy sparse matrix; the statistics are dense: pass {name}.toarray() (frozen "
            "features are dense)"
        )
    try:
        arr = np.asarray(features)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{name} could not be converted to an array: {exc}") from None
    if arr.ndim != 2:
        raise InputError(f"{name} must be a 2-D (N, d) array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"{name} is empty (shape {arr.shape}); pass at least one sample and one feature")
    check_real_dtype(arr, name)
    if not (keep_float32 and arr.dtype == np.float32):
        arr = arr.astype(np.float64, copy=False)
    step = scratch_rows(arr.nbytes, arr.shape[1], _CHECK_BLOCK_BYTES, _CHECK_SHARE)
    finite = np.empty((min(step, arr.shape[0]), arr.shape[1]), dtype=bool)
    first, count = None, 0
    for a in range(0, arr.shape[0], step):
        blk = arr[a : a + step]
        ok = np.isfinite(blk, out=finite[: blk.shape[0]])
        if not ok.all():  # only a failing block pays for counting
            count += int(ok.size - np.count_nonzero(ok))
            if first is None:
                first = a + int(np.flatnonzero(~ok.all(axis=1))[0])
    if first is not None:
        raise InputError(
            f"{name} contains {count} NaN/inf values (first in row {first}); "
            f"remove or impute those samples before {'fitting' if dim is None else 'predicting'}"
        )
    if dim is not None and arr.shape[1] != dim:
        raise InputError(f"{name} has {arr.shape[1]} columns but {dim_of}={dim}")
    return arr


def int64_range(arr: np.ndarray, name: str) -> None:
    """Refuse values a cast to int64 would wrap (reporting the value as given)."""
    if arr.size == 0:
        return
    if arr.dtype.kind == "u":
        hi = arr.max()
        if int(hi) > _INT64_MAX:
            raise InputError(f"{name} holds {int(hi)}, beyond the 64-bit integer range; encode ids as 0..n-1")
    elif arr.dtype.kind == "f":
        lo, hi = float(arr.min()), float(arr.max())
        worst = hi if abs(hi) >= abs(lo) else lo
        if not (-(2.0**63) <= worst < 2.0**63):
            raise InputError(f"{name} holds {worst:g}, beyond the 64-bit integer range; encode ids as 0..n-1")


def as_int_vector(values, name: str) -> np.ndarray:
    refuse_masked(values, name)
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":  # no object, complex, bool, string, date or time: nothing cast silently
        raise InputError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InputError(f"{name} must hold whole numbers; found non-integer or non-finite values")
    int64_range(arr, name)
    return arr.astype(np.int64, copy=False)


def check_num_classes(value, name: str = "num_classes") -> int:
    """``value`` as a positive int; floats (3.7, even 3.0), strings and bools are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")
    return int(value)


def check_labels(
    labels, n: int, num_classes: int | None = None, name: str = "labels", *, classes_of: str | None = None
) -> tuple[np.ndarray, int]:
    """Return (labels as int64, num_classes); labels must lie in [0, num_classes).

    Without ``num_classes`` the classes are ``0..max(labels)``: a largest
    label beyond the number of samples means classes without any sample
    (labels not encoded as 0..C-1), refused before anything is sized by it.
    """
    y = as_int_vector(labels, name)
    if y.shape[0] != n:
        raise InputError(f"{name} has {y.shape[0]} entries but features has {n} rows; they must match")
    if y.size == 0:
        raise InputError(f"{name} is empty; pass at least one sample")
    if y.min() < 0:
        raise InputError(f"{name} must be >= 0, found {int(y.min())}; encode classes as 0..C-1")
    top = int(y.max())
    if num_classes is None:
        if top >= n:
            raise InputError(
                f"{name} contains {top} but there are only {n} samples, so most classes 0..{top} have no "
                "sample; re-encode labels as 0..C-1 (e.g. numpy.unique(labels, return_inverse=True))"
            )
        num_classes = top + 1
    else:
        num_classes = check_num_classes(num_classes)
        if top >= num_classes:
            raise InputError(
                f"{name} contains {top}, out of range for num_classes={num_classes}; "
                "raise num_classes or re-encode labels as 0..C-1"
                if classes_of is None
                else f"{name} contains {top}, but {classes_of} has {num_classes} classes (0..{num_classes - 1}); "
                "pass labels encoded as it was fitted"
            )
    return y, num_classes


def check_clients(clients, n: int, name: str = "clients") -> tuple[np.ndarray, int]:
    """Return (client ids as int64, number of clients K = max id + 1).

    Client ids must be ``0..K-1``; a client id with no sample is an error
    (a client with no data cannot upload anything meaningful).
    """
    k = as_int_vector(clients, name)
    if k.shape[0] != n:
        raise InputError(f"{name} has {k.shape[0]} entries but features has {n} rows; they must match")
    if k.min() < 0:
        raise InputError(f"{name} must be >= 0, found {int(k.min())}; number clients 0..K-1")
    num_clients = int(k.max()) + 1
    if num_clients > n:  # some client would be empty: refused before sizing anything by the id
        raise InputError(
            f"{name} contains id {num_clients - 1} but there are only {n} samples, so some of the clients "
            f"0..{num_clients - 1} have no data; renumber clients 0..K-1 without gaps"
        )
    sizes = np.bincount(k, minlength=num_clients)
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise InputError(
            f"{name}: client(s) {empty[:10].tolist()} have no data; renumber clients 0..K-1 "
            "without gaps or drop empty clients"
        )
    return k, num_clients


def check_dataset(
    features, labels, clients=None, num_classes=None, *, every_class: bool = False, keep_float32: bool = False
):
    """Validate a federated dataset; returns (F, y, k, C, K).

    ``every_class=True`` (fitting a head) requires a sample of every class,
    so ``num_classes`` may not exceed the number of samples.  ``keep_float32``:
    see :func:`check_features`.  Otherwise a
    ``num_classes`` whose statistics would dwarf the data (over 64 times the
    features' bytes and over 1 GiB) is refused before anything is allocated.
    """
    F = check_features(features, keep_float32=keep_float32)
    N, d = F.shape
    if num_classes is not None:
        C = check_num_classes(num_classes)
        if every_class and C > N:
            raise InputError(
                f"num_classes={C} but there are only {N} samples; every class needs at least one sample, "
                "so pass the number of classes the labels use"
            )
        need = C * (d + 1) * 8
        if need > max(_MIN_STATS_LIMIT, 64 * F.nbytes):
            raise InputError(
                f"num_classes={C} would need {need / 2**30:.3g} GiB of class statistics for {N} samples of "
                f"dimension {d}; pass the number of classes the labels use"
            )
    y, C = check_labels(labels, F.shape[0], num_classes)
    if clients is None:
        k, K = np.zeros(F.shape[0], dtype=np.int64), 1
    else:
        k, K = check_clients(clients, F.shape[0])
    return F, y, k, C, K
