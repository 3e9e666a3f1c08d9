"""Mechanisms and protections are scikit-learn parameters of the estimator: get_params / set_params nested,
clone, and a grid search over ``privacy__epsilon`` that fits one fresh mechanism per candidate."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV

from mechanisms import GaussianMechanism, LaplaceCountNoise
from mechanisms.secagg.protection import PairwiseMasking
from privfed.errors import ConfigError
from privfed.estimators import FederatedHeadClassifier


def test_mechanism_parameters_are_its_constructor_arguments():
    mech = GaussianMechanism(epsilon=2, delta=1e-5, clip=31.4, blocks=("sums", "counts"))
    p = mech.get_params()
    assert (
        p["epsilon"] == 2 and p["clip"] == 31.4 and p["level"] == "record" and p["noise_multiplier"] is None
    )
    copy = clone(mech)
    assert type(copy) is GaussianMechanism and copy is not mech and copy.get_params() == p
    assert copy.sigma == mech.sigma  # the same calibration, rebuilt from the arguments
    mech.set_params(epsilon=4.0)
    assert mech.epsilon == 4.0 and mech.sigma["sums"] < copy.sigma["sums"]  # recalibrated: less noise
    with pytest.raises(ConfigError, match="no parameter 'epsilonn'"):
        mech.set_params(epsilonn=1)
    with pytest.raises(ConfigError, match="delta"):  # the constructor's checks run again
        mech.set_params(delta=2.0)
    lap = LaplaceCountNoise(epsilon=0.5)
    assert clone(lap).get_params() == {"epsilon": 0.5, "backend": None}
    mask = PairwiseMasking(neighbours=4)
    assert clone(mask).get_params()["neighbours"] == 4


def test_a_mechanism_that_has_released_refuses_new_parameters():
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    rng = np.random.default_rng(0)
    mech.release(rng.normal(size=(5, 3)), np.arange(5) % 2, rng=rng, num_classes=2)
    with pytest.raises(ConfigError, match="released already"):
        mech.set_params(epsilon=2.0)
    assert len(clone(mech).ledger) == 0  # a clone is a new, unused mechanism


def test_nested_parameters_of_the_estimator(digits_dataset):
    clf = FederatedHeadClassifier(
        "fedlog",
        clients=10,
        classes=10,
        privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=31.4),
        secure_agg=PairwiseMasking(),
    )
    params = clf.get_params(deep=True)
    assert params["privacy__epsilon"] == 1.0 and params["secure_agg__frac_bits"] == 32
    clf.set_params(privacy__epsilon=8.0, secure_agg__frac_bits=30)
    assert clf.privacy.epsilon == 8.0 and clf.secure_agg.get_params()["frac_bits"] == 30
    twin = clone(clf)
    assert twin.privacy is not clf.privacy and twin.get_params(deep=True)["privacy__epsilon"] == 8.0


def test_grid_search_over_the_budget(digits_dataset):
    """GridSearchCV over privacy__epsilon: every candidate fits with its own mechanism; more budget, less noise."""
    ds = digits_dataset
    est = FederatedHeadClassifier(
        "fedlog",
        clients=10,
        classes=10,
        random_state=0,
        privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=31.4, trusted_aggregator=True),
    )
    grid = GridSearchCV(est, {"privacy__epsilon": [0.05, 50.0]}, cv=3).fit(ds.train_features, ds.train_labels)
    assert grid.best_params_ == {"privacy__epsilon": 50.0}
    scores = grid.cv_results_["mean_test_score"]
    assert (
        scores[1] > scores[0] + 0.3
    )  # sigma at eps 0.05 is 1000x that at eps 50: near chance vs a real head
    assert grid.best_estimator_.head_.privacy.epsilon == pytest.approx(50.0, rel=1e-9)
    assert est.privacy.epsilon == 1.0 and len(est.privacy.ledger) == 0  # the grid used clones


def test_set_params_sets_one_method_parameter_on_a_copy_and_a_grid_searches_it(digits_dataset):
    """method_params__lam used to end in AttributeError ('dict' has no set_params); it now sets one key of a
    copy of the dict (the caller's is untouched), as a grid search over it needs."""
    given = {"lam": 3.0, "bias": False}
    est = FederatedHeadClassifier("fed3r", method_params=given).set_params(method_params__lam=5.0)
    assert est.method_params == {"lam": 5.0, "bias": False} and given == {"lam": 3.0, "bias": False}
    both = FederatedHeadClassifier("fed3r").set_params(method_params={"bias": False}, method_params__lam=2.0)
    assert both.method_params == {"bias": False, "lam": 2.0}
    with pytest.raises(ConfigError, match=r"method_params__lam sets a key of method_params, which is"):
        FederatedHeadClassifier("fed3r", method_params="lam=3").set_params(method_params__lam=5.0)
    X, y = digits_dataset.train_features[:600], digits_dataset.train_labels[:600]
    grid = GridSearchCV(FederatedHeadClassifier("fed3r"), {"method_params__lam": [1e-3, 1e3]}, cv=2).fit(X, y)
    lams = [p["method_params__lam"] for p in grid.cv_results_["params"]]
    assert lams == [1e-3, 1e3]
    scores = grid.cv_results_["mean_test_score"]
    assert scores[0] != scores[1]  # the parameter reached the method: a ridge of 1e3 changes the head


@pytest.mark.parametrize(
    "method", ["fed3r", "fed3r-within", "fedcgs", "fedcof", "fedcof-oracle", "fedlog", "fedncm"]
)
def test_the_estimator_passes_scikit_learns_own_estimator_checks(method):
    """scikit-learn's check_estimator (cloning, fitting on odd inputs, pickling, n_features_in_, classes_,
    errors for unfitted and wrongly shaped calls ...) on every method: what a Pipeline or a grid search
    relies on beyond get_params/set_params."""
    import warnings

    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checks' skip notices (array API) and the methods' own notes
        check_estimator(FederatedHeadClassifier(method=method))
