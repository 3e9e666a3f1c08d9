"""Benchmark: pairwise masking on Flower's simulation runtime at 1,000 nodes, against a plain run, its
cryptographic floor and Flower's own SecAgg+.

Each point is one Flower simulation (Ray; ``privfed.flower.run_simulation``) of N (``--timing-nodes``)
virtual SuperNodes running the privfed ClientApp, with the privfed ServerApp in this process, and
runs, after a first plain run that starts every actor, ``--repeats`` rounds of three aggregations of
the same statistics (FedNCM's class counts and sums on ``synthetic:D:20`` data, 20 samples a node,
C = 10 classes, so C (D + 1) values a node), their order rotating from one round to the next:

* **plain**: every node sends its statistics in clear (float64), folded as they arrive;
* **masked**: ``secure=mask``, the active-adversary protocol (operator roster of signing keys,
  signed key advertisements, consistency round), on the SecAgg+ graph of degree ``--degree`` k the
  operator drew into the roster, with the roster's threshold t;
* **Flower SecAgg+**: ``secure=flwr-secaggplus-insecure``, Flower's own ``SecAggPlusWorkflow`` on the
  same nodes, k + 1 shares a node and the same t (semi-honest, not secure against a deviating server;
  its statistics pre-scaled by public bounds and quantised to 2^22 levels).

Measured per run: the CPU seconds of this process and every process it started (the ServerApp,
Flower's engine and the Ray workers running the ClientApps, read from ``/proc``), its wall seconds,
the CPU seconds of each stage (the same, around each exchange of messages), bytes up and down per
node, and the machine's load average.

**The floor**: the plain run's CPU seconds plus the signatures, verifies, X25519 agreements and key
loads and the mask keystream the masked protocol's argument needs (per node: 3 signatures, 2k verifies,
2k agreements, 2 key loads, k + 1 masks, and the server one mask per uploader; the counts the
message-layer benchmark :mod:`experiments.bench_active_scale` finds at the state machines' call sites),
each timed alone with ``cryptography`` in this process in the same round.  Flower's engine costs a
round trip of messages whatever it carries; the masked run needs five (its setup, which carries the
key advertisements, then shares, masked input, consistency and unmasking) where the plain run needs one,
so the record also gives the floor with those extra round trips, each at the CPU cost of the masked
run's own consistency stage (its node work is one signature and a ledger entry a node).

The simulations run as ``privfed.flower.run_simulation`` starts them: Ray's inline limit raised (a node's
messages and context travel inside Ray's task messages, not through its object store; the record keeps
the limit) and the ClientApp sent as the call that builds it.

Memory.  Flower's simulation runs the ServerApp in the same process as its engine, which keeps every
virtual node's ``Context`` there; at each of ``--memory-nodes`` a second simulation runs with
tracemalloc on and reports, per run, the process's traced peak above where the run began, beside the
mean bytes of a node's ``context.state`` at the end, and across sizes the slope per added node.  The
server's own memory, in a process of its own, is measured by :mod:`experiments.bench_active_scale`.

``--record`` writes ``experiments/results/bench_flower_masked.json``;
``tests/flower/test_bench_flower_masked.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_flower_masked.py [--timing-nodes 1000] [--memory-nodes 250,500,1000]
[--dim 5120] [--degree 20] [--repeats 2] [--runs 2] [--num-cpus 2] [--record]``
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
from experiments.crypto_floor import OPS, floor_seconds, spread, tree_cpu, unit_seconds  # noqa: E402
from experiments.flag_types import count, degree, int_list, out_path  # noqa: E402
from privfed.flower import FlowerConfig, run_simulation  # noqa: E402

CLASSES = 10
SAMPLES = 20
#: The records' public bounds Flower's SecAgg+ pre-scales by (it needs them; the synthetic features lie
#: well within the clip).
FLWR_CLIP = 100.0
RUNS = ("plain", "masked", "flwr")


def _configs(nodes: int, dim: int, degree: int | None, round_: int = 0) -> dict[str, FlowerConfig]:
    """The three runs of round ``round_``.  Each round draws its own synthetic data of the same law (the
    partition seed ``round_``): a node takes part in one masked sum per configuration and round, ever (its
    ledger), so every round's masked run is another aggregation, of statistics of the same shape."""
    common = dict(
        method="fedncm",
        clients=nodes,
        partition_seed=round_,
        dataset=f"synthetic:{dim}:{SAMPLES}",
        timeout=3600.0,
        connect_timeout=1800.0,
    )
    graph = {} if degree is None else {"degree": degree}
    return {
        "plain": FlowerConfig(**common),
        "masked": FlowerConfig(**common, secure="mask", **graph),
        "flwr": FlowerConfig(
            **common, secure="flwr-secaggplus-insecure", clip=FLWR_CLIP, max_records=SAMPLES, **graph
        ),
    }


