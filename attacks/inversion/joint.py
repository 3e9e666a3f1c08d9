"""The joint set attacker: invert a mean of n records the way a server with the public bank would.

What the attacker knows (attacks.md, "Threat model as data"): the frozen
backbone f, the public images and their augmented bank
(:func:`attacks.inversion.learned.public_bank`), the released class sum, count and,
where uploaded, the client's second moment G_k.  n is read off the count
(rounded; exact when counts are released without noise).

Three steps per released cell (class c, mean m, n):

1. **Bank search** (:func:`bank_search`): subsets S of n bank images of class
   c minimising the feature residual ||mean_{i in S} f_i - m||^2 / ||m||^2
   (+ ||sum_{i in S} f_i f_i^T - G||_F^2 / ||G||_F^2 when G is released), by
   coordinate descent over the n slots (each slot swapped for the best bank
   image given the others) from random starts; the best distinct subsets
   are kept as candidates.
2. **Joint latent optimisation** (:func:`joint_decode`): the n images are
   decoded by the project's single-image decoder
   (:class:`attacks.inversion.learned.FeatureDecoder`) from n latent codes started at
   the candidate's bank features; the codes of a candidate are optimised
   jointly (Adam) so that the mean feature of the n decoded images matches
   the release (and their second moment matches G).
3. **Selection and joint pixel polish** (:func:`polish`): per cell, the
   candidate with the lowest feature residual is kept (the residual is what
   the server can measure; no private record is read), then its n images'
   pixels are refined jointly against the same objective.

With noisy counts the scale of a released mean is noisy: the mean is then
matched in direction only (cosine), as the other learned backends do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.inversion.determinism import deterministic
from privfed.errors import ConfigError

__all__ = ["JointConfig", "bank_search", "invert_joint", "joint_decode", "polish"]


def _torch():
    import torch

    return torch


@dataclass(frozen=True)
class JointConfig:
    """Budgets of the joint set attacker (defaults: the full-strength setting)."""

    restarts: int = 24  # random starts of the bank search per cell
    sweeps: int = 6  # coordinate-descent sweeps over the n slots per start
    candidates: int = 4  # distinct bank subsets per cell carried into the latent optimisation
    latent_steps: int = 300
    latent_lrs: tuple = (0.02,)  # every candidate is optimised at each; the lowest residual is kept
    polish_steps: int = 200
    polish_lr: float = 0.02
    second_weight: float = 1.0  # weight of the G residual next to the mean residual
    max_n: int = 16  # larger means are attacked as means of max_n

    def __post_init__(self) -> None:
        for k in ("restarts", "sweeps", "candidates", "max_n"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"JointConfig.{k} must be a positive int, got {v!r}")
        for k in ("latent_steps", "polish_steps"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ConfigError(f"JointConfig.{k} must be an int >= 0, got {v!r}")
        if not (
            self.latent_lrs
            and all(lr > 0 for lr in self.latent_lrs)
            and self.polish_lr > 0
            and self.second_weight >= 0
        ):
            raise ConfigError("JointConfig: learning rates must be > 0 and second_weight >= 0")


# -- 1. bank search ------------------------------------------------------------------------------------------
def bank_search(
    pool: np.ndarray,
    mean: np.ndarray,
    n: int,
    rng: np.random.Generator,
    *,
    second=None,
    second_weight: float = 1.0,
    restarts: int = 24,
    sweeps: int = 6,
    keep: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    """Subsets of ``n`` rows of ``pool`` (M, d) whose mean is closest to ``mean`` (and second moment to ``second``).

    Objective J(S) = ||sum_S f - n m||^2 / ||n m||^2 + w ||sum_S f f^T - G||_F^2 / ||G||_F^2;
    for each start, every slot in turn is replaced by the pool row that
    minimises J given the other n - 1 (exact, vectorised over the pool), for
    ``sweeps`` sweeps or until no slot changes.  A subset may repeat a row
    (a client may hold two near-identical images).  Returns (the ``keep``
    best distinct subsets (k, n) as pool indices, their objectives (k,)).
    """
    P = np.asarray(pool, np.float64)
    M = P.shape[0]
    n = int(n)
    target = n * np.asarray(mean, np.float64)
    ts = max(float(target @ target), 1e-24)
    sq = (P**2).sum(1)
    use_g = second is not None and second_weight > 0
    if use_g:
        G = np.asarray(second, np.float64)
        gs = max(float((G**2).sum()), 1e-24)
        sq4 = sq**2
    found: dict[tuple, float] = {}
    for _ in range(int(restarts)):
        S = rng.integers(0, M, n)
        for _ in range(int(sweeps)):
            changed = False
            for p in range(n):
                rest = np.delete(S, p)
                r = P[rest].sum(0) - target  # residual without slot p
                obj = (sq + 2 * P @ r) / ts
                if use_g:
                    R = P[rest].T @ P[rest] - G
                    obj = obj + second_weight * (2 * np.einsum("md,de,me->m", P, R, P) + sq4) / gs
                j = int(obj.argmin())
                if j != S[p]:
                    S[p], changed = j, True
            if not changed:
                break
        key = tuple(sorted(int(i) for i in S))
        if key not in found:
            found[key] = _objective(
                P, key, target, ts, G if use_g else None, gs if use_g else 1.0, second_weight
            )
    best = sorted(found, key=found.get)[: int(keep)]
    return np.array(best, np.int64).reshape(len(best), n), np.array([found[k] for k in best])


def _objective(P, idx, target, ts, G, gs, w) -> float:
    X = P[list(idx)]
    r = X.sum(0) - target
    val = float(r @ r) / ts
    if G is not None:
        val += w * float(((X.T @ X - G) ** 2).sum()) / gs
    return val


# -- 2. joint latent optimisation ------------------------------------------------------------------------------
def _residual(f, means, seconds, n: int, cosine: bool, w: float):
    """Per-group feature residual of decoded features f (g, n, d) against means (g, d) [and G (g, d, d)]."""
    torch = _torch()
    mu = f.mean(1)
    if cosine:
        res = 1.0 - (mu * means).sum(1) / (
            mu.norm(dim=1).clamp_min(1e-12) * means.norm(dim=1).clamp_min(1e-12)
        )
    else:
        res = ((mu - means) ** 2).sum(1) / (means**2).sum(1).clamp_min(1e-12)
    if seconds is not None:
        has = torch.as_tensor([bool(s.abs().sum() > 0) for s in seconds], device=f.device)
        Gh = torch.einsum("gnd,gne->gde", f, f)
        rg = ((Gh - seconds) ** 2).sum((1, 2)) / (seconds**2).sum((1, 2)).clamp_min(1e-12)
        res = res + w * torch.where(has, rg, torch.zeros_like(rg))
    return res


def joint_decode(
    backbone,
    decoder,
    latents: np.ndarray,
    classes: np.ndarray,
    means: np.ndarray,
    *,
    seconds: np.ndarray | None = None,
    steps: int = 300,
    lr: float = 0.02,
    cosine: bool = False,
    second_weight: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Optimise n latent codes per group jointly so the decoded images' mean feature matches.

    ``latents`` (g, n, d): starting codes (e.g. bank features); ``classes`` (g,);
    ``means`` (g, d) the released means; ``seconds`` (g, d, d) the released
    second moments (all zeros: none for that group).  Returns (images
    (g, n, H, W), final residuals (g,)).
    """
    torch = _torch()
    g, n, d = latents.shape
    cls = np.repeat(np.asarray(classes, np.int64), n)
    z = torch.as_tensor(np.asarray(latents, np.float32).reshape(g * n, d)).clone().requires_grad_(True)
    t = torch.as_tensor(np.asarray(means, np.float32))
    S = None if seconds is None else torch.as_tensor(np.asarray(seconds, np.float32))
    for p in decoder.net.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([z], lr=lr)

    def forward():
        x = decoder.decode_latent(z, cls)
        f = backbone(x[:, None]).reshape(g, n, -1)
        return x, _residual(f, t, S, n, cosine, second_weight)

    for _ in range(int(steps)):
        opt.zero_grad()
        _, res = forward()
        res.sum().backward()
        opt.step()
    with torch.no_grad():
        x, res = forward()
    return x.reshape(g, n, *x.shape[1:]).numpy(), res.numpy().astype(np.float64)


