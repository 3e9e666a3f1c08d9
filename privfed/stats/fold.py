"""Streaming aggregation: :class:`StatsFold` folds client statistics in chunk by chunk."""

from __future__ import annotations

import numpy as np

from privfed._validation import check_num_classes, refuse_masked
from privfed.errors import InputError
from privfed.stats.algebra import add_rows_by
from privfed.stats.arrays import dense_view_limit, readonly
from privfed.stats.checks import check_upload_finite
from privfed.stats.client_stats import ClientStats

__all__ = ["StatsFold"]


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
        need = 8 * num_classes * (dim + 1)  # N_c and S_c (both modes: "pairs" folds S_c as pairs arrive)
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
        self._S = np.zeros((self.num_classes, self.dim))
        self._gram: np.ndarray | None = None
        self._cs: np.ndarray | None = None
        self._cs_values = True
        #: result() handed out _gram and _cs read-only: the next add builds new totals (copy on write)
        self._handed = False
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
        check_upload_finite(chunk, where, ids)
        if source is not None:
            self._sources.add(source)
        if ids is not None:
            self._client_ids.update(ids)
        if self._fields is None:
            self._fields = chunk.available
            self._has_owners = chunk.owners is not None
        grow = np.add if self._handed else np.ndarray.__iadd__  # a result taken keeps its snapshot
        if {"second", "class_second"} & self._fields:
            g = chunk.gram()
            self._gram = np.array(g) if self._gram is None else grow(self._gram, g)
        if "class_second" in self._fields and self.keep == "total" and self._cs_values:
            if chunk._class_second is not None:
                cs = chunk._class_second.sum(axis=0)
                self._cs = cs if self._cs is None else grow(self._cs, cs)
            else:
                self._cs_values, self._cs = False, None
        self._handed = False
        self.num_pairs += chunk.folded_pairs if chunk.folded_pairs is not None else chunk.num_pairs()
        if self.keep == "total":
            N, S = chunk.class_totals()
            self._N += N
            self._S += S
        else:
            pc, pk, n, S, rows = chunk._pair_block()
            self._count_only |= rows is not None
            # The pairs are kept (copied: an upload's buffer may be reused for the next), and S_c over the
            # pairs with a count > 0 (the ones FedCOF's drop rule keeps) folded now, the few classes of this
            # chunk while its rows are at hand: the server's step after the last upload does not read the
            # M rows again for it, and a dropped pair's sum never enters it.
            pc, pk, n, S = (np.array(a) for a in (pc, pk, n, S))
            rows = None if rows is None else np.array(rows)
            keep = n > 0 if rows is None else (n > 0) & (rows >= 0)  # count-only cells hold no sum
            if keep.all():
                add_rows_by(self._S, S, pk)
            else:
                add_rows_by(self._S, S[keep if rows is None else rows[keep]], pk[keep])
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
        # 1 and "1": one client or two?  numpy would make them one string; a fold takes one kind of id
        strings = ids.dtype.kind == "U"
        mixed = strings and not all(isinstance(i, str) for i in client_ids)  # np.str_ is a str
        before = next(iter(self._client_ids), None)  # the kind of the ids folded so far
        if mixed or (before is not None and isinstance(before, str) != strings):
            raise InputError(
                f"{where}: client_ids mix integer and string ids (1 and '1' would be one client or two); "
                f"give every client of this fold the same kind of id"
                + (
                    f" ({'string' if isinstance(before, str) else 'integer'}s, as the chunks before)"
                    if before is not None
                    else ""
                )
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
        self._handed = True
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
            out._keep_class_sums(self._S.copy())
        object.__setattr__(out, "folded_pairs", self.num_pairs)
        return out
