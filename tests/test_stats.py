"""Federated statistics equal centralised ones; partition-invariant heads (FedCGS, Fed3R)."""

from __future__ import annotations

import numpy as np
import pytest

import privfed
import privfed.stats as stats_mod
from privfed.stats import ClientStats, compute_client_stats

ALL = ("counts", "sums", "second", "class_second")


def _data(seed=0, N=257, d=6, C=5):
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(C, d))
    y = rng.integers(0, C, N)
    y[:C] = np.arange(C)
    X = means[y] + rng.normal(size=(N, d))
    return X, y, rng


def _compact(ids):
    """Relabel client ids to 0..K-1 without gaps."""
    return np.unique(ids, return_inverse=True)[1]


def iid_split(y, K, rng):
    ids = np.empty(y.size, dtype=np.int64)
    for k, part in enumerate(np.array_split(rng.permutation(y.size), K)):
        ids[part] = k
    return ids


def dirichlet_split(y, K, alpha, rng):
    """Per class, proportions ~ Dir(alpha) over clients (NIID-bench style, very skewed for alpha=0.05)."""
    ids = np.empty(y.size, dtype=np.int64)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(alpha * np.ones(K))
        cuts = (np.cumsum(p)[:-1] * idx.size).astype(int)
        for k, part in enumerate(np.split(idx, cuts)):
            ids[part] = k
    return _compact(ids)


def natural_split(X, K):
    """Clients as contiguous groups along a latent attribute (first feature), geometric sizes."""
    order = np.argsort(X[:, 0], kind="stable")
    sizes = np.maximum(1, np.round(np.geomspace(1, 60, K))).astype(int)
    cuts = np.minimum(np.cumsum(sizes)[:-1], X.shape[0] - 1)
    ids = np.empty(X.shape[0], dtype=np.int64)
    for k, part in enumerate(np.split(order, cuts)):
        ids[part] = k
    return _compact(ids)


def loop_stats(X, y, k, K, C):
    """Independent oracle: explicit per-client, per-class loops."""
    d = X.shape[1]
    counts = np.zeros((K, C))
    sums = np.zeros((K, C, d))
    second = np.zeros((K, d, d))
    cs = np.zeros((K, C, d, d))
    for i in range(X.shape[0]):
        f = X[i]
        counts[k[i], y[i]] += 1
        sums[k[i], y[i]] += f
        second[k[i]] += np.outer(f, f)
        cs[k[i], y[i]] += np.outer(f, f)
    return counts, sums, second, cs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_federated_equals_centralised_and_loops(seed):
    X, y, rng = _data(seed)
    K = 7
    k = iid_split(y, K, rng) if seed == 0 else dirichlet_split(y, K, 0.3, rng)
    K = int(k.max()) + 1
    st = compute_client_stats(X, y, k, num_classes=5, fields=ALL)
    oracle = loop_stats(X, y, k, K, 5)
    for got, want in zip((st.counts, st.sums, st.second, st.class_second), oracle):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10)
    central = compute_client_stats(X, y, None, num_classes=5, fields=ALL)
    tot = st.total()
    for f in ALL:
        np.testing.assert_allclose(getattr(tot, f), getattr(central, f), rtol=1e-12, atol=1e-10)
    # direct pooled formulas
    np.testing.assert_allclose(central.second[0], X.T @ X, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(central.sums[0], np.stack([X[y == c].sum(0) for c in range(5)]), atol=1e-10)


def test_batched_blocks_unequal_clients(monkeypatch):
    """Force many padded blocks: clients of sizes 1..200 must still give exact second moments."""
    rng = np.random.default_rng(5)
    sizes = np.array([1, 2, 3, 50, 7, 200, 1, 31])
    k = np.repeat(np.arange(sizes.size), sizes)
    N, d, C = k.size, 4, 3
    X = rng.normal(size=(N, d))
    y = rng.integers(0, C, N)
    # a block then holds only a few samples' worth of rows
    monkeypatch.setattr(stats_mod, "_BLOCK_BYTES", 3 * 8 * d * 8)
    st = compute_client_stats(X, y, k, num_classes=C, fields=ALL)
    oracle = loop_stats(X, y, k, sizes.size, C)
    for got, want in zip((st.counts, st.sums, st.second, st.class_second), oracle):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10)


def test_aggregation_is_a_sum():
    X, y, rng = _data(3)
    k = iid_split(y, 6, rng)
    st = compute_client_stats(X, y, k, num_classes=5, fields=ALL)
    a, b = st.clients([0, 1, 2]).total(), st.clients([3, 4, 5]).total()
    both = a + b
    for f in ALL:
        np.testing.assert_allclose(getattr(both, f), getattr(st.total(), f), rtol=1e-12, atol=1e-10)
    # statistics of a union of clients = statistics of the pooled samples
    sel = np.isin(k, [0, 1, 2])
    union = compute_client_stats(X[sel], y[sel], None, num_classes=5, fields=ALL)
    for f in ALL:
        np.testing.assert_allclose(getattr(a, f), getattr(union, f), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("method,params", [("fedcgs", {}), ("fedcgs", {"covariance": "within"}),
                                           ("fed3r", {}), ("fed3r", {"bias": False}),
                                           ("fed3r-within", {}), ("fedncm", {}), ("fedlog", {}),
                                           ("fedcof-oracle", {})])
def test_sum_methods_partition_invariant(method, params):
    """Heads from summed statistics do not depend on how samples are split across clients."""
    X, y, rng = _data(4, N=400)
    ref = privfed.fit(method, X, y, None, **params)
    splits = {
        "iid": iid_split(y, 10, rng),
        "dirichlet0.05": dirichlet_split(y, 20, 0.05, rng),
        "natural": natural_split(X, 12),
    }
    for name, k in splits.items():
        h = privfed.fit(method, X, y, k, **params)
        np.testing.assert_allclose(h.weight, ref.weight, rtol=1e-9, atol=1e-9, err_msg=name)
        np.testing.assert_allclose(h.bias, ref.bias, rtol=1e-9, atol=1e-9, err_msg=name)


def test_dirichlet_split_is_skewed():
    """The alpha = 0.05 split used above really is non-IID (most clients see few classes)."""
    X, y, rng = _data(4, N=400)
    k = dirichlet_split(y, 20, 0.05, rng)
    st = compute_client_stats(X, y, k, num_classes=5)
    assert np.median((st.counts > 0).sum(axis=1)) <= 2


def test_clientstats_shape_errors():
    with pytest.raises(privfed.InputError, match="counts must have shape"):
        ClientStats(counts=np.zeros(3), sums=np.zeros((1, 3, 2)))
    with pytest.raises(privfed.InputError, match="unknown statistic"):
        compute_client_stats(np.zeros((2, 2)), [0, 1], fields=["bogus"])
