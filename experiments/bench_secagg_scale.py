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
without its agreement), so this is the ratio the target (<= 1.3) is set
on; ``vector_ratio`` = (masked - masked on D = 1) / (plain + PRG) is the
part that grows with the vector against the work that grows with it.
``ratio_to_plain_plus_prg`` (masked / (plain + PRG)) is reported, not
targeted: at small D the agreements alone exceed it.

Timing.  Every part runs on one BLAS thread (fixed before numpy loads, as
each node on its own machine would run) and is timed in CPU seconds of this
process (the work done, which other programs on a shared machine do not
add to, where wall time grows with them).  The parts are interleaved: each
of ``--repeats`` rounds times plain, PRG, X25519, masked and masked on D = 1
once for every graph and D, so a change in the machine's load falls on all
of them alike; each part records every repeat (``samples``), its least
(``best``), its median and its spread ((largest - least) / least), and the
ratios are given from the least and from the medians.  The machine's load
(``os.getloadavg``), CPU count and BLAS threads are recorded beside each
run.  ``--runs`` R (default 2) makes R independent runs, each in a fresh
interpreter one after the other, recorded side by side: a ratio is stated
as reproduced when every run's lies within 10 % of the others'.

Part 2, **SecAgg+ over Flower messages** (``--nodes`` N, ``--node-values`` D,
degree ``--degree`` k): the server is :class:`mechanisms.secagg.masking.server.MaskingServer`
in this process; the N nodes are :class:`mechanisms.secagg.masking.node.MaskingNode`
in one second process, each rebuilt from its state record for every
message as the Flower app does (:func:`privfed.flower.secagg.node_step`),
every request and reply a Flower ``RecordDict`` serialised to its protobuf
bytes and back, one message at a time (the server folds each reply as it
arrives).  The plain run of the same statistics sends each node a query
and gets its float64 vector as an ArrayRecord, folded the same way.
Reported: wall seconds of the whole run and the CPU seconds of both processes
(the server's and the nodes'), plain and masked alternated ``--flower-repeats``
times (plain, masked, plain, masked: never all of one then the other), bytes up
and down per node (Flower's ``count_bytes`` of the records), the traced peak of
the server process (tracemalloc: Python and numpy allocations) at every N in
``--memory-nodes``, and the slope of that peak per added node, against 8 D bytes
(what holding each upload would cost); with ``--memory-values`` the same
slope at other vector lengths, so that the server's memory per node is stated
as measured at each.  This is the protocol the Flower app runs: the active-adversary
version (signed keys, consistency round, echoes) on the SecAgg+ graph the
operator draws into the roster (here: this process, from OS entropy), with
the roster's threshold.  The server has its own process here, so its peak
is its own; on Flower's simulation runtime (:mod:`experiments.bench_flower_masked`)
the server shares its process with every virtual node.

``--record`` writes ``experiments/results/bench_secagg_scale.json``;
``tests/mechanisms/test_secagg_scale.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_secagg_scale.py [--clients 100] [--values 51200,204800] [--nodes 1000]
[--node-values 51200] [--degree 20] [--memory-nodes 250,500,1000] [--memory-values 12800] [--repeats 9]
[--flower-repeats 2] [--runs 2] [--record]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

# One BLAS thread for everything timed, fixed before numpy loads its OpenBLAS (the node process and
# the child runs inherit the environment).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from mechanisms.secagg import fixed_point  # noqa: E402
from mechanisms.secagg.identity import make_roster  # noqa: E402
from mechanisms.secagg.masking import (  # noqa: E402
    harary_split_bound,
    masked_sum,
    prg_buffer,
    prg_uint64,
)
from privfed.commands.common import parse_int_list  # noqa: E402

#: Targets the record is checked against (tests/mechanisms/test_secagg_scale.py).
TARGET_RATIO = 1.3
#: A ratio is reproduced when every independent run's lies within this share of the others'.
REPRODUCE = 0.10
#: The server's peak may grow per added node by at most this share of one upload (8 D bytes).
TARGET_SLOPE_SHARE = 0.05
FRAC_BITS = 32


def summary(samples: list[float]) -> dict:
    """Every repeat's seconds, their least, median and spread ((largest - least) / least)."""
    v = [float(x) for x in samples]
    lo = min(v)
    return {
        "samples": v,
        "best": lo,
        "median": float(np.median(v)),
        "spread": (max(v) - lo) / lo if lo else 0.0,
    }


def _cpu(fn) -> tuple[float, float, object]:
    """CPU and wall seconds of one call of ``fn``, and its output."""
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - t, out


def machine_state() -> dict:
    """What makes a timing comparable: load, CPUs, the BLAS threads in use."""
    from threadpoolctl import threadpool_info

    blas = sorted({int(i.get("num_threads", 0)) for i in threadpool_info() if i.get("user_api") == "blas"})
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "blas_threads": blas,
    }


