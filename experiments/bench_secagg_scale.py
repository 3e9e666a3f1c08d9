"""Benchmark of pairwise masking at scale: the masked sum against the work it cannot skip, and SecAgg+ at
1,000 nodes over Flower messages against a plain run of the same statistics.

Part 1, **the masked sum against its floor** (``--clients`` K x each D in ``--values``, one run):

* plain: the float64 sum of the (K, D) stack;
* PRG: the AES-CTR expansions of D values the protocol needs, alone (each
  client a self mask and one mask per neighbour, the server one self mask
  per uploader);
* X25519: the key agreements it needs, alone (each client one channel key
  and one mask key per neighbour);
* masked: :func:`mechanisms.secagg.masking.masked_sum` end to end (key agreement,
  Shamir sharing, share encryption, masking, unmasking), and the same on
  D = 1 (its part that does not grow with the vector).

``ratio_to_floor`` = masked / (plain + PRG + X25519): every term of the
floor is work the protocol must do (no mask without its key, no key
without its agreement), so this is the ratio the target (<= 1.5) is set
on; ``vector_ratio`` = (masked - masked on D = 1) / (plain + PRG) is the
part that grows with the vector against the work that grows with it.
``ratio_to_plain_plus_prg`` (masked / (plain + PRG)) is reported, not
targeted: at small D the agreements alone exceed it.  Times are the least
CPU seconds of ``--repeats`` runs (one thread; robust on a shared machine).

Part 2, **SecAgg+ over Flower messages** (``--nodes`` N, ``--node-values`` D,
degree ``--degree`` k): the server is :class:`mechanisms.secagg.masking.server.MaskingServer`
in this process; the N nodes are :class:`mechanisms.secagg.masking.node.MaskingNode`
in one second process, each rebuilt from its state record for every
message as the Flower app does (:func:`privfed.flower.secagg.node_step`),
every request and reply a Flower ``RecordDict`` serialised to its protobuf
bytes and back, one message at a time (the server folds each reply as it
arrives).  The plain run of the same statistics sends each node a query
and gets its float64 vector as an ArrayRecord, folded the same way.
Reported: wall seconds of the whole run (server and all nodes' work, one
process each), bytes up and down per node (Flower's ``count_bytes`` of the
records), the traced peak of the server process (tracemalloc: Python and
numpy allocations) at every N in ``--memory-nodes``, and the slope of that
peak per added node, against 8 D bytes (what holding each upload would
cost).  This is the protocol the Flower app runs: the active-adversary
version (signed keys, consistency round, echoes) on the SecAgg+ graph the
operator draws into the roster (here: this process, from OS entropy), with
the roster's threshold.  The server has its own process here, so its peak
is its own; on Flower's simulation runtime (:mod:`experiments.bench_flower_masked`)
the server shares its process with every virtual node.

``--record`` writes ``experiments/results/bench_secagg_scale.json``;
``tests/mechanisms/test_secagg_scale.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_secagg_scale.py [--clients 100] [--values 51200,204800] [--nodes 1000]
[--node-values 51200] [--degree 20] [--memory-nodes 250,500,1000] [--repeats 3] [--record]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from mechanisms.secagg import fixed_point
from mechanisms.secagg.identity import make_roster  # noqa: E402
from mechanisms.secagg.masking import (  # noqa: E402
    harary_split_bound,
    masked_sum,
    prg_buffer,
    prg_uint64,
)
from privfed.commands.common import parse_int_list  # noqa: E402

#: Targets the record is checked against (tests/mechanisms/test_secagg_scale.py).
TARGET_RATIO = 1.5
#: The server's peak may grow per added node by at most this share of one upload (8 D bytes).
TARGET_SLOPE_SHARE = 0.05
FRAC_BITS = 32


def _best(fn, repeats: int) -> tuple[float, float, object]:
    """Least CPU seconds of ``repeats`` runs, that run's wall seconds and output."""
    best, wall, out = float("inf"), float("nan"), None
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        o = fn()
        dc, dt = time.process_time() - c, time.perf_counter() - t
        if dc < best:
            best, wall, out = dc, dt, o
    return best, wall, out


