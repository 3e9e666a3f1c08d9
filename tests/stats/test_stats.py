"""Federated statistics equal centralised ones; partition-invariant heads (FedCGS, Fed3R)."""

from __future__ import annotations

import numpy as np
import pytest

import privfed
import privfed.stats as stats_mod
import privfed.stats.algebra as stats_algebra
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
    monkeypatch.setattr(stats_algebra, "_BLOCK_BYTES", 3 * 8 * d * 8)
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


@pytest.mark.parametrize(
    "method,params",
    [
        ("fedcgs", {}),
        ("fedcgs", {"covariance": "within"}),
        ("fed3r", {}),
        ("fed3r", {"bias": False}),
        ("fed3r-within", {}),
        ("fedncm", {}),
        ("fedlog", {}),
        ("fedcof-oracle", {}),
    ],
)
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


# -- the pair layout, dense views and the fold ----------------------------------------
def _federation(seed, N=300, d=5, C=6, K=12):
    """Random federation with empty clients (ids with no sample), one-sample classes on a client,
    a class held by a single client and a class absent from every client."""
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(C, d))
    y = rng.integers(0, C - 2, N)
    k = rng.integers(0, K - 3, N)  # clients K-3.. K-1 stay empty unless given below
    y[:2], k[:2] = C - 2, K - 2  # class C-2: one client, two samples
    y[2], k[2] = 0, K - 3  # client K-3: one sample, one class
    X = means[y] + rng.normal(size=(N, d))
    return X, y, k, C, K


def _dense(st):
    """The same statistics through the dense constructor (the layout before pairs)."""
    return ClientStats(
        counts=np.array(st.counts),
        sums=np.array(st.sums),
        second=None if st.second is None else np.array(st.second),
        class_second=None if st.class_second is None else np.array(st.class_second),
        owners=st.owners,
    )


def test_pair_layout_matches_loops_and_dense_views():
    X, y, k, C, K = _federation(0)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=ALL)
    counts, sums, second, cs = loop_stats(X, y, k, K, C)
    # only the (client, class) cells with data are stored, sorted by client then class
    cells = sorted({(a, b) for a, b in zip(k, y)})
    assert list(zip(st.pair_client, st.pair_class)) == cells
    np.testing.assert_array_equal(st.pair_counts, counts[st.pair_client, st.pair_class])
    np.testing.assert_allclose(st.pair_sums, sums[st.pair_client, st.pair_class], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(st.gram(), X.T @ X, rtol=1e-12, atol=1e-10)
    for got, want in zip((st.counts, st.sums, st.second, st.class_second), (counts, sums, second, cs)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10)
    assert st.num_pairs() == len(cells)
    assert st.nbytes_float32() == 4 * (K * C + K * C * 5 + K * 25 + K * C * 25)
    # dense -> pairs gives the same pairs
    dn = _dense(st)
    np.testing.assert_array_equal(dn.pair_client, st.pair_client)
    np.testing.assert_allclose(dn.pair_sums, st.pair_sums, rtol=0, atol=0)


def test_algebra_agrees_between_layouts():
    X, y, k, C, K = _federation(1)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=ALL)
    dn = _dense(st)
    rows = [5, 0, 3, K - 1]
    for a, b in (
        (st.total(), dn.total()),
        (st.clients(rows), dn.clients(rows)),
        (st.select(["second"]), dn.select(["second"])),
        (
            st.clients(rows[:2]).total() + st.clients(rows[2:]).total(),
            dn.clients(rows[:2]).total() + dn.clients(rows[2:]).total(),
        ),
    ):
        assert a.available == b.available and a.num_clients == b.num_clients
        for f in a.available:
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-12, atol=1e-10, err_msg=f)
    assert st.select([]).available == {"counts", "sums"}
    # with_arrays replaces dense blocks and keeps the rest
    noisy = st.with_arrays(sums=st.sums + 1.0)
    np.testing.assert_allclose(noisy.sums, st.sums + 1.0)
    np.testing.assert_array_equal(noisy.counts, st.counts)
    np.testing.assert_allclose(noisy.second, st.second)
    assert noisy.num_pairs() == st.num_pairs()
    assert noisy.pair_counts.size == K * C  # every cell now holds a (noisy) sum