def floor_counts(nodes: int, degree: int | None, values: int) -> dict[str, int]:
    """The public-key work and keystream the masked protocol's argument needs with every node uploading:
    per node 3 signatures, 2k verifies, 2k agreements, 2 key loads, k + 1 masks; the server one mask per
    uploader."""
    k = nodes - 1 if degree is None else int(degree)
    return {
        "sign": 3 * nodes,
        "verify": 2 * k * nodes,
        "x25519": 2 * k * nodes,
        "x25519_load": 2 * nodes,
        "prg_values": (k + 2) * nodes * values,
    }


class _Meter:
    """CPU seconds of the process tree around every aggregation and every exchange of messages."""

    def __init__(self) -> None:
        self.runs: list[dict] = []
        self.stages: dict[str, float] = {}

    def install(self):
        import privfed.flower.secagg as secagg
        import privfed.flower.server_app as server_app
        import privfed.flower.server_plain as server_plain
        import privfed.flower.server_secure as server_secure
        import privfed.flower.transport as transport

        original_serve, original_exchange = server_app.serve, transport.exchange

        def serve(grid, cfg, **kw):
            self.stages = {}
            load, c0, t0 = os.getloadavg()[0], tree_cpu(), time.perf_counter()
            res = original_serve(grid, cfg, **kw)
            self.runs.append(
                {
                    "cpu_s": tree_cpu() - c0,
                    "wall_s": time.perf_counter() - t0,
                    "load_average": round(load, 2),
                    "stage_cpu_s": dict(self.stages),
                }
            )
            return res

        def exchange(grid, contents, message_type, *a, **kw):
            c0 = tree_cpu()
            out = original_exchange(grid, contents, message_type, *a, **kw)
            name = message_type.removeprefix("query.")
            self.stages[name] = self.stages.get(name, 0.0) + tree_cpu() - c0
            return out

        saved = [(server_app, "serve", original_serve)]
        server_app.serve = serve
        for m in (transport, secagg, server_plain, server_secure):
            if hasattr(m, "exchange"):
                saved.append((m, "exchange", m.exchange))
                m.exchange = exchange
        return saved

    @staticmethod
    def uninstall(saved) -> None:
        for m, name, value in saved:
            setattr(m, name, value)


def _threshold(rep: dict):
    sa = rep.get("secure_aggregation")
    rounds = sa.get("rounds") if isinstance(sa, dict) else None
    return rounds[0].get("threshold") if rounds else None


def _row(name: str, cfg: FlowerConfig, res, meter: dict) -> dict:
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
        **meter,
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
    """Mean bytes of a virtual node's ``context.state`` at the end, as Flower counts record bytes."""
    from privfed.flower.wire import record_bytes

    sizes = [
        record_bytes(info.context.state)
        for store in stores
        for node in store.values()
        for info in node.run_infos.values()
    ]
    return float(np.mean(sizes)) if sizes else 0.0


def _simulate(cfgs: list[FlowerConfig], num_cpus: int, traced: bool):
    """One simulation of ``cfgs`` in order; returns (results, per-run meter entries, wall seconds, contexts)."""
    meter = _Meter()
    saved = meter.install()
    stores, original = _capture_node_contexts()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out = run_simulation(cfgs, num_cpus=num_cpus)
    finally:
        from flwr.server.superlink.fleet.vce import vce_api

        vce_api._register_node_info_stores = original
        meter.uninstall(saved)
        if traced:
            tracemalloc.stop()
    for cfg, res in zip(cfgs, out):
        if isinstance(res, Exception):
            raise RuntimeError(f"{cfg.secure} run at {cfg.clients} nodes failed: {res}")
    return out, meter.runs, time.perf_counter() - t0, _context_bytes(stores)