# --------------------------------------------------------------------------- part 1
def floor_rows(K: int, values: list[int], neighbours: int, repeats: int, seed: int) -> list[dict]:
    """The masked sum against plain + PRG + X25519, complete graph and SecAgg+, at each D."""
    rng = np.random.default_rng(seed)
    rows = []
    sk = [X25519PrivateKey.generate() for _ in range(2)]
    pk = [key.public_key() for key in sk]
    for D in values:
        X = rng.normal(size=(K, D))
        plain, _, _ = _best(lambda X=X: X.sum(axis=0), max(repeats, 10))
        for label, k in (("complete graph", None), (f"SecAgg+ k={neighbours}", neighbours)):
            deg = K - 1 if k is None else k
            n_prg = K * (deg + 1) + K
            key, buf = os.urandom(32), prg_buffer(D)
            prg, _, _ = _best(
                lambda n=n_prg, D=D: [prg_uint64(key, D, buf) for _ in range(n)] and None, repeats
            )
            n_agree = 2 * K * deg
            agree, _, _ = _best(
                lambda n=n_agree: [sk[i & 1].exchange(pk[(i >> 1) & 1]) for i in range(n)] and None, repeats
            )
            cpu, wall, res = _best(lambda X=X, k=k: masked_sum(X, neighbours=k, rng=rng), repeats)
            fixed, _, _ = _best(lambda X=X, k=k: masked_sum(X[:, :1], neighbours=k, rng=rng), repeats)
            rows.append(
                {
                    "variant": label,
                    "clients": K,
                    "values": D,
                    "neighbours": deg,
                    "plain_cpu_s": plain,
                    "prg_expansions": n_prg,
                    "prg_cpu_s": prg,
                    "x25519_agreements": n_agree,
                    "x25519_cpu_s": agree,
                    "masked_cpu_s": cpu,
                    "masked_wall_s": wall,
                    "masked_d1_cpu_s": fixed,
                    "ratio_to_floor": cpu / (plain + prg + agree),
                    "vector_ratio": (cpu - fixed) / (plain + prg),
                    "ratio_to_plain_plus_prg": cpu / (plain + prg),
                    "max_abs_error": float(np.abs(res.total - X.sum(axis=0)).max()),
                    "error_bound": K * 2.0 ** -(res.frac_bits + 1),
                }
            )
    return rows


# --------------------------------------------------------------------------- part 2
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


def _nodes(conn, K: int, t: int, roster_json: str, secrets: list[bytes], D: int, seed: int) -> None:
    """The N nodes, one message at a time: each node's state lives in a ConfigRecord between messages.

    Each node runs the active version with its roster identity, on the roster's graph (what a Flower
    node deployed with ``secagg-identity`` and ``secagg-roster`` runs)."""
    from flwr.app import ConfigRecord, RecordDict

    from mechanisms.secagg.crypto import KeySource
    from mechanisms.secagg.identity import Identity, Roster
    from mechanisms.secagg.masking.node import MaskingNode
    from privfed.flower.secagg import from_records, to_records
    from privfed.flower.wire import arrays_record

    roster = Roster.from_json(roster_json)
    ids = [Identity(i, sk) for i, sk in enumerate(secrets)]
    aggregation = os.urandom(32)  # the one aggregation this benchmark's nodes take part in
    states: dict[int, ConfigRecord] = {}
    keys = KeySource(None)
    while True:
        item = conn.recv()
        if item is None:
            return
        u, kind, raw = item
        if kind == "plain":
            out = RecordDict({"stats": arrays_record({"sums": _row(seed, u, D)})})
        else:
            req = from_records(_unpack(raw))
            node = MaskingNode(
                u,
                num_nodes=K,
                threshold=t,
                neighbours=roster.graph[u],
                identity=ids[u],
                roster=roster,
                keys=keys,
                state=None if req["stage"] == "keys" else dict(states[u]),
            )
            reply = node.handle(
                req,
                ring_input=lambda u=u: fixed_point.encode(_row(seed, u, D), FRAC_BITS),
                aggregation=aggregation,
            )
            states[u] = ConfigRecord(node.state())
            out = to_records(reply)
        conn.send_bytes(_pack(out))