@pytest.mark.parametrize("keep", ["total", "pairs"])
def test_fold_equals_total_in_any_chunking(keep):
    X, y, k, C, K = _federation(2)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=ALL)
    ref = st.total()
    for cuts in ([K], [1, K], [3, 4, 9, K], list(range(1, K + 1))):
        fold = stats_mod.StatsFold(num_classes=C, dim=X.shape[1], keep=keep)
        lo = 0
        for hi in cuts:
            fold.add(st.clients(np.arange(lo, hi)))
            lo = hi
        out = fold.result()
        assert out.folded_pairs == st.num_pairs() and fold.num_clients == K
        got = out if keep == "total" else out.total()
        for f in ("counts", "sums", "second"):
            np.testing.assert_allclose(getattr(got, f), getattr(ref, f), rtol=1e-12, atol=1e-10, err_msg=f)
        np.testing.assert_allclose(out.gram(), X.T @ X, rtol=1e-12, atol=1e-10)
        if keep == "pairs":  # every pair kept, in client order
            np.testing.assert_array_equal(out.pair_client, st.pair_client)
            np.testing.assert_allclose(out.pair_sums, st.pair_sums, rtol=0, atol=0)


def test_fold_renumbers_pseudo_client_owners():
    X, y, k, C, K = _federation(3)
    m = privfed.methods.get("fedcof", means_per_client=3)
    st = m.client_stats(X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(0))
    half = int(np.searchsorted(st.owners, K // 2))
    a, b = st.clients(np.arange(half)), st.clients(np.arange(half, st.num_clients))
    b = ClientStats.from_pairs(
        num_clients=b.num_clients,
        num_classes=C,
        pair_client=b.pair_client,
        pair_class=b.pair_class,
        pair_counts=b.pair_counts,
        pair_sums=b.pair_sums,
        owners=b.owners - b.owners.min(),
    )
    out = stats_mod.StatsFold(num_classes=C, dim=X.shape[1], keep="pairs").add(a).add(b).result()
    np.testing.assert_array_equal(out.owners, st.owners)


def test_dense_view_over_limit_is_refused(monkeypatch):
    X, y, k, C, K = _federation(4)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=["second"])
    monkeypatch.setattr(stats_mod, "DENSE_VIEW_LIMIT", 8 * K * C * X.shape[1] - 1)
    with pytest.raises(privfed.InputError, match=r"sums of shape \(12, 6, 5\) needs .* GiB"):
        st.sums
    st.counts  # (K, C) fits
    privfed.methods.get("fed3r").aggregate(st)  # the pair layout is enough for every server
    privfed.methods.get("fedcof").aggregate(st)
    with pytest.raises(privfed.InputError, match="folded"):
        stats_mod.StatsFold(num_classes=C, dim=X.shape[1], keep="pairs").add(st).result().second


def test_fold_errors():
    X, y, k, C, K = _federation(5)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K)
    with pytest.raises(privfed.InputError, match="nothing was folded"):
        stats_mod.StatsFold(num_classes=C, dim=5).result()
    with pytest.raises(privfed.InputError, match="keep must be"):
        stats_mod.StatsFold(num_classes=C, dim=5, keep="dense")
    with pytest.raises(privfed.InputError, match="C=3"):
        stats_mod.StatsFold(num_classes=3, dim=5).add(st)
    with pytest.raises(privfed.InputError, match="only once"):
        ClientStats.from_pairs(
            num_clients=2,
            num_classes=2,
            pair_client=[0, 0],
            pair_class=[1, 1],
            pair_counts=[1, 1],
            pair_sums=np.ones((2, 3)),
        )


def test_copy_and_pickle_keep_every_field():
    import copy
    import pickle

    X, y, k, C, K = _federation(6)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=ALL)
    for other in (copy.deepcopy(st), pickle.loads(pickle.dumps(st))):
        assert other.available == st.available
        for f in ALL:
            np.testing.assert_array_equal(getattr(other, f), getattr(st, f))
    with pytest.raises(AttributeError, match="immutable"):
        st.counts = None


def test_class_totals_of_folded_totals_are_read_only_views_of_the_one_row():
    rng = np.random.default_rng(3)
    F, y, k = rng.normal(size=(60, 5)), rng.integers(0, 4, 60), rng.integers(0, 6, 60)
    many = compute_client_stats(F, y, k, num_classes=4, num_clients=6, fields=("counts", "sums"))
    N, S = many.class_totals()
    folded = ClientStats(counts=N[None], sums=S[None])
    N1, S1 = folded.class_totals()
    np.testing.assert_array_equal(N1, N)
    np.testing.assert_array_equal(S1, S)
    assert np.shares_memory(S1, folded.sums) and not S1.flags.writeable
    with pytest.raises(ValueError):
        S1[0, 0] = 1.0
    # an independent total: the per-class sums of the raw rows
    np.testing.assert_allclose(S1, np.stack([F[y == c].sum(axis=0) for c in range(4)]), atol=1e-12)