# -- 3. joint pixel polish ---------------------------------------------------------------------------------------
def polish(
    backbone,
    images: np.ndarray,
    means: np.ndarray,
    *,
    seconds: np.ndarray | None = None,
    steps: int = 200,
    lr: float = 0.02,
    cosine: bool = False,
    second_weight: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Refine the pixels of n images per group jointly (logits, Adam) against the same residual.

    Returns (images (g, n, H, W), residuals (g,)); a group whose residual
    would grow keeps its input images.
    """
    torch = _torch()
    x0 = np.asarray(images, np.float32)
    g, n = x0.shape[:2]
    shape = x0.shape[2:]
    t = torch.as_tensor(np.asarray(means, np.float32))
    S = None if seconds is None else torch.as_tensor(np.asarray(seconds, np.float32))
    z = torch.logit(torch.as_tensor(np.clip(x0, 0.005, 0.995))).clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)

    def residual(x):
        f = backbone(x.reshape(g * n, 1, *shape)).reshape(g, n, -1)
        return _residual(f, t, S, n, cosine, second_weight)

    with torch.no_grad():
        start = residual(torch.as_tensor(x0))
    for _ in range(int(steps)):
        opt.zero_grad()
        residual(torch.sigmoid(z)).sum().backward()
        opt.step()
    with torch.no_grad():
        x = torch.sigmoid(z)
        res = residual(x)
        keep = res <= start
        x = torch.where(keep[:, None, None, None], x, torch.as_tensor(x0))
        res = torch.where(keep, res, start)
    return x.numpy(), res.numpy().astype(np.float64)


# -- the attack ------------------------------------------------------------------------------------------------
def invert_joint(
    backbone,
    decoder,
    bank: tuple,
    means: np.ndarray,
    classes: np.ndarray,
    ns: np.ndarray,
    rng: np.random.Generator,
    cfg: JointConfig = JointConfig(),
    *,
    seconds: np.ndarray | None = None,
    cosine: bool = False,
    progress=None,
) -> list[np.ndarray]:
    """Invert released means: per cell, ``ns[i]`` images (a list of (n_i, H, W) arrays).

    ``bank`` = (images, labels, features) of :func:`attacks.inversion.learned.public_bank`;
    ``seconds`` (r, d, d): the released second moment to match per cell
    (zeros: none).  ``progress(k)`` is called after each cell's bank search.
    """
    _, b_y, b_F = bank
    means = np.asarray(means, np.float64)
    classes = np.asarray(classes, np.int64)
    ns = np.minimum(np.maximum(np.asarray(ns, np.int64), 1), cfg.max_n)
    out: list = [None] * len(means)
    frozen = [(p, p.requires_grad) for p in backbone.parameters()]
    for p, _ in frozen:  # gradients flow to the images only
        p.requires_grad_(False)
    try:
        with deterministic(int(rng.integers(2**31))):  # one thread: the same images on any machine
            _run(backbone, decoder, b_F, b_y, means, classes, ns, rng, cfg, seconds, cosine, progress, out)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return out


def _run(backbone, decoder, b_F, b_y, means, classes, ns, rng, cfg, seconds, cosine, progress, out) -> None:
    for n in np.unique(ns):
        idx = np.flatnonzero(ns == n)
        lat, grp, cls, mus, sec = [], [], [], [], []
        for i in idx:
            pool = np.flatnonzero(b_y == classes[i])
            if pool.size == 0:
                pool = np.arange(len(b_y))
            G = None if seconds is None or not np.any(seconds[i]) else seconds[i]
            subsets, _ = bank_search(
                b_F[pool],
                means[i],
                int(n),
                rng,
                second=G,
                second_weight=cfg.second_weight,
                restarts=cfg.restarts,
                sweeps=cfg.sweeps,
                keep=cfg.candidates,
            )
            for s in subsets:
                lat.append(b_F[pool[s]])
                grp.append(i)
                cls.append(classes[i])
                mus.append(means[i])
                sec.append(np.zeros((b_F.shape[1],) * 2) if G is None else G)
            if progress is not None:
                progress(1)
        secs = np.array(sec) if seconds is not None else None
        runs = [
            joint_decode(
                backbone,
                decoder,
                np.array(lat),
                np.array(cls),
                np.array(mus),
                seconds=secs,
                steps=cfg.latent_steps,
                lr=lr,
                cosine=cosine,
                second_weight=cfg.second_weight,
            )
            for lr in cfg.latent_lrs
        ]
        ims = np.concatenate([r[0] for r in runs])
        res = np.concatenate([r[1] for r in runs])
        grp = np.tile(np.array(grp), len(runs))
        mus = mus * len(runs)
        secs = None if secs is None else np.concatenate([secs] * len(runs))
        pick = [np.flatnonzero(grp == i)[np.argmin(res[grp == i])] for i in idx]
        sel_secs = None if secs is None else secs[pick]
        pol, _ = polish(
            backbone,
            ims[pick],
            np.array(mus)[pick],
            seconds=sel_secs,
            steps=cfg.polish_steps,
            lr=cfg.polish_lr,
            cosine=cosine,
            second_weight=cfg.second_weight,
        )
        for j, i in enumerate(idx):
            out[i] = pol[j]
