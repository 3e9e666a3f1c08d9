"""The noise a deployed node draws for a real DP release (no noise-seed).

The node's lifetime budget charges every release as mu-GDP (docs/node-budget.md), which holds against a
reader of the released values only for noise from exact samplers: float64 noise from numpy is open to
floating-point attacks on their low-order bits.  Every Flower node used to draw numpy's noise, with nothing
to choose OpenDP.  Now the node's operator chooses (node config ``noise-backend``), a deployed node (a
roster or a budget) draws OpenDP's by default when it is installed, and every reply says which, so the
server's report states the backend of each release; numpy's noise is reported as not holding against
floating-point attacks, and a seeded simulation stays numpy and says so.

OpenDP's values lie on its grid (2^-10): a release drawn from it is recognisable in what the server
receives, which a numpy draw is not (with probability 1).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("opendp")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, charges, deployed_nodes  # noqa: E402

from mechanisms.dp.calibration import gdp_mu  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.checks import rounds_config  # noqa: E402
from privfed.flower.fedlog import make_rounds_dp  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, DELTA, GRID = 4, 1e-5, 2.0**-10
PARAMS = {"local_epochs": 0, "families": ["mlp"], "init": "scratch"}
CASES = {
    "local": {},
    "masked": {"secure": "mask"},
    "rounds": {"method": "fedlog", "rounds": 2, "clip": 2.0, "rounds_params": PARAMS, "epsilon": 4.0},
}


def _real(**kw):
    return FlowerConfig(
        **{
            "method": "fedncm",
            "clients": K,
            "epsilon": 1.0,
            "delta": DELTA,
            "clip": 10.0,
            "timeout": 30,
            **kw,
        }
    )


def _on_grid(x) -> bool:
    q = np.asarray(x, dtype=np.float64) / GRID
    return bool(np.array_equal(q, np.rint(q)))


def _deployed(tmp_path, **extra):
    nodes, _, _ = deployed_nodes(tmp_path, K, budget=(100.0, DELTA), **{"allow-plain-release": True, **extra})
    return nodes


@pytest.mark.parametrize("kw", list(CASES.values()), ids=list(CASES))
def test_a_real_release_on_a_node_draws_noise_from_the_secure_backend(tmp_path, kw):
    nodes = _deployed(tmp_path)
    cfg = _real(**kw)
    res = serve(LocalGrid(nodes), cfg, keep_view=True)
    assert res.report["noise_backends"] == {str(n): "opendp" for n in nodes}
    notes = " ".join(res.head.privacy.notes)
    assert "floating-point" not in notes and "'opendp'" in notes
    if cfg.secure == "mask":  # the decoded sum of grid values (fixed point at 2^-32 is exact on it)
        assert all(_on_grid(s) for s in res.sums)
    else:  # every statistic the server received
        assert res.received and all(_on_grid(a) for _, _, arrays in res.received for a in arrays.values())
    # the rounding slack is calibrated for: every release still costs the mu its epsilon declares
    mu = make_rounds_dp(rounds_config(cfg)).mu_per_release if cfg.rounds > 1 else gdp_mu(1.0, DELTA)
    assert all(c["declared_mu"] == pytest.approx(mu, rel=1e-12) for c in charges(nodes, FIRST))
    assert all(c["noise"] == "opendp" for n in nodes for c in charges(nodes, n))  # and the ledger says so


def test_a_node_whose_operator_chooses_numpy_is_reported_as_open_to_floating_point_attacks(tmp_path):
    nodes = _deployed(tmp_path, **{"noise-backend": "numpy"})
    res = serve(LocalGrid(nodes), _real(), keep_view=True)
    assert res.report["noise_backends"] == {str(n): "numpy" for n in nodes}
    assert any("does not hold against" in n and "floating-point" in n for n in res.head.privacy.notes)
    assert not any(_on_grid(a) for _, _, arrays in res.received for a in arrays.values())
    assert all(c["noise"] == "numpy" for n in nodes for c in charges(nodes, n))


def test_a_seeded_simulation_draws_numpy_noise_whatever_the_node_chose_and_says_so(tmp_path):
    nodes = _deployed(tmp_path, **{"noise-backend": "opendp", "allow-seeded-noise": True})
    res = serve(LocalGrid(nodes), _real(noise_seed=3))
    assert res.report["noise_backends"] == {str(n): "numpy" for n in nodes}
    assert res.report["noise_randomness"].startswith("seeded") and res.head.privacy.simulation


def test_nodes_that_draw_from_different_backends_are_refused_with_one_line(tmp_path):
    nodes = _deployed(tmp_path)
    nodes[FIRST]["noise-backend"] = "numpy"
    with pytest.raises(
        ConfigError, match="different backends .*node 100: numpy.*same node config noise-backend"
    ):
        serve(LocalGrid(nodes), _real())


def test_an_unknown_backend_in_the_node_config_is_refused_naming_the_key(tmp_path):
    nodes = _deployed(tmp_path, **{"noise-backend": "floats"})
    with pytest.raises(ConfigError, match="noise-backend='floats' is not a noise backend"):
        serve(LocalGrid(nodes), _real())
