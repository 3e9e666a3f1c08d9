"""Data loading: digits split and backbone, the cache, feature files, torchvision path."""

from __future__ import annotations

import json
import os
import pathlib
import re
import time

import numpy as np
import pytest
import torch

from privfed.data import (
    DatasetUnavailableError,
    FeatureDataset,
    available_datasets,
    default_cache_dir,
    load_dataset,
)
from privfed.data import cache as C
from privfed.data.digits import (
    FEATURE_DIM,
    backbone_description,
    digits_splits,
    extract_features,
    get_backbone,
    load_digits_features,
    load_shipped_weights,
)
from privfed.data.digits_numpy import float32_error_bound
from privfed.data.npzfile import load_feature_file, save_feature_file
from privfed.errors import ConfigError, InputError, PrivfedError

# -- digits split -----------------------------------------------------------------


def test_digits_split_sizes_disjoint_and_stratified(digits_parts):
    s = digits_parts
    sizes = {k: v.size for k, v in s.indices.items()}
    assert sizes == {"public": 539, "private": 899, "test": 359}
    allidx = np.concatenate(list(s.indices.values()))
    assert np.array_equal(np.sort(allidx), np.arange(1797))  # a partition of load_digits()
    from sklearn.datasets import load_digits

    ref = load_digits()
    for part in ("public", "private", "test"):
        im, lab = getattr(s, f"{part}_images"), getattr(s, f"{part}_labels")
        assert im.shape == (sizes[part], 8, 8) and im.dtype == np.float32
        assert lab.dtype == np.int64
        assert im.min() >= 0 and im.max() <= 1
        ix = s.indices[part]
        np.testing.assert_array_equal(im, (ref.images[ix] / 16).astype(np.float32))
        np.testing.assert_array_equal(lab, ref.target[ix])
        # Stratified: each class count is within 1 (rounding) of its share of the part
        # (scikit-learn's stratified split allocates by largest remainder).
        expected = np.bincount(ref.target, minlength=10) * sizes[part] / 1797
        assert np.all(np.abs(np.bincount(lab, minlength=10) - expected) <= 1.0 + 1e-9)
    assert not s.public_images.flags.writeable


def test_digits_split_seeded():
    a, b, c = digits_splits(0), digits_splits(0), digits_splits(1)
    assert np.array_equal(a.indices["public"], b.indices["public"])
    assert not np.array_equal(a.indices["public"], c.indices["public"])
    with pytest.raises(ConfigError, match="seed"):
        digits_splits(-1)


# -- digits backbone and features ---------------------------------------------------


def test_digits_backbone_frozen_and_shapes(digits_backbone, digits_parts):
    m = digits_backbone
    assert not m.training
    assert all(not p.requires_grad for p in m.parameters())
    x = torch.from_numpy(np.array(digits_parts.test_images[:5]))[:, None]
    out = m(x)
    assert out.shape == (5, FEATURE_DIM)
    assert torch.all(out >= 0)  # ReLU features
    F = extract_features(m, digits_parts.test_images[:5])
    assert F.dtype == np.float64 and F.shape == (5, FEATURE_DIM)
    np.testing.assert_array_equal(F, out.numpy().astype(np.float64))
    # (N, 1, 8, 8) input and a batch size that splits the data give the same numbers up to float32
    # rounding: float32 kernels may block a batch differently (or pick other kernels for another thread
    # count), and each result is within the forward error bound of the exact features, so two differ by
    # at most twice that bound (privfed.data.digits_numpy.float32_error_bound: gamma_{k+1} per layer)
    F2 = extract_features(m, digits_parts.test_images[:5, None], batch_size=2)
    bound = float32_error_bound(load_shipped_weights(0), digits_parts.test_images[:5])
    assert np.all(np.abs(F2 - F) <= 2 * bound)


def test_extract_features_rejects_bad_images(digits_backbone):
    with pytest.raises(InputError, match="shape"):
        extract_features(digits_backbone, np.zeros((3, 3, 8, 8)))
    with pytest.raises(InputError, match="NaN"):
        extract_features(digits_backbone, np.full((2, 8, 8), np.nan))
    with pytest.raises(ConfigError, match="batch_size"):
        extract_features(digits_backbone, np.zeros((2, 8, 8)), batch_size=0)


