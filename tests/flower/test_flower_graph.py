"""Pairwise masking on the Flower app over the roster's SecAgg+ graph (``degree``): the head of the plain run,
bytes per node set by k rather than K, and nodes that hold to their roster's graph."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import ConfigRecord  # noqa: E402

from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.identity import Roster  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import FlowerConfig, run_simulation, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.secagg import masked_sum_over_messages  # noqa: E402

K, DEGREE = 12, 4
#: Fixed-point bound of a masked sum per coordinate: K inputs each rounded to 2^-(f+1), f = 32 bits; the head
#: divides sums by counts >= 1, and fed3r's ridge solve amplifies by at most its condition number (< 1e3 here).
MASK_BOUND = K * 2.0**-33


def _nodes(n=K):
    return {100 + i: {"partition-id": i, "num-partitions": n} for i in range(n)}


def _masking_bytes(res, n: int) -> float:
    """Mean bytes a node sent and received on the wire over the masking stages (setup excluded)."""
    stages = res.report["wire"]["stages"]
    return (
        sum(v["bytes_up_total"] + v["bytes_down_total"] for k, v in stages.items() if k.startswith("sums:"))
        / n
    )


@pytest.mark.parametrize("method", ["fedncm", "fedcof"])
def test_a_sparse_masked_run_gives_the_plain_head(digits_dataset, method):
    plain = serve(LocalGrid(_nodes()), FlowerConfig(method=method, clients=K))
    cfg = FlowerConfig(method=method, clients=K, secure="mask", degree=DEGREE, timeout=60)
    masked = serve(LocalGrid(_nodes(), degree=DEGREE), cfg)
    assert np.abs(masked.head.weight - plain.head.weight).max() < 1e3 * MASK_BOUND
    rnd = masked.head.secure_aggregation["rounds"][0]
    assert "4-regular SecAgg+ graph" in rnd["protocol"] and rnd["threshold"] == 4 and rnd["uploaded"] == K


def test_bytes_per_node_grow_with_the_degree_not_the_number_of_nodes(digits_dataset):
    """Per node, the masking stages carry the same bytes at K = 12 and K = 24 for k = 4 (the statistic's
    length is fixed by d and C), and more at k = 8; on the complete graph they grow with K."""
    got = {}
    for n, k in ((12, 4), (24, 4), (24, 8), (12, None), (24, None)):
        cfg = FlowerConfig(method="fedncm", clients=n, secure="mask", degree=k, timeout=60)
        res = serve(LocalGrid(_nodes(n), degree=k), cfg)
        got[n, k] = _masking_bytes(res, n)
    assert abs(got[24, 4] - got[12, 4]) < 0.01 * got[12, 4]
    assert got[24, 8] > got[24, 4] and got[24, None] > got[24, 8]
    assert got[24, None] - got[12, None] > 100 * abs(got[24, 4] - got[12, 4]) + 1000


def test_a_run_config_whose_degree_is_not_the_rosters_is_refused(digits_dataset):
    with pytest.raises(ProtocolAbort, match="stage 'keys'.*roster graph is 4"):  # the server runs complete
        serve(LocalGrid(_nodes(), degree=DEGREE), FlowerConfig(method="fedncm", clients=K, secure="mask"))
    with pytest.raises(ProtocolAbort, match="stage 'keys'.*roster graph is complete"):
        serve(LocalGrid(_nodes()), FlowerConfig(method="fedncm", clients=K, secure="mask", degree=DEGREE))
    # A server that runs the roster's graph but hands the nodes a run config of another degree.
    grid = LocalGrid(_nodes(), degree=DEGREE)
    rec = ConfigRecord(
        {**FlowerConfig(method="fedncm", clients=K, secure="mask").to_wire(), "run-nonce": "x"}
    )
    with pytest.raises(
        ProtocolAbort, match="stage 'masked'.*degree=None but its roster's graph is 4-regular"
    ):
        masked_sum_over_messages(
            grid,
            sorted(grid.contexts),
            length=10 * 65,
            frac_bits=32,
            threshold=None,
            timeout=30,
            masked_payload=lambda n: {"config": rec, "round": ConfigRecord({"round": "sums"})},
            round_name="sums",
            num_nodes=K,
            degree=DEGREE,
        )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"degree": 3}, "even integer"),
        ({"degree": 12}, "below the number of nodes K=12"),
        ({"degree": 4, "secure": "ckks"}, "use it with --secure-agg mask"),
        ({"degree": 4, "secure": "none"}, "use it with --secure-agg mask"),
        ({"degree": 4, "threshold": 2}, r"too low for degree=4.*2t > k \+ 1.*t >= 3"),
        ({"degree": 4, "threshold": 6}, "exceeds the group size degree \\+ 1 = 5"),
    ],
)
def test_bad_degrees_are_refused_before_any_message(kw, match):
    with pytest.raises(ConfigError, match=match):
        FlowerConfig(method="fedncm", clients=K, **{"secure": "mask", **kw})


def test_degree_comes_from_the_run_config():
    cfg = FlowerConfig.from_run_config({"clients": 12, "secure-agg": "mask", "degree": "4", "eps": "inf"})
    assert cfg.degree == 4 and cfg.secagg_threshold == 4  # 2t > 5 + 1: tolerates a colluder
    assert FlowerConfig.from_wire(cfg.to_wire()) == cfg
    assert (
        FlowerConfig.from_run_config(
            {"clients": 12, "secure-agg": "mask", "degree": "none", "eps": "inf"}
        ).degree
        is None
    )


def test_a_flower_simulation_on_the_graph_gives_the_plain_head(digits_dataset):
    """Flower's simulation engine: the simulated operator draws the 4-regular graph into the roster."""
    w = dict(method="fedncm", clients=K, timeout=600.0, connect_timeout=600.0)
    plain, masked = run_simulation(
        [FlowerConfig(**w), FlowerConfig(secure="mask", degree=DEGREE, **w)], num_supernodes=K
    )
    assert not isinstance(plain, Exception) and not isinstance(masked, Exception), (plain, masked)
    assert np.abs(masked.head.weight - plain.head.weight).max() < 1e3 * MASK_BOUND
    assert masked.head.secure_aggregation["rounds"][0]["uploaded"] == K


@pytest.mark.parametrize("clients,degree", [(3, None), (8, None), (12, None), (12, 4), (12, 10), (40, 20)])
def test_one_default_threshold_for_the_report_the_roster_and_the_sum(clients, degree):
    """The configuration's report, the simulated operator's roster and a sum's opening take t from one rule,
    the smallest threshold of the node's group (K, or k + 1) that tolerates a colluder: 2t > n + 1."""
    from mechanisms.secagg.threat import colluders_tolerated, sum_threshold
    from privfed.flower.provision import SimulatedRoster

    cfg = FlowerConfig(method="fedncm", clients=clients, secure="mask", degree=degree)
    n = clients if degree is None else degree + 1
    want = max(2, (n + 1) // 2 + 1)  # by hand: the smallest t >= 2 with 2t > n + 1
    roster = Roster.from_json(SimulatedRoster(clients, degree=degree).roster_json)
    assert cfg.secagg_threshold == roster.threshold == sum_threshold(clients, None, degree) == want
    assert colluders_tolerated(n, want) >= 1 or n < 3
    assert sum_threshold(clients, 2, degree) == 2  # a configured threshold is taken as it is
