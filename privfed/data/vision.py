"""Real images: torchvision data sets through ImageNet-pretrained backbones.

The setting of FedCOF (Goswami et al., Sec. 5 and App. B) and its code:
frozen torchvision backbones

=================  =====  ==================================================
backbone           d      feature
=================  =====  ==================================================
``squeezenet1_1``  512    global average pool of ``features`` (IMAGENET1K_V1)
``mobilenet_v2``   1280   global average pool before the classifier (IMAGENET1K_V1)
``vit_b_16``       768    CLS token of the last encoder layer (IMAGENET1K_V1)
=================  =====  ==================================================

on 224-pixel inputs (CIFAR's 32-pixel images resized), normalised with the
ImageNet statistics, except CIFAR-100 which uses its own channel statistics
as in the FedCOF code.  Features are extracted in batches on the GPU when
there is one, with a progress bar, and cached (:mod:`privfed.data.cache`)
keyed by data set, split, backbone, weights and preprocessing.  The 32-pixel
images are normalised at their native size and resized to 224 in batches on
the device (resizing and per-channel normalisation commute), several times
faster than resizing each image with PIL for the convolutional backbones.
Features computed on a GPU differ from CPU ones by what TF32 convolutions
round (a few 1e-4 relative with torch's defaults); ``meta["device"]`` records
where they were computed.  Both are measured on a GPU by
``experiments/bench_vision_device.py`` (docs/data.md quotes its record).

The backbones are built in :mod:`privfed.data.vision_backbones` (re-exported here).

Nothing is downloaded unless ``download=True``: a data set or pretrained
weights missing from disk raise
:class:`privfed.data.DatasetUnavailableError` saying how to get them.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from privfed.data import DatasetUnavailableError, FeatureDataset
from privfed.data import cache as _cache
from privfed.data.vision_backbones import (
    BACKBONES,
    FeatureExtractor,
    available_backbones,
    build_backbone,
    torchvision_module,
)
from privfed.errors import ConfigError, InputError

__all__ = [
    "BACKBONES",
    "DATASETS",
    "FeatureExtractor",
    "available_backbones",
    "build_backbone",
    "extract_dataset_features",
    "features_from_datasets",
    "load_vision_features",
    "open_dataset",
    "preprocess",
    "preprocessing_description",
    "resize_batch",
    "resolve_device",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

#: Data sets: torchvision class name, number of classes, normalisation statistics.
DATASETS: dict[str, dict[str, Any]] = {
    "cifar10": {"cls": "CIFAR10", "num_classes": 10, "mean": IMAGENET_MEAN, "std": IMAGENET_STD},
    "cifar100": {"cls": "CIFAR100", "num_classes": 100, "mean": CIFAR100_MEAN, "std": CIFAR100_STD},
}


def preprocessing_description(dataset: str, image_size: int = 224, resize: str = "device") -> dict:
    """The preprocessing of ``dataset`` as JSON data (part of the cache key).

    ``resize="device"``: images are normalised at their native size and resized
    in batches on the extraction device (torch bilinear); ``"pil"``: resized per
    image by the transform (PIL bilinear, antialiased) before normalising.
    """
    if dataset not in DATASETS:
        raise ConfigError(f"unknown dataset {dataset!r}; available: {sorted(DATASETS)}")
    if resize not in ("device", "pil"):
        raise ConfigError(f"resize must be 'device' or 'pil', got {resize!r}")
    d = DATASETS[dataset]
    return {
        "resize": int(image_size),
        "interpolation": "bilinear",
        "resize_backend": "torch" if resize == "device" else "pil-antialias",
        "mean": list(d["mean"]),
        "std": list(d["std"]),
    }


def preprocess(dataset: str, image_size: int | None = 224) -> Callable:
    """The torchvision transform: (resize to ``image_size``,) to tensor, normalise.

    CIFAR-100 is normalised with its own channel statistics, others with
    ImageNet's (as in the FedCOF code).  ``image_size=None`` leaves the size
    alone (resize later on the device with ``extract_dataset_features(resize=...)``;
    bilinear resizing and per-channel normalisation commute, the interpolation
    weights summing to one).
    """
    tv = torchvision_module()
    T = tv.transforms
    desc = preprocessing_description(dataset, 224 if image_size is None else image_size, "pil")
    steps = (
        []
        if image_size is None
        else [
            T.Resize(
                (desc["resize"], desc["resize"]), interpolation=T.InterpolationMode.BILINEAR, antialias=True
            )
        ]
    )
    return T.Compose([*steps, T.ToTensor(), T.Normalize(desc["mean"], desc["std"])])


def resize_batch(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of an (N, C, H, W) batch to ``size`` x ``size`` (antialiased when shrinking)."""
    if x.shape[-2:] == (size, size):
        return x
    shrink = x.shape[-1] > size or x.shape[-2] > size
    return torch.nn.functional.interpolate(
        x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink
    )


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None`` -> CUDA when available, else CPU; a name is checked to exist."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device {device!r} is not a torch device ({exc}); use 'cpu' or 'cuda'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available; use device='cpu' or None")
    return dev


