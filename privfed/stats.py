"""Client statistics: the one object that flows from clients to methods.

:class:`ClientStats` holds the statistics of ``K`` clients (or pseudo-clients,
see FedCOF's multi-mean sampling).  Every field is *additive*: the statistics
of a union of clients are the sum of theirs, so aggregation is a sum
(:meth:`ClientStats.total`, :class:`StatsFold`) and masking, homomorphic
encryption and noise act on the same arrays.  Server-side arrays are float64.

Fields (``K`` clients, ``C`` classes, ``d`` features), as dense views:

``counts``        (K, C)        n_kc, samples of class c on client k
``sums``          (K, C, d)     s_kc = sum of client k's class-c features
``second``        (K, d, d)     G_k = sum_i f_i f_i^T over all of client k's samples
``class_second``  (K, C, d, d)  sum of f f^T over client k's class-c samples
                                (the additive form of per-class scatter, used by
                                the FedCOF oracle / CCVR)

Storage is what exists.  A federation of K clients and C classes in which
only M (client, class) pairs hold data (M = 54,590 of K C = 11.2 million at
iNat-120K) is stored as the pair layout

``pair_client``   (M,)     client of each pair (sorted by client, then class)
``pair_class``    (M,)     class of each pair
``pair_counts``   (M,)     n_kc of each pair
``pair_sums``     (M, d)   s_kc of each pair

plus the summed second moment ``gram()`` = sum_k G_k (d, d).  A pair may be a
*count-only cell*: a noisy count kept for a class the client lacks (count
noise, FedCOF App. I.1) has a zero sum, and such cells are stored without a
row of ``pair_sums`` (:meth:`ClientStats.from_pairs` with ``sum_rows``; at
iNat-120K, Laplace count noise keeps about half of the 11 million empty cells,
56 GB of zero rows at d = 1,280).  Per-client and
per-class second moments are kept only where something asks for them per
client: statistics computed from features build them from the features on
first access.  The dense views above are built on demand (and cached);
one that would exceed :data:`DENSE_VIEW_LIMIT` bytes is refused with an
:class:`~privfed.errors.InputError` naming its size.  Statistics constructed
from dense arrays (as noise mechanisms do) keep them as given (no copy) and
derive the pair layout on demand: a pair is a (client, class) cell whose
count or sum is non-zero.

:class:`StatsFold` folds client statistics in chunk by chunk (memory
O(C d + d^2) for the total, O(M d + d^2) when the pairs are kept): the
aggregation step of the trade-off sweep and of a server receiving client
updates.  :func:`privfed.fit`, which holds every sample, folds them in one
sorted pass into the same result (:func:`privfed.pipeline.fold_statistics`).

Optional fields are ``None`` when not computed.  Counts are floats so that
noisy releases (which may be negative or fractional) use the same type.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

from privfed._validation import check_dataset, check_num_classes, env_byte_size, refuse_masked
from privfed.errors import ConfigError, InputError

__all__ = [
    "DENSE_VIEW_LIMIT",
    "STAT_FIELDS",
    "ClientStats",
    "StatsFold",
    "compute_client_stats",
    "dense_view_limit",
]

#: Names of every statistic a method may require.
STAT_FIELDS = ("counts", "sums", "second", "class_second")

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


# Memory bound (bytes) of one padded block in the batched d x d products.
_BLOCK_BYTES = 64 * 2**20
# Rows of the M x d pair block processed at once by server-side products.
_ROW_BLOCK_BYTES = 32 * 2**20


def _check_dense(name: str, shape: tuple[int, ...]) -> None:
    nbytes = 8 * int(np.prod(shape, dtype=np.float64))
    limit = dense_view_limit()
    if nbytes > limit:
        raise InputError(
            f"the dense view ClientStats.{name} of shape {shape} needs {nbytes / 2**30:.3g} GiB, over the "
            f"{limit / 2**30:.3g} GiB limit; use the pair layout (pair_client, pair_class, "
            "pair_counts, pair_sums, gram()) or raise privfed.stats.DENSE_VIEW_LIMIT"
        )


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view (the caller's array keeps its flags; nothing is copied)."""
    v = a.view()
    v.setflags(write=False)
    return v


def _as_f64(a, name: str) -> np.ndarray:
    refuse_masked(a, name)
    arr = np.asarray(a)
    if arr.dtype != np.float64:
        arr = arr.astype(np.float64)
    return arr


class _Features:
    """Features kept by reference to build per-client second moments on first access."""

    def __init__(
        self, F: np.ndarray, client: np.ndarray, label: np.ndarray, weight: np.ndarray | None = None
    ) -> None:
        # ``weight`` (one per client, >= 0): the second moments are those of sqrt(w_k) f, i.e. w_k G_k.
        self.F, self.client, self.label, self.weight = F, client, label, weight

    def _rows(self) -> np.ndarray:
        if self.weight is None:
            return self.F
        return np.asarray(self.F, dtype=np.float64) * np.sqrt(self.weight)[self.client, None]

    def second(self, K: int) -> np.ndarray:
        _check_dense("second", (K, self.F.shape[1], self.F.shape[1]))
        return _group_second_moments(self._rows(), self.client, K)

    def class_second(self, K: int, C: int) -> np.ndarray:
        d = self.F.shape[1]
        _check_dense("class_second", (K, C, d, d))
        return _group_second_moments(self._rows(), self.client * C + self.label, K * C).reshape(K, C, d, d)

    def scaled(self, weights: np.ndarray) -> _Features:
        """The same features with client k's second moments multiplied by ``weights[k]``."""
        w = np.asarray(weights, dtype=np.float64)
        return _Features(self.F, self.client, self.label, w if self.weight is None else self.weight * w)

    def subset(self, rows: np.ndarray) -> _Features:
        """Features of clients ``rows`` (distinct), renumbered 0..len(rows)-1."""
        new = np.full(int(max(self.client.max(initial=-1), rows.max(initial=-1))) + 1, -1, dtype=np.int64)
        new[rows] = np.arange(rows.size)
        keep = new[self.client] >= 0
        weight = None if self.weight is None else self.weight[rows]
        return _Features(self.F[keep], new[self.client[keep]], self.label[keep], weight)

    def merged(self) -> _Features:
        if self.weight is not None:  # one client: fold the weights into the rows
            return _Features(self._rows(), np.zeros_like(self.client), self.label)
        return _Features(self.F, np.zeros_like(self.client), self.label)


