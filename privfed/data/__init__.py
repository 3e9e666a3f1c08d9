"""Data sets of frozen-backbone features, the on-disk cache and the loaders.

A :class:`FeatureDataset` holds the features that clients share statistics
of: the private training set the federation is built from, a test set, and
optionally a natural client split.  :func:`load_dataset` builds one from

``"digits"``
    scikit-learn's bundled 8x8 digits (offline) through a small CNN trained on
    a public split only (:mod:`privfed.data.digits`); the default.
``"file:PATH"``
    a ``.npz`` feature file the user brings (:mod:`privfed.data.npzfile`).
``"cifar100"`` / ``"cifar10"``
    torchvision data sets through an ImageNet-pretrained backbone
    (:mod:`privfed.data.vision`), as in FedCOF (Goswami et al.) Sec. 5.

Features are cached on disk (:mod:`privfed.data.cache`), keyed by everything
that determines them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from privfed.data.cache import default_cache_dir
from privfed.errors import ConfigError, PrivfedError

__all__ = [
    "DatasetUnavailableError",
    "FeatureDataset",
    "available_datasets",
    "default_cache_dir",
    "load_dataset",
]


class DatasetUnavailableError(PrivfedError):
    """A data set is not on disk and downloading was not allowed (or failed)."""


@dataclass(frozen=True, eq=False)
class FeatureDataset:
    """Frozen-backbone features of a training (private) and a test set.

    Parameters
    ----------
    name : str
        Data set name (``"digits"``, ``"file:..."``, ``"cifar100"``, ...).
    train_features : ndarray, shape (N, d), float64
        The private training set the federation shares statistics of.
    train_labels : ndarray, shape (N,), int64
        Classes in ``0..C-1``.
    test_features : ndarray, shape (N_test, d), float64
    test_labels : ndarray, shape (N_test,), int64
    num_classes : int
        C.
    train_clients : ndarray, shape (N,), int64, optional
        A natural client split (ids ``0..K-1``) when the source has one.
    meta : dict
        Provenance: backbone, cache key, ``d``, split sizes, notes.
    """

    name: str
    train_features: np.ndarray
    train_labels: np.ndarray
    test_features: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    train_clients: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from privfed._validation import check_features, check_labels

        F = check_features(self.train_features, "train_features")
        Ft = check_features(
            self.test_features, "test_features", dim=F.shape[1], dim_of="train_features has d"
        )
        y, C = check_labels(self.train_labels, F.shape[0], self.num_classes, "train_labels")
        yt, _ = check_labels(self.test_labels, Ft.shape[0], C, "test_labels")
        arrays = {"train_features": F, "train_labels": y, "test_features": Ft, "test_labels": yt}
        if self.train_clients is not None:
            k = np.asarray(self.train_clients)
            if k.shape != (F.shape[0],) or not np.issubdtype(k.dtype, np.integer) or (k.size and k.min() < 0):
                raise ConfigError(
                    f"train_clients must be {F.shape[0]} non-negative integer client ids, got "
                    f"shape {k.shape} dtype {k.dtype}"
                )
            arrays["train_clients"] = k.astype(np.int64)
        for name, arr in arrays.items():
            given = getattr(self, name)
            if arr.flags.writeable and isinstance(given, np.ndarray) and np.shares_memory(arr, given):
                arr = arr.copy()  # never freeze the caller's own array
            arr.setflags(write=False)  # a data set is shared by its users: read-only
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "num_classes", int(C))

    @property
    def dim(self) -> int:
        """Feature dimension d."""
        return int(self.train_features.shape[1])

    @property
    def num_train(self) -> int:
        return int(self.train_features.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_features.shape[0])

    def __repr__(self) -> str:
        k = "" if self.train_clients is None else f", clients={int(self.train_clients.max()) + 1}"
        return (
            f"FeatureDataset({self.name!r}, train={self.num_train}, test={self.num_test}, "
            f"d={self.dim}, C={self.num_classes}{k})"
        )


_BUILTIN = ("digits", "cifar10", "cifar100")


def available_datasets() -> list[str]:
    """Names :func:`load_dataset` accepts (plus ``"file:PATH"`` for a ``.npz`` file)."""
    return [*_BUILTIN, "file:PATH"]


def load_dataset(
    spec: str = "digits",
    *,
    backbone: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    download: bool = False,
    progress: bool = True,
    device: str | None = None,
    max_file_bytes: int | str | None = None,
) -> FeatureDataset:
    """Load (or extract and cache) the features of a data set.

    Parameters
    ----------
    spec : str
        ``"digits"`` (default, offline), ``"file:PATH"`` (a ``.npz`` file with
        ``features``, ``labels`` and optionally ``clients``, ``test_features``,
        ``test_labels``), ``"cifar100"`` or ``"cifar10"`` (torchvision).
    backbone : str, optional
        For the torchvision data sets: ``"squeezenet1_1"`` (default),
        ``"mobilenet_v2"`` or ``"vit_b_16"``.  For ``"digits"`` only
        ``None`` / ``"digits-cnn"`` is accepted; ignored for feature files.
    cache_dir : path, optional
        Cache directory; defaults to :func:`default_cache_dir`.
    seed : int
        Seed of the digits split and backbone training, and of the test split
        carved out of a feature file that has no test arrays.
    download : bool
        Allow torchvision to download a missing data set (and pretrained
        weights).  Needs internet access.
    progress : bool
        Show a progress bar during feature extraction.
    device : str, optional
        Torch device for extraction; ``None`` uses CUDA when available.
    max_file_bytes : int or str, optional
        For ``"file:PATH"``: the most array bytes the file may declare
        (default ``$PRIVFED_MAX_FILE_BYTES``, else 1 GiB); see
        :mod:`privfed.data.npzfile`.

    Returns
    -------
    FeatureDataset

    Raises
    ------
    ConfigError
        Unknown ``spec`` or ``backbone``.
    InputError
        A feature file that is missing or malformed.
    DatasetUnavailableError
        A torchvision data set not on disk with ``download=False``.
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"dataset must be a name from {available_datasets()}, got {spec!r}")
    from privfed._validation.seeds import check_seed

    seed = check_seed(seed)
    if spec.startswith("file:"):
        from privfed.data.npzfile import load_feature_file

        if backbone is not None:  # the file holds features already: a backbone named here would run nowhere
            raise ConfigError(
                f"backbone {backbone!r} does not apply to a feature file ({spec}), whose features are already "
                "extracted; leave backbone unset"
            )

        path = spec[len("file:") :]
        if not path.strip():  # the loader named "." (the folder it resolved the empty path to)
            raise ConfigError(f"dataset {spec!r} names no file: write file:PATH, e.g. file:features.npz")
        from privfed.data.npzfile import resolve_max_bytes

        limit = resolve_max_bytes(max_file_bytes, "max_file_bytes")  # refused under the name given here
        return load_feature_file(path, seed=int(seed), max_bytes=limit)
    name = spec.lower()
    if name == "digits":
        from privfed.data.digits import BACKBONE_NAME, load_digits_features

        if backbone not in (None, BACKBONE_NAME, "digits-cnn"):
            raise ConfigError(
                f"backbone {backbone!r} does not apply to the digits data set, which uses its own "
                f"{BACKBONE_NAME!r}; leave backbone unset"
            )
        return load_digits_features(seed=int(seed), cache_dir=cache_dir)
    if name in ("cifar10", "cifar100"):
        from privfed.data.vision import load_vision_features

        return load_vision_features(
            name,
            backbone=backbone or "squeezenet1_1",
            cache_dir=cache_dir,
            download=download,
            progress=progress,
            device=device,
        )
    if spec.endswith(".npz") or os.path.sep in spec:
        stripped = spec.strip()  # 'FILE:x' or ' file:x': the prefix mistyped, not missing
        path = stripped[len("file:") :] if stripped.lower().startswith("file:") else spec
        raise ConfigError(f"dataset {spec!r} looks like a file; pass it as 'file:{path}'")
    raise ConfigError(f"unknown dataset {spec!r}; available: {available_datasets()}")
