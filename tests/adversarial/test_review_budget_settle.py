"""A lying server against a budgeted node's settlement of its masked charge.

A node with a lifetime budget charges its noise share in a masked sum at the fewest shares the sum can
carry (t less the declared colluders).  It used to lower the charge at the consistency stage to the
uploaders the consistency request named: the server's word alone, before the node had seen the t
signatures that make a list the sum's uploader set.  Told there that all ten uploaded when seven had, a
victim charged mu*sqrt(10/9) for a release of mu*sqrt(10/7).  Now it settles at the unmask stage, on the
list t signatures confirm; a victim the server never asks to unmask (or shows signatures over another
list) keeps the fewest-shares charge.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, LyingServer, charges, deployed_nodes  # noqa: E402

from mechanisms.dp.calibration import gdp_epsilon, gdp_mu  # noqa: E402
from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import sum_vector_length  # noqa: E402
from privfed.flower.wire import stats_from_record  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

DELTA = 1e-5
MU1 = gdp_mu(1.0, DELTA)


def _cfg(K):
    return FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=DELTA, clip=10.0, secure="mask", timeout=30
    )


def _run(tmp_path, *, lie: bool, unmask_victim: bool = False):
    """K = 10 under the default roster (one declared colluder, t = 6).  Three nodes advertise keys and
    share, then the server holds back their masked request (they drop before upload).  With ``lie`` the
    victim (roster index 0) is told at the consistency stage that all ten uploaded; the six others are told
    the truth, sign it, and are shown only each other's signatures: the server decodes the sum of the seven
    real uploaders, the victim's noisy input among them.  The victim is skipped at the unmask stage, or
    (``unmask_victim``) sent the list it signed with the six others' signatures, which cover another list."""
    K, victim, dropped = 10, 0, {7, 8, 9}
    nodes, roster, _ = deployed_nodes(tmp_path, K, budget=(gdp_epsilon(MU1 * 10, DELTA), DELTA))
    assert (roster.threshold, roster.colluders) == (6, 1)
    grid = LocalGrid(nodes)
    cfg = _cfg(K)
    srv = LyingServer(grid, cfg)
    setup = srv.setup(sorted(nodes))
    meta = next(iter(setup.values()))["meta"]
    length = sum_vector_length(cfg.make_method(), int(meta["C"]), int(meta["d"]))

    def tamper(stage, u, msg):
        if stage == "masked" and u in dropped:
            return None
        if lie and stage == "consistency" and u == victim:
            return {**msg, "uploaded": sorted(set(range(K)))}
        if lie and stage == "unmask":
            # t signatures, none of them the victim's (the server forwards t; it holds all six honest ones)
            held = srv.server.signers
            signers = [v for v in sorted(held) if v != victim][: roster.threshold]
            if u == victim and not unmask_victim:
                return None
            out = {**msg, "signers": signers, "sigs": [held[v] for v in signers]}
            if u == victim:  # the list it signed, with the echoes of those that uploaded
                out["uploaded"] = sorted(set(range(K)))
            return out
        return msg

    server, total = srv.masked_sum(sorted(nodes), length, tamper=tamper)
    assert total is not None, srv.refusals
    uploaded = sorted(server.U3)
    assert uploaded == [u for u in range(K) if u not in dropped]
    # what the server decoded is the sum of the uploaders' noisy statistics (the victim's among them)
    expect = sum(
        np.concatenate(
            [
                a.ravel()
                for a in (lambda s: (s.counts, s.sums))(
                    stats_from_record(grid.contexts[FIRST + u].state["privfed-stats"], "cached")
                )
            ]
        )
        for u in uploaded
    )
    assert np.abs(total - expect).max() < 1e-3
    (charged,) = charges(nodes, FIRST + victim)
    honest_shares = len(uploaded)  # no node colludes in this run: every share in the sum is honest
    true_mu = charged["declared_mu"] * math.sqrt(K / honest_shares)
    return charged, true_mu, srv


def test_an_honest_consistency_list_settles_the_charge_at_the_uploaders_present(tmp_path):
    """Baseline: told the truth, the victim settles at the 7 uploaders less the declared colluder
    (6 honest shares assumed: at least the 7 really present), so it is charged no less than it released."""
    charged, true_mu, _ = _run(tmp_path, lie=False)
    assert charged["settled"]
    assert charged["mu"] == pytest.approx(charged["declared_mu"] * math.sqrt(10 / 6), rel=1e-12)
    assert charged["mu"] >= true_mu


@pytest.mark.parametrize("unmask_victim", [False, True], ids=["victim-skipped", "victim-shown-other-list"])
def test_a_victim_told_that_more_nodes_uploaded_is_charged_what_its_release_cost(tmp_path, unmask_victim):
    """The lie of the consistency stage settles nothing: no t signatures confirm the victim's list, so it
    keeps the charge at the fewest shares a decodable sum carries (t - n_C = 5 of the 10), above the 7 its
    release really had."""
    charged, true_mu, srv = _run(tmp_path, lie=True, unmask_victim=unmask_victim)
    # the run went through: the six others unmasked, the victim's signature was never needed
    assert not [k for k in srv.refusals if k[0] != "unmask"]
    if unmask_victim:  # shown signatures over another list, the victim revealed nothing
        assert "signed other survivor lists" in srv.refusals[("unmask", FIRST)]
    assert not charged["settled"]
    assert charged["mu"] == pytest.approx(charged["declared_mu"] * math.sqrt(10 / 5), rel=1e-12)
    assert charged["mu"] >= true_mu * (1 - 1e-12), (charged["mu"], true_mu)
