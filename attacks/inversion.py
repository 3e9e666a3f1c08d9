"""Feature inversion: rebuild a client's images from what it shared and the known backbone.

A released class mean m_kc = s_kc / n_kc is the backbone feature of a
client's images averaged over n_kc samples; with n_kc = 1 it is the feature
of one image.  Knowing the frozen backbone f, the server looks for an image
x whose feature matches (methods.md section 5, "feature inversion"; the
FedCGS paper, Guan et al., evaluates this attack by PSNR):

    min_x  ||f(x) - m||^2 / ||m||^2 + lambda_TV TV(x),   x in [0, 1]^{H x W}

Backends (``backend=``):

* ``pixel``: Adam on the pixels (x = sigmoid(z)) with a total-variation
  prior (Mahendran & Vedaldi, CVPR 2015), started from the attacker's public
  class-mean image;
* ``decoder``: an MLP trained on the attacker's public (feature, image)
  pairs (Dosovitskiy & Brox, CVPR 2016), applied to the released feature;
  under noise it is trained noise-aware (public features plus the view's
  noise on a mean), so it returns the posterior-mean image;
* ``dip``: a deep-image-prior generator (Ulyanov, Vedaldi & Lempitsky, CVPR
  2018): a small convolutional net from a fixed random input whose weights
  are optimised so that f(G(z)) matches, one net per target (grouped convs);
  meant for real images on a GPU.

Sources (``source=``): ``mean`` inverts every released class mean;
``second`` first unmixes each client's second moment G_k (with its class
sums and counts, :mod:`attacks.unmixing`) into per-sample features and
inverts each (the two-stage attack).

Scoring (attacks.md): per true image of a released cell, the best PSNR /
SSIM (scikit-image, data_range 1, win_size 7) over the cell's
reconstructions, identification (the nearest private image of one of the
cell's reconstructions is that image), feature cosine, and the same numbers
for the public class-mean image, the prior alone; delta-PSNR is the
reconstruction's PSNR minus the prior's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.base import Attack
from attacks.metrics import cosine, psnr, ssim
from attacks.unmixing import unmix
from attacks.view import GroundTruth, ServerView
from privfed.errors import ConfigError, InputError

__all__ = [
    "BACKENDS",
    "FeatureInversion",
    "InversionResult",
    "invert_dip",
    "invert_pixels",
    "total_variation",
    "train_decoder",
]

BACKENDS = ("pixel", "decoder", "dip")
SOURCES = ("mean", "second")


def _torch():
    import torch

    return torch


def total_variation(x):
    """Anisotropic TV (mean absolute difference of neighbours) per image of a (r, 1, H, W) tensor."""
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    return dh + dw


def _device(backbone):
    try:
        return next(backbone.parameters()).device
    except StopIteration:
        return _torch().device("cpu")


def _feature_loss(backbone, x, t, tn, loss: str = "l2"):
    f = backbone(x)
    if loss == "cosine":  # scale-free: for means whose count (hence scale) is noisy
        return 1.0 - (f * t).sum(1) / (f.norm(dim=1).clamp_min(1e-12) * tn.sqrt())
    return ((f - t) ** 2).sum(1) / tn


def invert_pixels(backbone, targets: np.ndarray, init: np.ndarray, *, steps: int = 300, lr: float = 0.1,
                  tv: float = 0.005, anchor: float = 0.0, loss: str = "l2", seed: int = 0) -> np.ndarray:
    """Pixel optimisation with a TV prior from ``init`` images; returns (r, H, W) float32 in [0, 1].

    ``anchor`` adds anchor * mean((x - init)^2), a Gaussian prior centred on the start image;
    ``loss="cosine"`` matches the feature's direction only.
    """
    torch = _torch()
    dev = _device(backbone)
    torch.manual_seed(seed)
    t = torch.as_tensor(np.asarray(targets, np.float32), device=dev)
    tn = (t**2).sum(1).clamp_min(1e-12)
    x0 = torch.as_tensor(np.clip(np.asarray(init, np.float32), 0.02, 0.98), device=dev)[:, None]
    z = torch.logit(x0).clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    for _ in range(int(steps)):
        opt.zero_grad()
        x = torch.sigmoid(z)
        obj = _feature_loss(backbone, x, t, tn, loss) + tv * total_variation(x)
        if anchor > 0:
            obj = obj + anchor * ((x - x0) ** 2).flatten(1).mean(1)
        obj.sum().backward()
        opt.step()
    return torch.sigmoid(z).detach()[:, 0].cpu().numpy()


class _Decoder:
    """MLP (feature, class) -> image trained on public pairs (kept with its input scale)."""

    def __init__(self, net, scale: float, shape, num_classes: int):
        self.net, self.scale, self.shape, self.num_classes = net, scale, shape, num_classes

    def __call__(self, features: np.ndarray, classes) -> np.ndarray:
        torch = _torch()
        with torch.no_grad():
            x = _decoder_input(features, classes, self.scale, self.num_classes)
            return self.net(torch.as_tensor(x)).reshape(-1, *self.shape).numpy()


def _decoder_input(features, classes, scale: float, num_classes: int) -> np.ndarray:
    F = np.asarray(features, np.float32) / scale
    onehot = np.eye(num_classes, dtype=np.float32)[np.asarray(classes, dtype=np.int64)]
    return np.hstack([F, onehot])


def train_decoder(features: np.ndarray, images: np.ndarray, labels, *, hidden: int = 256, epochs: int = 400,
                  lr: float = 3e-3, weight_decay: float = 1e-4, noise: float = 0.0, copies: int = 8,
                  num_classes: int | None = None, seed: int = 0) -> _Decoder:
    """Train an MLP decoder ((feature, class) -> image, sigmoid output) on public pairs, full batch, Adam.

    The class of a released mean is public (it is the cell's class), so the
    decoder takes it as a one-hot input next to the feature.

    ``noise`` > 0 trains it noise-aware: ``copies`` copies of every public
    feature get N(0, noise^2) per coordinate (then the ReLU floor at 0, as
    the attacked targets), so it learns the posterior-mean image of a noisy
    released mean, which falls back to the class prior as the noise grows.
    """
    torch = _torch()
    from torch import nn

    F = np.asarray(features, np.float32)
    im = np.asarray(images, np.float32)
    y = np.asarray(labels, dtype=np.int64)
    C = int(num_classes if num_classes is not None else y.max() + 1)
    scale = float(np.sqrt((F**2).sum(1).mean())) or 1.0
    if noise > 0:
        rs = np.random.default_rng(seed)
        F = np.maximum(np.tile(F, (copies, 1)) + rs.normal(0.0, noise, size=(F.shape[0] * copies, F.shape[1])),
                       0.0).astype(np.float32)
        im = np.tile(im, (copies, 1, 1))
        y = np.tile(y, copies)
    shape = im.shape[1:]
    g = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(F.shape[1] + C, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                        nn.Linear(hidden, int(np.prod(shape))), nn.Sigmoid())
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim == 2:
                bound = 1.0 / np.sqrt(p.shape[1])
                p.copy_(torch.rand(p.shape, generator=g) * 2 * bound - bound)
            else:
                p.zero_()
    X = torch.as_tensor(_decoder_input(F, y, scale, C))
    Y = torch.as_tensor(np.array(im.reshape(im.shape[0], -1)))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(int(epochs)):
        opt.zero_grad()
        loss = ((net(X) - Y) ** 2).mean()
        loss.backward()
        opt.step()
    net.eval()
    return _Decoder(net, scale, shape, C)


def invert_dip(backbone, targets: np.ndarray, shape, *, steps: int = 500, lr: float = 0.01, width: int = 32,
               tv: float = 0.0, loss: str = "l2", seed: int = 0) -> np.ndarray:
    """Deep-image-prior inversion: one small generator per target, optimised jointly (grouped convs)."""
    torch = _torch()
    from torch import nn

    dev = _device(backbone)
    g = torch.Generator().manual_seed(seed)
    t = torch.as_tensor(np.asarray(targets, np.float32), device=dev)
    r = t.shape[0]
    H, W = shape
    cin = 8
    z = (torch.rand((1, r * cin, H, W), generator=g) * 0.1).to(dev)
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(r * cin, r * width, 3, padding=1, groups=r), nn.LeakyReLU(0.2),
        nn.Conv2d(r * width, r * width, 3, padding=1, groups=r), nn.LeakyReLU(0.2),
        nn.Conv2d(r * width, r, 1, groups=r), nn.Sigmoid(),
    ).to(dev)
    tn = (t**2).sum(1).clamp_min(1e-12)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(int(steps)):
        opt.zero_grad()
        x = net(z).reshape(r, 1, H, W)
        obj = _feature_loss(backbone, x, t, tn, loss)
        if tv > 0:
            obj = obj + tv * total_variation(x)
        obj.sum().backward()
        opt.step()
    with torch.no_grad():
        return net(z).reshape(r, H, W).cpu().numpy()


@dataclass(frozen=True, eq=False)
class InversionResult:
    """Reconstructions, the prior baseline, and which released cell each came from."""

    images: np.ndarray  # (r, H, W)
    baseline: np.ndarray  # (r, H, W): public class-mean image of the same class
    targets: np.ndarray  # (r, d): the feature each reconstruction aimed at
    rows: np.ndarray  # (r,) released row (client, or 0 for a secure sum)
    owners: np.ndarray  # (r,) real client of the row
    classes: np.ndarray  # (r,) class of the cell (source "mean") or the recovered class ("second")
    group_by_class: bool  # score against the cell's class (mean) or the whole client (second)
    per_client: bool
    recon_features: np.ndarray  # (r, d): backbone features of the reconstructions


class FeatureInversion(Attack):
    """Invert released class means (or unmixed per-sample features) through the known backbone."""

    name = "inversion"
    requires = frozenset({"counts", "sums", "backbone", "public_images"})
    defaults = {
        "backend": "pixel",
        "source": "mean",
        "steps": 300,
        "lr": 0.1,
        "tv": 0.005,
        "anchor": 0.0,
        "loss": "auto",
        "max_cells": 40,
        "max_count": None,
        "max_samples": 8,
        "decoder_epochs": 400,
        "dip_steps": 500,
    }

    def _validate_params(self) -> None:
        p = self.params
        if p["backend"] not in BACKENDS:
            raise ConfigError(f"unknown inversion backend {p['backend']!r}; choose from {list(BACKENDS)}")
        if p["loss"] not in ("auto", "l2", "cosine"):
            raise ConfigError(f"loss must be 'auto', 'l2' or 'cosine', got {p['loss']!r}")
        if p["source"] not in SOURCES:
            raise ConfigError(f"unknown inversion source {p['source']!r}; choose from {list(SOURCES)}")
        for k in ("steps", "max_cells", "max_samples", "decoder_epochs", "dip_steps"):
            if isinstance(p[k], bool) or not isinstance(p[k], (int, np.integer)) or p[k] < 1:
                raise ConfigError(f"{k} must be a positive int, got {k}={p[k]!r}")

    def check(self, view: ServerView) -> None:
        super().check(view)
        if self.params["source"] == "second":
            view.require({"second", "per_client"}, f"{self.name} (source='second')")

    # -- attack ----------------------------------------------------------------
    def _cells(self, view: ServerView, rng: np.random.Generator):
        counts = view.stats.counts
        ok = counts >= 0.5
        if self.params["max_count"] is not None:
            ok &= counts <= float(self.params["max_count"]) + 0.5
        rows, classes = np.nonzero(ok)
        m = int(self.params["max_cells"])
        if rows.size > m:
            pick = np.sort(rng.choice(rows.size, size=m, replace=False))
            rows, classes = rows[pick], classes[pick]
        return rows, classes

    def _invert(self, view: ServerView, targets, classes, counts, rng: np.random.Generator) -> np.ndarray:
        prior = view.public.class_mean_images(view.num_classes)
        init = prior[classes]
        seed = int(rng.integers(2**31))
        b = self.params["backend"]
        loss = self.params["loss"]
        if loss == "auto":  # noisy counts scale the released means at random: match directions only
            noisy_counts = view.noise.count_kind is not None or view.noise.sigma.get("counts", 0.0) > 0
            loss = "cosine" if noisy_counts else "l2"
        if b == "pixel":
            return invert_pixels(view.backbone, targets, init, steps=self.params["steps"], lr=self.params["lr"],
                                 tv=self.params["tv"], anchor=self.params["anchor"], loss=loss, seed=seed)
        if b == "decoder":
            # Noise-aware: the per-coordinate noise std of the released means (sigma_sums / count).
            tau = float(np.median(view.noise.sigma.get("sums", 0.0) / np.maximum(counts, 1.0)))
            dec = train_decoder(view.public.features, view.public.images, view.public.labels,
                                epochs=self.params["decoder_epochs"], noise=tau, num_classes=view.num_classes,
                                seed=seed)
            return dec(targets, classes)
        return invert_dip(view.backbone, targets, prior.shape[1:], steps=self.params["dip_steps"], loss=loss,
                          seed=seed)

    def run(self, view: ServerView, rng: np.random.Generator, *, cells=None, **_) -> InversionResult:
        """Invert released cells.

        ``cells``: optional (rows, classes) to attack (the challenge: e.g. the
        cells that truly hold data); by default every cell whose released
        count is at least 0.5 (at most ``max_cells``, drawn at random).
        With ``source="second"`` the rows are clients to unmix.
        """
        self.check(view)
        st = view.stats
        if self.params["source"] == "mean":
            if cells is None:
                rows, classes = self._cells(view, rng)
            else:
                rows, classes = (np.asarray(a, dtype=np.int64) for a in cells)
            if rows.size == 0:
                raise InputError("no released class mean to invert (every count is below 0.5)")
            n = np.maximum(st.counts[rows, classes], 1.0)
            targets = st.sums[rows, classes] / n[:, None]
            counts = n
            group_by_class = True
        else:
            n_k = np.rint(np.maximum(st.counts, 0)).sum(axis=1).astype(int)
            cand = np.flatnonzero((n_k >= 1) & (n_k <= int(self.params["max_samples"])))
            if cells is not None:
                cand = np.intersect1d(cand, np.asarray(cells[0], dtype=np.int64))
            cand = cand[: int(self.params["max_cells"])]
            if cand.size == 0:
                raise InputError(f"no client holds 1..{self.params['max_samples']} samples; nothing to unmix")
            r_rows, r_cls, r_t = [], [], []
            G = view.second_moments()
            for k in cand:
                f, lab, _ = unmix(G[k], int(n_k[k]), rng=rng, sums=st.sums[k], counts=st.counts[k])
                r_rows += [k] * f.shape[0]
                r_cls += list(lab)
                r_t.append(f)
            rows, classes, targets = np.array(r_rows), np.array(r_cls), np.concatenate(r_t)
            counts = np.ones(rows.size)
            group_by_class = False
        targets = np.maximum(targets, 0.0)  # post-ReLU features are non-negative; noise is not
        images = self._invert(view, targets, classes, counts, rng)
        rf = _features(view.backbone, images)
        baseline = view.public.class_mean_images(view.num_classes)[classes]
        owners = rows if st.owners is None else st.owners[rows]
        return InversionResult(images=np.asarray(images, np.float32), baseline=baseline, targets=targets,
                               rows=rows, owners=owners, classes=classes, group_by_class=group_by_class,
                               per_client=view.per_client, recon_features=rf)

    # -- scoring -----------------------------------------------------------------
    def score(self, result: InversionResult, truth: GroundTruth) -> dict:
        if truth.images is None:
            raise InputError("scoring an inversion needs GroundTruth.images (the clients' true images)")
        # Candidate set of the identification: every private image (uploaded or not).
        keep = np.arange(truth.labels.size)
        pool = np.asarray(truth.images, np.float64).reshape(keep.size, -1)
        pool_sq = (pool**2).sum(1)
        labels, clients = truth.labels, truth.clients

        def nearest(ims):
            R = np.asarray(ims, np.float64).reshape(len(ims), -1)
            return ((R**2).sum(1)[:, None] - 2 * R @ pool.T + pool_sq[None]).argmin(1)

        nn_rec, nn_base = nearest(result.images), nearest(result.baseline)
        groups: dict = {}
        for i, (own, c) in enumerate(zip(result.owners, result.classes)):
            key = (own if result.per_client else -1, c if result.group_by_class else -1)
            groups.setdefault(key, []).append(i)
        per = {k: [] for k in ("psnr", "ssim", "ident", "base_psnr", "base_ssim", "base_ident", "chance", "fcos")}
        for (own, c), idx in groups.items():
            mem = clients >= 0
            if own >= 0:
                mem &= clients == own
            if c >= 0:
                mem &= labels == c
            members = np.flatnonzero(mem)
            if members.size == 0:
                continue
            true_im = pool[members].reshape(members.size, *result.images.shape[1:])
            rec = result.images[idx]
            base = result.baseline[idx]
            P = np.stack([psnr(np.repeat(rec[j][None], members.size, 0), true_im) for j in range(len(idx))])
            Pb = np.stack([psnr(np.repeat(base[j][None], members.size, 0), true_im) for j in range(len(idx))])
            jb = P.argmax(0)
            S = np.array([ssim(rec[jb[m]], true_im[m])[0] for m in range(members.size)])
            jbb = Pb.argmax(0)
            Sb = np.array([ssim(base[jbb[m]], true_im[m])[0] for m in range(members.size)])
            per["psnr"] += list(P.max(0))
            per["base_psnr"] += list(Pb.max(0))
            per["ssim"] += list(S)
            per["base_ssim"] += list(Sb)
            hit = set(nn_rec[idx].tolist())
            hitb = set(nn_base[idx].tolist())
            per["ident"] += [m in hit for m in members]
            per["base_ident"] += [m in hitb for m in members]
            same_class = int(np.count_nonzero(labels == labels[members[0]])) if c >= 0 else keep.size
            per["chance"] += [min(1.0, len(idx) / same_class)] * members.size
            tf = truth.features[members]
            fc = np.array([cosine(result.recon_features[idx], np.repeat(f[None], len(idx), 0)).max() for f in tf])
            per["fcos"] += list(fc)
        if not per["psnr"]:
            raise InputError("no reconstruction matches a client in the truth; "
                             "check that the view and the truth belong together")
        a = {k: np.asarray(v, float) for k, v in per.items()}
        finite = np.isfinite(a["psnr"]) & np.isfinite(a["base_psnr"])
        return {
            "psnr": float(np.mean(a["psnr"][finite])),
            "ssim": float(a["ssim"].mean()),
            "identification": float(a["ident"].mean()),
            "baseline_psnr": float(np.mean(a["base_psnr"][finite])),
            "baseline_ssim": float(a["base_ssim"].mean()),
            "baseline_identification": float(a["base_ident"].mean()),
            "chance_identification": float(a["chance"].mean()),
            "delta_psnr": float(np.mean(a["psnr"][finite] - a["base_psnr"][finite])),
            "delta_psnr_se": float(np.std(a["psnr"][finite] - a["base_psnr"][finite], ddof=1) /
                                   np.sqrt(max(finite.sum(), 1))) if finite.sum() > 1 else float("nan"),
            "feature_cosine_true": float(a["fcos"].mean()),
            "feature_cosine_target": float(cosine(result.recon_features, result.targets).mean()),
            "images_scored": int(a["psnr"].size),
            "reconstructions": int(result.images.shape[0]),
        }

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        """Challenge: up to ``max_cells`` released cells that truly hold data (drawn at random)."""
        return self.score(self.run(view, rng, cells=challenge_cells(view, truth, rng, self.params["max_cells"])),
                          truth)


def challenge_cells(view: ServerView, truth: GroundTruth, rng: np.random.Generator, max_cells: int):
    """The (row, class) cells of ``view`` that hold private data, at most ``max_cells`` of them."""
    keep = truth.clients >= 0
    C = view.num_classes
    if view.per_client:
        K = view.stats.num_clients
        if view.stats.owners is not None:  # pseudo-clients (multi-mean): rows whose owner holds the class
            Ko = int(max(view.stats.owners.max(), truth.clients.max())) + 1
            n_owner = np.bincount(truth.clients[keep] * C + truth.labels[keep], minlength=Ko * C).reshape(Ko, C)
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


def _features(backbone, images: np.ndarray) -> np.ndarray:
    torch = _torch()
    dev = _device(backbone)
    with torch.no_grad():
        x = torch.as_tensor(np.asarray(images, np.float32), device=dev)[:, None]
        return backbone(x).cpu().numpy().astype(np.float64)
