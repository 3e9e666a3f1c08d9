"""Client statistics: the one object that flows from clients to methods.

:class:`ClientStats` stacks the statistics of ``K`` clients (or pseudo-clients,
see FedCOF's multi-mean sampling).  Every field is *additive*: the statistics
of a union of clients are the sum of theirs, so aggregation is a sum
(:meth:`ClientStats.total`) and masking, homomorphic encryption and noise act
on the same arrays.  Server-side arrays are float64.

Fields (``K`` clients, ``C`` classes, ``d`` features):

``counts``        (K, C)        n_kc, samples of class c on client k
``sums``          (K, C, d)     s_kc = sum of client k's class-c features
``second``        (K, d, d)     G_k = sum_i f_i f_i^T over all of client k's samples
``class_second``  (K, C, d, d)  sum of f f^T over client k's class-c samples
                                (the additive form of per-class scatter, used by
                                the FedCOF oracle / CCVR)

Optional fields are ``None`` when not computed.  Counts are floats so that
noisy releases (which may be negative or fractional) use the same type.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Iterable

import numpy as np
import scipy.sparse as sp

from privfed._validation import check_dataset
from privfed.errors import InputError

__all__ = ["ClientStats", "STAT_FIELDS", "compute_client_stats"]

#: Names of every statistic a method may require.
STAT_FIELDS = ("counts", "sums", "second", "class_second")

# Memory bound (bytes) of one padded block in the batched d x d products.
_BLOCK_BYTES = 64 * 2**20


@dataclass(frozen=True, eq=False)
class ClientStats:
    """Additive per-client statistics of frozen-backbone features.

    Parameters
    ----------
    counts : ndarray, shape (K, C)
        Class counts n_kc.
    sums : ndarray, shape (K, C, d)
        Class sums s_kc.
    second : ndarray, shape (K, d, d), optional
        Second moments G_k = F_k^T F_k.
    class_second : ndarray, shape (K, C, d, d), optional
        Per-class second moments (uncentred scatter).
    owners : ndarray of int, shape (K,), optional
        The real client each row comes from, when rows are pseudo-clients
        (multi-mean sampling).  ``None`` means row k is client k.
    """

    counts: np.ndarray
    sums: np.ndarray
    second: np.ndarray | None = None
    class_second: np.ndarray | None = None
    owners: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        counts = np.array(self.counts, dtype=np.float64)
        sums = np.array(self.sums, dtype=np.float64)
        if counts.ndim != 2:
            raise InputError(f"ClientStats.counts must have shape (K, C), got {counts.shape}")
        K, C = counts.shape
        if sums.ndim != 3 or sums.shape[:2] != (K, C):
            raise InputError(f"ClientStats.sums must have shape (K={K}, C={C}, d), got {sums.shape}")
        d = sums.shape[2]
        object.__setattr__(self, "counts", _frozen(counts))
        object.__setattr__(self, "sums", _frozen(sums))
        if self.second is not None:
            second = np.array(self.second, dtype=np.float64)
            if second.shape != (K, d, d):
                raise InputError(f"ClientStats.second must have shape ({K}, {d}, {d}), got {second.shape}")
            object.__setattr__(self, "second", _frozen(second))
        if self.class_second is not None:
            cs = np.array(self.class_second, dtype=np.float64)
            if cs.shape != (K, C, d, d):
                raise InputError(
                    f"ClientStats.class_second must have shape ({K}, {C}, {d}, {d}), got {cs.shape}"
                )
            object.__setattr__(self, "class_second", _frozen(cs))
        if self.owners is not None:
            owners = np.array(self.owners, dtype=np.int64)
            if owners.shape != (K,):
                raise InputError(f"ClientStats.owners must have shape ({K},), got {owners.shape}")
            object.__setattr__(self, "owners", _frozen(owners))

    # -- shape ---------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        """Number of rows K (clients or pseudo-clients)."""
        return self.counts.shape[0]

    @property
    def num_classes(self) -> int:
        return self.counts.shape[1]

    @property
    def dim(self) -> int:
        return self.sums.shape[2]

    @property
    def available(self) -> frozenset[str]:
        """Names of the statistics present (``counts`` and ``sums`` always are)."""
        return frozenset(f for f in STAT_FIELDS if getattr(self, f) is not None)

    def arrays(self) -> dict[str, np.ndarray]:
        """The present statistics by name (each with leading axis K)."""
        return {f: getattr(self, f) for f in STAT_FIELDS if getattr(self, f) is not None}

    # -- algebra -------------------------------------------------------------
    def total(self) -> "ClientStats":
        """Sum over clients: the aggregate, as a ClientStats with K = 1."""
        return ClientStats(**{k: v.sum(axis=0, keepdims=True) for k, v in self.arrays().items()})

    def __add__(self, other: "ClientStats") -> "ClientStats":
        if not isinstance(other, ClientStats):
            return NotImplemented
        if self.available != other.available or self.counts.shape != other.counts.shape or self.dim != other.dim:
            raise InputError("cannot add ClientStats with different fields or shapes")
        return ClientStats(**{k: v + getattr(other, k) for k, v in self.arrays().items()}, owners=self.owners)

    def select(self, names: Iterable[str]) -> "ClientStats":
        """Keep only the named statistics (``counts`` and ``sums`` are always kept)."""
        names = set(names) | {"counts", "sums"}
        missing = names - self.available
        if missing:
            raise InputError(f"ClientStats lacks {sorted(missing)}; compute them with compute_client_stats(fields=...)")
        return ClientStats(**{k: v for k, v in self.arrays().items() if k in names}, owners=self.owners)

    def with_arrays(self, **arrays) -> "ClientStats":
        """A copy with some statistics replaced (used by noise mechanisms)."""
        return replace(self, **arrays)

    def clients(self, rows) -> "ClientStats":
        """The statistics of a subset of rows (clients)."""
        rows = np.asarray(rows)
        owners = None if self.owners is None else self.owners[rows]
        return ClientStats(**{k: v[rows] for k, v in self.arrays().items()}, owners=owners)

    def means(self) -> np.ndarray:
        """Class means s_kc / n_kc, NaN where n_kc <= 0 (shape (K, C, d))."""
        with np.errstate(invalid="ignore", divide="ignore"):
            n = self.counts[..., None]
            return np.where(n > 0, self.sums / np.where(n > 0, n, 1.0), np.nan)

    def num_pairs(self) -> int:
        """M: the number of (client, class) pairs with data (counts > 0)."""
        return int(np.count_nonzero(self.counts > 0))

    def nbytes_float32(self) -> int:
        """Bytes to upload every present array in float32 (4 bytes a value)."""
        return 4 * sum(v.size for v in self.arrays().values())

    def __repr__(self) -> str:
        return (
            f"ClientStats(K={self.num_clients}, C={self.num_classes}, d={self.dim}, "
            f"fields={sorted(self.available)})"
        )


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _group_sums(F: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum rows of F by group id with one sparse-dense product (no sample loop)."""
    n = F.shape[0]
    onehot = sp.csr_matrix((np.ones(n), (group, np.arange(n))), shape=(num_groups, n))
    return np.asarray(onehot @ F)


