"""Benchmark: pairwise masking on Flower's simulation runtime at 1,000 nodes, against a plain run.

Each point is one Flower simulation (Ray; ``privfed.flower.run_simulation``) of ``--nodes`` N
virtual SuperNodes running the privfed ClientApp, with the privfed ServerApp in this process, and
runs two aggregations of the same statistics (FedNCM's class counts and sums on
``synthetic:D:20`` data, 20 samples a node, C = 10 classes, so C (D + 1) values a node):

* **plain**: every node sends its statistics in clear (float64), folded as they arrive;
* **masked**: ``secure=mask``, the active-adversary protocol (operator roster of signing keys,
  signed key advertisements, consistency round), on the SecAgg+ graph of degree ``--degree`` k
  the operator drew into the roster (``None``: the complete graph), with the roster's threshold t.

Reported per run: the server's seconds from the first query to the head (the simulation's
start-up is reported once per point, apart), bytes up and down per node (Flower's ``count_bytes``
of every record the nodes sent and received), and the largest difference between the masked head
and the plain one (fixed-point error only).

Memory.  Flower's simulation runs the ServerApp in the same process as its engine, which keeps
every virtual node's ``Context`` there and copies contexts in and out of the Ray workers; so that
process's peak grows with the nodes' own state (a masked node caches its statistics, its noise
share under DP, between stages), not only the server's.  At each of ``--memory-nodes`` a second
simulation runs with tracemalloc on and reports, per run, the process's traced peak above where the
run began, beside the mean bytes of a node's ``context.state`` at the end (its cached statistics,
protocol state and ledger), and across sizes the slope of that peak per added node.  The server's
own memory, in a process of its own, is measured by :mod:`experiments.bench_secagg_scale` (the
same state machines over the same Flower records): it grows by O(k) bytes a node (keys, the share
messages it relays), and every vector is added to the total as it arrives.  The timed point
(``--timing-nodes``) runs without tracemalloc.

``--record`` writes ``experiments/results/bench_flower_masked.json``;
``tests/flower/test_bench_flower_masked.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_flower_masked.py [--timing-nodes 1000] [--memory-nodes 250,500,1000]
[--dim 5120] [--degree 20] [--num-cpus 2] [--record]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import tracemalloc

os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402
from privfed.commands.common import parse_int_list  # noqa: E402
from privfed.flower import FlowerConfig, run_simulation  # noqa: E402

CLASSES = 10


def _configs(nodes: int, dim: int, degree: int | None) -> tuple[FlowerConfig, FlowerConfig]:
    common = dict(
        method="fedncm",
        clients=nodes,
        dataset=f"synthetic:{dim}:20",
        timeout=3600.0,
        connect_timeout=1800.0,
    )
    masked = dict(common, secure="mask")
    if degree is not None:
        masked["degree"] = degree
    return FlowerConfig(**common), FlowerConfig(**masked)


def _threshold(rep: dict):
    """The threshold t the masked run's (first) secure sum used, None for a plain run."""
    sa = rep.get("secure_aggregation")
    rounds = sa.get("rounds") if isinstance(sa, dict) else None
    return rounds[0].get("threshold") if rounds else None


def _row(name: str, cfg: FlowerConfig, res) -> dict:
    rep = res.report
    wire = rep["wire"]
    nodes = cfg.clients
    row = {
        "run": name,
        "nodes": nodes,
        "degree": getattr(cfg, "degree", None),
        "threshold": _threshold(rep),
        "server_s": rep["seconds"]["total"],
        "bytes_up_per_node": wire["bytes_up_per_node"],
        "bytes_down_per_node": sum(s.get("bytes_down_total", 0) for s in wire["stages"].values()) / nodes,
        "stages": sorted(wire["stages"]),
    }
    if "server_peak_traced_bytes" in rep:
        row["process_peak_bytes"] = rep["server_peak_traced_bytes"] - rep["server_traced_at_start_bytes"]
    return row


def _capture_node_contexts() -> tuple[list, object]:
    """Flower's simulation keeps every virtual node's Context in the process that runs the ServerApp; capture
    the stores so the nodes' share of that process's memory can be stated apart (returns them and the
    original factory to restore)."""
    from flwr.server.superlink.fleet.vce import vce_api

    stores: list = []
    original = vce_api._register_node_info_stores

    def capture(*args, **kwargs):
        out = original(*args, **kwargs)
        stores.append(out)
        return out

    vce_api._register_node_info_stores = capture
    return stores, original


def _context_bytes(stores: list) -> float:
    """Mean bytes of a virtual node's ``context.state`` at the end (its cached statistics, protocol state and
    ledger), as Flower counts record bytes."""
    from privfed.flower.wire import record_bytes

    sizes = [
        record_bytes(info.context.state)
        for store in stores
        for node in store.values()
        for info in node.run_infos.values()
    ]
    return float(np.mean(sizes)) if sizes else 0.0


