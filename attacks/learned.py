"""Learned inversion: decoders trained on the attacker's public data, then refined against the target.

What the attacker knows (attacks.md, "Threat model as data"): the frozen
backbone f and the public split's labelled images.  Nothing here reads a
private record.

* :func:`augment_bank`: many augmented copies of every public image
  (random affine maps, smooth elastic displacements, same-class blends),
  so that a decoder sees far more (feature, image) pairs than the public
  split holds (the public split alone is ~540 images of 8x8 digits).
* :func:`feature_decoder`: an MLP from [f / ||f||, class one-hot] to the
  image (Dosovitskiy & Brox, CVPR 2016), trained on the bank's pairs.
  The input is scale-free, so a mean whose count is noisy (hence whose scale
  is wrong) decodes as well as a clean one.
* :func:`set_decoder`: for a mean of n records (n is public from the
  counts), an MLP from the normalised mean feature and the class to n
  images, trained on random same-class n-subsets (half of them of real
  public images, half of bank images, so real images weigh as much as the
  augmented bank) with a Hungarian-matched loss: the order of the n
  outputs is free.
* :func:`refine_pixels` / :func:`refine_set`: pixel-space refinement of a
  decoder's output against the target with a scale-free (cosine) loss on
  the feature, optionally with total variation; for a set, the n images
  are refined jointly so that the mean of their features matches.  Which
  refinement to use is chosen on *public* simulations (:func:`select_refinement`),
  never on the targets.

Trained decoders are cached on disk (:func:`privfed.data.cache.cached_arrays`),
keyed by the SHA-256 of everything that determines them: the backbone's
weights, the public images and labels, the hyper-parameters, torch's version.
Training is deterministic on a given torch build: seeded, on one torch
thread (a matrix product's summation order depends on the thread count, so
a decoder trained on 2 threads differs from one trained on 4) and with
torch's deterministic algorithms, all inside a context that restores the
caller's settings (:func:`deterministic`).  The feature decoder trains until
its validation loss (held-out public images and their augmented copies)
stops improving; the loss and the steps taken are stored with it.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import sys
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from privfed.errors import ConfigError, InputError

__all__ = [
    "DecoderConfig",
    "FeatureDecoder",
    "SetDecoder",
    "augment_bank",
    "deterministic",
    "feature_decoder",
    "progress_bar",
    "progress_bars",
    "public_bank",
    "refine_pixels",
    "refine_set",
    "select_refinement",
    "set_decoder",
    "set_validation",
]

#: Bump when the bank, the architectures or the training change (invalidates cached decoders).
VERSION = 2


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def deterministic(seed: int):
    """Seeded, one-thread, deterministic-algorithm torch inside the block; the caller's settings after it.

    The random state is forked (the caller's generator is left as it was).
    """
    torch = _torch()
    old = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(old_det)
            torch.set_num_threads(old)


_seeded = deterministic


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


def _digest_arrays(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def backbone_digest(backbone) -> str:
    """SHA-256 of the backbone's weights (its identity in decoder cache keys)."""
    state = backbone.state_dict()
    return _digest_arrays(*[state[k].detach().cpu().numpy() for k in sorted(state)])


def _features(backbone, images: np.ndarray, batch: int = 4096) -> np.ndarray:
    torch = _torch()
    dev = next(backbone.parameters()).device
    out = []
    with torch.no_grad():
        for s in range(0, len(images), batch):
            x = torch.as_tensor(np.array(images[s : s + batch], np.float32), device=dev)[:, None]
            out.append(backbone(x).cpu().numpy())
    return np.concatenate(out).astype(np.float32)


# -- the augmented bank ---------------------------------------------------------------------------------------
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


def _mlp(d_in: int, hidden: int, d_out: int):
    from torch import nn

    return nn.Sequential(
        nn.Linear(d_in, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, d_out),
        nn.Sigmoid(),
    )


def _inputs(features: np.ndarray, classes, num_classes: int) -> np.ndarray:
    F = np.asarray(features, np.float32)
    F = F / np.maximum(np.linalg.norm(F, axis=1, keepdims=True), 1e-12)
    return np.hstack([F, np.eye(num_classes, dtype=np.float32)[np.asarray(classes, np.int64)]])


def _state_arrays(net) -> dict:
    return {f"w{i:02d}": p.detach().cpu().numpy() for i, p in enumerate(net.parameters())}


def _load_state(net, arrays: dict) -> None:
    torch = _torch()
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.as_tensor(arrays[f"w{i:02d}"]))
    net.eval()


