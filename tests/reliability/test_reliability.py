"""Nothing lost, nothing silently wrong: cache integrity, input limits, extreme scales.

Fault injection on every kind of cache file (bit flips anywhere, truncation,
files of the old format, a read-only cache), inputs that would allocate
without bound (huge labels, client ids, class counts, ``.npz`` headers and
deflate bombs), and features at scales where the statistics overflow or
underflow.
"""

from __future__ import annotations

import io
import os
import pathlib
import warnings
import zipfile

import numpy as np
import pytest
import torch

import privfed
from privfed.data import cache as C
from privfed.data import digits as D
from privfed.data import digits_backbone as DB
from privfed.errors import ConfigError, InputError


def _flip(path, position: int, bit: int = 6) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def _positions(path) -> list[int]:
    """Byte positions to flip: in the magic, the header, the payload start, middle and end."""
    n = path.stat().st_size
    return sorted({3, len(C.MAGIC) + 2, len(C.MAGIC) + 40, n // 3, n // 2, n - 200, n - 1})


@pytest.fixture()
def fast_training(monkeypatch):
    """Training replaced by loading the shipped weights (deterministic, instant); counts calls."""
    calls = []

    def train(images, labels, seed, progress=False):
        calls.append(seed)
        m = D.DigitsCNN()
        m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in D.load_shipped_weights(0).items()})
        return m

    monkeypatch.setattr(DB, "train_backbone", train)
    return calls


# -- cache integrity -------------------------------------------------------------------


def test_bit_flips_in_cached_features_are_detected_and_rebuilt(tmp_path, digits_dataset):
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.CacheIntegrityWarning)  # an absent file is a silent miss
        clean = D.load_digits_features(seed=0, cache_dir=tmp_path)
    assert clean.meta["cache_hit"] is False
    (path,) = tmp_path.glob("digits-features-*.npz")
    pristine = path.read_bytes()
    for pos in _positions(path):
        path.write_bytes(pristine)
        _flip(path, pos)
        with pytest.warns(C.CacheIntegrityWarning, match=path.name) as rec:
            ds = D.load_digits_features(seed=0, cache_dir=tmp_path)
        assert len(rec) == 1 and "rebuilding" in str(rec[0].message)
        assert ds.meta["cache_hit"] is False
        np.testing.assert_array_equal(ds.train_features, digits_dataset.train_features)
        np.testing.assert_array_equal(ds.test_features, digits_dataset.test_features)
        with warnings.catch_warnings():
            warnings.simplefilter("error", C.CacheIntegrityWarning)  # the rebuilt file verifies: a silent hit
            again = D.load_digits_features(seed=0, cache_dir=tmp_path)
        assert again.meta["cache_hit"] is True


def test_bit_flips_in_a_cached_backbone_are_detected_and_rebuilt(tmp_path, fast_training):
    """The case that used to poison the cache: a damaged backbone with the features cache absent."""
    clean = D.load_digits_features(seed=0, cache_dir=tmp_path, weights="trained")
    assert fast_training == [0]
    (pt,) = tmp_path.glob("digits-backbone-*.pt")
    pristine = pt.read_bytes()
    for pos in _positions(pt):
        for f in tmp_path.glob("digits-features-*.npz"):
            f.unlink()
        pt.write_bytes(pristine)
        _flip(pt, pos)
        with pytest.warns(C.CacheIntegrityWarning, match=pt.name):
            ds = D.load_digits_features(seed=0, cache_dir=tmp_path, weights="trained")
        np.testing.assert_array_equal(ds.train_features, clean.train_features)
        assert (
            pt.read_bytes()[len(C.MAGIC) :] != b"" and C.load_torch(pt, D.backbone_description(0)) is not None
        )
    assert len(fast_training) == 1 + len(_positions(pt))  # retrained once per damaged file


def test_an_exponent_bit_flip_inside_a_tensor_is_caught(tmp_path, fast_training):
    """torch.load accepts a file whose float was changed; the digest does not."""
    m = D.get_backbone(seed=0, cache_dir=tmp_path, weights="trained")
    (pt,) = tmp_path.glob("digits-backbone-*.pt")
    data = bytearray(pt.read_bytes())
    w = m.state_dict()["fc.weight"].numpy().astype("<f4").tobytes()
    at = bytes(data).index(w[:64]) + 3  # the high byte of fc.weight[0, 0]: sign and exponent
    data[at] ^= 0x40
    pt.write_bytes(bytes(data))
    head_len = C._LEN.unpack_from(bytes(data), len(C.MAGIC))[0]
    payload = bytes(data)[len(C.MAGIC) + C._LEN.size + head_len :]
    bad = torch.load(io.BytesIO(payload), weights_only=True)  # still loads, with a wrong weight
    assert not torch.equal(bad["fc.weight"], m.state_dict()["fc.weight"])
    with pytest.warns(C.CacheIntegrityWarning, match="SHA-256"):
        again = D.get_backbone(seed=0, cache_dir=tmp_path, weights="trained")
    assert torch.equal(again.state_dict()["fc.weight"], m.state_dict()["fc.weight"])


