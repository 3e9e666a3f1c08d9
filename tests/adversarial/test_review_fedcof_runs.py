"""FedCOF without DP across several runs on deployed nodes (a roster and its ledger file each).

FedCOF's round 2 sums every node's class spreads under weights the server broadcasts.  Each sum is one
weighted total; over C runs with other weights the server solves for each class's spread.  The node's
ledger used to name a release without DP by the whole run config, so a server-side parameter (FedCOF's
gamma = 1.0001) was a fresh aggregation, and the same nodes answered round 2 again.  Now a node names a
release without DP by the statistic it computes (the statistics the method reads, the round, its data):
it answers each once, ever, whatever the server varies beside them.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import LyingServer, deployed_nodes  # noqa: E402

from privfed.errors import PrivfedError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.methods.fedcof_protocol import ROUNDS, FedCOFServer  # noqa: E402

K = 4


def _fedcof(**params):
    return FlowerConfig(method="fedcof", method_params=params, clients=K, secure="mask", timeout=30)


def test_a_server_varying_a_parameter_only_it_uses_gets_no_second_fedcof_round(tmp_path):
    nodes, _, _ = deployed_nodes(tmp_path, K, colluders=0)
    first = serve(LocalGrid(nodes), _fedcof())
    assert first.head.secure_aggregation["summed_nodes"] == K
    # The nodes restart; the server asks again under gamma = 1.0001 (what the nodes compute is the same).
    with pytest.raises(
        PrivfedError, match="stage 'masked'.*already uploaded for this configuration and round"
    ):
        serve(LocalGrid(nodes), _fedcof(gamma=1.0001))
    # A server that skips round 1 and sends round 2 at once, with the first run's broadcast: refused too.
    cfg = _fedcof(gamma=1.0001)
    srv = LyingServer(LocalGrid(nodes), cfg)
    meta = next(iter(srv.setup(sorted(nodes)).values()))["meta"]
    server = FedCOFServer(cfg.make_method(), int(meta["C"]), int(meta["d"]))
    broadcast = server.fold_round1(first.sums[0])
    _, total = srv.masked_sum(
        sorted(nodes), server.lengths[ROUNDS[1]], round_name=ROUNDS[1], broadcast=broadcast
    )
    assert total is None
    refused = {n: why for (stage, n), why in srv.refusals.items() if stage == "masked" and n != -1}
    assert sorted(refused) == sorted(nodes)
    assert all("already uploaded for this configuration and round" in why for why in refused.values())


def test_another_statistic_of_the_same_data_is_still_released_once(tmp_path):
    """fed3r reads the second moment too: another statistic, released once; fedcgs reads the same three
    statistics as fed3r, so a server asking for it next gets no second release of them."""
    nodes, _, _ = deployed_nodes(tmp_path, K, colluders=0)
    serve(LocalGrid(nodes), _fedcof())
    fed3r = serve(LocalGrid(nodes), FlowerConfig(method="fed3r", clients=K, secure="mask", timeout=30))
    assert fed3r.head.secure_aggregation["summed_nodes"] == K
    with pytest.raises(PrivfedError, match="already uploaded for this configuration and round"):
        serve(LocalGrid(nodes), FlowerConfig(method="fedcgs", clients=K, secure="mask", timeout=30))
