"""Benchmark: the active masking protocol at 1,000 nodes over Flower messages, against its cryptographic floor.

The protocol the Flower app runs (the active-adversary version: signed keys checked against the roster,
the consistency round, echoes) on the SecAgg+ graph the operator draws into the roster (``--degree`` k,
the roster's threshold t), ``--nodes`` N nodes of ``--values`` D floats each.  The server,
:class:`mechanisms.secagg.masking.server.MaskingServer`, runs in this process; the N nodes run in a
second process, each answering through :func:`privfed.flower.secagg.node_step` (the ClientApp's handler:
its own ``flwr.app.Context``, its state machine kept between its messages, its state record and ledger
written after each), one message at a time; every request and reply is a Flower ``RecordDict``
serialised to its protobuf bytes and back.  The plain run of the same statistics sends each node a query
and gets its float64 vector as an ArrayRecord; the server folds each reply as it arrives in both.  A stage's
requests are serialised before they are pushed (as the app's transport builds a stage's messages before
pushing them, :func:`privfed.flower.transport.exchange`).

**The floor** (:mod:`experiments.crypto_floor`): the plain run's CPU seconds plus the signatures,
verifies, X25519 agreements and key loads, and the mask keystream the protocol makes, each counted at
the protocol's call sites (both processes) and timed alone with ``cryptography`` in the node process
within the same repeat.  The counts come from two untimed runs of the same configuration, one before the
timed repeats and one after, which must agree (a run without dropouts makes the same operations every
time): the counting wrappers cost CPU at every call (a few per cent of the masked run), so no timed run
is a counted one.  ``ratio`` = masked CPU / floor, CPU seconds of both
processes (the work done, unchanged when other programs share the cores).  ``ratio_to_protocol_work`` =
masked CPU / the protocol work (:func:`experiments.crypto_floor.work_seconds`: the floor plus its AES-GCM,
HKDF, Shamir sharing and recovery, mask additions and fixed-point encoding, counted and timed the same way):
what is left over it is Python and the message handling.  The parts of each repeat run
back to back in the same two processes (plain, masked, the unit timings; the order alternates between
repeats), the machine's load average is recorded beside each, and ``--runs`` whole runs (fresh
processes) are recorded so that a ratio can be checked against an independent run.

**Memory**: the server's traced peak (tracemalloc: Python and numpy allocations of its process) of a
masked run at every N of ``--memory-nodes``, at D and at ``--memory-values``; the slope per added node
at each D is what the server keeps per node (keys, relayed share messages, signatures, unmasking
shares, and a stage's serialised requests until its last reply), and is the same at both D: each upload
is added to the total as it arrives.

``--record`` writes ``experiments/results/bench_active_scale.json`` (its claims and the docs' quote of it:
``tests/mechanisms/test_active_scale.py``).  Run: ``python experiments/bench_active_scale.py [--nodes 1000]
[--values 51200] [--degree 20] [--memory-nodes 250,500,1000] [--memory-values 5120] [--repeats 3] [--runs 2]
[--record]``
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from experiments.crypto_floor import OPS, WORK_OPS, counting, floor_seconds, spread, work_seconds  # noqa: E402
from experiments.flag_types import count, even_degree, int_list, seed  # noqa: E402
from mechanisms.secagg.identity import make_roster  # noqa: E402
from mechanisms.secagg.masking import harary_split_bound  # noqa: E402

#: The target the record is checked against (tests/mechanisms/test_active_scale.py).
TARGET_RATIO = 1.3
#: Two runs' median ratios must agree within this share.
REPRODUCE = 0.10
FRAC_BITS = 32


def _row(seed: int, u: int, D: int) -> np.ndarray:
    """Node u's statistic (made where the node runs, never sent to the server in the masked run)."""
    return np.random.default_rng([seed, u]).normal(size=D)


def _pack(rec) -> bytes:
    from flwr.common.serde import recorddict_to_proto

    return recorddict_to_proto(rec).SerializeToString()


def _unpack(raw: bytes):
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    return recorddict_from_proto(ProtoRecordDict.FromString(raw))


#: glibc's heap settings in both processes (mallopt): the heap's top is not returned to the system below
#: this many free bytes, and blocks this large or smaller come from the heap, not from mmap.
HEAP_TRIM_BYTES = 64 << 20
HEAP_MMAP_BYTES = 32 << 20


