"""Ready-made trade-off recipes on the embedded default; each writes CSV, JSON and a PNG.

    python experiments/recipes.py fedlog-dp       # FedLog under DP: central vs local vs secure-sum noise, classic vs analytic
    python experiments/recipes.py record-dp       # FedCOF vs Fed3R vs FedNCM (and fed3r-within) under record-level DP
    python experiments/recipes.py count-noise     # FedCOF App. I.1: count noise only (uniform variant: NO DP)
    python experiments/recipes.py all

Outputs go to ``results/recipes/<name>/`` (``--out`` to change); an existing
non-empty folder is refused unless ``--overwrite``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from privfed.commands.common import HelpFormatter, OutputDir, Parser, cli_entry, versions
from privfed.tradeoff import TradeoffConfig, run_tradeoff, summarise

EPS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, math.inf)
BASE = TradeoffConfig(epsilons=EPS, seeds=tuple(range(5)), clients=100, alpha=0.1, plot=False)

RECIPES: dict[str, dict] = {
    "fedlog-dp": {
        "title": "FedLog under Gaussian DP (record level, digits, 100 clients)",
        "variants": {
            "central noise, analytic (trusted aggregator)": replace(
                BASE, methods=("fedlog",), trusted_aggregator=True
            ),
            "central noise, classic bound (FedLog paper)": replace(
                BASE, methods=("fedlog",), trusted_aggregator=True, calibration="classic"
            ),
            "noise split under secure aggregation (mask)": replace(
                BASE, methods=("fedlog",), secure_agg="mask"
            ),
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
                BASE, methods=("fedcof",), count_noise=kind, epsilons=(0.05, 0.1, 0.2, 0.5, 0.9, math.inf)
            )
            for kind in ("laplace", "geometric", "gaussian", "uniform")
        },
    },
}


def run_recipe(name: str, out: OutputDir, progress: bool = True) -> list[dict]:
    """Run every variant of a recipe; write ``<name>.csv``, ``.json`` and ``.png`` into ``out`` atomically."""
    recipe = RECIPES[name]
    rows, configs, num_classes = [], {}, None
    for label, cfg in recipe["variants"].items():
        res = run_tradeoff(cfg, progress=progress)
        configs[label] = asdict(res["config"])
        num_classes = res["dataset"]["num_classes"]
        for r in res["records"]:
            rows.append({"variant": label, **r})
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out.write_csv(f"{name}.csv", rows, keys)
    out.write_json(
        f"{name}.json", {"recipe": name, "configs": configs, "versions": versions(), "records": rows}
    )
    plot_recipe((out, f"{name}.png"), rows, recipe["title"], num_classes=num_classes)
    return rows


def _variant_label(label: str, rows: list[dict]) -> str:
    """The legend entry: the variant, its placement / protocol / calibration / delta as the records state them."""
    fin = [r for r in rows if math.isfinite(r["epsilon"])]
    if not fin:
        return label
    r = fin[0]
    if not r.get("private", True):
        return (
            f"{label} (x = nominal parameter)"
            if "NO DP" in label
            else f"{label} — NO DP GUARANTEE (x = nominal parameter)"
        )
    proto = f", {r['protocol']}" if r.get("protocol", "none") != "none" else ""
    return f"{label} [{r['placement']}{proto}; {r['calibration']}; delta={r['delta']:g}]"


def plot_recipe(path, rows: list[dict], title: str, *, num_classes: int | None = None) -> None:
    """Accuracy against the epsilon the ledger computes, one curve per variant (``path``: file or (OutputDir, name))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from privfed.tradeoff import accuracy_axis

    fig, ax = plt.subplots(figsize=(10, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ticks: set[float] = set()
    seeds = 1
    for i, label in enumerate(dict.fromkeys(r["variant"] for r in rows)):
        vrows = [r for r in rows if r["variant"] == label]
        summ = summarise(vrows)
        fin = sorted((s for s in summ if math.isfinite(s["epsilon"])), key=lambda s: s["epsilon"])
        private = all(s.get("private", True) for s in fin)
        # x: the epsilon the ledger reports (classic calibration differs from the target); a variant
        # without a guarantee is drawn apart (dotted, hollow markers) at its nominal parameter.
        x = np.array([s["epsilon_reported"] if private else s["epsilon"] for s in fin])
        ticks.update(x.tolist())
        mu = np.array([s["accuracy_mean"] for s in fin])
        sd = np.array([s["accuracy_std"] for s in fin])
        seeds = max(seeds, *(s["seeds"] for s in fin))
        c = colors[i % len(colors)]
        ax.plot(
            x,
            mu,
            marker="o" if private else "x",
            ms=5 if private else 7,
            color=c,
            mfc=c if private else "none",
            label=_variant_label(label, vrows),
            ls="-" if private else ":",
        )
        ax.fill_between(x, mu - sd, mu + sd, color=c, alpha=0.15, lw=0)
        ax.axhline(summ[0]["nonprivate_mean"], color=c, ls=(0, (6, 3)), lw=0.8)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="0.3", ls=(0, (6, 3)), lw=0.8))
    labels.append("non-private (same color)")
    accuracy_axis(ax, handles, labels, ticks, band_seeds=seeds, num_classes=num_classes)
    ax.set_xlabel(
        "epsilon computed by the ledger (log scale; NO-DP variants at their nominal parameter)", fontsize=8
    )
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.6, 0.9), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.6, 1))
    if isinstance(path, tuple):
        out, name = path
        out.save_figure(name, fig, dpi=130, bbox_inches="tight")
    else:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _body(argv=None) -> int:
    p = Parser(
        prog="python experiments/recipes.py",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    p.add_argument("recipe", choices=[*RECIPES, "all"], help="which recipe to run")
    p.add_argument("--out", default="results/recipes", help="parent folder; each recipe writes <out>/<name>/")
    p.add_argument(
        "--overwrite", action="store_true", help="replace a previous run of the recipe in its folder"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write experiments/results/recipes.json (per variant and eps: mean, std, ledger eps), "
        "the record the README's readings are checked against",
    )
    args = p.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore", UserWarning)
    record: dict[str, dict] = {}
    for name in RECIPES if args.recipe == "all" else [args.recipe]:
        out = OutputDir(Path(args.out) / name, name, overwrite=args.overwrite)
        try:
            rows = run_recipe(name, out, progress=not args.quiet)
            out.finish(f"python experiments/recipes.py {name}", complete=True)
        except BaseException:
            if not out.written:
                out.abandon()
            raise
        for label in dict.fromkeys(r["variant"] for r in rows):
            summ = summarise([r for r in rows if r["variant"] == label])
            cells = ", ".join(f"eps={s['epsilon']:g}: {s['accuracy_mean']:.3f}" for s in summ)
            print(f"{name} | {label} | {cells}")
            record.setdefault(name, {})[label] = [
                {
                    k: s[k]
                    for k in (
                        "epsilon",
                        "epsilon_reported",
                        "accuracy_mean",
                        "accuracy_std",
                        "seeds",
                        "nonprivate_mean",
                        "placement",
                        "calibration",
                        "private",
                    )
                }
                for s in summ
            ]
        print(f"wrote {out.path}/: {', '.join(out.files())}")
    if args.record:
        save_record(record, args.recipe)
    return 0


def save_record(record: dict, which: str) -> None:
    """Merge this run's summaries into experiments/results/recipes.json (one entry per recipe)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments import recorded

    try:
        data = recorded.load("recipes")["data"]
    except recorded.MissingRecord:
        data = {}
    data.update(record)
    cmd = (
        "python experiments/recipes.py all --record"
        if set(data) >= set(RECIPES)
        else f"python experiments/recipes.py {which} --record"
    )
    print(f"recorded {recorded.save('recipes', data, cmd)}")


main = cli_entry("python experiments/recipes.py", _body)

if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
