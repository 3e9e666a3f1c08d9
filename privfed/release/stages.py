"""The stages of a release: small objects with one method, each writing its record into the trace.

A stage's :meth:`Stage.apply` reads and writes a :class:`ReleaseState`
(the statistics, the uploads, the sum, the head) and records what it did in
the state's :class:`~privfed.release.trace.ReleaseTrace`.  Which stages a
release runs, in which order, is decided once by
:class:`~privfed.release.plan.ReleasePlan` from the method, the privacy
mechanism and the protection; the stages themselves never look at classes.

The privacy mechanism is reached through its hook protocol only
(``before_upload``, ``after_aggregate``, ``after_secure_sum``,
``fold_local_upload``, ``local_upload_stream``, ``sent_pairs``, ``report``;
see :mod:`mechanisms`), and the protection through ``secure_sum`` and
``report``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privfed._validation import check_memory
from privfed.errors import InputError
from privfed.head import LinearHead
from privfed.methods.base import Method
from privfed.release.trace import ReleaseTrace
from privfed.stats import ClientStats, StatsFold, dense_view_limit

__all__ = [
    "UPLOAD_CHUNK_BYTES",
    "Aggregate",
    "CentralNoise",
    "ClientRelease",
    "Finish",
    "PerClientAggregate",
    "PlainSum",
    "ReleaseState",
    "SecureSum",
    "Stage",
    "StreamedLocalPairs",
    "StreamedLocalSum",
    "SQUARE_COPIES",
    "check_release_memory",
    "check_secure_size",
]

#: Bytes of dense noisy uploads produced at once when clients noise their own uploads (streamed release).
UPLOAD_CHUNK_BYTES = 16 * 2**20  # under glibc's 32 MiB mmap ceiling: freed chunks are reused, not re-faulted


@dataclass
class ReleaseState:
    """What flows between the stages of one release."""

    method: Method
    stats: ClientStats
    num_clients: int
    rng: np.random.Generator
    trace: ReleaseTrace
    privacy: Any = None
    secure_agg: Any = None
    randomness: str = "none"  # where noise and sampling come from: "seeded" or "os-entropy"
    keep_uploads: bool = False
    uploaded: ClientStats | None = None  # the clients' uploads, where the release holds them all at once
    total: ClientStats | None = None
    head: LinearHead | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def events_since(self, start: int) -> tuple[dict, ...]:
        ledger = getattr(self.privacy, "ledger", None)
        if ledger is None:
            return ()
        return tuple(_event(e) for e in ledger.events[start:])

    def ledger_size(self) -> int:
        ledger = getattr(self.privacy, "ledger", None)
        return 0 if ledger is None else len(ledger.events)


def _event(e) -> dict:
    from dataclasses import asdict, is_dataclass

    return asdict(e) if is_dataclass(e) else dict(e)


class Stage:
    """One step of a release.  ``streamed`` stages never hold every client's upload at once."""

    name = "stage"
    streamed = False

    def apply(self, st: ReleaseState) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def _sigma(privacy) -> dict:
    try:
        sig = getattr(privacy, "sigma", None)
    except Exception:  # noqa: BLE001 - sigma may be unknown until d is (coordinate clipping)
        return {}
    return {k: float(v) for k, v in sig.items()} if isinstance(sig, dict) else {}


class ClientRelease(Stage):
    """Each client bounds, samples or noises its own upload (the mechanism's ``before_upload``)."""

    name = "client-release"

    def apply(self, st: ReleaseState) -> None:
        n0 = st.ledger_size()
        st.uploaded = st.privacy.before_upload(st.stats, st.method, st.rng)
        booked = st.events_since(n0)
        st.trace.record(
            self.name,
            f"{type(st.privacy).__name__}.before_upload: each client's upload bounded and noised as the "
            "mechanism's level and placement say"
            if booked
            else f"{type(st.privacy).__name__}.before_upload: uploads bounded (noise, if any, is added after the sum)",
            clients_in=st.stats.num_clients,
            clients_out=st.uploaded.num_clients,
            randomness=st.randomness if booked else "none",
            values={"sigma": _sigma(st.privacy)},
        )


