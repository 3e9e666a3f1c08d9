"""Singleton exposure: a class mean of one sample *is* the sample.

A client holding exactly one sample of class c uploads s_kc = f (and the
count n_kc = 1), so the server reads the raw feature (attacks.md, "singleton
exposure"; methods.md section 1).  Under Dirichlet label skew this is a
sizeable fraction of all samples; count noise does not hide it because the
sum itself is untouched.  The attacker flags every released (client, class)
cell whose count rounds to 1 and reads its sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.base import Attack
from attacks.knowledge import check_truth
from attacks.metrics import cosine
from attacks.view import GroundTruth, ServerView, clip_rows
from mechanisms.dp.calibration import check_nonnegative

__all__ = ["SingletonExposure", "SingletonResult", "singleton_fraction"]


def singleton_fraction(labels, clients) -> float:
    """Fraction of uploaded samples (client >= 0) that are alone in their (client, class) cell."""
    y = np.asarray(labels).astype(np.int64)
    k = np.asarray(clients).astype(np.int64)
    keep = k >= 0
    y, k = y[keep], k[keep]
    if y.size == 0:
        return 0.0
    C = int(y.max()) + 1
    cell = k * C + y
    _, inv, cnt = np.unique(cell, return_inverse=True, return_counts=True)
    return float(np.count_nonzero(cnt[inv] == 1) / y.size)


@dataclass(frozen=True, eq=False)
class SingletonResult:
    """Cells read as single samples: their row (client), class and recovered feature."""

    rows: np.ndarray
    classes: np.ndarray
    features: np.ndarray
    owners: np.ndarray
    per_client: bool
    #: The L2 bound the release clipped every record to (the view's NoiseSpec), None for none.
    clip: float | None = None
    clip_norm: str = "l2"  # its norm: L2, or each coordinate


class SingletonExposure(Attack):
    """Read every released class sum whose count rounds to one as a raw feature."""

    name = "singleton"
    requires = frozenset({"counts", "sums"})
    defaults = {"tolerance": 1e-6}

    def _validate_params(self) -> None:
        self.params["tolerance"] = check_nonnegative(self.params["tolerance"], "tolerance")

    def run(self, view: ServerView, rng: np.random.Generator | None = None, **_) -> SingletonResult:
        self.check(view)
        counts, sums = view.stats.counts, view.stats.sums
        # A zero sum marks a class the client lacks (count noise gives it a count but no mean).
        has_mean = np.abs(sums).sum(axis=-1) > 0
        rows, classes = np.nonzero((np.rint(counts) == 1) & has_mean)
        owners = rows if view.stats.owners is None else view.stats.owners[rows]
        # The count rounds to one, so the cell holds one record.  Count noise of FedCOF App. I.1 with clean
        # sums sends n~ x the exact mean, so sum / noisy count is the record; any other count noise (Gaussian,
        # or with noisy sums) leaves the sum as it was, so the sum itself is the record (divided by the
        # rounded count, 1) and dividing by the noisy count would only rescale it.
        rescaled = view.noise.count_kind is not None and view.noise.sigma.get("sums", 0.0) <= 0
        n = counts[rows, classes] if rescaled else np.rint(counts[rows, classes])
        feats = sums[rows, classes] / n[:, None]
        return SingletonResult(
            rows=rows,
            classes=classes,
            features=feats,
            owners=owners,
            per_client=view.per_client,
            clip=view.noise.clip,
            clip_norm=view.noise.clip_norm,
        )

    def score(self, result: SingletonResult, truth: GroundTruth) -> dict:
        tol = float(self.params["tolerance"])
        keep = truth.clients >= 0
        # the records as the clients clipped them: clipping alone is no protection against being read
        F, y, k = (
            clip_rows(truth.features[keep], result.clip, result.clip_norm),
            truth.labels[keep],
            truth.clients[keep],
        )
        exposed = np.zeros(F.shape[0], dtype=bool)
        cos = []
        for own, c, f in zip(result.owners, result.classes, result.features):
            idx = np.flatnonzero((y == c) & ((k == own) if result.per_client else True))
            if idx.size == 0:
                cos.append(0.0)
                continue
            err = np.linalg.norm(F[idx] - f, axis=1)
            j = int(err.argmin())
            cos.append(float(cosine(F[idx[j]], f)[0]))
            if err[j] <= tol * max(1.0, float(np.linalg.norm(F[idx[j]]))):
                exposed[idx[j]] = True
        n_cand = len(result.rows)
        return {
            "exposed_fraction": float(exposed.mean()),
            "exposed_samples": int(exposed.sum()),
            "singleton_fraction": singleton_fraction(y, k)
            if result.per_client
            else float(np.mean(np.bincount(y)[y] == 1)),
            "candidates": n_cand,
            "candidate_precision": float(exposed.sum() / n_cand) if n_cand else float("nan"),
            "mean_cosine": float(np.mean(cos)) if cos else float("nan"),
        }

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator | None = None) -> dict:
        check_truth(truth, view)
        return self.score(self.run(view, rng), truth)