def timed_point(nodes: int, dim: int, degree: int | None, num_cpus: int, repeats: int) -> dict:
    """One simulation: a warm-up plain run, then ``repeats`` rounds of plain, masked and Flower SecAgg+ (the
    order rotating), each round beside the unit times of the floor's operations."""
    cfgs = [_configs(nodes, dim, degree, r) for r in range(repeats)]
    order = [list(RUNS[r % 3 :] + RUNS[: r % 3]) for r in range(repeats)]
    seq = [cfgs[0]["plain"]] + [cfgs[r][name] for r, names in enumerate(order) for name in names]
    units = []
    # the unit times are measured in this process before the simulation starts and after it ends (the
    # ServerApp's thread shares this process with the engine while it runs)
    units.append(unit_seconds(values=CLASSES * (dim + 1)))
    out, meters, wall, ctx = _simulate(seq, num_cpus, traced=False)
    units.append(unit_seconds(values=CLASSES * (dim + 1)))
    unit = {op: float(np.mean([u[op] for u in units])) for op in OPS}
    values = CLASSES * (dim + 1)
    counts = floor_counts(nodes, degree, values)
    rounds, i = [], 1
    for r, names in enumerate(order):
        got = {}
        for name in names:
            got[name] = _row(name, cfgs[r][name], out[i], meters[i])
            got[name + "_head"] = out[i].head.weight
            i += 1
        p, m, f = got["plain"], got["masked"], got["flwr"]
        floor, terms = floor_seconds(p["cpu_s"], counts, unit)
        trip = m["stage_cpu_s"].get("consistency", 0.0)
        extra = len(m["stage_cpu_s"]) - len(p["stage_cpu_s"])  # round trips beyond the plain run's one
        rounds.append(
            {
                "order": names,
                "load_average": [got[n]["load_average"] for n in names],
                "plain": p,
                "masked": m,
                "flwr": f,
                "floor_terms_s": terms,
                "floor_cpu_s": floor,
                "round_trip_cpu_s": trip,
                "extra_round_trips": extra,
                "floor_with_round_trips_cpu_s": floor + extra * trip,
                "ratio": m["cpu_s"] / floor,
                "ratio_with_round_trips": m["cpu_s"] / (floor + extra * trip),
                "ratio_to_plain": m["cpu_s"] / p["cpu_s"],
                "flwr_ratio": f["cpu_s"] / floor,
                "masked_to_flwr": m["cpu_s"] / f["cpu_s"],
                "max_abs_head_diff": float(np.abs(got["plain_head"] - got["masked_head"]).max()),
                "flwr_max_abs_head_diff": float(np.abs(got["plain_head"] - got["flwr_head"]).max()),
            }
        )
        print(
            f"  [{nodes} nodes] plain {p['cpu_s']:.1f} s, masked {m['cpu_s']:.1f} s, Flower SecAgg+ "
            f"{f['cpu_s']:.1f} s CPU; floor {floor:.1f} s ({m['cpu_s'] / floor:.2f}x), with "
            f"{extra} more round trips at {trip:.1f} s: {m['cpu_s'] / (floor + extra * trip):.2f}x",
            flush=True,
        )
    return {
        "nodes": nodes,
        "simulation_wall_s": wall,
        "unit_s": unit,
        "counts": counts,
        "upload_bytes": 8 * values,
        "node_context_bytes": ctx,
        "rounds": rounds,
        "ratio": spread([r["ratio"] for r in rounds]),
        "ratio_with_round_trips": spread([r["ratio_with_round_trips"] for r in rounds]),
        "flwr_ratio": spread([r["flwr_ratio"] for r in rounds]),
        "masked_to_flwr": spread([r["masked_to_flwr"] for r in rounds]),
    }


def memory_point(nodes: int, dim: int, degree: int | None, num_cpus: int) -> dict:
    """A traced simulation: the process's peak of a plain and a masked run above where each began."""
    cfgs = _configs(nodes, dim, degree)
    seq = [cfgs["plain"], cfgs["plain"], cfgs["masked"]]
    out, meters, wall, ctx = _simulate(seq, num_cpus, traced=True)
    plain, masked = (_row(n, cfgs[n], r, m) for n, r, m in zip(("plain", "masked"), out[1:], meters[1:]))
    return {
        "nodes": nodes,
        "traced": True,
        "plain": plain,
        "masked": masked,
        "upload_bytes": 8 * CLASSES * (dim + 1),
        "node_context_bytes": ctx,
    }