def extract_dataset_features(
    dataset,
    backbone: nn.Module,
    batch_size: int = 128,
    device: str | torch.device | None = None,
    progress: bool = True,
    num_workers: int = 0,
    desc: str = "extracting features",
    resize: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run every sample of a (transformed) image data set through a backbone.

    Parameters
    ----------
    dataset : torch.utils.data.Dataset
        Yields ``(image_tensor, label)`` (apply :func:`preprocess` as its transform).
    backbone : torch.nn.Module
        E.g. from :func:`build_backbone`; run in eval mode without gradients.
    batch_size : int
    device : str, optional
        ``None`` uses CUDA when available.
    progress : bool
        Show a tqdm progress bar.
    num_workers : int
        DataLoader workers.
    desc : str
        Progress-bar label.
    resize : int, optional
        Resize every batch to ``resize`` x ``resize`` on the device (see
        :func:`resize_batch`) before the backbone.

    Returns
    -------
    features : ndarray, shape (N, d), float64
    labels : ndarray, shape (N,), int64
    """
    from torch.utils.data import DataLoader

    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    if len(dataset) == 0:
        raise InputError("the data set is empty; nothing to extract")
    dev = resolve_device(device)
    backbone = backbone.to(dev).eval()
    loader = DataLoader(
        dataset,
        batch_size=int(batch_size),
        shuffle=False,
        num_workers=int(num_workers),
        pin_memory=dev.type == "cuda",
    )
    batches = loader
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(loader, desc=desc, unit="batch", total=len(loader))
    feats, labels = [], []
    with torch.inference_mode():
        for x, y in batches:
            x = x.to(dev, non_blocking=True)
            if resize is not None:
                x = resize_batch(x, int(resize))
            try:
                out = backbone(x)
            except (RuntimeError, AssertionError) as exc:
                # only images of a shape it cannot take are the data's fault (one channel; a ViT's fixed
                # size, which torchvision asserts); memory, device and dtype errors go on as they are
                if not (isinstance(exc, AssertionError) or x.ndim != 4 or x.shape[1] != 3):
                    raise
                what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise InputError(
                    f"the backbone {getattr(backbone, 'name', type(backbone).__name__)} cannot take a batch of "
                    f"images of shape {tuple(x.shape)} ({what}); the images must be what it was built for "
                    "(3 channels; vit_b_16 224 x 224 unless built with image_size): give the data set the "
                    "transform of preprocess(), or pass resize"
                ) from None
            if out.ndim != 2:
                raise InputError(
                    f"the backbone returned shape {tuple(out.shape)}; expected (batch, d) features"
                )
            feats.append(out.float().cpu().numpy().astype(np.float64))
            labels.append(np.asarray(y, dtype=np.int64).reshape(-1))
    return np.concatenate(feats), np.concatenate(labels)


def open_dataset(name: str, root: str | os.PathLike, *, train: bool, download: bool = False, transform=None):
    """A torchvision data set, never downloading unless ``download=True``.

    Raises
    ------
    DatasetUnavailableError
        Not under ``root`` and ``download=False``, or the download failed.
    """
    tv = torchvision_module()
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; available: {sorted(DATASETS)}")
    cls = getattr(tv.datasets, DATASETS[name]["cls"])
    root = pathlib.Path(root).expanduser()
    try:
        return cls(root=str(root), train=train, transform=transform, download=bool(download))
    except RuntimeError as exc:
        folder = root / str(getattr(cls, "base_folder", ""))
        if folder != root and folder.exists():  # present but failing torchvision's own check
            raise DatasetUnavailableError(
                f"{name} under {str(folder)!r} is incomplete or corrupted (torchvision's check failed); remove "
                "that folder and fetch it again"
                + ("" if download else " (download=True, --download)")
                + ", or replace it with a good copy"
            ) from None
        if download:
            raise DatasetUnavailableError(
                f"{name} under {str(root)!r} could not be prepared ({exc})"
            ) from None
        raise DatasetUnavailableError(
            f"{name} is not in {str(root)!r} and downloading is off; pass download=True "
            "(--download on the command line, needs internet) to fetch it, or point PRIVFED_DATA at a "
            "directory that holds it"
        ) from None
    except OSError as exc:  # network errors (URLError is an OSError) during a download
        if root.exists() and not root.is_dir():
            raise DatasetUnavailableError(
                f"the data folder {str(root)!r} is a file, not a folder; point PRIVFED_DATA at a folder"
            ) from None
        raise DatasetUnavailableError(
            f"downloading {name} into {str(root)!r} failed ({exc}); downloading needs internet, or place the "
            "extracted data set there yourself"
        ) from None


def default_data_root(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Where image data sets live: ``$PRIVFED_DATA``, else ``<cache dir>/datasets``."""
    env = os.environ.get("PRIVFED_DATA")
    if env:
        return pathlib.Path(env).expanduser()
    base = _cache.default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir).expanduser()
    return base / "datasets"