@pytest.mark.parametrize("d", [1, 7, 64, 65, 130])
def test_gram_sum_equals_the_product_over_all_rows(d):
    """GramSum over blocks of any size (empty, one row, across the 64-row mirror tiles), with a
    subtracted block, equals X^T X - Z^T Z summed row by row in exact-order-free float64 (1e-12 of its
    scale); the result is symmetric bit for bit, C-ordered, and the diagonal read before the
    subtraction is X^T X's."""
    rng = np.random.default_rng(d)
    X = rng.standard_normal((301, d)) * rng.uniform(0.5, 3.0, d)
    Z = rng.standard_normal((9, d))
    g = stats_algebra.GramSum(d)
    cuts = [0, 0, 1, 2, 70, 70, 200, 301]
    for a, b in zip(cuts[:-1], cuts[1:]):
        g.add(X[a:b])
    assert g.rows == 301
    want_diag = np.einsum("ij,ij->j", X, X)
    np.testing.assert_allclose(g.diagonal(), want_diag, rtol=1e-12)
    g.add(Z, sign=-1.0)
    out = g.result()
    want = sum(np.outer(x, x) for x in X) - sum(np.outer(z, z) for z in Z)
    scale = np.abs(X).max() ** 2 * X.shape[0]
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12 * scale)
    assert out.flags["C_CONTIGUOUS"] and np.array_equal(out, out.T)


def test_gram_sum_refuses_misuse_and_takes_empty_blocks():
    """A block of the wrong width or rank, or any use after result(), is refused; empty blocks and
    d = 0 add nothing."""
    g = stats_algebra.GramSum(3)
    with pytest.raises(ValueError, match=r"blocks \(m, 3\)"):
        g.add(np.ones(3))
    with pytest.raises(ValueError, match=r"blocks \(m, 3\)"):
        g.add(np.ones((2, 4)))
    g.add(np.ones((0, 3)))
    g.add(np.ones((2, 3)))
    assert g.rows == 2 and np.array_equal(g.result(), np.full((3, 3), 2.0))
    for again in (lambda: g.add(np.ones((1, 3))), g.diagonal, g.result):
        with pytest.raises(RuntimeError, match="result\\(\\) was taken"):
            again()
    z = stats_algebra.GramSum(0)
    z.add(np.ones((5, 0)))
    assert z.result().shape == (0, 0)


def _class_sums_loop(X, y, C):
    """Independent oracle: each class's sum of samples, one sample at a time."""
    out = np.zeros((C, X.shape[1]))
    for i in range(X.shape[0]):
        out[y[i]] += X[i]
    return out


