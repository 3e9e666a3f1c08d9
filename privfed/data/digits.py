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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import warnings
from dataclasses import dataclass, field

import numpy as np

from privfed.data import FeatureDataset, digits_numpy
from privfed.data import cache as _cache
from privfed.errors import ConfigError, InputError
from privfed.optional import require

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

#: Name of the digits backbone (recorded in ``FeatureDataset.meta``).
BACKBONE_NAME = "digits-cnn"
#: Bump when the architecture or the training procedure changes (invalidates caches).
ARCH_VERSION = 1
#: Bump when the split procedure changes.
SPLIT_VERSION = 1
#: Feature dimension of the backbone.
FEATURE_DIM = 64

#: Weights shipped in the package: seed -> (file name in privfed/data, :func:`weights_digest`).
#: Made by ``python -m experiments.train_digits_backbone --write``.
SHIPPED_WEIGHTS = {
    0: ("digits_cnn_seed0.npz", "ae6b065eb7619d10ec56762b5673944544e1a5d44f856096ad66d6929c9a7f74"),
}
#: Where a backbone's weights come from.
WEIGHT_SOURCES = ("auto", "shipped", "trained")

#: Split fractions of the whole data set.
PUBLIC_FRACTION = 0.3
TEST_FRACTION = 0.2

#: Training hyper-parameters of the backbone (all part of the cache key).
TRAIN_CONFIG = {
    "epochs": 40,
    "batch_size": 64,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 1e-4,
    "augment": "random-shift-1px",
}


@dataclass(frozen=True, eq=False)
class DigitsSplits:
    """Public / private / test parts of scikit-learn digits.

    Images are (n, 8, 8) float32 in [0, 1] (raw 0..16 grey levels / 16);
    labels are int64 in 0..9.  Arrays are read-only.
    """

    public_images: np.ndarray
    public_labels: np.ndarray
    private_images: np.ndarray
    private_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    #: Indices of each part into ``sklearn.datasets.load_digits()`` order.
    indices: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return 10


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)


def digits_splits(seed: int = 0) -> DigitsSplits:
    """Seeded stratified split of scikit-learn digits: ~30 % public, ~20 % test, rest private.

    Parameters
    ----------
    seed : int
        Seed of the split (``random_state`` of scikit-learn's stratified split).

    Returns
    -------
    DigitsSplits
        Public 539, private 899, test 359 images for every seed (the class
        proportions are kept in each part).
    """
    return _digits_splits(_check_seed(seed))


@functools.lru_cache(maxsize=8)
def _digits_splits(seed: int) -> DigitsSplits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = (np.asarray(data.images, dtype=np.float64) / 16.0).astype(np.float32)
    labels = np.asarray(data.target, dtype=np.int64)
    idx = np.arange(labels.size)
    n_test = int(round(TEST_FRACTION * labels.size))
    n_public = int(round(PUBLIC_FRACTION * labels.size))
    rest, test = train_test_split(idx, test_size=n_test, stratify=labels, random_state=seed)
    public, private = train_test_split(rest, train_size=n_public, stratify=labels[rest], random_state=seed)
    parts = {"public": np.sort(public), "private": np.sort(private), "test": np.sort(test)}
    arrays = {}
    for name, ix in parts.items():
        ix.setflags(write=False)
        im, lab = images[ix], labels[ix]
        im.setflags(write=False)
        lab.setflags(write=False)
        arrays[f"{name}_images"], arrays[f"{name}_labels"] = im, lab
    return DigitsSplits(**arrays, indices=parts)


@functools.lru_cache(maxsize=1)
def _digits_cnn_class():
    torch = require("torch", "the digits backbone as a torch module (training, gradients)")
    nn = torch.nn

    class DigitsCNN(nn.Module):
        """The digits backbone: conv3x3(16)-ReLU-conv3x3(32)-ReLU-maxpool2-linear(64)-ReLU.

        Maps (N, 1, 8, 8) float32 images in [0, 1] to (N, 64) non-negative features.
        Needs torch; :func:`extract_features_numpy` runs the same network without it.
        """

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(32 * 4 * 4, FEATURE_DIM)
            self.relu = nn.ReLU()

        def forward(self, x):
            x = self.relu(self.conv1(x))
            x = self.pool(self.relu(self.conv2(x)))
            return self.relu(self.fc(x.flatten(1)))

    DigitsCNN.__module__ = __name__
    return DigitsCNN