class StreamedLocalSum(Stage):
    """Every client noises its own upload; the server folds the noisy uploads a chunk of clients at a time."""

    name = "client-release"
    streamed = True

    def apply(self, st: ReleaseState) -> None:
        parts: dict[str, list[np.ndarray]] = {}
        kw = {}
        if st.keep_uploads:

            def observe(block, k0, k1, values):
                parts.setdefault(block, []).append(np.array(values))

            kw["observe"] = observe
        st.total = st.privacy.fold_local_upload(
            st.stats, st.method, st.rng, chunk_bytes=UPLOAD_CHUNK_BYTES, **kw
        )
        if st.keep_uploads:
            st.trace.received("uploads", stats=_dense_uploads(parts, st.stats))
        else:
            st.trace.received("not-kept")
        st.trace.record(
            self.name,
            "each client noised its own upload (local DP); uploads folded into their sum "
            f"{UPLOAD_CHUNK_BYTES // 2**20} MiB of clients at a time (streamed)",
            clients_in=st.stats.num_clients,
            clients_out=1,
            randomness=st.randomness,
            values={"sigma": _sigma(st.privacy), "streamed": True},
        )


class StreamedLocalPairs(Stage):
    """Every client noises its own upload; a per-client method's server folds the noisy sums as they come."""

    name = "client-release"
    streamed = True

    def apply(self, st: ReleaseState) -> None:
        counts, chunks = st.privacy.local_upload_stream(st.stats, st.rng, chunk_bytes=UPLOAD_CHUNK_BYTES)
        if st.keep_uploads:
            kept: list[np.ndarray] = []

            def recording():
                for k0, k1, values in chunks:
                    kept.append(np.array(values))
                    yield k0, k1, values

            st.head = st.method.aggregate_stream(counts, recording())
            st.trace.received("uploads", stats=_dense_uploads({"counts": [counts], "sums": kept}, st.stats))
        else:
            st.head = st.method.aggregate_stream(counts, chunks)
            st.trace.received("not-kept")
        st.trace.record(
            self.name,
            "each client noised its own upload (local DP); the server took every noisy count, then "
            "folded the noisy sums a chunk of clients at a time (streamed)",
            clients_in=st.stats.num_clients,
            clients_out=st.stats.num_clients,
            randomness=st.randomness,
            values={"sigma": _sigma(st.privacy), "streamed": True},
        )
        st.trace.record(
            "method", f"{st.method.name}: head from the streamed uploads", clients_in=st.stats.num_clients
        )


def _dense_uploads(parts: dict, stats: ClientStats) -> ClientStats:
    arrays = {block: np.concatenate(values) for block, values in parts.items()}
    return ClientStats(
        counts=arrays["counts"], sums=arrays["sums"], second=arrays.get("second"), owners=stats.owners
    )


def check_secure_size(method: Method, stats: ClientStats) -> None:
    """Refuse, naming the sizes and the way out, a secure aggregation too large for one process.

    Under secure aggregation every client masks its whole upload: all C classes (zeros included, so
    the masks hide which classes it holds), and a d x d matrix where the method sums one per client
    (second moments; FedCOF's second round).  In one process those are (K, ...) stacks.
    """
    K, C, d = stats.num_clients, stats.num_classes, stats.dim
    square = "second" in method.requires or method.per_client
    per_client = C * d + 2 * C + (d * d if square else 0)
    need = 8 * K * per_client
    limit = dense_view_limit()  # a malformed $PRIVFED_DENSE_VIEW_LIMIT is refused here as everywhere
    if need > limit:
        raise InputError(
            f"secure aggregation in one process masks every client's whole upload: {K:,} clients x "
            f"{per_client:,} values (all C = {C:,} classes, zeros included, so the masks hide which classes a "
            f"client holds{', and a d x d matrix each' if square else ''}) need {need / 2**30:.3g} GiB, over "
            f"privfed.stats.DENSE_VIEW_LIMIT ({limit / 2**30:.3g} GiB); run it across "
            "processes with the Flower app (python -m privfed.flower), where each node masks only its own "
            "upload, or raise privfed.stats.DENSE_VIEW_LIMIT"
        )


