"""Attacks scored on federations whose right answer is known: what the server can read, it is credited with.

Small synthetic federations (non-negative features, 3 classes, 120 records), each in well under a second.
"""

from __future__ import annotations

import numpy as np
import pytest

import attacks
from attacks.view import NoiseSpec, PublicData

N, D, C = 120, 6, 3


def _data(seed=0):
    rng = np.random.default_rng(seed)
    F = np.abs(rng.normal(size=(N, D))) + 0.1
    H = np.abs(rng.normal(size=(60, D))) + 0.1
    P = np.abs(rng.normal(size=(60, D))) + 0.1
    return F, np.arange(N) % C, H, np.arange(60) % C, PublicData(labels=np.arange(60) % C, features=P)


@pytest.mark.parametrize(
    "noise",
    [
        NoiseSpec(sigma={"counts": 0.1}),
        NoiseSpec.gaussian(epsilon=1, delta=1e-5, clip=5.0, blocks=("counts",)),
    ],
    ids=["sigma", "gaussian"],
)
def test_singleton_reads_clean_sums_whatever_noise_the_counts_carry(noise):
    # 120 clients of one record each: every released sum is a record.  Gaussian noise on the counts
    # alone does not touch the sums, so every candidate the server finds is an exact record.
    F, y, *_ = _data()
    view, truth = attacks.scenario("fedncm", F, y, np.arange(N), privacy=noise, rng=0)
    res = attacks.get("singleton").run(view)
    assert res.rows.size > 0
    np.testing.assert_array_equal(res.features, view.stats.sums[res.rows, res.classes])
    got = attacks.evaluate("singleton", view, truth)
    # a candidate is a cell whose noisy count rounds to 1; each is a record, read exactly
    assert got["candidate_precision"] == 1.0
    assert got["exposed_samples"] == got["candidates"] == res.rows.size
    if noise.sigma["counts"] <= 0.1:  # |N(0, 0.1)| < 0.5 for all 120 cells with overwhelming probability
        assert got["exposed_fraction"] == 1.0


def test_singleton_still_divides_fedcof_count_noise_out_of_its_rescaled_sums():
    # FedCOF App. I.1 with clean sums sends n~ x the exact mean: sum / noisy count is the record
    F, y, *_ = _data()
    noise = NoiseSpec(count_kind="gaussian", count_epsilon=1.0, count_delta=1e-5)
    view, truth = attacks.scenario("fedcof", F, y, np.arange(N), privacy=noise, rng=0)
    got = attacks.evaluate("singleton", view, truth)
    assert got["candidates"] > 0 and got["candidate_precision"] == 1.0


@pytest.mark.parametrize("clients", [np.arange(N) % 40 * 2, np.arange(N) % 40], ids=["gaps", "extra"])
def test_labels_exact_recovery_scores_zero_total_variation_with_empty_clients(clients):
    F, y, *_ = _data()
    extra = {"num_clients": 50} if clients.max() < 40 else {}
    view, truth = attacks.scenario("fedncm", F, y, clients, rng=0, **extra)
    assert view.stats.counts.shape[0] > 40  # clients without records are in the view
    got = attacks.evaluate("labels", view, truth)
    assert got["count_mae"] == 0.0 and got["exact_support"] == 1.0
    assert got["total_variation"] == 0.0


def test_client_level_noise_without_secure_aggregation_is_no_noise_to_the_attacks():
    # The server reads every clean upload: tracing must be as strong as on the clean view, and the view
    # must claim no budget.
    F, y, H, yh, pub = _data()
    kw = dict(holdout_features=H, holdout_labels=yh, public=pub, rng=0)
    clients = np.arange(N) % 40
    noisy, truth = attacks.scenario(
        "fedncm", F, y, clients, privacy=NoiseSpec(sigma={"sums": 1.0}, level="client", epsilon=1.0), **kw
    )
    clean, _ = attacks.scenario("fedncm", F, y, clients, **kw)
    assert noisy.noise.is_clean and noisy.noise.epsilon == float("inf")
    assert any("clean upload" in n for n in noisy.notes)
    np.testing.assert_array_equal(noisy.stats.sums, clean.stats.sums)
    a = attacks.evaluate("tracing", noisy, truth, rng=np.random.default_rng(1))["auc"]
    b = attacks.evaluate("tracing", clean, truth, rng=np.random.default_rng(1))["auc"]
    assert a == b


