"""The run's printed guarantee against the colluders its roster declares.

The operator's default roster declares one colluder (``--colluders``, default 1).  A colluding node knows
its own noise share and subtracts it, so a masked sum of m uploads carries m - 1 honest shares.  Each
budgeted node charges that (it settles at its survivors less the declared colluders); the head's privacy
and the threat model's "this run" epsilon count every share, and the threat record shows no declared
colluders.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import deployed_nodes, masked_rounds_config  # noqa: E402

from mechanisms.dp.calibration import gdp_epsilon, gdp_mu  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, DELTA = 5, 1e-5


def _run(tmp_path):
    budget = (gdp_epsilon(gdp_mu(1.0, DELTA) * 10, DELTA), DELTA)
    nodes, roster, _ = deployed_nodes(tmp_path, K, budget=budget)
    assert roster.colluders == 1
    cfg = FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=DELTA, clip=10.0, secure="mask", timeout=30
    )
    return serve(LocalGrid(nodes), cfg)


def test_each_node_charges_the_run_with_the_declared_colluder_share_removed(tmp_path):
    res = _run(tmp_path)
    honest = gdp_epsilon(gdp_mu(1.0, DELTA) * (K / (K - 1)) ** 0.5, DELTA)
    for answer in res.report["budgets"]["nodes"].values():
        assert answer["spent_epsilon_run"] == pytest.approx(honest, rel=1e-9)


def test_the_printed_guarantee_of_the_run_holds_against_the_declared_colluders(tmp_path):
    res = _run(tmp_path)
    threat = res.head.secure_aggregation["threat"]
    charged = res.report["budgets"]["weakest"]["spent_epsilon"]
    assert threat["declared_colluders"] == 1
    assert res.head.privacy.epsilon == pytest.approx(charged, rel=1e-9)
    # the threat model's epsilon of this run is the same, over the K - 1 shares of the non-colluders
    assert threat["shares"]["this_run"] == K - 1
    assert threat["epsilon"]["this_run"] == pytest.approx(charged, rel=1e-9)
    assert "declared colluder(s)' noise shares not counted" in threat["text"]


def test_masked_dp_rounds_print_the_composed_epsilon_every_node_charged(tmp_path):
    """Multi-round FedLog under masking (distributed noise) on the default roster (K = 4, t = 3, one declared
    colluder): each round's sum counts 3 honest shares of 4, in the composed epsilon the server prints and in
    what every node charged."""
    from privfed.flower.checks import rounds_config
    from privfed.flower.fedlog import make_rounds_dp

    k = 4
    nodes, roster, _ = deployed_nodes(tmp_path, k, budget=(40.0, DELTA))
    assert (roster.threshold, roster.colluders) == (3, 1)
    cfg = masked_rounds_config(k, DELTA)
    res = serve(LocalGrid(nodes), cfg)
    mu = make_rounds_dp(rounds_config(cfg)).mu_per_release * (k / (k - 1)) ** 0.5
    honest = gdp_epsilon(mu * 2**0.5, DELTA)  # two rounds, each at 3 of 4 shares
    assert res.head.privacy.epsilon == pytest.approx(honest, rel=1e-9)
    for answer in res.report["budgets"]["nodes"].values():
        assert answer["spent_epsilon_run"] == pytest.approx(honest, rel=1e-9)
    assert res.head.secure_aggregation["threat"]["declared_colluders"] == 1
