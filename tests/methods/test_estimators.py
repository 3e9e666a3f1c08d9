"""scikit-learn estimator contract of FederatedHeadClassifier."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import estimator_checks_generator

import privfed
from privfed import methods
from privfed.errors import ConfigError
from privfed.estimators import FederatedHeadClassifier, iid_clients

ESTIMATORS = [FederatedHeadClassifier(m) for m in methods.available()] + [
    FederatedHeadClassifier("fedcof", clients=3, random_state=0),
    FederatedHeadClassifier("fedcof", {"means_per_client": 2, "gamma": 0.1}, clients=2, random_state=1),
]


def _checks():
    """Every scikit-learn check that applies.  Left out: the array-API input check (the
    estimators compute in numpy float64 on the server by design and do not claim array-API
    support, so scikit-learn would only skip it)."""
    for est in ESTIMATORS:
        for e, check in estimator_checks_generator(est, legacy=True):
            name = getattr(check, "func", check).__name__
            if name != "check_array_api_input":
                yield pytest.param(e, check, id=f"{e!r}-{name}")


@pytest.mark.parametrize("estimator, check", list(_checks()))
def test_sklearn_compatible(estimator, check):
    check(estimator)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    means = 3 * rng.normal(size=(3, 5))
    y = rng.integers(0, 3, 300)
    return means[y] + rng.normal(size=(300, 5)), y


@pytest.mark.parametrize("name", methods.available())
def test_same_head_as_fit(name):
    X, y = _data()
    k = iid_clients(300, 6, np.random.default_rng(0))
    clf = FederatedHeadClassifier(name).fit(X, y, clients=k)
    h = privfed.fit(name, X, y, k)
    np.testing.assert_array_equal(clf.coef_, h.weight)
    np.testing.assert_array_equal(clf.intercept_, h.bias)
    assert clf.head_.method == name
    assert clf.score(X, y) == pytest.approx(h.score(X, y))


def test_arbitrary_labels_mapped_through_classes_():
    X, y = _data(1)
    names = np.array(["zebra", "ant", "moth"])
    clf = FederatedHeadClassifier("fed3r", clients=4, random_state=0).fit(X, names[y])
    assert clf.classes_.tolist() == ["ant", "moth", "zebra"]
    ref = FederatedHeadClassifier("fed3r", clients=4, random_state=0).fit(X, y)
    order = np.argsort(names)  # class index of "ant", "moth", "zebra" in y
    np.testing.assert_allclose(clf.coef_, ref.coef_[order])
    np.testing.assert_array_equal(clf.predict(X), names[ref.predict(X)])
    assert clf.decision_function(X).shape == (300, 3)
    np.testing.assert_allclose(clf.predict_proba(X).sum(axis=1), 1.0)


def test_binary_decision_function_is_a_margin():
    X, y = _data(2)
    yb = (y == 0).astype(int)
    clf = FederatedHeadClassifier("fedcgs").fit(X, yb)
    s = clf.head_.decision_function(X)
    np.testing.assert_allclose(clf.decision_function(X), s[:, 1] - s[:, 0])


def test_clients_parameter_forms():
    X, y = _data(3)
    a = FederatedHeadClassifier("fedcof", clients=5, random_state=7).fit(X, y)
    b = FederatedHeadClassifier("fedcof", clients=5, random_state=7).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)  # reproducible from random_state
    assert not any("one client" in n for n in a.head_.notes)
    one = FederatedHeadClassifier("fedcof").fit(X, y)  # centralised: each class one mean
    assert any("seen by one client" in n for n in one.head_.notes)
    by_label = FederatedHeadClassifier(
        "fedcof", clients=lambda yy, rng: rng.integers(0, 4, yy.size), random_state=0
    ).fit(X, y)
    assert by_label.head_.upload_bytes["K"] == 4
    with pytest.raises(ConfigError, match="clients must be None, an int"):
        FederatedHeadClassifier("fedcof", clients="iid").fit(X, y)
    with pytest.raises(ConfigError, match="unknown parameter"):
        FederatedHeadClassifier("fedcof", {"lam": 1.0}).fit(X, y)


def test_works_in_pipelines_and_cross_validation():
    X, y = _data(4)
    pipe = make_pipeline(
        StandardScaler(), FederatedHeadClassifier("fedcof", {"gamma": 0.1}, clients=6, random_state=0)
    )
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.min() > 0.9
    c = clone(FederatedHeadClassifier("fedlog", {"nu": 2.0}, clients=3))
    assert c.get_params()["method_params"] == {"nu": 2.0}


def test_iid_clients_nonempty():
    ids = iid_clients(10, 4, np.random.default_rng(0))
    assert np.bincount(ids).min() >= 2 and ids.max() == 3
    assert iid_clients(3, 10, np.random.default_rng(0)).max() == 2
    with pytest.raises(ConfigError, match=r"n_clients must be an int >= 1, got 0"):
        iid_clients(10, 0, np.random.default_rng(0))  # was one client, where 0 were asked
    with pytest.raises(ConfigError, match=r"got 2\.7"):
        iid_clients(10, 2.7, np.random.default_rng(0))  # was 2
    np.testing.assert_array_equal(iid_clients(10, 3, 5), iid_clients(10, 3, np.random.default_rng(5)))


def _blobs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    return X, (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)


def test_a_failed_refit_leaves_the_earlier_fit_whole():
    """A re-fit refused midway set classes_ (and n_features_in_) and kept the old head: the old model then
    answered with the new labels, or refused both widths."""
    X, y = _blobs()
    clf = FederatedHeadClassifier("fedcof", clients=3).fit(X, y)
    want = clf.predict(X)
    with pytest.raises(privfed.errors.InputError, match="clients has 119 entries"):
        clf.fit(X[:, :3], np.array(["cat", "dog", "eel"])[y], clients=np.zeros(119, int))
    assert clf.classes_.tolist() == [0, 1, 2] and clf.n_features_in_ == 5
    np.testing.assert_array_equal(clf.predict(X), want)
    fresh = FederatedHeadClassifier("fedcof")
    with pytest.raises(privfed.errors.InputError):
        fresh.fit(X, y, clients=np.zeros(3, int))
    assert not [k for k in vars(fresh) if k.endswith("_")]  # nothing fitted is left behind


def test_client_ids_without_privacy_only_group_the_samples():
    """Ids had to be exactly 0..K-1: a fold holding out whole clients (GroupKFold) failed to fit."""
    from sklearn.model_selection import GroupKFold

    X, y = _blobs()
    k = np.arange(120) % 4
    scores = cross_val_score(
        FederatedHeadClassifier("fedcof"), X, y, cv=GroupKFold(4), groups=k, params={"clients": k}
    )
    assert np.isfinite(scores).all()
    a = FederatedHeadClassifier("fedcof").fit(X, y, clients=np.array([10, 20, 30])[k % 3])
    b = FederatedHeadClassifier("fedcof").fit(X, y, clients=k % 3)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    # a public number of clients keeps the ids as given: 0..K-1, each with data
    with pytest.raises(privfed.errors.InputError, match=r"client\(s\) \[2, 3, 4, 5, 6\] have no data"):
        FederatedHeadClassifier("fedcof", num_clients=8).fit(X, y, clients=np.array([0, 1, 7])[k % 3])


def test_input_the_estimator_would_misread_is_refused():
    X, y = _blobs()
    with pytest.raises(privfed.errors.InputError, match="masked array; its mask would be ignored"):
        FederatedHeadClassifier("fedncm").fit(np.ma.masked_greater(X, 1.0), y)
    clf = FederatedHeadClassifier("fedncm").fit(X, y)
    with pytest.raises(privfed.errors.InputError, match="masked array"):
        clf.predict(np.ma.masked_greater(X, 1.0))
    for spec in (np.float64(3), 1.5, True, np.array(3)):  # was a TypeError (no len())
        with pytest.raises(ConfigError, match="classes must be distinct labels"):
            FederatedHeadClassifier("fedcof", classes=spec).fit(X, y)
    with pytest.raises(
        privfed.errors.InputError, match=r"classes=\['a', 'b', 'c', 'z'\] names \['z'\] with no sample"
    ):
        FederatedHeadClassifier("fedcof", classes=["a", "b", "c", "z"]).fit(X, np.array(list("abc"))[y])


def test_scores_beyond_float64_are_refused_not_inf_or_nan():
    """Finite features of 1.7e308 gave scores of +-inf, probabilities of NaN and numpy warnings."""
    import warnings

    X, y = _blobs()
    clf = FederatedHeadClassifier("fedcof", clients=3).fit(X, y)
    big = np.vstack([X[:1], np.full((1, 5), 1.7e308)])
    for call in (clf.decision_function, clf.predict_proba, clf.predict, clf.head_.predict_proba):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(
                privfed.errors.InputError, match=r"row\(s\) \[1\] give scores beyond the float64"
            ):
                call(big)
    assert np.isfinite(clf.predict_proba(X * 1e3)).all()  # large, representable scores stay numbers


def test_a_refused_set_params_leaves_the_mechanism_as_it_was():
    """set_params(epsilon=0.5, clip=-1) recorded epsilon 0.5 and kept the noise of epsilon 2."""
    from mechanisms import GaussianMechanism

    mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=5.0)
    sigma = mech.sigma
    est = FederatedHeadClassifier("fedlog", clients=3, classes=2, random_state=0, privacy=mech)
    with pytest.raises(ConfigError, match="clip must be > 0"):
        est.set_params(privacy__epsilon=0.5, privacy__clip=-1.0)
    assert est.get_params()["privacy__epsilon"] == mech.epsilon == 2.0 and mech.sigma == sigma
    clone(est)  # still clones
    est.set_params(privacy__epsilon=0.5)
    assert mech.epsilon == 0.5 and mech.sigma["sums"] > sigma["sums"]


def test_each_fit_starts_from_a_mechanism_that_released_nothing():
    """A mechanism used before carried its releases into the fit's guarantee (2 releases, epsilon 1.466)."""
    from mechanisms import GaussianMechanism

    X, y = _blobs()
    y2 = (y > 0).astype(int)
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=5.0)
    privfed.fit("fedlog", X, y2, privacy=mech, num_classes=2, random_state=0)
    head = FederatedHeadClassifier("fedlog", classes=2, privacy=mech, random_state=0).fit(X, y2).head_
    assert "(1, 1e-05)-DP" in head.privacy.guarantee and "over 1 release(s)" in head.privacy.guarantee
