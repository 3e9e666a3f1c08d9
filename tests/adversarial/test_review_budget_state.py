"""A lying server against the state a budgeted, deployed node keeps between messages and across restarts:
replayed stages, a replayed run nonce after a restart, and a budget ledger that disappears mid-sum.  Each
is refused (regression tests)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, LyingServer, charges, deployed_nodes  # noqa: E402

from mechanisms.dp.calibration import gdp_epsilon, gdp_mu  # noqa: E402
from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import sum_vector_length  # noqa: E402
from privfed.flower.secagg import to_records  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, DELTA = 4, 1e-5
BUDGET = (gdp_epsilon(gdp_mu(1.0, DELTA) * 10, DELTA), DELTA)  # a hundred releases of epsilon = 1


def _cfg():
    return FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=DELTA, clip=10.0, secure="mask", timeout=30
    )


def _length(srv, nodes):
    meta = next(iter(srv.setup(sorted(nodes)).values()))["meta"]
    return sum_vector_length(srv.cfg.make_method(), int(meta["C"]), int(meta["d"]))


def test_a_replayed_consistency_request_neither_signs_nor_settles_again(tmp_path):
    nodes, _, _ = deployed_nodes(tmp_path, K, colluders=0, budget=BUDGET)
    grid = LocalGrid(nodes)
    srv = LyingServer(grid, _cfg())
    seen = {}

    def keep(stage, u, msg):
        seen[(stage, u)] = msg
        return msg

    _, total = srv.masked_sum(sorted(nodes), _length(srv, nodes), tamper=keep)
    assert total is not None and not srv.refusals
    before = charges(nodes, FIRST)
    (charged,) = before
    assert charged["settled"]
    # the server replays node 0's consistency request, told that every node uploaded
    got = srv.send(
        FIRST, "query.consistency", to_records({**seen[("consistency", 0)], "uploaded": list(range(K))})
    )
    assert isinstance(got, str) and "request 'consistency' in state 'done'" in got
    assert charges(nodes, FIRST) == before


def test_a_run_nonce_replayed_after_a_restart_is_refused_before_any_upload(tmp_path):
    """A budgeted node names each release by the run's nonce; a server that restarts the nodes (a new grid,
    fresh Flower state) and replays a nonce gets the masked stage refused from the ledger file, charged
    nothing."""
    nodes, _, _ = deployed_nodes(tmp_path, K, colluders=0, budget=BUDGET)
    first = LyingServer(LocalGrid(nodes), _cfg(), nonce="ab" * 8)
    _, total = first.masked_sum(sorted(nodes), _length(first, nodes))
    assert total is not None
    again = LyingServer(LocalGrid(nodes), _cfg(), nonce="ab" * 8)
    _, total = again.masked_sum(sorted(nodes), _length(again, nodes))
    assert total is None
    masked = {n: why for (stage, n), why in again.refusals.items() if stage == "masked" and n != -1}
    assert sorted(masked) == sorted(nodes)
    assert all("already uploaded for this configuration and round" in why for why in masked.values())
    assert all(len(charges(nodes, n)) == 1 for n in nodes)


def test_a_budget_ledger_that_disappears_after_the_upload_withholds_the_consistency_signature(tmp_path):
    """The node charged at the masked stage; its budget ledger then goes (a new disk, a deleted file).  At
    the consistency stage it cannot settle, and refuses: the server holds no signature of it, and the node
    keeps the charge it made at the fewest shares."""
    nodes, roster, _ = deployed_nodes(tmp_path, K, colluders=0, budget=BUDGET)
    grid = LocalGrid(nodes)
    srv = LyingServer(grid, _cfg())
    gone = nodes[FIRST]["dp-budget-ledger"]

    def drop_ledger(stage, u, msg):
        if stage == "consistency" and u == 0 and os.path.exists(gone):
            os.replace(gone, gone + ".moved")
        return msg

    server, _ = srv.masked_sum(sorted(nodes), _length(srv, nodes), tamper=drop_ledger)
    why = srv.refusals[("consistency", FIRST)]
    assert "no such file" in why and "budget" in why
    assert 0 not in server.signers
    os.replace(gone + ".moved", gone)
    (charged,) = charges(nodes, FIRST)
    assert not charged["settled"]  # it keeps the fewest-shares charge
