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
of every record the nodes sent and received), the traced peak of the server process above what it
held when the run began (tracemalloc over the ServerApp and Flower's in-memory link state), and the
largest difference between the masked head and the plain one (fixed-point error only).  Across
points: the slope of the server's peak per added node, against 8 (C (D + 1)) bytes, what holding
each node's upload would cost.  The server must hold, for each node, its signed keys and, until it
relays them, the k encrypted share messages that node sends, so the masked peak grows with N by
O(k) bytes a node, whatever D is; everything that grows with D is folded on arrival.

``--record`` writes ``experiments/results/bench_flower_masked.json``;
``tests/flower/test_bench_flower_masked.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_flower_masked.py [--nodes 250,500,1000] [--dim 5120] [--degree 20]
[--num-cpus 2] [--record]``
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
from privfed._cli import parse_int_list  # noqa: E402
from privfed.flower import FlowerConfig, run_simulation  # noqa: E402

#: The masked server's peak may grow per added node by at most this share of one node's upload.
TARGET_SLOPE_SHARE = 0.05
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
    return {
        "run": name,
        "nodes": nodes,
        "degree": getattr(cfg, "degree", None),
        "threshold": _threshold(rep),
        "server_s": rep["seconds"]["total"],
        "bytes_up_per_node": wire["bytes_up_per_node"],
        "bytes_down_per_node": sum(s.get("bytes_down_total", 0) for s in wire["stages"].values()) / nodes,
        "stages": sorted(wire["stages"]),
        "server_peak_bytes": rep["server_peak_traced_bytes"] - rep["server_traced_at_start_bytes"],
    }


def point(nodes: int, dim: int, degree: int | None, num_cpus: int) -> dict:
    """One simulation: the plain and the masked aggregation of the same statistics."""
    plain_cfg, masked_cfg = _configs(nodes, dim, degree)
    t0 = time.perf_counter()
    # a first plain run starts every actor and loads every node's data (its time is start-up, reported
    # apart); the plain and the masked runs then find the same warm simulation
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        out = run_simulation([plain_cfg, plain_cfg, masked_cfg], num_cpus=num_cpus)
    finally:
        if not tracing:
            tracemalloc.stop()
    wall = time.perf_counter() - t0
    warm, out = out[0], out[1:]
    for cfg, res in zip((plain_cfg, plain_cfg, masked_cfg), (warm, *out)):
        if isinstance(res, Exception):
            raise RuntimeError(f"{cfg.secure} run at {nodes} nodes failed: {res}")
    plain, masked = (_row(n, c, r) for n, c, r in zip(("plain", "masked"), (plain_cfg, masked_cfg), out))
    diff = float(np.abs(out[0].head.weight - out[1].head.weight).max())
    upload = 8 * CLASSES * (dim + 1)
    return {
        "nodes": nodes,
        "simulation_wall_s": wall,
        "startup_s": wall - plain["server_s"] - masked["server_s"],  # Ray, actors, the first run
        "plain": plain,
        "masked": masked,
        "upload_bytes": upload,
        "max_abs_head_diff": diff,
        "ratios": {
            "server_time": masked["server_s"] / plain["server_s"],
            "bytes_up": masked["bytes_up_per_node"] / plain["bytes_up_per_node"],
        },
    }


def slope(points: list[dict], run: str) -> float:
    """Least-squares slope of the server's peak (bytes) against the number of nodes."""
    n = np.array([p["nodes"] for p in points], dtype=float)
    peak = np.array([p[run]["server_peak_bytes"] for p in points], dtype=float)
    return float(np.polyfit(n, peak, 1)[0]) if len(points) > 1 else float("nan")


def run(nodes: list[int], dim: int, degree: int | None, num_cpus: int) -> dict:
    tracemalloc.start()
    try:
        points = []
        for n in nodes:
            print(f"[{n} nodes] one simulation: plain, then masked ...", flush=True)
            points.append(point(n, dim, degree, num_cpus))
            p = points[-1]
            print(
                f"[{n} nodes] plain {p['plain']['server_s']:.1f} s, masked {p['masked']['server_s']:.1f} s "
                f"({p['ratios']['server_time']:.2f}x), bytes up {p['ratios']['bytes_up']:.3f}x, "
                f"peak plain {p['plain']['server_peak_bytes'] / 2**20:.1f} MiB, "
                f"masked {p['masked']['server_peak_bytes'] / 2**20:.1f} MiB",
                flush=True,
            )
    finally:
        tracemalloc.stop()
    upload = points[0]["upload_bytes"]
    slopes = {r: slope(points, r) for r in ("plain", "masked")}
    return {
        "config": {"nodes": nodes, "dim": dim, "classes": CLASSES, "degree": degree, "num_cpus": num_cpus},
        "points": points,
        "peak_slope_bytes_per_node": slopes,
        "slope_share_of_upload": {r: v / upload for r, v in slopes.items()},
        "target_slope_share": TARGET_SLOPE_SHARE,
    }


def render(res: dict) -> str:
    rows = []
    for p in res["points"]:
        for r in ("plain", "masked"):
            q = p[r]
            rows.append(
                {
                    "nodes": p["nodes"],
                    "run": r,
                    "server s": q["server_s"],
                    "bytes up / node": q["bytes_up_per_node"],
                    "bytes down / node": q["bytes_down_per_node"],
                    "server peak MiB": q["server_peak_bytes"] / 2**20,
                }
            )
    cols = ["nodes", "run", "server s", "bytes up / node", "bytes down / node", "server peak MiB"]
    s = res["peak_slope_bytes_per_node"]
    return (
        markdown(rows, cols, ".4g")
        + f"\n\nserver peak slope: plain {s['plain']:+,.0f} B/node, masked {s['masked']:+,.0f} B/node "
        f"({res['slope_share_of_upload']['masked']:.1%} of a {res['points'][0]['upload_bytes']:,}-byte upload)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="250,500,1000", help="simulated nodes per point (comma-separated)")
    p.add_argument(
        "--dim", type=int, default=5120, help="feature dimension D (C = 10 classes: 51,210 values a node)"
    )
    p.add_argument("--degree", default="20", help="SecAgg+ degree k (even), or 'complete'")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs Ray may use for the nodes")
    p.add_argument("--out", default="results/bench_flower_masked")
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_flower_masked.json")
    args = p.parse_args(argv)
    nodes = parse_int_list(args.nodes, "--nodes", minimum=3)
    degree = None if args.degree == "complete" else int(args.degree)
    res = run(nodes, args.dim, degree, args.num_cpus)
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