def _bank(backbone, public, cfg: DecoderConfig):
    if public.images is None:
        raise InputError("learned inversion needs the attacker's public images (PublicData(images=...))")
    ims, y = augment_bank(
        public.images, public.labels, cfg.copies, seed=cfg.seed, blend_fraction=cfg.blend_fraction
    )
    return ims, y, _features(backbone, ims)


def public_bank(
    backbone, public, cfg: DecoderConfig = DecoderConfig()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The attacker's image bank: the public images and the augmented copies the decoders train on.

    Returns (images (N, H, W), labels (N,), backbone features (N, d)), the real
    public images first.
    """
    ims, y, F = _bank(backbone, public, cfg)
    pim = np.asarray(public.images, np.float32)
    return (
        np.concatenate([pim, ims]),
        np.concatenate([np.asarray(public.labels, np.int64), y]),
        np.vstack([_features(backbone, pim), F]),
    )


def _description(kind: str, backbone, public, cfg: DecoderConfig, num_classes: int, **extra) -> dict:
    torch = _torch()
    return {
        "artefact": kind,
        "version": VERSION,
        "backbone": backbone_digest(backbone),
        "public": _digest_arrays(np.asarray(public.images, np.float32), np.asarray(public.labels, np.int64)),
        "config": cfg.as_dict(),
        "num_classes": int(num_classes),
        "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
        **extra,
    }


class FeatureDecoder:
    """(feature, class) -> image; ``__call__`` returns (r, H, W) float32 in [0, 1].

    ``val_loss``: its mean squared pixel error on the held-out public images and
    their augmented copies; ``steps_trained``: the steps it took until validation
    stopped improving.
    """

    def __init__(
        self, net, shape, num_classes: int, key: str, val_loss: float = float("nan"), steps_trained: int = 0
    ):
        self.net, self.shape, self.num_classes, self.key = net, tuple(shape), num_classes, key
        self.val_loss, self.steps_trained = float(val_loss), int(steps_trained)

    def __call__(self, features: np.ndarray, classes) -> np.ndarray:
        torch = _torch()
        with torch.no_grad():
            out = self.net(torch.as_tensor(_inputs(features, classes, self.num_classes)))
        return out.reshape(-1, *self.shape).numpy()

    def decode_latent(self, latent, classes):
        """Differentiable decoding of latent codes (torch (r, d), any scale) for classes (r,): (r, H, W)."""
        torch = _torch()
        u = latent / latent.norm(dim=1, keepdim=True).clamp_min(1e-12)
        onehot = torch.as_tensor(np.eye(self.num_classes, dtype=np.float32)[np.asarray(classes, np.int64)])
        return self.net(torch.cat([u, onehot.to(u.device)], 1)).reshape(-1, *self.shape)


#: Every VALIDATION_EVERY-th public image (and its augmented copies) is held out to stop the feature decoder.
VALIDATION_EVERY = 10


def feature_decoder(
    backbone, public, num_classes: int, cfg: DecoderConfig = DecoderConfig(), *, cache_dir=None
) -> FeatureDecoder:
    """The feature decoder for this backbone and public data (trained on a cache miss).

    Training pairs: the augmented bank and the real public images (repeated 4
    times, so they weigh as much as their copies).  Every
    :data:`VALIDATION_EVERY`-th public image and its copies are held out; Adam
    runs in minibatches, the validation loss is measured every
    ``cfg.val_every`` steps, each validation without improvement halves the
    learning rate, and ``cfg.patience`` of them in a row stop training (at
    most ``cfg.feature_steps`` steps); the best validated weights are kept.
    """
    from privfed.data.cache import cached_arrays

    torch = _torch()
    shape = np.asarray(public.images).shape[1:]
    d = np.asarray(public.features).shape[1]
    D = int(np.prod(shape))

    def compute():
        ims, y, F = _bank(backbone, public, cfg)
        pim = np.asarray(public.images, np.float32)
        N = len(pim)
        held = np.arange(N) % VALIDATION_EVERY == VALIDATION_EVERY - 1
        bank_held = held[
            np.arange(len(ims)) % N
        ]  # augment_bank tiles the public images: copy j is of image j % N
        Xb, Yb = _inputs(F, y, num_classes), ims.reshape(len(ims), -1)
        Xp, Yp = _inputs(_features(backbone, pim), public.labels, num_classes), pim.reshape(N, -1)
        X = np.vstack([Xb[~bank_held], np.repeat(Xp[~held], 4, 0)])
        Y = np.vstack([Yb[~bank_held], np.repeat(Yp[~held], 4, 0)])
        Xv = np.vstack([Xb[bank_held], np.repeat(Xp[held], 4, 0)])
        Yv = np.vstack([Yb[bank_held], np.repeat(Yp[held], 4, 0)])
        with _seeded(cfg.seed):
            net = _mlp(d + num_classes, cfg.hidden, D)
            val, steps = _fit(net, *(torch.as_tensor(a) for a in (X, Y, Xv, Yv)), cfg)
        return {**_state_arrays(net), "val_loss": np.array(val), "steps_trained": np.array(steps)}

    desc = _description(
        "feature-decoder", backbone, public, cfg, num_classes, validation_every=VALIDATION_EVERY
    )
    arrays, key, _ = cached_arrays("attack-feature-decoder", desc, compute, cache_dir)
    with _seeded(cfg.seed):
        net = _mlp(d + num_classes, cfg.hidden, D)
    _load_state(net, arrays)
    return FeatureDecoder(
        net, shape, num_classes, key, float(arrays["val_loss"]), int(arrays["steps_trained"])
    )


def _fit(net, X, Y, Xv, Yv, cfg: DecoderConfig) -> tuple[float, int]:
    """Minibatch Adam until the validation loss stops improving; returns (best validation loss, steps)."""
    torch = _torch()
    g = torch.Generator().manual_seed(cfg.seed)

    def batch_loss():
        b = torch.randint(0, X.shape[0], (cfg.batch,), generator=g)
        return ((net(X[b]) - Y[b]) ** 2).mean()

    def val_loss() -> float:
        return float(((net(Xv) - Yv) ** 2).mean())

    return train_until_stopped(
        net,
        batch_loss,
        val_loss,
        cfg,
        cfg.feature_steps,
        "training the feature decoder (until validation stops improving)",
    )


def train_until_stopped(
    net, batch_loss, val_loss, cfg: DecoderConfig, cap: int, desc: str
) -> tuple[float, int]:
    """Adam on ``batch_loss()`` until ``val_loss()`` (measured every ``cfg.val_every`` steps) stops improving.

    Each validation without a relative improvement of 1e-3 halves the
    learning rate; ``cfg.patience`` of them in a row stop training (at most
    ``cap`` steps).  The best validated weights are loaded back into ``net``
    (left in eval mode).  Returns (best validation loss, the step it was
    measured at).
    """
    torch = _torch()
    lr = cfg.lr
    opt = torch.optim.Adam(net.parameters(), lr=lr)

    def validate() -> float:
        with torch.no_grad():
            return float(val_loss())

    best, best_step, bad, step = validate(), 0, 0, 0
    best_state = [p.detach().clone() for p in net.parameters()]
    with progress_bar(cap, desc) as bar:
        while step < cap:
            opt.zero_grad()
            batch_loss().backward()
            opt.step()
            step += 1
            bar.update(1)
            if step % cfg.val_every == 0:
                v = validate()
                if v < best * (1 - 1e-3):
                    best, best_step, bad = v, step, 0
                    best_state = [p.detach().clone() for p in net.parameters()]
                else:
                    bad += 1
                    lr /= 2
                    for group in opt.param_groups:
                        group["lr"] = lr
                    if bad >= cfg.patience:
                        break
                bar.set_postfix_str(f"validation mse {best:.4f}", refresh=False)
    with torch.no_grad():
        for p, q in zip(net.parameters(), best_state):
            p.copy_(q)
    net.eval()
    return best, best_step


_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("privfed_attack_progress", default=False)


@contextlib.contextmanager
def progress_bars(enabled: bool = True):
    """Show progress bars (stderr) for decoder training inside the block."""
    token = _PROGRESS.set(bool(enabled))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def progress_bar(total: int, desc: str, unit: str = "step"):
    """A tqdm bar on stderr, shown only inside :func:`progress_bars` (ETA from the first updates)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=int(total),
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        disable=not _PROGRESS.get(),
        mininterval=1.0,
    )