class ClientStats:
    """Additive per-client statistics of frozen-backbone features.

    Construct from dense arrays (``ClientStats(counts=..., sums=...)``), from
    the pair layout (:meth:`from_pairs`), or from features
    (:func:`compute_client_stats`).  Instances are immutable; arrays are not
    copied, so do not modify arrays (or features) after handing them over.

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

    __slots__ = (
        "_K",
        "_C",
        "_d",
        "_counts",
        "_sums",
        "_pairs",
        "_second",
        "_class_second",
        "_gram",
        "_features",
        "_fields",
        "_owners",
        "folded_pairs",
        "_sum_rows",
    )

    def __init__(self, counts, sums, second=None, class_second=None, owners=None) -> None:
        counts = _as_f64(counts, "counts")
        sums = _as_f64(sums, "sums")
        if counts.ndim != 2:
            raise InputError(f"ClientStats.counts must have shape (K, C), got {counts.shape}")
        K, C = counts.shape
        if sums.ndim != 3 or sums.shape[:2] != (K, C):
            raise InputError(f"ClientStats.sums must have shape (K={K}, C={C}, d), got {sums.shape}")
        d = sums.shape[2]
        fields = {"counts", "sums"}
        if second is not None:
            second = _as_f64(second, "second")
            if second.shape != (K, d, d):
                raise InputError(f"ClientStats.second must have shape ({K}, {d}, {d}), got {second.shape}")
            second = readonly(second)
            fields.add("second")
        if class_second is not None:
            class_second = _as_f64(class_second, "class_second")
            if class_second.shape != (K, C, d, d):
                raise InputError(
                    f"ClientStats.class_second must have shape ({K}, {C}, {d}, {d}), got {class_second.shape}"
                )
            class_second = readonly(class_second)
            fields.add("class_second")
        self._init(
            K,
            C,
            d,
            counts=readonly(counts),
            sums=readonly(sums),
            pairs=None,
            second=second,
            class_second=class_second,
            gram=None,
            features=None,
            fields=fields,
            owners=owners,
        )

    def _init(
        self,
        K,
        C,
        d,
        *,
        counts,
        sums,
        pairs,
        second,
        class_second,
        gram,
        features,
        fields,
        owners,
        folded_pairs=None,
        sum_rows=None,
    ) -> None:
        if owners is not None:
            owners = np.array(owners, dtype=np.int64)
            if owners.shape != (K,):
                raise InputError(f"ClientStats.owners must have shape ({K},), got {owners.shape}")
            owners.setflags(write=False)
        s = object.__setattr__
        s(self, "_K", int(K))
        s(self, "_C", int(C))
        s(self, "_d", int(d))
        s(self, "_counts", counts)
        s(self, "_sums", sums)
        s(self, "_pairs", pairs)
        s(self, "_second", second)
        s(self, "_class_second", class_second)
        s(self, "_gram", gram)
        s(self, "_features", features)
        s(self, "_fields", frozenset(fields))
        s(self, "_owners", owners)
        s(self, "folded_pairs", folded_pairs)
        s(self, "_sum_rows", sum_rows)

    def __setattr__(self, name, value):
        raise AttributeError("ClientStats is immutable; use with_arrays(...) for a modified copy")

    def __getstate__(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict) -> None:
        for name in self.__slots__:  # a slot added since the object was pickled starts empty
            object.__setattr__(self, name, state.get(name))

    @classmethod
    def _new(cls, K, C, d, **kw) -> ClientStats:
        obj = cls.__new__(cls)
        kw.setdefault("counts", None)
        kw.setdefault("sums", None)
        kw.setdefault("pairs", None)
        kw.setdefault("second", None)
        kw.setdefault("class_second", None)
        kw.setdefault("gram", None)
        kw.setdefault("features", None)
        kw.setdefault("owners", None)
        kw.setdefault("fields", {"counts", "sums"})
        obj._init(K, C, d, **kw)
        return obj

    @classmethod
    def from_pairs(
        cls,
        *,
        num_clients: int,
        num_classes: int,
        pair_client,
        pair_class,
        pair_counts,
        pair_sums,
        second=None,
        gram=None,
        owners=None,
        sum_rows=None,
    ) -> ClientStats:
        """Statistics from the pair layout.

        Parameters
        ----------
        num_clients, num_classes : int
            K and C.
        pair_client, pair_class : int arrays, shape (M,)
            Client and class of each pair (each pair at most once).
        pair_counts : array, shape (M,)
        pair_sums : array, shape (M, d)
        second : array, shape (K, d, d), optional
            Per-client second moments.
        gram : array, shape (d, d), optional
            The summed second moment only (``second`` is then available as a
            total: its per-client dense view is refused for K > 1).
        owners : int array, shape (K,), optional
        sum_rows : int array, shape (M,), optional
            Count-only cells: pair p's sum is ``pair_sums[sum_rows[p]]``, or
            zero where ``sum_rows[p] == -1`` (``pair_sums`` then has one row per
            pair with a sum, R <= M rows, each used once).  ``None``: row p is
            pair p.
        """
        refuse_masked(pair_client, "pair_client")
        refuse_masked(pair_class, "pair_class")
        pc = np.asarray(pair_client, dtype=np.int64)
        pk = np.asarray(pair_class, dtype=np.int64)
        n = _as_f64(pair_counts, "pair_counts")
        S = _as_f64(pair_sums, "pair_sums")
        M = pc.shape[0]
        R = M if sum_rows is None else int(np.count_nonzero(np.asarray(sum_rows) >= 0))
        if pk.shape != (M,) or n.shape != (M,) or S.ndim != 2 or S.shape[0] != R:
            raise InputError(
                f"pair arrays must have shapes (M,), (M,), (M,), (M, d); got {pc.shape}, {pk.shape}, "
                f"{n.shape}, {S.shape}"
                + ("" if sum_rows is None else f" (pair_sums: one row per sum_rows >= 0, {R})")
            )
        if sum_rows is not None:
            sum_rows = np.asarray(sum_rows)
            if sum_rows.shape != (M,) or sum_rows.dtype.kind not in "iu":
                raise InputError(
                    f"sum_rows must be an integer array of shape ({M},), got {sum_rows.dtype} {sum_rows.shape}"
                )
            sum_rows = sum_rows.astype(np.int64)
            used = np.sort(sum_rows[sum_rows >= 0])
            if np.any(sum_rows < -1) or not np.array_equal(used, np.arange(R)):
                raise InputError(
                    "sum_rows must hold -1 (a count-only cell) or each row of pair_sums exactly once"
                )
        K, C, d = int(num_clients), int(num_classes), S.shape[1]
        if M and (pc.min() < 0 or pc.max() >= K or pk.min() < 0 or pk.max() >= C):
            raise InputError(f"pair_client must lie in 0..{K - 1} and pair_class in 0..{C - 1}")
        key = pc * C + pk
        if M > 1 and np.any(key[1:] <= key[:-1]):
            order = np.argsort(key, kind="stable")
            key = key[order]
            if np.any(key[1:] == key[:-1]):
                raise InputError("each (client, class) pair may appear only once in the pair layout")
            pc, pk, n = pc[order], pk[order], n[order]
            if sum_rows is None:
                S = S[order]
            else:
                sum_rows = sum_rows[order]
        if sum_rows is not None and np.any(np.diff(sum_rows[sum_rows >= 0]) != 1):
            has = sum_rows >= 0  # the block in pair order: row r is the r-th pair with a sum
            S = S[sum_rows[has]]
            sum_rows = np.where(has, np.cumsum(has) - 1, -1)
        fields = {"counts", "sums"}
        if second is not None:
            second = readonly(_as_f64(second, "second"))
            if second.shape != (K, d, d):
                raise InputError(f"second must have shape ({K}, {d}, {d}), got {second.shape}")
            fields.add("second")
        if gram is not None:
            gram = readonly(_as_f64(gram, "gram"))
            if gram.shape != (d, d):
                raise InputError(f"gram must have shape ({d}, {d}), got {gram.shape}")
            fields.add("second")
        pairs = tuple(readonly(a) for a in (pc, pk, n, S))
        return cls._new(
            K,
            C,
            d,
            pairs=pairs,
            second=second,
            gram=gram,
            fields=fields,
            owners=owners,
            sum_rows=None if sum_rows is None else readonly(sum_rows),
        )

    # -- shape ---------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        """Number of rows K (clients or pseudo-clients)."""
        return self._K

    @property
    def num_classes(self) -> int:
        return self._C

    @property
    def dim(self) -> int:
        return self._d

    @property
    def owners(self) -> np.ndarray | None:
        return self._owners

    @property
    def available(self) -> frozenset[str]:
        """Names of the statistics present (``counts`` and ``sums`` always are)."""
        return self._fields

    # -- the pair layout -------------------------------------------------------
    def _pair_block(self):
        """(pair_client, pair_class, pair_counts, block, sum_rows): the pairs with their sums as stored.

        ``sum_rows`` is ``None`` when row p of ``block`` is pair p; else pair p's
        sum is ``block[sum_rows[p]]``, zero where ``sum_rows[p] == -1``
        (count-only cells).  Nothing is materialised.
        """
        if self._sum_rows is None:
            return (*self._pair_data(), None)
        return (*self._pairs, self._sum_rows)

    def summed_pairs(self) -> np.ndarray:
        """Boolean (M,): which pairs have a stored sum (False: a count-only cell, its sum is zero)."""
        if self._sum_rows is None:
            return np.ones(len(self._pair_data()[0]), dtype=bool)
        return self._sum_rows >= 0

    def _pair_data(self):
        if self._sum_rows is not None:  # count-only cells: every pair's sum as one (M, d) block
            pc, pk, n, block = self._pairs
            _check_dense("pair_sums", (pc.size, self._d))
            S = np.zeros((pc.size, self._d))
            has = self._sum_rows >= 0
            S[has] = block[self._sum_rows[has]]
            return pc, pk, n, readonly(S)
        if self._pairs is None:
            counts, sums = self._counts, self._sums
            nz = (counts != 0) | np.any(sums != 0, axis=2)
            kk, cc = np.nonzero(nz)
            pairs = tuple(
                readonly(a) for a in (kk.astype(np.int64), cc.astype(np.int64), counts[kk, cc], sums[kk, cc])
            )
            object.__setattr__(self, "_pairs", pairs)
        return self._pairs

    @property
    def pair_client(self) -> np.ndarray:
        """Client of each stored (client, class) pair, shape (M,)."""
        return self._pair_block()[0]

    @property
    def pair_class(self) -> np.ndarray:
        """Class of each stored pair, shape (M,)."""
        return self._pair_block()[1]

    @property
    def pair_counts(self) -> np.ndarray:
        """n_kc of each stored pair, shape (M,)."""
        return self._pair_block()[2]

    @property
    def pair_sums(self) -> np.ndarray:
        """s_kc of each stored pair, shape (M, d)."""
        return self._pair_data()[3]

    def class_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """(N_c, S_c): counts (C,) and sums (C, d) summed over clients, from the stored pairs."""
        if self._counts is not None and self._sums is not None:
            return self._counts.sum(axis=0), self._sums.sum(axis=0)
        _, pk, n, S, rows = self._pair_block()
        N = np.bincount(pk, weights=n, minlength=self._C)
        if rows is None:
            return N, sum_rows_by(S, pk, self._C)
        row_class = np.empty(S.shape[0], dtype=np.int64)
        row_class[rows[rows >= 0]] = pk[rows >= 0]
        return N, sum_rows_by(S, row_class, self._C)

    # -- dense views -----------------------------------------------------------
    @property
    def counts(self) -> np.ndarray:
        """Dense (K, C) counts (built from the pairs on first access)."""
        if self._counts is None:
            _check_dense("counts", (self._K, self._C))
            pc, pk, n, _ = self._pairs
            out = np.zeros((self._K, self._C))
            out[pc, pk] = n
            object.__setattr__(self, "_counts", readonly(out))
        return self._counts

    @property
    def sums(self) -> np.ndarray:
        """Dense (K, C, d) sums (built from the pairs on first access; refused above DENSE_VIEW_LIMIT)."""
        if self._sums is None:
            _check_dense("sums", (self._K, self._C, self._d))
            pc, pk, _, S, rows = self._pair_block()
            out = np.zeros((self._K, self._C, self._d))
            if rows is None:
                out[pc, pk] = S
            else:
                out[pc[rows >= 0], pk[rows >= 0]] = S[rows[rows >= 0]]
            object.__setattr__(self, "_sums", readonly(out))
        return self._sums

    @property
    def second(self) -> np.ndarray | None:
        """Dense (K, d, d) per-client second moments, ``None`` if not computed."""
        if "second" not in self._fields:
            return None
        if self._second is None:
            if self._features is not None:
                out = self._features.second(self._K)
            elif self._K == 1:
                out = np.array(self.gram())[None]
            elif self._class_second is not None:
                out = self._class_second.sum(axis=1)
            else:
                raise InputError(
                    f"these statistics hold only the second moment summed over the {self._K} clients "
                    "(they were folded); per-client second moments are not available"
                )
            object.__setattr__(self, "_second", readonly(out))
        return self._second

    @property
    def class_second(self) -> np.ndarray | None:
        """Dense (K, C, d, d) per-class second moments, ``None`` if not computed."""
        if "class_second" not in self._fields:
            return None
        if self._class_second is None:
            if self._features is None:
                raise InputError(
                    "these statistics hold only the summed second moment (per-class second moments were "
                    "folded into it); per-class second moments are not available"
                )
            out = self._features.class_second(self._K, self._C)
            object.__setattr__(self, "_class_second", readonly(out))
        return self._class_second

    def gram(self) -> np.ndarray:
        """sum_k G_k = sum over every sample of f f^T, shape (d, d) (needs ``second`` or ``class_second``)."""
        if self._gram is None:
            if not ({"second", "class_second"} & self._fields):
                raise InputError(
                    "ClientStats has no second moments; compute them with fields=('second', ...)"
                )
            if self._second is not None:
                g = self._second.sum(axis=0)
            elif self._class_second is not None:
                g = self._class_second.sum(axis=(0, 1))
            elif self._features is not None:
                g = (
                    gram_of(self._features.F)
                    if self._features.weight is None
                    else self.client_weighted_gram(np.ones(self._K))
                )
            else:  # pragma: no cover - every constructor sets one of them
                raise InputError("ClientStats lost its second moments")
            object.__setattr__(self, "_gram", readonly(g))
        return self._gram

    def client_weighted_gram(self, weights) -> np.ndarray:
        """sum_k w_k G_k (d, d) for per-client weights ``w`` (K,), without stacking (K, d, d).

        From the features when the statistics were computed from them (rows
        scaled by sqrt(w_k), in blocks of rows), else from per-client second
        moments held as values.
        """
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (self._K,):
            raise InputError(f"weights must have shape ({self._K},), got {w.shape}")
        if "second" not in self._fields:
            raise InputError("ClientStats has no second moments; compute them with fields=('second', ...)")
        if self._second is None and self._features is not None:
            F, client = self._features.F, self._features.client
            if self._features.weight is not None:
                w = w * self._features.weight
            root = np.sqrt(w)
            d = self._d
            out = np.zeros((d, d))
            step = max(1, _ROW_BLOCK_BYTES // (8 * max(d, 1)))
            for a in range(0, F.shape[0], step):
                B = np.asarray(F[a : a + step], dtype=np.float64) * root[client[a : a + step], None]
                out += B.T @ B
            return out
        return np.einsum("k,kij->ij", w, self.second)

    def scale_clients(self, weights) -> ClientStats:
        """Every statistic of client k multiplied by ``weights[k]`` (>= 0), each client kept separate.

        The client-level bound (a client with n_k > n_max records scaled by
        n_max / n_k) and a trusted aggregator's Poisson sampling (weights 0/1)
        act per client, *before* anything is summed: per-client second moments
        stay available (built from the features, rows scaled by sqrt(w_k), on
        first access), so secure aggregation and sampling can still noise,
        mask or drop each client's own matrix.  Statistics holding only the
        summed second moment of K > 1 clients cannot be scaled per client and
        are refused.
        """
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (self._K,) or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise InputError(f"weights must be {self._K} finite values >= 0, got shape {w.shape}")
        seconds = {"second", "class_second"} & self._fields
        carry = dict(second=None, class_second=None, gram=None, features=None, fields=set(self._fields))
        if seconds:
            if self._features is not None:
                carry["features"] = self._features.scaled(w)
            if self._second is not None:
                carry["second"] = readonly(self._second * w[:, None, None])
            if self._class_second is not None:
                carry["class_second"] = readonly(self._class_second * w[:, None, None, None])
            if self._features is None and (
                ("second" in seconds and self._second is None)
                or ("class_second" in seconds and self._class_second is None)
            ):
                if self._K != 1:
                    raise InputError(
                        f"these statistics hold only the second moment summed over the {self._K} clients; "
                        "they cannot be bounded per client (compute them per client, e.g. with "
                        "compute_client_stats(..., fields=('second', ...)))"
                    )
                carry["gram"] = readonly(self.gram() * w[0])
                if "second" in seconds:
                    carry["second"] = carry["gram"][None]
        if self._counts is not None and self._sums is not None:
            out = ClientStats._new(
                self._K,
                self._C,
                self._d,
                counts=readonly(self._counts * w[:, None]),
                sums=readonly(self._sums * w[:, None, None]),
                owners=self._owners,
                **carry,
            )
        else:
            pc, pk, n, S, rows = self._pair_block()
            if rows is None:
                S2 = S * w[pc][:, None]
            else:
                row_client = np.empty(S.shape[0], dtype=np.int64)
                row_client[rows[rows >= 0]] = pc[rows >= 0]
                S2 = S * w[row_client][:, None]
            pairs = tuple(readonly(a) for a in (pc, pk, n * w[pc], S2))
            out = ClientStats._new(
                self._K, self._C, self._d, pairs=pairs, owners=self._owners, sum_rows=rows, **carry
            )
        object.__setattr__(out, "folded_pairs", self.folded_pairs)
        return out

    def is_materialised(self, name: str) -> bool:
        """Whether statistic ``name`` is held as an array (given or already built), not derived on demand.

        Per-class second moments computed from features are not materialised
        until asked for; a server that needs only their sum reads :meth:`gram`.
        """
        return {
            "counts": self._counts,
            "sums": self._sums,
            "second": self._second,
            "class_second": self._class_second,
        }[name] is not None

    def arrays(self) -> dict[str, np.ndarray]:
        """The present statistics by name (each with leading axis K), as dense views."""
        return {f: getattr(self, f) for f in STAT_FIELDS if f in self._fields}

    # -- algebra -------------------------------------------------------------
    def _carry(self, names=None) -> dict:
        """Second-moment storage carried over to a copy keeping the clients (names: fields kept)."""
        names = self._fields if names is None else names
        keep2 = "second" in names
        keepc = "class_second" in names
        fields = (
            {"counts", "sums"} | ({"second"} if keep2 else set()) | ({"class_second"} if keepc else set())
        )
        return dict(
            second=self._second if keep2 else None,
            class_second=self._class_second if keepc else None,
            gram=self._gram if (keep2 or keepc) else None,
            features=self._features if (keep2 or keepc) else None,
            fields=fields,
        )

    def total(self) -> ClientStats:
        """Sum over clients: the aggregate, as a ClientStats with K = 1."""
        N, S = self.class_totals()
        kw = {"fields": set(self._fields)}
        if "second" in self._fields or "class_second" in self._fields:
            kw["gram"] = readonly(np.array(self.gram()))
        if "second" in self._fields:
            kw["second"] = kw["gram"][None]
        if "class_second" in self._fields:
            if self._class_second is not None:
                kw["class_second"] = readonly(self._class_second.sum(axis=0, keepdims=True))
            elif self._features is not None:
                kw["features"] = self._features.merged()
        out = ClientStats._new(1, self._C, self._d, counts=readonly(N[None]), sums=readonly(S[None]), **kw)
        object.__setattr__(
            out, "folded_pairs", self.folded_pairs if self.folded_pairs is not None else self.num_pairs()
        )
        return out

    def __add__(self, other: ClientStats) -> ClientStats:
        if not isinstance(other, ClientStats):
            return NotImplemented
        if (
            self.available != other.available
            or (self._K, self._C) != (other._K, other._C)
            or self.dim != other.dim
        ):
            raise InputError("cannot add ClientStats with different fields or shapes")
        if self._K == 1:
            N1, S1 = self.class_totals()
            N2, S2 = other.class_totals()
            kw = {"fields": set(self._fields)}
            if {"second", "class_second"} & self._fields:
                kw["gram"] = readonly(self.gram() + other.gram())
            if "second" in self._fields:
                kw["second"] = kw["gram"][None]
            if "class_second" in self._fields:
                kw["class_second"] = readonly(self.class_second + other.class_second)
            return ClientStats._new(
                1,
                self._C,
                self._d,
                counts=readonly((N1 + N2)[None]),
                sums=readonly((S1 + S2)[None]),
                owners=self._owners,
                **kw,
            )
        return ClientStats(
            **{k: v + getattr(other, k) for k, v in self.arrays().items()}, owners=self._owners
        )

    def select(self, names: Iterable[str]) -> ClientStats:
        """Keep only the named statistics (``counts`` and ``sums`` are always kept); nothing is copied."""
        names = set(names) | {"counts", "sums"}
        missing = names - self.available
        if missing:
            raise InputError(
                f"ClientStats lacks {sorted(missing)}; compute them with compute_client_stats(fields=...)"
            )
        out = ClientStats._new(
            self._K,
            self._C,
            self._d,
            counts=self._counts,
            sums=self._sums,
            pairs=self._pairs,
            owners=self._owners,
            sum_rows=self._sum_rows,
            **self._carry(names),
        )
        object.__setattr__(out, "folded_pairs", self.folded_pairs)
        return out

    def with_arrays(self, **arrays) -> ClientStats:
        """A copy with some statistics replaced by dense arrays (used by noise mechanisms)."""
        unknown = set(arrays) - set(STAT_FIELDS)
        if unknown:
            raise InputError(f"unknown statistic(s) {sorted(unknown)}; choose from {list(STAT_FIELDS)}")
        counts = arrays.get("counts", self._counts)
        sums = arrays.get("sums", self._sums)
        if "counts" in arrays and "sums" not in arrays:
            sums = self.sums
        if "sums" in arrays and "counts" not in arrays:
            counts = self.counts
        if counts is None and sums is None:  # only second moments replaced: keep the pairs
            out = ClientStats._new(
                self._K,
                self._C,
                self._d,
                pairs=self._pairs,
                owners=self._owners,
                sum_rows=self._sum_rows,
                **self._carry(),
            )
        else:
            out = ClientStats(counts=counts, sums=sums, owners=self._owners)
            object.__setattr__(out, "_second", self._second)
            object.__setattr__(out, "_class_second", self._class_second)
            object.__setattr__(out, "_gram", self._gram)
            object.__setattr__(out, "_features", self._features)
            object.__setattr__(out, "_fields", self._fields)
        for name in ("second", "class_second"):
            if name in arrays:
                v = arrays[name]
                if v is None:
                    object.__setattr__(out, "_fields", out._fields - {name})
                    object.__setattr__(out, "_" + name, None)
                else:
                    shape = (
                        (self._K, self._d, self._d)
                        if name == "second"
                        else (self._K, self._C, self._d, self._d)
                    )
                    v = _as_f64(v, name)
                    if v.shape != shape:
                        raise InputError(f"ClientStats.{name} must have shape {shape}, got {v.shape}")
                    object.__setattr__(out, "_" + name, readonly(v))
                    object.__setattr__(out, "_fields", out._fields | {name})
                object.__setattr__(out, "_gram", None)
                object.__setattr__(out, "_features", None)
                # the other second-moment field, if kept from features, must be materialised now
        if ("second" in arrays) != ("class_second" in arrays) and self._features is not None:
            other = "class_second" if "second" in arrays else "second"
            if other in out._fields and getattr(out, "_" + other) is None:
                object.__setattr__(out, "_" + other, getattr(self, other))
        return out

    def clients(self, rows) -> ClientStats:
        """The statistics of a subset of rows (clients)."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64)
        owners = None if self._owners is None else self._owners[rows]
        distinct = np.unique(rows).size == rows.size
        if self._counts is None and distinct:
            pc, pk, n, S, srows = self._pair_block()
            new = np.full(self._K, -1, dtype=np.int64)
            new[rows] = np.arange(rows.size)
            keep = new[pc] >= 0
            pc2 = new[pc[keep]]
            order = np.lexsort((pk[keep], pc2))
            sum_rows = None
            if srows is None:
                S2 = S[keep][order]
            else:  # count-only cells stay count-only
                r = srows[keep][order]
                has = r >= 0
                S2 = S[r[has]]
                sum_rows = np.full(r.size, -1, dtype=np.int64)
                sum_rows[has] = np.arange(int(has.sum()))
            pairs = tuple(readonly(a) for a in (pc2[order], pk[keep][order], n[keep][order], S2))
            carry = self._carry()
            carry["second"] = None if self._second is None else readonly(self._second[rows])
            carry["class_second"] = None if self._class_second is None else readonly(self._class_second[rows])
            carry["gram"] = None
            if self._features is not None:
                carry["features"] = self._features.subset(rows)
            elif (
                carry["second"] is None
                and carry["class_second"] is None
                and carry["fields"] - {"counts", "sums"}
            ):
                raise InputError(
                    "per-client second moments were folded; a subset of clients is not available"
                )
            return ClientStats._new(
                rows.size, self._C, self._d, pairs=pairs, owners=owners, sum_rows=sum_rows, **carry
            )
        return ClientStats(**{k: v[rows] for k, v in self.arrays().items()}, owners=owners)

    def means(self) -> np.ndarray:
        """Class means s_kc / n_kc, NaN where n_kc <= 0 (shape (K, C, d))."""
        with np.errstate(invalid="ignore", divide="ignore"):
            n = self.counts[..., None]
            return np.where(n > 0, self.sums / np.where(n > 0, n, 1.0), np.nan)

    def num_pairs(self) -> int:
        """M: the number of (client, class) pairs with data (counts > 0)."""
        if self._counts is not None:
            return int(np.count_nonzero(self._counts > 0))
        return int(np.count_nonzero(self._pairs[2] > 0))

    def nbytes_float32(self) -> int:
        """Bytes to upload every present array in float32 (4 bytes a value), dense shapes."""
        K, C, d = self._K, self._C, self._d
        size = {"counts": K * C, "sums": K * C * d, "second": K * d * d, "class_second": K * C * d * d}
        return 4 * sum(size[f] for f in self._fields)

    def __repr__(self) -> str:
        layout = (
            "dense"
            if self._counts is not None and self._sums is not None
            else f"pairs M={len(self._pairs[0])}"
        )
        return (
            f"ClientStats(K={self.num_clients}, C={self.num_classes}, d={self.dim}, "
            f"fields={sorted(self.available)}, {layout})"
        )