def test_digits_features_dataset(digits_dataset, digits_parts):
    ds = digits_dataset
    assert isinstance(ds, FeatureDataset)
    assert ds.name == "digits" and ds.num_classes == 10 and ds.dim == 64
    assert ds.train_features.shape == (899, 64) and ds.test_features.shape == (359, 64)
    assert ds.train_features.dtype == np.float64 and ds.train_labels.dtype == np.int64
    np.testing.assert_array_equal(ds.train_labels, digits_parts.private_labels)
    np.testing.assert_array_equal(ds.test_labels, digits_parts.test_labels)
    assert ds.meta["backbone"] == "digits-cnn" and ds.meta["d"] == 64
    assert ds.meta["split"] == {"public": 539, "private": 899, "test": 359}
    assert ds.train_clients is None
    assert not ds.train_features.flags.writeable


def test_digits_features_are_good(digits_dataset):
    """Centralised heads on the private features reach >= 90% test accuracy.

    Measured (seed 0): nearest class mean (cosine, FedNCM's head) 0.950, ridge (lambda 1) 0.964;
    seeds 1-4: 0.95-0.98 and 0.97-0.99.
    0.90 is the accuracy the digits backbone is built to reach, not a value fitted to the result.
    """
    ds = digits_dataset
    mu = np.stack([ds.train_features[ds.train_labels == c].mean(0) for c in range(10)])
    W = mu / np.linalg.norm(mu, axis=1, keepdims=True)
    acc_ncm = np.mean((ds.test_features @ W.T).argmax(1) == ds.test_labels)
    Y = np.eye(10)[ds.train_labels]
    F = ds.train_features
    Wr = np.linalg.solve(F.T @ F + 1.0 * np.eye(64), F.T @ Y)
    acc_ridge = np.mean((ds.test_features @ Wr).argmax(1) == ds.test_labels)
    assert acc_ncm >= 0.90, acc_ncm
    assert acc_ridge >= 0.90, acc_ridge


def test_digits_cache_hit_is_fast_and_identical(digits_cache, digits_dataset):
    t = time.perf_counter()
    again = load_digits_features(seed=0, cache_dir=digits_cache)
    assert time.perf_counter() - t < 1.0
    assert again.meta["cache_hit"] is True
    np.testing.assert_array_equal(again.train_features, digits_dataset.train_features)
    assert again.meta["cache_key"] == digits_dataset.meta["cache_key"]


def test_retraining_is_deterministic_and_as_good_as_the_shipped_backbone(tmp_path, digits_dataset):
    """What retraining guarantees everywhere: the same weights bit for bit on every run on one machine
    (seeded, deterministic algorithms, one thread), a backbone as good as the shipped one, and the
    caller's torch state untouched.  Not the shipped bits: float32 convolution kernels differ between
    CPUs (instruction sets) and torch versions, and 40 epochs of Adam amplify one rounding difference
    (0.0145 in the largest weight on another CPU); the shipped file is what fixes the default features,
    and ``python -m experiments.train_digits_backbone`` reports how far a retrained one drifts."""
    from privfed.data import digits as D
    from privfed.data import digits_backbone as DB

    threads, det, rng = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_rng_state(),
    )
    trained = get_backbone(seed=0, cache_dir=tmp_path, weights="trained")
    # training restored the caller's torch settings and global RNG
    assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled() == det
    assert torch.equal(torch.get_rng_state(), rng)
    assert trained.weights_source == "trained"
    # a second training from scratch (no cache) gives the same bits
    splits = digits_splits(0)
    again_fresh = DB.train_backbone(splits.public_images, splits.public_labels, 0)
    assert D.weights_digest(again_fresh.state_dict()) == trained.weights_sha256
    ds = load_digits_features(seed=0, cache_dir=tmp_path, weights="trained")
    assert ds.meta["weights"] == "trained" and ds.meta["cache_hit"] is False
    if trained.weights_sha256 == D.SHIPPED_WEIGHTS[0][1]:  # the machine (and torch) the file was made on
        assert ds.meta["cache_key"] == digits_dataset.meta["cache_key"]
        np.testing.assert_array_equal(ds.train_features, digits_dataset.train_features)
    # as good as the shipped backbone: the nearest-class-mean head reaches the 0.90 the backbone is built
    # for (test_digits_features_are_good; shipped: 0.955)
    mu = np.stack([ds.train_features[ds.train_labels == c].mean(0) for c in range(10)])
    W = mu / np.linalg.norm(mu, axis=1, keepdims=True)
    assert np.mean((ds.test_features @ W.T).argmax(1) == ds.test_labels) >= 0.90
    # the trained weights are now a cache hit
    again = get_backbone(seed=0, cache_dir=tmp_path, weights="trained")
    for (k0, v0), (k1, v1) in zip(trained.state_dict().items(), again.state_dict().items()):
        assert k0 == k1 and torch.equal(v0, v1)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # atomic writes leave no temp file


