"""Ready-made trade-off recipes on the embedded default; each writes CSV, JSON and a PNG.

    python experiments/recipes.py fedlog-dp       # FedLog under DP: central vs local vs secure-sum noise, classic vs analytic
    python experiments/recipes.py record-dp       # FedCOF vs Fed3R vs FedNCM (and fed3r-within) under record-level DP
    python experiments/recipes.py count-noise     # FedCOF App. I.1: count noise only (uniform variant: NO DP)
    python experiments/recipes.py all

Outputs go to ``results/recipes/<name>/`` (``--out`` to change); an existing
non-empty folder is refused unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from privfed._cli import prepare_out_dir, versions, write_json
from privfed.tradeoff import TradeoffConfig, run_tradeoff, summarise

EPS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, math.inf)
BASE = TradeoffConfig(epsilons=EPS, seeds=tuple(range(5)), clients=100, alpha=0.1, plot=False)

RECIPES: dict[str, dict] = {
    "fedlog-dp": {
        "title": "FedLog under Gaussian DP (record level, digits, 100 clients)",
        "variants": {
            "central noise, analytic (trusted aggregator)": replace(BASE, methods=("fedlog",), trusted_aggregator=True),
            "central noise, classic bound (FedLog paper)": replace(BASE, methods=("fedlog",), trusted_aggregator=True,
                                                                calibration="classic"),
            "noise split under secure aggregation (mask)": replace(BASE, methods=("fedlog",), secure_agg="mask"),
            "local noise (each client, no trust)": replace(BASE, methods=("fedlog",)),
        },
    },
    "record-dp": {
        "title": "Record-level DP, each client noises its upload (digits, 100 clients)",
        "variants": {m: replace(BASE, methods=(m,)) for m in ("fedcof", "fed3r", "fed3r-within", "fedncm")},
    },
    "count-noise": {
        "title": "FedCOF with noise on class counts only (App. I.1); means in clear",
        "variants": {
            f"{kind}" + (" (NO DP GUARANTEE)" if kind == "uniform" else ""): replace(
                BASE, methods=("fedcof",), count_noise=kind, epsilons=(0.05, 0.1, 0.2, 0.5, 0.9, math.inf))
            for kind in ("laplace", "geometric", "gaussian", "uniform")
        },
    },
}


def run_recipe(name: str, out: Path, progress: bool = True) -> list[dict]:
    recipe = RECIPES[name]
    rows, configs = [], {}
    for label, cfg in recipe["variants"].items():
        res = run_tradeoff(cfg, progress=progress)
        configs[label] = asdict(res["config"])
        for r in res["records"]:
            rows.append({"variant": label, **r})
    with (out / f"{name}.csv").open("w", newline="") as fh:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    write_json(out / f"{name}.json", {"recipe": name, "configs": configs, "versions": versions(), "records": rows})
    plot_recipe(out / f"{name}.png", rows, recipe["title"])
    return rows


def plot_recipe(path: Path, rows: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(dict.fromkeys(r["variant"] for r in rows)):
        summ = summarise([r for r in rows if r["variant"] == label])
        fin = sorted((s for s in summ if math.isfinite(s["epsilon"])), key=lambda s: s["epsilon"])
        # x: the epsilon the ledger reports (differs from the target for the classic bound); a variant
        # with no guarantee (reported inf) is drawn at its nominal parameter, and its label says NO DP.
        rep = [np.mean([r["epsilon_reported"] for r in rows if r["variant"] == label
                        and r["epsilon"] == s["epsilon"]]) for s in fin]
        x = np.array([e if math.isfinite(e) else s["epsilon"] for e, s in zip(rep, fin)])
        mu = np.array([s["accuracy_mean"] for s in fin])
        sd = np.array([s["accuracy_std"] for s in fin])
        c = colors[i % len(colors)]
        ax.plot(x, mu, "o-", ms=4, color=c, label=label, ls=":" if "NO DP" in label else "-")
        ax.fill_between(x, mu - sd, mu + sd, color=c, alpha=0.15, lw=0)
        ax.axhline(summ[0]["nonprivate_mean"], color=c, ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon reported by the ledger (log scale; NO-DP variants at their nominal value); "
                  "dashed: non-private", fontsize=8)
    ax.set_ylabel("test accuracy (mean ± std over 5 seeds)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", choices=[*RECIPES, "all"])
    p.add_argument("--out", default="results/recipes")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore", UserWarning)
    for name in RECIPES if args.recipe == "all" else [args.recipe]:
        out = prepare_out_dir(str(Path(args.out) / name), name, overwrite=args.overwrite)
        rows = run_recipe(name, out, progress=not args.quiet)
        for label in dict.fromkeys(r["variant"] for r in rows):
            summ = summarise([r for r in rows if r["variant"] == label])
            cells = ", ".join(f"eps={s['epsilon']:g}: {s['accuracy_mean']:.3f}" for s in summ)
            print(f"{name} | {label} | {cells}")
        print(f"wrote {out}/{name}.csv, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
