"""Multi-round FedLog with local bodies as a Flower loop: the heads of privfed.rounds.run_rounds.

The real ClientApp (each node trains its own body, kept in its context.state
between rounds) and the server's loop run over the in-process grid.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.client_app import make_client_app  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.rounds import run_rounds  # noqa: E402

K, R = 3, 3
PARAMS = {"local_epochs": 1, "families": ["mlp", "cnn-narrow"], "init": "scratch"}


def _nodes():
    return {10 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}


def _eta(head):
    return np.concatenate([head.bias[:, None], head.weight], axis=1)


def test_flower_rounds_give_run_rounds_heads_bit_for_bit():
    cfg = FlowerConfig(method="fedlog", clients=K, rounds=R, rounds_params=PARAMS, timeout=120)
    res = serve(LocalGrid(_nodes()), cfg)
    ref = run_rounds(clients=K, rounds=R, baselines=(), **{**PARAMS, "families": tuple(PARAMS["families"])})
    assert len(res.heads) == R
    for r in range(R):
        np.testing.assert_array_equal(_eta(res.heads[r]), ref.history[r]["eta"])
    # The heads move from round to round (the bodies train against each new head).
    assert np.abs(_eta(res.heads[-1]) - _eta(res.heads[0])).max() > 1e-2
    stages = res.report["wire"]["stages"]
    assert sorted(stages) == [f"round-{r}" for r in range(R)]
    # Each node uploads C (d + 1) float64 values a round (and the arrays' names).
    assert all(st["answered"] == K and st["bytes_up_per_node"] >= 8 * 10 * 65 for st in stages.values())


def test_a_node_that_lost_its_body_stops_the_run_with_a_clear_error():
    app = make_client_app()

    def forgetful(msg, context):  # a node restarted without its state after round 0
        if msg.metadata.message_type == "query.round" and int(msg.content["round"]["index"]) == 1:
            context.state.clear()
        return app(msg, context)

    cfg = FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params=PARAMS, timeout=120)
    with pytest.raises(ConfigError, match=r"round 1.*node 1\d \(partition \d\) has no body from round 0"):
        serve(LocalGrid(_nodes(), forgetful), cfg)


def test_bad_multi_round_configurations_are_refused_before_any_message():
    with pytest.raises(ConfigError, match="only fedlog runs several rounds"):
        FlowerConfig(method="fedncm", clients=K, rounds=3)
    with pytest.raises(ConfigError, match="secure='ckks' is not offered over rounds"):
        FlowerConfig(method="fedlog", clients=K, rounds=3, epsilon=1.0, clip=1.0, secure="ckks")
    with pytest.raises(ConfigError, match="level='client' needs noise on the aggregate"):
        FlowerConfig(
            method="fedlog", clients=K, rounds=3, epsilon=1.0, clip=1.0, level="client", max_records=9
        )
    with pytest.raises(ConfigError, match="calibration must be one of"):
        FlowerConfig(
            method="fedlog", clients=K, rounds=3, epsilon=1.0, clip=1.0, rounds_params={"calibration": "x"}
        )
    with pytest.raises(ConfigError, match=r"rounds-params key\(s\) \['epochs'\] unknown"):
        FlowerConfig(method="fedlog", clients=K, rounds=3, rounds_params={"epochs": 1})
    with pytest.raises(ConfigError, match="rounds-params applies to multi-round FedLog"):
        FlowerConfig(method="fedlog", clients=K, rounds_params={"local_epochs": 1})


def test_command_line_takes_rounds_and_refuses_bad_ones_in_one_line(capsys):
    from privfed.commands.flower import main

    assert main(["--method", "fedncm", "--rounds", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only fedlog runs several rounds" in err[0]
    assert main(["--method", "fedlog", "--rounds", "3", "--rounds-params", "{bad"]) == 2
    assert "--rounds-params must be a JSON object" in capsys.readouterr().err
    assert (
        main(
            [
                "--method",
                "fedncm",
                "--secure",
                "flwr-secaggplus-insecure",
                "--eps",
                "inf",
                "--clients",
                "1024",
                "--clip",
                "1",
                "--max-records",
                "10",
            ]
        )
        == 2
    )
    assert "at most 1023 clients" in capsys.readouterr().err
