"""DP noise under secure aggregation on Flower: distributed shares, the report ``fit`` gives, the noise present.

Every run here goes through the real ClientApp and ServerApp over the
in-process grid (:class:`privfed.flower.local.LocalGrid`), milliseconds a run.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import privfed  # noqa: E402
from mechanisms import CKKSAggregation, GaussianMechanism, PairwiseMasking  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.client_app import make_client_app  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.node import load_node_data, node_rng, node_statistics  # noqa: E402
from privfed.flower.protocol import split_sum_vector  # noqa: E402
from privfed.flower.server_app import run_record  # noqa: E402
from privfed.stats import compute_client_stats  # noqa: E402

K = 4
DROPPED = 3  # partition 3 fails its masked stage: it drops before uploading, its share never reaches the sum


@pytest.fixture(scope="module")
def split(digits_dataset):
    ds = digits_dataset
    return partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )


def _nodes():
    return {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}


def _flower(cfg, drop=False):
    app = make_client_app(faults={DROPPED: "masked"} if drop else None)
    return serve(LocalGrid(_nodes(), app), cfg)


CASES = {
    # name: (secure, method, level kwargs, dropout tolerance, a node drops before uploading)
    "mask, a dropout beyond the tolerance": ("mask", "fedncm", {}, 0, True),
    "mask, a dropout within the tolerance": ("mask", "fedncm", {}, 1, True),
    "mask, fed3r, no dropout": ("mask", "fed3r", {}, 0, False),
    "mask, client level, a dropout": ("mask", "fedncm", {"level": "client", "max_records": 500}, 0, True),
    "ckks": ("ckks", "fedncm", {}, 0, False),
}


def _blocks(method):
    return ("sums", "counts", "second") if method == "fed3r" else ("sums", "counts")


@pytest.mark.parametrize("case", list(CASES))
def test_distributed_noise_report_equals_fit(split, case):
    secure, method, lvl, tol, drop = CASES[case]
    cfg = FlowerConfig(
        method=method,
        clients=K,
        epsilon=1.0,
        delta=1e-5,
        clip=10.0,
        secure=secure,
        dropout_tolerance=tol,
        noise_seed=11,
        timeout=30,
        **lvl,
    )
    res = _flower(cfg, drop)
    mech = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=10.0, blocks=_blocks(method), dropout_tolerance=tol, **lvl
    )
    proto = (
        PairwiseMasking(dropouts=1 if drop else 0, dropout_phase="before_upload")
        if secure == "mask"
        else CKKSAggregation()
    )
    ref = privfed.fit(
        method, *split, num_classes=10, num_clients=K, privacy=mech, secure_agg=proto, random_state=0
    )
    got, want = res.head.privacy, ref.privacy
    assert got.guarantee == want.guarantee
    assert got.epsilon == pytest.approx(want.epsilon, rel=1e-12)
    assert got.sigma == want.sigma and got.num_events == want.num_events
    assert got.notes == want.notes and got.placement == "distributed"
    present = K - 1 if drop else K
    assert res.head.secure_aggregation["summed_nodes"] == present
    if drop and tol == 0:  # the noise present is 3/4 of sigma^2: epsilon recomputed, above the target
        assert got.epsilon > 1.0 + 1e-3
        assert any(f"only {present} of {K}" in n for n in got.notes)
    else:
        assert got.epsilon == pytest.approx(1.0, rel=1e-9)
    # the results file gives the epsilon the run delivered beside the one asked, as the other commands' do
    (row,) = run_record(res, cfg)["records"]
    assert row["epsilon"] == 1.0 and row["epsilon_reported"] == got.epsilon
    assert (row["delta"], row["level"], row["sigma"]) == (got.delta, got.level, got.sigma["sums"])
    assert row["private"] is True and row["protects"] == got.protects


def _clean_sum(split, keep, method="fedncm"):
    """The noise-free summed counts and sums of the kept partitions, computed here from the clipped rows."""
    F, y, k = split
    clipped = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=10.0).clip(F)
    rows = np.isin(k, keep)
    return compute_client_stats(clipped[rows], y[rows], None, num_classes=10)


def test_masked_sum_is_fits_statistics_plus_the_shares_present(split):
    cfg = FlowerConfig(
        method="fedncm",
        clients=K,
        epsilon=1.0,
        delta=1e-5,
        clip=10.0,
        secure="mask",
        noise_seed=5,
        timeout=30,
    )
    res = _flower(cfg, drop=True)
    C, d = 10, split[0].shape[1]
    got = split_sum_vector(res.sums[0], cfg.make_method(), C, d)
    keep = [i for i in range(K) if i != DROPPED]

    # Exactly: the sum of the uploaders' noised statistics, replayed from the seeded simulation's node seeds.
    want_counts, want_sums = np.zeros(C), np.zeros((C, d))
    for i in keep:
        data = load_node_data({"partition-id": i, "num-partitions": K}, cfg)
        st, _ = node_statistics(data, cfg, node_rng(cfg, 100 + i, "noise"), secure=True)
        want_counts += st.counts.sum(axis=0)
        want_sums += st.sums.sum(axis=0)
    bound = K * 2.0**-33  # fixed-point rounding of K inputs at frac-bits 32
    assert np.abs(got.counts[0] - want_counts).max() <= bound
    assert np.abs(got.sums[0] - want_sums).max() <= bound

    # Statistically: against fit's clean statistics, the residual is N(0, sigma^2 * 3/4) per coordinate.
    clean = _clean_sum(split, keep)
    sigma = res.head.privacy.sigma
    frac = len(keep) / K
    z = np.concatenate(
        [
            (got.sums[0] - clean.sums.sum(axis=0)).ravel() / (sigma["sums"] * math.sqrt(frac)),
            (got.counts[0] - clean.counts.sum(axis=0)) / (sigma["counts"] * math.sqrt(frac)),
        ]
    )
    # Sample variance of n standard normals: sd sqrt(2 / n); five of them.
    assert abs(np.mean(z**2) - 1.0) < 5 * math.sqrt(2.0 / z.size)
    # The head is the method's head of that sum (what fit's aggregate gives on it).
    head = cfg.make_method().aggregate(got)
    assert np.abs(res.head.weight - head.weight).max() < 1e-12


def test_os_entropy_run_is_a_release_and_draws_fresh_shares(split):
    cfg = FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=1e-5, clip=10.0, secure="mask", timeout=30
    )
    a, b = _flower(cfg), _flower(cfg)
    assert not a.head.privacy.simulation and "SIMULATION" not in a.head.privacy.guarantee
    assert a.report["noise_randomness"] == "OS entropy"
    # Two runs of the same configuration: independent noise (continuous draws never coincide).
    assert np.all(a.sums[0] != b.sums[0])


def test_a_node_without_records_still_uploads_its_share_under_dp(split, tmp_path):
    empty = tmp_path / "empty.npz"
    np.savez(empty, features=np.zeros((0, 64)), labels=np.zeros(0, dtype=np.int64))
    nodes = {**_nodes(), 103: {"features": str(empty)}}
    cfg = FlowerConfig(
        method="fedncm",
        clients=K,
        epsilon=1.0,
        delta=1e-5,
        clip=10.0,
        secure="mask",
        num_classes=10,
        noise_seed=3,
        timeout=30,
    )
    res = serve(LocalGrid(nodes), cfg)
    assert res.head.secure_aggregation["summed_nodes"] == K
    assert res.head.privacy.epsilon == pytest.approx(1.0, rel=1e-9)
    # Without DP the same node is refused, with its name.
    with pytest.raises(ConfigError, match="node 103.*empty"):
        serve(
            LocalGrid(nodes),
            FlowerConfig(method="fedncm", clients=K, secure="mask", num_classes=10, timeout=5),
        )


def test_secure_dp_configurations_fit_refuses_are_refused_before_any_message():
    with pytest.raises(ConfigError, match="fedcof.*secure protocol is not supported"):
        FlowerConfig(method="fedcof", clients=K, epsilon=1.0, clip=10.0, secure="mask")
    with pytest.raises(ConfigError, match="dropout-tolerance=4 must lie in 0..clients-1=3"):
        FlowerConfig(method="fedncm", clients=K, epsilon=1.0, clip=10.0, secure="mask", dropout_tolerance=4)
    with pytest.raises(ConfigError, match="trusted-aggregator contradicts secure-agg ckks"):
        FlowerConfig(
            method="fedncm", clients=K, epsilon=1.0, clip=10.0, secure="ckks", trusted_aggregator=True
        )
    with pytest.raises(ConfigError, match="level client needs max-records N"):
        FlowerConfig(method="fedncm", clients=K, epsilon=1.0, clip=10.0, secure="mask", level="client")


def test_a_run_without_noise_records_no_protection_as_the_tradeoff_command_does(split):
    cfg = FlowerConfig(method="fedncm", clients=K, epsilon=math.inf, timeout=30)
    res = _flower(cfg)
    assert res.head.privacy is None
    (row,) = run_record(res, cfg)["records"]
    got = {k: row[k] for k in ("epsilon_reported", "delta", "level", "mechanism", "sigma", "private")}
    # the values the trade-off command writes for its eps=inf rows (privfed.commands.tradeoff.sweep)
    assert got == {
        "epsilon_reported": "inf",  # the record's JSON spelling of an infinity
        "delta": 0.0,
        "level": "none",
        "mechanism": "none",
        "sigma": 0.0,
        "private": False,
    }