# -- streaming aggregation -----------------------------------------------------------
class StatsFold:
    """Fold client statistics in as they arrive: the aggregation step of a server.

    Usage::

        fold = StatsFold(num_classes=C, dim=d, keep="total")   # or keep="pairs"
        for chunk in client_chunks:        # each a ClientStats of the next clients
            fold.add(chunk)
        stats = fold.result()              # a ClientStats

    Every chunk holds new clients (its rows are appended after the clients
    folded so far; pseudo-client ``owners`` are renumbered the same way).
    Chunks must have the same C, d and fields.

    ``keep="total"``: memory O(C d + d^2); ``result()`` is the aggregate
    (K = 1) as :meth:`ClientStats.total` gives, for methods that need sums
    only (``per_client = False``).
    ``keep="pairs"``: memory O(M d + d^2); ``result()`` holds every
    (client, class) pair with data, for methods that need each client's
    values (FedCOF).

    Second moments are folded into their sum (``gram``, d x d) in both
    modes; per-client and per-class d x d matrices are never stacked (the
    result's ``second`` is the total; per-class second moments supplied as
    values are summed into a (C, d, d) total only in ``keep="total"``).

    Attributes
    ----------
    num_clients : int
        Rows folded so far (clients or pseudo-clients).
    num_owners : int
        Real clients folded so far.
    num_pairs : int
        (client, class) pairs with a positive count folded so far (M).
    """

    def __init__(self, *, num_classes: int, dim: int, keep: str = "total") -> None:
        if keep not in ("total", "pairs"):
            raise InputError(f"keep must be 'total' or 'pairs', got {keep!r}")
        num_classes, dim = check_num_classes(num_classes), check_num_classes(dim, "dim")
        need = 8 * num_classes * (dim + 1 if keep == "total" else 1)
        if need > dense_view_limit():  # checked before anything is allocated
            raise InputError(
                f"StatsFold(num_classes={num_classes}, dim={dim}) would hold {need / 2**30:.3g} GiB of class "
                f"totals, over the {dense_view_limit() / 2**30:.3g} GiB limit (privfed.stats.DENSE_VIEW_LIMIT, "
                "$PRIVFED_DENSE_VIEW_LIMIT); pass the number of classes and the feature dimension the uploads have"
            )
        self.num_classes, self.dim, self.keep = num_classes, dim, keep
        self._sources: set = set()
        self._client_ids: set = set()
        self.num_clients = 0
        self.num_owners = 0
        self.num_pairs = 0
        self._fields: frozenset[str] | None = None
        self._N = np.zeros(self.num_classes)
        self._S = np.zeros((self.num_classes, self.dim)) if keep == "total" else None
        self._gram: np.ndarray | None = None
        self._cs: np.ndarray | None = None
        self._cs_values = True
        self._pairs: list[tuple[np.ndarray, ...]] = []
        self._rows = 0  # rows of pair sums folded so far
        self._count_only = False  # whether a chunk held count-only cells
        self._owners: list[np.ndarray] = []
        self._has_owners = False

    def add(self, chunk: ClientStats, *, source=None, client_ids=None) -> StatsFold:
        """Fold in the statistics of the next clients; returns ``self``.

        Every value is checked before anything is folded: a NaN or inf in an
        upload is an :class:`~privfed.errors.InputError` naming the sender
        (``source``, e.g. ``"node 7"``), the client, the statistic and the
        class, never a silently wrong head.  ``source`` (any hashable) and
        ``client_ids`` (the ids of the chunk's real clients, one per client)
        may each appear once across all chunks: a client uploading twice is refused.
        """
        where = "chunk" if source is None else str(source)
        if not isinstance(chunk, ClientStats):
            raise InputError(f"StatsFold.add takes a ClientStats, got {type(chunk).__name__} from {where}")
        if (chunk.num_classes, chunk.dim) != (self.num_classes, self.dim):
            raise InputError(
                f"{where} has C={chunk.num_classes}, d={chunk.dim}; this fold takes C={self.num_classes}, "
                f"d={self.dim}"
            )
        if self._fields is not None and chunk.available != self._fields:
            raise InputError(
                f"{where} has fields {sorted(chunk.available)}, earlier chunks {sorted(self._fields)}"
            )
        ids = self._check_ids(chunk, source, client_ids, where)
        _check_upload_finite(chunk, where, ids)
        if source is not None:
            self._sources.add(source)
        if ids is not None:
            self._client_ids.update(ids)
        if self._fields is None:
            self._fields = chunk.available
            self._has_owners = chunk.owners is not None
        if {"second", "class_second"} & self._fields:
            g = chunk.gram()
            self._gram = np.array(g) if self._gram is None else self._gram.__iadd__(g)
        if "class_second" in self._fields and self.keep == "total" and self._cs_values:
            if chunk._class_second is not None:
                cs = chunk._class_second.sum(axis=0)
                self._cs = cs if self._cs is None else self._cs.__iadd__(cs)
            else:
                self._cs_values, self._cs = False, None
        self.num_pairs += chunk.folded_pairs if chunk.folded_pairs is not None else chunk.num_pairs()
        if self.keep == "total":
            N, S = chunk.class_totals()
            self._N += N
            self._S += S
        else:
            pc, pk, n, S, rows = chunk._pair_block()
            self._count_only |= rows is not None
            rows = np.arange(pc.size) if rows is None else rows
            rows = np.where(rows >= 0, rows + self._rows, -1)
            self._rows += S.shape[0]
            self._pairs.append((pc + self.num_clients, pk, n, S, rows))
            self._N += np.bincount(pk, weights=n, minlength=self.num_classes)
        if chunk.owners is not None:
            self._owners.append(chunk.owners + self.num_owners)
            self.num_owners += int(chunk.owners.max(initial=-1)) + 1
        else:
            self._owners.append(np.arange(chunk.num_clients) + self.num_owners)
            self.num_owners += chunk.num_clients
        self.num_clients += chunk.num_clients
        return self

    def _check_ids(self, chunk: ClientStats, source, client_ids, where: str) -> list | None:
        if source is not None:
            try:
                seen = source in self._sources
            except TypeError:
                raise InputError(
                    f"StatsFold.add: source must be hashable (a name or an id), got {source!r}"
                ) from None
            if seen:
                raise InputError(
                    f"{where} already uploaded statistics to this fold; a second upload from the same "
                    "sender is refused (it would count its clients twice)"
                )
        if client_ids is None:
            return None
        refuse_masked(client_ids, "client_ids")
        ids = np.asarray(client_ids)
        owners = chunk.num_clients if chunk.owners is None else int(chunk.owners.max(initial=-1)) + 1
        if ids.ndim != 1 or ids.shape[0] != owners or ids.dtype.kind not in "iuU":
            raise InputError(
                f"{where}: client_ids must be {owners} integer or string ids (one per client of the "
                f"chunk), got {ids.dtype} of shape {ids.shape}"
            )
        listed = ids.tolist()
        dup = sorted({i for i in listed if listed.count(i) > 1}) if len(set(listed)) != len(listed) else []
        again = [i for i in listed if i in self._client_ids]
        if dup or again:
            raise InputError(
                f"{where}: client id(s) {(dup or again)[:10]} "
                + ("appear twice in this chunk" if dup else "were already folded from an earlier chunk")
                + "; every client may upload once"
            )
        return listed

    def result(self) -> ClientStats:
        """The folded statistics (see the class docstring); ``folded_pairs`` is M."""
        if self._fields is None:
            raise InputError("nothing was folded; add at least one chunk of client statistics")
        C, d = self.num_classes, self.dim
        fields = set(self._fields)
        gram = None if self._gram is None else readonly(self._gram)
        if self.keep == "total":
            kw = {}
            if "second" in fields:
                kw["second"] = gram[None]
            if "class_second" in fields and self._cs_values and self._cs is not None:
                kw["class_second"] = readonly(self._cs[None])
            out = ClientStats._new(
                1,
                C,
                d,
                counts=readonly(self._N[None].copy()),
                sums=readonly(self._S[None].copy()),
                gram=gram,
                fields=fields,
                **kw,
            )
        else:
            if self._pairs:
                *pairs, rows = (readonly(np.concatenate(parts)) for parts in zip(*self._pairs))
            else:  # pragma: no cover - guarded above
                pairs, rows = (
                    [np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros((0, d))],
                    None,
                )
            owners = np.concatenate(self._owners) if self._has_owners else None
            out = ClientStats._new(
                self.num_clients,
                C,
                d,
                pairs=tuple(pairs),
                gram=gram,
                fields=fields,
                owners=owners,
                sum_rows=rows if self._count_only else None,
            )
        object.__setattr__(out, "folded_pairs", self.num_pairs)
        return out


