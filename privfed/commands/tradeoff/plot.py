"""The trade-off figure: accuracy against the ledger's epsilon, one panel per attack metric.

One style for one-shot and multi-round (``--rounds``) runs.  Every series (a
method, its rounds, a noise placement) has its own colour and marker; the
legend has one entry per thing drawn: each series, its spread (a shaded
band along a curve, error bars on a lone point), the non-private accuracy
of each method (dashed) and chance (dotted).  The accuracy axis runs from 0
to 1, so chance is on it and small differences are not magnified; epsilon
ticks are the budgets drawn, in plain numbers.  A run with one budget per
series is drawn as points side by side (one column per series) rather than
as markers piled on one x.  The figure is written as PNG, PDF and SVG.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privfed.commands.tradeoff.config import TradeoffConfig
from privfed.commands.tradeoff.table import SEQUENCE_ATTACK, headline_keys

__all__ = ["CHANCE", "accuracy_axis", "eps_ticks", "plot_title", "plot_tradeoff"]


def accuracy_axis(
    ax, handles: list, labels: list, ticks, *, band_seeds: int | None, num_classes: int | None
) -> None:
    """Finish an accuracy-against-epsilon axis the way every privfed plot does.

    Adds the legend entries for the ± 1 std band (when ``band_seeds``) and
    the chance line (when ``num_classes``), puts epsilon on a log axis with
    plain ticks at the budgets drawn and shows the whole accuracy range,
    so that small differences are not magnified and chance is on the axis.
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
    eps_ticks(ax, sorted(ticks))
    ax.set_ylim(0, 1.02)


def eps_ticks(ax, ticks: list[float]) -> None:
    """Label the budgets drawn, in plain numbers (log axes otherwise print 2×10^0); pad a short range.

    Ticks closer than a factor 1.8 to the previous label are dropped, so that
    ledger epsilons next to the asked ones (classic calibration) stay readable.
    """
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ticks = [t for t in ticks if t > 0 and math.isfinite(t)]

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

_MARKERS = {"local": "o", "secure sum": "s", "trusted aggregator": "^"}


def _series(summary: list[dict[str, Any]]) -> list[tuple]:
    """(method, rounds, placement, private) of every noised series, in table order."""
    return list(
        dict.fromkeys(
            (s["method"], int(s.get("rounds", 1)), s.get("placement", ""), bool(s.get("private", True)))
            for s in summary
            if math.isfinite(s["epsilon"])
        )
    )


def _label(key: tuple, *, multi_rounds: bool, multi_placement: bool) -> str:
    m, rounds, place, private = key
    label = m + (f" ×{rounds} rounds" if rounds > 1 else (", one-shot (frozen)" if multi_rounds else ""))
    if multi_placement:
        label += f", {place}"
    if not private:
        label += " — NO DP GUARANTEE (x = nominal parameter)"
    return label


