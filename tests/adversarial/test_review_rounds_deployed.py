"""Multi-round FedLog under DP on deployed nodes (a roster, its ledger file, no simulation allowances).

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


@pytest.mark.xfail(
    strict=True,
    reason="masked multi-round FedLog under DP cannot run on a deployed node unless its operator sets "
    "allow-plain-release=true (query.round is refused as a plain release), and that setting lets the server "
    "read any round's statistic in the clear (epsilon = inf) from a node without a budget",
)
def test_masked_dp_rounds_run_on_nodes_that_refuse_plain_releases(tmp_path):
    nodes, _, _ = deployed_nodes(tmp_path, K, colluders=0)
    res = serve(LocalGrid(nodes), _masked())
    assert res.head.privacy.epsilon == pytest.approx(4.0, rel=1e-9)


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
