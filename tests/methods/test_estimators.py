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