def _group_second_moments(F: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """sum_i f_i f_i^T per group, as batched matmuls over zero-padded blocks."""
    d = F.shape[1]
    out = np.zeros((num_groups, d, d))
    order = np.argsort(group, kind="stable")
    sizes = np.bincount(group, minlength=num_groups)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    # Groups sorted by size; each block is padded to its largest group and
    # multiplied in one batched BLAS call, the padded block kept under _BLOCK_BYTES.
    nonempty = np.flatnonzero(sizes)
    nonempty = nonempty[np.argsort(sizes[nonempty], kind="stable")]
    Fs = F[order]
    i, m = 0, nonempty.size
    while i < m:
        j = i + 1
        while j < m and (j + 1 - i) * sizes[nonempty[j]] * d * 8 <= _BLOCK_BYTES:
            j += 1
        block = nonempty[i:j]
        n_max = int(sizes[block].max())
        pos = np.arange(n_max)
        valid = pos[None, :] < sizes[block][:, None]
        idx = np.where(valid, starts[block][:, None] + pos[None, :], 0)
        padded = np.where(valid[..., None], Fs[idx], 0.0)
        out[block] = np.matmul(padded.transpose(0, 2, 1), padded)
        i = j
    return out


def compute_client_stats(
    features,
    labels,
    clients=None,
    *,
    num_classes: int | None = None,
    num_clients: int | None = None,
    fields: Iterable[str] = ("counts", "sums"),
) -> ClientStats:
    """Compute every client's statistics at once (vectorised, float64).

    Parameters
    ----------
    features : array, shape (N, d)
    labels : int array, shape (N,)
    clients : int array, shape (N,), optional
        Client id of each sample (0..K-1); ``None`` puts every sample on one client.
    num_classes, num_clients : int, optional
        Override C and K (useful when some ids have no sample).
    fields : iterable of str
        Which statistics to compute, among :data:`STAT_FIELDS`.

    Returns
    -------
    ClientStats
    """
    fields = set(fields)
    unknown = fields - set(STAT_FIELDS)
    if unknown:
        raise InputError(f"unknown statistic(s) {sorted(unknown)}; choose from {list(STAT_FIELDS)}")
    if clients is None:
        F, y, k, C, _ = check_dataset(features, labels, None, num_classes)
        K = 1
    else:
        from privfed._validation import as_int_vector, check_features, check_labels

        F = check_features(features)
        y, C = check_labels(labels, F.shape[0], num_classes)
        k = as_int_vector(clients, "clients")
        if k.shape[0] != F.shape[0]:
            raise InputError(f"clients has {k.shape[0]} entries but features has {F.shape[0]} rows; they must match")
        if k.size and k.min() < 0:
            raise InputError("clients must be >= 0")
        K = int(k.max()) + 1
    if num_clients is not None:
        if num_clients < K:
            raise InputError(f"num_clients={num_clients} but client ids go up to {K - 1}")
        K = int(num_clients)
    d = F.shape[1]
    group = k * C + y
    counts = np.bincount(group, minlength=K * C).astype(np.float64).reshape(K, C)
    sums = _group_sums(F, group, K * C).reshape(K, C, d)
    second = _group_second_moments(F, k, K) if "second" in fields else None
    class_second = (
        _group_second_moments(F, group, K * C).reshape(K, C, d, d) if "class_second" in fields else None
    )
    return ClientStats(counts=counts, sums=sums, second=second, class_second=class_second)
