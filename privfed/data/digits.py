"""The embedded default data set: scikit-learn digits through a small CNN.

scikit-learn ships the UCI optical-recognition digits (1797 images of 8x8
pixels, 10 classes) inside the package, so this data set works offline.  It
is split, stratified and seeded, into three disjoint parts:

* **public** (~30 %): what everybody, the server and an attacker included,
  may see.  The backbone is trained on it and only on it, the way the papers'
  backbones are pretrained on public data (ImageNet) before federation
  (FedCOF, Goswami et al., Sec. 3; FedCGS, Guan et al., Sec. 3).
* **private** (~50 %): the federation's training data, split over clients.
* **test** (~20 %): held out for accuracy.

The backbone is a small convolutional network on (N, 1, 8, 8) inputs in
[0, 1] whose 64-dimensional ReLU layer is the feature ``f(x)``; a linear
layer on top is used for training only and then discarded.  The trained
weights of seed 0 ship with the package (``digits_cnn_seed0.npz``, its
SHA-256 recorded here as :data:`SHIPPED_WEIGHTS`), so the default features
are the same on every torch version up to float rounding and nothing is
trained at first use.  ``experiments/train_digits_backbone.py`` makes that
file: training is deterministic on one machine (seeded, deterministic
algorithms, one thread, a few seconds), and the script retrains and
compares against the shipped file; across CPUs and torch versions float32
kernels differ, so retrained weights differ slightly and the shipped file
is what fixes the default features.  Without torch, the shipped weights run
through :func:`extract_features_numpy` (same features up to float32 rounding).  Other seeds (or ``weights="trained"``)
train the backbone and cache it, keyed by everything that determines it
(the torch version included, since training is not reproducible across
versions); extracted features are cached keyed by the weights' digest.
The attack module uses the same backbone and public split as the
attacker's knowledge (see :mod:`attacks.view`).

The split is made in :mod:`privfed.data.digits_split`, the backbone in
:mod:`privfed.data.digits_backbone`; this module extracts and caches the
features and re-exports both.
"""

from __future__ import annotations

import os

import numpy as np

from privfed.data import FeatureDataset, digits_numpy
from privfed.data import cache as _cache
from privfed.data.digits_backbone import ARCH_VERSION as ARCH_VERSION
from privfed.data.digits_backbone import BACKBONE_NAME as BACKBONE_NAME
from privfed.data.digits_backbone import FEATURE_DIM as FEATURE_DIM
from privfed.data.digits_backbone import SHIPPED_WEIGHTS as SHIPPED_WEIGHTS
from privfed.data.digits_backbone import TRAIN_CONFIG as TRAIN_CONFIG
from privfed.data.digits_backbone import WEIGHT_SOURCES as WEIGHT_SOURCES
from privfed.data.digits_backbone import backbone_description as backbone_description
from privfed.data.digits_backbone import deterministic_torch as deterministic_torch
from privfed.data.digits_backbone import digits_cnn_class, resolve_source, torch_available
from privfed.data.digits_backbone import get_backbone as get_backbone
from privfed.data.digits_backbone import load_shipped_weights as load_shipped_weights
from privfed.data.digits_backbone import weights_digest as weights_digest
from privfed.data.digits_split import PUBLIC_FRACTION as PUBLIC_FRACTION
from privfed.data.digits_split import SPLIT_VERSION as SPLIT_VERSION
from privfed.data.digits_split import TEST_FRACTION as TEST_FRACTION
from privfed.data.digits_split import DigitsSplits as DigitsSplits
from privfed.data.digits_split import check_seed
from privfed.data.digits_split import digits_splits as digits_splits
from privfed.errors import ConfigError

__all__ = [
    "BACKBONE_NAME",
    "SHIPPED_WEIGHTS",
    "DigitsSplits",
    "backbone_description",
    "digits_splits",
    "extract_features",
    "extract_features_numpy",
    "embed",
    "get_backbone",
    "load_digits_features",
    "load_shipped_weights",
    "weights_digest",
]