def features_from_datasets(
    name: str,
    train,
    test,
    backbone: FeatureExtractor,
    *,
    num_classes: int,
    description: dict,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 128,
    device: str | None = None,
    progress: bool = True,
    resize: int | None = None,
) -> FeatureDataset:
    """Extract (or load from the cache) the features of a train and a test data set.

    Parameters
    ----------
    name : str
        Data set name for the result.
    train, test : torch.utils.data.Dataset
        Transformed data sets yielding ``(tensor, label)``.
    backbone : FeatureExtractor
    num_classes : int
    description : dict
        Everything that determines the features besides the split (data set,
        backbone, weights, preprocessing); hashed into the cache key together
        with the split name.
    resize : int, optional
        Resize on the device (passed to :func:`extract_dataset_features`).
    """
    out: dict[str, np.ndarray] = {}
    keys, hits = {}, {}
    for split, ds in (("train", train), ("test", test)):
        desc = {"artefact": "vision-features", "split": split, **description}

        def compute(ds=ds, split=split):
            F, y = extract_dataset_features(
                ds,
                backbone,
                batch_size=batch_size,
                device=device,
                progress=progress,
                desc=f"{name} {split}",
                resize=resize,
            )
            return {"features": F, "labels": y}

        arrays, key, hit = _cache.cached_arrays(f"{name}-{split}", desc, compute, cache_dir)
        if not _valid_features(arrays) or arrays["features"].shape[0] != len(ds):
            path, key = _cache.artefact_path(f"{name}-{split}", desc, ".npz", cache_dir)
            arrays = compute()
            _cache.save_arrays(path, arrays, desc)
            hit = False
        out[f"{split}_features"] = np.asarray(arrays["features"], dtype=np.float64)
        out[f"{split}_labels"] = np.asarray(arrays["labels"], dtype=np.int64)
        keys[split], hits[split] = key, hit
    return FeatureDataset(
        name=name,
        train_features=out["train_features"],
        train_labels=out["train_labels"],
        test_features=out["test_features"],
        test_labels=out["test_labels"],
        num_classes=int(num_classes),
        meta={
            **description,
            "d": int(out["train_features"].shape[1]),
            "cache_key": keys,
            "cache_hit": hits,
            "device": str(resolve_device(device)),
        },
    )


