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
