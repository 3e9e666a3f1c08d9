"""The digits backbone without torch: the numpy forward pass against the torch module.

The tolerance is not tuned: both forward passes compute float32 dot products
(in different orders), so each is within the standard forward error bound of
the exact features (privfed.data.digits_numpy.float32_error_bound) and they
differ by at most twice that bound, entry by entry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from privfed.data.digits import extract_features, extract_features_numpy, load_shipped_weights
from privfed.data.digits_numpy import float32_error_bound, forward
from privfed.errors import ConfigError, InputError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def all_images():
    from sklearn.datasets import load_digits

    return (load_digits().images / 16.0).astype(np.float32)


def test_numpy_forward_equals_torch_within_the_float32_bound(digits_backbone, all_images):
    w = load_shipped_weights(0)
    f_np = extract_features_numpy(w, all_images)
    f_torch = extract_features(digits_backbone, all_images)
    bound = float32_error_bound(w, all_images)
    assert f_np.shape == f_torch.shape == (1797, 64)
    assert np.all(np.abs(f_np - f_torch) <= 2 * bound)
    # the worst-case bound still pins three significant digits of every feature (measured: 3.1e-3 at most,
    # against features up to 19.3; the observed differences are ~1e-6)
    assert bound.max() < 1e-3 * np.abs(f_torch).max()
    # float64 arithmetic is the exact forward up to float64 rounding: each float32 one is within the bound
    exact = forward(w, all_images, dtype=np.float64)
    assert np.all(np.abs(f_torch - exact) <= bound) and np.all(np.abs(f_np - exact) <= bound)


def test_numpy_forward_is_a_real_forward(all_images):
    """An independent check of the layer code: one image through explicit loops in float64."""
    w = load_shipped_weights(0)
    x = all_images[7].astype(np.float64)
    pad = np.pad(x, 1)
    h1 = np.zeros((16, 8, 8))
    for o in range(16):
        for i in range(8):
            for j in range(8):
                h1[o, i, j] = np.sum(w["conv1.weight"][o, 0] * pad[i : i + 3, j : j + 3]) + w["conv1.bias"][o]
    h1 = np.maximum(h1, 0)
    p1 = np.pad(h1, ((0, 0), (1, 1), (1, 1)))
    h2 = np.zeros((32, 8, 8))
    for o in range(32):
        for i in range(8):
            for j in range(8):
                h2[o, i, j] = np.sum(w["conv2.weight"][o] * p1[:, i : i + 3, j : j + 3]) + w["conv2.bias"][o]
    h2 = np.maximum(h2, 0)
    pooled = np.array(
        [
            [[h2[c, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].max() for j in range(4)] for i in range(4)]
            for c in range(32)
        ]
    )
    ref = np.maximum(w["fc.weight"].astype(np.float64) @ pooled.ravel() + w["fc.bias"], 0)
    np.testing.assert_allclose(forward(w, x[None], dtype=np.float64)[0], ref, rtol=1e-12, atol=1e-12)


def test_numpy_forward_rejects_bad_input():
    w = load_shipped_weights(0)
    with pytest.raises(InputError, match="shape"):
        extract_features_numpy(w, np.zeros((2, 3, 8, 8)))
    with pytest.raises(InputError, match="NaN"):
        extract_features_numpy(w, np.full((2, 8, 8), np.nan))
    with pytest.raises(InputError, match="lack"):
        forward({"conv1.weight": w["conv1.weight"]}, np.zeros((1, 8, 8)))
    # before: NaN features at 1e39 (float32 overflow), the imaginary part dropped, 0..16 pixels taken as they
    # came, and raw numpy or Python errors for a mismatched layer or no weights at all
    im = np.random.default_rng(0).uniform(size=(3, 8, 8))
    for images, text in (
        (im * 1e39, r"pixel values in \[0, 1\], got values in \[2\.7\d*e\+36, 9\.97\d*e\+38\]$"),
        (im + 1j, "got dtype complex128"),
        (np.round(im * 16), "load_digits\(\) images are 0..16: divide them by 16"),
        (-im, r"got values in \[-0\.9"),
    ):
        with pytest.raises(InputError, match=text):
            extract_features_numpy(w, images)
    with pytest.raises(InputError, match="'fc.weight' has shape \\(64, 3\\), which does not fit the others"):
        extract_features_numpy({**w, "fc.weight": w["fc.weight"][:, :3]}, im)
    with pytest.raises(InputError, match="must map layer names to arrays, got NoneType"):
        extract_features_numpy(None, im)
    with pytest.raises(ConfigError, match="dtype must be float32 .* got int32"):
        forward(w, im, dtype=np.int32)
    assert extract_features_numpy(w, im).shape == (3, 64)


BLOCK_TORCH = textwrap.dedent("""
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "torchvision", "opacus"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, _Block())
""")


def test_the_main_job_needs_no_torch(tmp_path, digits_dataset):
    """The light install: the default features come from the numpy forward pass; torch features say
    which extra to install."""
    script = BLOCK_TORCH + textwrap.dedent("""
        import numpy as np
        from privfed.data import load_dataset
        from privfed.data.digits import get_backbone
        from privfed.errors import MissingDependencyError
        ds = load_dataset("digits")
        np.save(sys.argv[1], ds.train_features)
        assert "torch" not in sys.modules
        try:
            get_backbone(seed=0)
        except MissingDependencyError as exc:
            print(exc)
    """)
    out = tmp_path / "f.npy"
    env = {**os.environ, "PRIVFED_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert 'pip install "privfed[torch]"' in res.stdout
    from privfed.data.digits import digits_splits

    bound = float32_error_bound(load_shipped_weights(0), digits_splits(0).private_images)
    assert np.all(np.abs(np.load(out) - digits_dataset.train_features) <= 2 * bound)


def test_the_core_install_pulls_no_torch():
    """The first command's install (`pip install -e .`) has no torch, CUDA or opacus; the extras do."""
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {re.split(r"[\s<>=!\[;~]", r, maxsplit=1)[0].lower() for r in reqs}  # noqa: E731
    assert not names(project["dependencies"]) & {"torch", "torchvision", "opacus", "flwr", "tenseal"}
    extras = project["optional-dependencies"]
    assert {"torch", "opacus"} <= names(extras["torch"]) and "torch" in names(extras["all"])
    assert {"mkdocs", "mkdocs-material", "mkdocstrings"} <= names(extras["dev"])


