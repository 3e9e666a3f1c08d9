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
