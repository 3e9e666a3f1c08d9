"""The digits backbone: a small CNN trained on the public split only; seed 0's weights ship, checked."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import warnings

import numpy as np

from privfed.data import cache as _cache
from privfed.data.digits_split import PUBLIC_FRACTION, SPLIT_VERSION, TEST_FRACTION, check_seed, digits_splits
from privfed.errors import ConfigError, InputError
from privfed.optional import import_held, require

__all__ = [
    "ARCH_VERSION",
    "BACKBONE_NAME",
    "FEATURE_DIM",
    "SHIPPED_WEIGHTS",
    "TRAIN_CONFIG",
    "WEIGHT_SOURCES",
    "backbone_description",
    "deterministic_torch",
    "digits_cnn_class",
    "freeze",
    "get_backbone",
    "load_shipped_weights",
    "resolve_source",
    "shipped_path",
    "torch_available",
    "train_backbone",
    "weights_digest",
]


#: Name of the digits backbone (recorded in ``FeatureDataset.meta``).
BACKBONE_NAME = "digits-cnn"
#: Bump when the architecture or the training procedure changes (invalidates caches).
ARCH_VERSION = 1
#: Feature dimension of the backbone.
FEATURE_DIM = 64

#: Weights shipped in the package: seed -> (file name in privfed/data, :func:`weights_digest`).
#: Made by ``python -m experiments.train_digits_backbone --write``.
SHIPPED_WEIGHTS = {
    0: ("digits_cnn_seed0.npz", "ae6b065eb7619d10ec56762b5673944544e1a5d44f856096ad66d6929c9a7f74"),
}
#: Where a backbone's weights come from.
WEIGHT_SOURCES = ("auto", "shipped", "trained")

#: Training hyper-parameters of the backbone (all part of the cache key).
TRAIN_CONFIG = {
    "epochs": 40,
    "batch_size": 64,
    "optimizer": "adam",
    "lr": 3e-3,
    "weight_decay": 1e-4,
    "augment": "random-shift-1px",
}


@functools.lru_cache(maxsize=1)
def digits_cnn_class():
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
        return digits_cnn_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def torch_available() -> bool:
    try:
        import_held("torch")  # Ctrl-C during torch's import lands after it, where it can be handled
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


def train_backbone(public_images: np.ndarray, public_labels: np.ndarray, seed: int, progress: bool = False):
    """Train the backbone (and a throw-away linear head) on the public images only."""
    torch = require("torch", "training the digits backbone")
    F = torch.nn.functional
    cfg = TRAIN_CONFIG
    with deterministic_torch(seed=seed):
        gen = torch.Generator().manual_seed(seed)
        model = digits_cnn_class()()
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


def freeze(model):
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


def shipped_path(seed: int):
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
    seed = check_seed(seed)
    if seed not in SHIPPED_WEIGHTS:
        raise ConfigError(
            f"no digits backbone weights are shipped for seed {seed} (only {sorted(SHIPPED_WEIGHTS)}); "
            "use weights='trained' (or 'auto') to train them"
        )
    name, digest = SHIPPED_WEIGHTS[seed]
    try:
        data = shipped_path(seed).read_bytes()
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


def resolve_source(seed: int, weights: str) -> str:
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
    seed = check_seed(seed)
    source = resolve_source(seed, weights)
    torch = require("torch", "the digits backbone as a torch module (extract_features_numpy needs none)")
    with torch.random.fork_rng(devices=[]):  # building the module must not advance the caller's RNG
        model = digits_cnn_class()()
    if source == "shipped":
        arrays = load_shipped_weights(seed)
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        model.weights_sha256 = SHIPPED_WEIGHTS[seed][1]
        model.weights_source = "shipped"
        model.cache_key = model.weights_sha256
        return freeze(model)
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
            return freeze(model)
    public = digits_splits(seed)
    model = train_backbone(public.public_images, public.public_labels, seed, progress=progress)
    _cache.save_torch(path, dict(model.state_dict()), desc)
    model.weights_sha256 = weights_digest(model.state_dict())
    model.weights_source = "trained"
    model.cache_key = key
    return freeze(model)