def steady_heap() -> bool:
    """Keep this process's heap from shrinking and growing under every upload (glibc's ``mallopt``; False
    without glibc): with glibc's defaults, whether freeing an upload's buffers returns the heap's top to the
    system (the next upload then faults its pages back in) depends on where the heap's other objects lie,
    which differs between the plain and the masked run.  Both runs are measured with the same settings."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        trim, mmap = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (malloc.h)
        return libc.mallopt(trim, HEAP_TRIM_BYTES) == 1 and libc.mallopt(mmap, HEAP_MMAP_BYTES) == 1
    except (OSError, AttributeError):
        return False


# --------------------------------------------------------------------------- the node process
def _nodes(requests, replies, roster_json: str, secrets: list[bytes], D: int, seed: int) -> None:
    """All nodes, one message at a time in the order they arrive, through the ClientApp's handler (each its
    own Context); ``requests`` and ``replies`` are the two one-way pipes to the server."""
    import signal

    from flwr.app import Context, RecordDict

    from experiments.crypto_floor import counting, unit_seconds, work_unit_seconds
    from mechanisms.secagg import fixed_point
    from mechanisms.secagg.identity import Identity, Roster
    from privfed.flower.secagg import node_step
    from privfed.flower.wire import arrays_record

    # Ctrl-C reaches the whole process group: the server process decides (it stops this one), so a stop
    # prints its one line there and no traceback here
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    steady_heap()
    roster = Roster.from_json(roster_json)
    ids = [Identity(i, sk) for i, sk in enumerate(secrets)]
    contexts: list = []
    aggregation = b""
    # the protocol's call sites are counted only between a "count" request with u = 1 and one with u = 0 (the
    # counts its reply): the counting wrappers cost CPU, so a timed run is never a counted one
    counted, counts = contextlib.ExitStack(), {}
    with counted:
        try:
            while True:
                raw = requests.recv_bytes()
                if not raw:
                    return
                kind, u, raw = _KINDS[raw[0]], int.from_bytes(raw[1:5], "little"), raw[5:]
                if kind == "cpu":
                    replies.send(time.process_time())
                    continue
                if kind == "count":
                    if u:
                        counts = counted.enter_context(counting())
                        replies.send(True)
                    else:
                        counted.close()
                        replies.send(dict(counts))
                    continue
                if kind == "units":
                    units = work_unit_seconds(
                        values=D, threshold=roster.threshold, group=len(roster.graph[0]) + 1
                    )
                    replies.send({**unit_seconds(values=D), **units})
                    continue
                if kind == "session":  # fresh contexts and aggregation id: one masked sum
                    contexts = [
                        Context(run_id=u, node_id=v, node_config={}, state=RecordDict(), run_config={})
                        for v in range(roster.size)
                    ]
                    aggregation = os.urandom(32)
                    replies.send(True)
                    continue
                if kind == "plain":
                    out = RecordDict({"stats": arrays_record({"sums": _row(seed, u, D)})})
                else:
                    out = node_step(
                        _unpack(raw),
                        contexts[u],
                        ids[u],
                        roster,
                        ring_input=lambda u=u: fixed_point.encode(_row(seed, u, D), FRAC_BITS),
                        context_digest=b"the run config, round and broadcast",
                        aggregation=aggregation,
                    )
                replies.send_bytes(_pack(out))
        except (
            EOFError,
            BrokenPipeError,
        ):  # the server process is gone (stopped or killed): nothing to answer
            return


_KINDS = ("plain", "secagg", "cpu", "count", "units", "session")


class _Link:
    """The server's end of the two one-way pipes to the node process."""

    def __init__(self, requests, replies) -> None:
        self.requests, self.replies = requests, replies

    def send(self, kind: str, u: int = 0, raw: bytes = b"") -> None:
        """One request: a kind byte, the node's index, the message bytes."""
        self.requests.send_bytes(bytes([_KINDS.index(kind)]) + int(u).to_bytes(4, "little") + raw)

    def ask(self, kind: str, u: int = 0):
        self.send(kind, u)
        return self.replies.recv()

    def exchange(self, kind: str, messages):
        """Push every ``(u, bytes)`` of a stage and yield each reply's bytes as it arrives (as the app's
        transport does); the pushing runs in a thread only so that the two pipes cannot deadlock."""
        import threading

        order: list[int] = []

        def push() -> None:
            try:
                for u, raw in messages:
                    order.append(u)
                    self.send(kind, u, raw)
            except OSError:  # the node process is gone (stopped): the replies' end says so, as an EOFError
                return

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        got = 0
        while pusher.is_alive() or got < len(order):
            if got < len(order):
                raw = self.replies.recv_bytes()
                yield order[got], raw
                got += 1
            else:
                pusher.join(0.001)
        pusher.join()


