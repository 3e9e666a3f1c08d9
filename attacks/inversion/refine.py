"""Pixel refinement of decoded images against the released feature, and its choice on public simulations.

:func:`refine_pixels` / :func:`refine_set`: pixel-space refinement of a
decoder's output against the target with a scale-free (cosine) loss on the
feature, optionally with total variation; for a set, the n images are
refined jointly so that the mean of their features matches.  Which
refinement to use is chosen on *public* simulations
(:func:`select_refinement`), never on the targets.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from attacks.inversion.backends import total_variation
from attacks.inversion.bank import augment_bank, image_features
from attacks.inversion.decoders import class_subsets
from attacks.inversion.determinism import deterministic
from privfed.errors import ConfigError

__all__ = ["REFINEMENTS", "refine_pixels", "refine_set", "select_refinement"]


def _torch():
    import torch

    return torch


def refine_pixels(
    backbone,
    targets: np.ndarray,
    init: np.ndarray,
    *,
    steps: int = 400,
    lr: float = 0.1,
    tv: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Refine images (r, H, W) so that the direction of f(x) matches each target (scale-free cosine loss)."""
    return refine_set(backbone, targets, np.asarray(init)[:, None], steps=steps, lr=lr, tv=tv, seed=seed)[
        :, 0
    ]


def refine_set(
    backbone,
    targets: np.ndarray,
    init: np.ndarray,
    *,
    steps: int = 400,
    lr: float = 0.1,
    tv: float = 0.0,
    anchor: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Jointly refine n images per target, (r, n, H, W), so the mean of their features points like the target.

    Loss per target: 1 - cos(mean_i f(x_i), m) + tv * mean_i TV(x_i)
    + anchor * mean squared distance to the initial images (keeps the n
    images apart: the mean alone does not pin each of them).
    """
    torch = _torch()
    x0 = np.asarray(init, np.float32)
    r, n = x0.shape[:2]
    shape = x0.shape[2:]
    with deterministic(seed):
        dev = next(backbone.parameters()).device
        t = torch.as_tensor(np.asarray(targets, np.float32), device=dev)
        tn = t.norm(dim=1).clamp_min(1e-12)
        X0 = torch.as_tensor(np.clip(x0, 0.01, 0.99).astype(np.float32), device=dev)
        z = torch.logit(X0).clone().requires_grad_(True)
        opt = torch.optim.Adam([z], lr=lr)
        for _ in range(int(steps)):
            opt.zero_grad()
            x = torch.sigmoid(z)
            f = backbone(x.reshape(r * n, 1, *shape)).reshape(r, n, -1).mean(1)
            obj = 1.0 - (f * t).sum(1) / (f.norm(dim=1).clamp_min(1e-12) * tn)
            if tv > 0:
                obj = obj + tv * total_variation(x.reshape(r * n, *shape)).reshape(r, n).mean(1)
            if anchor > 0:
                obj = obj + anchor * ((x - X0) ** 2).flatten(1).mean(1)
            obj.sum().backward()
            opt.step()
        return torch.sigmoid(z).detach().cpu().numpy()


#: Refinement settings compared on public simulations: name -> (steps, tv, anchor); "none" keeps the
#: decoder's output.  Adam, learning rate 0.1 on the logits, cosine loss on the (mean) feature.
REFINEMENTS = {"none": None, "plain": (400, 0.0, 0.0), "tv": (400, 0.001, 0.0), "anchored": (400, 0.0, 0.5)}


def select_refinement(
    backbone,
    public,
    decode,
    n: int,
    *,
    trials: int = 48,
    seed: int = 0,
    options=("none", "plain", "tv", "anchored"),
) -> tuple[str, dict]:
    """Choose the refinement on public simulations (never on the targets).

    Simulated targets: means of ``n`` fresh augmentations (a seed the decoder
    never saw) of public images of one class; ``decode(means, classes)``
    returns (r, n, H, W).  Each option refines and is scored by the mean
    Hungarian-matched PSNR against the simulated images.  Returns the best
    option's name and every option's PSNR.
    """
    rs = np.random.default_rng(seed + 104729)
    ims, y = augment_bank(public.images, public.labels, 1, seed=seed + 104729, blend_fraction=0.0)
    by = {c: np.flatnonzero(y == c) for c in np.unique(y)}
    cls, idx = class_subsets(rs, y, n, trials, by)
    truth = ims[idx]  # (trials, n, H, W)
    F = image_features(backbone, ims)
    means = F[idx].mean(1)
    init = decode(means, cls)
    scores = {}
    for name in options:
        if name not in REFINEMENTS:
            raise ConfigError(f"unknown refinement {name!r}; choose from {list(REFINEMENTS)}")
        spec = REFINEMENTS[name]
        rec = (
            init
            if spec is None
            else refine_set(
                backbone, means, init, steps=spec[0], tv=spec[1], anchor=spec[2] if n > 1 else 0.0, seed=seed
            )
        )
        scores[name] = float(np.mean([_matched_psnr(rec[i], truth[i]) for i in range(trials)]))
    return max(scores, key=scores.get), scores


def _matched_psnr(rec: np.ndarray, true: np.ndarray) -> float:
    R = rec.reshape(len(rec), -1).astype(np.float64)
    T = true.reshape(len(true), -1).astype(np.float64)
    mse = ((R[:, None] - T[None]) ** 2).mean(-1)
    i, j = linear_sum_assignment(mse)
    return float(np.mean(-10 * np.log10(np.maximum(mse[i, j], 1e-4))))
