"""Differencing: two releases of the same client that differ by a few records expose them.

If a client's class-c sum is released with n records and again with n + m
(a later round, or with and without one record), the difference of the
two sums is the sum of the m added records; with m = 1 it is the record:

    x = S_{n+1} - S_n = (n + 1) m_{n+1} - n m_n        (attacks.md, "differencing")

Counts reveal m, so the attacker knows which cells changed by one.  Noise
on both releases adds sqrt(2) sigma per coordinate to the difference.  Under
secure aggregation the same works on the all-client sums whenever exactly
one record joins between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.base import Attack
from attacks.metrics import cosine
from attacks.params import index_vector
from attacks.view import GroundTruth, ServerView, clip_rows
from mechanisms.dp.calibration import check_count, check_nonnegative
from privfed.errors import InputError

__all__ = ["Differencing", "DifferencingResult"]


@dataclass(frozen=True, eq=False)
class DifferencingResult:
    rows: np.ndarray
    classes: np.ndarray
    added: np.ndarray  # (r,) records added per cell (count difference)
    features: np.ndarray  # (r, d): recovered mean of the added records
    per_client: bool
    clip: float | None = None  # the bound the release clipped every record to (the view's NoiseSpec)
    clip_norm: str = "l2"  # its norm: L2, or each coordinate


class Differencing(Attack):
    """Subtract an earlier release from a later one, cell by cell."""

    name = "differencing"
    requires = frozenset({"counts", "sums"})
    defaults = {"tolerance": 1e-6, "max_added": 1}

    def _validate_params(self) -> None:
        self.params["tolerance"] = check_nonnegative(self.params["tolerance"], "tolerance")
        self.params["max_added"] = check_count(
            self.params["max_added"], "max_added"
        )  # 0: no cell, NaN metrics

    def run(
        self, view: ServerView, rng=None, *, earlier: ServerView | None = None, **_
    ) -> DifferencingResult:
        self.check(view)
        if earlier is None:
            raise InputError("differencing needs earlier=ServerView(...), the release to subtract")
        self.check(earlier)
        if earlier.stats.counts.shape != view.stats.counts.shape or earlier.stats.dim != view.stats.dim:
            raise InputError("the two releases must have the same clients, classes and feature dimension")
        dn = np.rint(view.stats.counts - earlier.stats.counts)
        rows, classes = np.nonzero((dn >= 1) & (dn <= int(self.params["max_added"])))
        diff = view.stats.sums[rows, classes] - earlier.stats.sums[rows, classes]
        m = dn[rows, classes]
        return DifferencingResult(
            rows=rows,
            classes=classes,
            added=m,
            features=diff / m[:, None],
            per_client=view.per_client,
            clip=view.noise.clip,
            clip_norm=view.noise.clip_norm,
        )

    def score(self, result: DifferencingResult, truth: GroundTruth, added: np.ndarray | None = None) -> dict:
        """``added``: indices (into the truth) of the records only the later release holds."""
        if added is None:
            raise InputError("differencing scores need added= (the truth's indices of the added records)")
        if isinstance(added, np.ndarray) and added.dtype == bool:  # a mask read as indices 0 and 1
            raise InputError(
                "added must be the truth's indices of the added records, got a boolean mask: pass "
                "np.flatnonzero(mask)"
            )
        added = index_vector(
            added, "added", truth.labels.shape[0], what="indices into the ground truth's records"
        )
        tol = float(self.params["tolerance"])
        exact, cos, rel = [], [], []
        for k, c, f in zip(result.rows, result.classes, result.features):
            mask = truth.labels[added] == c
            if result.per_client:
                mask &= truth.clients[added] == k
            idx = added[mask]
            if idx.size == 0:
                continue
            true = clip_rows(truth.features[idx], result.clip, result.clip_norm).mean(
                axis=0
            )  # as the clients clipped them
            err = float(np.linalg.norm(f - true))
            scale = max(1.0, float(np.linalg.norm(true)))
            exact.append(err <= tol * scale)
            rel.append(err / scale)
            cos.append(float(cosine(f, true)[0]))
        if not exact:
            return {
                "cells": 0,
                "exact_fraction": float("nan"),
                "mean_cosine": float("nan"),
                "mean_relative_error": float("nan"),
            }
        return {
            "cells": len(exact),
            "exact_fraction": float(np.mean(exact)),
            "mean_cosine": float(np.mean(cos)),
            "mean_relative_error": float(np.mean(rel)),
        }

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        """Challenge: an earlier round in which every client lacked one random uploaded record.

        The earlier release is rebuilt from the truth with the view's method and
        noise specification (a fresh noise draw), so it is what the same server
        would have seen one round before.
        """
        if view.stats.owners is not None:
            raise InputError(
                "differencing pseudo-client releases (multi-mean sampling) is not defined: "
                "their random subsets change between rounds"
            )
        clients = truth.clients.copy()
        added = []
        groups = (
            [np.flatnonzero(clients >= 0)]
            if not view.per_client
            else [np.flatnonzero(clients == k) for k in np.unique(clients[clients >= 0])]
        )
        for idx in groups:  # secure sum: one record in total; per client: one record each
            if idx.size >= 2:
                j = int(rng.choice(idx))
                added.append(j)
                clients[j] = -1
        if not added:
            raise InputError("no client holds two records; nothing to difference")
        earlier = ServerView.from_federation(
            view.method,
            truth.features,
            truth.labels,
            clients,
            privacy=view.noise,
            secure_agg=not view.per_client,
            num_classes=view.num_classes,
            rng=rng,
        )
        if earlier.stats.num_clients != view.stats.num_clients:
            raise InputError("the earlier release lost a client; use clients with at least two records")
        res = self.run(view, rng, earlier=earlier)
        return self.score(res, truth, added=np.array(added))
