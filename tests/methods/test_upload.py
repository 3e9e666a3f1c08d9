"""Communication accounting (methods.md section 3, FedCOF paper App. H)."""

from __future__ import annotations

import numpy as np
import pytest

import privfed
from privfed import methods
from privfed.errors import InputError

# iNat-120K with MobileNetV2 (FedCOF paper App. H): d, M (client-class pairs), K clients, C classes
INAT = {"d": 1280, "M": 54590, "K": 9275, "C": 1203}


def mb(name, **kw):
    return methods.get_class(name).upload_bytes(**kw) / 1e6


def test_paper_figures_inat120k():
    assert round(mb("fedncm", **INAT), 1) == 279.5
    assert round(mb("fed3r", **INAT), 1) == 61064.1
    assert mb("fedcof", **INAT) == mb("fedncm", **INAT)


@pytest.mark.parametrize(
    "name,formula",
    [
        ("fedncm", lambda M, K, d, C: M * d),
        ("fedcof", lambda M, K, d, C: M * d),
        ("fed3r", lambda M, K, d, C: M * d + K * d * d),
        ("fed3r-within", lambda M, K, d, C: M * d + K * d * d + M),
        ("fedcof-oracle", lambda M, K, d, C: M * (d + d * d)),
        ("fedcgs", lambda M, K, d, C: K * ((C + d) * d + C)),
        ("fedlog", lambda M, K, d, C: K * ((d + 1) * C + 1)),
    ],
)
def test_formulas(name, formula):
    for kw in (INAT, {"d": 512, "M": 2870, "K": 100, "C": 100}, {"d": 3, "M": 7, "K": 2, "C": 4}):
        assert methods.get_class(name).upload_floats(**kw) == formula(**kw)
        assert methods.get_class(name).upload_bytes(**kw) == 4 * formula(**kw)


def test_every_method_has_positive_upload():
    for name in methods.available():
        assert methods.get_class(name).upload_bytes(M=10, K=3, d=4, C=5) > 0


def test_run_accounting_counts_client_class_pairs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.repeat(np.arange(4), 10)
    k = np.tile(np.arange(5), 8)
    pairs = len({(a, b) for a, b in zip(k, y)})
    h = privfed.fit("fedncm", X, y, k)
    assert h.upload_bytes["M"] == pairs
    assert h.upload_bytes["total"] == 4 * pairs * 3
    h = privfed.fit("fed3r", X, y, k)
    assert h.upload_bytes["total"] == 4 * (pairs * 3 + 5 * 9)


def test_multi_mean_sampling_uploads_every_mean():
    """FedCOF with M means per client uploads one d-vector per (pseudo-client, class) mean."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3))
    y = np.repeat(np.arange(3), 40)
    k = np.tile(np.arange(4), 30)  # 10 samples per (client, class): 3 means each with M = 3
    h = privfed.fit("fedcof", X, y, k, means_per_client=3, random_state=0)
    assert h.upload_bytes["M"] == 4 * 3 * 3
    assert h.upload_bytes["total"] == 4 * 36 * 3


def test_negative_sizes_rejected():
    with pytest.raises(InputError, match="M must be >= 0"):
        methods.get_class("fedncm").upload_bytes(M=-1, K=1, d=1, C=1)
