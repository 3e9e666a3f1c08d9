"""The release path: clip -> client statistics -> client noise -> (secure) sum -> server noise -> method.

Methods never see privacy.  Two optional hooks wrap the path:

``privacy`` (see :mod:`mechanisms`) provides::

    check(method, secure_agg) -> None             # refuse incompatible settings
    clip(features) -> features                    # bound each record
    before_upload(stats, method, rng) -> stats    # per-client noise (record level)
    after_aggregate(total, method, rng) -> total  # noise on the sum (client level)
    after_secure_sum(array, method, rng) -> array # optional: noise on one securely summed array
    report() -> object                            # the privacy report, computed from its ledger
    feature_transform -> callable or None         # applied to test features too

``secure_agg`` (see :mod:`mechanisms`) provides::

    secure_sum(rng) -> SecureSum                  # sums (K, ...) stacks; the server sees only the sum
    report(method, stats) -> object               # bytes, threshold, what the server saw

Either may be ``None``.  The release itself is one :class:`privfed.release.ReleasePlan`
(its stages and its trace); this module is the entry the rest of privfed calls.  The path is
split in two so that sweeps can compute (clipped) client statistics once and release them many
times: :func:`client_statistics` and :func:`server_head`.  Without privacy and
secure aggregation, :func:`run_federation` streams instead: clients are
processed in chunks of bounded memory and folded into the server's
aggregate (:func:`fold_statistics`, :class:`privfed.stats.StatsFold`), so no
(K, C, d) or (K, d, d) array is ever built; a per-client method with
``aggregate_pairs`` (FedCOF) takes its pair sums as they are summed
(:func:`pair_sum_blocks`), so not even the M x d pairs are held.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from privfed._validation import scratch_rows
from privfed.errors import InputError
from privfed.head import LinearHead
from privfed.methods.base import Method
from privfed.release import UPLOAD_CHUNK_BYTES, ReleasePlan, ReleaseTrace
from privfed.release.streaming import stream_stands_for
from privfed.stats import ClientStats, GramSum, add_rows_by, readonly, sorted_segments

__all__ = [
    "FOLD_CHUNK_BYTES",
    "FOLD_GRAM_CHUNK_BYTES",
    "FOLD_GRAM_SHARE",
    "FOLD_SHARE",
    "UPLOAD_CHUNK_BYTES",
    "client_statistics",
    "fold_statistics",
    "pair_sum_blocks",
    "run_federation",
    "server_head",
]

#: Bytes of float64 feature rows gathered (and converted, for float32 input) at once by
#: :func:`fold_statistics`: one reused buffer, small enough to stay in cache between the gather and the
#: sum (4 MiB: 0.20 s for FedCOF's pairs at iNat-120K, against 0.26 s with 8 MiB and 0.31 s with 16 MiB) ...
FOLD_CHUNK_BYTES = 4 * 2**20
#: ... and when X^T X is accumulated too, large enough for each chunk's product to run at GEMM speed
#: (16 MiB: 4.6 s for Fed3R at iNat-120K, against 6.0 s with 4 MiB).
FOLD_GRAM_CHUNK_BYTES = 16 * 2**20
#: Each is at most a share of the input's bytes (the chunk, its float32 rows and its sums take about
#: 2.5 chunks), so a small input's fit stays within input + 25 % as iNat-120K's does: the first 1/64
#: (4 MiB from a 256 MiB input up), the second 1/32 (16 MiB from 512 MiB up).
FOLD_SHARE = 1 / 64
FOLD_GRAM_SHARE = 1 / 32


def client_statistics(
    method: Method,
    features: np.ndarray,
    labels: np.ndarray,
    clients: np.ndarray,
    *,
    num_classes: int,
    num_clients: int,
    rng: np.random.Generator,
    privacy: Any = None,
    secure_agg: Any = None,
) -> ClientStats:
    """What the clients compute before any noise: (clipped) statistics, per client."""
    return ReleasePlan(method, privacy, secure_agg).client_statistics(
        features, labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng
    )


def fold_statistics(
    method: Method,
    features: np.ndarray,
    labels: np.ndarray,
    clients: np.ndarray,
    *,
    num_classes: int,
    num_clients: int,
    rng: np.random.Generator,
    keep: str | None = None,
    chunk_bytes: int | None = None,
) -> ClientStats:
    """The clients' statistics folded into what the server keeps (as :class:`~privfed.stats.StatsFold` gives).

    ``keep="pairs"`` (per-client methods) keeps the M (pseudo-)client-class
    pairs, ``"total"`` only the class totals and the summed second moment.
    One stable sort of the sample keys ((pseudo-)client, class for pairs;
    class for totals) lines the rows up by output row; the rows are then
    taken in sorted order a chunk at a time (at most ``chunk_bytes`` of
    float64 rows, default :data:`FOLD_CHUNK_BYTES`, or :data:`FOLD_GRAM_CHUNK_BYTES` with a second
    moment, each cut to its share of the input's bytes), gathered and converted
    into one reused float64 buffer (float32 input is accumulated in float64
    without an N x d float64 copy), summed into their output rows with one
    sparse-dense product and, when a second moment is needed, added into
    X^T X.  The outputs are written in place: memory O(M d + d^2) for
    ``"pairs"``, O(C d + d^2) for ``"total"``, plus one chunk; no per-chunk
    statistics are stacked and concatenated.  A pair cut by a chunk boundary
    is summed in two parts (identical up to rounding).
    """
    keep = keep or ("pairs" if method.per_client else "total")
    F, y, k = features, np.asarray(labels, dtype=np.int64), np.asarray(clients, dtype=np.int64)
    C, d = int(num_classes), F.shape[1]
    if y.size and (y.min() < 0 or y.max() >= C):
        raise InputError(
            f"labels must lie in 0..{C - 1} (num_classes={C}); got {int(y.min())}..{int(y.max())}"
        )
    groups, owners = method.row_groups(y, k, num_classes=C, num_clients=num_clients, rng=rng)
    groups = np.asarray(groups, dtype=np.int64)
    G = num_clients if owners is None else owners.size
    second = bool({"second", "class_second"} & set(method.requires))
    fields = {"counts", "sums"} | (set(method.requires) & {"second", "class_second"})
    pair_key = groups * C + y
    key = pair_key if keep == "pairs" else y
    order, out_key, indptr = sorted_segments(key)
    S = np.empty((out_key.size, d))  # every row is written below
    gram = GramSum(d) if second else None
    # keep="pairs": the class sums are folded too (every pair here counts >= 1 sample, so FedCOF's drop rule
    # keeps them all), a chunk's few classes at a time while its pair sums are at hand (as a server adds each
    # upload), so the server's step does not read the M rows again for them
    Sc = np.zeros((C, d)) if keep == "pairs" else None
    step = _chunk_rows(F, second, chunk_bytes)
    for r0, X, t0, t1, part in _segment_chunks(F, order, indptr, step):
        if indptr[t0] < r0:  # the row the previous chunk began
            S[t0] += part[0]
            S[t0 + 1 : t1] = part[1:]
        else:
            S[t0:t1] = part
        if Sc is not None:
            add_rows_by(Sc, part, out_key[t0:t1] % C)
        if second:
            gram.add(X)
    counts = np.diff(indptr).astype(np.float64)
    gram = None if gram is None else readonly(gram.result())
    if keep == "pairs":
        pairs = tuple(readonly(a) for a in (out_key // C, out_key % C, counts, S))
        out = ClientStats._new(G, C, d, pairs=pairs, gram=gram, fields=fields, owners=owners)
        out._keep_class_sums(Sc)
        object.__setattr__(out, "folded_pairs", int(out_key.size))
        return out
    Nc, Sc = np.zeros(C), np.zeros((C, d))
    Nc[out_key], Sc[out_key] = counts, S
    kw = {"second": gram[None]} if "second" in fields else {}
    out = ClientStats._new(
        1, C, d, counts=readonly(Nc[None]), sums=readonly(Sc[None]), gram=gram, fields=fields, **kw
    )
    object.__setattr__(out, "folded_pairs", int(np.unique(pair_key).size))
    return out


def _chunk_rows(F: np.ndarray, second: bool, chunk_bytes: int | None) -> int:
    """Rows of float64 gathered at once: ``chunk_bytes`` when given, else sized from the input."""
    row = 8 * max(F.shape[1], 1)
    if chunk_bytes:
        return max(1, int(chunk_bytes) // row)
    if second:
        return scratch_rows(F.nbytes, row, FOLD_GRAM_CHUNK_BYTES, FOLD_GRAM_SHARE)
    return scratch_rows(F.nbytes, row, FOLD_CHUNK_BYTES, FOLD_SHARE)


def _segment_chunks(F: np.ndarray, order: np.ndarray, indptr: np.ndarray, step: int):
    """The rows of ``F`` in ``order``, ``step`` at a time, summed by the segments ``indptr`` cuts them into.

    Yields ``(r0, X, t0, t1, part)``: the chunk's first sorted row r0, its rows gathered (and converted
    to float64) into one reused buffer ``X``, and the sums ``part`` of segments t0..t1-1 over the
    chunk's rows (a segment cut by a chunk boundary is summed in parts, one per chunk).  ``X`` and
    ``part`` are valid until the next chunk.
    """
    N, d = order.size, F.shape[1]
    buf = np.empty((min(step, N), d))
    raw = None if F.dtype == np.float64 else np.empty((min(step, N), d), dtype=F.dtype)
    for r0 in range(0, N, step):
        r1 = min(r0 + step, N)
        n = r1 - r0
        X = buf[:n]
        if raw is None:
            np.take(F, order[r0:r1], axis=0, out=X)
        else:
            np.take(F, order[r0:r1], axis=0, out=raw[:n])
            X[...] = raw[:n]
        t0 = int(np.searchsorted(indptr, r0, side="right")) - 1
        t1 = int(np.searchsorted(indptr, r1, side="left"))
        local = np.clip(indptr[t0 : t1 + 1], r0, r1) - r0
        yield r0, X, t0, t1, sp.csr_matrix((np.ones(n), np.arange(n), local), shape=(t1 - t0, n)) @ X


def pair_sum_blocks(
    method: Method,
    features: np.ndarray,
    labels: np.ndarray,
    clients: np.ndarray,
    *,
    num_classes: int,
    num_clients: int,
    rng: np.random.Generator,
    chunk_bytes: int | None = None,
):
    """The (pseudo-)client-class pairs of :func:`fold_statistics` without holding their M x d sums.

    Returns ``(pair_class, pair_counts, blocks)``: the class and count of
    every pair (in the order of :func:`fold_statistics`'s ``"pairs"``), and a
    generator of ``(p0, sums)``, the float64 sums of whole pairs p0..p0 +
    len(sums) - 1 (a pair cut by a chunk boundary is finished before it is
    given out).  Rows are gathered and converted a chunk of ``chunk_bytes``
    (default :data:`FOLD_CHUNK_BYTES`, cut to :data:`FOLD_SHARE` of the input) at a time into one
    reused buffer, as
    in :func:`fold_statistics`; each block lives until the next is made.
    """
    F, y, k = features, np.asarray(labels, dtype=np.int64), np.asarray(clients, dtype=np.int64)
    C = int(num_classes)
    groups, _ = method.row_groups(y, k, num_classes=C, num_clients=num_clients, rng=rng)
    order, out_key, indptr = sorted_segments(np.asarray(groups, dtype=np.int64) * C + y)
    counts = np.diff(indptr).astype(np.float64)
    step = _chunk_rows(F, False, chunk_bytes)

    def blocks():
        carry, done = None, 0  # the partial sum of a pair the previous chunk cut
        for r0, X, _t0, t1, part in _segment_chunks(F, order, indptr, step):
            r1 = r0 + X.shape[0]
            if carry is not None:
                part[0] += carry
            cut = indptr[t1] > r1  # the last pair goes on in the next chunk
            carry = part[-1].copy() if cut else None
            whole = part[:-1] if cut else part
            if whole.shape[0]:
                yield done, whole
                done += whole.shape[0]

    return out_key % C, counts, blocks()


def server_head(
    method: Method,
    stats: ClientStats,
    *,
    num_clients: int,
    rng: np.random.Generator,
    privacy: Any = None,
    secure_agg: Any = None,
    seeded: bool = True,
    keep_uploads: bool = False,
) -> LinearHead:
    """Noise, aggregate and fit: everything after the clients computed ``stats``.

    Runs the release's :class:`~privfed.release.ReleasePlan` (the one implementation of the release);
    the head carries its :class:`~privfed.release.ReleaseTrace` as ``head.trace``.  When every client
    noises its own upload and the method needs only their sum, or a per-client method has a streamed
    server (FedCOF), the plan folds the noisy uploads a chunk of clients at a time: memory independent
    of K, never a (K, C, d) stack.
    """
    plan = ReleasePlan(method, privacy, secure_agg)
    return plan.release(stats, num_clients=num_clients, rng=rng, seeded=seeded, keep_uploads=keep_uploads)


def run_federation(
    method: Method,
    features: np.ndarray,
    labels: np.ndarray,
    clients: np.ndarray,
    *,
    num_classes: int,
    num_clients: int,
    rng: np.random.Generator,
    privacy: Any = None,
    secure_agg: Any = None,
    seeded: bool = True,
) -> LinearHead:
    """Run one federated aggregation on validated inputs and return the head (with ``head.trace``)."""
    if privacy is None and secure_agg is None and _folds_pairs(method):
        # the server folds the pairs as they are summed: their M x d sums are never all held
        pair_class, counts, blocks = pair_sum_blocks(
            method, features, labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng
        )
        head = method.aggregate_pairs(pair_class, counts, blocks, num_classes)
        total = method.upload_bytes(M=counts.size, K=num_clients, d=features.shape[1], C=num_classes)
        head.upload_bytes = {
            "total": total,
            "per_client": total / max(num_clients, 1),
            "M": int(counts.size),
            "K": num_clients,
        }
        head.trace = _plain_trace(
            method,
            head,
            None,
            "each (client, class) pair's sums folded into the server's "
            "estimate as they are summed (no privacy, no protection)",
        )
        return head
    if privacy is None and secure_agg is None:
        folded = fold_statistics(
            method, features, labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng
        )
        head = method.aggregate(folded)
        head.upload_bytes = method.communication(folded, num_clients)
        head.trace = _plain_trace(
            method,
            head,
            folded,
            "clients' statistics folded into the server's aggregate "
            "as they arrive (no privacy, no protection)",
        )
        return head
    plan = ReleasePlan(method, privacy, secure_agg)
    return plan.run(
        features, labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng, seeded=seeded
    )


def _plain_trace(method: Method, head: LinearHead, folded: ClientStats | None, detail: str) -> ReleaseTrace:
    """The trace of a release without privacy or protection: the server received every statistic exactly."""
    trace = ReleaseTrace(method.name)
    trace.record(
        "statistics", f"{method.name}: {detail}", clients_out=None if folded is None else folded.num_clients
    )
    if folded is not None:
        trace.received("sum" if not method.per_client else "uploads", stats=folded)
    trace.record("method", f"{method.name}: head from the folded statistics")
    trace.record("report", "no privacy mechanism: NO DP GUARANTEE", values={"bytes": dict(head.upload_bytes)})
    return trace


#: The method hooks its pair stream (``aggregate_pairs``) stands for.
PAIR_STREAM_HOOKS = ("aggregate", "estimate", "row_groups", "aggregate_pairs", "estimate_pairs")


def _folds_pairs(method: Method) -> bool:
    """Whether ``method`` takes its pairs as a stream (``aggregate_pairs``) that agrees with its ``aggregate``.

    Only when the class defining ``aggregate_pairs`` also defines the ``aggregate``, ``estimate`` and
    ``row_groups`` in use: a subclass that replaced one of them keeps the one-call path.
    """
    return bool(method.per_client) and stream_stands_for(method, "aggregate_pairs", PAIR_STREAM_HOOKS)