def test_default_features_come_from_the_shipped_weights(digits_dataset, digits_backbone):
    """The default uses the packaged weights (no training) and keys the features on their digest,
    not on the torch version."""
    from privfed.data import digits as D

    assert digits_dataset.meta["weights"] == "shipped"
    assert digits_dataset.meta["weights_sha256"] == D.SHIPPED_WEIGHTS[0][1]
    assert digits_backbone.weights_source == "shipped"
    assert D.weights_digest(digits_backbone.state_dict()) == D.SHIPPED_WEIGHTS[0][1]
    desc = D.features_description(0, D.SHIPPED_WEIGHTS[0][1])
    assert "torch" not in C.canonical_json(desc)
    assert digits_dataset.meta["cache_key"] == C.cache_key(desc)
    with pytest.raises(ConfigError, match="weights"):
        get_backbone(seed=0, weights="imagenet")
    with pytest.raises(ConfigError, match="no digits backbone weights are shipped for seed 3"):
        get_backbone(seed=3, weights="shipped")


def test_backbone_training_leaves_torch_settings_alone(digits_backbone):
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    state = torch.get_rng_state()
    get_backbone(seed=0)  # cache hit (PRIVFED_CACHE is the session cache)
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == det
    assert torch.equal(torch.get_rng_state(), state)


def test_backbone_description_keys_everything():
    a = backbone_description(0)
    assert a != backbone_description(1)
    for field in ("arch_version", "split_version", "train", "torch", "seed"):
        assert field in a
    assert C.cache_key(a) != C.cache_key(backbone_description(1))


# -- the cache module --------------------------------------------------------------


def test_cache_key_canonical():
    a = {"b": 1, "a": [1, 2, {"y": 2.5, "x": None}]}
    b = json.loads(json.dumps({"a": [1, 2, {"x": None, "y": 2.5}], "b": 1}))
    assert C.cache_key(a) == C.cache_key(b)
    assert C.cache_key(a) != C.cache_key({**a, "b": 2})
    assert len(C.cache_key(a)) == 64
    import hashlib

    assert C.cache_key(a) == hashlib.sha256(b'{"a":[1,2,{"x":null,"y":2.5}],"b":1}').hexdigest()
    with pytest.raises(ConfigError):
        C.cache_key({"x": float("nan")})
    with pytest.raises(ConfigError):
        C.cache_key({"x": object()})


def test_cached_arrays_roundtrip_and_corruption(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"x": np.arange(6.0).reshape(2, 3)}

    desc = {"artefact": "t", "v": 1}
    a, key, hit = C.cached_arrays("t", desc, compute, tmp_path)
    assert not hit and len(calls) == 1
    b, key2, hit2 = C.cached_arrays("t", desc, compute, tmp_path)
    assert hit2 and key2 == key and len(calls) == 1
    np.testing.assert_array_equal(a["x"], b["x"])
    (path,) = [p for p in tmp_path.iterdir() if p.suffix == ".npz"]
    path.write_bytes(path.read_bytes()[:40])  # truncated
    c, _, hit3 = C.cached_arrays("t", desc, compute, tmp_path)
    assert not hit3 and len(calls) == 2
    np.testing.assert_array_equal(c["x"], a["x"])
    # a file whose stored description differs (a truncated-key collision) is a miss
    assert C.load_arrays(path, {"artefact": "t", "v": 2}) is None
    assert C.load_arrays(tmp_path / "missing.npz") is None
    assert C.load_torch(tmp_path / "missing.pt") is None
    garbage = tmp_path / "g.pt"
    garbage.write_bytes(b"\x00\x01garbage")
    assert C.load_torch(garbage) is None


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIVFED_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PRIVFED_CACHE")
    if os.name == "posix" and not os.uname().sysname == "Darwin":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert default_cache_dir() == tmp_path / "xdg" / "privfed"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert default_cache_dir() == pathlib.Path.home() / ".cache" / "privfed"