def plot_tradeoff(
    path: Path | tuple, summary: list[dict[str, Any]], title: str = "", *, num_classes: int | None = None
) -> None:
    """Accuracy against the ledger's epsilon (one series per method x rounds x placement), one panel per
    attack metric.

    ``path`` is a file path (its suffix picks the format), or ``(OutputDir, stem)`` to write
    ``stem.png``, ``stem.pdf`` and ``stem.svg`` through the result folder (atomically).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    attack_cols = [k for k in headline_keys(summary) if any(np.isfinite(s.get(k, np.nan)) for s in summary)]
    n = 1 + len(attack_cols)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n + 3.2, 4.6), squeeze=False)
    series = _series(summary)
    multi_rounds = len({k[1] for k in series}) > 1
    multi_placement = len({k[2] for k in series}) > 1
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    groups = list(dict.fromkeys((k[0], k[1]) for k in series))  # one colour per method x rounds
    color = {g: colors[i % len(colors)] for i, g in enumerate(groups)}
    seeds = max((s["seeds"] for s in summary), default=1)

    def rows_of(key: tuple, col: str) -> tuple[list[dict], np.ndarray]:
        m, rounds, place, private = key
        rows = [
            s
            for s in summary
            if (s["method"], int(s.get("rounds", 1)), s.get("placement", ""), bool(s.get("private", True)))
            == key
            and math.isfinite(s["epsilon"])
            and np.isfinite(s.get(col, np.nan))
        ]
        x = np.asarray([s["epsilon_reported"] if private else s["epsilon"] for s in rows], float)
        order = np.argsort(x)
        return [rows[i] for i in order], x[order]

    # one budget in every series: points side by side, one column each (no markers piled on one x)
    points = all(len(rows_of(k, "accuracy_mean")[0]) <= 1 for k in series)
    handles: list = []
    labels: list[str] = []
    drew_band = drew_bars = False

    def draw(ax, col: str, sd_col: str | None, *, legend: bool) -> set[float]:
        nonlocal drew_band, drew_bars
        ticks: set[float] = set()
        for i, key in enumerate(series):
            rows, x = rows_of(key, col)
            if not rows:
                continue
            c = color[(key[0], key[1])]
            y = np.array([s[col] for s in rows])
            sd = np.array([s.get(sd_col, 0.0) for s in rows]) if sd_col else np.zeros(len(rows))
            xs = np.full(len(rows), float(i)) if points else x
            ticks.update(x.tolist())
            mk = _MARKERS.get(key[2], "o") if key[3] else "x"
            (line,) = ax.plot(
                xs, y, marker=mk, ls="-" if not points else "none", color=c, ms=7, mfc=c if key[3] else "none"
            )
            spread = sd_col is not None and seeds > 1
            if spread and len(xs) > 1:
                ax.fill_between(xs, y - sd, y + sd, color=c, alpha=0.15, lw=0)
                drew_band = True
            elif spread:
                ax.errorbar(xs, y, yerr=sd, color=c, capsize=4, lw=1.2, ls="none")
                drew_bars = True
            if legend:
                handles.append(line)
                labels.append(_label(key, multi_rounds=multi_rounds, multi_placement=multi_placement))
        return ticks

    ax = axes[0, 0]
    ticks = draw(ax, "accuracy_mean", "accuracy_std", legend=True)
    for g in groups:  # the non-private accuracy of each method (x rounds), dashed in its colour
        base = [s["nonprivate_mean"] for s in summary if (s["method"], int(s.get("rounds", 1))) == g]
        if base:
            line = ax.axhline(base[0], color=color[g], ls=(0, (6, 3)), lw=1.2, alpha=0.9)
            handles.append(line)
            name = g[0] + (f" ×{g[1]} rounds" if g[1] > 1 else (" one-shot" if multi_rounds else ""))
            labels.append(f"{name} non-private ({base[0]:.3f})")
    if drew_band:
        handles.append(Patch(color="0.5", alpha=0.3, lw=0))
        labels.append(f"shaded band: ± 1 std over {seeds} seeds")
    if drew_bars:
        handles.append(Line2D([], [], color="0.3", marker="|", ms=10, ls="none"))
        labels.append(f"error bar: ± 1 std over {seeds} seeds")
    if num_classes:
        chance = ax.axhline(1 / num_classes, color="0.4", ls=":", lw=1.2)
        handles.append(chance)
        labels.append(f"chance (1/{num_classes} classes)")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("test accuracy")
    ax.set_title("accuracy", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    composed = " (composed over every round)" if any(k[1] > 1 for k in series) else ""
    if points:
        _categories(ax, series, ticks, multi_rounds=multi_rounds)
        eps = ", ".join(f"{t:.3g}" for t in sorted(ticks))
        ax.set_xlabel(f"epsilon computed by the ledger{composed}: {eps}")
    else:
        ax.set_xscale("log")
        eps_ticks(ax, sorted(ticks))
        ax.set_xlabel(f"epsilon computed by the ledger{composed} (log scale)")
    for p, col in enumerate(attack_cols, start=1):
        ax2 = axes[0, p]
        metric = "auc" if col == SEQUENCE_ATTACK else col.split("_", 2)[2]
        draw(ax2, col, None, legend=False)
        for g in groups:
            clean = [
                s[col]
                for s in summary
                if (s["method"], int(s.get("rounds", 1))) == g
                and not math.isfinite(s["epsilon"])
                and np.isfinite(s.get(col, np.nan))
            ]
            if clean:
                ax2.axhline(clean[0], color=color[g], ls=(0, (6, 3)), lw=1.0, alpha=0.8)
        if metric in CHANCE:
            ax2.axhline(CHANCE[metric], color="0.4", ls=":", lw=1.2)
        if metric.endswith("auc") or metric.endswith("fraction"):
            ax2.set_ylim(0, 1.02)
        if points:
            _categories(ax2, series, ticks, multi_rounds=multi_rounds)
        else:
            ax2.set_xscale("log")
            eps_ticks(ax2, sorted(ticks))
            ax2.set_xlabel("epsilon computed by the ledger (log scale)")
        ax2.set_ylabel(metric)
        what = (
            "membership attack on all rounds"
            if col == SEQUENCE_ATTACK
            else f"{col[7:].split('_', 1)[0]} attack"
        )
        chance = f"; dotted: chance ({CHANCE[metric]:g})" if metric in CHANCE else ""
        ax2.set_title(f"{what}: {metric}\n(dashed: no protection{chance})", fontsize=9)
        ax2.grid(alpha=0.3, which="both")
    width = 5.0 * n + 3.2
    fig.legend(
        handles, labels, loc="upper left", bbox_to_anchor=(1.0 - 3.0 / width, 0.9), fontsize=8, frameon=False
    )
    fig.suptitle(title or "privacy-utility trade-off", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1.0 - 3.2 / width, 0.93))
    if isinstance(path, tuple):
        out, stem = path
        out.save_figures(
            str(stem).rsplit(".", 1)[0] if str(stem).endswith(".png") else str(stem),
            fig,
            dpi=130,
            bbox_inches="tight",
        )
    else:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _categories(ax, series: list[tuple], ticks, *, multi_rounds: bool) -> None:
    names = []
    for m, rounds, place, _ in series:
        top = m + (f" ×{rounds}" if rounds > 1 else (" one-shot" if multi_rounds else ""))
        names.append(f"{place}\n{top}")
    ax.set_xticks(range(len(series)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_xlim(-0.6, len(series) - 0.4)


def plot_title(cfg: TradeoffConfig, dataset: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    """What a reader needs to judge the curves: data, trust model, delta, level, calibration, protocol."""
    places = list(dict.fromkeys(s.get("placement", "") for s in summary if math.isfinite(s["epsilon"])))
    protocols = list(dict.fromkeys(s.get("protocol", "none") for s in summary if math.isfinite(s["epsilon"])))
    cals = list(dict.fromkeys(s["calibration"] for s in summary if math.isfinite(s["epsilon"])))
    deltas = sorted({s["delta"] for s in summary if math.isfinite(s["epsilon"]) and s.get("private", True)})
    finite = any(math.isfinite(e) for e in cfg.epsilons)
    if cfg.count_noise:
        noise = f"count noise ({cfg.count_noise}) on class counts only, means in clear"
    elif not finite:
        noise = "no noise"
    elif cfg.rounds > 1:  # privfed.rounds' default bound when --clip is not given: 2 per coordinate
        noise = f"Gaussian noise on the augmented statistic, clip {cfg.clip or 2.0:.4g} ({cfg.clip_norm if cfg.clip else 'coordinate'})"
    else:
        noise = f"Gaussian noise on the uploaded statistics, clip {cfg.clip:.4g}" + (
            f" ({cfg.clip_norm})" if cfg.clip_norm != "l2" else ""
        )
    rounds = (
        f"; FedLog with local bodies over {cfg.rounds} rounds vs one-shot frozen" if cfg.rounds > 1 else ""
    )
    line1 = (
        f"{dataset['name']}: {cfg.clients} clients, {cfg.partition}"
        + (f" alpha={cfg.alpha:g}" if cfg.partition.startswith("dirichlet") else "")
        + f", {len(cfg.seeds)} seed(s); {noise}{rounds}"
    )
    line2 = (
        f"{cfg.level} level, delta={'/'.join(f'{d:g}' for d in deltas) or '-'}, calibration: "
        f"{', '.join(cals) or '-'}; placement: {', '.join(p for p in places if p) or '-'}; protocol: "
        f"{', '.join(protocols)}"
    )
    return line1 + "\n" + line2