# --------------------------------------------------------------------------- the server
def _plain(link: _Link, K: int, D: int) -> dict:
    from flwr.app import ConfigRecord, RecordDict

    up, down = np.zeros(K), np.zeros(K)
    total = np.zeros(D)
    query = _pack(RecordDict({"query": ConfigRecord({"stat": "sums"})}))
    down[:] = len(query)
    for u, raw in link.exchange("plain", ((u, query) for u in range(K))):
        up[u] += len(raw)
        np.add(total, _unpack(raw)["stats"]["sums"].numpy(), out=total)
        del raw
    return {"total": total, "bytes_up": float(up.mean()), "bytes_down": float(down.mean()), "round_trips": 1}


def _masked(link: _Link, K: int, roster, D: int, run_id: int) -> dict:
    from mechanisms.secagg import fixed_point
    from mechanisms.secagg.masking.server import MaskingServer
    from privfed.flower.secagg import from_records, to_records

    link.ask("session", run_id)
    up, down = np.zeros(K), np.zeros(K)
    server = MaskingServer(
        num_nodes=K,
        threshold=roster.threshold,
        length=D,
        session=os.urandom(16),
        active=True,
        degree=roster.degree,
        frac_bits=FRAC_BITS,
        keep_view=False,
    )
    stages = 0
    while not server.done:
        # A stage's requests are all serialised before the first is pushed, as the app's transport builds a
        # stage's messages before grid.push_messages (privfed.flower.transport.exchange); the keys request
        # is the same for every node (serialised once).
        requests = server.requests()
        same = _pack(to_records(next(iter(requests.values())))) if server.stage == "keys" else None
        messages = [(u, same or _pack(to_records(msg))) for u, msg in requests.items()]
        del requests
        for u, raw in messages:
            down[u] += len(raw)
        for u, raw in link.exchange("secagg", messages):
            up[u] += len(raw)
            server.receive(u, from_records(_unpack(raw)))
            del raw
        del messages  # held until the stage's last reply, as the transport holds its list
        server.close()
        stages += 1
    return {
        "total": fixed_point.decode(server.total, FRAC_BITS),
        "bytes_up": float(up.mean()),
        "bytes_down": float(down.mean()),
        "round_trips": stages,
        "uploaded": len(server.U3),
    }


def _counted(link: _Link, fn) -> dict[str, int]:
    """The protocol's operations in both processes while ``fn()`` runs (an untimed run: counting costs CPU)."""
    link.ask("count", 1)
    with counting() as server_counts:
        fn()
    # only after the run: on an error the node process may still be answering, and _stop kills it
    counts = link.ask("count", 0)
    return {k: v + server_counts.get(k, 0) for k, v in counts.items()}


def _timed(link: _Link, fn) -> tuple[float, float, dict]:
    """(CPU seconds of both processes, wall seconds, output with ``server_cpu_s``) of ``fn()``."""
    n0, c0, t0 = link.ask("cpu"), time.process_time(), time.perf_counter()
    out = fn()
    t1, c1, n1 = time.perf_counter(), time.process_time(), link.ask("cpu")
    out["server_cpu_s"] = c1 - c0
    return (c1 - c0) + (n1 - n0), t1 - t0, out


def _start(K: int, degree: int, D: int, seed: int):
    """The operator's roster (identities and the SecAgg+ graph from OS entropy) and the node process (which
    sets :func:`steady_heap`; :func:`main` sets it in this one)."""
    roster, ids = make_roster(K, degree=degree)
    ctx = mp.get_context("spawn")
    req_r, req_w = ctx.Pipe(duplex=False)
    rep_r, rep_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_nodes,
        args=(req_r, rep_w, roster.to_json(), [i.private_key for i in ids], D, seed),
        daemon=True,
    )
    proc.start()
    # this process's copies of the node's ends closed: a node process that dies is then an EOFError here, not
    # a wait for ever on a pipe this process itself holds open
    req_r.close()
    rep_w.close()
    link = _Link(req_w, rep_r)
    _plain(link, 2, D)  # warm-up: the node process has imported everything and answered once
    return roster, link, proc


