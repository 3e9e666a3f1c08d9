"""The DP parameters of a masked release are the server's to choose; a budgeted node's charge must follow the
noise it really adds, whatever they are.

The server sets the dropout tolerance t_d (each node's share is sigma^2 / (K - t_d)), the level (client level
bounds each node to ``max-records`` records' worth) and the clip, and the node charges
``declared_mu * sqrt((K - t_d) / (shares - n_C))`` at record level (client level doubled).  If the share a node
draws and the factor it charges read different values, a server could make nodes add less noise than they
pay for.  Here deployed nodes with their own feature files (records inside the clip ball, so the statistics
before noise are known exactly) run an honest masked fedncm release under three choices; for every node the
noise in its cached upload has the standard deviation of the share its events declare (a statistical check:
400 values, tolerance five standard errors of a standard deviation, 5 / sqrt(2 * 400)), and its charge is at
least the mu of the sum the server decoded, computed from those events and the shares present.
"""

from __future__ import annotations

import math
import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, charges, deployed_nodes  # noqa: E402

from mechanisms.dp.calibration import gdp_epsilon, gdp_mu  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.wire import stats_from_record  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, C, D, N, DELTA = 5, 4, 100, 30, 1e-5


def _files(folder: pathlib.Path) -> list[pathlib.Path]:
    rng = np.random.default_rng(0)
    out = []
    for h in range(K):
        F = rng.normal(size=(N, D))
        F *= 0.5 / np.linalg.norm(F, axis=1, keepdims=True)  # every record inside the clip (1.0): unclipped
        path = folder / f"site-{h}.npz"
        np.savez(path, features=F, labels=rng.integers(0, C, N))
        out.append(path)
    return out


@pytest.mark.parametrize(
    "kw",
    [{"dropout_tolerance": K - 1}, {"level": "client", "max_records": 40}, {}],
    ids=["tolerance-K-1", "client-level", "defaults"],
)
def test_the_charge_follows_the_noise_the_node_adds_whatever_the_server_sets(tmp_path, kw):
    files = _files(tmp_path)
    nodes, roster, _ = deployed_nodes(
        tmp_path / "roster", K, budget=(gdp_epsilon(gdp_mu(1.0, DELTA) * 20, DELTA), DELTA)
    )
    for i, path in enumerate(files):
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
    cfg = FlowerConfig(
        method="fedncm",
        clients=K,
        epsilon=1.0,
        delta=DELTA,
        clip=1.0,
        secure="mask",
        num_classes=C,
        timeout=30,
        **kw,
    )
    grid = LocalGrid(nodes)
    res = serve(grid, cfg)
    shares = res.head.secure_aggregation["summed_nodes"]
    assert shares == K
    spread = []
    for i, path in enumerate(files):
        sent = stats_from_record(
            grid.contexts[FIRST + i].state["privfed-stats"], "the node's noisy statistics"
        )
        z = np.load(path)
        clean = np.stack([z["features"][z["labels"] == c].sum(axis=0) for c in range(C)])
        noise = (sent.sums[0] - clean).ravel()
        (charged,) = charges(nodes, FIRST + i)
        blocks = {e["block"]: e for e in charged["events"]}
        share = blocks["sums"]["scale"] / math.sqrt(K - cfg.dropout_tolerance)
        spread.append(noise.std() / share)
        level = 2.0 if blocks["sums"]["relation"] == "client" else 1.0
        declared = math.sqrt(sum((e["sensitivity"] / e["scale"]) ** 2 for e in charged["events"]))
        released = level * declared * math.sqrt((K - cfg.dropout_tolerance) / (shares - roster.colluders))
        assert charged["settled"] and charged["mu"] >= released * (1 - 1e-12), (i, charged["mu"], released)
    if cfg.level == "record":  # the printed guarantee is the epsilon every node charged (the same unit)
        for answer in res.report["budgets"]["nodes"].values():
            assert answer["spent_epsilon_run"] == pytest.approx(res.head.privacy.epsilon, rel=1e-9)
    tolerance = 5 / math.sqrt(2 * noise.size)
    assert all(abs(r - 1) < tolerance for r in spread), spread