class SetDecoder:
    """(mean feature of n records, class) -> n images; ``__call__`` returns (r, n, H, W).

    ``val_loss``: its Hungarian-matched mean squared pixel error on validation
    subsets of held-out public images (and their augmented copies);
    ``steps_trained``: the steps it took until validation stopped improving.
    """

    def __init__(
        self,
        net,
        n: int,
        shape,
        num_classes: int,
        key: str,
        val_loss: float = float("nan"),
        steps_trained: int = 0,
    ):
        self.net, self.n, self.shape, self.num_classes, self.key = net, n, tuple(shape), num_classes, key
        self.val_loss, self.steps_trained = float(val_loss), int(steps_trained)

    def __call__(self, means: np.ndarray, classes) -> np.ndarray:
        torch = _torch()
        with torch.no_grad():
            out = self.net(torch.as_tensor(_inputs(means, classes, self.num_classes)))
        return out.reshape(-1, self.n, *self.shape).numpy()


def _subsets(rs, labels: np.ndarray, n: int, size: int, by_class: dict) -> tuple[np.ndarray, np.ndarray]:
    cls = rs.choice(np.array(sorted(by_class)), size=size)
    idx = np.empty((size, n), np.int64)
    for c in np.unique(cls):
        rows = np.flatnonzero(cls == c)
        pool = by_class[c]
        # n distinct records of the class per subset: draw with replacement, redraw subsets with a repeat
        j = rs.integers(0, pool.size, (rows.size, n))
        while n > 1 and pool.size >= n:
            s = np.sort(j, axis=1)
            bad = np.flatnonzero((np.diff(s, axis=1) == 0).any(axis=1))
            if bad.size == 0:
                break
            j[bad] = rs.integers(0, pool.size, (bad.size, n))
        idx[rows] = pool[j]
    return cls, idx