def _stop(link: _Link, proc) -> None:
    """End the node process: asked to stop after its last message, or killed at once when this process is
    being stopped (an exception, Ctrl-C, is on its way), so that a stop does not wait for a stage to finish."""
    if sys.exc_info()[0] is not None:
        proc.kill()
        proc.join(timeout=30)
        return
    try:
        link.requests.send_bytes(b"")
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()


def one_run(K: int, D: int, degree: int, repeats: int, seed: int) -> dict:
    """One run: ``repeats`` interleaved repeats of plain, masked and the unit timings in two fresh processes."""
    roster, link, proc = _start(K, degree, D, seed)
    try:
        direct = sum((_row(seed, u, D) for u in range(K)), np.zeros(D))
        # warm-up, untimed: both processes have run the protocol once, and its operations are counted
        counts = _counted(link, lambda: _masked(link, K, roster, D, 0))
        rows = []
        for r in range(repeats):
            load = os.getloadavg()[0]
            parts = ["plain", "masked"] if r % 2 == 0 else ["masked", "plain"]
            got = {}
            for part in parts:
                if part == "plain":
                    got["plain"] = _timed(link, lambda: _plain(link, K, D))
                else:
                    got["masked"] = _timed(link, lambda r=r: _masked(link, K, roster, D, r + 1))
            units = link.ask("units")
            (pc, pw, p), (mc, mw, m) = got["plain"], got["masked"]
            floor, terms = floor_seconds(pc, counts, units)
            work, work_terms = work_seconds(floor, counts, units)
            rows.append(
                {
                    "repeat": r,
                    "load_average": round(load, 2),
                    "order": parts,
                    "plain_cpu_s": pc,
                    "plain_wall_s": pw,
                    "plain_server_cpu_s": p["server_cpu_s"],
                    "masked_cpu_s": mc,
                    "masked_wall_s": mw,
                    "masked_server_cpu_s": m["server_cpu_s"],
                    "counts": counts,
                    "unit_s": units,
                    "floor_terms_s": terms,
                    "floor_cpu_s": floor,
                    "ratio": mc / floor,
                    "protocol_work_terms_s": work_terms,
                    "protocol_work_cpu_s": work,
                    "ratio_to_protocol_work": mc / work,
                    "ratio_to_plain": mc / pc,
                    "round_trips": m["round_trips"],
                    "uploaded": m["uploaded"],
                    "bytes_up_per_node": {"plain": p["bytes_up"], "masked": m["bytes_up"]},
                    "bytes_down_per_node": {"plain": p["bytes_down"], "masked": m["bytes_down"]},
                    "max_abs_error": {
                        "plain": float(np.abs(p["total"] - direct).max()),
                        "masked": float(np.abs(m["total"] - direct).max()),
                    },
                }
            )
            print(
                f"  [{K} nodes, repeat {r}] plain {pc:.2f} s (server {p['server_cpu_s']:.2f}), masked {mc:.2f} s "
                f"(server {m['server_cpu_s']:.2f}), floor {floor:.2f} s: "
                f"{mc / floor:.3f}x the floor, {mc / work:.3f}x the protocol work (load {load:.1f})",
                flush=True,
            )
        # counted again after the timed runs: a run without dropouts makes the same operations every time
        again = _counted(link, lambda: _masked(link, K, roster, D, repeats + 1))
        if again != counts:
            raise RuntimeError(f"two counted runs made different operations: {counts} and {again}")
    finally:
        _stop(link, proc)
    per_node = {op: counts[op] / K for op in (*OPS, "prg", *WORK_OPS)}
    return {
        "threshold": roster.threshold,
        "repeats": rows,
        "ratio": spread([r["ratio"] for r in rows]),
        "ratio_to_plain": spread([r["ratio_to_plain"] for r in rows]),
        "ratio_to_protocol_work": spread([r["ratio_to_protocol_work"] for r in rows]),
        "per_node": per_node,
    }


def memory(nodes: list[int], values: list[int], degree: int, seed: int) -> list[dict]:
    """The server's traced peak of a masked (and a plain) run at every N and D."""
    out = []
    for D in values:
        for K in nodes:
            roster, link, proc = _start(K, degree, D, seed)
            try:
                for kind in ("plain", "masked"):
                    tracemalloc.start()
                    if kind == "plain":
                        _plain(link, K, D)
                    else:
                        _masked(link, K, roster, D, 1)
                    peak = tracemalloc.get_traced_memory()[1]
                    tracemalloc.stop()
                    out.append({"protocol": kind, "nodes": K, "values": D, "peak_bytes": peak})
            finally:
                _stop(link, proc)
            print(
                f"  [memory {K} nodes x {D}] {out[-2]['peak_bytes']:,} / {out[-1]['peak_bytes']:,} B",
                flush=True,
            )
    return out