def extract_features(model, images: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Features of ``images`` through ``model`` as a float64 (N, d) array.

    Parameters
    ----------
    model : torch.nn.Module
        A backbone, e.g. from :func:`get_backbone` (put in eval mode here).
    images : ndarray, shape (N, 8, 8) or (N, 1, 8, 8)
        Pixel values in [0, 1].
    batch_size : int
        Images per forward pass.

    Returns
    -------
    ndarray, shape (N, d), float64
    """
    arr = digits_numpy.digit_images(
        images
    )  # the numpy forward's rule: the same images, with or without torch
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    import torch

    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    model.eval()
    x = torch.from_numpy(np.array(arr, dtype=np.float32))
    out = []
    with torch.no_grad():
        for start in range(0, x.shape[0], int(batch_size)):
            out.append(model(x[start : start + int(batch_size)].to(device)).cpu().numpy().astype(np.float64))
    if not out:
        return np.zeros((0, FEATURE_DIM))
    return np.concatenate(out, axis=0)


def extract_features_numpy(weights, images, batch_size: int = 512) -> np.ndarray:
    """Features of ``images`` through the digits backbone with ``weights``, computed in numpy (no torch).

    Parameters
    ----------
    weights : mapping of str to ndarray
        The backbone's parameters by torch name, e.g. :func:`load_shipped_weights`.
    images : ndarray, shape (N, 8, 8) or (N, 1, 8, 8)
        Pixel values in [0, 1].
    batch_size : int
        Images per forward pass (bounds the memory of the convolutions' patches).

    Returns
    -------
    ndarray, shape (N, d), float64
        The torch module's features up to float32 rounding: the two differ by at
        most twice :func:`privfed.data.digits_numpy.float32_error_bound` per entry.
    """
    arr = digits_numpy.digit_images(images)  # the forward's rule, checked once for every batch
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    out = [
        digits_numpy.forward(weights, arr[i : i + int(batch_size)])
        for i in range(0, arr.shape[0], int(batch_size))
    ]
    return np.concatenate(out, axis=0) if out else np.zeros((0, FEATURE_DIM))


def embed(images, *, seed: int = 0, weights: str = "auto") -> np.ndarray:
    """Features of ``images`` through the digits backbone of ``seed``, with or without torch.

    With torch installed, the torch module (:func:`get_backbone`); without it,
    the shipped weights through :func:`extract_features_numpy` (the same
    features up to float32 rounding).  Weights that are not shipped are
    trained, which needs torch.
    """
    seed = check_seed(seed)
    if resolve_source(seed, weights) == "shipped" and not torch_available():
        return extract_features_numpy(load_shipped_weights(seed), images)
    return extract_features(get_backbone(seed=seed, weights=weights), images)


def features_description(seed: int, weights_sha256: str) -> dict:
    """Everything that determines the cached digits features: the weights' digest and the split.

    Not the torch version: extraction with fixed weights agrees across
    versions up to float rounding.
    """
    return {
        "artefact": "digits-features",
        "backbone": BACKBONE_NAME,
        "arch_version": ARCH_VERSION,
        "weights_sha256": weights_sha256,
        "split_version": SPLIT_VERSION,
        "public_fraction": PUBLIC_FRACTION,
        "test_fraction": TEST_FRACTION,
        "seed": int(seed),
        "parts": ["private", "test"],
    }


def load_digits_features(
    *, seed: int = 0, cache_dir: str | os.PathLike | None = None, weights: str = "auto"
) -> FeatureDataset:
    """Private-train and test features of digits through the public-trained backbone (cached).

    Parameters
    ----------
    seed : int
        Seed of the split and the backbone.
    cache_dir : path, optional
        Cache directory; defaults to :func:`privfed.data.default_cache_dir`.
    weights : {"auto", "shipped", "trained"}
        Which backbone weights (see :func:`get_backbone`); by default the
        shipped ones for seed 0, so no training happens.

    Returns
    -------
    FeatureDataset
        ``name="digits"``, 899 training and 359 test samples, d = 64, C = 10.
        ``meta`` names the backbone, the weights' source and digest, the
        cache key and the split sizes.
    """
    seed = check_seed(seed)
    source = resolve_source(seed, weights)
    splits = digits_splits(seed)
    model = None
    if source == "shipped":
        digest = SHIPPED_WEIGHTS[seed][1]
    else:
        model = get_backbone(seed=seed, cache_dir=cache_dir, weights="trained")
        digest = model.weights_sha256
    desc = features_description(seed, digest)

    def compute():
        if model is None and not torch_available():
            # the light install: the shipped network in numpy (equal to torch's up to float32 rounding)
            w = load_shipped_weights(seed)
            return {
                "train_features": extract_features_numpy(w, splits.private_images),
                "test_features": extract_features_numpy(w, splits.test_images),
            }
        m = model if model is not None else get_backbone(seed=seed, weights="shipped")
        return {
            "train_features": extract_features(m, splits.private_images),
            "test_features": extract_features(m, splits.test_images),
        }

    def valid(arrays) -> bool:
        return (
            arrays.get("train_features") is not None
            and arrays.get("test_features") is not None
            and arrays["train_features"].shape == (splits.private_labels.size, FEATURE_DIM)
            and arrays["test_features"].shape == (splits.test_labels.size, FEATURE_DIM)
        )

    arrays, key, hit = _cache.cached_arrays("digits-features", desc, compute, cache_dir, validate=valid)
    return FeatureDataset(
        name="digits",
        train_features=np.asarray(arrays["train_features"], dtype=np.float64),
        train_labels=np.array(splits.private_labels, dtype=np.int64),
        test_features=np.asarray(arrays["test_features"], dtype=np.float64),
        test_labels=np.array(splits.test_labels, dtype=np.int64),
        num_classes=10,
        meta={
            "backbone": BACKBONE_NAME,
            "weights": source,
            "weights_sha256": digest,
            "backbone_key": digest,
            "cache_key": key,
            "cache_hit": hit,
            "d": FEATURE_DIM,
            "seed": seed,
            "source": "sklearn.datasets.load_digits",
            "split": {
                "public": int(splits.public_labels.size),
                "private": int(splits.private_labels.size),
                "test": int(splits.test_labels.size),
            },
        },
    )


def __getattr__(name: str):
    # ``DigitsCNN`` is a torch module, built on first use so that importing this module needs no torch.
    if name == "DigitsCNN":
        return digits_cnn_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