def _run(conn, kind: str, K: int, t: int, roster, D: int, trace: bool) -> dict:
    """One plain or masked run, the server in this process; wall seconds, bytes per node, traced peak."""
    from flwr.app import ConfigRecord, RecordDict

    from mechanisms.secagg.masking.server import MaskingServer
    from privfed.flower.secagg import from_records, to_records
    from privfed.flower.wire import record_bytes

    up, down = np.zeros(K), np.zeros(K)
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    if kind == "plain":
        total = np.zeros(D)
        query = RecordDict({"query": ConfigRecord({"stat": "sums"})})
        for u in range(K):
            down[u] += record_bytes(query)
            conn.send((u, "plain", _pack(query)))
            reply = _unpack(conn.recv_bytes())
            up[u] += record_bytes(reply)
            np.add(total, reply["stats"]["sums"].numpy(), out=total)
            del reply
        stages = 1
    else:
        server = MaskingServer(
            num_nodes=K,
            threshold=t,
            length=D,
            session=os.urandom(16),
            active=True,
            graph=roster.graph,
            degree=roster.degree,
            frac_bits=FRAC_BITS,
            keep_view=False,
        )
        stages = 0
        while not server.done:
            for u, msg in server.requests().items():
                rec = to_records(msg)
                down[u] += record_bytes(rec)
                conn.send((u, "secagg", _pack(rec)))
                del rec
                reply = _unpack(conn.recv_bytes())
                up[u] += record_bytes(reply)
                server.receive(u, from_records(reply))
                del reply
            server.close()
            stages += 1
        total = fixed_point.decode(server.total, FRAC_BITS)
    wall = time.perf_counter() - t0
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return {
        "wall_s": wall,
        "bytes_up_per_node": float(up.mean()),
        "bytes_down_per_node": float(down.mean()),
        "peak_bytes": peak,
        "round_trips": stages,
        "total": total,
    }