def slopes(points: list[dict]) -> dict[str, dict[int, float]]:
    """Least-squares slope of the traced peak against N, per protocol and vector length (bytes per node)."""
    out: dict[str, dict[int, float]] = {}
    for kind in ("plain", "masked"):
        for D in sorted({p["values"] for p in points}):
            pts = sorted(
                (p["nodes"], p["peak_bytes"]) for p in points if p["protocol"] == kind and p["values"] == D
            )
            if len(pts) > 1:
                out.setdefault(kind, {})[D] = float(
                    np.polyfit([k for k, _ in pts], [b for _, b in pts], 1)[0]
                )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=count(3), default=1000)
    p.add_argument("--values", type=count(1), default=51_200)
    p.add_argument("--degree", type=even_degree, default=20, help="SecAgg+ degree k (even)")
    p.add_argument("--memory-nodes", type=int_list(3), default=[250, 500, 1000])
    p.add_argument(
        "--memory-values",
        type=int_list(1),
        default=[5_120],
        help="vector lengths the server's memory is measured at besides --values",
    )
    p.add_argument(
        "--removed-fraction",
        type=float,
        default=0.1,
        help="share of nodes colluding or dropped for which the graph's split bound is reported",
    )
    p.add_argument("--repeats", type=count(1), default=3)
    p.add_argument("--runs", type=count(1), default=2, help="independent runs (fresh processes) recorded")
    # numpy seeds are >= 0 (a negative one failed in the node process)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_active_scale.json")
    a = p.parse_args(argv)
    if not 0 <= a.removed_fraction < 1:
        p.error("--removed-fraction must lie in [0, 1)")
    steady = steady_heap()  # this process's, as the node process sets its own
    runs = []
    for i in range(a.runs):
        print(f"run {i + 1} of {a.runs}: {a.nodes} nodes x {a.values} values, degree {a.degree}", flush=True)
        runs.append(one_run(a.nodes, a.values, a.degree, a.repeats, a.seed))
    mem = memory(a.memory_nodes, sorted({a.values, *a.memory_values}), a.degree, a.seed)
    medians = [r["ratio"]["median"] for r in runs]
    data = {
        "config": {
            "nodes": a.nodes,
            "values": a.values,
            "degree": a.degree,
            "memory_nodes": a.memory_nodes,
            "memory_values": sorted({a.values, *a.memory_values}),
            "repeats": a.repeats,
            "runs": a.runs,
            "seed": a.seed,
            "target_ratio": TARGET_RATIO,
            "reproduce": REPRODUCE,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "numpy": np.__version__,
            "heap": {"steady": steady, "trim_bytes": HEAP_TRIM_BYTES, "mmap_bytes": HEAP_MMAP_BYTES},
        },
        "runs": runs,
        "agreement": max(medians) / min(medians) - 1.0,
        "memory": mem,
        "peak_slope_bytes_per_node": slopes(mem),
        "graph": {
            "removed_fraction": a.removed_fraction,
            "split_bound": harary_split_bound(a.nodes, a.degree, a.removed_fraction),
        },
    }
    rows = [
        {
            "run": i + 1,
            "repeat": r["repeat"],
            "load": r["load_average"],
            **{k: r[k] for k in ("plain_cpu_s", "masked_cpu_s", "floor_cpu_s", "ratio")},
        }
        for i, run in enumerate(runs)
        for r in run["repeats"]
    ]
    print(
        "\n"
        + markdown(
            rows, ["run", "repeat", "load", "plain_cpu_s", "masked_cpu_s", "floor_cpu_s", "ratio"], ".3f"
        )
    )
    print(f"per node: {runs[-1]['per_node']}; runs agree within {data['agreement']:.1%}")
    print(f"server peak slope per node: {data['peak_slope_bytes_per_node']}")
    if a.record:
        from experiments import recorded

        cmd = recorded.command("experiments/bench_active_scale.py", argv)
        print(f"recorded {recorded.save('bench_active_scale', data, cmd)}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