def point(nodes: int, dim: int, degree: int | None, num_cpus: int, *, traced: bool = False) -> dict:
    """One simulation: a warm-up plain run, then the plain and the masked aggregation of the same statistics.

    ``traced`` runs it under tracemalloc (the process's peak per run; see the module docstring).
    """
    plain_cfg, masked_cfg = _configs(nodes, dim, degree)
    cfgs = [plain_cfg, plain_cfg, masked_cfg]
    stores, original = _capture_node_contexts()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        # the first plain run starts every actor and loads every node's data (its time is start-up,
        # reported apart); the plain and the masked runs then find the same warm simulation
        out = run_simulation(cfgs, num_cpus=num_cpus)
    finally:
        from flwr.server.superlink.fleet.vce import vce_api

        vce_api._register_node_info_stores = original
        if traced:
            tracemalloc.stop()
    wall = time.perf_counter() - t0
    for cfg, res in zip(cfgs, out):
        if isinstance(res, Exception):
            raise RuntimeError(f"{cfg.secure} run at {nodes} nodes failed: {res}")
    out = out[1:]
    plain, masked = (_row(n, c, r) for n, c, r in zip(("plain", "masked"), (plain_cfg, masked_cfg), out))
    return {
        "nodes": nodes,
        "traced": traced,
        "simulation_wall_s": wall,
        "startup_s": wall - plain["server_s"] - masked["server_s"],  # Ray, actors, the first run
        "plain": plain,
        "masked": masked,
        "upload_bytes": 8 * CLASSES * (dim + 1),
        "node_context_bytes": _context_bytes(stores),
        "max_abs_head_diff": float(np.abs(out[0].head.weight - out[1].head.weight).max()),
        "ratios": {
            "server_time": masked["server_s"] / plain["server_s"],
            "bytes_up": masked["bytes_up_per_node"] / plain["bytes_up_per_node"],
        },
    }


def slope(points: list[dict], run: str, key: str) -> float:
    """Least-squares slope of ``points[i][run][key]`` (bytes) against the number of nodes."""
    n = np.array([p["nodes"] for p in points], dtype=float)
    y = np.array([p[run][key] for p in points], dtype=float)
    return float(np.polyfit(n, y, 1)[0]) if len(points) > 1 else float("nan")


def _say(p: dict) -> None:
    m, q = p["masked"], p["plain"]
    text = (
        f"[{p['nodes']} nodes] plain {q['server_s']:.1f} s, masked {m['server_s']:.1f} s "
        f"({p['ratios']['server_time']:.2f}x), bytes up {p['ratios']['bytes_up']:.3f}x"
    )
    if p["traced"]:
        text += (
            f"; process peak plain {q['process_peak_bytes'] / 2**20:.1f} MiB, masked "
            f"{m['process_peak_bytes'] / 2**20:.1f} MiB; node context {p['node_context_bytes']:,.0f} B"
        )
    print(text, flush=True)


def run(timing_nodes: int, memory_nodes: list[int], dim: int, degree: int | None, num_cpus: int) -> dict:
    print(f"[{timing_nodes} nodes] timed simulation ...", flush=True)
    timed = point(timing_nodes, dim, degree, num_cpus)
    _say(timed)
    memory = []
    for n in memory_nodes:
        print(f"[{n} nodes] traced simulation ...", flush=True)
        memory.append(point(n, dim, degree, num_cpus, traced=True))
        _say(memory[-1])
    slopes = {run: slope(memory, run, "process_peak_bytes") for run in ("plain", "masked")}
    return {
        "config": {
            "timing_nodes": timing_nodes,
            "memory_nodes": memory_nodes,
            "dim": dim,
            "classes": CLASSES,
            "degree": degree,
            "num_cpus": num_cpus,
        },
        "timed": timed,
        "memory": memory,
        "process_peak_slope_bytes_per_node": slopes,
    }


def render(res: dict) -> str:
    t = res["timed"]
    rows = [
        {
            "run": r,
            "server s": t[r]["server_s"],
            "bytes up / node": t[r]["bytes_up_per_node"],
            "bytes down / node": t[r]["bytes_down_per_node"],
        }
        for r in ("plain", "masked")
    ]
    mem = [
        {
            "nodes": p["nodes"],
            "run": r,
            "process peak MiB": p[r]["process_peak_bytes"] / 2**20,
            "node context B": p["node_context_bytes"],
        }
        for p in res["memory"]
        for r in ("plain", "masked")
    ]
    s = res["process_peak_slope_bytes_per_node"]
    return (
        f"{t['nodes']:,} nodes:\n\n"
        + markdown(rows, ["run", "server s", "bytes up / node", "bytes down / node"], ".4g")
        + "\n\n"
        + markdown(mem, ["nodes", "run", "process peak MiB", "node context B"], ".4g")
        + f"\n\nprocess peak per added node: plain {s['plain']:+,.0f} B, masked {s['masked']:+,.0f} B"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timing-nodes", type=int, default=1000, help="simulated nodes of the timed point")
    p.add_argument("--memory-nodes", default="250,500,1000", help="simulated nodes of the traced points")
    p.add_argument(
        "--dim", type=int, default=5120, help="feature dimension D (C = 10 classes: 51,210 values a node)"
    )
    p.add_argument("--degree", default="20", help="SecAgg+ degree k (even), or 'complete'")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs Ray may use for the nodes")
    p.add_argument("--out", default="results/bench_flower_masked")
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_flower_masked.json")
    args = p.parse_args(argv)
    memory_nodes = parse_int_list(args.memory_nodes, "--memory-nodes", minimum=3)
    degree = None if args.degree == "complete" else int(args.degree)
    res = run(args.timing_nodes, memory_nodes, args.dim, degree, args.num_cpus)
    print("\n" + render(res))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    if args.record:
        from experiments import recorded

        cmd = recorded.command("experiments/bench_flower_masked.py", argv)
        print(f"recorded {recorded.save('bench_flower_masked', res, cmd)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