def test_uncreatable_cache_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cache directory"):
        C.resolve_cache_dir(blocker / "sub")


# -- load_dataset ------------------------------------------------------------------


def test_load_dataset_digits_and_errors(digits_cache, digits_dataset):
    ds = load_dataset("digits", cache_dir=digits_cache)
    np.testing.assert_array_equal(ds.train_features, digits_dataset.train_features)
    assert "digits" in available_datasets() and "cifar100" in available_datasets()
    with pytest.raises(ConfigError, match="available"):
        load_dataset("mnist")
    with pytest.raises(ConfigError, match="file:"):
        load_dataset("feats.npz")
    with pytest.raises(ConfigError, match="backbone"):
        load_dataset("digits", backbone="vit_b_16")
    with pytest.raises(ConfigError, match="seed"):
        load_dataset("digits", seed=-3)


def test_feature_dataset_validates():
    F = np.zeros((4, 2))
    with pytest.raises(InputError, match="train_labels"):
        FeatureDataset("x", F, np.array([0, 1, 2]), F, np.zeros(4, int), 3)
    with pytest.raises(InputError, match="test_features"):
        FeatureDataset("x", F, np.zeros(4, int), np.zeros((4, 3)), np.zeros(4, int), 1)
    user = np.zeros((4, 2))
    ds = FeatureDataset("x", user, np.zeros(4, int), user, np.zeros(4, int), 1)
    assert user.flags.writeable and not ds.train_features.flags.writeable  # the caller's array is untouched


# -- feature files -------------------------------------------------------------------


def _blobs(n=100, d=5, C=4, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % C
    F = rng.normal(size=(n, d)) + 3 * np.eye(C, d)[y]
    return F, y


def test_feature_file_with_test_and_clients(tmp_path):
    F, y = _blobs()
    Ft, yt = _blobs(40, seed=1)
    k = np.arange(100) % 7
    path = save_feature_file(tmp_path / "f", F, y, clients=k, test_features=Ft, test_labels=yt)
    assert path.suffix == ".npz"
    ds = load_dataset(f"file:{path}")
    np.testing.assert_array_equal(ds.train_features, F)
    np.testing.assert_array_equal(ds.train_labels, y)
    np.testing.assert_array_equal(ds.train_clients, k)
    np.testing.assert_array_equal(ds.test_features, Ft)
    assert ds.num_classes == 4 and ds.meta["test_split"] == "from the file"
    assert ds.meta["natural_clients"] == 7 and ds.meta["d"] == 5


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("test_feature", "test_features"),
        ("test_label", "test_labels"),
        ("client", "clients"),
        ("Clients", "clients"),
    ],
)
def test_a_misspelt_optional_array_is_refused_not_ignored(tmp_path, typo, meant):
    """test_feature/test_label were ignored: the run carved its own test part out of the training arrays and
    said only 'no test arrays in the file'.  A name unlike any (feature_names) is still ignored and listed."""
    F, y = _blobs(100)
    np.savez(
        tmp_path / "f.npz", features=F, labels=y, **{typo: y}, feature_names=np.array(["a"] * F.shape[1])
    )
    with pytest.raises(InputError, match=f"holds '{typo}', not read: did you mean '{meant}'"):
        load_feature_file(tmp_path / "f.npz")
    np.savez(tmp_path / "g.npz", features=F, labels=y, feature_names=np.array(["a"] * F.shape[1]))
    assert load_feature_file(tmp_path / "g.npz").meta["ignored_arrays"] == ["feature_names"]
    # near the name of an array the file holds, or of a required one: an extra array, ignored and listed
    np.savez(tmp_path / "h.npz", features=F, labels=y, clients=y, features2=F, labels_0=y, Clients=y)
    assert load_feature_file(tmp_path / "h.npz").meta["ignored_arrays"] == [
        "Clients",
        "features2",
        "labels_0",
    ]


