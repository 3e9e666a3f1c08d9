"""Shared test fixtures.

Every test session uses its own temporary cache directory: ``PRIVFED_CACHE``
points there for the whole session, so no test reads or writes the user's
real cache.

Fixtures
--------
``privfed_cache`` (session)
    The session's cache directory (a ``pathlib.Path``).
``digits_cache`` (session)
    The same directory after the digits features (seed 0, through the
    backbone weights shipped in the package: nothing is trained) have been
    extracted into it: loading them is then instant.
``digits_dataset`` (session)
    ``privfed.data.digits.load_digits_features(seed=0)``: a
    :class:`privfed.data.FeatureDataset` with 899 private training and 359
    test samples, d = 64, C = 10.
``digits_backbone`` (session)
    The frozen digits CNN with the shipped seed-0 weights: (N, 1, 8, 8)
    images in [0, 1] -> (N, 64).
``digits_parts`` (session)
    ``privfed.data.digits.digits_splits(seed=0)``: public / private / test
    images and labels (the public part is the attacker's knowledge).
``digits`` (session)
    What the attack tests use: private features ``Fp``, labels ``yp`` and
    images ``imp``, test features ``Ft`` / labels ``yt``, the attacker's
    ``public`` data (:class:`attacks.view.PublicData`) and the ``backbone``.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def privfed_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("privfed-cache")
    old = os.environ.get("PRIVFED_CACHE")
    os.environ["PRIVFED_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("PRIVFED_CACHE", None)
    else:
        os.environ["PRIVFED_CACHE"] = old


@pytest.fixture(scope="session")
def digits_dataset(privfed_cache):
    from privfed.data.digits import load_digits_features

    return load_digits_features(seed=0, cache_dir=privfed_cache)


@pytest.fixture(scope="session")
def digits_cache(privfed_cache, digits_dataset):
    return privfed_cache


@pytest.fixture(scope="session")
def digits_backbone(digits_cache):
    from privfed.data.digits import get_backbone

    return get_backbone(seed=0, cache_dir=digits_cache)


@pytest.fixture(scope="session")
def digits_parts():
    from privfed.data.digits import digits_splits

    return digits_splits(seed=0)


@pytest.fixture(scope="session")
def digits(digits_backbone, digits_parts):
    import numpy as np

    from attacks.view import PublicData
    from privfed.data.digits import extract_features

    sp = digits_parts
    return {
        "Fp": extract_features(digits_backbone, sp.private_images),
        "yp": np.asarray(sp.private_labels),
        "imp": np.asarray(sp.private_images),
        "Ft": extract_features(digits_backbone, sp.test_images),
        "yt": np.asarray(sp.test_labels),
        "public": PublicData(
            labels=sp.public_labels,
            features=extract_features(digits_backbone, sp.public_images),
            images=sp.public_images,
        ),
        "backbone": digits_backbone,
    }


@pytest.fixture(scope="session")
def clipped_tracing(digits):
    """The DP tracing games' setting: the largest private class, the clip at the public split's median
    feature norm, and the attacker's reference model from that class's clipped public features."""
    import numpy as np

    from attacks.tracing.attack import reference_model
    from attacks.view import clip_rows

    c = int(np.bincount(digits["yp"]).argmax())
    pub = digits["public"]
    clip = float(np.median(np.linalg.norm(pub.features, axis=1)))
    model = reference_model(clip_rows(pub.features[pub.labels == c], clip))
    return {"pool": digits["Fp"][digits["yp"] == c], "clip": clip, "model": model}