# --------------------------------------------------------------------------- part 1
FLOOR_PARTS = ("plain", "prg", "x25519", "masked", "masked_d1")


def floor_rows(K: int, values: list[int], neighbours: int, repeats: int, seed: int) -> list[dict]:
    """The masked sum against plain + PRG + X25519, complete graph and SecAgg+, at each D, interleaved."""
    rng = np.random.default_rng(seed)
    sk = [X25519PrivateKey.generate() for _ in range(2)]
    pk = [key.public_key() for key in sk]
    graphs = [("complete graph", None), (f"SecAgg+ k={neighbours}", neighbours)]
    cases = []
    for D in values:
        X = rng.normal(size=(K, D))
        for label, k in graphs:
            deg = K - 1 if k is None else k
            cases.append({"X": X, "label": label, "k": k, "deg": deg, "D": D, "buf": prg_buffer(D)})
    key = os.urandom(32)
    for c in cases:  # the first call of each kind loads what it imports lazily; not timed
        masked_sum(c["X"][:, :1], neighbours=c["k"], rng=rng)
    times = [{p: [] for p in FLOOR_PARTS} for _ in cases]
    walls, results = [[] for _ in cases], [None] * len(cases)
    for _ in range(repeats):  # A B A B: every part once a round, every case once a round
        for i, c in enumerate(cases):
            X, k, D, buf = c["X"], c["k"], c["D"], c["buf"]
            n_prg, n_agree = K * (c["deg"] + 1) + K, 2 * K * c["deg"]
            t = times[i]
            t["plain"].append(_cpu(lambda X=X: X.sum(axis=0))[0])
            t["prg"].append(
                _cpu(lambda n=n_prg, D=D, buf=buf: [prg_uint64(key, D, buf) for _ in range(n)])[0]
            )
            t["x25519"].append(
                _cpu(lambda n=n_agree: [sk[i & 1].exchange(pk[(i >> 1) & 1]) for i in range(n)])[0]
            )
            cpu, wall, res = _cpu(lambda X=X, k=k: masked_sum(X, neighbours=k, rng=rng))
            t["masked"].append(cpu)
            walls[i].append(wall)
            results[i] = res
            t["masked_d1"].append(_cpu(lambda X=X, k=k: masked_sum(X[:, :1], neighbours=k, rng=rng))[0])
    rows = []
    for c, t, wall, res in zip(cases, times, walls, results):
        parts = {p: summary(v) for p, v in t.items()}
        row = {
            "variant": c["label"],
            "clients": K,
            "values": c["D"],
            "neighbours": c["deg"],
            "prg_expansions": K * (c["deg"] + 1) + K,
            "x25519_agreements": 2 * K * c["deg"],
            "parts": parts,
            "masked_wall_s": summary(wall),
            "max_abs_error": float(np.abs(res.total - c["X"].sum(axis=0)).max()),
            "error_bound": K * 2.0 ** -(res.frac_bits + 1),
        }
        for stat in ("best", "median"):
            q = {p: parts[p][stat] for p in FLOOR_PARTS}
            row[stat] = floor_ratios(q)
        rows.append(row)
    return rows


def floor_ratios(q: dict) -> dict:
    """The ratios of one set of part seconds (least or median): against the floor, the growing part."""
    return {
        "ratio_to_floor": q["masked"] / (q["plain"] + q["prg"] + q["x25519"]),
        "vector_ratio": (q["masked"] - q["masked_d1"]) / (q["plain"] + q["prg"]),
        "ratio_to_plain_plus_prg": q["masked"] / (q["plain"] + q["prg"]),
    }


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