def test_feature_file_without_test_splits_stratified(tmp_path):
    F, y = _blobs(100)
    F = F.astype(np.float32)
    k = np.arange(100) % 3
    np.savez(tmp_path / "f.npz", features=F, labels=y.astype(np.int32), clients=k, extra=np.ones(2))
    ds = load_feature_file(tmp_path / "f.npz", seed=3)
    assert ds.num_train == 80 and ds.num_test == 20
    assert np.array_equal(np.bincount(ds.test_labels), [5, 5, 5, 5])  # 20% of each of the 4 classes of 25
    assert "held out" in ds.meta["test_split"] and "seed 3" in ds.meta["test_split"]
    assert ds.meta["ignored_arrays"] == ["extra"]
    test_idx = np.array(ds.meta["test_indices"])
    train_idx = np.setdiff1d(np.arange(100), test_idx)
    np.testing.assert_array_equal(ds.train_features, F[train_idx].astype(np.float64))
    np.testing.assert_array_equal(ds.train_clients, k[train_idx])
    again = load_feature_file(tmp_path / "f.npz", seed=3)
    np.testing.assert_array_equal(again.test_labels, ds.test_labels)


@pytest.mark.parametrize(
    "arrays, match",
    [
        (
            {"features": np.zeros((100, 3)), "labels": np.zeros(90, int)},
            "'labels' has 90 entries but 'features' has 100 rows",
        ),
        ({"features": np.zeros((10, 3))}, "no 'labels' array"),
        ({"labels": np.zeros(10, int)}, "no 'features' array"),
        ({"features": np.zeros(10), "labels": np.zeros(10, int)}, "'features' must be a 2-D"),
        (
            {"features": np.array([[0.0, np.nan]] * 4), "labels": np.zeros(4, int)},
            "'features' has 4 NaN/inf values \\(first in row 0\\)",
        ),
        ({"features": np.zeros((4, 2)), "labels": np.array([0, 1, -1, 0])}, "'labels' must be >= 0"),
        ({"features": np.zeros((4, 2)), "labels": np.array([0, 0.5, 1, 0])}, "whole numbers"),
        (
            {"features": np.zeros((4, 2)), "labels": np.array(["a", "b", "c", "d"])},
            "'labels' must hold integers",
        ),
        ({"features": np.zeros((8, 2)), "labels": np.array([0, 2] * 4)}, "skip class"),
        (
            {"features": np.zeros((4, 2)), "labels": np.zeros(4, int), "clients": np.zeros(3, int)},
            "'clients' has 3 entries",
        ),
        (
            {"features": np.zeros((4, 2)), "labels": np.zeros(4, int), "test_features": np.zeros((2, 2))},
            "no 'test_labels'",
        ),
        (
            {
                "features": np.zeros((4, 2)),
                "labels": np.zeros(4, int),
                "test_features": np.zeros((2, 3)),
                "test_labels": np.zeros(2, int),
            },
            "'test_features' has 3 columns",
        ),
        (
            {
                "features": np.zeros((4, 2)),
                "labels": np.zeros(4, int),
                "test_features": np.zeros((2, 2)),
                "test_labels": np.array([0, 1]),
            },
            r"class\(es\) \[1\] appear in the test set",
        ),
    ],
)
def test_feature_file_errors(tmp_path, arrays, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(InputError, match=match) as info:
        load_dataset(f"file:{path}")
    assert str(path) in str(info.value)  # the message names the file


def test_feature_file_pickled_and_unreadable(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, features=np.array([[1.0, 2.0], [3.0, 4.0]]), labels=np.array([0, 1], dtype=object))
    with pytest.raises(InputError, match="pickled") as info:
        load_dataset(f"file:{path}")
    assert "'labels'" in str(info.value)
    missing = tmp_path / "nope.npz"
    with pytest.raises(InputError, match="does not exist") as info:
        load_dataset(f"file:{missing}")
    assert str(missing) in str(info.value)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not numpy")
    with pytest.raises(InputError, match="cannot be read"):
        load_dataset(f"file:{junk}")
    single = tmp_path / "one.npy"
    np.save(single, np.zeros((3, 2)))
    with pytest.raises(InputError, match="single .npy"):
        load_dataset(f"file:{single}")
    with pytest.raises(InputError, match="directory"):
        load_dataset(f"file:{tmp_path}")


def test_feature_file_too_small_to_split(tmp_path):
    with pytest.raises(InputError, match="too few"):  # the writer refuses what the reader would
        save_feature_file(tmp_path / "tiny.npz", np.zeros((2, 2)), np.array([0, 0]))
    np.savez(tmp_path / "tiny.npz", features=np.zeros((2, 2)), labels=np.array([0, 0]))
    with pytest.raises(InputError, match="too few"):
        load_dataset(f"file:{tmp_path / 'tiny.npz'}")


# -- torchvision path (never downloads) ------------------------------------------------

vision = pytest.importorskip("privfed.data.vision")


def _fake(n, size=32, classes=3, offset=0, image_size=64):
    from torchvision.datasets import FakeData

    return FakeData(
        size=n,
        image_size=(3, size, size),
        num_classes=classes,
        transform=vision.preprocess("cifar10", image_size),
        random_offset=offset,
    )


def test_build_backbone_dims_without_weights():
    torch.manual_seed(0)
    for name, size in (("squeezenet1_1", 64), ("mobilenet_v2", 64), ("vit_b_16", 32)):
        fx = vision.build_backbone(name, weights=None, image_size=size)
        assert fx.weights is None and not fx.training
        assert all(not p.requires_grad for p in fx.parameters())
        out = fx(torch.rand(2, 3, size, size))
        assert out.shape == (2, vision.BACKBONES[name].dim) == (2, fx.dim)
    with pytest.raises(ConfigError, match="available"):
        vision.build_backbone("resnet18", weights=None)
    with pytest.raises(ConfigError, match="IMAGENET1K_V1"):
        vision.build_backbone("mobilenet_v2", weights="IMAGENET1K_V9")


def test_missing_pretrained_weights_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty hub cache
    with pytest.raises(DatasetUnavailableError, match="download=True"):
        vision.build_backbone("squeezenet1_1")


def test_extract_dataset_features_matches_direct_forward():
    torch.manual_seed(0)
    fx = vision.build_backbone("squeezenet1_1", weights=None)
    ds = _fake(10)
    F, y = vision.extract_dataset_features(ds, fx, batch_size=4, device="cpu", progress=False)
    assert F.shape == (10, 512) and F.dtype == np.float64
    np.testing.assert_array_equal(y, [int(ds[i][1]) for i in range(10)])
    x = torch.stack([ds[i][0] for i in range(10)])
    with torch.no_grad():
        direct = torch.cat([fx(x[i : i + 4]) for i in range(0, 10, 4)]).numpy().astype(np.float64)
    np.testing.assert_array_equal(F, direct)  # same batches, same kernels: same bits


def test_images_a_backbone_cannot_take_are_named_not_a_torch_traceback():
    """Before: one-channel images (or a ViT given another size) raised torch's RuntimeError from inside the
    convolution."""
    import torch.utils.data as tud

    torch.manual_seed(0)
    fx = vision.build_backbone("squeezenet1_1", weights=None)
    grey = tud.TensorDataset(torch.rand(6, 1, 32, 32), torch.zeros(6, dtype=torch.int64))
    with pytest.raises(
        InputError, match=r"squeezenet1_1 cannot take a batch of images of shape \(4, 1, 32, 32\)"
    ):
        vision.extract_dataset_features(grey, fx, batch_size=4, device="cpu", progress=False)
    vit = vision.build_backbone("vit_b_16", weights=None, image_size=32)
    wrong = tud.TensorDataset(torch.rand(2, 3, 48, 48), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(InputError, match="vit_b_16 cannot take.*preprocess"):
        vision.extract_dataset_features(wrong, vit, batch_size=2, device="cpu", progress=False)
    # a fault that is not the images' shape (here float64 images) is torch's own error, not blamed on them
    doubles = tud.TensorDataset(
        torch.rand(4, 3, 32, 32, dtype=torch.float64), torch.zeros(4, dtype=torch.int64)
    )
    with pytest.raises(RuntimeError, match="type") as exc:
        vision.extract_dataset_features(doubles, fx, batch_size=4, device="cpu", progress=False)
    assert not isinstance(exc.value, InputError)


def test_vision_pipeline_caches_and_skips_backbone(monkeypatch, tmp_path):
    """load_vision_features end to end on FakeData; a cache hit never builds the backbone."""
    built = []
    real_build = vision.build_backbone

    def fake_open(name, root, *, train, download=False, transform=None):
        from torchvision.datasets import FakeData

        return FakeData(
            size=6 if train else 4,
            image_size=(3, 32, 32),
            num_classes=10,
            transform=transform,
            random_offset=0 if train else 1000,
        )

    def fake_build(name, weights="DEFAULT", **kw):
        built.append(name)
        torch.manual_seed(0)
        return real_build(name, None)

    monkeypatch.setattr(vision, "open_dataset", fake_open)
    monkeypatch.setattr(vision, "build_backbone", fake_build)
    ds = vision.load_vision_features(
        "cifar10", cache_dir=tmp_path, progress=False, device="cpu", image_size=64
    )
    assert ds.train_features.shape == (6, 512) and ds.test_features.shape == (4, 512)
    assert ds.num_classes == 10 and ds.meta["backbone"] == "squeezenet1_1"
    assert ds.meta["weights"] == "IMAGENET1K_V1" and ds.meta["preprocessing"]["resize"] == 64
    assert built == ["squeezenet1_1"]

    def gone(*a, **k):
        raise DatasetUnavailableError("images deleted")

    monkeypatch.setattr(vision, "open_dataset", gone)  # a cache hit needs neither images nor backbone
    again = vision.load_vision_features(
        "cifar10", cache_dir=tmp_path, progress=False, device="cpu", image_size=64
    )
    assert built == ["squeezenet1_1"]  # not rebuilt
    monkeypatch.setattr(vision, "open_dataset", fake_open)
    assert again.meta["cache_hit"] == {"train": True, "test": True}
    np.testing.assert_array_equal(again.train_features, ds.train_features)
    # another preprocessing is another key
    vision.load_vision_features("cifar10", cache_dir=tmp_path, progress=False, device="cpu", image_size=32)
    assert len(built) == 2


def test_cifar_offline_without_download_is_clear(tmp_path):
    with pytest.raises(DatasetUnavailableError, match="download=True") as info:
        load_dataset("cifar100", cache_dir=tmp_path, download=False)
    assert isinstance(info.value, PrivfedError)
    with pytest.raises(DatasetUnavailableError, match="not in"):
        vision.open_dataset("cifar10", tmp_path / "data", train=True, download=False)


def test_a_corrupt_data_set_or_a_data_folder_that_is_a_file_is_named_as_such(tmp_path):
    """Junk in cifar-10-batches-py was called 'not in ... downloading is off', and a file as the data folder
    'downloading failed (File exists); downloading needs internet'."""
    junk = tmp_path / "data" / "cifar-10-batches-py"
    junk.mkdir(parents=True)
    for part in ("data_batch_1", "batches.meta", "test_batch"):
        (junk / part).write_bytes(b"not a pickle")
    with pytest.raises(DatasetUnavailableError, match="cifar-10-batches-py' is incomplete or corrupted"):
        vision.open_dataset("cifar10", tmp_path / "data", train=True, download=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetUnavailableError, match="is a file, not a folder"):
        vision.open_dataset("cifar10", tmp_path / "file", train=True, download=True)


def test_preprocessing_statistics():
    assert vision.preprocessing_description("cifar100")["mean"] == [0.5071, 0.4865, 0.4409]
    assert vision.preprocessing_description("cifar10")["mean"] == [0.485, 0.456, 0.406]
    assert vision.preprocessing_description("cifar10")["resize"] == 224
    with pytest.raises(ConfigError):
        vision.preprocessing_description("svhn")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA"):
            vision.resolve_device("cuda")
    assert vision.resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_device_resize_commutes_with_normalisation():
    """Bilinear weights sum to one, so resizing and per-channel affine normalisation commute
    (up to float32 rounding, ~1e-6 on values of order 1)."""
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.random((2, 3, 32, 32), dtype=np.float32))
    mean = torch.tensor(vision.CIFAR100_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(vision.CIFAR100_STD).view(1, 3, 1, 1)
    a = vision.resize_batch((x - mean) / std, 224)
    b = (vision.resize_batch(x, 224) - mean) / std
    assert a.shape == (2, 3, 224, 224)
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    assert vision.resize_batch(x, 32) is x


def test_extract_with_device_resize_matches_direct_forward():
    from torchvision.datasets import FakeData

    torch.manual_seed(0)
    fx = vision.build_backbone("squeezenet1_1", weights=None)
    ds = FakeData(
        size=5, image_size=(3, 32, 32), num_classes=3, transform=vision.preprocess("cifar100", None)
    )
    F, _ = vision.extract_dataset_features(ds, fx, batch_size=5, device="cpu", progress=False, resize=64)
    x = torch.stack([ds[i][0] for i in range(5)])
    assert x.shape[-1] == 32
    with torch.no_grad():
        direct = fx(vision.resize_batch(x, 64)).numpy().astype(np.float64)
    np.testing.assert_array_equal(F, direct)


@pytest.mark.parametrize(
    "spec, advice",
    [
        ("/data/f.npz", "'file:/data/f.npz'"),
        ("FILE:/data/f.npz", "'file:/data/f.npz'"),  # was 'file:FILE:/data/f.npz', which names no file
        (" file:/data/f.npz", "'file:/data/f.npz'"),
    ],
)
def test_a_path_without_its_prefix_is_advised_the_spelling_that_works(spec, advice):
    with pytest.raises(ConfigError, match=f"looks like a file; pass it as {advice}$"):
        load_dataset(spec)


def test_a_cache_path_that_is_a_file_is_named_as_such(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        ConfigError, match="cannot be created \\(a file is in the way\\)"
    ):  # was 'File exists'
        C.resolve_cache_dir(tmp_path / "f")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"test_features": "narrow"}, "'test_features' has 2 columns but 'features' has 3"),
        ({"labels": "mod3"}, "class(es) [3] appear in the test set but have no training sample"),
        ({"labels": "gap"}, "class(es) [1]"),  # no training sample of class 1 (its test samples remain)
        ({"clients": "far"}, "'clients' goes up to"),
        ({"labels": "huge"}, "labels go up to 3000"),
    ],
)
def test_save_feature_file_refuses_what_load_feature_file_would(tmp_path, change, message):
    """The writer ran the reader's per-array checks only: each of these was written, then refused on load."""
    rng = np.random.default_rng(0)
    F, y, Ft, yt = rng.normal(size=(20, 3)), np.arange(20) % 4, rng.normal(size=(8, 3)), np.arange(8) % 4
    kw = {"test_features": Ft, "test_labels": yt, "clients": np.arange(20) % 2}
    variants = {
        "narrow": Ft[:, :2],
        "mod3": y % 3,
        "gap": np.where(y == 1, 3, y),
        "far": (np.arange(20) % 2) * 100,
        "huge": y * 1000,
    }
    ((key, which),) = change.items()
    labels = variants[which] if key == "labels" else y
    if key != "labels":
        kw[key] = variants[which]
    path = tmp_path / "f.npz"
    with pytest.raises(InputError, match=re.escape(message)):
        save_feature_file(path, F, labels, **kw)
    assert not path.exists()
    save_feature_file(path, F, y, test_features=Ft, test_labels=yt, clients=np.arange(20) % 2)
    assert load_feature_file(path).num_classes == 4  # the same arrays, set right, are written and read


def test_a_feature_file_named_in_capitals_keeps_its_name(tmp_path):
    path = save_feature_file(
        tmp_path / "x.NPZ", np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 2
    )
    assert path == tmp_path / "x.NPZ" and path.is_file()  # was written as x.NPZ.npz
