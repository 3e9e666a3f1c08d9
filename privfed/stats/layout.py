"""How :class:`~privfed.stats.ClientStats` is built, stored and viewed: pairs, dense views, Gram."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from privfed._validation import as_int_vector, check_num_classes
from privfed.errors import InputError
from privfed.stats.algebra import gram_of, sum_rows_by
from privfed.stats.arrays import as_f64, check_dense, readonly

if TYPE_CHECKING:  # typing.Self is Python 3.11+
    from typing import Self

__all__ = ["STAT_FIELDS", "StatsLayout"]

#: Names of every statistic a method may require.
STAT_FIELDS = ("counts", "sums", "second", "class_second")

# Rows of the M x d pair block processed at once by server-side products.
_ROW_BLOCK_BYTES = 32 * 2**20


def _one_class_one_feature(C: int, d: int) -> None:
    """Statistics of no class or of 0-dimensional features are refused: every method's head needs both (fedcof
    and fedlog crashed on them, the others returned empty heads)."""
    if C < 1 or d < 1:
        raise InputError(
            f"ClientStats needs at least one class and one feature dimension, got C={C} classes and d={d}"
        )


class StatsLayout:
    """Storage and views of :class:`~privfed.stats.ClientStats` (its one subclass, which adds the algebra)."""

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
        "_row_class_sums",
    )

    def __init__(self, counts, sums, second=None, class_second=None, owners=None) -> None:
        counts = as_f64(counts, "counts")
        sums = as_f64(sums, "sums")
        if counts.ndim != 2:
            raise InputError(f"ClientStats.counts must have shape (K, C), got {counts.shape}")
        K, C = counts.shape
        if sums.ndim != 3 or sums.shape[:2] != (K, C):
            raise InputError(f"ClientStats.sums must have shape (K={K}, C={C}, d), got {sums.shape}")
        d = sums.shape[2]
        _one_class_one_feature(C, d)
        fields = {"counts", "sums"}
        if second is not None:
            second = as_f64(second, "second")
            if second.shape != (K, d, d):
                raise InputError(f"ClientStats.second must have shape ({K}, {d}, {d}), got {second.shape}")
            second = readonly(second)
            fields.add("second")
        if class_second is not None:
            class_second = as_f64(class_second, "class_second")
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
            owners = np.array(as_int_vector(owners, "ClientStats.owners"))
            if owners.shape != (K,):
                raise InputError(f"ClientStats.owners must have shape ({K},), got {owners.shape}")
            if K and owners.min() < 0:  # a client's rows are bucketed and renumbered from 0 by every server
                raise InputError(f"ClientStats.owners must be client ids >= 0, got {int(owners.min())}")
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
        s(self, "_row_class_sums", None)

    def __setattr__(self, name, value):
        raise AttributeError("ClientStats is immutable; use with_arrays(...) for a modified copy")

    def __getstate__(self) -> dict:
        return {name: getattr(self, name) for name in StatsLayout.__slots__}

    def __setstate__(self, state: dict) -> None:
        for name in StatsLayout.__slots__:  # a slot added since the object was pickled starts empty
            object.__setattr__(self, name, state.get(name))

    @classmethod
    def _new(cls, K, C, d, **kw) -> Self:
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
    ) -> Self:
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
        pc = as_int_vector(pair_client, "pair_client")  # 1.7 is refused, not read as client 1
        pk = as_int_vector(pair_class, "pair_class")
        n = as_f64(pair_counts, "pair_counts")
        S = as_f64(pair_sums, "pair_sums")
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
        K, C = check_num_classes(num_clients, "num_clients"), check_num_classes(num_classes)
        d = S.shape[1]
        _one_class_one_feature(C, d)
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
            second = readonly(as_f64(second, "second"))
            if second.shape != (K, d, d):
                raise InputError(f"second must have shape ({K}, {d}, {d}), got {second.shape}")
            fields.add("second")
        if gram is not None:
            if second is not None:  # two values of one statistic: which one a method read would be chance
                raise InputError("give second (per client) or gram (their sum), not both")
            gram = readonly(as_f64(gram, "gram"))
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

    def _stored_class_sums(self) -> np.ndarray | None:
        """S_c over the stored sums of the pairs with a count > 0 (read-only (C, d): the pairs FedCOF's drop
        rule keeps), when a server folded it as the pairs arrived (:meth:`_keep_class_sums`) and the pairs are
        still the ones it was folded from; else None."""
        kept = self._row_class_sums
        if kept is None or self._pairs is None or kept[0] is not self._pairs[3]:
            return None
        return kept[1]

    def _keep_class_sums(self, S: np.ndarray) -> None:
        """Keep ``S`` (C, d), the class sums of the stored sums of pairs with a count > 0 a server folded as
        they arrived, tied to this very block of sums (a copy with other sums never reads them)."""
        object.__setattr__(self, "_row_class_sums", (self._pairs[3], readonly(S)))

    def summed_pairs(self) -> np.ndarray:
        """Boolean (M,): which pairs have a stored sum (False: a count-only cell, its sum is zero)."""
        if self._sum_rows is None:
            return np.ones(len(self._pair_data()[0]), dtype=bool)
        return self._sum_rows >= 0

    def _pair_data(self):
        if self._sum_rows is not None:  # count-only cells: every pair's sum as one (M, d) block
            pc, pk, n, block = self._pairs
            check_dense("pair_sums", (pc.size, self._d))
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
            if self._K == 1:  # folded totals: the sum over one client is its row (read-only views, no copy)
                return self._counts[0], self._sums[0]
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
            check_dense("counts", (self._K, self._C))
            pc, pk, n, _ = self._pairs
            out = np.zeros((self._K, self._C))
            out[pc, pk] = n
            object.__setattr__(self, "_counts", readonly(out))
        return self._counts

    @property
    def sums(self) -> np.ndarray:
        """Dense (K, C, d) sums (built from the pairs on first access; refused above DENSE_VIEW_LIMIT)."""
        if self._sums is None:
            check_dense("sums", (self._K, self._C, self._d))
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
        w = as_f64(weights, "weights")
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
