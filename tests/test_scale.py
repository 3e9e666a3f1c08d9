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


# -- record-level DP with local noise, streamed ----------------------------------------------
def _local_dp(blocks=("sums", "counts")):
    from mechanisms import GaussianMechanism

    return GaussianMechanism(epsilon=2.0, delta=1e-5, clip=3.0, blocks=blocks)


def _small_federation(seed=0, K=23, C=7, d=5):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, 400)
    k = rng.integers(0, K, 400)
    y[:C], k[:K] = np.arange(C), np.arange(K)
    return rng.standard_normal((400, d)), y, k


@pytest.mark.parametrize("name,blocks", [("fedncm", ("sums", "counts")),
                                         ("fed3r", ("sums", "counts", "second"))])
@pytest.mark.parametrize("chunk_bytes", [1, 700, 4000, None])
def test_streamed_local_noise_draws_the_uploads_before_upload_draws(name, blocks, chunk_bytes):
    """Chunk by chunk, the noisy uploads are before_upload's values bit for bit (same seed)."""
    from privfed.methods import get
    from privfed.pipeline import client_statistics

    F, y, k = _small_federation()
    method = get(name)
    a, b = _local_dp(blocks), _local_dp(blocks)
    stats_a = client_statistics(method, F, y, k, num_classes=7, num_clients=23, rng=np.random.default_rng(1),
                                privacy=a)
    stats_b = client_statistics(method, F, y, k, num_classes=7, num_clients=23, rng=np.random.default_rng(1),
                                privacy=b)
    whole = a.before_upload(stats_a, method, np.random.default_rng(9))
    parts: dict[str, list] = {}
    ends: dict[str, int] = {}
    for block, k0, k1, values in b.local_noise_blocks(stats_b, np.random.default_rng(9), chunk_bytes=chunk_bytes):
        assert k0 == ends.get(block, 0) and k1 > k0 and values.shape[0] == k1 - k0  # clients in order
        ends[block] = k1
        parts.setdefault(block, []).append(values)
    assert list(parts) == list(blocks) and all(e == 23 for e in ends.values())
    if chunk_bytes == 1:
        assert all(len(p) == 23 for p in parts.values())  # one client a chunk
    for block, p in parts.items():
        np.testing.assert_array_equal(np.concatenate(p), getattr(whole, block))
    assert a.ledger.events == b.ledger.events  # one release, the same events


@pytest.mark.parametrize("name,blocks", [("fedncm", ("sums", "counts")), ("fedlog", ("sums", "counts")),
                                         ("fed3r", ("sums", "counts", "second")),
                                         ("fedcgs", ("sums", "counts", "second"))])
def test_streamed_local_noise_head_and_report_equal_the_one_call_path(name, blocks, monkeypatch):
    """server_head's streamed path equals before_upload + one fold: head, report and bytes."""
    import privfed.pipeline as pipeline
    from privfed.methods import get
    from privfed.stats import StatsFold

    F, y, k = _small_federation(seed=2)
    method = get(name)
    monkeypatch.setattr(pipeline, "UPLOAD_CHUNK_BYTES", 600)  # several chunks
    a, b = _local_dp(blocks), _local_dp(blocks)
    assert a.streams_upload(method)
    stats = pipeline.client_statistics(method, F, y, k, num_classes=7, num_clients=23,
                                       rng=np.random.default_rng(1), privacy=a)
    b.check(method, None)
    streamed = pipeline.server_head(method, stats, num_clients=23, rng=np.random.default_rng(5), privacy=a)
    up = b.before_upload(stats, method, np.random.default_rng(5))
    total = StatsFold(num_classes=7, dim=5).add(up.select(method.requires)).result()
    one_call = method.aggregate(b.after_aggregate(total, method, np.random.default_rng(5)))
    np.testing.assert_array_equal(streamed.weight, one_call.weight)
    np.testing.assert_array_equal(streamed.bias, one_call.bias)
    assert streamed.privacy == b.report()
    assert "local" in streamed.privacy.placement and len({e.release_id for e in a.ledger.events}) == 1
    d = 5
    assert streamed.upload_bytes["M"] == 23 * 7  # every client sends every class, zeros included
    assert streamed.upload_bytes["total"] == method.upload_bytes(M=23 * 7, K=23, d=d, C=7)


def test_per_client_methods_keep_the_one_call_path():
    from privfed.methods import get

    m = _local_dp()
    m.check(get("fedcof"), None)
    assert not m.streams_upload(get("fedcof"))  # the server needs every client's noisy means
    central = _local_dp()
    central.trusted_aggregator = True
    assert not central.streams_upload(get("fedncm"))


def test_streamed_local_noise_memory_does_not_grow_with_clients(monkeypatch):
    """Local DP at a scaled shape: peak traced memory of the release stays at the chunk size.

    C = 300, d = 128: one client's dense upload is 8 C d = 307 KB; the dense (K, C, d) stack
    would be 307 MB at K = 1,000.  With 4 MiB chunks the release (noise, fold, head) holds a
    few chunks plus the C x d aggregate, the same at K = 250 and K = 1,000.
    """
    import privfed.pipeline as pipeline
    from privfed.methods import get

    monkeypatch.setattr(pipeline, "UPLOAD_CHUNK_BYTES", 4 * 2**20)
    monkeypatch.setattr(stats_mod, "DENSE_VIEW_LIMIT", 64 * 2**20)
    method = get("fedncm")
    peaks = {}
    d = 128
    for KK, NN, MM in ((250, 3250, 1475), (1000, 13000, 5900)):
        F, y, k = inat_like(KK, C, d, NN, MM, seed=4)
        mech = _local_dp()
        Ck = int(y.max()) + 1
        stats = pipeline.client_statistics(method, F, y, k, num_classes=Ck, num_clients=KK,
                                           rng=np.random.default_rng(0), privacy=mech)
        del F
        tracemalloc.start()
        try:
            head = pipeline.server_head(method, stats, num_clients=KK, rng=np.random.default_rng(1), privacy=mech)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        peaks[KK] = peak
        assert head.upload_bytes["M"] == KK * Ck
        assert len({e.release_id for e in mech.ledger.events}) == 1
    dense = 8 * 1000 * C * d
    assert peaks[1000] < dense / 20, peaks
    # independent of K: the 4x larger federation adds under one chunk (index arrays of the subsets)
    assert peaks[1000] < peaks[250] + 4 * 2**20, peaks
