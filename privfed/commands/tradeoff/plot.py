"""The trade-off figure: accuracy against the ledger's epsilon, one panel per attack metric."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privfed.commands.tradeoff.config import PLACEMENT_LABEL, TradeoffConfig
from privfed.commands.tradeoff.table import headline_keys

__all__ = ["CHANCE", "accuracy_axis", "plot_title", "plot_tradeoff"]


def accuracy_axis(
    ax, handles: list, labels: list, ticks, *, band_seeds: int | None, num_classes: int | None
) -> None:
    """Finish an accuracy-against-epsilon axis the way every privfed plot does.

    Adds the legend entries for the ± 1 std band (when ``band_seeds``) and
    the chance line (when ``num_classes``), puts epsilon on a log axis with
    readable ticks at the budgets drawn and shows the whole accuracy range,
    so that small differences are not magnified.
    """
    from matplotlib.patches import Patch

    if band_seeds:
        handles.append(Patch(color="0.5", alpha=0.3, lw=0))
        labels.append(f"band: ± 1 std over {band_seeds} seeds")
    if num_classes:
        ax.axhline(1 / num_classes, color="0.4", ls=":", lw=1)
        handles.append(ax.lines[-1])
        labels.append(f"chance (1/{num_classes} classes)")
    ax.set_xscale("log")
    _eps_ticks(ax, sorted(ticks))
    ax.set_ylim(0, 1.02)


def _eps_ticks(ax, ticks: list[float]) -> None:
    """Label the budgets drawn (log axes otherwise crowd minor labels); pad a short range.

    Ticks closer than a factor 1.8 to the previous label are dropped, so that
    ledger epsilons next to the asked ones (classic calibration) stay readable.
    """
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    def rank(t: float) -> int:  # powers of ten first, then 2 and 5 times them, then one-digit values
        m = t / 10 ** math.floor(math.log10(t))
        close = lambda v: math.isclose(m, v, rel_tol=1e-9)  # noqa: E731
        return 0 if close(1) or close(10) else 1 if close(2) or close(5) else 2 if close(round(m, 1)) else 3

    kept: list[float] = []
    for t in sorted(ticks, key=lambda t: (rank(t), t)):  # round budgets first, others where there is room
        if all(max(t, k) / min(t, k) >= 1.8 for k in kept):
            kept.append(t)
    kept.sort()
    if kept:
        ax.xaxis.set_major_locator(FixedLocator(kept))
        ax.set_xticklabels([f"{t:.2g}" for t in kept])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        lo, hi = min(ticks), max(ticks)
        if hi / lo < 10:  # one or two budgets: keep them off the frame
            ax.set_xlim(lo / 2, hi * 2)


#: Reference value of each attack metric with no information (drawn as the chance line).
CHANCE = {"auc": 0.5, "presence_auc": 0.5, "delta_psnr": 0.0}


def _series_label(s: dict[str, Any], multi_placement: bool) -> str:
    label = s["method"]
    if multi_placement:
        label += f", {s.get('placement', '')}"
    if not s.get("private", True):
        label += " — NO DP GUARANTEE (x = nominal parameter)"
    return label


def plot_tradeoff(
    path: Path | tuple, summary: list[dict[str, Any]], title: str = "", *, num_classes: int | None = None
) -> None:
    """Accuracy against the ledger's epsilon (one curve per method x placement), one panel per attack metric.

    ``path`` is a file path, or ``(OutputDir, name)`` to write through the
    result folder (atomically).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attack_cols = [k for k in headline_keys(summary) if any(np.isfinite(s.get(k, np.nan)) for s in summary)]
    n = 1 + len(attack_cols)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n + 2.8, 4.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series = list(
        dict.fromkeys(
            (s["method"], s.get("placement", ""), bool(s.get("private", True)))
            for s in summary
            if math.isfinite(s["epsilon"])
        )
    )
    multi_placement = len({p for _, p, _ in series}) > 1
    methods = list(dict.fromkeys(s["method"] for s in summary))
    styles = {label: st for label, st in zip(PLACEMENT_LABEL.values(), ("-", "--", "-."))}
    markers = {label: mk for label, mk in zip(PLACEMENT_LABEL.values(), ("o", "s", "^"))}
    seeds = max((s["seeds"] for s in summary), default=1)

    def points(m, place, private, col):
        rows = [
            s
            for s in summary
            if s["method"] == m
            and s.get("placement", "") == place
            and bool(s.get("private", True)) == private
            and math.isfinite(s["epsilon"])
            and np.isfinite(s.get(col, np.nan))
        ]
        x = [s["epsilon_reported"] if private else s["epsilon"] for s in rows]
        order = np.argsort(x)
        return [rows[i] for i in order], np.asarray(x, float)[order]

    ax = axes[0, 0]
    ticks: set[float] = set()
    for m, place, private in series:
        c = colors[methods.index(m) % len(colors)]
        rows, x = points(m, place, private, "accuracy_mean")
        if not rows:
            continue
        ticks.update(x.tolist())
        mu = np.array([s["accuracy_mean"] for s in rows])
        sd = np.array([s["accuracy_std"] for s in rows])
        ls = styles.get(place, "-") if private else ":"
        ax.plot(
            x,
            mu,
            marker=markers.get(place, "o") if private else "x",
            ls=ls,
            color=c,
            ms=6 if private else 7,
            mfc=c if private else "none",
            label=_series_label(rows[0], multi_placement),
        )
        if len(x) > 1:
            ax.fill_between(x, mu - sd, mu + sd, color=c, alpha=0.15, lw=0)
        else:  # a single budget: the band is an error bar
            ax.errorbar(x, mu, yerr=sd, color=c, capsize=3, lw=1, ls="none")
    for i, m in enumerate(methods):
        base = [s["nonprivate_mean"] for s in summary if s["method"] == m]
        ax.axhline(
            base[0], color=colors[i % len(colors)], ls=(0, (6, 3)), lw=1, alpha=0.8, label=f"{m} non-private"
        )
    handles, labels = ax.get_legend_handles_labels()
    accuracy_axis(
        ax, handles, labels, ticks, band_seeds=seeds if seeds > 1 else None, num_classes=num_classes
    )
    ax.set_xlabel("epsilon computed by the ledger (log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_title("accuracy", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    for p, col in enumerate(attack_cols, start=1):
        ax2 = axes[0, p]
        metric = col.split("_", 2)[2]
        for m, place, private in series:
            c = colors[methods.index(m) % len(colors)]
            rows, x = points(m, place, private, col)
            if rows:
                ax2.plot(
                    x,
                    [s[col] for s in rows],
                    marker=markers.get(place, "o") if private else "x",
                    ls=styles.get(place, "-") if private else ":",
                    color=c,
                    ms=4,
                )
            clean = [
                s[col]
                for s in summary
                if s["method"] == m and not math.isfinite(s["epsilon"]) and np.isfinite(s.get(col, np.nan))
            ]
            if clean:
                ax2.axhline(clean[0], color=c, ls=(0, (6, 3)), lw=0.8, alpha=0.7)
        if metric in CHANCE:
            ax2.axhline(CHANCE[metric], color="0.4", ls=":", lw=1)
        if metric.endswith("auc") or metric.endswith("fraction"):
            ax2.set_ylim(0, 1.02)
        ax2.set_xscale("log")
        _eps_ticks(ax2, sorted(ticks))
        ax2.set_xlabel("epsilon computed by the ledger (log scale)")
        ax2.set_ylabel(metric)
        chance = f"; dotted: chance ({CHANCE[metric]:g})" if metric in CHANCE else ""
        ax2.set_title(
            f"{col[7:].split('_', 1)[0]} attack: {metric}\n(dashed: no protection{chance})", fontsize=9
        )
        ax2.grid(alpha=0.3, which="both")
    fig.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.0 - 2.6 / (5.0 * n + 2.8), 0.9),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(title or "privacy-utility trade-off", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1.0 - 2.8 / (5.0 * n + 2.8), 0.93))
    if isinstance(path, tuple):
        out, name = path
        out.save_figure(name, fig, dpi=130, bbox_inches="tight")
    else:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def plot_title(cfg: TradeoffConfig, dataset: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    """What a reader needs to judge the curves: data, trust model, delta, level, calibration, protocol."""
    places = list(dict.fromkeys(s.get("placement", "") for s in summary if math.isfinite(s["epsilon"])))
    protocols = list(dict.fromkeys(s.get("protocol", "none") for s in summary if math.isfinite(s["epsilon"])))
    cals = list(dict.fromkeys(s["calibration"] for s in summary if math.isfinite(s["epsilon"])))
    deltas = sorted({s["delta"] for s in summary if math.isfinite(s["epsilon"]) and s.get("private", True)})
    noise = (
        f"count noise ({cfg.count_noise}) on class counts only, means in clear"
        if cfg.count_noise
        else f"Gaussian noise on the uploaded statistics, clip {cfg.clip:.4g}"
        if cfg.clip
        else "no noise"
    )
    line1 = (
        f"{dataset['name']}: {cfg.clients} clients, {cfg.partition}"
        + (f" alpha={cfg.alpha:g}" if cfg.partition.startswith("dirichlet") else "")
        + f"; {noise}"
    )
    line2 = (
        f"{cfg.level} level, delta={'/'.join(f'{d:g}' for d in deltas) or '-'}, calibration: "
        f"{', '.join(cals) or '-'}; placement: {', '.join(places) or '-'}; protocol: {', '.join(protocols)}"
    )
    return line1 + "\n" + line2
