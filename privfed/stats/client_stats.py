"""Client statistics: the one object that flows from clients to methods (see :mod:`privfed.stats`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from privfed.errors import InputError
from privfed.stats.arrays import as_f64, readonly
from privfed.stats.layout import STAT_FIELDS, StatsLayout

__all__ = ["ClientStats"]


class ClientStats(StatsLayout):
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

    __slots__ = ()

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
        w = as_f64(weights, "weights")
        if w.shape != (self._K,):
            raise InputError(f"weights must be {self._K} values (one per client), got shape {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):  # the values, not the shape, are wrong
            bad = int(np.flatnonzero(~(np.isfinite(w) & (w >= 0)))[0])
            raise InputError(f"weights must be finite and >= 0, got {float(w[bad]):g} for client {bad}")
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
        mine, theirs = self._owners, other._owners
        if (mine is None) != (theirs is None) or (mine is not None and not np.array_equal(mine, theirs)):
            raise InputError(  # the sum kept the first operand's owners, silently
                "cannot add ClientStats whose rows have different owners (pseudo-clients of other clients)"
            )
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
        names = ({names} if isinstance(names, str) else set(names)) | {"counts", "sums"}
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
        for name, want in (("counts", (self._K, self._C)), ("sums", (self._K, self._C, self._d))):
            if name in arrays and np.shape(arrays[name]) != want:  # before the other is read alongside it
                raise InputError(f"with_arrays: {name} must have shape {want}, got {np.shape(arrays[name])}")
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
                    v = as_f64(v, name)
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
        """The statistics of a subset of rows (clients): their indices in 0..K-1, or a boolean mask of K."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (self._K,):
                raise InputError(
                    f"ClientStats.clients: a boolean mask must have shape ({self._K},), got {rows.shape}"
                )
            rows = np.flatnonzero(rows)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise InputError(
                f"ClientStats.clients takes client indices (integers in 0..{self._K - 1}) or a boolean mask, "
                f"got {rows.dtype} of shape {rows.shape}"
            )
        rows = rows.astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._K):
            raise InputError(
                f"ClientStats.clients: indices must lie in 0..{self._K - 1}, got {int(rows.min())}..{int(rows.max())}"
            )
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