def _nodes(conn, K: int, t: int, roster_json: str, secrets: list[bytes], seed: int) -> None:
    """The N nodes, one message at a time: each node's state lives in a ConfigRecord between messages.

    Each node runs the active version with its roster identity, on the roster's graph (what a Flower
    node deployed with ``secagg-identity`` and ``secagg-roster`` runs).  ``("cpu",)`` asks for this
    process's CPU seconds so far."""
    from flwr.app import ConfigRecord, RecordDict

    from mechanisms.secagg.crypto import KeySource
    from mechanisms.secagg.identity import Identity, Roster
    from mechanisms.secagg.masking.node import MaskingNode
    from privfed.flower.secagg import from_records, to_records
    from privfed.flower.wire import arrays_record

    roster = Roster.from_json(roster_json)
    ids = [Identity(i, sk) for i, sk in enumerate(secrets)]
    states: dict[int, ConfigRecord] = {}
    keys = KeySource(None)
    aggregation = None
    while True:
        item = conn.recv()
        if item is None:
            return
        if item[0] == "cpu":
            conn.send(time.process_time())
            aggregation = os.urandom(32)  # each masked run is a new aggregation of these nodes
            continue
        u, kind, raw, D = item
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
                ring_input=lambda u=u, D=D: fixed_point.encode(_row(seed, u, D), FRAC_BITS),
                aggregation=aggregation,
            )
            states[u] = ConfigRecord(node.state())
            out = to_records(reply)
        conn.send_bytes(_pack(out))


def _node_cpu(conn) -> float:
    conn.send(("cpu",))
    return float(conn.recv())


def _run(conn, kind: str, K: int, t: int, roster, D: int, trace: bool) -> dict:
    """One plain or masked run, the server in this process: wall seconds, CPU seconds of both processes,
    bytes per node, traced peak of this one."""
    from flwr.app import ConfigRecord, RecordDict

    from mechanisms.secagg.masking.server import MaskingServer
    from privfed.flower.secagg import from_records, to_records
    from privfed.flower.wire import record_bytes

    up, down = np.zeros(K), np.zeros(K)
    node_c0 = _node_cpu(conn)
    if trace:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "plain":
        total = np.zeros(D)
        query = RecordDict({"query": ConfigRecord({"stat": "sums"})})
        for u in range(K):
            down[u] += record_bytes(query)
            conn.send((u, "plain", _pack(query), D))
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
                conn.send((u, "secagg", _pack(rec), D))
                del rec
                reply = _unpack(conn.recv_bytes())
                up[u] += record_bytes(reply)
                server.receive(u, from_records(reply))
                del reply
            server.close()
            stages += 1
        total = fixed_point.decode(server.total, FRAC_BITS)
    wall, server_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    node_cpu = _node_cpu(conn) - node_c0
    return {
        "wall_s": wall,
        "server_cpu_s": server_cpu,
        "node_cpu_s": node_cpu,
        "cpu_s": server_cpu + node_cpu,
        "bytes_up_per_node": float(up.mean()),
        "bytes_down_per_node": float(down.mean()),
        "peak_bytes": peak,
        "round_trips": stages,
        "total": total,
    }


def _slope(points) -> float:
    pts = sorted(points)
    return float(np.polyfit([k for k, _ in pts], [b for _, b in pts], 1)[0]) if len(pts) > 1 else float("nan")


