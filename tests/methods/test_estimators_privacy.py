"""The scikit-learn estimator takes privacy= and secure_agg= like privfed.fit, with the same results."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

import privfed
from mechanisms import GaussianMechanism
from mechanisms.secagg.protection import PairwiseMasking
from privfed.estimators import FederatedHeadClassifier, iid_clients


@pytest.fixture(scope="module")
def data(digits_dataset):
    ds = digits_dataset
    return ds.train_features, ds.train_labels, ds.test_features, ds.test_labels


def test_privacy_parameter_equals_fit_with_the_same_seed(data):
    X, y, Xt, yt = data
    mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=31.4)
    clf = FederatedHeadClassifier("fedlog", clients=10, random_state=3, privacy=mech, classes=10).fit(X, y)
    rng = np.random.default_rng(3)
    ids = iid_clients(y.size, 10, rng)
    head = privfed.fit(
        "fedlog",
        X,
        y,
        ids,
        num_classes=10,
        num_clients=10,
        privacy=GaussianMechanism(epsilon=2.0, delta=1e-5, clip=31.4),
        random_state=rng,
    )
    np.testing.assert_array_equal(clf.coef_, head.weight)
    np.testing.assert_array_equal(clf.intercept_, head.bias)
    assert (
        clf.head_.privacy.guarantee == head.privacy.guarantee and "SIMULATION" in clf.head_.privacy.guarantee
    )
    # noise changes the head (a test that could fail if privacy were dropped on the way)
    clean = FederatedHeadClassifier("fedlog", clients=10, random_state=3).fit(X, y)
    assert not np.array_equal(clean.coef_, clf.coef_)
    # each fit is one release with its own report; the estimator's parameter is left untouched
    again = clf.fit(X, y)
    assert again.head_.privacy.guarantee == head.privacy.guarantee
    assert clf.get_params()["privacy"] is mech


def test_unseeded_private_estimator_is_a_release_not_a_simulation(data):
    X, y, _, _ = data
    mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=31.4)
    a = FederatedHeadClassifier("fedlog", clients=10, privacy=mech, classes=10).fit(X, y)
    b = clone(a).fit(X, y)
    assert "SIMULATION" not in a.head_.privacy.guarantee
    assert not np.array_equal(a.coef_, b.coef_)  # fresh OS entropy each fit


def test_secure_agg_parameter_gives_the_plain_head_up_to_fixed_point(data):
    X, y, Xt, yt = data
    plain = FederatedHeadClassifier("fed3r", clients=8, random_state=0).fit(X, y)
    masked = FederatedHeadClassifier("fed3r", clients=8, random_state=0, secure_agg=PairwiseMasking()).fit(
        X, y
    )
    assert masked.head_.secure_aggregation is not None
    np.testing.assert_allclose(masked.coef_, plain.coef_, rtol=1e-6, atol=1e-6)
    assert masked.score(Xt, yt) == plain.score(Xt, yt)
    assert clone(masked).get_params()["secure_agg"] is not None


def test_under_privacy_the_label_set_and_the_number_of_clients_are_public_parameters(data):
    X, y, _, _ = data
    mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=31.4)
    with pytest.raises(privfed.ConfigError, match="classes="):
        FederatedHeadClassifier("fedncm", clients=4, random_state=0, privacy=mech).fit(X, y)
    by_label = FederatedHeadClassifier(
        "fedncm", clients=lambda y, rng: y % 4, random_state=0, privacy=mech, classes=10
    )
    with pytest.raises(privfed.ConfigError, match="num_clients="):
        by_label.fit(X, y)
    with pytest.raises(privfed.ConfigError, match="num_clients="):
        FederatedHeadClassifier("fedncm", random_state=0, privacy=mech, classes=10).fit(X, y, clients=y % 4)
    with pytest.raises(privfed.ConfigError, match="num_clients=5 but clients=4"):
        FederatedHeadClassifier("fedncm", clients=4, num_clients=5, privacy=mech, classes=10).fit(X, y)
    # given, they shape the release whatever the data holds: a class and a client with no sample
    keep = y < 9
    clf = FederatedHeadClassifier(
        "fedncm", clients=lambda y, rng: y % 4, num_clients=6, random_state=0, privacy=mech, classes=10
    ).fit(X[keep], y[keep])
    assert clf.classes_.tolist() == list(range(10)) and clf.coef_.shape == (10, X.shape[1])
    assert (
        clf.head_.privacy.guarantee
        == privfed.fit(
            "fedncm",
            X[keep],
            y[keep],
            y[keep] % 4,
            num_classes=10,
            num_clients=6,
            privacy=mech,
            random_state=0,
        ).privacy.guarantee
    )


def test_public_labels_map_any_sortable_values_and_refuse_a_label_outside_them():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = np.where(X[:, 0] > 0, "yes", "no")
    mech = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=10.0)
    clf = FederatedHeadClassifier(
        "fedncm", clients=3, random_state=0, privacy=mech, classes=["yes", "no", "maybe"]
    ).fit(X, y)
    assert clf.classes_.tolist() == ["maybe", "no", "yes"] and clf.coef_.shape == (3, 3)
    assert set(clf.predict(X)) <= {"maybe", "no", "yes"}
    with pytest.raises(privfed.InputError, match="'yes', not in classes"):
        FederatedHeadClassifier("fedncm", clients=3, privacy=mech, classes=["no", "maybe"]).fit(X, y)


def test_a_mechanism_says_which_of_its_settings_did_not_apply():
    """Before: trusted_aggregator=True with FedCOF (whose server needs each client's statistics) ran local
    noise, and dropout_tolerance without secure aggregation was ignored, both without a word."""
    import privfed
    from mechanisms import GaussianMechanism

    rng = np.random.default_rng(0)
    X, y, k = rng.normal(size=(60, 4)), np.arange(60) % 3, np.arange(60) % 4
    kw = dict(num_classes=3, num_clients=4, random_state=0)
    trusted = GaussianMechanism(epsilon=1, delta=1e-5, clip=3, trusted_aggregator=True)
    rep = privfed.fit("fedcof", X, y, k, privacy=trusted, **kw).privacy
    assert rep.placement == "local" and any("trusted_aggregator=True was not used" in n for n in rep.notes)
    rep = privfed.fit(
        "fedncm",
        X,
        y,
        k,
        privacy=GaussianMechanism(epsilon=1, delta=1e-5, clip=3, trusted_aggregator=True),
        **kw,
    ).privacy
    assert rep.placement == "central" and not any("was not used" in n for n in rep.notes)
    both = GaussianMechanism(epsilon=1, delta=1e-5, clip=3, trusted_aggregator=True)  # one central, one local
    privfed.fit("fedncm", X, y, k, privacy=both, **kw)
    rep = privfed.fit("fedcof", X, y, k, privacy=both, **kw).privacy
    assert rep.placement == "mixed: central, local" and not any("was not used" in n for n in rep.notes)
    tol = GaussianMechanism(epsilon=1, delta=1e-5, clip=3, dropout_tolerance=2)
    rep = privfed.fit("fedncm", X, y, k, privacy=tol, **kw).privacy
    assert any("dropout_tolerance=2 sizes the noise shares of a secure sum" in n for n in rep.notes)
