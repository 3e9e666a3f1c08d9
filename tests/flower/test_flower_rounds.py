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
#: A Flower run's partition is its run config's (FlowerConfig's defaults here), for one round or many.
FLOWER_DATA = {"partition": "dirichlet", "alpha": 0.5, "seed": 0}


def _nodes():
    return {10 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}


def _eta(head):
    return np.concatenate([head.bias[:, None], head.weight], axis=1)


def test_flower_rounds_give_run_rounds_heads_bit_for_bit():
    cfg = FlowerConfig(method="fedlog", clients=K, rounds=R, rounds_params=PARAMS, timeout=120)
    res = serve(LocalGrid(_nodes()), cfg)
    ref = run_rounds(
        clients=K, rounds=R, baselines=(), **FLOWER_DATA, **{**PARAMS, "families": tuple(PARAMS["families"])}
    )
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
    with pytest.raises(
        ConfigError, match=r"level client adds noise to the aggregate: pass --secure-agg mask \(the nodes"
    ):
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


def test_a_flower_rounds_run_partitions_by_its_run_config_and_its_report_says_how():
    """--partition, --alpha and --seeds were ignored by multi-round runs on Flower (always rounds' shards of
    seed 0), while the report described the run config's partition and a one-round run's counts."""
    from privfed.flower.checks import rounds_config
    from privfed.rounds.training import RoundsSetup

    cfg = FlowerConfig(
        method="fedlog", clients=K, rounds=2, partition="iid", partition_seed=4, rounds_params=PARAMS
    )
    rc = rounds_config(cfg)
    assert (rc.partition, rc.alpha, rc.seed) == ("iid", cfg.alpha, 4)
    data = rc.data_rules()
    setup = RoundsSetup(rc)  # what every node trains on
    assert data["partition"] == "iid" and data["seeds"] == [4] and data["clients"] == K
    assert (
        data["used_samples"] == int(setup.part.sizes().sum()) and data["train_samples"] == setup.y_all.numel()
    )
    shards = rounds_config(
        FlowerConfig(method="fedlog", clients=K, rounds=2, partition="shards", rounds_params=PARAMS)
    )
    assert shards.data_rules()["partition"] == "shards (2 classes per client)"
    assert shards.data_rules()["used_samples"] == int(RoundsSetup(shards).part.sizes().sum())
    for key, value in (("partition", "iid"), ("alpha", 0.3), ("seed", 2)):  # one source: the run config's
        with pytest.raises(
            ConfigError, match=r"rounds-params \['%s'\]: a Flower run's partition is the run config's" % key
        ):
            rounds_config(
                FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params={**PARAMS, key: value})
            )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"lr": True}, "lr must be a number, got True"),
        ({"nu": "1"}, "nu must be a number, got '1'"),
        ({"head_init_scale": float("nan")}, "head_init_scale must be finite and >= 0, got nan"),
        ({"head_init_scale": -1.0}, r"head_init_scale must be finite and >= 0, got -1\.0"),
        ({"head_init_scale": "x"}, "head_init_scale must be a number, got 'x'"),
        ({"clients": 3, "epsilon": 1.0, "placement": "distributed", "dropouts": 1}, r"at most 0 may drop"),
        ({"rounds": 10**20}, r"rounds must be an integer in \[1, 2\*\*53\]"),
        # misspelt settings of a run without noise were accepted and ignored
        ({"level": "user"}, r"level must be one of \['record', 'client'\], got level='user'"),
        ({"placement": "nowhere"}, "placement must be one of"),
        ({"calibration": "x"}, "calibration must be one of"),
        ({"record_bound": "y"}, "record_bound must be one of"),
        ({"clip_norm": "z"}, "clip_norm must be one of"),
        (
            {"clients": 5, "epsilon": 1.0, "placement": "central", "tolerate": 2},
            "tolerate=2 sizes the noise shares",
        ),
        ({"tolerate": 1}, r"with placement='central' and no noise it would be ignored"),
        ({"noise_seed": 2**70}, r"noise_seed must be below 2\*\*64"),
    ],
)
def test_rounds_settings_a_run_would_misuse_are_refused_up_front(kw, match):
    """lr=True trained at 1.0; nu='1', head_init_scale NaN / -1 / 'x' were Python's or numpy's errors; a
    dropout the masked sum's threshold cannot allow failed after the first round's training."""
    from privfed.rounds import RoundsConfig

    with pytest.raises(ConfigError, match=match):
        RoundsConfig(**{"local_epochs": 1, "families": ("mlp",), "init": "scratch", **kw}).validate()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"alpha": "x"}, "alpha must be a finite number > 0"),
        ({"partition_seed": None}, r"partition-seed must be an integer seed in 0..2\*\*64 - 1, got None"),
        ({"partition_seed": -1}, "partition-seed must be an integer seed"),
        (
            {"partition": "natural"},
            r"partition must be one of \['dirichlet', 'dirichlet-class', 'iid', 'shards'\] \(multi-round FedLog splits digits\)",
        ),
    ],
)
def test_a_rounds_run_checks_its_partition_before_building_the_rounds(kw, match):
    """The rounds config read alpha and the seed before the run config had checked them: Python's ValueError
    and TypeError, or a message naming rounds' seed for the partition seed."""
    with pytest.raises(ConfigError, match=match):
        FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params=PARAMS, **kw)


def test_rounds_params_read_one_family_name_as_a_list_of_one():
    """Before: families='cnn' reached RoundsConfig as ('c', 'n', 'n') and was refused."""
    from privfed.flower.checks import rounds_config

    cfg = FlowerConfig(method="fedlog", clients=4, rounds=3, rounds_params={"families": "cnn"})
    assert rounds_config(cfg).families == ("cnn",)