def _matched_loss(out, T, n: int, perms):
    """Hungarian-matched mean squared error of outputs (B, n, D) against true sets (B, n, D)."""
    torch = _torch()
    cost = ((out[:, :, None, :] - T[:, None, :, :]) ** 2).mean(-1)  # (B, n out, n true)
    if n == 1:
        return cost.mean()
    if perms is not None:  # every assignment enumerated: exact and vectorised
        return cost[:, torch.arange(n)[None, :], perms].sum(-1).min(1).values.mean() / n
    cn = cost.detach().numpy()
    perm = np.stack([linear_sum_assignment(cn[i])[1] for i in range(cn.shape[0])])
    return torch.gather(cost, 2, torch.as_tensor(perm)[:, :, None]).mean()


#: Validation subsets of held-out public images per set decoder (drawn once, seeded).
SET_VALIDATION_SUBSETS = 1024


def _set_sources(backbone, public, cfg: DecoderConfig, n: int):
    """The real public images and the bank as (images, labels, features), with their train / held-out pools."""
    ims, y, F = _bank(backbone, public, cfg)
    pim = np.asarray(public.images, np.float32)
    N = len(pim)
    held = np.arange(N) % VALIDATION_EVERY == VALIDATION_EVERY - 1
    bank_held = held[np.arange(len(ims)) % N]  # copy j is of public image j % N
    sources = [(pim, np.asarray(public.labels, np.int64), _features(backbone, pim)), (ims, y, F)]
    train_by, val_by = [], []
    for (_, lab, _), h in zip(sources, (held, bank_held)):
        train_by.append({c: np.flatnonzero((lab == c) & ~h) for c in np.unique(lab)})
        val_by.append({c: np.flatnonzero((lab == c) & h) for c in np.unique(lab)})
    for c, pool in train_by[0].items():
        if pool.size < n:
            raise InputError(
                f"public class {c} has {pool.size} training images; a set decoder for n={n} needs {n}"
            )
    return sources, train_by, val_by


def _validation_subsets(sources, val_by, n: int, cfg: DecoderConfig):
    rs = np.random.default_rng(cfg.seed + 7919 * n + 1)
    half = SET_VALIDATION_SUBSETS // 2
    means, classes, truth = [], [], []
    for (im_s, y_s, F_s), bc, size in zip(sources, val_by, (half, SET_VALIDATION_SUBSETS - half)):
        cls, idx = _subsets(rs, y_s, n, size, bc)
        means.append(F_s[idx].mean(1))
        classes.append(cls)
        truth.append(im_s[idx])
    return np.vstack(means), np.concatenate(classes), np.concatenate(truth)


