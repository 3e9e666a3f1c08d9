"""Sizes checked before work, types that would change the data refused, one reading of each setting.

* Memory: work whose arrays cannot fit is refused before anything is allocated, naming the size, the
  limit and the option that lowers it (a feature dimension of 100,000 for a d x d method, 10**9
  declared clients, 10**6 clients masked in one process).  ``$PRIVFED_MEMORY_LIMIT`` fixes the limit
  here, so the tests do not depend on the machine (and never try the allocation).
* Seeds: 0..2**64 - 1 everywhere (numpy, scikit-learn, torch all take that range), a ConfigError beyond.
* Types: complex, object, extended-precision and boolean arrays are refused at every door instead of
  being cast (a ComplexWarning at most), and ids of 1.7 are never read as 1.
* ``$PRIVFED_DENSE_VIEW_LIMIT`` is read through one function: fit refuses a malformed value as the
  commands do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import privfed
from mechanisms import GaussianMechanism
from mechanisms.secagg import PairwiseMasking
from mechanisms.secagg.masking import masked_sum
from privfed._validation import MEMORY_MARGIN, available_memory, check_memory
from privfed._validation.seeds import MAX_SEED
from privfed.data import load_dataset
from privfed.data.digits_split import digits_splits
from privfed.data.npzfile import load_feature_file, save_feature_file
from privfed.errors import ConfigError, InputError
from privfed.federation import Partition, partition
from privfed.stats import ClientStats, compute_client_stats

LIMIT = "4G"  # $PRIVFED_MEMORY_LIMIT in these tests: far below what the refused work needs


@pytest.fixture
def limited(monkeypatch):
    monkeypatch.setenv("PRIVFED_MEMORY_LIMIT", LIMIT)


def _refused_at_once(fn, *patterns):
    t0 = time.process_time()
    with pytest.raises(InputError) as info:
        fn()
    assert time.process_time() - t0 < 5.0, "refused only after the work started"
    msg = str(info.value)
    assert "\n" not in msg
    for p in ("needs about", "GiB", "PRIVFED_MEMORY_LIMIT", *patterns):
        assert p in msg, (p, msg)
    return msg


# ---------------------------------------------------------------- memory
def test_the_limit_is_the_margin_of_the_variable_or_of_the_machine(monkeypatch):
    monkeypatch.setenv("PRIVFED_MEMORY_LIMIT", "1G")
    assert available_memory() == 2**30
    check_memory(MEMORY_MARGIN * 2**30, "x", "y")  # exactly at the margin: allowed
    with pytest.raises(
        InputError, match=r"x needs about 820 MiB.*over the 819 MiB .*of the 1 GiB available.*; y"
    ):
        check_memory(MEMORY_MARGIN * 2**30 + 2**20, "x", "y")
    monkeypatch.setenv("PRIVFED_MEMORY_LIMIT", "lots")
    with pytest.raises(ConfigError, match=r"\$PRIVFED_MEMORY_LIMIT must be a positive number of bytes"):
        available_memory()
    monkeypatch.delenv("PRIVFED_MEMORY_LIMIT")
    found = available_memory()
    assert found is None or 0 < found  # the machine's own figure where the platform gives one


@pytest.mark.parametrize("method", ["fed3r", "fed3r-within", "fedcgs", "fedcof", "fedcof-oracle"])
def test_a_feature_dimension_of_100000_is_refused_before_any_work(method, limited):
    F = np.zeros((4, 100_000), dtype=np.float32)
    F[:, :2] = np.eye(4, 2)
    y = np.array([0, 1, 0, 1])
    _refused_at_once(
        lambda: privfed.fit(method, F, y, np.array([0, 0, 1, 1])),
        "d=100,000 features",
        "reduce the feature dimension",
    )


def test_a_method_without_d_by_d_statistics_takes_the_same_features(limited):
    F = np.zeros((4, 100_000), dtype=np.float32)
    F[:, :2] = np.eye(4, 2)
    head = privfed.fit("fedncm", F, np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]))
    assert head.weight.shape == (2, 100_000)


def test_second_moments_of_a_huge_dimension_are_refused_by_compute_client_stats(limited):
    F = np.zeros((2, 100_000), dtype=np.float32)
    _refused_at_once(
        lambda: compute_client_stats(F, np.array([0, 1]), fields=("counts", "sums", "second")),
        "the summed second moment of d=100,000",
        "fields=('counts', 'sums') only",
    )
    assert compute_client_stats(F, np.array([0, 1])).num_classes == 2  # counts and sums alone fit


def test_a_billion_declared_clients_are_refused_at_once(limited):
    F = np.random.default_rng(0).normal(size=(40, 4))
    y, k = np.arange(40) % 2, np.arange(40) % 4
    mech = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=1.0, level="client", max_records=20, trusted_aggregator=True
    )
    t0 = time.process_time()
    with pytest.raises(InputError, match=r"num_clients=1000000000"):
        privfed.fit("fedncm", F, y, k, num_classes=2, num_clients=10**9, privacy=mech)
    assert time.process_time() - t0 < 5.0
    # fewer clients that pass the fixed checks but not the memory: refused by their size, naming them
    mech = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=1.0, level="client", max_records=20, trusted_aggregator=True
    )
    _refused_at_once(
        lambda: privfed.fit("fedncm", F, y, k, num_classes=2, num_clients=60_000_000, privacy=mech),
        "num_clients=60,000,000 x num_classes=2",
        "pass the number of clients and classes the release really has",
    )


def test_a_million_clients_masked_in_one_process_are_refused_before_any_neighbour_set(limited):
    _refused_at_once(
        lambda: masked_sum(np.zeros((10**6, 1)), key_seed=0),
        "masking 1,000,000 clients in one process on the complete graph",
        "PairwiseMasking(neighbours=k)",
    )
    K = 10**6
    F = np.ones((K, 1), dtype=np.float32)
    _refused_at_once(
        lambda: privfed.fit("fedncm", F, np.zeros(K, int), np.arange(K), secure_agg=PairwiseMasking()),
        "1,000,000 x 1,000,000 node-holder pairs",
    )


def test_a_sparse_graph_of_the_same_clients_is_sized_by_its_degree(monkeypatch):
    from mechanisms.secagg.masking import BYTES_PER_PAIR, check_masking_size

    monkeypatch.setenv("PRIVFED_MEMORY_LIMIT", str(int(BYTES_PER_PAIR * 1000 * 9 / MEMORY_MARGIN) + 1))
    check_masking_size(1000, 8)  # 1000 x 9 pairs: just fits
    with pytest.raises(InputError, match="1,000 x 11 node-holder pairs"):
        check_masking_size(1000, 10)
    with pytest.raises(InputError, match="on the complete graph"):
        check_masking_size(1000, None)


# ---------------------------------------------------------------- seeds
def test_seeds_beyond_64_bits_are_refused_with_the_range_everywhere(tmp_path):
    F = np.random.default_rng(1).normal(size=(30, 3))
    y, k = np.arange(30) % 2, np.arange(30) % 3
    assert privfed.fit("fedcof", F, y, k, random_state=MAX_SEED).weight.shape == (2, 3)
    path = save_feature_file(tmp_path / "f.npz", F, y)
    for call in (
        lambda s: privfed.fit("fedcof", F, y, k, random_state=s),
        lambda s: partition(y, 3, rng=s),
        lambda s: load_dataset(f"file:{path}", seed=s),
        lambda s: digits_splits(s),
    ):
        for bad in (MAX_SEED + 1, 2**70, -1):
            with pytest.raises(ConfigError, match=r"integer seed in 0\.\.2\*\*64 - 1.*, got "):
                call(bad)
    # seeds beyond 32 bits reach scikit-learn's split as a seeded RandomState: the same split each time
    a = load_dataset(f"file:{path}", seed=2**40 + 3).meta["test_indices"]
    b = load_dataset(f"file:{path}", seed=2**40 + 3).meta["test_indices"]
    c = load_dataset(f"file:{path}", seed=MAX_SEED).meta["test_indices"]
    assert a == b and len(c) == len(a)


# ---------------------------------------------------------------- types
def _bad_arrays(shape):
    real = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1.0
    return {
        "complex": (real + 0j, "complex"),
        "complex with imaginary part": (real + 1j, "complex"),
        "object": (real.astype(object), "dtype object"),
        "bool": (real > 2, "got dtype bool"),
        "text": (real.astype(str), "got dtype <U"),
        "extended precision": (real.astype(np.longdouble), "float64 would round"),
        "timedelta": (real.astype("m8[s]"), "got dtype timedelta64"),
    }


@pytest.mark.parametrize("kind", list(_bad_arrays((2, 2))))
def test_client_statistics_of_the_wrong_type_are_refused_not_cast(kind):
    counts, why = _bad_arrays((2, 3))[kind]
    if np.dtype(counts.dtype).itemsize > 8 and counts.dtype.kind == "f" and np.finfo(counts.dtype).bits <= 64:
        pytest.skip("this platform's longdouble is float64")
    sums = np.ones((2, 3, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning or any other cast warning on the way
        with pytest.raises(InputError, match=f"ClientStats.counts .*{why}"):
            ClientStats(counts=counts, sums=sums)
        with pytest.raises(InputError, match=f"ClientStats.sums .*{why}"):
            ClientStats(counts=np.ones((2, 3)), sums=_bad_arrays((2, 3, 2))[kind][0])
        with pytest.raises(InputError, match=f"ClientStats.second .*{why}"):
            ClientStats(counts=np.ones((2, 3)), sums=sums, second=_bad_arrays((2, 2, 2))[kind][0])


def test_integer_statistics_are_exact_and_huge_ones_refused():
    st = ClientStats(counts=np.array([[3, 4]]), sums=np.arange(4).reshape(1, 2, 2))
    assert st.counts.dtype == np.float64 and st.sums[0, 1, 1] == 3.0
    with pytest.raises(InputError, match="beyond 2\\*\\*53"):
        ClientStats(counts=np.array([[2**60, 1]]), sums=np.zeros((1, 2, 2)))


def test_fractional_ids_are_refused_not_truncated():
    with pytest.raises(InputError, match="pair_client must hold whole numbers"):
        ClientStats.from_pairs(
            num_clients=2,
            num_classes=2,
            pair_client=[0.0, 1.7],
            pair_class=[0, 1],
            pair_counts=[1.0, 1.0],
            pair_sums=np.ones((2, 2)),
        )
    with pytest.raises(InputError, match="ClientStats.owners must hold whole numbers"):
        ClientStats(counts=np.ones((2, 2)), sums=np.ones((2, 2, 1)), owners=[0.0, 1.5])
    with pytest.raises(InputError, match="weights must hold real numbers|weights .*complex"):
        ClientStats(counts=np.ones((2, 2)), sums=np.ones((2, 2, 1))).scale_clients(np.array([1 + 1j, 1]))
    with pytest.raises(InputError, match="Partition.clients must hold whole numbers"):
        Partition(np.array([0.0, 1.7]), 2, "natural")


@pytest.mark.parametrize("kind", ["complex", "object", "bool", "text", "timedelta"])
def test_fit_refuses_features_and_ids_of_the_wrong_type(kind):
    F, why = _bad_arrays((6, 2))[kind]
    y = np.arange(6) % 2
    for privacy in (None, GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)):
        kw = {} if privacy is None else {"num_classes": 2, "num_clients": 1}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(InputError, match=f"features .*{why}"):
                privfed.fit("fedncm", F, y, privacy=privacy, **kw)
    ids = _bad_arrays((6,))[kind][0]
    with pytest.raises(InputError, match="labels must be integers"):
        privfed.fit("fedncm", np.ones((6, 2)), ids)
    with pytest.raises(InputError, match="clients must be integers"):
        privfed.fit("fedncm", np.eye(6, 2), y, ids)


@pytest.mark.parametrize("kind", ["complex", "bool", "extended precision"])
def test_a_feature_file_of_the_wrong_type_is_refused(tmp_path, kind):
    F, why = _bad_arrays((10, 2))[kind]
    path = tmp_path / "f.npz"
    np.savez(path, features=F, labels=np.arange(10) % 2)
    with pytest.raises(InputError, match=f"feature file .*'features' .*{why}"):
        load_feature_file(path)
    np.savez(path, features=np.ones((10, 2)), labels=(np.arange(10) % 2).astype(bool))
    with pytest.raises(InputError, match="'labels' must hold integers, got dtype bool"):
        load_feature_file(path)


def test_the_estimator_refuses_complex_data_in_one_line():
    from privfed.estimators import FederatedHeadClassifier

    X = np.random.default_rng(0).normal(size=(12, 2))
    y = np.arange(12) % 2
    for Xb, yb, name in ((X + 1j, y, "X"), (X, y + 0j, "y")):
        with pytest.raises(InputError, match=f"^{name} is complex .*Complex data not supported") as info:
            FederatedHeadClassifier("fedncm").fit(Xb, yb)
        assert "\n" not in str(info.value)
    est = FederatedHeadClassifier("fedncm").fit(X, y)
    if np.finfo(np.longdouble).bits > 64:  # extended precision: float64 would round it
        with pytest.raises(InputError, match="float64 would round"):
            est.predict(X.astype(np.longdouble))


# ---------------------------------------------------------------- one reading of the dense-view limit
def test_fit_refuses_a_malformed_dense_view_limit_like_the_commands():
    code = (
        "import numpy as np, privfed\n"
        "from privfed.errors import ConfigError\n"
        "F = np.random.default_rng(0).normal(size=(24, 3)); y = np.arange(24) % 2; k = np.arange(24) % 3\n"
        "for m in privfed.methods.available():\n"
        "    try:\n"
        "        privfed.fit(m, F, y, k); print(m, 'head')\n"
        "    except ConfigError as e:\n"
        "        print(m, 'refused', e)\n"
    )
    env = {**os.environ, "PRIVFED_DENSE_VIEW_LIMIT": "abc"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(privfed.methods.available()) == 7, out.stdout + out.stderr
    for line in lines:
        assert (
            " refused $PRIVFED_DENSE_VIEW_LIMIT must be a positive number of bytes" in line
            and "'abc'" in line
        )


def test_an_assigned_dense_view_limit_is_read_through_the_same_function(monkeypatch):
    import privfed.stats

    F = np.random.default_rng(0).normal(size=(24, 3))
    y, k = np.arange(24) % 2, np.arange(24) % 3
    monkeypatch.setattr(privfed.stats, "DENSE_VIEW_LIMIT", -5)
    with pytest.raises(ConfigError, match="DENSE_VIEW_LIMIT must be a positive number of bytes, got -5"):
        privfed.fit("fedncm", F, y, k)
    # the secure-sum stage reads it through the same function (it compared the raw attribute)
    from privfed.release.stages import check_secure_size

    st = compute_client_stats(F, y, k)
    with pytest.raises(ConfigError, match="got -5"):
        check_secure_size(privfed.methods.get("fedncm"), st)
    monkeypatch.setattr(privfed.stats, "DENSE_VIEW_LIMIT", 100)
    with pytest.raises(
        InputError, match="secure aggregation in one process masks every client's whole upload"
    ):
        check_secure_size(privfed.methods.get("fedncm"), st)


@pytest.mark.parametrize("value", ["no", "False", "0", 1, None])
def test_a_trusted_aggregator_that_is_not_a_bool_is_refused(value):
    """Any non-empty string is truthy: "no" turned central DP on (the server then sees every exact upload)."""
    with pytest.raises(ConfigError, match=r"trusted_aggregator must be True or False, got"):
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, trusted_aggregator=value)
    assert GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=1.0, trusted_aggregator=np.True_
    ).trusted_aggregator


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 3.0, "3", True, 0, 1])
def test_a_masking_threshold_that_is_not_an_integer_of_two_or_more_is_one_line(value):
    with pytest.raises(ConfigError, match=r"threshold must be an integer >= 2 or None, got"):
        PairwiseMasking(threshold=value)
    assert PairwiseMasking(threshold=np.int64(3)).threshold == 3


def test_a_client_id_below_minus_one_is_refused_by_the_attacks_not_dropped():
    """-1 marks a sample that was not uploaded; -2 is a mistake, and was silently dropped like -1."""
    import attacks

    rng = np.random.default_rng(0)
    F, y, k = rng.normal(size=(120, 6)), rng.integers(0, 3, 120), rng.integers(0, 10, 120)
    with pytest.raises(InputError, match=r"clients: id -2 is below -1"):
        attacks.evaluate_federation("labels", "fedncm", F, y, np.where(np.arange(120) < 5, -2, k), rng=0)
    out = attacks.evaluate_federation("labels", "fedncm", F, y, np.where(np.arange(120) < 5, -1, k), rng=0)
    assert isinstance(out, dict) and out


@pytest.mark.parametrize("flag", ["active", "keep_view"])
def test_masked_sum_switches_that_are_not_bools_are_refused(flag):
    with pytest.raises(ConfigError, match=rf"{flag} must be True or False, got 'no'"):
        masked_sum(np.ones((3, 2)), **{flag: "no"})


def test_one_generator_check_names_the_argument_and_how_to_make_one():
    """Every call that draws simulation randomness takes a numpy Generator through one check: a seed, a legacy
    RandomState or None (where not optional) is refused naming the argument; a Generator passes as itself."""
    from privfed._validation.seeds import check_generator

    g = np.random.default_rng(0)
    assert check_generator(g) is g and check_generator(None, optional=True) is None
    for bad in (0, np.random.RandomState(0), None, "rng"):
        with pytest.raises(ConfigError, match=r"^noise_rng must be a numpy.random.Generator \(np.random"):
            check_generator(bad, "noise_rng")
    with pytest.raises(ConfigError, match=r"must be a numpy.random.Generator or None .*got int$"):
        check_generator(3, optional=True)


def test_a_private_fit_of_no_records_still_checks_its_labels_and_clients():
    """With 0 rows the labels and clients were never read: four labels (one a string) and a client id past K
    were taken without a word.  Empty ones fit (a private release of nothing is allowed)."""
    import privfed
    from mechanisms import GaussianMechanism

    dp = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=3.0, backend="numpy")
    kw = dict(num_classes=3, num_clients=4, privacy=dp, random_state=0)
    with pytest.raises(InputError, match="^labels has 4 entries but features has 0 rows"):
        privfed.fit("fedncm", np.zeros((0, 5)), [7, 8, 9, "a"], [], **kw)
    with pytest.raises(InputError, match="^clients has 1 entries but features has 0 rows"):
        privfed.fit("fedncm", np.zeros((0, 5)), [], [99], **kw)
    head = privfed.fit("fedncm", np.zeros((0, 5)), np.zeros(0, int), np.zeros(0, int), **kw)
    assert head.privacy is not None


def test_nan_features_at_prediction_say_predicting_not_fitting():
    import privfed

    rng = np.random.default_rng(0)
    head = privfed.fit("fedncm", rng.normal(size=(30, 4)), np.arange(30) % 3)
    bad = rng.normal(size=(5, 4))
    bad[2, 1] = np.nan
    with pytest.raises(
        InputError, match=r"\(first in row 2\); remove or impute those samples before predicting$"
    ):
        head.predict(bad)
    with pytest.raises(InputError, match="before fitting$"):
        privfed.fit("fedncm", bad, np.arange(5) % 3)
