"""What ``python -m privfed.attack`` shows: the inversion grid figure and the one-line summary of a row."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["PRINTED", "TEST_WORDS", "UNDEFINED", "grid_figure", "summary_line", "undefined_notes"]


def grid_figure(result, truth, title: str, columns: int = 8):
    """True images, reconstructions and the public prior, one column per released cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = min(columns, result.images.shape[0])
    true_im = []
    for i in range(r):
        mem = (
            np.flatnonzero((truth.clients == result.owners[i]) & (truth.labels == result.classes[i]))
            if result.per_client and result.group_by_class
            else np.flatnonzero(truth.clients == result.owners[i])
            if result.per_client
            else np.flatnonzero((truth.clients >= 0) & (truth.labels == result.classes[i]))
        )
        if mem.size == 0:
            true_im.append(np.zeros(result.images.shape[1:]))
            continue
        d = ((truth.images[mem] - result.images[i]) ** 2).reshape(mem.size, -1).sum(1)
        true_im.append(truth.images[mem[d.argmin()]])
    fig, ax = plt.subplots(3, r, figsize=(1.2 * r, 3.9), squeeze=False)
    for i in range(r):
        for j, (im, lab) in enumerate(
            ((true_im[i], "true"), (result.images[i], "reconstructed"), (result.baseline[i], "public prior"))
        ):
            ax[j, i].imshow(im, cmap="gray", vmin=0, vmax=1)
            ax[j, i].set_xticks([]), ax[j, i].set_yticks([])
            if i == 0:
                ax[j, i].set_ylabel(lab, fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return fig


#: Metrics printed per row, with the words that say what they measure.
PRINTED = (
    ("auc", "auc[{test}]"),
    ("auc_inner", "auc[inner product]"),
    ("auc_lrt", "auc[likelihood ratio]"),
    ("tpr@0.01", "tpr@0.01[{test}]"),
    ("identification", "identification"),
    ("delta_psnr", "delta_psnr"),
    ("psnr", "psnr"),
    ("exposed_fraction", "exposed_fraction"),
    ("exact_fraction", "exact_fraction"),
    ("matched_cosine", "matched_cosine"),
    ("total_variation", "total_variation"),
    ("singleton_auc", "singleton_auc"),
)
TEST_WORDS = {"lrt": "likelihood ratio", "inner": "inner product", "homer": "Homer", "sum": "sum"}
#: Why a printed metric is undefined (NaN) on a run: the summary prints it as n/a and the command says why.
UNDEFINED = {
    "exact_fraction": "no cell's count changed by exactly one record between the two releases, so no record "
    "was isolated to score (e.g. few clients under noise)",
    "singleton_auc": "the cells holding at most one record are all singletons or all empty, so no AUC separates "
    "them (e.g. few clients holding many records each)",
}


def undefined_notes(records: list[dict[str, Any]]) -> list[str]:
    """One line per printed metric that is NaN in some row, saying why (never a bare nan)."""
    notes = []
    for key, label in PRINTED:
        if any(_is_nan(r.get(key)) for r in records):
            why = UNDEFINED.get(key, "the run gave the attack nothing to score")
            notes.append(f"note: {label.format(test='test')}=n/a in some rows: {why}")
    return notes


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def summary_line(r: dict[str, Any]) -> str:
    """One printed line per result row: the metrics of :data:`PRINTED` and the strongest attack."""
    test = TEST_WORDS.get(str(r.get("test", "")), str(r.get("test", ""))) or "test"
    cells = [
        f"{label.format(test=test)}=" + ("n/a" if _is_nan(r[k]) else f"{r[k]:.3f}")
        for k, label in PRINTED
        if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
    ]
    if r.get("not_applicable"):
        cells.append(f"n/a ({r['not_applicable']})")
    if r.get("strongest_attack"):
        key = "strongest_auc" if "strongest_auc" in r else "strongest_identification"
        text = f"strongest[{r['strongest_attack']}]: {key[10:]}={r[key]:.3f}"
        if isinstance(r.get(f"{key}_se"), float) and math.isfinite(r[f"{key}_se"]):
            text += f" (SE {r[f'{key}_se']:.3f}"
            if "strongest_chance_identification" in r:
                text += (
                    f", chance {r['strongest_chance_identification']:.3f}, "
                    f"{r['n'] if r.get('partition') == 'groups' else 'n'}-guess prior "
                    f"{r['strongest_baseline_identification']:.3f}"
                )
            text += ")"
        cells.append(text)
    where = r["placement"] + (f"/{r['protocol']}" if r["protocol"] != "none" else "")
    n = f"n={r['n']:<3} " if r.get("partition") == "groups" else ""
    return f"{r['method']:>12} eps={r['epsilon']:<6g} {where:<14} {n}seed={r['seed']} " + " ".join(cells)
