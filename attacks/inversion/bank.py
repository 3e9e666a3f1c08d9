"""The attacker's image bank: augmented copies of every public image, their backbone features, and the config.

:func:`augment_bank` makes many augmented copies of every public image
(random affine maps, smooth elastic displacements, same-class blends), so
that a decoder sees far more (feature, image) pairs than the public split
holds; :func:`public_bank` is the bank the joint attacker searches.
:class:`DecoderConfig` holds the hyper-parameters of the bank and of the
decoders trained on it (all part of their cache keys); :func:`backbone_digest`
is a backbone's identity in those keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from privfed.errors import ConfigError, InputError

__all__ = [
    "DecoderConfig",
    "augment_bank",
    "augmented_bank",
    "backbone_digest",
    "digest_arrays",
    "image_features",
    "public_bank",
]


def _torch():
    import torch

    return torch


@dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of the bank and the decoders (all part of the cache key).

    The defaults are the full-strength settings (a minute or two of CPU
    training per decoder on digits); tests use smaller ones.
    """

    copies: int = 60  # augmented copies of every public image
    hidden: int = 512
    steps: int = 12000  # a set decoder's cap; it stops when validation stops improving
    batch: int = 256
    lr: float = 2e-3
    blend_fraction: float = 0.25
    seed: int = 0
    feature_steps: int = 20000  # the feature decoder's cap; it stops when validation stops improving
    val_every: int = 250  # steps between validation losses
    patience: int = 4  # validations without improvement (each halves the learning rate) before stopping

    def __post_init__(self) -> None:
        for k in ("copies", "hidden", "steps", "batch", "feature_steps", "val_every", "patience"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"DecoderConfig.{k} must be a positive int, got {v!r}")
        if not 0 <= self.blend_fraction < 1:
            raise ConfigError(f"DecoderConfig.blend_fraction must be in [0, 1), got {self.blend_fraction!r}")
        if not self.lr > 0:
            raise ConfigError(f"DecoderConfig.lr must be > 0, got {self.lr!r}")

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "copies",
                "hidden",
                "steps",
                "batch",
                "lr",
                "blend_fraction",
                "seed",
                "feature_steps",
                "val_every",
                "patience",
            )
        }


def digest_arrays(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def backbone_digest(backbone) -> str:
    """SHA-256 of the backbone's weights (its identity in decoder cache keys)."""
    state = backbone.state_dict()
    return digest_arrays(*[state[k].detach().cpu().numpy() for k in sorted(state)])


def image_features(backbone, images: np.ndarray, batch: int = 4096) -> np.ndarray:
    torch = _torch()
    dev = next(backbone.parameters()).device
    out = []
    with torch.no_grad():
        for s in range(0, len(images), batch):
            x = torch.as_tensor(np.array(images[s : s + batch], np.float32), device=dev)[:, None]
            out.append(backbone(x).cpu().numpy())
    return np.concatenate(out).astype(np.float32)


def augment_bank(
    images: np.ndarray, labels: np.ndarray, copies: int, *, seed: int = 0, blend_fraction: float = 0.25
) -> tuple[np.ndarray, np.ndarray]:
    """``copies`` augmented versions of every image: affine + smooth elastic warps, and same-class blends.

    Affine: rotation within +-15 degrees, isotropic scale 0.85-1.15, shear
    within +-0.15, translation within +-1 pixel.  Elastic: a random
    displacement field on a 3x3 grid (std 0.08 in normalised coordinates,
    about a third of a pixel), upsampled bicubically, so the warp is smooth.
    A ``blend_fraction`` of the copies are convex mixtures of the warped image
    with another warped image of the same class (weight U(0.5, 1) on the first).
    Returns (images (N * copies, H, W) float32 in [0, 1], labels).
    """
    torch = _torch()
    F = torch.nn.functional
    im = np.asarray(images, np.float32)
    y = np.asarray(labels, np.int64)
    N, H, W = im.shape
    rs = np.random.default_rng(seed)
    M = N * int(copies)
    src = np.tile(np.arange(N), int(copies))
    ang = np.deg2rad(rs.uniform(-15, 15, M))
    sc = rs.uniform(0.85, 1.15, M)
    sh = rs.uniform(-0.15, 0.15, M)
    tx, ty = rs.uniform(-2 / W, 2 / W, M), rs.uniform(-2 / H, 2 / H, M)
    c, s = np.cos(ang), np.sin(ang)
    theta = np.zeros((M, 2, 3), np.float32)
    theta[:, 0, 0], theta[:, 0, 1], theta[:, 0, 2] = c / sc, (-s + sh) / sc, tx
    theta[:, 1, 0], theta[:, 1, 1], theta[:, 1, 2] = s / sc, c / sc, ty
    with torch.no_grad():
        grid = F.affine_grid(torch.as_tensor(theta), (M, 1, H, W), align_corners=False)
        coarse = torch.as_tensor(rs.normal(0.0, 0.08, (M, 2, 3, 3)).astype(np.float32))
        disp = F.interpolate(coarse, size=(H, W), mode="bicubic", align_corners=True).permute(0, 2, 3, 1)
        x = torch.as_tensor(im[src])[:, None]
        out = F.grid_sample(x, grid + disp, mode="bilinear", padding_mode="zeros", align_corners=False)
        out = out[:, 0].clamp(0, 1).numpy()
    yb = y[src]
    k = int(round(blend_fraction * M))
    if k:
        which = rs.choice(M, size=k, replace=False)
        partner = np.empty(k, np.int64)
        for cls in np.unique(yb[which]):
            sel = which[yb[which] == cls]
            pool = np.flatnonzero(yb == cls)
            partner[np.isin(which, sel)] = rs.choice(pool, size=sel.size)
        lam = rs.uniform(0.5, 1.0, k).astype(np.float32)[:, None, None]
        out[which] = lam * out[which] + (1 - lam) * out[partner]
    return out.astype(np.float32), yb


def augmented_bank(backbone, public, cfg: DecoderConfig):
    if public.images is None:
        raise InputError("learned inversion needs the attacker's public images (PublicData(images=...))")
    ims, y = augment_bank(
        public.images, public.labels, cfg.copies, seed=cfg.seed, blend_fraction=cfg.blend_fraction
    )
    return ims, y, image_features(backbone, ims)


def public_bank(
    backbone, public, cfg: DecoderConfig = DecoderConfig()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The attacker's image bank: the public images and the augmented copies the decoders train on.

    Returns (images (N, H, W), labels (N,), backbone features (N, d)), the real
    public images first.
    """
    ims, y, F = augmented_bank(backbone, public, cfg)
    pim = np.asarray(public.images, np.float32)
    return (
        np.concatenate([pim, ims]),
        np.concatenate([np.asarray(public.labels, np.int64), y]),
        np.vstack([image_features(backbone, pim), F]),
    )
