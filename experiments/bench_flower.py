"""Benchmark of privfed on Flower's simulation engine: start-up, bytes on the wire, scale, server memory.

Measurements (the first three one Flower simulation (Ray) of the privfed app each; the last two
run the real ClientApp and server over the in-process grid, ``privfed.flower.local.LocalGrid``):

1. **start-up and bytes per method** (``--clients`` nodes, digits, d = 64):
   every method plain, fedncm / fed3r / fedcof under pairwise masking and
   fedncm / fedcof under CKKS, in one simulation; the wall time minus the server time of every run but
   the first is the time to the first head (Ray, actors, node imports and
   data loading, then one run).  Bytes are what
   the nodes' replies carried (Flower's ``count_bytes`` of every record),
   against ``fit``'s model of the upload (4 bytes a float).
2. **scale**: fedncm on ``synthetic:64:20`` data (20 samples a node) with
   ``--scale`` nodes (default 10, 100, 1000), one simulation each: wall
   time, server time, and the head's agreement with a direct sum.
3. **server memory against d^2**: fed3r (sums + d x d second moment) on
   ``synthetic:D:20`` for D in ``--dims`` with a fixed number of nodes, and
   for the largest D with twice the nodes: the traced peak of the server
   process (tracemalloc over the server thread; Flower's in-memory link
   state included) next to d^2 * 8 bytes and K d^2 * 8 bytes, which is what
   holding every reply would cost.

4. **bytes per protocol** (fedncm, fed3r; ``--clients`` digits nodes):
   plain float64, the compact layout (float32, held classes only without
   DP), local DP, pairwise masking, masking with distributed DP noise, CKKS,
   Flower's SecAgg+: bytes up per node against plain float64 in the same
   run, fit's byte model and the payload the nodes' arrays carried, and the
   server's seconds per run (median of ``--reps``; no Ray).
5. **end-to-end audits** of the Flower DP paths (``privfed.audit.audit_release``
   driving the ClientApp): local, trusted-aggregator and distributed
   (masking) noise, and halved noise on the nodes: claimed mu, mu lower
   bound, draws, seconds.

Prints markdown tables and writes ``results.json`` under ``--out``.

Run: ``python experiments/bench_flower.py [--clients 10] [--scale 10,100,1000] [--dims 64,256,512,1024]
[--skip methods,scale,memory,protocols,audit] [--out results/bench_flower]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time
import tracemalloc

import numpy as np

os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from experiments.flag_types import count, int_list, name_list, out_path  # noqa: E402
from privfed.flower import FlowerConfig, run_simulation  # noqa: E402
from privfed.flower.node import load_node_data  # noqa: E402
from privfed.methods import available  # noqa: E402


def _sim(cfgs, num_cpus):
    t0 = time.perf_counter()
    out = run_simulation(cfgs, num_cpus=num_cpus)
    return out, time.perf_counter() - t0


def bench_methods(K: int, num_cpus: int) -> dict:
    # Generous stage timeouts: on a loaded machine the first stage waits for every actor to start.
    slow = dict(clients=K, timeout=900.0, connect_timeout=900.0)
    cfgs = [FlowerConfig(method=m, **slow) for m in available()]
    cfgs += [FlowerConfig(method=m, secure="mask", **slow) for m in ("fedncm", "fed3r", "fedcof")]
    cfgs += [FlowerConfig(method=m, secure="ckks", **slow) for m in ("fedncm", "fedcof")]
    cfgs += [FlowerConfig(method=m, wire="compact", **slow) for m in ("fedncm", "fed3r")]
    cfgs += [FlowerConfig(method="fedncm", secure="mask", epsilon=1.0, clip=10.0, **slow)]
    cfgs += [
        FlowerConfig(method=m, secure="flwr-secaggplus-insecure", clip=10.0, max_records=1000, **slow)
        for m in ("fedncm", "fed3r")
    ]
    out, wall = _sim(cfgs, num_cpus)
    rows, server = [], 0.0
    for cfg, res in zip(cfgs, out):
        if isinstance(res, Exception):
            rows.append({"method": cfg.method, "secure": cfg.secure, "error": str(res)})
            continue
        server += res.report["seconds"]["total"]
        model = res.report["upload_bytes_model"]
        rows.append(
            {
                "method": cfg.method,
                "secure": cfg.secure,
                "wire": cfg.wire,
                "dp": "distributed"
                if cfg.private and cfg.secure != "none"
                else ("local" if cfg.private else ""),
                "wire_bytes_up_per_node": res.report["wire"]["bytes_up_per_node"],
                "fit_model_bytes_per_client": model.get("per_client") if cfg.secure == "none" else None,
                "server_seconds": res.report["seconds"]["total"],
            }
        )
    later = sum(r.get("server_seconds", 0.0) for r in rows[1:])
    # Time to the first head: Ray, actors, node imports and data loading, then one run.
    return {
        "clients": K,
        "simulation_wall_s": wall,
        "server_s": server,
        "first_head_s": wall - later,
        "runs": rows,
    }


def bench_scale(sizes: list[int], num_cpus: int) -> list[dict]:
    rows = []
    for K in sizes:
        cfg = FlowerConfig(
            method="fedncm", clients=K, dataset="synthetic:64:20", timeout=1800.0, connect_timeout=600.0
        )
        res, wall = _sim(cfg, num_cpus)
        # The same statistics summed directly: every node's data is reproducible from its id.
        S = np.zeros((10, 64))
        N = np.zeros(10)
        for i in range(K):
            nd = load_node_data({"partition-id": i, "num-partitions": K}, cfg)
            np.add.at(S, nd.labels, nd.features)
            N += np.bincount(nd.labels, minlength=10)
        mu = S / N[:, None]
        ref = mu / np.linalg.norm(mu, axis=1, keepdims=True)
        rows.append(
            {
                "clients": K,
                "simulation_wall_s": wall,
                "server_s": res.report["seconds"]["total"],
                "query_stage_s": res.report["wire"]["stages"]["query"]["seconds"],
                "wire_bytes_up_per_node": res.report["wire"]["bytes_up_per_node"],
                "max_abs_diff_vs_direct_sum": float(np.abs(res.head.weight - ref).max()),
            }
        )
    return rows


def bench_memory(dims: list[int], K: int, num_cpus: int) -> list[dict]:
    cfgs = [FlowerConfig(method="fed3r", clients=K, dataset=f"synthetic:{d}:20", timeout=900.0) for d in dims]
    cfgs.append(
        FlowerConfig(method="fed3r", clients=2 * K, dataset=f"synthetic:{dims[-1]}:20", timeout=900.0)
    )
    tracemalloc.start()
    try:
        out, _ = _sim(cfgs, num_cpus)
    finally:
        tracemalloc.stop()
    rows = []
    for cfg, res in zip(cfgs, out):
        d = int(cfg.dataset.split(":")[1])
        if isinstance(res, Exception):
            rows.append({"d": d, "clients": cfg.clients, "error": str(res)})
            continue
        peak = res.report["server_peak_traced_bytes"]
        rows.append(
            {
                "d": d,
                "clients": cfg.clients,
                "server_peak_traced_bytes": peak,
                "d2_bytes": 8 * d * d,
                "K_d2_bytes": 8 * cfg.clients * d * d,
                "peak_over_d2": peak / (8 * d * d),
            }
        )
    return rows


_PROTOCOLS = [
    ("plain float64", {}),
    ("plain compact", {"wire": "compact"}),
    ("local DP, float64", {"epsilon": 1.0, "clip": 10.0}),
    ("local DP, compact", {"epsilon": 1.0, "clip": 10.0, "wire": "compact"}),
    ("mask", {"secure": "mask"}),
    ("mask + distributed DP", {"secure": "mask", "epsilon": 1.0, "clip": 10.0}),
    ("ckks", {"secure": "ckks"}),
    ("ckks + distributed DP", {"secure": "ckks", "epsilon": 1.0, "clip": 10.0}),
    ("flwr-secaggplus-insecure", {"secure": "flwr-secaggplus-insecure", "clip": 10.0, "max_records": 1000}),
]


def bench_protocols(K: int, reps: int) -> list[dict]:
    import logging
    import warnings

    from privfed.flower import serve
    from privfed.flower.local import LocalGrid

    logging.getLogger("flwr").setLevel(logging.ERROR)
    nodes = {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}
    rows = []
    for method in ("fedncm", "fed3r"):
        base = None
        for name, kw in _PROTOCOLS:
            times, res = [], None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(reps):
                    t0 = time.perf_counter()
                    res = serve(LocalGrid(nodes), FlowerConfig(method=method, clients=K, timeout=120.0, **kw))
                    times.append(time.perf_counter() - t0)
            up = res.report["wire"]["bytes_up_per_node"]
            base = up if base is None else base
            pv = res.report.get("payload_vs_model") or {}
            rows.append(
                {
                    "method": method,
                    "protocol": name,
                    "bytes_up_per_node": up,
                    "vs_plain_float64": up / base,
                    "fit_model_bytes_per_node": pv["model_bytes"] / K if pv else None,
                    "payload_bytes_per_node": pv["payload_bytes"] / K if pv else None,
                    "epsilon": None if res.head.privacy is None else res.head.privacy.epsilon,
                    "server_s_median": float(np.median(times)),
                }
            )
    return rows


def bench_audit(draws: int) -> list[dict]:
    import contextlib
    import warnings

    from privfed.audit import audit_release, neighbour_battery
    from privfed.flower.audit import flower_release, halved_noise_nodes

    record, client = neighbour_battery("record"), neighbour_battery("client")
    cases = [
        ("local", {}, record[1], False),
        ("trusted aggregator (central)", {"trusted_aggregator": True}, record[1], False),
        ("distributed, masking", {"secure": "mask"}, record[1], False),
        (
            "distributed, masking, client level",
            {"secure": "mask", "level": "client", "max_records": 20},
            client[1],
            False,
        ),
        ("BROKEN halved noise, local", {}, record[1], True),
        ("BROKEN halved noise, masking", {"secure": "mask"}, record[1], True),
    ]
    rows = []
    for name, kw, pair, broken in cases:
        t0 = time.perf_counter()
        with warnings.catch_warnings(), halved_noise_nodes() if broken else contextlib.nullcontext():
            warnings.simplefilter("ignore")
            r = audit_release(
                flower_release("fedncm", epsilon=4.0, clip=3.0, **kw),
                [pair],
                draws=draws,
                heldout=draws // 2,
                meta_draws=2,
            )[0]
        rows.append(
            {
                "path": name,
                "pair": r.pair,
                "claimed_eps": r.claimed_eps,
                "claimed_mu": r.claimed_mu,
                "mu_lb": r.mu_lb,
                "draws": r.draws,
                "flagged": r.flagged,
                "seconds": time.perf_counter() - t0,
            }
        )
    return rows


#: The benchmark's parts, in the order they run (``--skip`` names any of them).
PARTS = ("methods", "scale", "memory", "protocols", "audit")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=count(2), default=10)
    p.add_argument("--scale", type=int_list(1), default="10,100,1000")
    p.add_argument("--dims", type=int_list(1), default="64,256,512,1024")
    p.add_argument("--memory-clients", type=count(2), default=20)
    p.add_argument("--num-cpus", type=count(1), default=2)
    p.add_argument("--reps", type=count(1), default=3, help="protocols part: runs per configuration (median)")
    p.add_argument("--audit-draws", type=count(1), default=150, help="audit part: fresh draws per side")
    p.add_argument(
        "--skip",
        type=name_list(PARTS, empty=True),
        default="",
        help="comma-separated parts to skip: " + ",".join(PARTS),
    )
    p.add_argument("--out", type=out_path, default="results/bench_flower")
    p.add_argument(
        "--record",
        action="store_true",
        help="also merge the parts that ran into experiments/results/bench_flower.json, "
        "the record the README's Flower figures are checked against",
    )
    args = p.parse_args(argv)
    skip = set(args.skip)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "config": vars(args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    if "methods" not in skip:
        res["methods"] = bench_methods(args.clients, args.num_cpus)
        m = res["methods"]
        print(f"\n## Start-up and bytes ({m['clients']} nodes, digits d = 64)\n")
        print(
            f"simulation wall {m['simulation_wall_s']:.1f} s, server {m['server_s']:.1f} s, "
            f"first head after {m['first_head_s']:.1f} s (start-up + one run)\n"
        )
        print(
            markdown(
                m["runs"],
                [
                    "method",
                    "secure",
                    "wire",
                    "dp",
                    "wire_bytes_up_per_node",
                    "fit_model_bytes_per_client",
                    "server_seconds",
                    "error",
                ],
                ".4g",
            )
        )
    if "scale" not in skip:
        res["scale"] = bench_scale(args.scale, args.num_cpus)
        print("\n## Scale (fedncm, synthetic d = 64, 20 samples a node)\n")
        print(
            markdown(
                res["scale"],
                [
                    "clients",
                    "simulation_wall_s",
                    "server_s",
                    "query_stage_s",
                    "wire_bytes_up_per_node",
                    "max_abs_diff_vs_direct_sum",
                ],
                ".4g",
            )
        )
    if "memory" not in skip:
        res["memory"] = bench_memory(args.dims, args.memory_clients, args.num_cpus)
        print("\n## Server memory against d^2 (fed3r, synthetic)\n")
        print(
            markdown(
                res["memory"],
                [
                    "d",
                    "clients",
                    "server_peak_traced_bytes",
                    "d2_bytes",
                    "K_d2_bytes",
                    "peak_over_d2",
                    "error",
                ],
                ".4g",
            )
        )
    if "protocols" not in skip:
        res["protocols"] = bench_protocols(args.clients, args.reps)
        print(f"\n## Bytes per protocol ({args.clients} digits nodes, in-process grid)\n")
        print(
            markdown(
                res["protocols"],
                [
                    "method",
                    "protocol",
                    "bytes_up_per_node",
                    "vs_plain_float64",
                    "fit_model_bytes_per_node",
                    "payload_bytes_per_node",
                    "epsilon",
                    "server_s_median",
                ],
                ".4g",
            )
        )
    if "audit" not in skip:
        res["audit"] = bench_audit(args.audit_draws)
        print("\n## End-to-end audits of the Flower DP paths (fedncm, eps = 4)\n")
        print(
            markdown(
                res["audit"],
                ["path", "pair", "claimed_eps", "claimed_mu", "mu_lb", "draws", "flagged", "seconds"],
                ".4g",
            )
        )
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"\nwritten {out / 'results.json'}")
    if args.record:
        record(res, argv)
    return 0


def record(res: dict, argv) -> None:
    """Merge the parts this run measured into the record, each part with the command that measured it."""
    from experiments import recorded

    try:
        data = recorded.load("bench_flower")["data"]
    except recorded.MissingRecord:
        data = {}
    cmd = recorded.command("-m experiments.bench_flower", argv)
    for part in ("methods", "scale", "memory", "protocols", "audit"):
        if part in res:
            data[part] = {
                "command": cmd,
                "machine": recorded.machine(),
                "config": res["config"],
                "rows": res[part],
            }
    print(f"recorded {recorded.save('bench_flower', data, cmd)}")


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