def flower_rows(
    nodes: int,
    D: int,
    degree: int,
    memory_nodes: list[int],
    memory_values: list[int],
    seed: int,
    rho: float,
    repeats: int,
) -> dict:
    """SecAgg+ and plain over Flower records at ``nodes`` (timed, untraced, alternated ``repeats`` times) and
    at each of ``memory_nodes`` (traced), for the vector length ``D`` and each of ``memory_values``."""
    ctx = mp.get_context("spawn")
    out: dict = {"timed": [], "memory": []}
    lengths = sorted({D, *memory_values})
    runs: dict[str, list[dict]] = {"plain": [], "masked": []}
    for K in sorted({nodes, *memory_nodes}):
        # the operator's roster: identities and the SecAgg+ graph drawn from OS entropy, the smallest
        # threshold its groups allow
        roster, ids = make_roster(K, degree=degree)
        t = roster.threshold
        secrets = [i.private_key for i in ids]
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_nodes, args=(there, K, t, roster.to_json(), secrets, seed), daemon=True)
        proc.start()
        try:
            # Warm up: the node process has imported everything and answered once before any clock starts.
            _run(here, "plain", 2, t, roster, D, False)
            if K == nodes:
                direct, abs_sum = np.zeros(D), np.zeros(D)
                for u in range(K):
                    row = _row(seed, u, D)
                    direct += row
                    abs_sum += np.abs(row)
                for _ in range(repeats):  # plain, masked, plain, masked: never all of one first
                    for kind in ("plain", "masked"):
                        r = _run(here, kind, K, t, roster, D, False)
                        r["max_abs_error"] = float(np.abs(r.pop("total") - direct).max())
                        runs[kind].append(r)
                        print(
                            f"[flower] {kind} {K} nodes: wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s",
                            flush=True,
                        )
                t_timed = t
                err_bound = {
                    # plain: two float64 sums in the same order; masked: the encoding's rounding
                    "plain": float(2 * (K - 1) * np.finfo(float).eps * abs_sum.max()),
                    "masked": K * 2.0 ** -(FRAC_BITS + 1),
                }
            for L in lengths:
                for kind in ("plain", "masked") if L == D else ("masked",):
                    r = _run(here, kind, K, t, roster, L, True)
                    out["memory"].append(
                        {"protocol": kind, "nodes": K, "values": L, "peak_bytes": r["peak_bytes"]}
                    )
            here.send(None)
        finally:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    for kind, rs in runs.items():
        last = rs[-1]
        out["timed"].append(
            {
                "protocol": kind,
                "nodes": nodes,
                "values": D,
                "neighbours": degree if kind == "masked" else 0,
                "threshold": t_timed if kind == "masked" else 0,
                "wall_s": summary([r["wall_s"] for r in rs]),
                "cpu_s": summary([r["cpu_s"] for r in rs]),
                "server_cpu_s": summary([r["server_cpu_s"] for r in rs]),
                "node_cpu_s": summary([r["node_cpu_s"] for r in rs]),
                "bytes_up_per_node": last["bytes_up_per_node"],
                "bytes_down_per_node": last["bytes_down_per_node"],
                "round_trips": last["round_trips"],
                "max_abs_error": max(r["max_abs_error"] for r in rs),
                "error_bound": err_bound[kind],
            }
        )
    by = {r["protocol"]: r for r in out["timed"]}
    p, m = by["plain"], by["masked"]
    out["ratios"] = {
        "wall": m["wall_s"]["best"] / p["wall_s"]["best"],
        "cpu": m["cpu_s"]["best"] / p["cpu_s"]["best"],
        "cpu_median": m["cpu_s"]["median"] / p["cpu_s"]["median"],
        "bytes_up": m["bytes_up_per_node"] / p["bytes_up_per_node"],
        "bytes_total": (m["bytes_up_per_node"] + m["bytes_down_per_node"])
        / (p["bytes_up_per_node"] + p["bytes_down_per_node"]),
    }
    mem = out["memory"]
    out["peak_slope_bytes_per_node"] = {
        kind: _slope((r["nodes"], r["peak_bytes"]) for r in mem if r["protocol"] == kind and r["values"] == D)
        for kind in ("plain", "masked")
    }
    out["masked_slope_by_values"] = {
        str(L): _slope(
            (r["nodes"], r["peak_bytes"]) for r in mem if r["protocol"] == "masked" and r["values"] == L
        )
        for L in lengths
    }
    out["upload_bytes"] = 8 * D
    out["slope_share_of_upload"] = {k: v / (8 * D) for k, v in out["peak_slope_bytes_per_node"].items()}
    out["graph"] = {
        "degree": degree,
        "removed_fraction": rho,
        "split_bound": harary_split_bound(nodes, degree, rho),
    }
    return out


# --------------------------------------------------------------------------- main
def one_run(a) -> dict:
    """One independent run of the parts not skipped (its machine state before and after)."""
    skip = {s for s in a.skip.split(",") if s}
    data: dict = {"machine_before": machine_state()}
    if "floor" not in skip:
        data["floor"] = floor_rows(a.clients, a.values, a.neighbours, a.repeats, a.seed)
    if "flower" not in skip:
        data["flower"] = flower_rows(
            a.nodes,
            a.node_values,
            a.degree,
            a.memory_nodes,
            a.memory_values,
            a.seed,
            a.removed_fraction,
            a.flower_repeats,
        )
    data["machine_after"] = machine_state()
    return data


