"""Federated partitions: exact sizes, seeding, reports, and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from privfed.errors import ConfigError, InputError
from privfed.federation import Partition, available_schemes, partition


def _labels(counts):
    return np.repeat(np.arange(len(counts)), counts)


def _shuffled(counts, seed=0):
    y = _labels(counts)
    return np.random.default_rng(seed).permutation(y)


def test_available_schemes():
    assert available_schemes() == sorted(["dirichlet", "dirichlet-class", "shards", "iid", "natural"])


@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet-class", "shards", "iid"])
def test_seeded_and_reproducible(scheme):
    y = _shuffled([60] * 10)
    a = partition(y, 12, scheme, rng=7, min_size=5)
    b = partition(y, 12, scheme, rng=np.random.default_rng(7), min_size=5)
    c = partition(y, 12, scheme, rng=8, min_size=5)
    assert np.array_equal(a.clients, b.clients)
    assert not np.array_equal(a.clients, c.clients)
    assert a.scheme == scheme and a.num_clients == 12
    assert not a.clients.flags.writeable


# -- dirichlet (FedNCM / FedCOF) -----------------------------------------------------


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0, 100.0])
@pytest.mark.parametrize("n, K", [(1000, 10), (997, 7), (50, 50), (103, 1)])
def test_dirichlet_exact_sizes(alpha, n, K):
    y = _shuffled(np.bincount(np.arange(n) % 10))
    p = partition(y, K, "dirichlet", alpha=alpha, rng=1)
    per = n // K
    assert np.all(p.sizes() == per)  # exactly floor(N/K) on every client: none empty
    assert p.dropped.size == n - K * per
    assert p.report(y)["dropped_samples"] == n - K * per
    assert p.params["alpha"] == alpha and p.params["per_client"] == per


def test_dirichlet_renormalises_exhausted_classes():
    """Class 0 has 3 samples and class 1 has 97: exact sizes hold whatever p_k wants."""
    y = _shuffled([3, 97])
    for seed in range(20):
        p = partition(y, 2, "dirichlet", alpha=0.05, rng=seed)
        assert np.all(p.sizes() == 50) and p.dropped.size == 0
        counts = p.class_counts(y)
        assert counts[:, 0].sum() == 3 and counts[:, 1].sum() == 97


def test_dirichlet_first_client_follows_its_proportions():
    """With alpha huge, p_0 ~ Dir(1e6 * 1) is uniform to within sd sqrt(0.1 * 0.9 / 1e6) = 3e-4,
    and client 0's 1000 samples drawn from pools of 1000 per class cannot exhaust any class
    before the last draw, so n_0c ~ Binomial(1000, 0.1): sd sqrt(90) = 9.5.  A 5-sd band (+-48)
    has two-sided false-alarm probability 6e-7 per class."""
    y = _shuffled([1000] * 10)
    p = partition(y, 10, "dirichlet", alpha=1e6, rng=3)
    n0 = p.class_counts(y)[0]
    assert n0.sum() == 1000
    assert np.all(np.abs(n0 - 100) <= 48), n0


def test_dirichlet_alpha_controls_heterogeneity():
    """Dir(0.01) over 10 classes puts > 0.99 of its mass on one class about two times in three,
    so clients hold one class, or two once their class's pool runs out (1.9 on average here);
    Dir(100) is near uniform, so each client's 50 samples cover about 10 (1 - 0.9^50) = 9.95
    classes (9.75 here, the last clients taking what is left).  Thresholds sit between."""
    y = _shuffled([100] * 10)
    cpc_small = partition(y, 20, "dirichlet", alpha=0.01, rng=0).report(y)["classes_per_client"]["mean"]
    cpc_large = partition(y, 20, "dirichlet", alpha=100, rng=0).report(y)["classes_per_client"]["mean"]
    assert cpc_small < 3 and cpc_large > 9


def test_exhausted_classes_are_renormalised_in_law():
    """The batched draw has the law of sequential draws from p renormalised over classes left.

    p = (0.6, 0.3, 0.1), left = (3, 40, 40), 20 draws.  Reference: 2000 sequential samplings;
    candidate: 2000 batched ones.  Class 1's count has sd <= sqrt(20 * 0.25) = 2.24 per run, so
    the difference of two means of 2000 runs has sd <= 2.24 * sqrt(2 / 2000) = 0.071; 5 sd = 0.36.
    Class 0 fills up (P(< 3 of class 0 in 20 draws) ~ 1e-5), and each of the other 17 draws goes
    to class 1 with probability 0.3 / 0.4, so E[n_1] = 12.75 exactly (sd of the mean 0.04).
    """
    from privfed.federation import _draw_class_counts

    p, left, need, reps = np.array([0.6, 0.3, 0.1]), np.array([3, 40, 40]), 20, 2000
    rng = np.random.default_rng(11)
    batched = np.array([_draw_class_counts(p, left, need, rng)[0] for _ in range(reps)])
    seq = np.zeros((reps, 3), dtype=int)
    for r in range(reps):
        room = left.copy()
        for _ in range(need):
            q = np.where(room > 0, p, 0.0)
            c = rng.choice(3, p=q / q.sum())
            seq[r, c] += 1
            room[c] -= 1
    assert np.all(batched.sum(axis=1) == need) and np.all(batched <= left)
    assert np.all(batched[:, 0] == 3) and np.all(seq[:, 0] == 3)
    assert abs(batched[:, 1].mean() - seq[:, 1].mean()) < 0.36
    assert abs(batched[:, 1].mean() - 12.75) < 0.2  # 5 sd of the mean


# -- dirichlet-class (FedCGS / NIID-bench) ---------------------------------------------


@pytest.mark.parametrize("alpha", [0.1, 0.5, 5.0])
def test_dirichlet_class_min_size_and_coverage(alpha):
    y = _shuffled([120] * 10)
    p = partition(y, 20, "dirichlet-class", alpha=alpha, rng=4, min_size=10)
    assert p.sizes().min() >= 10
    assert p.dropped.size == 0  # every sample placed
    assert p.params["tries"] >= 1 and p.params["min_size"] == 10


def test_dirichlet_class_gives_up_clearly():
    # four classes of 25 and alpha 0.01: each class lands (almost) whole on one client, so at most
    # four of ten clients can reach 10 samples; five draws cannot succeed.
    y = _shuffled([25] * 4)
    with pytest.raises(ConfigError, match="lower min_size, raise alpha"):
        partition(y, 10, "dirichlet-class", alpha=0.01, rng=0, min_size=10, max_tries=5)
    with pytest.raises(ConfigError, match="needs 110 samples"):
        partition(y, 11, "dirichlet-class", min_size=10)


# -- shards (FedLog) ---------------------------------------------------------------


@pytest.mark.parametrize("K, s, C", [(10, 2, 10), (50, 2, 10), (20, 10, 100), (7, 3, 5)])
def test_shards_classes_per_client(K, s, C):
    y = _shuffled([40] * C)
    p = partition(y, K, "shards", classes_per_client=s, rng=2)
    counts = p.class_counts(y)
    assert np.all((counts > 0).sum(axis=1) == s)  # exactly s distinct classes each
    holders = (counts > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1  # classes spread evenly over clients
    for c in range(C):  # each class split evenly over its holders
        nz = counts[:, c][counts[:, c] > 0]
        assert nz.sum() == 40 and nz.max() - nz.min() <= 1
    assert p.dropped.size == 0


def test_shards_fewer_slots_than_classes_are_reported():
    y = _shuffled([10] * 10)
    p = partition(y, 3, "shards", classes_per_client=2, rng=0)
    assert p.dropped.size == 40  # 4 classes of 10 held by nobody
    assert len(p.params["unassigned_classes"]) == 4
    r = p.report(y)
    assert r["dropped_samples"] == 40 and sorted(r["classes_without_data"]) == sorted(
        p.params["unassigned_classes"]
    )
    assert any("dropped" in w for w in r["warnings"])
    with pytest.raises(ConfigError, match="classes_per_client=11"):
        partition(y, 3, "shards", classes_per_client=11)


# -- iid and natural -----------------------------------------------------------------


def test_iid_balanced():
    y = _shuffled([33] * 3)
    p = partition(y, 10, "iid", rng=0)
    sizes = p.sizes()
    assert sizes.sum() == 99 and sizes.max() - sizes.min() <= 1 and p.dropped.size == 0


def test_natural_passthrough_and_checks():
    y = _shuffled([5] * 4)
    k = np.arange(20) % 4
    p = partition(y, None, "natural", natural=k)
    assert np.array_equal(p.clients, k) and p.num_clients == 4 and p.scheme == "natural"
    assert partition(y, 4, "natural", natural=k).num_clients == 4
    other = partition(y, 5, "natural", natural=k)  # a CLI default K: ignored, and said so
    assert other.num_clients == 4 and np.array_equal(other.clients, k)
    assert "num_clients=5 ignored: the natural split has 4 clients" in other.report()["warnings"]
    with pytest.raises(InputError, match="natural clients has 19 entries but labels has 20"):
        partition(y, None, "natural", natural=k[:19])
    with pytest.raises(InputError, match=">= 0"):
        partition(y, None, "natural", natural=k - 1)
    with pytest.raises(ConfigError, match="has none: use another scheme"):
        partition(y, 4, "natural")
    gaps = np.where(k == 2, 5, k)  # ids 0, 1, 3, 5: clients 2 and 4 are empty
    g = partition(y, None, "natural", natural=gaps)
    r = g.report(y)
    assert g.num_clients == 6 and r["empty_clients"] == [2, 4]
    F = np.arange(20.0)[:, None]
    F2, y2, k2 = g.apply(F, y)
    assert np.array_equal(k2, np.array([0, 1, 2, 3])[np.searchsorted([0, 1, 3, 5], gaps)])


# -- Partition methods -------------------------------------------------------------


def test_report_names_problems():
    y = np.array([0, 0, 1, 1, 2, 0, 1])
    clients = np.array([0, 0, 0, 2, 2, -1, 3])  # client 1 empty; client 3 one sample; one dropped
    p = Partition(clients, 5, "manual", {})
    r = p.report(y)
    assert r["empty_clients"] == [1, 4]
    assert r["single_sample_clients"] == [3]
    assert r["dropped_samples"] == 1
    assert r["sizes"]["per_client"] == [3, 0, 2, 1, 0]
    # singleton (client, class) pairs: (0,1), (2,1), (2,2), (3,1)
    assert r["singleton_pairs"]["count"] == 4
    assert r["singleton_pairs"]["first"] == [[0, 1], [2, 1], [2, 2], [3, 1]]
    assert r["classes_per_client"]["per_client"] == [2, 0, 2, 1, 0]
    assert r["clients_per_class"] == [1, 3, 1]
    text = " ".join(r["warnings"])
    assert "no sample" in text and "single sample" in text and "dropped" in text
    assert partition(_shuffled([5, 5]), 2, "iid").report()["warnings"] == []


def test_class_counts_and_apply_match_loops():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 200)
    p = partition(y, 9, "dirichlet", alpha=0.3, rng=1)
    counts = p.class_counts(y, num_classes=6)
    ref = np.zeros((9, 6), dtype=int)
    for k, c in zip(p.clients, y):
        if k >= 0:
            ref[k, c] += 1
    assert np.array_equal(counts, ref)
    F = rng.normal(size=(200, 3))
    F2, y2, k2 = p.apply(F, y)
    keep = p.clients >= 0
    assert np.array_equal(F2, F[keep]) and np.array_equal(y2, y[keep])
    used = np.unique(p.clients[keep])
    assert np.array_equal(k2, np.searchsorted(used, p.clients[keep]))  # renumbered 0..K'-1, order kept
    with pytest.raises(InputError, match="features has 10 rows"):
        p.apply(F[:10], y)
    with pytest.raises(InputError, match="labels has 10 entries"):
        p.class_counts(y[:10])


def test_apply_feeds_fit():
    import privfed

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 50)
    F = rng.normal(size=(200, 6)) + 4 * np.eye(4, 6)[y]
    p = partition(y, 8, "dirichlet-class", alpha=0.5, rng=0, min_size=5)
    F2, y2, k2 = p.apply(F, y)
    head = privfed.fit("fedncm", F2, y2, k2)
    assert head.score(F, y) > 0.9  # well-separated blobs (means 4 apart, unit noise)


# -- bad arguments -----------------------------------------------------------------


def test_bad_arguments():
    y = _shuffled([10] * 3)
    with pytest.raises(ConfigError, match=r"unknown partition scheme 'pathological'.*dirichlet-class"):
        partition(y, 3, "pathological")
    for alpha in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="alpha"):
            partition(y, 3, "dirichlet", alpha=alpha)
        with pytest.raises(ConfigError, match="alpha"):
            partition(y, 3, "dirichlet-class", alpha=alpha)
    for K in (0, -2, True, 2.5):
        with pytest.raises(ConfigError, match="num_clients"):
            partition(y, K, "iid")
    with pytest.raises(ConfigError, match="num_clients=31 exceeds the 30 samples"):
        partition(y, 31, "dirichlet")
    with pytest.raises(InputError, match="labels must be >= 0"):
        partition(np.array([0, -1, 1]), 2, "iid")
    with pytest.raises(InputError, match="1-D"):
        partition(np.zeros((3, 2), int), 2, "iid")
    with pytest.raises(InputError, match="whole numbers"):
        partition(np.array([0.5, 1.0]), 1, "iid")
    with pytest.raises(ConfigError, match="rng"):
        partition(y, 3, "iid", rng="seed")
    with pytest.raises(ConfigError, match="max_tries"):
        partition(y, 3, "dirichlet-class", min_size=1, max_tries=0)
    with pytest.raises(InputError, match="client"):
        Partition(np.array([0, 3]), 2, "manual")
