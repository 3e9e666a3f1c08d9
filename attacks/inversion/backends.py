"""The optimising inversion backends: pixel optimisation with TV, an MLP decoder, a deep image prior.

* :func:`invert_pixels`: Adam on the pixels (x = sigmoid(z)) with a
  total-variation prior (Mahendran & Vedaldi, CVPR 2015) from start images;
* :func:`train_decoder`: an MLP (feature, class) -> image trained on public
  pairs (Dosovitskiy & Brox, CVPR 2016), noise-aware on request;
* :func:`invert_dip`: a deep-image-prior generator per target (Ulyanov,
  Vedaldi & Lempitsky, CVPR 2018), grouped convolutions.

Each runs on one seeded torch thread with deterministic algorithms
(:func:`attacks.inversion.determinism.deterministic`): the same images whatever the
caller's thread count.
"""

from __future__ import annotations

import numpy as np

from attacks.inversion.determinism import deterministic

__all__ = ["invert_dip", "invert_pixels", "reconstruction_features", "total_variation", "train_decoder"]


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


def invert_pixels(
    backbone,
    targets: np.ndarray,
    init: np.ndarray,
    *,
    steps: int = 300,
    lr: float = 0.1,
    tv: float = 0.005,
    anchor: float = 0.0,
    loss: str = "l2",
    seed: int = 0,
) -> np.ndarray:
    """Pixel optimisation with a TV prior from ``init`` images; returns (r, H, W) float32 in [0, 1].

    ``anchor`` adds anchor * mean((x - init)^2), a Gaussian prior centred on the start image;
    ``loss="cosine"`` matches the feature's direction only.
    """
    torch = _torch()
    dev = _device(backbone)
    with deterministic(seed):
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


def train_decoder(
    features: np.ndarray,
    images: np.ndarray,
    labels,
    *,
    hidden: int = 256,
    epochs: int = 400,
    lr: float = 3e-3,
    weight_decay: float = 1e-4,
    noise: float = 0.0,
    copies: int = 8,
    num_classes: int | None = None,
    seed: int = 0,
) -> _Decoder:
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
        F = np.maximum(
            np.tile(F, (copies, 1)) + rs.normal(0.0, noise, size=(F.shape[0] * copies, F.shape[1])), 0.0
        ).astype(np.float32)
        im = np.tile(im, (copies, 1, 1))
        y = np.tile(y, copies)
    shape = im.shape[1:]
    with deterministic(seed):
        g = torch.Generator().manual_seed(seed)
        net = nn.Sequential(
            nn.Linear(F.shape[1] + C, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, int(np.prod(shape))),
            nn.Sigmoid(),
        )
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


def invert_dip(
    backbone,
    targets: np.ndarray,
    shape,
    *,
    steps: int = 500,
    lr: float = 0.01,
    width: int = 32,
    tv: float = 0.0,
    loss: str = "l2",
    seed: int = 0,
) -> np.ndarray:
    """Deep-image-prior inversion: one small generator per target, optimised jointly (grouped convs)."""
    torch = _torch()
    from torch import nn

    dev = _device(backbone)
    with deterministic(seed):
        g = torch.Generator().manual_seed(seed)
        t = torch.as_tensor(np.asarray(targets, np.float32), device=dev)
        r = t.shape[0]
        H, W = shape
        cin = 8
        z = (torch.rand((1, r * cin, H, W), generator=g) * 0.1).to(dev)
        torch.manual_seed(seed)
        net = nn.Sequential(
            nn.Conv2d(r * cin, r * width, 3, padding=1, groups=r),
            nn.LeakyReLU(0.2),
            nn.Conv2d(r * width, r * width, 3, padding=1, groups=r),
            nn.LeakyReLU(0.2),
            nn.Conv2d(r * width, r, 1, groups=r),
            nn.Sigmoid(),
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


def reconstruction_features(backbone, images: np.ndarray) -> np.ndarray:
    """Backbone features (float64) of images (r, H, W), on one deterministic torch thread."""
    torch = _torch()
    dev = _device(backbone)
    with torch.no_grad(), deterministic(0):
        x = torch.as_tensor(np.asarray(images, np.float32), device=dev)[:, None]
        return backbone(x).cpu().numpy().astype(np.float64)