def _first_bad(a: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN / inf of ``a`` (checked block by block), or None."""
    if a is None or a.size == 0:
        return None
    flat = a.reshape(-1)
    step = 1 << 21
    for s in range(0, flat.size, step):
        bad = ~np.isfinite(flat[s : s + step])
        if bad.any():
            return tuple(int(j) for j in np.unravel_index(s + int(np.flatnonzero(bad)[0]), a.shape))
    return None


def _check_upload_finite(chunk: ClientStats, where: str, ids: list | None) -> None:
    """Refuse a chunk holding NaN / inf, naming the sender, the client, the statistic and the class."""

    def who(row: int) -> str:
        owner = row if chunk._owners is None else int(chunk._owners[row])
        return f"client {ids[owner]!r}" if ids is not None else f"client {owner} of {where}"

    def refuse(stat: str, row: int | None, cls: int | None, value) -> None:
        at = (f" from {who(row)}" if row is not None else "") + (f", class {cls}" if cls is not None else "")
        raise InputError(
            f"{where}: statistic {stat!r}{at} holds {float(value)!r}; NaN/inf is not a statistic "
            "(a corrupt or overflowed upload), so it is refused instead of being folded into the head"
        )

    for stat, arr in (("counts", chunk._counts), ("sums", chunk._sums)):
        i = _first_bad(arr)
        if i is not None:
            refuse(stat, i[0], i[1], arr[i])
    if chunk._pairs is not None and chunk._counts is None and chunk._sums is None:
        pc, pk, n, S = chunk._pairs
        i = _first_bad(n)
        if i is not None:
            refuse("counts", int(pc[i[0]]), int(pk[i[0]]), n[i])
        i = _first_bad(S)
        if i is not None:
            p = i[0] if chunk._sum_rows is None else int(np.flatnonzero(chunk._sum_rows == i[0])[0])
            refuse("sums", int(pc[p]), int(pk[p]), S[i])
    for stat, arr in (("second", chunk._second), ("class_second", chunk._class_second)):
        i = _first_bad(arr)
        if i is not None:
            refuse(stat, i[0], i[1] if stat == "class_second" else None, arr[i])
    i = _first_bad(chunk._gram)
    if i is not None:
        refuse("second (summed)", None, None, chunk._gram[i])


# -- computing statistics from features ---------------------------------------------
def gram_of(F: np.ndarray) -> np.ndarray:
    """F^T F with one BLAS GEMM.

    numpy's GEMM, not scipy's ``dsyrk``: scipy ships its own OpenBLAS whose
    threads a caller's ``threadpoolctl`` limit may not reach, and its syrk
    was measured 5-800 times slower than the GEMM with two threads on a
    loaded machine (and no faster with one).
    """
    return F.T @ F


def sum_rows_by(F: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum rows of F by group id with one sparse-dense product (no sample loop)."""
    n = F.shape[0]
    onehot = sp.csr_matrix((np.ones(n), (group, np.arange(n))), shape=(num_groups, n))
    return np.asarray(onehot @ F)


_group_sums = sum_rows_by


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


def sorted_segments(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One stable sort of integer keys: (order, the distinct keys, CSR row pointer of their runs).

    ``key[order[indptr[j]:indptr[j + 1]]]`` all equal the j-th distinct key.
    """
    order = np.argsort(key, kind="stable")
    ks = key[order]
    starts = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1]))) if ks.size else np.zeros(0, np.int64)
    return order, ks[starts], np.concatenate((starts, [ks.size])).astype(np.int64)


def stats_from_rows(
    F: np.ndarray, y: np.ndarray, k: np.ndarray, C: int, K: int, fields, owners=None
) -> ClientStats:
    """Pair-layout statistics of validated rows (F float64, y and k int64 in range)."""
    d = F.shape[1]
    key = k * C + y if K > 1 else y
    # One sort: the CSR one-hot of samples into pairs, then one sparse-dense product.
    order, uniq, indptr = sorted_segments(key)
    counts = np.diff(indptr).astype(np.float64)
    onehot = sp.csr_matrix((np.ones(key.size), order, indptr), shape=(uniq.size, key.size))
    S = np.asarray(onehot @ F) if uniq.size else np.zeros((0, d))
    pcl = uniq // C if K > 1 else np.zeros(uniq.size, dtype=np.int64)
    pairs = tuple(readonly(a) for a in (pcl, uniq % C, counts, S))
    out_fields = {"counts", "sums"} | (set(fields) & {"second", "class_second"})
    features = gram = None
    if out_fields - {"counts", "sums"}:
        features = _Features(F, k, y)
        gram = readonly(gram_of(F))
    return ClientStats._new(
        K, C, d, pairs=pairs, gram=gram, features=features, fields=out_fields, owners=owners
    )


def compute_client_stats(
    features,
    labels,
    clients=None,
    *,
    num_classes: int | None = None,
    num_clients: int | None = None,
    fields: Iterable[str] = ("counts", "sums"),
) -> ClientStats:
    """Compute every client's statistics at once (vectorised, float64, pair layout).

    Per-client and per-class second moments, when requested, are built from
    ``features`` on first access (their sum, ``gram()``, is computed now);
    do not modify ``features`` while the statistics are in use.

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
            raise InputError(
                f"clients has {k.shape[0]} entries but features has {F.shape[0]} rows; they must match"
            )
        if k.size and k.min() < 0:
            raise InputError("clients must be >= 0")
        K = int(k.max()) + 1
    if num_clients is not None:
        if num_clients < K:
            raise InputError(f"num_clients={num_clients} but client ids go up to {K - 1}")
        K = int(num_clients)
    return stats_from_rows(F, y, k, C, K, fields)