# ----------------------------------------------------------------------------- inputs read silently before
def test_differencing_score_refuses_indices_it_would_read_from_the_end_or_cast():
    from privfed.errors import InputError

    F, y, *_ = _data()
    k = np.arange(N) % 40
    view, truth = attacks.scenario("fedncm", F, y, k)
    k2 = k.copy()
    k2[:40] = -1
    earlier, _ = attacks.scenario("fedncm", F, y, k2, num_clients=40, num_classes=C)
    att = attacks.get("differencing")
    res = att.run(view, earlier=earlier)
    good = att.score(res, truth, added=np.arange(40))
    assert good["cells"] == 40 and good["exact_fraction"] == 1.0
    for bad, word in [
        (np.arange(40) - 1, "added holds -1, out of range"),
        (np.arange(40) + 0.7, "added"),
        (np.ones(N, bool), "boolean mask"),
        ([500], "added holds 500, out of range"),
    ]:
        with pytest.raises(InputError, match=word):
            att.score(res, truth, added=bad)


def test_ground_truth_refuses_ids_and_labels_no_view_holds():
    from attacks.view import GroundTruth
    from privfed.errors import InputError

    F, y, H, yh, _ = _data()
    k = np.arange(N) % 40
    with pytest.raises(InputError, match=r"GroundTruth.clients holds -5: client ids are >= 0, or -1"):
        GroundTruth(features=F, labels=y, clients=k - 5)
    with pytest.raises(InputError, match=r"GroundTruth.holdout_labels holds -1"):
        GroundTruth(features=F, labels=y, clients=k, holdout_features=H, holdout_labels=yh - 1)
    with pytest.raises(InputError, match="GroundTruth.labels is required"):
        GroundTruth(features=F, labels=None, clients=k)
    k[0] = -1  # a record left out is fine
    assert GroundTruth(features=F, labels=y, clients=k).clients[0] == -1


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"n": np.inf}, "n must be an integer"),
        ({"n": 2.5}, "n must be an integer"),
        ({"rng": 0}, "rng must be a numpy.random.Generator"),
        ({"max_groups": -1}, "max_groups"),
        ({"max_groups": 2.7}, "max_groups"),
        ({"labels": np.arange(N) % C + 0.5}, "labels"),
        ({"labels": np.arange(N) % C - 1}, "labels holds -1"),
    ],
)
def test_class_groups_refuses_what_it_used_to_cast(kw, word):
    from attacks.view import class_groups
    from privfed.errors import ConfigError, InputError

    args = {"labels": np.arange(N) % C, "n": 2, "rng": np.random.default_rng(0), **kw}
    labels, n, rng = args.pop("labels"), args.pop("n"), args.pop("rng")
    with pytest.raises((ConfigError, InputError), match=word):
        class_groups(labels, n, rng, **args)
    groups = class_groups(np.arange(N) % C, 2, np.random.default_rng(0), max_groups=5)
    assert (
        sorted(set(groups.tolist())) == [-1, 0, 1, 2, 3, 4]
        and np.bincount(groups[groups >= 0]).tolist() == [2] * 5
    )


def _rounds_data(rounds=2, P=5, d=3, sigma=1.0):
    from attacks.rounds import RoundsAttackData

    g = np.random.default_rng(0)
    phi = np.concatenate([np.ones((rounds, 2 * P, 1)), np.abs(g.normal(size=(rounds, 2 * P, d)))], -1)
    clean = np.concatenate([np.full((rounds, P, 1), 5.0), np.abs(g.normal(size=(rounds, P, d))) * 5], -1)
    clean += phi[:, :P]
    released = clean + g.normal(size=clean.shape) * sigma
    data = RoundsAttackData(view="x", classes=np.zeros(P, int), clients=np.zeros(P, int))
    eye = np.broadcast_to(np.eye(d), (P, d, d))
    for r in range(rounds):
        data.phi.append(phi[r])
        data.released.append(released[r])
        data.clean.append(clean[r])
        data.sigma.append(sigma)
        for name in ("one_mean", "rest_mean", "inc_one_mean", "inc_rest_mean"):
            getattr(data, name).append(np.ones((P, d)))
        for name in ("one_cov", "rest_cov", "inc_one_cov", "inc_rest_cov"):
            getattr(data, name).append(eye.copy())
    return data


