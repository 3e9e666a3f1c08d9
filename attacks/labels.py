"""Label-distribution inference from (noisy) class counts.

Every method uploads class counts n_kc (or their noisy version, FedCOF
paper App. I.1: n~ = max(n + noise, 0), a class clipped to 0 not sent).
The server reads each client's class histogram directly: p^_kc = n~_kc /
sum_c n~_kc.  Metrics (attacks.md): total variation between the true and
inferred histograms (over the clients holding records), count MAE, exact support recovery, presence AUC (is
class c on client k: score n~_kc) and singleton AUC (count 0 vs 1).

Against Laplace(1/eps) or geometric noise the singleton AUC of any test is
at most e^eps / (1 + e^eps) (pure eps-DP); the uniform variant
U(-(1 - eps) n, (1 - eps) n) leaves a zero count at exactly zero, so presence
and singleton AUC are 1 at every eps: it is not DP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.base import Attack
from attacks.knowledge import check_truth
from attacks.metrics import auc, auc_se
from attacks.view import GroundTruth, ServerView
from privfed.errors import InputError

__all__ = ["LabelInference", "LabelResult", "true_counts"]


def true_counts(truth: GroundTruth, num_rows: int, num_classes: int, per_client: bool) -> np.ndarray:
    """The clients' true class counts (num_rows, C), or the all-client total as one row."""
    keep = truth.clients >= 0
    y, k = truth.labels[keep], truth.clients[keep]
    fix = "score a view against the truth of its own federation (attacks.scenario returns both)"
    if y.size and int(y.max()) >= num_classes:
        raise InputError(
            f"GroundTruth.labels holds class {int(y.max())} but the view has {num_classes}; {fix}"
        )
    if not per_client:
        return np.bincount(y, minlength=num_classes)[None].astype(float)
    if k.size and int(k.max()) >= num_rows:
        raise InputError(
            f"GroundTruth.clients holds client {int(k.max())} but the view has {num_rows}; {fix}"
        )
    return (
        np.bincount(k * num_classes + y, minlength=num_rows * num_classes)
        .reshape(num_rows, num_classes)
        .astype(float)
    )


@dataclass(frozen=True, eq=False)
class LabelResult:
    counts: np.ndarray  # (K, C) inferred counts per real client (or the total)
    histograms: np.ndarray  # (K, C) inferred class proportions
    per_client: bool


class LabelInference(Attack):
    """Read each client's class histogram from its released counts."""

    name = "labels"
    requires = frozenset({"counts"})
    defaults: dict = {}

    def run(self, view: ServerView, rng=None, **_) -> LabelResult:
        self.check(view)
        n = np.maximum(view.stats.counts, 0.0)
        if view.stats.owners is not None:  # pseudo-clients: add the rows of each real client
            K = int(view.stats.owners.max()) + 1
            agg = np.zeros((K, n.shape[1]))
            np.add.at(agg, view.stats.owners, n)
            n = agg
        tot = n.sum(axis=1, keepdims=True)
        C = n.shape[1]
        hist = np.where(tot > 0, n / np.where(tot > 0, tot, 1.0), 1.0 / C)
        return LabelResult(counts=n, histograms=hist, per_client=view.per_client)

    def score(self, result: LabelResult, truth: GroundTruth) -> dict:
        K, C = result.counts.shape
        n = true_counts(truth, K, C, result.per_client)
        if n.shape != result.counts.shape:
            raise InputError(
                f"GroundTruth gives {n.shape} class counts but the view's are {result.counts.shape}"
            )
        p = n / np.maximum(n.sum(axis=1, keepdims=True), 1.0)
        # over the clients that hold records: one without has no histogram to recover (its inferred one is
        # uniform, its true one all zero), and it must not make an exact recovery score above 0
        held = n.sum(axis=1) > 0
        tv = 0.5 * np.abs(p - result.histograms).sum(axis=1)[held]
        est_support = result.counts >= 0.5
        out = {
            "total_variation": float(tv.mean()) if tv.size else float("nan"),
            "count_mae": float(np.abs(result.counts - n).mean()),
            "exact_support": float(np.mean((est_support == (n > 0)).all(axis=1))),
        }
        present = (n > 0).ravel()
        if present.any() and not present.all():
            a = auc(result.counts.ravel(), present)
            out["presence_auc"], out["presence_auc_se"] = (
                a,
                auc_se(a, int(present.sum()), int((~present).sum())),
            )
        else:
            out["presence_auc"] = out["presence_auc_se"] = float("nan")
        cell = (n <= 1).ravel()
        ones = (n == 1).ravel()[cell]
        if ones.any() and not ones.all():
            a = auc(result.counts.ravel()[cell], ones)
            out["singleton_auc"] = a
            out["singleton_auc_se"] = auc_se(a, int(ones.sum()), int((~ones).sum()))
            out["singleton_pairs"] = int(cell.sum())
        else:
            out["singleton_auc"] = out["singleton_auc_se"] = float("nan")
            out["singleton_pairs"] = int(cell.sum())
        return out

    def evaluate(self, view: ServerView, truth: GroundTruth, rng=None) -> dict:
        check_truth(truth, view)
        return self.score(self.run(view, rng), truth)
