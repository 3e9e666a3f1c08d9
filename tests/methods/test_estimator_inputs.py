"""The estimator's inputs as a user passes them: coef_ over the user's own features, client ids a partition
marks as left out, a number of clients with no ids, secure aggregation of one client, and the helpers and
hand-built heads around it."""

from __future__ import annotations

import numpy as np
import pytest

import privfed
from mechanisms.secagg.protection import PairwiseMasking
from privfed.errors import ConfigError, InputError
from privfed.estimators import FederatedHeadClassifier, iid_clients
from privfed.federation import partition
from privfed.head import LinearHead


def _data(n=200, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] + X[:, 1] > 0).astype(int) + (X[:, 2] > 0.5)
    return X, y


@pytest.mark.parametrize("factor", [1e200, 1e-200])
@pytest.mark.parametrize("method", ["fedcgs", "fedncm"])
def test_coef_scores_the_features_as_given_when_they_were_rescaled(method, factor):
    X, y = _data()
    Xs = X * factor
    clf = FederatedHeadClassifier(method).fit(Xs, y)
    assert clf.head_.extras["feature_exponent"] != 0  # the run did rescale (else this tests nothing)
    # the head scores Xs 2^-e: coef_ is its weight over Xs itself, exactly (a power of two)
    e = clf.head_.extras["feature_exponent"]
    np.testing.assert_array_equal(clf.coef_, np.ldexp(clf.head_.weight, -e))
    manual = Xs @ clf.coef_.T + clf.intercept_
    np.testing.assert_allclose(manual, clf.head_.decision_function(Xs), rtol=1e-12, atol=1e-12)
    # ... and the classes it picks are predict's, up to the last bit of rounding between the two orders
    assert np.mean(np.argmax(manual, axis=1) == np.argmax(clf.head_.decision_function(Xs), axis=1)) == 1.0


def test_coef_of_features_of_mixed_scales_scores_them_to_the_last_bit_that_matters():
    """Columns at 1e300 and 1e150: the second column's weights fall below the smallest normal float once folded
    (each then moves by at most 2^-1075, its term in a score by less than 2^-51): coef_ is still the
    weight over the features as given, not the rescaled one (which is off by 2^e)."""
    X, y = _data()
    Xs = X * np.array([1e300, 1e150, 1e300, 1e300])
    clf = FederatedHeadClassifier("fedcgs").fit(Xs, y)
    e = clf.head_.extras["feature_exponent"]
    scores = clf.head_.decision_function(Xs)
    manual = Xs @ clf.coef_.T + clf.intercept_
    # the products are the head's own but for the underflowed entries: d terms, each within 2^-51
    np.testing.assert_allclose(manual, scores, rtol=0, atol=Xs.shape[1] * 2.0**-51)
    assert np.abs(np.ldexp(clf.head_.weight, -e)).min() < np.finfo(float).tiny  # some entries did underflow
    assert np.mean(np.argmax(manual, axis=1) == clf.predict(Xs)) == 1.0


def test_coef_is_the_head_weight_when_nothing_was_rescaled():
    X, y = _data()
    clf = FederatedHeadClassifier("fedcgs").fit(X, y)
    assert "feature_exponent" not in clf.head_.extras and clf.coef_ is clf.head_.weight


def test_negative_client_ids_are_refused_not_made_a_client():
    X, y = _data(103, 5)
    part = partition(y, 10, "dirichlet", rng=0)
    assert part.dropped.size  # the partition left samples out (-1), else nothing is tested
    with pytest.raises(InputError, match=r"clients holds -1, which marks the samples a partition left out"):
        FederatedHeadClassifier("fedcof").fit(X, y, clients=part.clients)
    Xa, ya, ka = part.apply(X, y)
    assert FederatedHeadClassifier("fedcof").fit(Xa, ya, clients=ka).head_.upload_bytes["K"] == 10
    # any other integers only group the samples: hashed ids, negative or past int64, are renumbered
    for ids in (ka * 1000 - 9123, ka.astype(np.uint64) + np.uint64(2**63)):
        assert FederatedHeadClassifier("fedcof").fit(Xa, ya, clients=ids).head_.upload_bytes["K"] == 10