def slope(points: list[dict], run: str, key: str) -> float:
    """Least-squares slope of ``points[i][run][key]`` (bytes) against the number of nodes."""
    n = np.array([p["nodes"] for p in points], dtype=float)
    y = np.array([p[run][key] for p in points], dtype=float)
    return float(np.polyfit(n, y, 1)[0]) if len(points) > 1 else float("nan")


def run(
    timing_nodes: int,
    memory_nodes: list[int],
    dim: int,
    degree: int | None,
    num_cpus: int,
    repeats: int,
    runs: int,
) -> dict:
    from privfed.flower.runtime_env import ray_inline_bytes

    inline = ray_inline_bytes()  # the limit every simulation below runs with (refused before any run if bad)
    timed = []
    for i in range(runs):
        print(f"run {i + 1} of {runs}: {timing_nodes} nodes, timed simulation ...", flush=True)
        timed.append(timed_point(timing_nodes, dim, degree, num_cpus, repeats))
    memory = []
    for n in memory_nodes:
        print(f"[{n} nodes] traced simulation ...", flush=True)
        memory.append(memory_point(n, dim, degree, num_cpus))
    medians = [t["ratio"]["median"] for t in timed]
    return {
        "config": {
            "timing_nodes": timing_nodes,
            "memory_nodes": memory_nodes,
            "dim": dim,
            "classes": CLASSES,
            "degree": degree,
            "num_cpus": num_cpus,
            "repeats": repeats,
            "runs": runs,
            "flwr_clip": FLWR_CLIP,
            "samples": SAMPLES,
            # Ray's inline limit the simulations ran with (privfed's default, or the environment's own)
            "ray_inline_bytes": inline,
        },
        "timed": timed,
        "agreement": max(medians) / min(medians) - 1.0,
        "memory": memory,
        "process_peak_slope_bytes_per_node": {
            r: slope(memory, r, "process_peak_bytes") for r in ("plain", "masked")
        },
    }


def render(res: dict) -> str:
    rows = [
        {
            "run": i + 1,
            "order": "/".join(r["order"]),
            "plain s": r["plain"]["cpu_s"],
            "masked s": r["masked"]["cpu_s"],
            "Flower SecAgg+ s": r["flwr"]["cpu_s"],
            "floor s": r["floor_cpu_s"],
            "masked / floor": r["ratio"],
            "with round trips": r["ratio_with_round_trips"],
        }
        for i, t in enumerate(res["timed"])
        for r in t["rounds"]
    ]
    cols = [
        "run",
        "order",
        "plain s",
        "masked s",
        "Flower SecAgg+ s",
        "floor s",
        "masked / floor",
        "with round trips",
    ]
    return markdown(rows, cols, ".3g") + f"\n\nruns agree within {res['agreement']:.1%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timing-nodes", type=count(3), default=1000, help="simulated nodes of the timed point")
    p.add_argument(
        "--memory-nodes",
        type=int_list(3),
        default="250,500,1000",
        help="simulated nodes of the traced points",
    )
    p.add_argument(
        "--dim",
        type=count(1),
        default=5120,
        help="feature dimension D (C = 10 classes: 51,210 values a node)",
    )
    p.add_argument("--degree", type=degree, default="20", help="SecAgg+ degree k (even), or 'complete'")
    p.add_argument("--num-cpus", type=count(1), default=2, help="CPUs Ray may use for the nodes")
    p.add_argument(
        "--repeats", type=count(1), default=2, help="rounds of plain, masked and Flower SecAgg+ runs"
    )
    p.add_argument("--runs", type=count(1), default=2, help="independent timed simulations recorded")
    p.add_argument("--out", type=out_path, default="results/bench_flower_masked")
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_flower_masked.json")
    args = p.parse_args(argv)
    memory_nodes, degree_k = args.memory_nodes, args.degree
    if degree_k is not None and degree_k >= min([args.timing_nodes, *memory_nodes]):
        p.error(
            f"--degree {degree_k} must be below every node count (--timing-nodes, --memory-nodes): a node has "
            "at most K - 1 neighbours; use 'complete' for the complete graph"
        )
    res = run(args.timing_nodes, memory_nodes, args.dim, degree_k, args.num_cpus, args.repeats, args.runs)
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
    from privfed.commands.start import run_script

    run_script(main)
