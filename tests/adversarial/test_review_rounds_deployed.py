"""Multi-round FedLog under DP on deployed nodes (a roster, its ledger file, a lifetime budget, no simulation
allowances).

The masked (distributed-noise) rounds start with ``query.round``: each node trains its body and keeps its
noisy statistic for the round's masked sum.  A node deployed with a roster refuses every ``query.round``
as a plain release unless its operator sets ``allow-plain-release=true``, and that setting then lets the
same server ask for a round in the clear.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import ConfigRecord, RecordDict  # noqa: E402
from lying_server import FIRST, LyingServer, deployed_nodes  # noqa: E402

from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.fedlog import C_DIGITS  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.wire import arrays_record  # noqa: E402
from privfed.rounds.bodies import FEATURE_DIM  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K = 4
PARAMS = {"local_epochs": 0, "families": ["mlp"], "init": "scratch"}


def _masked(**kw):
    return FlowerConfig(
        method="fedlog",
        clients=K,
        rounds=2,
        rounds_params=PARAMS,
        epsilon=4.0,
        delta=1e-5,
        clip=2.0,
        secure="mask",
        timeout=30,
        **kw,
    )


def _round0(srv: LyingServer, node: int):
    eta = np.zeros((C_DIGITS, FEATURE_DIM + 1))
    content = RecordDict(
        {
            "config": srv.config,
            "round": ConfigRecord({"name": "fedlog-rounds", "index": 0, "round": "fedlog-rounds"}),
            "broadcast": arrays_record({"eta": eta}),
        }
    )
    return srv.send(node, "query.round", content)


class _Recording(LocalGrid):
    """Keeps every reply the server received."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.seen = []

    def pull_messages(self, ids):
        out = super().pull_messages(ids)
        self.seen.extend(out)
        return out


def test_masked_dp_rounds_run_on_nodes_that_refuse_plain_releases(tmp_path):
    """The masked rounds run on nodes deployed without any allowance; no round reply carries a statistic
    (each goes into the round's masked sum only), and a server asking the same nodes for a round in the clear
    is refused."""
    nodes, _, _ = deployed_nodes(tmp_path, K, colluders=0, budget=(40.0, 1e-5))
    grid = _Recording(nodes)
    res = serve(grid, _masked())
    assert res.head.privacy.epsilon == pytest.approx(4.0, rel=1e-9)
    rounds = [m for m in grid.seen if m.metadata.message_type == "query.round"]
    assert len(rounds) == 2 * K and not any("stats" in m.content for m in rounds)
    for cfg in (
        FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params=PARAMS),
        FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params=PARAMS, epsilon=4.0, clip=2.0),
    ):
        got = _round0(LyingServer(grid, cfg), FIRST)
        assert isinstance(got, str) and "deployed for secure aggregation" in got


def test_with_plain_releases_allowed_a_budget_still_refuses_a_noiseless_round(tmp_path):
    """The mitigation today: a node with a lifetime budget refuses a round without DP noise, even with
    allow-plain-release=true, after running the masked DP rounds."""
    nodes, _, _ = deployed_nodes(
        tmp_path, K, colluders=0, budget=(40.0, 1e-5), **{"allow-plain-release": True}
    )
    grid = LocalGrid(nodes)
    res = serve(grid, _masked())
    assert res.head.privacy.epsilon == pytest.approx(4.0, rel=1e-9)
    plain = LyingServer(grid, FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params=PARAMS))
    got = _round0(plain, FIRST)
    assert isinstance(got, str) and "keeps a lifetime privacy budget" in got and "without DP noise" in got