def __getattr__(name: str):
    # ``DigitsCNN`` is a torch module, built on first use so that importing this module needs no torch.
    if name == "DigitsCNN":
        return _digits_cnn_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def backbone_description(seed: int = 0) -> dict:
    """Everything that determines the trained backbone (hashed into its cache key)."""
    torch = require("torch", "training the digits backbone")
    major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    return {
        "artefact": "digits-backbone",
        "name": BACKBONE_NAME,
        "arch_version": ARCH_VERSION,
        "split_version": SPLIT_VERSION,
        "public_fraction": PUBLIC_FRACTION,
        "test_fraction": TEST_FRACTION,
        "seed": int(seed),
        "train": TRAIN_CONFIG,
        "torch": major_minor,
    }


@contextlib.contextmanager
def deterministic_torch(threads: int = 1, seed: int | None = None):
    """Deterministic algorithms on ``threads`` threads (seeded when ``seed`` is given).

    Restores the caller's settings and torch's global RNG on exit.
    """
    torch = require("torch", "training the digits backbone")
    old_threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(det, warn_only=warn_only)
            torch.set_num_threads(old_threads)


def _train_backbone(public_images: np.ndarray, public_labels: np.ndarray, seed: int, progress: bool = False):
    """Train the backbone (and a throw-away linear head) on the public images only."""
    torch = require("torch", "training the digits backbone")
    F = torch.nn.functional
    cfg = TRAIN_CONFIG
    with deterministic_torch(seed=seed):
        gen = torch.Generator().manual_seed(seed)
        model = _digits_cnn_class()()
        head = torch.nn.Linear(FEATURE_DIM, 10)
        params = list(model.parameters()) + list(head.parameters())
        opt = torch.optim.Adam(params, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
        x = torch.from_numpy(np.array(public_images, dtype=np.float32))[:, None]
        y = torch.from_numpy(np.array(public_labels, dtype=np.int64))
        model.train()
        epochs = range(cfg["epochs"])
        if progress:
            from tqdm.auto import tqdm

            epochs = tqdm(epochs, desc="training digits backbone", unit="epoch", leave=False)
        for _ in epochs:
            perm = torch.randperm(y.shape[0], generator=gen)
            for start in range(0, y.shape[0], cfg["batch_size"]):
                b = perm[start : start + cfg["batch_size"]]
                xb = x[b]
                # random shift by up to one pixel (digits sit in an 8x8 box with empty borders)
                shift = torch.randint(-1, 2, (2,), generator=gen).tolist()
                xb = torch.roll(xb, shifts=(shift[0], shift[1]), dims=(2, 3))
                loss = F.cross_entropy(head(model(xb)), y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
    return model


def _freeze(model):
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def weights_digest(state) -> str:
    """SHA-256 of a backbone's weights: names, dtypes, shapes and little-endian bytes, in name order.

    The same for a ``state_dict`` of tensors and a mapping of numpy arrays
    holding the same values, so shipped and trained weights are keyed alike.
    """
    h = hashlib.sha256()
    for name in sorted(state):
        v = state[name]
        arr = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        h.update(f"{name}|{arr.dtype.str}|{list(arr.shape)}|".encode("ascii"))
        h.update(arr.tobytes())
    return h.hexdigest()


def _shipped_path(seed: int):
    from importlib.resources import files

    return files("privfed.data") / SHIPPED_WEIGHTS[seed][0]


def load_shipped_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """The packaged weights of ``seed`` as float32 arrays, verified against their recorded digest.

    Raises
    ------
    ConfigError
        No weights are shipped for ``seed``.
    InputError
        The packaged file is missing or fails its SHA-256 check (a damaged install).
    """
    seed = _check_seed(seed)
    if seed not in SHIPPED_WEIGHTS:
        raise ConfigError(
            f"no digits backbone weights are shipped for seed {seed} (only {sorted(SHIPPED_WEIGHTS)}); "
            "use weights='trained' (or 'auto') to train them"
        )
    name, digest = SHIPPED_WEIGHTS[seed]
    try:
        data = _shipped_path(seed).read_bytes()
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if not k.startswith("__")}
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(
            f"the packaged digits backbone {name} cannot be read ({exc}); reinstall privfed, or pass "
            "weights='trained' to train it"
        ) from None
    if weights_digest(arrays) != digest:
        raise InputError(
            f"the packaged digits backbone {name} fails its SHA-256 check (a damaged install); reinstall "
            "privfed, or pass weights='trained' to train it"
        )
    return arrays


def _resolve_source(seed: int, weights: str) -> str:
    if weights not in WEIGHT_SOURCES:
        raise ConfigError(f"weights must be one of {list(WEIGHT_SOURCES)}, got {weights!r}")
    if weights == "auto":
        return "shipped" if seed in SHIPPED_WEIGHTS else "trained"
    return weights


def get_backbone(
    *,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
    weights: str = "auto",
):
    """The digits backbone trained on the public split, frozen, in eval mode.

    Parameters
    ----------
    seed : int
        Seed of the split and of the training.
    cache_dir : path, optional
        Cache directory of trained weights; defaults to
        :func:`privfed.data.default_cache_dir`.
    progress : bool
        Show a progress bar while training.
    weights : {"auto", "shipped", "trained"}
        ``"shipped"``: the weights packaged with privfed (seed 0), verified
        against their SHA-256; ``"trained"``: train on the public split (a
        few seconds on one CPU thread; deterministic, so the same seed and
        torch version give bit-identical weights) and cache the result;
        ``"auto"`` (default): shipped when there are shipped weights for
        ``seed``, else trained.

    Returns
    -------
    torch.nn.Module
        Maps (N, 1, 8, 8) float32 images in [0, 1] to (N, 64) ReLU features;
        ``requires_grad`` is False on every parameter.  ``weights_sha256``
        (:func:`weights_digest`) and ``weights_source`` say which weights it holds.
    """
    seed = _check_seed(seed)
    source = _resolve_source(seed, weights)
    torch = require("torch", "the digits backbone as a torch module (extract_features_numpy needs none)")
    with torch.random.fork_rng(devices=[]):  # building the module must not advance the caller's RNG
        model = _digits_cnn_class()()
    if source == "shipped":
        arrays = load_shipped_weights(seed)
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        model.weights_sha256 = SHIPPED_WEIGHTS[seed][1]
        model.weights_source = "shipped"
        model.cache_key = model.weights_sha256
        return _freeze(model)
    desc = backbone_description(seed)
    path, key = _cache.artefact_path("digits-backbone", desc, ".pt", cache_dir)
    state = _cache.load_torch(path, desc)
    if state is not None:
        try:
            model.load_state_dict(state)
        except (RuntimeError, ValueError, TypeError, KeyError):
            warnings.warn(
                f"privfed cache: {path.name} holds weights of another architecture; rebuilding it",
                _cache.CacheIntegrityWarning,
                stacklevel=2,
            )
        else:
            model.weights_sha256 = weights_digest(model.state_dict())
            model.weights_source = "trained"
            model.cache_key = key
            return _freeze(model)
    public = digits_splits(seed)
    model = _train_backbone(public.public_images, public.public_labels, seed, progress=progress)
    _cache.save_torch(path, dict(model.state_dict()), desc)
    model.weights_sha256 = weights_digest(model.state_dict())
    model.weights_source = "trained"
    model.cache_key = key
    return _freeze(model)


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
    arr = np.asarray(images)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"images must be a numeric array, got dtype {arr.dtype}")
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4 or arr.shape[1] != 1:
        raise InputError(f"images must have shape (N, 8, 8) or (N, 1, 8, 8), got {np.shape(images)}")
    if not np.all(np.isfinite(arr)):
        raise InputError("images contain NaN/inf values")
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
    arr = np.asarray(images)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"images must be a numeric array, got dtype {arr.dtype}")
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4 or arr.shape[1:] != (1, 8, 8):
        raise InputError(f"images must have shape (N, 8, 8) or (N, 1, 8, 8), got {np.shape(images)}")
    if not np.all(np.isfinite(arr)):
        raise InputError("images contain NaN/inf values")
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
    seed = _check_seed(seed)
    if _resolve_source(seed, weights) == "shipped" and not _torch_available():
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
    seed = _check_seed(seed)
    source = _resolve_source(seed, weights)
    splits = digits_splits(seed)
    model = None
    if source == "shipped":
        digest = SHIPPED_WEIGHTS[seed][1]
    else:
        model = get_backbone(seed=seed, cache_dir=cache_dir, weights="trained")
        digest = model.weights_sha256
    desc = features_description(seed, digest)

    def compute():
        if model is None and not _torch_available():
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