def test_rounds_attacks_refuse_budgets_and_noise_that_give_impossible_bounds():
    from attacks.rounds import evaluate_rounds_attacks
    from privfed.errors import ConfigError

    ok = evaluate_rounds_attacks(_rounds_data(), np.random.default_rng(0), mu_total=1.0)
    assert 0.5 < ok["auc_bound"] < 1.0 and ok["differencing"] is not None
    for kw, word in [
        ({"mu_total": -1.0}, "mu_total"),
        ({"mu_total": float("nan")}, "mu_total"),
        ({"mu_total": "x"}, "mu_total"),
        ({"mu_per_release": True}, "mu_per_release"),
    ]:
        with pytest.raises(ConfigError, match=word):
            evaluate_rounds_attacks(_rounds_data(), np.random.default_rng(0), **kw)
    with pytest.raises(ConfigError, match="rng must be a numpy.random.Generator"):
        evaluate_rounds_attacks(_rounds_data(), 0)
    for bad in (-1.0, float("nan"), float("inf")):
        data = _rounds_data()
        data.sigma[0] = bad
        with pytest.raises(ConfigError, match="sigma must be finite and >= 0"):
            evaluate_rounds_attacks(data, np.random.default_rng(0))


@pytest.mark.parametrize("value", [1.0, 0.3])  # 0.3: a covariance of rounding noise, about 1e-30
@pytest.mark.parametrize("test", ["lrt", "learned"])
def test_tracing_with_public_records_that_do_not_vary_still_scores(test, value):
    # a zero public covariance used to floor the variances at 1e-309: scores overflowed to inf (lrt: "scores
    # are NaN/inf"; learned: a raw sklearn error)
    F, y, H, yh, _ = _data()
    pub = PublicData(labels=np.arange(60) % C, features=np.full((60, D), value))
    view, truth = attacks.scenario(
        "fedncm", F, y, np.arange(N) % 40, holdout_features=H, holdout_labels=yh, public=pub
    )
    got = attacks.evaluate("tracing", view, truth, test=test, rng=np.random.default_rng(0))
    assert np.isfinite(got["auc"]) and 0.0 <= got["auc"] <= 1.0
    if (
        test == "lrt"
    ):  # log-likelihood ratios at the floor's scale (1e-9 of the data's): not the 1e32 of 1e-42
        assert abs(got["threshold@0.01"]) < 1e15


def test_strongest_and_membership_targets_name_what_is_malformed():
    from attacks.view import membership_targets
    from privfed.errors import ConfigError

    F, y, H, yh, pub = _data()
    view, truth = attacks.scenario(
        "fedncm", F, y, np.arange(N) % 40, holdout_features=H, holdout_labels=yh, public=pub
    )
    for kw, word in [
        ({"suite": {"x": ("labels", {})}}, "report no 'auc'"),
        ({"suite": {"x": "tracing"}}, "suite member 'x' must be"),
        ({"challenge": 5}, "challenge must be a dict"),
        ({"progress": 5}, "progress must be a callable"),
    ]:
        with pytest.raises(ConfigError, match=word):
            attacks.strongest("tracing", view, truth, rng=0, **kw)
    with pytest.raises(ConfigError, match="rng must be a numpy.random.Generator"):
        membership_targets(view, truth, 10, 0, "tracing")


def test_images_tau_and_inversion_settings_are_refused_where_they_are_given():
    from attacks.theory import tracing_snr
    from attacks.view import GroundTruth
    from privfed.errors import ConfigError, InputError

    F, y, *_ = _data()
    P = np.abs(np.random.default_rng(1).normal(size=(60, D)))
    for images, word in [
        (np.full((60, 4, 4), np.nan), "holds NaN or inf pixels"),
        (np.ones((60, 16)), r"must be real images of shape \(n, H, W\)"),
        (np.array([["a"]] * 60), "must be real images"),
    ]:
        with pytest.raises(InputError, match="PublicData.images " + word):
            PublicData(labels=np.arange(60) % C, features=P, images=images)
    with pytest.raises(InputError, match="GroundTruth.images holds NaN"):
        GroundTruth(features=F, labels=y, clients=np.arange(N) % 40, images=np.full((N, 4, 4), np.nan))
    with pytest.raises(ConfigError, match="num_classes"):
        PublicData(labels=np.arange(60) % C, features=P).class_means(-1)
    with pytest.raises(InputError, match="tau must be a number or match n's shape"):
        tracing_snr(np.eye(3), np.array([1, 2, 3]), tau=np.array([0.0, 1.0]))
    assert np.shape(tracing_snr(np.eye(3), np.array([1, 2, 3]), tau=np.array([0.0, 1.0, 2.0]))) == (3,)
    for kw, word in [
        ({"joint_lrs": 0.1}, "joint_lrs must be a list"),
        ({"refine": ["a"]}, "unknown refinement"),
    ]:
        with pytest.raises(ConfigError, match=word):
            attacks.get("inversion", **kw)
    assert attacks.get("inversion", joint_lrs=[0.02, 0.1]).params["joint_lrs"] == [0.02, 0.1]