def test_pairs_folds_keep_the_class_sums_of_their_own_sums():
    """A pairs fold (StatsFold, and fold_statistics with chunks that cut pairs) folds S_c as the pairs
    arrive; it equals a sample loop's, and a copy with other sums or other clients never reads it."""
    from privfed.release.pipeline import fold_statistics

    X, y, k, C, K = _federation(7)
    want = _class_sums_loop(X, y, C)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K)
    assert st._stored_class_sums() is None  # computed statistics: nothing folded
    for cuts in ([K], [2, 5, K], list(range(1, K + 1))):
        fold = stats_mod.StatsFold(num_classes=C, dim=X.shape[1], keep="pairs")
        lo = 0
        for hi in cuts:
            fold.add(st.clients(np.arange(lo, hi)))
            lo = hi
        out = fold.result()
        np.testing.assert_allclose(out._stored_class_sums(), want, rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(out.class_totals()[1], want, rtol=1e-12, atol=1e-10)
    m = privfed.methods.get("fedcof")
    for chunk_bytes in (8 * X.shape[1] * 7, None):  # 7 rows a chunk: most chunks cut a pair
        folded = fold_statistics(
            m, X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(0), chunk_bytes=chunk_bytes
        )
        np.testing.assert_allclose(folded._stored_class_sums(), want, rtol=1e-12, atol=1e-10)
    other = folded.with_arrays(sums=folded.sums + 1.0)
    assert other._stored_class_sums() is None
    np.testing.assert_allclose(other.class_totals()[1], want + K, rtol=1e-12, atol=1e-10)
    assert folded.clients(np.arange(2))._stored_class_sums() is None


def test_pairs_fold_of_count_only_cells_sums_the_stored_rows_only():
    rng = np.random.default_rng(8)
    C, d = 4, 3
    stored = rng.normal(size=(3, d))
    chunk = ClientStats.from_pairs(  # client 0: classes 0, 2 summed, class 3 a count-only cell; client 1: 2
        num_clients=2,
        num_classes=C,
        pair_client=[0, 0, 0, 1],
        pair_class=[0, 2, 3, 2],
        pair_counts=[2.0, 1.0, 4.0, 3.0],
        pair_sums=stored,
        sum_rows=[2, 0, -1, 1],  # rows stored in another order than the pairs
    )
    plain = ClientStats.from_pairs(
        num_clients=1,
        num_classes=C,
        pair_client=[0],
        pair_class=[1],
        pair_counts=[5.0],
        pair_sums=np.ones((1, d)),
    )
    out = stats_mod.StatsFold(num_classes=C, dim=d, keep="pairs").add(chunk).add(plain).result()
    want = np.zeros((C, d))
    want[0], want[2], want[1] = stored[2], stored[0] + stored[1], 1.0
    np.testing.assert_allclose(out._stored_class_sums(), want, rtol=1e-12, atol=1e-12)


def test_pairs_fold_copies_each_upload_and_keeps_sums_of_counted_pairs_only():
    """A server may reuse one receive buffer for every upload: the fold keeps copies, so its pairs and its
    class sums are the uploads'. Pairs whose count is <= 0 (dropped by FedCOF's rule) add nothing to the
    kept class sums, however large their sums."""
    rng = np.random.default_rng(9)
    K, C, d = 5, 3, 4
    n = rng.integers(1, 6, (K, C)).astype(float)
    n[1, 2], n[3, 0] = -1.0, 0.0
    sums = rng.normal(size=(K, C, d))
    sums[1, 2], sums[3, 0] = 1e300, -1e300
    fold = stats_mod.StatsFold(num_classes=C, dim=d, keep="pairs")
    buf_n, buf_s = np.empty(C), np.empty((C, d))
    for k in range(K):
        buf_n[:], buf_s[:] = n[k], sums[k]
        fold.add(
            ClientStats.from_pairs(
                num_clients=1,
                num_classes=C,
                pair_client=np.zeros(C, int),
                pair_class=np.arange(C),
                pair_counts=buf_n,
                pair_sums=buf_s,
            )
        )
    out = fold.result()
    np.testing.assert_array_equal(out.pair_sums, sums.reshape(-1, d))
    np.testing.assert_array_equal(out.pair_counts, n.ravel())
    want = np.where((n > 0)[..., None], sums, 0.0).sum(axis=0)
    np.testing.assert_allclose(out._stored_class_sums(), want, rtol=1e-12, atol=1e-12)


def test_pairs_fold_refuses_a_non_finite_sum_after_its_counts_were_read():
    S = np.ones((2, 3))
    S[1, 0] = np.nan
    chunk = ClientStats.from_pairs(
        num_clients=2, num_classes=2, pair_client=[0, 1], pair_class=[0, 1], pair_counts=[2, 3], pair_sums=S
    )
    chunk.counts  # a dense view of the counts, cached; the sums are still the pairs'
    with pytest.raises(
        privfed.InputError, match=r"node 7: statistic 'sums' from client 1 of node 7, class 1"
    ):
        stats_mod.StatsFold(num_classes=2, dim=3, keep="pairs").add(chunk, source="node 7")


def _small_stats():
    X = np.random.default_rng(10).normal(size=(40, 3))
    return compute_client_stats(X, np.arange(40) % 2, np.arange(40) % 4, fields=("counts", "sums", "second"))


_PAIRS = dict(pair_client=[0, 1], pair_class=[0, 1], pair_counts=[2.0, 3.0], pair_sums=np.ones((2, 3)))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: _small_stats().with_arrays(sums=np.ones((4, 2, 7))), r"sums must have shape \(4, 2, 3\)"),
        (lambda: _small_stats().with_arrays(counts=np.ones((3, 2))), r"counts must have shape \(4, 2\)"),
        (lambda: ClientStats.from_pairs(num_clients=2, num_classes=None, **_PAIRS), "num_classes must be"),
        (lambda: ClientStats.from_pairs(num_clients=-1, num_classes=2, **_PAIRS), "num_clients must be >= 1"),
        (lambda: ClientStats.from_pairs(num_clients=2.9, num_classes=2, **_PAIRS), "num_clients must be a"),
        (
            lambda: ClientStats.from_pairs(
                num_clients=2, num_classes=2, gram=np.eye(3), second=np.zeros((2, 3, 3)), **_PAIRS
            ),
            "not both",
        ),
        (lambda: ClientStats.from_pairs(num_clients=2, num_classes=2, owners=[-1, 0], **_PAIRS), "ids >= 0"),
        (lambda: _small_stats().clients([0, 9]), r"lie in 0\.\.3"),
        (lambda: _small_stats().clients(["a"]), "client indices"),
        (lambda: _small_stats().clients([0.9]), "client indices"),
        (lambda: _small_stats().clients([True, False]), r"mask must have shape \(4,\)"),
        (
            lambda: privfed.methods.get("fedcof").aggregate(np.zeros(3)),
            "aggregates a privfed.stats.ClientStats",
        ),
    ],
)
def test_stats_misuse_is_named(call, message):
    """Each of these ran on (a d = 7 sums beside d = 3 second moments, a negative owner whose rows a secure
    sum dropped, num_clients=2.9 read as 2, gram and second disagreeing, client 0.9 read as 0, a short mask
    read as indices) or raised numpy's own error."""
    with pytest.raises(privfed.InputError if "num_c" not in message else privfed.ConfigError, match=message):
        call()