def test_both_forwards_refuse_the_same_images(digits_backbone):
    """Before: the torch forward took load_digits' 0..16 pixels and complex ones, which the numpy forward (the
    same network without torch) refuses, so embed() answered differently with and without torch."""
    from sklearn.datasets import load_digits

    w = load_shipped_weights(0)
    raw = load_digits().images[:3]
    for images, text in ((raw, "divide them by 16"), (raw / 16 + 1j, "got dtype complex128")):
        for forward_of in (
            lambda im: extract_features(digits_backbone, im),
            lambda im: extract_features_numpy(w, im),
        ):
            with pytest.raises(InputError, match=text):
                forward_of(images)
    assert extract_features(digits_backbone, raw / 16).shape == (3, 64)
    # the same shape rule (torch's was a raw matmul error for 16 x 16), and no images give no features in both
    for forward_of in (
        lambda im: extract_features(digits_backbone, im),
        lambda im: extract_features_numpy(w, im),
    ):
        with pytest.raises(InputError, match=r"shape \(N, 8, 8\) or \(N, 1, 8, 8\), got \(2, 1, 16, 16\)"):
            forward_of(np.zeros((2, 1, 16, 16)))
        assert forward_of(np.zeros((0, 8, 8))).shape == (0, 64)
    assert forward(w, np.zeros((0, 8, 8))).shape == (0, 64)
