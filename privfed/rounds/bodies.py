"""Multi-round FedLog's local bodies and their features.

Each client trains its own body (a small CNN or MLP of feature width
:data:`FEATURE_DIM`) between rounds; the statistic it uploads is the class
sums of its augmented features [1, f] (:func:`augment`).  Used by the rounds
themselves (:mod:`privfed.rounds`) and by the attacks across rounds
(:mod:`attacks.rounds`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from privfed.data.digits import deterministic_torch
from privfed.errors import ConfigError

__all__ = [
    "FAMILIES",
    "FEATURE_DIM",
    "augment",
    "client_features",
    "features",
    "make_body",
    "num_parameters",
    "public_body",
]

#: Body families (feature width FEATURE_DIM each).
FAMILIES = ("cnn", "cnn-narrow", "mlp")
#: Feature width d of every body (the head's input is m = d + 1).
FEATURE_DIM = 64


class _CNN(nn.Module):
    """conv3x3(c1)-ReLU-conv3x3(c2)-ReLU-maxpool2-linear(d)-ReLU on (N, 1, 8, 8) images."""

    def __init__(self, c1: int, c2: int, d: int = FEATURE_DIM) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(c2 * 4 * 4, d)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.pool(self.relu(self.conv2(x)))
        return self.relu(self.fc(x.flatten(1)))


class _MLP(nn.Module):
    """flatten(64)-linear(128)-ReLU-linear(d)-ReLU on raw pixels."""

    def __init__(self, d: int = FEATURE_DIM) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, d), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_body(family: str) -> nn.Module:
    """A freshly initialised body of ``family`` (uses torch's global RNG)."""
    if family == "cnn":
        from privfed.data.digits import DigitsCNN

        return DigitsCNN()
    if family == "cnn-narrow":
        return _CNN(8, 16)
    if family == "mlp":
        return _MLP()
    raise ConfigError(f"unknown body family {family!r}; choose from {list(FAMILIES)}")


def num_parameters(module: nn.Module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


_PUBLIC_BODIES: dict[tuple[str, int], dict] = {}


def public_body(family: str, seed: int = 0) -> nn.Module:
    """A body of ``family`` trained on the digits *public* split only (a fresh trainable copy).

    ``cnn`` is the digits backbone itself (:func:`privfed.data.digits.get_backbone`);
    the other families are trained with the backbone's recipe
    (``privfed.data.digits.TRAIN_CONFIG``), deterministically, and kept in memory.
    """
    from privfed.data.digits import TRAIN_CONFIG, digits_splits, get_backbone

    key = (family, int(seed))
    if key not in _PUBLIC_BODIES:
        if family == "cnn":
            state = get_backbone(seed=seed).state_dict()
        else:
            splits = digits_splits(seed)
            cfg = TRAIN_CONFIG
            F = torch.nn.functional
            with deterministic_torch():
                torch.manual_seed(seed)
                gen = torch.Generator().manual_seed(seed)
                body = make_body(family)
                head = nn.Linear(FEATURE_DIM, 10)
                opt = torch.optim.Adam(
                    list(body.parameters()) + list(head.parameters()),
                    lr=cfg["lr"],
                    weight_decay=cfg["weight_decay"],
                )
                x = torch.from_numpy(np.array(splits.public_images, dtype=np.float32))[:, None]
                y = torch.from_numpy(np.array(splits.public_labels, dtype=np.int64))
                for _ in range(cfg["epochs"]):
                    perm = torch.randperm(y.shape[0], generator=gen)
                    for start in range(0, y.shape[0], cfg["batch_size"]):
                        b = perm[start : start + cfg["batch_size"]]
                        shift = torch.randint(-1, 2, (2,), generator=gen).tolist()
                        xb = torch.roll(x[b], shifts=(shift[0], shift[1]), dims=(2, 3))
                        loss = F.cross_entropy(head(body(xb)), y[b])
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
            state = body.state_dict()
        _PUBLIC_BODIES[key] = {k: v.detach().clone() for k, v in state.items()}
    with torch.random.fork_rng(devices=[]):
        body = make_body(family)
    body.load_state_dict(_PUBLIC_BODIES[key])
    for p in body.parameters():
        p.requires_grad_(True)
    return body


def features(body, x, clip_fn) -> torch.Tensor:
    """The body's features of ``x``, through the clipping ``clip_fn`` (the paper's g(x)) when given."""
    f = body(x)
    return clip_fn(f) if clip_fn is not None else f


def augment(f: torch.Tensor) -> torch.Tensor:
    """[1, f]: the augmented features whose class sums are FedLog's statistic (counts in column 0)."""
    return torch.cat([torch.ones(f.shape[0], 1, dtype=f.dtype), f], dim=1)


def client_features(body, x, clip_fn) -> np.ndarray:
    """The body's (clipped) features of ``x`` in evaluation mode, as float64."""
    body.eval()
    with torch.no_grad():
        return features(body, x, clip_fn).numpy().astype(np.float64)