def test_masked_client_ids_are_refused_not_read_under_the_mask():
    X, y = _data(120, 5)
    ids = np.arange(120) % 6
    with pytest.raises(InputError, match="clients"):
        FederatedHeadClassifier("fedcof").fit(X, y, clients=np.ma.array(ids, mask=ids == 0))


def test_whole_float_client_ids_are_renumbered_as_int_ones():
    X, y = _data(120, 5)
    ids = np.arange(120) % 4 * 2  # clients 0, 2, 4, 6: a fold missing the odd ones
    as_int = FederatedHeadClassifier("fedcof").fit(X, y, clients=ids)
    as_float = FederatedHeadClassifier("fedcof").fit(X, y, clients=ids.astype(float))
    np.testing.assert_array_equal(as_int.coef_, as_float.coef_)
    with pytest.raises(InputError, match="whole numbers"):
        FederatedHeadClassifier("fedcof").fit(X, y, clients=ids + 0.5)


def test_num_clients_without_client_ids_is_refused():
    X, y = _data(120, 5)
    with pytest.raises(ConfigError, match="num_clients=5 but no clients were given"):
        FederatedHeadClassifier("fedcof", num_clients=5).fit(X, y)
    # one client is what no ids mean: accepted
    assert FederatedHeadClassifier("fedcof", num_clients=1).fit(X, y).head_.upload_bytes["K"] == 1


@pytest.mark.parametrize("clients", [None, 1])
def test_secure_aggregation_of_one_client_is_refused_before_any_work(clients):
    X, y = _data(30, 3)
    clf = FederatedHeadClassifier("fedncm", secure_agg=PairwiseMasking(), random_state=0, clients=clients)
    with pytest.raises(InputError, match="secure_agg sums the uploads of K >= 2 clients, but this run has 1"):
        clf.fit(X, y)
    with pytest.raises(InputError, match="K >= 2 clients"):
        privfed.fit("fedncm", X, y, secure_agg=PairwiseMasking(), random_state=0)


@pytest.mark.parametrize(
    "n, rng, match",
    [(5.0, 0, "n_samples must be an int >= 0, got 5.0"), (-5, 0, "n_samples"), (5, "x", "rng must be None")],
)
def test_iid_clients_names_the_bad_argument(n, rng, match):
    with pytest.raises(ConfigError, match=match):
        iid_clients(n, 3, rng)


def test_iid_clients_splits_every_sample_into_non_empty_clients():
    ids = iid_clients(10, 3, 0)
    assert sorted(np.bincount(ids).tolist()) == [3, 3, 4]
    assert iid_clients(0, 3, 0).size == 0


def test_a_hand_built_head_names_its_bad_numbers():
    with pytest.raises(InputError, match="must be finite"):
        LinearHead(np.full((2, 3), np.nan), np.zeros(2))
    with pytest.raises(InputError, match="weight must hold real numbers"):
        LinearHead([["a"]], [0])
    for weight in ([["1.5", "2"]], np.ones((1, 2), bool)):
        with pytest.raises(InputError, match="weight must hold real numbers, got dtype"):
            LinearHead(weight, [0.0])
    with pytest.raises(InputError, match=r"weight is complex .* the imaginary part would be lost"):
        LinearHead(np.ones((1, 2), complex), [0.0])
    with pytest.raises(InputError, match="must be finite"):  # a name of the caller's own, not a method's
        LinearHead(np.full((2, 3), np.nan), np.zeros(2), method="custom")
    with pytest.raises(InputError, match=r"weight must be \(C, d\)"):
        LinearHead(np.zeros((2, 3)), np.zeros(3))
    # a method's head with NaN is the method's fault, and says so; a method's name alone makes no method's head
    with pytest.raises(FloatingPointError, match="this is a bug"):
        LinearHead(np.full((2, 3), np.nan), np.zeros(2), method="fedncm", made_by_method=True)
    with pytest.raises(InputError, match="must be finite"):
        LinearHead(np.full((2, 3), np.nan), np.zeros(2), method="fedncm")


