"""Scoring feature inversion: the result, the n-guess prior, Hungarian-matched scores, the challenge.

Per released cell, the reconstructions are matched one-to-one to the cell's
true images (Hungarian, squared error) and so is the n-guess prior (k-means
centres of the public class, as many guesses as reconstructions); PSNR is
capped at :data:`PSNR_CAP`; identification is per true image (its matched
reconstruction's nearest private image is that image), so n reconstructions
of a mean of n can identify every record; SSIM uses 3x3 windows; standard
errors treat the cell, not the image, as the independent unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from attacks.metrics import cosine, ssim
from attacks.view import GroundTruth, ServerView
from privfed.errors import InputError

__all__ = [
    "PSNR_CAP",
    "SSIM_WIN",
    "InversionResult",
    "challenge_cells",
    "prior_guesses",
    "score_inversion",
]


@dataclass(frozen=True, eq=False)
class InversionResult:
    """Reconstructions, the prior baseline, and which released cell each came from.

    A released cell may get several reconstructions (the set backend returns
    n images for a mean of n); every row of ``images`` has its ``baseline``
    (the n-guess prior: k-means centres of the public class, as many as the
    cell's reconstructions), its cell's ``rows`` / ``classes`` and the
    ``targets`` it aimed at.
    """

    images: np.ndarray  # (r, H, W)
    baseline: np.ndarray  # (r, H, W): the prior guess of the same cell (k-means centres of the public class)
    targets: np.ndarray  # (r, d): the feature (or mean feature) each reconstruction's cell aimed at
    rows: np.ndarray  # (r,) released row (client, or 0 for a secure sum)
    owners: np.ndarray  # (r,) real client of the row
    classes: np.ndarray  # (r,) class of the cell (source "mean") or the recovered class ("second")
    group_by_class: bool  # score against the cell's class (mean) or the whole client (second)
    per_client: bool
    recon_features: np.ndarray  # (r, d): backbone features of the reconstructions
    attacker: str = ""  # what the attacker used (knowledge and method), for the report


#: PSNR of an exact copy is infinite; scores cap it here (an 8x8 image quantised to 17 grey levels is
#: within 30 dB of its copy after any sub-level error), so a perfect reconstruction counts, and counts finitely.
PSNR_CAP = 40.0
#: SSIM window on 8x8 images: win_size=7 leaves 2x2 window positions, a nearly global statistic (the
#: public prior alone scores ~0.8); 3x3 windows (36 positions) measure local structure.
SSIM_WIN = 3


def prior_guesses(
    public_images: np.ndarray, public_labels: np.ndarray, c: int, k: int, seed: int = 0
) -> np.ndarray:
    """The k-guess prior of class c: k-means centres of its public images (k = 1: the class-mean image)."""
    ims = np.asarray(public_images, np.float64)[np.asarray(public_labels) == c]
    if ims.shape[0] == 0:
        ims = np.asarray(public_images, np.float64)
    flat = ims.reshape(ims.shape[0], -1)
    k = int(min(k, flat.shape[0]))
    if k == 1:
        return flat.mean(0).reshape(1, *ims.shape[1:]).astype(np.float32)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(flat)
    return km.cluster_centers_.reshape(k, *ims.shape[1:]).astype(np.float32)


def score_inversion(result: InversionResult, truth: GroundTruth) -> dict:
    """Hungarian-matched scores per cell, cluster standard errors over cells.

    For every cell (the client's class, or the whole client for the
    two-stage source) with m true images and r reconstructions, the
    reconstructions are matched one-to-one to true images by the
    Hungarian algorithm on the squared error (min(r, m) pairs); the prior's
    guesses (as many as the reconstructions) are matched the same way.

    * ``psnr`` / ``baseline_psnr``: mean over matched pairs, capped at
      :data:`PSNR_CAP` (an exact copy scores the cap, it is not dropped);
    * ``delta_psnr``: attack minus prior, pair-averaged per cell;
    * ``identification``: the share of true images whose matched
      reconstruction's nearest private image (among all private images)
      is that image; an unmatched true image counts as missed, so a cell
      with one reconstruction caps at 1/m;
    * ``chance_identification``: min(r, m) / (private images of the class)
      per cell, averaged over true images;
    * ``ssim``: SSIM with 3x3 windows (:data:`SSIM_WIN`) on matched pairs;
    * ``*_se``: cluster-robust standard errors with the cell as the cluster
      (the images of one cell share one release and are not independent).
    """
    if truth.images is None:
        raise InputError("scoring an inversion needs GroundTruth.images (the clients' true images)")
    N = truth.labels.size
    pool = np.asarray(truth.images, np.float64).reshape(N, -1)
    pool_sq = (pool**2).sum(1)
    labels, clients = truth.labels, truth.clients
    shape = result.images.shape[1:]

    def nearest(ims):
        R = np.asarray(ims, np.float64).reshape(len(ims), -1)
        return ((R**2).sum(1)[:, None] - 2 * R @ pool.T + pool_sq[None]).argmin(1)

    nn_rec, nn_base = nearest(result.images), nearest(result.baseline)
    groups: dict = {}
    for i, (own, c) in enumerate(zip(result.owners, result.classes)):
        key = (own if result.per_client else -1, c if result.group_by_class else -1)
        groups.setdefault(key, []).append(i)
    cells = []
    for (own, c), idx in groups.items():
        mem = clients >= 0
        if own >= 0:
            mem &= clients == own
        if c >= 0:
            mem &= labels == c
        members = np.flatnonzero(mem)
        if members.size == 0:
            continue
        idx = np.asarray(idx)
        T = pool[members]

        def matched(ims, nn, T=T, members=members):
            R = np.asarray(ims, np.float64).reshape(len(ims), -1)
            mse = ((R[:, None, :] - T[None]) ** 2).mean(-1)
            ri, ti = linear_sum_assignment(mse)
            p = np.minimum(-10 * np.log10(np.maximum(mse[ri, ti], 1e-300)), PSNR_CAP)
            hits = nn[ri] == members[ti]
            s = ssim(np.asarray(ims)[ri], T[ti].reshape(-1, *shape), win_size=SSIM_WIN)
            return p, hits, s, ri, ti

        p, h, s, ri, ti = matched(result.images[idx], nn_rec[idx])
        pb, hb, sb, _, _ = matched(result.baseline[idx], nn_base[idx])
        same_class = int(np.count_nonzero(labels == c)) if c >= 0 else N
        fcos_true = cosine(result.recon_features[idx][ri], truth.features[members[ti]])
        fmean = result.recon_features[idx].mean(0)
        cells.append(
            {
                "pairs": p.size,
                "members": members.size,
                "psnr": p.sum(),
                "base_psnr": pb.sum(),
                "ident": h.sum(),
                "base_ident": hb.sum(),
                "ssim": s.sum(),
                "base_ssim": sb.sum(),
                "chance": min(idx.size, members.size) / same_class * members.size,
                "fcos": fcos_true.sum(),
                "fcos_target": float(cosine(fmean[None], result.targets[idx][:1])[0]),
            }
        )
    if not cells:
        raise InputError(
            "no reconstruction matches a client in the truth; "
            "check that the view and the truth belong together"
        )
    a = {k: np.array([c[k] for c in cells], float) for k in cells[0]}
    P, M = a["pairs"].sum(), a["members"].sum()

    def ratio(num, den):
        return float(num.sum() / den.sum())

    def cluster_se(num, den):
        G = num.size
        if G < 2:
            return float("nan")
        r = num.sum() / den.sum()
        return float(np.sqrt(G / (G - 1) * ((num - r * den) ** 2).sum()) / den.sum())

    dpsnr = a["psnr"] - a["base_psnr"]
    dident = a["ident"] - a["base_ident"]
    return {
        "psnr": ratio(a["psnr"], a["pairs"]),
        "ssim": ratio(a["ssim"], a["pairs"]),
        "identification": ratio(a["ident"], a["members"]),
        "identification_se": cluster_se(a["ident"], a["members"]),
        "baseline_psnr": ratio(a["base_psnr"], a["pairs"]),
        "baseline_ssim": ratio(a["base_ssim"], a["pairs"]),
        "baseline_identification": ratio(a["base_ident"], a["members"]),
        "chance_identification": ratio(a["chance"], a["members"]),
        "delta_psnr": ratio(dpsnr, a["pairs"]),
        "delta_psnr_se": cluster_se(dpsnr, a["pairs"]),
        "delta_identification": ratio(dident, a["members"]),
        "delta_identification_se": cluster_se(dident, a["members"]),
        "feature_cosine_true": ratio(a["fcos"], a["pairs"]),
        "feature_cosine_target": float(a["fcos_target"].mean()),
        "images_scored": int(M),
        "pairs_matched": int(P),
        "cells": len(cells),
        "reconstructions": int(result.images.shape[0]),
    }


def challenge_cells(view: ServerView, truth: GroundTruth, rng: np.random.Generator, max_cells: int):
    """The (row, class) cells of ``view`` that hold private data, at most ``max_cells`` of them."""
    keep = truth.clients >= 0
    C = view.num_classes
    if view.per_client:
        K = view.stats.num_clients
        if view.stats.owners is not None:  # pseudo-clients (multi-mean): rows whose owner holds the class
            Ko = int(max(view.stats.owners.max(), truth.clients.max())) + 1
            n_owner = np.bincount(truth.clients[keep] * C + truth.labels[keep], minlength=Ko * C).reshape(
                Ko, C
            )
            n = n_owner[view.stats.owners] * (view.stats.counts >= 0.5)
        else:
            n = np.bincount(truth.clients[keep] * C + truth.labels[keep], minlength=K * C).reshape(K, C)
    else:
        n = np.bincount(truth.labels[keep], minlength=C)[None]
    rows, classes = np.nonzero(n > 0)
    if rows.size > max_cells:
        pick = np.sort(rng.choice(rows.size, size=max_cells, replace=False))
        rows, classes = rows[pick], classes[pick]
    return rows, classes
