"""The frozen torchvision backbones of the real-image data sets, with their classifiers stripped."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from privfed.data import DatasetUnavailableError
from privfed.errors import ConfigError, MissingDependencyError

__all__ = [
    "BACKBONES",
    "BackboneSpec",
    "FeatureExtractor",
    "available_backbones",
    "build_backbone",
    "torchvision_module",
]


@dataclass(frozen=True)
class BackboneSpec:
    dim: int
    default_weights: str
    head: Callable[[nn.Module], nn.Module]


def _squeezenet_features(model: nn.Module) -> nn.Module:
    return nn.Sequential(model.features, nn.AdaptiveAvgPool2d(1), nn.Flatten(1))


def _drop_classifier(model: nn.Module) -> nn.Module:
    model.classifier = nn.Identity()
    return model


def _drop_heads(model: nn.Module) -> nn.Module:
    model.heads = nn.Identity()  # VisionTransformer.forward returns the CLS token before the heads
    return model


#: Backbones: feature dimension, default weights (FedCOF's), how to strip the classifier.
BACKBONES: dict[str, BackboneSpec] = {
    "squeezenet1_1": BackboneSpec(512, "IMAGENET1K_V1", _squeezenet_features),
    "mobilenet_v2": BackboneSpec(1280, "IMAGENET1K_V1", _drop_classifier),
    "vit_b_16": BackboneSpec(768, "IMAGENET1K_V1", _drop_heads),
}


def available_backbones() -> list[str]:
    """Names :func:`build_backbone` accepts."""
    return sorted(BACKBONES)


def torchvision_module():
    try:
        import torchvision
    except ImportError:
        raise MissingDependencyError(
            "real-image data sets need torchvision; install privfed[vision] (pip install 'privfed[vision]')"
        ) from None
    return torchvision


class FeatureExtractor(nn.Module):
    """A frozen backbone returning (N, d) features; records its name and weights."""

    def __init__(self, body: nn.Module, name: str, weights: str | None, dim: int) -> None:
        super().__init__()
        self.body = body
        self.name = name
        self.weights = weights
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _weights_path(weights) -> pathlib.Path:
    return pathlib.Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(weights.url).path)


def build_backbone(
    name: str = "squeezenet1_1",
    weights: str | None = "DEFAULT",
    *,
    download: bool = False,
    progress: bool = False,
    image_size: int | None = None,
) -> FeatureExtractor:
    """A frozen torchvision backbone that outputs features instead of logits.

    Parameters
    ----------
    name : str
        ``"squeezenet1_1"``, ``"mobilenet_v2"`` or ``"vit_b_16"``.
    weights : str or None
        ``"DEFAULT"`` (the weights FedCOF uses: IMAGENET1K_V1 for all three),
        a torchvision weights name such as ``"IMAGENET1K_V2"``, or ``None``
        for random initialisation (tests, debugging).
    download : bool
        Allow downloading pretrained weights missing from the torch hub cache.
    progress : bool
        Show torchvision's download progress bar.
    image_size : int, optional
        Input size of ``vit_b_16`` with ``weights=None`` (pretrained ViT
        weights fix it at 224).  Ignored by the convolutional backbones.

    Returns
    -------
    FeatureExtractor
        In eval mode with ``requires_grad=False``; ``.dim`` is d.

    Raises
    ------
    ConfigError
        Unknown backbone or weights name.
    DatasetUnavailableError
        Pretrained weights not on disk and ``download=False``, or the download failed.
    """
    tv = torchvision_module()
    if name not in BACKBONES:
        raise ConfigError(f"unknown backbone {name!r}; available: {available_backbones()}")
    spec = BACKBONES[name]
    weight_enum = tv.models.get_model_weights(name)
    w = None
    if weights is not None:
        wname = spec.default_weights if weights == "DEFAULT" else str(weights)
        if wname not in weight_enum.__members__ or wname == "DEFAULT":
            raise ConfigError(
                f"unknown weights {weights!r} for {name}; use 'DEFAULT', None or one of "
                f"{[m for m in weight_enum.__members__ if m != 'DEFAULT']}"
            )
        w = weight_enum[wname]
        path = _weights_path(w)
        if not path.is_file() and not download:
            raise DatasetUnavailableError(
                f"pretrained weights {name}/{wname} are not in {str(path.parent)!r}; pass download=True "
                "(--download on the command line, needs internet) to fetch them, or weights=None"
            )
    kwargs: dict[str, Any] = {}
    if name == "vit_b_16" and w is None and image_size is not None:
        kwargs["image_size"] = int(image_size)
    try:
        model = tv.models.get_model(name, weights=w, progress=progress, **kwargs)
    except (OSError, RuntimeError) as exc:
        if w is None:
            raise
        raise DatasetUnavailableError(
            f"could not download or read pretrained weights {name}/{w.name} ({exc}); downloading needs "
            f"internet, or place the file in {str(_weights_path(w).parent)!r}"
        ) from None
    body = spec.head(model)
    fx = FeatureExtractor(body, name, None if w is None else w.name, spec.dim)
    fx.eval()
    for p in fx.parameters():
        p.requires_grad_(False)
    return fx