def load_vision_features(
    name: str,
    *,
    backbone: str = "squeezenet1_1",
    weights: str | None = "DEFAULT",
    cache_dir: str | os.PathLike | None = None,
    root: str | os.PathLike | None = None,
    download: bool = False,
    progress: bool = True,
    device: str | None = None,
    batch_size: int = 128,
    image_size: int = 224,
) -> FeatureDataset:
    """Features of CIFAR-10 / CIFAR-100 through a pretrained backbone (cached).

    Parameters
    ----------
    name : str
        ``"cifar10"`` or ``"cifar100"``.
    backbone : str
        See :data:`BACKBONES`.
    weights : str or None
        ``"DEFAULT"`` (FedCOF's weights), a torchvision weights name, or None.
    cache_dir : path, optional
        Feature cache; defaults to :func:`privfed.data.default_cache_dir`.
    root : path, optional
        Image data root; defaults to ``$PRIVFED_DATA`` or ``<cache dir>/datasets``.
    download : bool
        Allow downloading the data set and the weights (needs internet).
    progress, device, batch_size, image_size
        Extraction settings (``image_size`` is part of the cache key).

    Raises
    ------
    DatasetUnavailableError
        Data or weights missing and ``download=False`` (or the download failed).
    """
    tv = torchvision_module()
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; available: {sorted(DATASETS)}")
    if backbone not in BACKBONES:
        raise ConfigError(f"unknown backbone {backbone!r}; available: {available_backbones()}")
    if weights is None:
        raise ConfigError(
            "weights=None gives random features; real data sets need pretrained weights ('DEFAULT')"
        )
    spec = BACKBONES[backbone]
    description = {
        "dataset": name,
        "backbone": backbone,
        "weights": spec.default_weights if weights == "DEFAULT" else str(weights),
        "preprocessing": preprocessing_description(name, image_size),
        "torchvision": ".".join(tv.__version__.split("+")[0].split(".")[:2]),
    }
    num_classes = DATASETS[name]["num_classes"]
    # Features already cached: neither the images nor the backbone are needed.
    cached = {}
    for split in ("train", "test"):
        desc = {"artefact": "vision-features", "split": split, **description}
        path, key = _cache.artefact_path(f"{name}-{split}", desc, ".npz", cache_dir)
        got = _cache.load_arrays(path, desc)
        if got is None or not _valid_features(got):
            break
        cached[split] = (got, key)
    else:
        (tr, ktr), (te, kte) = cached["train"], cached["test"]
        return FeatureDataset(
            name=name,
            train_features=np.asarray(tr["features"], dtype=np.float64),
            train_labels=np.asarray(tr["labels"], dtype=np.int64),
            test_features=np.asarray(te["features"], dtype=np.float64),
            test_labels=np.asarray(te["labels"], dtype=np.int64),
            num_classes=num_classes,
            meta={
                **description,
                "d": int(tr["features"].shape[1]),
                "cache_key": {"train": ktr, "test": kte},
                "cache_hit": {"train": True, "test": True},
            },
        )
    root = default_data_root(cache_dir) if root is None else pathlib.Path(root).expanduser()
    transform = preprocess(name, None)  # resized in batches on the device
    # Open both splits before building the backbone so a missing data set fails fast.
    train = open_dataset(name, root, train=True, download=download, transform=transform)
    test = open_dataset(name, root, train=False, download=download, transform=transform)
    fx = build_backbone(backbone, weights, download=download, progress=progress)
    return features_from_datasets(
        name,
        train,
        test,
        fx,
        num_classes=num_classes,
        description=description,
        cache_dir=cache_dir,
        batch_size=batch_size,
        device=device,
        progress=progress,
        resize=image_size,
    )


def _valid_features(arrays: dict) -> bool:
    F, y = arrays.get("features"), arrays.get("labels")
    return F is not None and y is not None and F.ndim == 2 and y.ndim == 1 and F.shape[0] == y.shape[0] > 0