#: d x d matrices a second-moment method's server holds at once (the sum, its regularised copy, a
#: factor and a solver's workspace): the estimate :func:`check_release_memory` makes for d x d statistics.
SQUARE_COPIES = 4


def check_release_memory(m: Method, d: int, C: int, K: int, *, dense_uploads: bool = False) -> None:
    """Refuse, before any work, a release whose largest arrays cannot fit in the memory available.

    The estimate counts what grows fastest: the d x d matrices the method's server holds at once
    (its ``server_squares``, else :data:`SQUARE_COPIES` for a method that sums second moments, and
    C more for per-class ones), and with ``dense_uploads`` (every client's upload of every class
    held at once: under privacy unless the release is streamed, and under secure aggregation) the
    (K, C, d + 1) uploads and their noisy copy.  The limit is :func:`privfed._validation.check_memory`'s.
    """
    squares = getattr(m, "server_squares", None)
    if squares is None:
        squares = SQUARE_COPIES if {"second", "class_second"} & m.requires else 0
    squares += C if "class_second" in m.requires else 0  # the per-class totals besides
    if squares:
        check_memory(
            8.0 * d * d * squares,
            f"method {m.name!r} with d={d:,} features ({squares} d x d matrices of {8.0 * d * d / 2**30:.3g} "
            "GiB at once)",
            "reduce the feature dimension (e.g. PCA to a few thousand) or use a method without d x d "
            "statistics (fedncm, fedlog)",
        )
    if dense_uploads:
        check_memory(
            2 * 8.0 * K * C * (d + 1),
            f"num_clients={K:,} x num_classes={C:,} x (d + 1)={d + 1:,} uploads held at once (every client "
            "sends every class) and their noisy copy",
            "pass the number of clients and classes the release really has, or add the noise locally at "
            "record level (the uploads are then folded a chunk of clients at a time)",
        )


#: A fixed-point secure sum's rounding above this share of its typical summed value is noted on the head.
ROUNDING_NOTE_SHARE = 1e-6


def rounding_note(total: np.ndarray, call: dict, number: int) -> list[str]:
    """A note when a secure sum's rounding exceeds :data:`ROUNDING_NOTE_SHARE` of the median nonzero |value|
    of the sum the server received (read from that output alone): masking's fixed point (each of the
    ``call["uploaded"]`` uploaders rounds each value to 2^-f: at most uploaders x 2^-(f+1) per summed value),
    or CKKS's release grid (the decrypted sum rounded to 2^-p: 2^-(p+1), plus the decryption error the grid is
    kept 2^-3 above); none for a sum the call says was not rounded."""
    values = np.abs(np.asarray(total, dtype=np.float64)).ravel()
    values = values[np.isfinite(values) & (values > 0)]
    if call.get("release_bits") is not None:
        from mechanisms.secagg.ckks.scheme import GRID_MARGIN_BITS

        # half the grid from the rounding, plus the decryption error the grid is kept GRID_MARGIN_BITS above
        p = int(call["release_bits"])
        bound = 2.0 ** -(p + 1) + 2.0 ** -(p + GRID_MARGIN_BITS)
        head = f"secure sum {number}: CKKS releases the sum on the 2^-{p} grid, which moves each value"
        by = "by up to about"  # the decryption error's bound is an estimate (CKKSParams.max_precision_bits)
        fix = "scale the features up by a public constant, or release on a finer grid (CKKSParams precision_bits)"
    elif "frac_bits" in call:
        f, K = int(call["frac_bits"]), int(call.get("uploaded", 1))
        bound = K * 2.0 ** -(f + 1)
        head = f"secure sum {number}: fixed-point rounding (f = {f} fractional bits, {K} uploaders) moves each value"
        by = "by up to"
        fix = "scale the features up by a public constant, or raise frac_bits"
    else:  # a sum released without rounding (CKKS's integers, or a protocol with no grid)
        return []
    if values.size == 0:  # every value rounded away, or the statistics are zero
        return [f"{head} {by} {bound:.3g} and every summed value is 0: statistics below that are lost; {fix}"]
    typical = float(np.median(values))
    if bound <= ROUNDING_NOTE_SHARE * typical:
        return []
    return [
        f"{head} {by} {bound:.3g}, {bound / typical:.3g} x the sum's median |value| {typical:.3g}: the head "
        f"loses what the statistics hold below that; {fix}"
    ]