def flower_rows(nodes: int, D: int, degree: int, memory_nodes: list[int], seed: int, rho: float) -> dict:
    """SecAgg+ and plain over Flower records at ``nodes`` (timed, untraced) and at each of ``memory_nodes`` (traced)."""
    ctx = mp.get_context("spawn")
    out: dict = {"timed": [], "memory": []}
    for K in sorted({nodes, *memory_nodes}):
        # the operator's roster: identities and the SecAgg+ graph drawn from OS entropy, the smallest
        # threshold its groups allow
        roster, ids = make_roster(K, degree=degree)
        t = roster.threshold
        secrets = [i.private_key for i in ids]
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_nodes, args=(there, K, t, roster.to_json(), secrets, D, seed), daemon=True)
        proc.start()
        try:
            # Warm up: the node process has imported everything and answered once before any clock starts.
            _run(here, "plain", 2, t, roster, D, False)
            direct = abs_sum = None
            if K == nodes:
                direct, abs_sum = np.zeros(D), np.zeros(D)
                for u in range(K):
                    row = _row(seed, u, D)
                    direct += row
                    abs_sum += np.abs(row)
            for kind in ("plain", "masked"):
                for trace in [False, True] if K == nodes else [True]:
                    r = _run(here, kind, K, t, roster, D, trace)
                    total = r.pop("total")
                    if trace:
                        out["memory"].append({"protocol": kind, "nodes": K, "peak_bytes": r["peak_bytes"]})
                    else:
                        err = float(np.abs(total - direct).max())
                        out["timed"].append(
                            {
                                "protocol": kind,
                                "nodes": K,
                                "values": D,
                                "neighbours": degree if kind == "masked" else 0,
                                "threshold": t if kind == "masked" else 0,
                                **{k: v for k, v in r.items() if k != "peak_bytes"},
                                "max_abs_error": err,
                                # plain: two float64 sums in the same order; masked: the encoding's rounding
                                "error_bound": (
                                    float(2 * (K - 1) * np.finfo(float).eps * abs_sum.max())
                                    if kind == "plain"
                                    else K * 2.0 ** -(FRAC_BITS + 1)
                                ),
                            }
                        )
            here.send(None)
        finally:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    by = {r["protocol"]: r for r in out["timed"]}
    p, m = by["plain"], by["masked"]
    out["ratios"] = {
        "wall": m["wall_s"] / p["wall_s"],
        "bytes_up": m["bytes_up_per_node"] / p["bytes_up_per_node"],
        "bytes_total": (m["bytes_up_per_node"] + m["bytes_down_per_node"])
        / (p["bytes_up_per_node"] + p["bytes_down_per_node"]),
    }
    slopes = {}
    for kind in ("plain", "masked"):
        pts = sorted((r["nodes"], r["peak_bytes"]) for r in out["memory"] if r["protocol"] == kind)
        ks, peaks = np.array([k for k, _ in pts], float), np.array([b for _, b in pts], float)
        slopes[kind] = float(np.polyfit(ks, peaks, 1)[0]) if len(pts) > 1 else float("nan")
    out["peak_slope_bytes_per_node"] = slopes
    out["upload_bytes"] = 8 * D
    out["slope_share_of_upload"] = {k: v / (8 * D) for k, v in slopes.items()}
    out["graph"] = {
        "degree": degree,
        "removed_fraction": rho,
        "split_bound": harary_split_bound(nodes, degree, rho),
    }
    return out


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument(
        "--values", type=lambda s: parse_int_list(s, "--values", minimum=1), default=[51_200, 204_800]
    )
    p.add_argument("--neighbours", type=int, default=14, help="SecAgg+ degree in part 1 (even)")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--node-values", type=int, default=51_200)
    p.add_argument("--degree", type=int, default=20, help="SecAgg+ degree in part 2 (even)")
    p.add_argument(
        "--memory-nodes",
        type=lambda s: parse_int_list(s, "--memory-nodes", minimum=2),
        default=[250, 500, 1000],
    )
    p.add_argument(
        "--removed-fraction",
        type=float,
        default=0.1,
        help="share of nodes colluding or dropped for which the graph's split bound is reported",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: floor,flower")
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_secagg_scale.json")
    a = p.parse_args(argv)
    if a.clients < 2 or a.nodes < 2 or a.repeats < 1 or min(a.values) < 1 or a.node_values < 1:
        p.error("--clients and --nodes must be >= 2, --values, --node-values and --repeats >= 1")
    if not 0 <= a.removed_fraction < 1:
        p.error("--removed-fraction must lie in [0, 1)")
    skip = {s for s in a.skip.split(",") if s}
    data: dict = {
        "config": {
            "clients": a.clients,
            "values": a.values,
            "neighbours": a.neighbours,
            "nodes": a.nodes,
            "node_values": a.node_values,
            "degree": a.degree,
            "memory_nodes": a.memory_nodes,
            "repeats": a.repeats,
            "seed": a.seed,
            "target_ratio": TARGET_RATIO,
            "target_slope_share": TARGET_SLOPE_SHARE,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "numpy": np.__version__,
        }
    }
    if "floor" not in skip:
        rows = floor_rows(a.clients, a.values, a.neighbours, a.repeats, a.seed)
        data["floor"] = rows
        print(f"masked sum against its floor ({a.clients} clients; least CPU s of {a.repeats})\n")
        cols = ["variant", "values", "plain_cpu_s", "prg_cpu_s", "x25519_cpu_s", "masked_cpu_s"]
        print(markdown(rows, cols + ["ratio_to_floor", "vector_ratio", "ratio_to_plain_plus_prg"], ".4g"))
    if "flower" not in skip:
        fl = flower_rows(a.nodes, a.node_values, a.degree, a.memory_nodes, a.seed, a.removed_fraction)
        data["flower"] = fl
        print(
            f"\nSecAgg+ (k={a.degree}) and plain over Flower records, {a.nodes} nodes x {a.node_values} values\n"
        )
        print(
            markdown(fl["timed"], ["protocol", "wall_s", "bytes_up_per_node", "bytes_down_per_node"], ".4g")
        )
        print(markdown(fl["memory"], ["protocol", "nodes", "peak_bytes"], ".4g"))
        print(
            f"ratios {fl['ratios']}, peak slope per node {fl['peak_slope_bytes_per_node']} (upload {8 * a.node_values} B)"
        )
    if a.record:
        from experiments import recorded

        cmd = recorded.command("experiments/bench_secagg_scale.py", argv)
        print(f"recorded {recorded.save('bench_secagg_scale', data, cmd)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
