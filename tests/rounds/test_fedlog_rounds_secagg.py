"""Multi-round FedLog under real secure aggregation: every round's release goes through pairwise masking
(or CKKS); the server's view holds only masked vectors; distributed noise is charged from the shares present."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from mechanisms.secagg import fixed_point
from privfed.errors import ConfigError
from privfed.rounds import (
    FEATURE_DIM,
    RoundRelease,
    RoundsConfig,
    RoundsDP,
    RoundsSetup,
    client_statistic,
    make_body,
    run_rounds,
    server_step,
)

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

SMALL = dict(
    clients=6, rounds=2, local_epochs=1, init="scratch", baselines=(), batch_size=16, families=("mlp",)
)
F_BITS = 32


def _gdp_eps(mu: float, delta: float) -> float:
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return brentq(f, 0.0, 100.0, xtol=1e-14, rtol=1e-14)


def _client_stack(K: int = 5, seed: int = 0) -> np.ndarray:
    """Real per-client FedLog statistics (K, C, m): digits clients through a fresh mlp body."""
    setup = RoundsSetup(RoundsConfig(clients=K, families=("mlp",)).validate())
    torch.manual_seed(seed)
    body = make_body("mlp")
    return np.stack([client_statistic(body, *setup.client_data(k)[:2]) for k in range(K)])


def test_masked_rounds_equal_the_plain_sum_run_to_the_fixed_point_bound():
    plain = run_rounds(**SMALL)
    masked = run_rounds(**SMALL, secure_agg="mask")
    K = SMALL["clients"]
    bound = K * 2.0 ** -(F_BITS + 1)  # each of K encodings rounds to the 2^-f grid
    for hp, hm in zip(plain.history, masked.history):
        assert np.abs(hm["statistic"] - hp["statistic"]).max() <= bound
    # head: first-order response of the MAP solver to a statistic error of at most `bound` per coordinate,
    # with the Jacobian taken by finite differences on the plain statistic of round 1 (factor 2: linearisation)
    a = plain.history[0]["statistic"]
    _, eta0 = server_step(a)
    h = 1e-4
    J = np.zeros(eta0.shape)
    for idx in np.ndindex(a.shape):
        ap = a.copy()
        ap[idx] += h
        J += np.abs(server_step(ap)[1] - eta0) / h
    np.testing.assert_array_equal(eta0, plain.history[0]["eta"])
    assert np.all(np.abs(masked.history[0]["eta"] - eta0) <= 2 * J * bound)
    assert len(masked.server_views) == SMALL["rounds"]
    assert masked.secure_aggregation["protocol"] == "mask"
    assert masked.bytes["secure_upload_per_client_round"] > masked.bytes["upload_per_client_round"]


def test_server_view_holds_only_masked_vectors():
    A = _client_stack()
    K = A.shape[0]
    release = RoundRelease(None, "mask", num_clients=K)
    rng = np.random.default_rng(3)
    total = release(A, rng)
    total2 = release(A, rng)  # a second round: fresh keys, fresh masks
    assert np.abs(total - A.sum(0)).max() <= K * 2.0 ** -(F_BITS + 1)
    v1, v2 = release.views
    assert set(v1.masked_uploads) == set(range(K))
    enc = [fixed_point.encode(A[k].ravel(), F_BITS) for k in range(K)]
    for view in (v1, v2):
        for y in view.masked_uploads.values():
            assert y.dtype == np.uint64
            for k in range(K):
                # a masked coordinate equals the encoded input with probability 2^-64
                assert np.count_nonzero(y == enc[k]) == 0
                assert np.abs(fixed_point.decode(y, F_BITS) - A[k].ravel()).max() > 1.0
    # the same client's masked uploads of two rounds differ: the masks are fresh each round
    assert not np.array_equal(v1.masked_uploads[0], v2.masked_uploads[0])
    np.testing.assert_array_equal(total, total2)


def test_distributed_noise_is_charged_from_the_shares_present():
    eps, delta, K, drop, R = 1.0, 1e-5, 6, 2, 3
    cfg = dict(
        SMALL,
        rounds=R,
        epsilon=eps,
        delta=delta,
        placement="distributed",
        max_records=200,
        dropouts=drop,
        noise_seed=0,
    )
    r = run_rounds(**cfg)
    rep = r.privacy
    calls = r.secure_aggregation["calls"]
    assert [c["uploaded"] for c in calls] == [K - drop] * R
    assert all(len(c["dropped_before_upload"]) == drop for c in calls)
    dp = RoundsDP(epsilon=eps, delta=delta, clip=2.0, rounds=R, max_records=200)
    mu = math.sqrt(R) * dp.sensitivity / (dp.sigma * math.sqrt((K - drop) / K))
    assert rep.mu_total == pytest.approx(mu, rel=1e-12)
    assert rep.epsilon == pytest.approx(_gdp_eps(mu, delta), rel=1e-9)
    assert rep.epsilon > eps  # two of six shares missing every round: less noise than calibrated
    assert any(f"{K - drop} of {K} shares present" in n for n in rep.notes)
    # masks cancel exactly in the ring and the shares and dropouts come from the seeded generator: the seeded
    # run is bit-reproducible although every round's keys are fresh OS entropy
    again = run_rounds(**cfg)
    assert np.array_equal(again.head.weight, r.head.weight) and np.array_equal(again.head.bias, r.head.bias)
    # dropping after the upload keeps every share: the budget is met exactly
    after = run_rounds(**dict(cfg, dropout_phase="after_upload"))
    assert after.privacy.epsilon == pytest.approx(eps, rel=1e-9)


def test_noise_in_the_masked_sum_has_the_variance_of_the_shares_present():
    K, t, drop = 6, 1, 2
    dp = RoundsDP(
        epsilon=1.0,
        delta=1e-5,
        clip=2.0,
        rounds=1,
        placement="distributed",
        bodies_trained=False,
        tolerate=t,
        dim=999,
    )
    release = RoundRelease(dp, "mask", num_clients=K, dropouts=drop)
    total = release(np.zeros((K, 10, 1000)), np.random.default_rng(7))
    N = total.size
    var = float(np.mean(total**2)) / dp.sigma**2
    expect = (K - drop) / (K - t)  # each present client added sigma^2 / (K - t)
    # the sample variance of N standard normals has relative sd sqrt(2 / N); 5 sd
    assert abs(var / expect - 1) <= 5 * math.sqrt(2 / N)
    assert abs(expect - 1) > 10 * math.sqrt(2 / N)  # and is told apart from the calibrated sigma^2
    assert dp.ledger.events[0].scale == pytest.approx(dp.sigma * math.sqrt(expect), rel=1e-12)


def test_ckks_rounds_release_the_sum_on_its_grid():
    cfg = dict(SMALL, rounds=1)
    plain = run_rounds(**cfg)
    ck = run_rounds(**cfg, secure_agg="ckks")
    a, b = plain.history[0]["statistic"], ck.history[0]["statistic"]
    assert np.abs(b - a).max() <= 1e-6 * np.abs(a).max()
    scaled = b[:, 1:] * 2.0**20
    assert np.array_equal(scaled, np.round(scaled))
    assert ck.secure_aggregation["protocol"] == "ckks"


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(epsilon=1.0, placement="distributed", secure_agg="none", max_records=50), "secure aggregation"),
        (dict(secure_agg="paillier"), "secure_agg"),
        (dict(dropouts=1, secure_agg="ckks"), "masking"),
        (dict(dropouts=6), "dropouts"),
        (dict(dropout_phase="never"), "dropout_phase"),
        (dict(epsilon=1.0, placement="central", max_records=50, dropouts=1), "placement='distributed'"),
        (dict(epsilon=1.0, placement="local", max_records=50, secure_agg="mask"), "split the noise"),
    ],
)
def test_bad_secure_settings_raise_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        run_rounds(**dict(SMALL, rounds=1, **bad))


def test_server_step_is_the_one_shot_solver():
    A = _client_stack()
    head, eta = server_step(A.sum(0))
    assert eta.shape == (10, FEATURE_DIM + 1)
    np.testing.assert_array_equal(eta[:, 0], head.bias)
    np.testing.assert_array_equal(eta[:, 1:], head.weight)


def test_the_one_shot_baseline_runs_under_the_rounds_protection():
    # distributed noise needs a secure sum: the baseline is released the way FedLog's rounds are,
    # not through a plain sum that would refuse the placement (or expose every noise share)
    r = run_rounds(
        **dict(SMALL, rounds=1, baselines=("oneshot",)),
        epsilon=4.0,
        placement="distributed",
        secure_agg="mask",
    )
    one = r.baselines["oneshot"]["privacy"]
    assert one.placement == "distributed" and "secure aggregation" in one.guarantee
    assert one.releases == 1 and one.epsilon == pytest.approx(4.0, abs=1e-9)
    assert 0.0 < r.baselines["oneshot"]["personalised"] <= 1.0


def test_the_tradeoff_rows_of_masked_rounds_state_what_the_protocol_sent(tmp_path, digits_cache):
    """Under --secure-agg mask the rounds rows said 5,208 and 2,604 bytes a client: the plain float uploads,
    where the one-shot command states the protocol's (keys, shares, masked ring elements)."""
    import json

    from privfed.tradeoff import main

    argv = [
        "--method",
        "fedlog",
        "--rounds",
        "2",
        "--local-epochs",
        "0",
        "--families",
        "mlp",
        "--clients",
        "2",
    ]
    out = tmp_path / "r"
    assert main([*argv, "--eps", "1", "--secure-agg", "mask", "--out", str(out), "--quiet", "--no-plot"]) == 0
    rows = {r["rounds"]: r["upload_bytes"] for r in json.loads((out / "results.json").read_text())["records"]}
    plain = 4 * 10 * 65  # a client's float32 statistic, C x (d + 1), in one round
    assert rows[2] == 2 * rows[1] and rows[1] > 1.5 * plain
    r = run_rounds(**{**SMALL, "clients": 2, "secure_agg": "mask", "placement": "distributed"}, epsilon=1.0)
    assert rows[2] * 2 == r.bytes["secure_upload_total"]  # the API states the same