def test_lbfgs_that_stops_short_says_so_and_a_converged_one_does_not():
    rng = np.random.default_rng(0)
    y = np.arange(200) % 4
    X = rng.normal(size=(200, 6)) + y[:, None]
    k = np.arange(200) % 5
    short = privfed.fit("fedlog", X, y, k, nu=1e10, solver="lbfgs")
    exact = privfed.fit("fedlog", X, y, k, nu=1e10)
    assert any("stopped short of Eq. 15's maximum" in n for n in short.notes)
    # the note is about a real gap: the weights differ from the exact MAP far beyond rounding
    assert np.abs(short.weight - exact.weight).max() > 1e-6 * np.abs(exact.weight).max()
    done = privfed.fit("fedlog", X, y, k, solver="lbfgs")
    assert not any("stopped short" in n for n in done.notes)
    assert not any("stopped short" in n for n in exact.notes)


def test_classes_mixing_text_and_numbers_are_named_not_misread():
    """Before: np.asarray turned classes=[0, 'a'] into ['0', 'a'] and the error said y's 0 was not in them."""
    X = np.random.default_rng(0).normal(size=(30, 3))
    with pytest.raises(ConfigError, match=r"classes=\[0, 'a'\] mixes text and other labels"):
        FederatedHeadClassifier("fedncm", classes=[0, "a"]).fit(X, np.array([0, 1] * 15))
    clf = FederatedHeadClassifier("fedncm", classes=["a", "b"]).fit(X, np.array(["a", "b"] * 15))
    assert clf.classes_.tolist() == ["a", "b"]


def test_a_clients_callable_reads_its_ids_as_fit_reads_its_clients_argument():
    """Before: the callable's ids were not renumbered (ids 0, 5, 10 failed with 'client(s) [1, 2, ...] have no
    data' where fit(clients=) renumbered them), and a callable of another signature was a raw TypeError."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 3)), np.arange(30) % 3
    ids = np.arange(30) % 3 * 5
    given = FederatedHeadClassifier("fedcof").fit(X, y, clients=ids)
    called = FederatedHeadClassifier("fedcof", clients=lambda y, rng: ids).fit(X, y)
    np.testing.assert_array_equal(called.coef_, given.coef_)
    with pytest.raises(ConfigError, match=r"clients must be a callable \(y, rng\) -> ids"):
        FederatedHeadClassifier("fedcof", clients=lambda y: ids).fit(X, y)
    with pytest.raises(ConfigError, match="returned None"):
        FederatedHeadClassifier("fedcof", clients=lambda y, rng: None).fit(X, y)


def test_num_clients_without_clients_says_no_clients_were_given():
    X, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    with pytest.raises(
        InputError, match=r"num_clients=2 but no clients were given \(every sample on one client\)"
    ):
        privfed.fit("fedncm", X, y, None, num_clients=2)
    with pytest.raises(InputError, match=r"num_clients=5 but clients numbers 2 client\(s\), 0\.\.1"):
        privfed.fit("fedncm", X, y, np.arange(20) % 2, num_clients=5)


def test_a_head_without_classes_or_with_a_transform_that_is_no_function_is_refused_when_made():
    """Before: both were accepted, and predict then raised numpy's 'argmax of an empty sequence' or
    "'int' object is not callable"."""
    with pytest.raises(InputError, match=r"C >= 1 classes, got \(0, 4\)"):
        LinearHead(np.ones((0, 4)), np.ones(0))
    with pytest.raises(InputError, match="feature_transform must be a callable"):
        LinearHead(np.ones((2, 4)), np.zeros(2), feature_transform=5)
    head = LinearHead(np.eye(2, 4), np.zeros(2), feature_transform=lambda F: 2 * F)
    assert head.predict(np.eye(2, 4)).tolist() == [0, 1]


def test_a_head_whose_transform_leaves_its_feature_space_says_so():
    """Before: numpy's matmul ValueError from decision_function."""
    from privfed.head import LinearHead

    head = LinearHead(np.ones((2, 3)), np.zeros(2), feature_transform=lambda f: f[:, :2])
    with pytest.raises(
        InputError, match=r"feature_transform returned shape \(1, 2\) for 1 rows, not \(1, 3\)"
    ):
        head.predict(np.ones((1, 3)))
    assert LinearHead(np.eye(3)[:2], np.zeros(2), feature_transform=lambda f: 2 * f).predict(
        np.eye(3)[[1]]
    ) == [1]
