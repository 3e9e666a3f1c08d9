"""Flower's own SecAgg+ workflow as a secure sum: its scaling, quantisation and overflow limits.

The real ClientApp (``secaggplus_mod`` in front of privfed's train handler)
and Flower's ``SecAggPlusWorkflow`` run over the in-process grid.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

import privfed  # noqa: E402
from mechanisms.dp.clipping import Clipping  # noqa: E402
from mechanisms.secagg.masking import ProtocolAbort  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.federation import partition  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.flwr_secagg import QUANTIZATION_RANGE, quantisation_bound  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import split_sum_vector  # noqa: E402
from privfed.stats import compute_client_stats  # noqa: E402

K, C, CLIP, N_MAX = 4, 10, 10.0, 1000


@pytest.fixture(scope="module")
def split(digits_dataset):
    ds = digits_dataset
    return partition(ds.train_labels, K, "dirichlet", alpha=0.5, rng=0).apply(
        ds.train_features, ds.train_labels
    )


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("flwr").setLevel(logging.WARNING)


def _nodes():
    return {100 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}


@pytest.mark.parametrize("method", ["fedncm", "fed3r"])
def test_secaggplus_sum_is_within_the_quantisation_bound_of_fits_statistics(split, method):
    F, y, k = split
    cfg = FlowerConfig(
        method=method, clients=K, secure="flwr-secaggplus-insecure", clip=CLIP, max_records=N_MAX, timeout=30
    )
    res = serve(LocalGrid(_nodes()), cfg)
    m = cfg.make_method()
    d = F.shape[1]
    got = split_sum_vector(res.sums[0], m, C, d)
    Fc = Clipping(CLIP, "l2")(F)
    fields = ("counts", "sums", "second") if method == "fed3r" else ("counts", "sums")
    exact = compute_client_stats(Fc, y, None, num_classes=C, fields=fields)
    bound = quantisation_bound(m, cfg, K)
    # Each node's value is stochastically rounded to one of 2^22 levels over [-B, B] (scaled by the public
    # bound B = n_max, n_max clip, n_max clip^2): less than 2B/2^22 a node, 2KB/2^22 for the sum.
    assert bound["counts"] == 2 * K * N_MAX / QUANTIZATION_RANGE
    rnd = res.head.secure_aggregation["rounds"][0]
    assert rnd["quantisation_bound_per_entry"] == bound and rnd["uploaded"] == K
    for f in fields:
        err = np.abs(getattr(got, f)[0] - getattr(exact, f)[0]).max()
        assert 0 < err < bound[f], (f, err, bound[f])
    # The head is the method's head of that sum; fit's head on the same (clipped) records is the
    # exact-statistics one, and the two differ only through the rounding.
    head = m.aggregate(got)
    np.testing.assert_array_equal(res.head.weight, head.weight)
    ref = privfed.fit(method, Fc, y, k, num_classes=C)
    assert np.abs(res.head.weight - ref.weight).max() > 0
    assert res.report["wire"]["stages"]["sums:collect_masked_vectors"]["answered"] == K


def test_secaggplus_limits_are_enforced_before_any_message():
    base = dict(method="fedncm", secure="flwr-secaggplus-insecure", clip=CLIP, max_records=N_MAX)
    FlowerConfig(clients=1023, **base)  # 1023 * 2^22 < 2^32: fits
    with pytest.raises(ConfigError, match="could overflow.*at most 1023 clients"):
        FlowerConfig(clients=1024, **base)
    with pytest.raises(ConfigError, match="needs public bounds.*clip.*max-records"):
        FlowerConfig(method="fedncm", clients=K, secure="flwr-secaggplus-insecure", clip=CLIP)
    with pytest.raises(ConfigError, match="DP noise is not offered with Flower's SecAgg"):
        FlowerConfig(clients=K, epsilon=1.0, level="client", **base)
    with pytest.raises(ConfigError, match="fedcof.*needs every node's statistics"):
        FlowerConfig(**{**base, "method": "fedcof"}, clients=K)
    with pytest.raises(ConfigError, match="at least 3 nodes.*clients=2"):  # was a raw ValueError from Flower
        FlowerConfig(clients=2, **base)
    # The old name is no secure choice: the error says why and what to use.
    with pytest.raises(ConfigError, match="gives up any node's input.*--secure-agg mask"):
        FlowerConfig(**{**base, "secure": "flwr-secaggplus"}, clients=K)


def test_secaggplus_report_says_a_deviating_server_recovers_any_input(split):
    cfg = FlowerConfig(
        method="fedncm",
        clients=K,
        secure="flwr-secaggplus-insecure",
        clip=CLIP,
        max_records=N_MAX,
        timeout=30,
    )
    res = serve(LocalGrid(_nodes()), cfg)
    threat = res.head.secure_aggregation["threat_model"]
    assert (
        threat.startswith("NOT SECURE AGAINST A DEVIATING SERVER") and "recovers that node's input" in threat
    )


def test_a_node_above_the_public_bound_stops_the_run_with_its_reason(split):
    cfg = FlowerConfig(
        method="fedncm", clients=K, secure="flwr-secaggplus-insecure", clip=CLIP, max_records=50, timeout=30
    )
    with pytest.raises(ProtocolAbort, match="more than max-records=50"):
        serve(LocalGrid(_nodes()), cfg)


def test_secaggplus_with_a_degree_shares_among_k_plus_one_nodes():
    """``degree`` k gives Flower's workflow k + 1 shares a node and the threshold masking takes for groups of
    k + 1 (the sizes the benchmarks compare it at); its sum agrees with the complete graph's on the same
    nodes within both runs' quantisation bounds."""
    nodes = {100 + i: {"partition-id": i, "num-partitions": 6} for i in range(6)}
    base = dict(method="fedncm", clients=6, secure="flwr-secaggplus-insecure", clip=CLIP, max_records=N_MAX)
    cfg = FlowerConfig(degree=4, **base)
    assert cfg.secagg_threshold == 4
    res = serve(LocalGrid(nodes), cfg)
    rnd = res.head.secure_aggregation["rounds"][0]
    assert rnd["num_shares"] == 5 and rnd["threshold"] == 4 and rnd["uploaded"] == 6
    full = serve(LocalGrid(nodes), FlowerConfig(**base))
    assert full.head.secure_aggregation["rounds"][0]["num_shares"] == 6
    m, d = cfg.make_method(), 64
    a, b = (split_sum_vector(r.sums[0], m, C, d) for r in (res, full))
    bound = quantisation_bound(m, cfg, 6)
    for f in ("counts", "sums"):
        assert np.abs(getattr(a, f) - getattr(b, f)).max() < 2 * bound[f], f
    with pytest.raises(ConfigError, match="degree=4 is the SecAgg\\+ graph"):
        FlowerConfig(method="fedncm", clients=6, degree=4, secure="ckks")
