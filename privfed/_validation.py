"""Input validation shared by every entry point (features, labels, clients)."""

from __future__ import annotations

import numpy as np

from privfed.errors import ConfigError, InputError

__all__ = ["as_generator", "as_int_vector", "check_features", "check_labels", "check_clients", "check_dataset"]


def as_generator(value, name: str = "random_state") -> np.random.Generator:
    """A numpy Generator from None / a non-negative int seed / a Generator.

    ``None`` gives seed 0, so an unseeded call is still reproducible.
    """
    if isinstance(value, np.random.Generator):
        return value
    if value is None:
        return np.random.default_rng(0)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return np.random.default_rng(int(value))
    raise ConfigError(f"{name} must be None, a non-negative int seed or a numpy Generator, got {value!r}")


def check_features(features, name: str = "features", dim: int | None = None) -> np.ndarray:
    """Return ``features`` as a finite 2-D float64 array or raise :class:`InputError`."""
    try:
        arr = np.asarray(features)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{name} could not be converted to an array: {exc}") from None
    if arr.dtype == object:
        raise InputError(f"{name} has dtype object; pass a numeric (N, d) array")
    if arr.ndim != 2:
        raise InputError(f"{name} must be a 2-D (N, d) array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"{name} is empty (shape {arr.shape}); pass at least one sample and one feature")
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise InputError(f"{name} must be real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    bad = ~np.isfinite(arr)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise InputError(
            f"{name} contains {int(bad.sum())} NaN/inf values (first in row {int(rows[0])}); "
            "remove or impute those samples before fitting"
        )
    if dim is not None and arr.shape[1] != dim:
        raise InputError(f"{name} has {arr.shape[1]} columns but the model was fitted with d={dim}")
    return arr


def as_int_vector(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise InputError(f"{name} must be integers, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InputError(f"{name} must hold whole numbers; found non-integer or non-finite values")
        arr = arr.astype(np.int64)
    return arr.astype(np.int64, copy=False)


def check_labels(labels, n: int, num_classes: int | None = None, name: str = "labels") -> tuple[np.ndarray, int]:
    """Return (labels as int64, num_classes); labels must lie in [0, num_classes)."""
    y = as_int_vector(labels, name)
    if y.shape[0] != n:
        raise InputError(f"{name} has {y.shape[0]} entries but features has {n} rows; they must match")
    if y.min() < 0:
        raise InputError(f"{name} must be >= 0, found {int(y.min())}; encode classes as 0..C-1")
    if num_classes is None:
        num_classes = int(y.max()) + 1
    else:
        num_classes = int(num_classes)
        if num_classes < 1:
            raise InputError(f"num_classes must be >= 1, got {num_classes}")
        if y.max() >= num_classes:
            raise InputError(
                f"{name} contains {int(y.max())}, out of range for num_classes={num_classes}; "
                "raise num_classes or re-encode labels as 0..C-1"
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
    sizes = np.bincount(k, minlength=num_clients)
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise InputError(
            f"{name}: client(s) {empty[:10].tolist()} have no data; renumber clients 0..K-1 "
            "without gaps or drop empty clients"
        )
    return k, num_clients


def check_dataset(features, labels, clients=None, num_classes=None):
    """Validate a federated dataset; returns (F, y, k, C, K)."""
    F = check_features(features)
    y, C = check_labels(labels, F.shape[0], num_classes)
    if clients is None:
        k, K = np.zeros(F.shape[0], dtype=np.int64), 1
    else:
        k, K = check_clients(clients, F.shape[0])
    return F, y, k, C, K
