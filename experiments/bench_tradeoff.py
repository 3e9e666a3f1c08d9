"""Benchmark: a 5-method x 10-eps x 5-seed trade-off sweep on the embedded default.

Measures the sweep as ``python -m privfed.tradeoff`` runs it (client
statistics computed once per seed and method, then released at every budget)
against a baseline measured in the same run: the naive loop that calls
``privfed.fit`` once per (method, eps, seed) and so recomputes the clipped
statistics every time.  Features come from the cache (the first run trains
the backbone and is excluded: it is warmed up before timing).

    python experiments/bench_tradeoff.py [--out results/bench_tradeoff]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import privfed
from privfed.commands.common import write_json
from privfed.data import load_dataset
from privfed.federation import partition
from privfed.release.settings import make_privacy
from privfed.tradeoff import TradeoffConfig, digits_public_clip, run_tradeoff

METHODS = ("fedncm", "fed3r", "fedcof", "fedcgs", "fedlog")
EPS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, math.inf)


def naive(cfg: TradeoffConfig) -> float:
    """One privfed.fit per run: statistics recomputed for every budget."""
    ds = load_dataset("digits")
    clip = digits_public_clip()
    t0 = time.perf_counter()
    for seed in cfg.seeds:
        part = partition(ds.train_labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=seed)
        F, y, k = part.apply(ds.train_features, ds.train_labels)
        for m in cfg.methods:
            method = privfed.methods.get(m)
            for eps in cfg.epsilons:
                privacy = None if math.isinf(eps) else make_privacy(cfg, method, eps, clip)
                head = privfed.fit(
                    m,
                    F,
                    y,
                    k,
                    num_classes=ds.num_classes,
                    num_clients=part.num_clients,
                    privacy=privacy,
                    random_state=seed,
                )
                head.score(ds.test_features, ds.test_labels)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/bench_tradeoff")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--record",
        action="store_true",
        help="also write experiments/results/bench_tradeoff.json, the record the README's table is checked against",
    )
    args = p.parse_args(argv)
    if args.repeats < 1:  # 0 or fewer ran nothing and printed NaN (or failed) with exit 0
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    cfg = TradeoffConfig(methods=METHODS, epsilons=EPS, seeds=tuple(range(5)), plot=False)
    warnings.simplefilter("ignore")
    run_tradeoff(
        TradeoffConfig(methods=("fedncm",), epsilons=(1.0,), seeds=(0,)), progress=False
    )  # warm caches
    from threadpoolctl import threadpool_limits

    sweep_s, naive_s, naive1_s = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        res = run_tradeoff(cfg, progress=False)
        sweep_s.append(time.perf_counter() - t0)
        naive_s.append(naive(cfg))
        with threadpool_limits(limits=1, user_api="blas"):
            naive1_s.append(naive(cfg))
    runs = len(res["records"])
    med = lambda xs: float(np.median(xs))  # noqa: E731
    row = {
        "runs": runs,
        "sweep_s_median": med(sweep_s),
        "naive_s_median": med(naive_s),
        "naive_1thread_s_median": med(naive1_s),
        "speedup": med(naive_s) / med(sweep_s),
        "speedup_vs_1thread": med(naive1_s) / med(sweep_s),
        "sweep_s": sweep_s,
        "naive_s": naive_s,
        "naive_1thread_s": naive1_s,
        "repeats": args.repeats,
    }
    print(
        "| sweep (250 runs: 5 methods x 10 eps x 5 seeds, digits, 100 clients) | median s | ratio to tradeoff |"
    )
    print("| --- | --- | --- |")
    print(
        f"| `privfed.tradeoff` (statistics once per seed and method) | {row['sweep_s_median']:.2f} | 1.00 |"
    )
    print(
        f"| baseline: `privfed.fit` per run, default BLAS threads | {row['naive_s_median']:.2f} | "
        f"{row['speedup']:.2f} |"
    )
    print(
        f"| baseline: `privfed.fit` per run, one BLAS thread | {row['naive_1thread_s_median']:.2f} | "
        f"{row['speedup_vs_1thread']:.2f} |"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bench_tradeoff.json", row)  # atomic: a reader never sees half a file
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from experiments import recorded

        cmd = recorded.command("experiments/bench_tradeoff.py", argv)
        print(f"recorded {recorded.save('bench_tradeoff', row, cmd)}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