class SecureSum(Stage):
    """The server learns only sums, through the protection's protocol (noise on each sum, if any)."""

    name = "secure-sum"

    def apply(self, st: ReleaseState) -> None:
        check_secure_size(st.method, st.stats)
        uploaded = st.uploaded if st.uploaded is not None else st.stats
        check_clients = getattr(st.secure_agg, "check_clients", None)
        if check_clients is not None:  # a protocol that cannot sum K inputs says so before its first sum
            check_clients(int(uploaded.num_clients))
        run = st.secure_agg.secure_sum(st.rng)
        after = getattr(st.privacy, "after_secure_sum", None) if st.privacy is not None else None
        trace = st.trace

        coarse: list[str] = []

        def summed(stack):
            total = run(stack)
            if after is not None:
                total = after(total, st.method, st.rng)
            trace.add_sum_output(total)
            calls = getattr(run, "calls", [])
            if calls and not calls[-1].get("exact"):
                coarse.extend(rounding_note(total, calls[-1], len(calls)))
            return total

        st.head = st.method.secure_aggregate(uploaded, summed)
        st.head.notes.extend(coarse)
        if trace.server_view().kind != "secure-sums":
            trace.received("secure-sums")
        calls = getattr(run, "calls", [])
        keyed = getattr(st.secure_agg, "key_seed", None) is not None or getattr(
            getattr(st.secure_agg, "keys", None), "seeded", False
        )
        trace.record(
            self.name,
            f"{getattr(st.secure_agg, 'name', type(st.secure_agg).__name__)}: {len(calls)} secure sum(s); "
            "the server saw only their outputs",
            clients_in=uploaded.num_clients,
            clients_out=min(
                (int(c.get("uploaded", uploaded.num_clients)) for c in calls), default=uploaded.num_clients
            ),
            randomness="seeded" if keyed or st.randomness == "seeded" else "os-entropy",
            values={
                "calls": len(calls),
                "dropped_before_upload": sorted(
                    {int(u) for c in calls for u in c.get("dropped_before_upload", ())}
                ),
            },
        )
        trace.record(
            "method", f"{st.method.name}: head from the secure sums", clients_in=uploaded.num_clients
        )


class PerClientAggregate(Stage):
    """A per-client method's server reads every client's upload."""

    name = "method"

    def apply(self, st: ReleaseState) -> None:
        uploaded = st.uploaded if st.uploaded is not None else st.stats
        st.trace.received("uploads", stats=uploaded)
        st.head = st.method.aggregate(uploaded)
        st.trace.record(
            self.name, f"{st.method.name}: head from every client's upload", clients_in=uploaded.num_clients
        )