def test_generic_cached_arrays_truncation_old_format_and_collision(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"x": np.arange(12.0).reshape(3, 4)}

    desc = {"artefact": "t", "v": 1}
    C.cached_arrays("t", desc, compute, tmp_path)
    (path,) = tmp_path.glob("t-*.npz")
    good = path.read_bytes()
    cases = {
        "truncated": good[:-7],
        "no integrity record": good[len(C.MAGIC) + C._LEN.size + C._LEN.unpack_from(good, len(C.MAGIC))[0] :],
        "damaged header": good[: len(C.MAGIC)] + b"\xff" * 8 + good[len(C.MAGIC) + 8 :],
        "empty": b"",
    }
    for why, blob in cases.items():
        path.write_bytes(blob)
        with pytest.warns(C.CacheIntegrityWarning):
            out, _, hit = C.cached_arrays("t", desc, compute, tmp_path)
        assert not hit, why
        np.testing.assert_array_equal(out["x"], compute()["x"])
    path.write_bytes(good)
    with pytest.warns(C.CacheIntegrityWarning, match="another description"):
        assert C.load_arrays(path, {"artefact": "t", "v": 2}) is None
    with pytest.warns(C.CacheIntegrityWarning, match="'npz' artefact where 'torch'"):
        assert C.load_torch(path) is None


def test_shipped_weights_are_verified(tmp_path, monkeypatch):
    src = DB.shipped_path(0)
    copy = tmp_path / "digits_cnn_seed0.npz"
    copy.write_bytes(src.read_bytes())
    monkeypatch.setattr(DB, "shipped_path", lambda seed: copy)
    D.load_shipped_weights(0)
    with np.load(copy) as z:
        arrays = {k: z[k].copy() for k in z.files}
    arrays["fc.weight"][0, 0] = np.float32(arrays["fc.weight"][0, 0] * 2)
    np.savez(copy, **arrays)
    with pytest.raises(InputError, match="SHA-256"):
        D.get_backbone(seed=0)
    copy.write_bytes(b"")
    with pytest.raises(InputError, match="cannot be read"):
        D.load_shipped_weights(0)


def test_read_only_cache_holding_a_complete_cache_is_used(tmp_path, monkeypatch, digits_dataset):
    cache = tmp_path / "shared"
    D.load_digits_features(seed=0, cache_dir=cache)

    def refuse(path, data):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(C, "atomic_write_bytes", refuse)  # as root a chmod would not stop writes
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    os.chmod(cache, 0o555)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", C.CacheIntegrityWarning)
            ds = D.load_digits_features(seed=0, cache_dir=cache)
        assert ds.meta["cache_hit"] is True
        np.testing.assert_array_equal(ds.train_features, digits_dataset.train_features)
        # a miss in a read-only cache is computed in memory, with one warning
        with pytest.warns(C.CacheIntegrityWarning, match="cannot write"):
            out, _, hit = C.cached_arrays("t", {"v": 1}, lambda: {"x": np.ones(2)}, cache)
        assert not hit and np.array_equal(out["x"], np.ones(2))
    finally:
        os.chmod(cache, 0o755)


# -- input limits: refused before allocating ---------------------------------------------------

_HUGE = 10**12


