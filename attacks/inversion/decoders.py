"""Decoders trained on the attacker's bank: a feature decoder (one image) and set decoders (n images).

* :func:`feature_decoder`: an MLP from [f / ||f||, class one-hot] to the
  image (Dosovitskiy & Brox, CVPR 2016), trained on the bank's pairs.  The
  input is scale-free, so a mean whose count is noisy (hence whose scale is
  wrong) decodes as well as a clean one.
* :func:`set_decoder`: for a mean of n records (n is public from the
  counts), an MLP from the normalised mean feature and the class to n
  images, trained on random same-class n-subsets (half of real public
  images, half of bank images) with a Hungarian-matched loss: the order of
  the n outputs is free.

Both train until their validation loss on held-out public images (every
:data:`VALIDATION_EVERY`-th one and its augmented copies) stops improving
(:func:`train_until_stopped`), seeded, on one torch thread, with torch's
deterministic algorithms; the loss and the steps taken are stored with them.
Trained decoders are cached on disk (:func:`privfed.data.cache.cached_arrays`)
keyed by the SHA-256 of everything that determines them: the backbone's
weights, the public images and labels, the hyper-parameters, torch's version.
A lock on the cache entry (:func:`cached_decoder`) makes a second process
that needs the same decoder wait for the first one's instead of training it
again, and the training checkpoints itself (:class:`TrainingCheckpoint`):
an interrupted training (Ctrl-C, SIGTERM) resumes where it was, to the same
decoder.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import linear_sum_assignment

from attacks.inversion.bank import (
    DecoderConfig,
    augmented_bank,
    backbone_digest,
    digest_arrays,
    image_features,
)
from attacks.inversion.determinism import deterministic
from attacks.inversion.training import TYPICAL_STOP, TrainingCheckpoint, cached_decoder, train_until_stopped
from privfed.errors import ConfigError, InputError

__all__ = [
    "SET_VALIDATION_SUBSETS",
    "VALIDATION_EVERY",
    "VERSION",
    "FeatureDecoder",
    "SetDecoder",
    "class_subsets",
    "decoder_cached",
    "decoder_description",
    "feature_decoder",
    "set_decoder",
    "set_validation",
    "train_until_stopped",
]

_DEFAULT = DecoderConfig()  # the full-strength defaults

#: Bump when the bank, the architectures or the training change (invalidates cached decoders).
VERSION = 2


def _torch():
    import torch

    return torch


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


def _description(kind: str, backbone, public, cfg: DecoderConfig, num_classes: int, **extra) -> dict:
    torch = _torch()
    return {
        "artefact": kind,
        "version": VERSION,
        "backbone": backbone_digest(backbone),
        "public": digest_arrays(np.asarray(public.images, np.float32), np.asarray(public.labels, np.int64)),
        "config": cfg.as_dict(),
        "num_classes": int(num_classes),
        "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
        **extra,
    }


def decoder_description(
    backbone, public, num_classes: int, cfg: DecoderConfig = _DEFAULT, n: int | None = None
) -> dict:
    """Everything that determines a decoder (its cache key): the feature decoder, or the set decoder for ``n``."""
    if n is None:
        return _description(
            "feature-decoder", backbone, public, cfg, num_classes, validation_every=VALIDATION_EVERY
        )
    return _description(
        "set-decoder",
        backbone,
        public,
        cfg,
        num_classes,
        n=int(n),
        sampler=3,
        validation_every=VALIDATION_EVERY,
        validation_subsets=SET_VALIDATION_SUBSETS,
    )


def decoder_cached(
    backbone, public, num_classes: int, cfg: DecoderConfig = _DEFAULT, n=None, cache_dir=None
) -> bool:
    """Whether the decoder (feature, or set for ``n``) is in the cache: a run needing it will not train it."""
    from privfed.data.cache import artefact_path, load_arrays

    desc = decoder_description(backbone, public, num_classes, cfg, n)
    kind = "attack-feature-decoder" if n is None else "attack-set-decoder"
    path, _ = artefact_path(kind, desc, ".npz", cache_dir)
    return path.exists() and load_arrays(path, desc) is not None


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
    backbone, public, num_classes: int, cfg: DecoderConfig = _DEFAULT, *, cache_dir=None
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

    torch = _torch()
    shape = np.asarray(public.images).shape[1:]
    d = np.asarray(public.features).shape[1]
    D = int(np.prod(shape))

    def compute():
        ims, y, F = augmented_bank(backbone, public, cfg)
        pim = np.asarray(public.images, np.float32)
        N = len(pim)
        held = np.arange(N) % VALIDATION_EVERY == VALIDATION_EVERY - 1
        bank_held = held[
            np.arange(len(ims)) % N
        ]  # augment_bank tiles the public images: copy j is of image j % N
        Xb, Yb = _inputs(F, y, num_classes), ims.reshape(len(ims), -1)
        Xp, Yp = _inputs(image_features(backbone, pim), public.labels, num_classes), pim.reshape(N, -1)
        X = np.vstack([Xb[~bank_held], np.repeat(Xp[~held], 4, 0)])
        Y = np.vstack([Yb[~bank_held], np.repeat(Yp[~held], 4, 0)])
        Xv = np.vstack([Xb[bank_held], np.repeat(Xp[held], 4, 0)])
        Yv = np.vstack([Yb[bank_held], np.repeat(Yp[held], 4, 0)])
        with deterministic(cfg.seed):
            net = _mlp(d + num_classes, cfg.hidden, D)
            val, steps = _fit(net, *(torch.as_tensor(a) for a in (X, Y, Xv, Yv)), cfg, desc, cache_dir)
        return {**_state_arrays(net), "val_loss": np.array(val), "steps_trained": np.array(steps)}

    desc = decoder_description(backbone, public, num_classes, cfg)
    arrays, key, _ = cached_decoder("feature-decoder", desc, compute, cache_dir)
    with deterministic(cfg.seed):
        net = _mlp(d + num_classes, cfg.hidden, D)
    _load_state(net, arrays)
    return FeatureDecoder(
        net, shape, num_classes, key, float(arrays["val_loss"]), int(arrays["steps_trained"])
    )


def _fit(net, X, Y, Xv, Yv, cfg: DecoderConfig, desc=None, cache_dir=None) -> tuple[float, int]:
    """Minibatch Adam until the validation loss stops improving; returns (best validation loss, steps)."""
    torch = _torch()
    g = torch.Generator().manual_seed(cfg.seed)

    def get_rng():
        return g.get_state().tolist()

    def set_rng(state):
        g.set_state(torch.as_tensor(state, dtype=torch.uint8))

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
        "training the feature decoder",
        checkpoint=None
        if desc is None
        else TrainingCheckpoint("feature-decoder", desc, cache_dir, (get_rng, set_rng)),
        typical=TYPICAL_STOP["feature-decoder"] if cfg == _DEFAULT else None,
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


def class_subsets(rs, labels: np.ndarray, n: int, size: int, by_class: dict) -> tuple[np.ndarray, np.ndarray]:
    """``size`` same-class n-subsets: a class drawn uniformly from ``by_class`` (class -> record indices), then n
    distinct records of it (with repeats only where the class holds fewer than n).  Returns (classes, indices
    (size, n)); ``labels`` is the records' labels (kept for the callers' symmetry)."""
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
    ims, y, F = augmented_bank(backbone, public, cfg)
    pim = np.asarray(public.images, np.float32)
    N = len(pim)
    held = np.arange(N) % VALIDATION_EVERY == VALIDATION_EVERY - 1
    bank_held = held[np.arange(len(ims)) % N]  # copy j is of public image j % N
    sources = [(pim, np.asarray(public.labels, np.int64), image_features(backbone, pim)), (ims, y, F)]
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
        cls, idx = class_subsets(rs, y_s, n, size, bc)
        means.append(F_s[idx].mean(1))
        classes.append(cls)
        truth.append(im_s[idx])
    return np.vstack(means), np.concatenate(classes), np.concatenate(truth)


def set_validation(
    backbone, public, n: int, cfg: DecoderConfig = _DEFAULT
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
    backbone, public, num_classes: int, n: int, cfg: DecoderConfig = _DEFAULT, *, cache_dir=None
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
                cls, idx = class_subsets(rs, y_s, n, size, bc)
                Xs.append(_inputs(F_s[idx].mean(1), cls, num_classes))
                Ts.append(im_s[idx].reshape(size, n, -1))
            return torch.as_tensor(np.vstack(Xs)), torch.as_tensor(np.concatenate(Ts))

        means, cls, truth = _validation_subsets(sources, val_by, n, cfg)
        Xv = torch.as_tensor(_inputs(means, cls, num_classes))
        Tv = torch.as_tensor(truth.reshape(len(truth), n, -1))
        perms = torch.as_tensor(list(itertools.permutations(range(n)))) if 1 < n <= 5 else None  # (P, n)
        with deterministic(cfg.seed + n):
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
                f"training the set decoder for means of {n}",
                checkpoint=TrainingCheckpoint(
                    "set-decoder",
                    desc,
                    cache_dir,
                    (lambda: rs.bit_generator.state, lambda st: setattr(rs.bit_generator, "state", st)),
                ),
                typical=TYPICAL_STOP["set-decoder"] if cfg == _DEFAULT else None,
            )
        return {**_state_arrays(net), "val_loss": np.array(best), "steps_trained": np.array(best_step)}

    desc = decoder_description(backbone, public, num_classes, cfg, n=n)
    arrays, key, _ = cached_decoder("set-decoder", desc, compute, cache_dir)
    with deterministic(cfg.seed + n):
        net = _mlp(d + num_classes, cfg.hidden, n * D)
    _load_state(net, arrays)
    return SetDecoder(
        net, n, shape, num_classes, key, float(arrays["val_loss"]), int(arrays["steps_trained"])
    )