class PlainSum(Stage):
    """The server sums the uploads (the statistics the method requires)."""

    name = "sum"

    def apply(self, st: ReleaseState) -> None:
        uploaded = st.uploaded if st.uploaded is not None else st.stats
        st.trace.received("uploads", stats=uploaded)
        st.total = (
            StatsFold(num_classes=uploaded.num_classes, dim=uploaded.dim)
            .add(uploaded.select(st.method.requires))
            .result()
        )
        st.trace.record(
            self.name,
            f"the server summed {uploaded.num_clients} uploads",
            clients_in=uploaded.num_clients,
            clients_out=1,
        )


class CentralNoise(Stage):
    """Noise on the sum where the mechanism places it there (a trusted aggregator)."""

    name = "central-noise"

    def apply(self, st: ReleaseState) -> None:
        n0 = st.ledger_size()
        out = st.privacy.after_aggregate(st.total, st.method, st.rng)
        booked = st.events_since(n0)
        if out is not st.total and booked:
            st.trace.released(out)
            st.trace.record(
                self.name,
                "a trusted aggregator added the noise to the sum (central DP)",
                clients_in=1,
                clients_out=1,
                randomness=st.randomness,
                values={"sigma": _sigma(st.privacy)},
            )
        st.total = out


class Aggregate(Stage):
    """The method's head from the sum."""

    name = "method"

    def apply(self, st: ReleaseState) -> None:
        st.head = st.method.aggregate(st.total)
        st.trace.record(self.name, f"{st.method.name}: head from the sum", clients_in=1)


class Finish(Stage):
    """Bytes, the privacy and secure-aggregation reports, and the notes they imply, set on the head."""

    name = "report"

    def __init__(self, ledger_start: int = 0) -> None:
        self.ledger_start = ledger_start

    def apply(self, st: ReleaseState) -> None:
        head, privacy, secure_agg = st.head, st.privacy, st.secure_agg
        if privacy is None:
            head.upload_bytes = st.method.communication(st.stats, st.num_clients)
        else:
            head.upload_bytes = sent_communication(st.method, privacy, st.stats, st.uploaded, st.num_clients)
            head.privacy = privacy.report()
            head.feature_transform = getattr(privacy, "feature_transform", None)
        if secure_agg is not None:
            head.secure_aggregation = secure_agg.report(st.method, st.stats)
            head.notes.extend(whose_data(head.secure_aggregation))
        rep = head.privacy
        st.trace.record(
            self.name,
            getattr(rep, "guarantee", "no privacy mechanism: NO DP GUARANTEE"),
            values={
                "bytes": {k: v for k, v in head.upload_bytes.items()},
                "epsilon": getattr(rep, "epsilon", None),
                "delta": getattr(rep, "delta", None),
            },
            events=st.events_since(self.ledger_start),  # after report(): settled with the shares present
        )
        head.trace = st.trace


def sent_communication(
    method: Method, privacy: Any, stats: ClientStats, uploaded: ClientStats | None, num_clients: int
) -> dict:
    """Upload accounting under privacy: from what is sent, never from the raw statistics.

    The mechanism says how many (client, class) pairs go out (under DP every client sends every class,
    zeros included and noised), so the bytes are a function of the release and public parameters.
    """
    sent = getattr(privacy, "sent_pairs", None)
    M = int(sent(stats, uploaded)) if sent is not None else stats.num_clients * stats.num_classes
    total = method.upload_bytes(M=M, K=num_clients, d=stats.dim, C=stats.num_classes)
    return {"total": total, "per_client": total / max(num_clients, 1), "M": M, "K": num_clients}


def whose_data(report: Any) -> list[str]:
    """A head's note on which clients' data it holds when some dropped before uploading."""
    calls = getattr(report, "calls", None) or []
    gone = sorted({u for c in calls for u in c.get("dropped_before_upload", ())})
    if not gone:
        return []
    K = max(int(c.get("clients", 0)) for c in calls)
    return [
        f"holds the data of {K - len(gone)} of {K} clients: client(s) {gone[:20]} dropped before uploading "
        "and are not in the sums"
    ]