def _small(n=40, d=3, C=4, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % C
    return rng.normal(size=(n, d)) + 3 * np.eye(C, d)[y], y


@pytest.mark.parametrize("where", ["labels", "clients", "num_classes"])
def test_huge_ids_are_refused_by_fit_before_allocating(where):
    F, y = _small()
    k = np.arange(40) % 5
    kwargs = {}
    if where == "labels":
        y = y.copy()
        y[3] = _HUGE
    elif where == "clients":
        k = k.copy()
        k[3] = _HUGE
    else:
        kwargs["num_classes"] = _HUGE
    with pytest.raises(InputError, match=f"{_HUGE}|{_HUGE - 1}") as info:
        privfed.fit("fedncm", F, y, k, **kwargs)
    assert "only 40 samples" in str(info.value)


def test_num_classes_must_be_an_integer():
    F, y = _small()
    for bad in (3.7, "4", 4.0, True, 0, -2):
        with pytest.raises(ConfigError, match="num_classes"):
            privfed.fit("fedncm", F, y, num_classes=bad)
    assert privfed.fit("fedncm", F, y, num_classes=np.int32(4)).num_classes == 4


def test_labels_beyond_int64_are_reported_as_given():
    F, y = _small()
    yf = y.astype(np.float64)
    yf[0] = 1e20
    with pytest.raises(InputError, match=r"1e\+20") as info:
        privfed.fit("fedncm", F, yf)
    assert "-9223372036854775808" not in str(info.value)
    yu = y.astype(np.uint64)
    yu[0] = np.uint64(2**64 - 1)
    with pytest.raises(InputError, match=str(2**64 - 1)):
        privfed.fit("fedncm", F, yu)


def test_compute_client_stats_refuses_a_class_count_the_data_cannot_hold():
    from privfed.stats import compute_client_stats

    F, y = _small()
    with pytest.raises(InputError, match="GiB"):
        compute_client_stats(F, y, None, num_classes=_HUGE)
    assert compute_client_stats(F, y, None, num_classes=6).counts.shape == (
        1,
        6,
    )  # absent classes are fine here


@pytest.mark.parametrize("field", ["labels", "clients"])
def test_npz_with_huge_labels_or_clients_is_refused(tmp_path, field):
    F, y = _small()
    arrays = {"features": F, "labels": y.copy(), "clients": np.arange(40) % 4}
    arrays[field][5] = _HUGE
    np.savez(tmp_path / "f.npz", **arrays)
    with pytest.raises(InputError, match=f"up to {_HUGE}"):
        privfed.data.load_dataset(f"file:{tmp_path / 'f.npz'}")


def _npz_with_header(path, shape, body: bytes = b"", compress: bool = False):
    """A .npz whose 'features' header declares ``shape`` but holds only ``body``."""
    hdr = io.BytesIO()
    np.lib.format.write_array_header_2_0(hdr, {"descr": "<f8", "fortran_order": False, "shape": shape})
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        with zf.open("features.npy", "w", force_zip64=True) as fh:
            fh.write(hdr.getvalue())
            fh.write(body)
        buf = io.BytesIO()
        np.save(buf, np.zeros(2, dtype=np.int64))
        zf.writestr("labels.npy", buf.getvalue())


def test_npz_header_declaring_a_huge_shape_is_refused_before_allocating(tmp_path):
    """A member declaring 8 TB and holding 64 bytes is named as cut short, whatever the size limit (with the
    limit raised, numpy tried to allocate 7.3 TiB; the limit's advice could only lead there)."""
    path = tmp_path / "huge.npz"
    _npz_with_header(path, (10**6, 10**6), body=b"\0" * 64)
    for limit in (None, "100T"):
        with pytest.raises(
            InputError, match=r"'features.npy' declares 8,000,000,000,000 bytes of array but holds 64;"
        ):
            privfed.data.load_dataset(f"file:{path}", max_file_bytes=limit)
    # a genuine file over the limit is told a limit that admits it (the example was always 8G)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "big.npz", features=rng.normal(size=(3000, 100)), labels=np.arange(3000) % 3)
    with pytest.raises(
        InputError, match=r"declares 2,424,000 bytes.*\(3000, 100\).*PRIVFED_MAX_FILE_BYTES=1G"
    ):
        privfed.data.load_dataset(f"file:{tmp_path / 'big.npz'}", max_file_bytes="1M")
    # a pickled member is no cut-short array: its own refusal names the pickle
    np.savez(tmp_path / "obj.npz", features=np.array([None] * 1000, dtype=object), labels=np.zeros(3))
    with pytest.raises(InputError, match="pickle"):
        privfed.data.load_dataset(f"file:{tmp_path / 'obj.npz'}")


def test_deflate_bomb_is_refused_before_expanding_with_a_limit_the_user_can_raise(tmp_path, monkeypatch):
    path = tmp_path / "bomb.npz"
    n = 8 * 2**20  # 64 MiB of zeros in a ~64 KiB file
    _npz_with_header(path, (n // 4, 4), body=b"\0" * (8 * n), compress=True)
    assert path.stat().st_size < 2**20
    monkeypatch.setenv("PRIVFED_MAX_FILE_BYTES", "16M")
    with pytest.raises(
        InputError,
        match=r"declares 67,108,\d\d\d bytes.*the file itself is \d\d,\d\d\d bytes.*refused before it is expanded"
        r".*load_dataset\(\.\.\., max_file_bytes=\), load_feature_file\(\.\.\., max_bytes=\)",  # the names they take
    ):
        privfed.data.load_dataset(f"file:{path}")
    # the limit is the user's: raised by argument, the file is read (and then checked as usual)
    with pytest.raises(InputError, match="'labels' has 2 entries"):
        privfed.data.load_dataset(f"file:{path}", max_file_bytes="128M")
    monkeypatch.setenv("PRIVFED_MAX_FILE_BYTES", "lots")
    with pytest.raises(ConfigError, match="PRIVFED_MAX_FILE_BYTES"):
        privfed.data.load_dataset(f"file:{path}")
    monkeypatch.delenv("PRIVFED_MAX_FILE_BYTES")
    from privfed.data.npzfile import DEFAULT_MAX_BYTES, resolve_max_bytes

    assert resolve_max_bytes() == DEFAULT_MAX_BYTES == 2**30
    with pytest.raises(ConfigError, match="max_bytes"):
        resolve_max_bytes(-1)


# -- scale: no silent zero or non-finite head ------------------------------------------------------

SCALES = [2.0**-40, 1e-3, 1e160, 1e-170, 1e300, 1e-300]


def test_normalise_rows_is_overflow_and_underflow_safe():
    from privfed._linalg import normalise_rows

    base = np.array([[3.0, -4.0, 0.0], [1e-3, 2e-3, 2e-3], [0.0, 0.0, 0.0]])
    unit = np.array([[0.6, -0.8, 0.0], [1 / 3, 2 / 3, 2 / 3], [0.0, 0.0, 0.0]])
    for s in [1.0, *SCALES]:
        W, b = normalise_rows(base * s, np.array([1.0, 2.0, 3.0]))
        np.testing.assert_allclose(W, unit, rtol=1e-15, atol=0)
        # the other arrays are divided by the same norms (5 s and 3e-3 s), whose squares are not representable
        np.testing.assert_allclose(b[:2] * np.array([5.0, 3e-3]) * s, [1.0, 2.0], rtol=1e-15)
        assert b[2] == 0.0
    tiny = np.array([[3e-320, -4e-320]])  # subnormal entries: still a unit row
    np.testing.assert_allclose(normalise_rows(tiny), [[0.6, -0.8]], rtol=1e-3)


@pytest.mark.parametrize(
    "method, params", [("fedncm", {}), ("fedcgs", {}), ("fedlog", {"feature_scale": "auto"})]
)
def test_scale_invariant_methods_stay_scale_invariant(method, params, digits_dataset):
    ds = digits_dataset
    k = np.arange(ds.num_train) % 20
    ref = privfed.fit(method, ds.train_features, ds.train_labels, k, **params)
    ref_pred = ref.predict(ds.test_features)
    assert ref.score(ds.test_features, ds.test_labels) > 0.9
    for s in SCALES:
        head = privfed.fit(method, ds.train_features * s, ds.train_labels, k, **params)
        assert np.all(np.isfinite(head.weight)) and np.any(head.weight != 0)
        np.testing.assert_array_equal(head.predict(ds.test_features * s), ref_pred, err_msg=f"scale {s:g}")
        lo, hi = privfed.scaling.safe_band(ds.num_train, ds.dim)
        rescaled = not (lo <= np.max(np.abs(ds.train_features * s)) <= hi)
        assert any("multiplied by 2^" in n for n in head.notes) == rescaled


@pytest.mark.parametrize("small", [1e-80, 1e-200])
def test_rescaling_never_flushes_a_class_of_small_rows_to_zero(small):
    """Before: rows of 1e200 beside rows of 1e-200 were multiplied by 2^-666, which flushed the small class to
    zero: FedNCM zeroed its weight row, predicted one class for every sample and noted the scaling as exact.
    Now the exponent keeps every class's largest feature inside float64's range, or the span is refused as one
    InputError; a single row far below its class (beside 1e296 rows) is no reason to refuse."""
    rng = np.random.default_rng(0)
    A = np.abs(rng.normal(size=(10, 3))) * [1, 0.01, 0.01] * 1e200
    B = np.abs(rng.normal(size=(10, 3))) * [0.01, 1, 0.01] * small
    X, y = np.r_[A, B], np.repeat([0, 1], 10)
    if small == 1e-200:  # 400 orders of magnitude: no common scale holds both
        with pytest.raises(
            InputError, match=r"class 1's features reach magnitude 1\.46e-200 at most, others 2\.33e\+200"
        ):
            privfed.fit("fedncm", X, y)
        return
    head = privfed.fit("fedncm", X, y)
    # the formula (each mean over its own peak first)
    mu = np.stack([A.mean(0) / A.max(), B.mean(0) / B.max()])
    np.testing.assert_allclose(head.weight, mu / np.linalg.norm(mu, axis=1, keepdims=True), rtol=1e-14)
    W = mu / np.linalg.norm(mu, axis=1, keepdims=True)
    np.testing.assert_array_equal(head.predict(X), np.argmax(X @ W.T, axis=1))  # 19 of 20 right, not 10
    assert head.score(X, y) == 0.95 and any("multiplied by 2^" in n for n in head.notes)
    B2 = np.abs(rng.normal(size=(10, 3))) * [0.01, 1, 0.01] * 1e296
    B2[0] = [1e-10, 0, 0]  # one row 306 orders below its class: negligible in its sums, as before
    mu2 = np.stack([A.mean(0) / A.max(), B2.mean(0) / B2.max()])
    W2 = privfed.fit("fedncm", np.r_[A, B2], y).weight
    np.testing.assert_allclose(W2, mu2 / np.linalg.norm(mu2, axis=1, keepdims=True), rtol=1e-14)


@pytest.mark.parametrize("method", ["fed3r", "fed3r-within", "fedcof", "fedcof-oracle", "fedlog"])
@pytest.mark.parametrize("scale", [1e160, 1e-170, 1e300])
def test_scale_dependent_methods_give_one_clear_error_out_of_range(method, scale):
    F, y = _small(60, 3, 3)
    with pytest.raises(
        InputError, match=r"features reach magnitude .*too (large|small).*divide the features"
    ):
        privfed.fit(method, F * scale, y, np.arange(60) % 4)
    head = privfed.fit(method, F * 1e-3, y, np.arange(60) % 4)  # inside the range: fitted as before
    assert np.all(np.isfinite(head.weight))


def test_infinite_clip_with_finite_epsilon_is_refused():
    from mechanisms import GaussianMechanism

    F, y = _small()
    with pytest.raises(ConfigError, match="clip=inf"):  # refused from the configuration, before any data
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=float("inf"), trusted_aggregator=True)
    big = GaussianMechanism(epsilon=float("inf"), delta=1e-5, clip=float("inf"))
    with pytest.raises(InputError, match="overflow"):
        privfed.fit("fed3r", F * 1e160, y, np.arange(40) % 4, num_classes=4, num_clients=4, privacy=big)


def test_fedlog_says_when_its_map_is_ill_posed_and_offers_the_fix(digits_dataset):
    from privfed.federation import partition

    ds = digits_dataset
    part = partition(ds.train_labels, 100, "dirichlet", alpha=0.1, rng=0)  # the README's federation
    F, y, k = part.apply(ds.train_features, ds.train_labels)
    Ft, yt = ds.test_features, ds.test_labels
    plain = privfed.fit("fedlog", F, y, k)
    assert not any("feature_scale" in n for n in plain.notes)  # digits: class means of norm ~30
    small = privfed.fit("fedlog", F * 1e-3, y, k)
    (note,) = [n for n in small.notes if "feature_scale" in n]
    assert "short against FedLog's constant feature" in note
    suggested = float(note.split("pass feature_scale=")[1].split()[0])
    # the model's feature is [1, f / s]: scaling f and s together gives the same eta, weight / c
    fixed = privfed.fit("fedlog", F * 1e-3, y, k, feature_scale=suggested)
    same = privfed.fit("fedlog", F, y, k, feature_scale=suggested * 1e3)
    np.testing.assert_allclose(fixed.weight * 1e-3, same.weight, rtol=1e-9, atol=0)
    np.testing.assert_allclose(fixed.bias, same.bias, rtol=1e-9, atol=1e-12)
    ncm = privfed.fit("fedncm", F, y, k).score(Ft, yt)
    # the collapse the note names: one class predicted for every test sample
    assert np.unique(small.predict(Ft * 1e-3)).size == 1
    assert fixed.score(Ft * 1e-3, yt) >= ncm - 0.01
    with pytest.raises(ConfigError, match="feature_scale"):
        privfed.fit("fedlog", F, y, k, feature_scale=0)
    # zero class means: no scale helps, and the note no longer offers feature_scale=0 (which is refused)
    (zero,) = [
        n for n in privfed.fit("fedlog", np.zeros((6, 2)), np.arange(6) % 2, None).notes if "short" in n
    ]
    assert "no feature_scale lengthens a zero mean" in zero and "pass feature_scale" not in zero
    with pytest.raises(ConfigError, match="feature_scale"):
        privfed.fit("fedlog", F, y, k, feature_scale="big")


def test_fedcgs_on_all_zero_features_names_the_cause():
    F = np.zeros((30, 4))
    y = np.arange(30) % 3
    with pytest.raises(InputError, match="covariance is zero.*no shrinkage") as info:
        privfed.fit("fedcgs", F, y)
    assert "set shrinkage > 0" not in str(info.value)


def test_bit_flip_in_cached_vision_features_is_detected_and_rebuilt(tmp_path, monkeypatch):
    vision = pytest.importorskip("privfed.data.vision")
    from torchvision.datasets import FakeData

    def fake_open(name, root, *, train, download=False, transform=None):
        return FakeData(
            size=6 if train else 4,
            image_size=(3, 32, 32),
            num_classes=10,
            transform=transform,
            random_offset=0 if train else 1000,
        )

    real_build = vision.build_backbone

    def fake_build(name, weights="DEFAULT", **kw):
        torch.manual_seed(0)
        return real_build(name, None)

    monkeypatch.setattr(vision, "open_dataset", fake_open)
    monkeypatch.setattr(vision, "build_backbone", fake_build)
    kw = dict(cache_dir=tmp_path, progress=False, device="cpu", image_size=32)
    clean = vision.load_vision_features("cifar10", **kw)
    (train_file,) = tmp_path.glob("cifar10-train-*.npz")
    _flip(train_file, train_file.stat().st_size // 2)
    with pytest.warns(C.CacheIntegrityWarning, match=train_file.name):
        again = vision.load_vision_features("cifar10", **kw)
    np.testing.assert_array_equal(again.train_features, clean.train_features)
    np.testing.assert_array_equal(again.test_features, clean.test_features)


def test_train_script_reports_identity_and_drift():
    from experiments import train_digits_backbone as T

    shipped = D.load_shipped_weights(0)
    same = T.compare(dict(shipped), shipped)
    assert same["identical"] and same["max_abs_weight_diff"] == 0.0 and same["max_abs_feature_diff"] == 0.0
    assert same["digest_new"] == same["digest_shipped"] == D.SHIPPED_WEIGHTS[0][1]
    moved = {k: v.copy() for k, v in shipped.items()}
    moved["fc.bias"] = moved["fc.bias"] + np.float32(0.25)
    drift = T.compare(moved, shipped)
    assert not drift["identical"] and drift["max_abs_weight_diff"] == pytest.approx(0.25, rel=1e-6)
    assert drift["max_abs_feature_diff"] > 0 and drift["digest_new"] != drift["digest_shipped"]
    # --write records the digest in exactly one place of the source
    import re

    src = pathlib.Path(DB.__file__).read_text()  # the module that defines SHIPPED_WEIGHTS
    assert len(re.findall(r'0: \("digits_cnn_seed0\.npz", "[0-9a-f]{64}"\)', src)) == 1


def test_partition_refuses_labels_and_natural_ids_beyond_the_data():
    from privfed.federation import partition

    y = np.arange(30) % 3
    bad = y.copy()
    bad[0] = _HUGE
    with pytest.raises(InputError, match=f"labels contains {_HUGE} but there are only 30 samples"):
        partition(bad, 3, "iid", rng=0)
    nat = np.arange(30) % 3
    nat[0] = _HUGE
    with pytest.raises(InputError, match=f"natural clients contains id {_HUGE}"):
        partition(y, 3, "natural", natural=nat, rng=0)


def test_tradeoff_on_features_beyond_float64_range_rescales_or_says_why(tmp_path, capsys, digits_dataset):
    """The trade-off sweep applies fit's range handling: fedncm is scale-invariant (same accuracy at
    x1e160 as at x1), fedcof is not and stops with one line instead of a silent zero head."""
    import json

    from privfed.data.npzfile import save_feature_file
    from privfed.tradeoff import main

    ds = digits_dataset

    def run(scale, method, out):
        path = tmp_path / f"f{scale:g}.npz"
        save_feature_file(
            path,
            ds.train_features * scale,
            ds.train_labels,
            test_features=ds.test_features * scale,
            test_labels=ds.test_labels,
        )
        return main(
            [
                "--method",
                method,
                "--eps",
                "inf",
                "--dataset",
                f"file:{path}",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--no-plot",
                "--quiet",
                "--out",
                str(tmp_path / out),
            ]
        )

    accs = []
    for scale, out in ((1.0, "a"), (1e160, "b")):
        assert run(scale, "fedncm", out) == 0
        (rec,) = json.loads((tmp_path / out / "results.json").read_text())["records"]
        accs.append(rec["accuracy"])
    assert accs[0] == accs[1] and accs[0] > 0.5
    capsys.readouterr()
    assert run(1e160, "fedcof", "c") == 2
    err = capsys.readouterr().err
    assert "too large for float64 statistics" in err and "Traceback" not in err


# -- round 3: uploads, limits under privacy, archives, environment, count noise ----------------------------------
def _digits_split(digits_dataset, K=10):
    ds = digits_dataset
    return ds, np.arange(ds.train_labels.size) % K


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("keep", ["total", "pairs"])
def test_a_non_finite_upload_is_refused_naming_sender_client_statistic_and_class(digits_dataset, bad, keep):
    """Before: a NaN class sum became an all-zero weight row (fedncm 0.758 -> 0.458), inf a 'this is a bug'."""
    from privfed.stats import StatsFold, compute_client_stats

    ds, k = _digits_split(digits_dataset)
    fold = StatsFold(num_classes=ds.num_classes, dim=ds.dim, keep=keep)
    clean = [
        compute_client_stats(
            ds.train_features[k == i],
            ds.train_labels[k == i],
            np.zeros((k == i).sum(), int),
            num_classes=ds.num_classes,
        )
        for i in range(10)
    ]
    for i in range(3):
        fold.add(clean[i], source=f"node {i}")
    sums = np.array(clean[3].sums)
    c = int(np.flatnonzero(clean[3].counts[0] > 0)[1])
    sums[0, c, 5] = bad
    tampered = privfed.stats.ClientStats(counts=clean[3].counts, sums=sums)
    with pytest.raises(
        InputError,
        match=rf"node 3: statistic 'sums' from client 0 of node 3, class {c} holds "
        rf"{'nan' if np.isnan(bad) else repr(float(bad))}",
    ):
        fold.add(tampered, source="node 3")
    counts = np.array(clean[3].counts)
    counts[0, c] = bad
    with pytest.raises(InputError, match=rf"statistic 'counts' from client 0 of node 3, class {c}"):
        fold.add(privfed.stats.ClientStats(counts=counts, sums=clean[3].sums), source="node 3")
    # the fold is unchanged by the refused uploads: the others still give the clean head
    for i in range(3, 10):
        fold.add(clean[i], source=f"node {i}")
    N, S = fold.result().class_totals()
    assert np.array_equal(N, np.bincount(ds.train_labels, minlength=ds.num_classes).astype(float))
    want = np.zeros((ds.num_classes, ds.dim))
    np.add.at(want, ds.train_labels, ds.train_features)
    np.testing.assert_allclose(S, want, rtol=1e-12, atol=1e-9)


def test_a_client_folded_twice_is_refused(digits_dataset):
    from privfed.stats import StatsFold, compute_client_stats

    ds, k = _digits_split(digits_dataset, K=4)
    chunk = compute_client_stats(ds.train_features, ds.train_labels, k)
    fold = StatsFold(num_classes=ds.num_classes, dim=ds.dim).add(
        chunk, source="batch 1", client_ids=[10, 11, 12, 13]
    )
    with pytest.raises(
        InputError, match=r"batch 2: client id\(s\) \[12\] were already folded from an earlier chunk"
    ):
        fold.add(chunk, source="batch 2", client_ids=[20, 21, 12, 23])
    with pytest.raises(InputError, match=r"client id\(s\) \[7\] appear twice in this chunk"):
        fold.add(chunk, source="batch 3", client_ids=[7, 7, 8, 9])
    with pytest.raises(InputError, match="batch 1 already uploaded statistics to this fold"):
        fold.add(chunk, source="batch 1")
    with pytest.raises(InputError, match="client_ids must be 4 integer or string ids"):
        fold.add(chunk, source="batch 4", client_ids=[1, 2])
    assert fold.num_clients == 4  # nothing of the refused chunks was folded


def test_masked_arrays_are_refused_everywhere(tmp_path, digits_dataset):
    from privfed.data.npzfile import save_feature_file
    from privfed.stats import ClientStats

    ds = digits_dataset
    m = np.ma.masked_array(ds.train_features, mask=ds.train_features > 10)
    with pytest.raises(InputError, match="features is a numpy masked array"):
        privfed.fit("fedncm", m, ds.train_labels)
    import scipy.sparse

    # a sparse matrix became a 0-d object array: "features must be a 2-D (N, d) array, got shape ()"
    with pytest.raises(InputError, match=r"features is a scipy sparse matrix.*features\.toarray\(\)"):
        privfed.fit("fedncm", scipy.sparse.csr_matrix(ds.train_features), ds.train_labels)
    with pytest.raises(InputError, match="labels is a numpy masked array"):
        privfed.fit("fedncm", ds.train_features, np.ma.masked_array(ds.train_labels))
    with pytest.raises(InputError, match="sums is a numpy masked array"):
        ClientStats(counts=np.ones((1, 2)), sums=np.ma.masked_array(np.ones((1, 2, 3))))
    with pytest.raises(InputError, match="features is a numpy masked array"):
        save_feature_file(tmp_path / "f.npz", m, ds.train_labels)


@pytest.mark.parametrize(
    "kw, words",
    [
        # 10**12 x (64 + 1) x 8 bytes = 4.84e5 GiB; 10**9 x 10 x 8 bytes = 74.5 GiB; 10**12 x 10 x 8 = 7.45e4 GiB
        ({"num_classes": 10**12}, "num_classes=1000000000000 would need 4.84e+05 GiB of class statistics"),
        ({"num_clients": 10**9}, "num_clients=1000000000 x num_classes=10 would need 74.5 GiB"),
        ({"num_clients": 10**12}, "num_clients=1000000000000 x num_classes=10 would need 7.45e+04 GiB"),
    ],
)
def test_private_fit_sizes_are_refused_at_once_naming_the_size(digits_dataset, kw, words):
    import time

    from mechanisms import GaussianMechanism

    ds = digits_dataset
    k = np.arange(ds.train_labels.size) % 10
    t0 = time.monotonic()
    with pytest.raises(InputError, match=words.replace("+", r"\+")):
        privfed.fit(
            "fedncm",
            ds.train_features,
            ds.train_labels,
            k,
            privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0),
            **{"num_classes": 10, "num_clients": 10, **kw},
        )  # the other size the true one
    assert time.monotonic() - t0 < 2.0
    # the same fold a server would build refuses the same class count before allocating
    from privfed.stats import StatsFold

    if "num_classes" in kw:
        with pytest.raises(InputError, match="StatsFold\\(num_classes=1000000000000, dim=64\\) would hold"):
            StatsFold(num_classes=kw["num_classes"], dim=ds.dim)


def test_a_large_private_release_says_so_before_it_starts(digits_dataset, monkeypatch):
    from mechanisms import GaussianMechanism
    from privfed import _validation

    ds = digits_dataset
    k = np.arange(ds.train_labels.size) % 10
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    assert _validation.release_cost_note(10, 10, 64) is None
    # 10**8 clients: 10**8 x (10 x 65 + 64**2) = 4.75e11 values at 2e7/s (23730 s) plus 4e-6 s a client (400 s)
    assert "up to 4.75e+11 noise values; expect about 402 minute(s)" in _validation.release_cost_note(
        10**8, 10, 64
    )
    monkeypatch.setattr(_validation, "SECONDS_PER_CLIENT", 7.0)  # so that 10 clients predict over a minute
    with pytest.warns(
        UserWarning, match=r"this private release is large: num_clients=10, num_classes=10, d=64"
    ):
        privfed.fit(
            "fedncm",
            ds.train_features,
            ds.train_labels,
            k,
            num_classes=10,
            num_clients=10,
            privacy=mech,
            random_state=0,
        )


def test_npz_size_check_cannot_be_bypassed(tmp_path):
    """Three bypasses: a member without the .npy suffix, features under another name, a malformed header."""

    def npy(a):
        b = io.BytesIO()
        np.save(b, a)
        return b.getvalue()

    F, y = np.ones((10, 3)), np.arange(10) % 2
    bomb = npy(np.zeros((2**20, 8)))  # 8 MiB
    cases = {
        "no-suffix": [("features", npy(F)), ("labels.npy", npy(y)), ("blob", bomb)],
        "other-name": [("features.npy", npy(F)), ("labels.npy", npy(y)), ("feats.npy", bomb)],
        "bad-header": [
            ("junk.npy", b"\x93NUMPY\x01\x00garbage"),
            ("features.npy", bomb),
            ("labels.npy", npy(y)),
        ],
    }
    for name, members in cases.items():
        path = tmp_path / f"{name}.npz"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for m, data in members:
                z.writestr(m, data)
        assert path.stat().st_size < 2**17  # a small file that would expand to 8 MiB
        with pytest.raises(InputError) as info:
            privfed.data.load_dataset(f"file:{path}", max_file_bytes="4M")
        msg = str(info.value)
        if name == "bad-header":
            assert "member 'junk.npy' is not a readable .npy array" in msg
        else:
            assert "over the 4,194,304-byte limit, and is refused before it is expanded" in msg


@pytest.mark.parametrize(
    "value, ok",
    [
        ("abc", False),
        ("nan", False),
        ("inf", False),
        ("-1", False),
        ("0", False),
        ("2G", True),
        ("1073741824", True),
        ("512M", True),
    ],
)
def test_dense_view_limit_variable_is_parsed_with_a_clear_error(monkeypatch, value, ok):
    from privfed._validation import env_byte_size

    monkeypatch.setenv("PRIVFED_DENSE_VIEW_LIMIT", value)
    limit, err = env_byte_size("PRIVFED_DENSE_VIEW_LIMIT", 2 * 2**30)
    if ok:
        assert err is None and limit == {"2G": 2 * 2**30, "512M": 2**29}.get(value, 2**30)
    else:  # the default stands in until the limit is used, which raises this error
        assert limit == 2 * 2**30 and str(err) == (
            f"$PRIVFED_DENSE_VIEW_LIMIT must be a positive number of bytes "
            f"(e.g. 2147483648 or 2G), got {value!r}"
        )


def test_a_malformed_dense_view_limit_never_breaks_import_and_a_command_says_so_at_once(tmp_path):
    import subprocess
    import sys

    env = {
        **os.environ,
        "PRIVFED_DENSE_VIEW_LIMIT": "abc",
        "PYTHONPATH": str(pathlib.Path(__file__).parents[2]),
    }
    code = (
        "import privfed, privfed.stats as s\n"
        "try:\n    s.dense_view_limit()\nexcept privfed.errors.ConfigError as e:\n    print('error', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr  # import privfed never crashes
    assert r.stdout.startswith("error $PRIVFED_DENSE_VIEW_LIMIT must be a positive number of bytes")
    assert _tradeoff_with(env, tmp_path) == (
        2,
        [
            "python -m privfed.tradeoff: error: $PRIVFED_DENSE_VIEW_LIMIT must be a positive number of bytes "
            "(e.g. 2147483648 or 2G), got 'abc'"
        ],
    )
    assert not (tmp_path / "o").exists()


def _tradeoff_with(env: dict, tmp_path, *args: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of the trade-off run in ``env`` into ``tmp_path / "o"``."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "privfed.tradeoff", "--eps", "1", *args, "--out", str(tmp_path / "o")]
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    return r.returncode, r.stderr.strip().splitlines()


@pytest.mark.parametrize("value", ["abc", "0"])
def test_a_malformed_memory_limit_stops_a_command_at_once(tmp_path, value):
    """$PRIVFED_MEMORY_LIMIT=abc left the secure-sum and trusted placements out of the sweep with a note each
    (the memory check of those variants read it), and the run exited 0 with the local row alone."""
    env = {**os.environ, "PRIVFED_MEMORY_LIMIT": value, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    assert _tradeoff_with(env, tmp_path, "--clients", "10") == (
        2,
        [
            "python -m privfed.tradeoff: error: $PRIVFED_MEMORY_LIMIT must be a positive number of bytes "
            f"(e.g. 2147483648 or 2G), got {value!r}"
        ],
    )
    assert not (tmp_path / "o").exists()


def test_the_dense_view_limit_in_use_is_checked_where_it_is_used(monkeypatch):
    import privfed.stats as S

    stats = S.compute_client_stats(np.ones((4, 2)), np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]))
    monkeypatch.setattr(S, "DENSE_VIEW_LIMIT", -1)  # before: silently refused every dense view
    with pytest.raises(ConfigError, match=r"DENSE_VIEW_LIMIT must be a positive number of bytes, got -1"):
        stats.sums
    monkeypatch.setattr(
        S, "DENSE_VIEW_LIMIT", 8 * 2 * 2 * 2 - 1
    )  # one byte short of the (2, 2, 2) float64 sums
    with pytest.raises(InputError, match=r"ClientStats.sums of shape \(2, 2, 2\) needs"):
        stats.sums
    monkeypatch.setattr(S, "DENSE_VIEW_LIMIT", 8 * 2 * 2 * 2)
    assert stats.sums.shape == (2, 2, 2)