def reproduction(runs: list[dict]) -> dict:
    """Each recorded ratio's values across the runs and their spread ((largest - least) / least)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for r in run.get("floor", []):
            for stat in ("best", "median"):
                values.setdefault(f"{r['variant']} D={r['values']} {stat} ratio_to_floor", []).append(
                    r[stat]["ratio_to_floor"]
                )
        if "flower" in run:
            fl = run["flower"]
            for key in ("cpu", "cpu_median", "wall"):
                values.setdefault(f"flower {key}", []).append(fl["ratios"][key])
            values.setdefault("flower masked peak slope", []).append(
                fl["peak_slope_bytes_per_node"]["masked"]
            )
    out = {}
    for key, v in values.items():
        spread = (max(v) - min(v)) / min(v) if min(v) > 0 else float("inf")
        out[key] = {"values": v, "spread": spread, "reproduced": spread <= REPRODUCE}
    return out


def _report(run: dict, a) -> None:
    if "floor" in run:
        rows = [
            {
                "variant": r["variant"],
                "values": r["values"],
                **{p: r["parts"][p]["best"] for p in FLOOR_PARTS},
                "ratio": r["best"]["ratio_to_floor"],
                "ratio (medians)": r["median"]["ratio_to_floor"],
                "masked spread": r["parts"]["masked"]["spread"],
            }
            for r in run["floor"]
        ]
        print(
            f"masked sum against its floor ({a.clients} clients; CPU s, least of {a.repeats}, interleaved)\n"
        )
        print(markdown(rows, list(rows[0]), ".4g"))
    if "flower" in run:
        fl = run["flower"]
        print(
            f"\nSecAgg+ (k={a.degree}) and plain over Flower records, {a.nodes} nodes x {a.node_values} values"
        )
        print(f"ratios {fl['ratios']}, peak slope per node {fl['peak_slope_bytes_per_node']}")


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
        "--memory-values",
        type=lambda s: parse_int_list(s, "--memory-values", minimum=1),
        default=[12_800],
        help="other vector lengths at which the masked server's memory per node is measured",
    )
    p.add_argument(
        "--removed-fraction",
        type=float,
        default=0.1,
        help="share of nodes colluding or dropped for which the graph's split bound is reported",
    )
    p.add_argument("--repeats", type=int, default=9, help="interleaved rounds of part 1")
    p.add_argument("--flower-repeats", type=int, default=4, help="plain / masked alternations of part 2")
    p.add_argument("--runs", type=int, default=2, help="independent runs, each in a fresh interpreter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: floor,flower")
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_secagg_scale.json")
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.clients < 2 or a.nodes < 2 or a.repeats < 1 or min(a.values) < 1 or a.node_values < 1:
        p.error("--clients and --nodes must be >= 2, --values, --node-values and --repeats >= 1")
    if a.runs < 1 or a.flower_repeats < 1:
        p.error("--runs and --flower-repeats must be >= 1")
    if not 0 <= a.removed_fraction < 1:
        p.error("--removed-fraction must lie in [0, 1)")
    if a.one_run:
        print("RESULT " + json.dumps(one_run(a)), flush=True)
        return 0
    args = list(sys.argv[1:] if argv is None else argv)
    args = [x for x in args if x != "--record"]
    runs = []
    for i in range(a.runs):  # independent: a fresh interpreter each, one after the other
        print(f"run {i + 1} of {a.runs}", flush=True)
        proc = subprocess.run(
            [sys.executable, __file__, *args, "--one-run"], capture_output=True, text=True, check=False
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            return 1
        runs.append(json.loads(lines[-1][len("RESULT ") :]))
        _report(runs[-1], a)
    data: dict = {
        "config": {
            "clients": a.clients,
            "values": a.values,
            "neighbours": a.neighbours,
            "nodes": a.nodes,
            "node_values": a.node_values,
            "degree": a.degree,
            "memory_nodes": a.memory_nodes,
            "memory_values": a.memory_values,
            "repeats": a.repeats,
            "flower_repeats": a.flower_repeats,
            "runs": a.runs,
            "seed": a.seed,
            "target_ratio": TARGET_RATIO,
            "reproduce": REPRODUCE,
            "target_slope_share": TARGET_SLOPE_SHARE,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "numpy": np.__version__,
        },
        "runs": runs,
        "reproduction": reproduction(runs),
    }
    for key, r in data["reproduction"].items():
        print(f"{key}: {[round(v, 4) for v in r['values']]} spread {r['spread']:.1%}")
    if a.record:
        from experiments import recorded

        cmd = recorded.command("experiments/bench_secagg_scale.py", argv)
        print(f"recorded {recorded.save('bench_secagg_scale', data, cmd)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
