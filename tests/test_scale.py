"""A scaled iNat-120K-shaped federation fits within a memory cap the dense layout would exceed.

K = 2,000 clients, C = 300 classes, d = 256, about 26K samples in about 11,800
(client, class) pairs (the shape of experiments/bench_scale.py, scaled down).
Dense per-client statistics would need 8 K C d bytes = 1.23 GB for the class
sums alone and 8 K d^2 = 1.07 GB for the per-client second moments; the
pair layout needs 8 M d = 24 MB.  Peak traced allocation (numpy reports its
buffers to tracemalloc) during ``privfed.fit`` must stay under 160 MB, about
2 (N d + M d + d^2) floats, with dense views refused above 64 MB.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import privfed
import privfed.stats as stats_mod
from experiments.bench_scale import inat_like, shape_of

K, C, D, N, M = 2000, 300, 256, 26000, 11800
CAP = 160 * 2**20


@pytest.fixture(scope="module")
def federation():
    F, y, k = inat_like(K, C, D, N, M, seed=3)
    return F, y, k


def test_federation_has_the_inat_shape(federation):
    F, y, k = federation
    shp = shape_of(y, k)
    assert F.dtype == np.float32 and F.shape == (shp["N"], D)
    assert shp["K"] == K and shp["C"] == C
    assert 0.8 * M < shp["M"] < 1.2 * M and 0.8 * N < shp["N"] < 1.2 * N
    # the dense layout would be far over the cap: (K, C, d) sums and (K, d, d) second moments
    assert 8 * K * C * D > 7 * CAP and 8 * K * D * D > 6 * CAP


@pytest.mark.parametrize("name,params", [("fedcof", {"gamma": 0.1}), ("fedcof", {"means_per_client": 4}),
                                         ("fed3r", {}), ("fedcof-oracle", {"solver": "solve"}),
                                         ("fedcgs", {}), ("fedncm", {})])
def test_fit_at_scale_stays_under_the_memory_cap(federation, monkeypatch, name, params):
    F, y, k = federation
    monkeypatch.setattr(stats_mod, "DENSE_VIEW_LIMIT", 64 * 2**20)
    tracemalloc.start()
    try:
        head = privfed.fit(name, F, y, k, random_state=0, **params)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CAP, f"{name}: peak traced allocation {peak / 2**20:.0f} MiB"
    assert head.upload_bytes["M"] >= shape_of(y, k)["M"]
    # a real head: far above chance (1/300) on its own training features
    idx = np.random.default_rng(0).choice(F.shape[0], 3000, replace=False)
    assert head.score(F[idx], y[idx]) > 0.5


def test_oracle_at_scale_equals_fed3r_within(federation):
    """fedcof-oracle's server never builds (C, d, d); its head is fed3r-within's at the same gamma."""
    F, y, k = federation
    a = privfed.fit("fedcof-oracle", F, y, k, gamma=0.1, solver="solve")
    b = privfed.fit("fed3r-within", F, y, k, gamma=0.1)
    np.testing.assert_allclose(a.weight, b.weight, rtol=1e-9, atol=1e-10)