def test_a_field_name_given_alone_is_one_name_and_ids_of_one_kind_per_fold():
    st = _small_stats()
    assert st.select("second").available == {"counts", "sums", "second"}
    X = np.random.default_rng(11).normal(size=(20, 3))
    one = compute_client_stats(X, np.arange(20) % 2, np.arange(20) % 2, fields="second")
    assert one.available == {"counts", "sums", "second"}
    fold = stats_mod.StatsFold(num_classes=2, dim=3)
    with pytest.raises(privfed.InputError, match="mix integer and string ids"):
        fold.add(one, client_ids=["1", 1])
    fold.add(one, client_ids=["1", "2"])
    with pytest.raises(
        privfed.InputError, match=r"mix integer and string ids.*\(strings, as the chunks before\)"
    ):
        fold.add(one, client_ids=[1, 3])


@pytest.mark.parametrize("keep", ["total", "pairs"])
def test_a_folds_result_is_a_snapshot_that_later_chunks_leave_alone(keep):
    """result() shared the running second-moment totals: chunks folded after it grew the result's gram, second
    and class_second while its counts and sums stayed, a mix of two federations (a fed3r head refit from it
    moved by 0.2)."""
    X, y, k, C, K = _federation(2)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=ALL)
    fold = stats_mod.StatsFold(num_classes=C, dim=X.shape[1], keep=keep)
    first = fold.add(st.clients(np.arange(3))).result()
    alone = (
        stats_mod.StatsFold(num_classes=C, dim=X.shape[1], keep=keep).add(st.clients(np.arange(3))).result()
    )
    fold.add(st.clients(np.arange(3, K)))
    got, want = (first, alone) if keep == "total" else (first.total(), alone.total())
    for f in ("counts", "sums", "second"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    assert not np.array_equal(first.gram(), fold.result().gram())
    np.testing.assert_allclose(fold.result().gram(), X.T @ X, rtol=1e-12, atol=1e-10)  # the fold went on


def test_statistics_no_method_can_use_and_their_mistakes_are_one_line():
    """C = 0 or d = 0 statistics were taken (fedcof and fedlog then crashed, the others returned empty
    heads); compute_client_stats cut num_clients=3.5 to 3 and gave '3' a TypeError; a + b with other owners
    kept a's owners."""
    from privfed.errors import ConfigError, InputError

    for counts, sums in ((np.zeros((2, 0)), np.zeros((2, 0, 3))), (np.ones((2, 2)), np.zeros((2, 2, 0)))):
        with pytest.raises(InputError, match="at least one class and one feature dimension"):
            ClientStats(counts=counts, sums=sums)
    F, y, k = np.ones((4, 2)), np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])
    for n in (3.5, True, "3"):
        with pytest.raises(ConfigError, match=f"num_clients must be a positive integer, got {n!r}"):
            compute_client_stats(F, y, k, num_clients=n)
    assert compute_client_stats(F, y, k, num_clients=3).num_clients == 3
    a = ClientStats(counts=np.ones((3, 2)), sums=np.ones((3, 2, 2)), owners=[0, 0, 1])
    with pytest.raises(InputError, match="different owners"):
        a + ClientStats(counts=np.ones((3, 2)), sums=np.ones((3, 2, 2)), owners=[0, 1, 1])
    assert (a + a).owners.tolist() == [0, 0, 1]


def test_scale_clients_names_the_bad_weight_not_the_shape():
    from privfed.errors import InputError

    a = ClientStats(counts=np.ones((3, 2)), sums=np.ones((3, 2, 2)))
    for w, said in (([1, -1, 0], "got -1 for client 1"), ([1, np.nan, 0], "got nan for client 1")):
        with pytest.raises(InputError, match=said):  # was 'got shape (3,)', the shape being right
            a.scale_clients(w)
    with pytest.raises(InputError, match="3 values \\(one per client\\), got shape \\(2,\\)"):
        a.scale_clients([1, 2])