def set_validation(
    backbone, public, n: int, cfg: DecoderConfig = DecoderConfig()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The validation set that stops a set decoder for means of ``n``: held-out public images only.

    :data:`SET_VALIDATION_SUBSETS` same-class n-subsets (half of real held-out
    public images, half of their augmented copies; distinct records where the
    class holds n of them), drawn once from ``cfg.seed``.  Returns (mean
    features (S, d), classes (S,), true images (S, n, H, W)).
    """
    sources, _, val_by = _set_sources(backbone, public, cfg, int(n))
    return _validation_subsets(sources, val_by, int(n), cfg)


def set_decoder(
    backbone, public, num_classes: int, n: int, cfg: DecoderConfig = DecoderConfig(), *, cache_dir=None
) -> SetDecoder:
    """The set decoder for means of ``n`` records (trained on a cache miss).

    Training pairs: a class c, n distinct records of c drawn either from the
    real public images or from the augmented bank (probability 1/2 each),
    the mean of their features -> the n images; loss: mean squared error
    after the Hungarian matching of outputs to images (order is free).

    Every :data:`VALIDATION_EVERY`-th public image and its augmented copies
    are held out (as for :func:`feature_decoder`); :data:`SET_VALIDATION_SUBSETS`
    n-subsets of them (half real, half augmented, drawn once) are the
    validation set.  Adam runs in minibatches of fresh training subsets; the
    validation loss is measured every ``cfg.val_every`` steps, each
    validation without improvement halves the learning rate, ``cfg.patience``
    of them in a row stop training (at most ``cfg.steps`` steps) and the best
    validated weights are kept.  Seeded, on one torch thread, deterministic.
    """
    from privfed.data.cache import cached_arrays

    torch = _torch()
    n = int(n)
    if n < 1:
        raise ConfigError(f"a set decoder needs n >= 1, got n={n}")
    shape = np.asarray(public.images).shape[1:]
    d = np.asarray(public.features).shape[1]
    D = int(np.prod(shape))

    def compute():
        sources, train_by, val_by = _set_sources(backbone, public, cfg, n)
        rs = np.random.default_rng(cfg.seed + 7919 * n)
        half = cfg.batch // 2

        def draw(rs, by, sizes):
            Xs, Ts = [], []
            for (im_s, y_s, F_s), bc, size in zip(sources, by, sizes):
                cls, idx = _subsets(rs, y_s, n, size, bc)
                Xs.append(_inputs(F_s[idx].mean(1), cls, num_classes))
                Ts.append(im_s[idx].reshape(size, n, -1))
            return torch.as_tensor(np.vstack(Xs)), torch.as_tensor(np.concatenate(Ts))

        means, cls, truth = _validation_subsets(sources, val_by, n, cfg)
        Xv = torch.as_tensor(_inputs(means, cls, num_classes))
        Tv = torch.as_tensor(truth.reshape(len(truth), n, -1))
        perms = torch.as_tensor(list(itertools.permutations(range(n)))) if 1 < n <= 5 else None  # (P, n)
        with _seeded(cfg.seed + n):
            net = _mlp(d + num_classes, cfg.hidden, n * D)

            def batch_loss():
                X, T = draw(rs, train_by, (half, cfg.batch - half))
                return _matched_loss(net(X).reshape(-1, n, D), T, n, perms)

            best, best_step = train_until_stopped(
                net,
                batch_loss,
                lambda: _matched_loss(net(Xv).reshape(-1, n, D), Tv, n, perms),
                cfg,
                cfg.steps,
                f"training the set decoder for means of {n} (until validation stops improving)",
            )
        return {**_state_arrays(net), "val_loss": np.array(best), "steps_trained": np.array(best_step)}

    desc = _description(
        "set-decoder",
        backbone,
        public,
        cfg,
        num_classes,
        n=n,
        sampler=3,
        validation_every=VALIDATION_EVERY,
        validation_subsets=SET_VALIDATION_SUBSETS,
    )
    arrays, key, _ = cached_arrays("attack-set-decoder", desc, compute, cache_dir)
    with _seeded(cfg.seed + n):
        net = _mlp(d + num_classes, cfg.hidden, n * D)
    _load_state(net, arrays)
    return SetDecoder(
        net, n, shape, num_classes, key, float(arrays["val_loss"]), int(arrays["steps_trained"])
    )


# -- refinement -------------------------------------------------------------------------------------------------
def _tv(x):
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    return dh + dw


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
    with _seeded(seed):
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
                obj = obj + tv * _tv(x.reshape(r * n, *shape)).reshape(r, n).mean(1)
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
    cls, idx = _subsets(rs, y, n, trials, by)
    truth = ims[idx]  # (trials, n, H, W)
    F = _features(backbone, ims)
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
