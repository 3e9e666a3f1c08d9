"""Every value a Flower node receives, checked at the door (the in-process grid: milliseconds a run).

A node's own node config (``partition-id``, ``num-partitions``), the run config the operator writes
(``flwr run --run-config``) and the config the server sends each node are typed before anything is
computed: a wrong value is one line that names the key, and the server's report names the node.  Two
nodes holding one partition (the same ``partition-id``, or the same data) are refused by the server:
counted twice, one partition would weigh double and another would be left out.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from privfed.errors import ConfigError  # noqa: E402
from privfed.flower.config import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.server_app import serve  # noqa: E402


def _nodes(pids, n=3):
    return {i + 1: {"partition-id": p, "num-partitions": n} for i, p in enumerate(pids)}


@pytest.mark.parametrize(
    "bad,words",
    [
        (1.7, "partition-id=1.7 must be a whole number"),
        ("abc", "partition-id='abc' must be a whole number"),
        (True, "partition-id=True must be a whole number"),
        (-1, "partition-id=-1 must be >= 0"),
        (3, "partition-id=3 must lie in 0..num-partitions-1=2"),
    ],
)
def test_a_malformed_partition_id_is_refused_naming_the_node_and_the_key(bad, words, digits_cache):
    with pytest.raises(ConfigError) as exc:
        serve(LocalGrid(_nodes([0, bad, 2])), FlowerConfig(method="fedncm", clients=3, timeout=10))
    text = str(exc.value)
    assert "node 2: " in text and words in text and "\n" not in text, text


def test_a_whole_number_as_text_is_the_number(digits_cache):
    res = serve(LocalGrid(_nodes([0, "1", 2])), FlowerConfig(method="fedncm", clients=3, timeout=10))
    assert res.head.upload_bytes["K"] == 3


def test_two_nodes_with_one_partition_id_are_refused_not_counted_twice(digits_cache):
    with pytest.raises(
        ConfigError, match=r"nodes 1, 2 all hold partition-id=0: one partition would be counted twice"
    ):
        serve(LocalGrid(_nodes([0, 0, 2])), FlowerConfig(method="fedncm", clients=3, timeout=10))


def test_two_nodes_with_the_same_data_are_refused(tmp_path):
    F = np.random.default_rng(0).normal(size=(30, 5))
    y = np.arange(30) % 3
    np.savez(tmp_path / "a.npz", features=F, labels=y)
    np.savez(tmp_path / "b.npz", features=F[:10], labels=y[:10])
    nodes = {1: {"features": str(tmp_path / "a.npz")}, 2: {"features": str(tmp_path / "a.npz")},
             3: {"features": str(tmp_path / "b.npz")}}  # fmt: skip
    cfg = FlowerConfig(method="fedncm", clients=3, timeout=10, num_classes=3, dataset="file:nodes")
    with pytest.raises(ConfigError, match="nodes 1, 2 sent identical statistics"):
        serve(LocalGrid(nodes), cfg)
    nodes[2] = {"features": str(tmp_path / "b.npz")}  # distinct data: the run goes through
    np.savez(tmp_path / "b.npz", features=F[10:20], labels=y[10:20])
    nodes[3] = {"features": str(tmp_path / "c.npz")}
    np.savez(tmp_path / "c.npz", features=F[20:], labels=y[20:])
    assert serve(LocalGrid(nodes), cfg).head.upload_bytes["K"] == 3


@pytest.mark.parametrize(
    "run_config,words",
    [
        ({"timeout": True}, "run-config timeout=True has the wrong type: it must be a number"),
        ({"connect-timeout": "yes"}, "run-config connect-timeout='yes' has the wrong type"),
        ({"clients": 2.5}, "run-config clients=2.5 has the wrong type: it must be a whole number"),
        ({"param": "{"}, "run-config param is not valid JSON"),
        ({"param": "[1]"}, "run-config param must be a JSON object"),
        ({"rounds-params": '{"a":'}, "run-config rounds-params is not valid JSON"),
        ({"trusted-aggregator": "maybe"}, "run-config trusted-aggregator='maybe' has the wrong type"),
        ({"dataset": "synthetic:0:5"}, "must read synthetic:D:N with whole numbers D >= 1"),
        ({"dataset": "synthetic:5:-1"}, "must read synthetic:D:N"),
        ({"dataset": "synthetic:x:5"}, "must read synthetic:D:N"),
        ({"dataset": "synthetic:100000:100000"}, "lower D or N"),
        ({"seeds": f"{2**64},"}, "run-config seeds="),
        ({"noise-seed": 2**64, "eps": 1.0}, "noise-seed must be an integer seed in 0..2\\*\\*64 - 1"),
    ],
)
def test_run_config_values_are_typed_at_the_door(run_config, words):
    with pytest.raises(ConfigError, match=words) as exc:
        FlowerConfig.from_run_config({"method": "fedncm", "clients": 3, "eps": "inf", **run_config})
    assert "\n" not in str(exc.value) and "Error" not in str(exc.value)


@pytest.mark.parametrize(
    "key,value",
    [
        ("clients", 2.5),
        ("clients", "3"),
        ("timeout", True),
        ("epsilon", "1"),
        ("method_params", "{x"),
        ("method_params", "[1]"),
        ("trusted_aggregator", "yes"),
        ("trusted_aggregator", 1),
        ("partition_seed", 0.5),
        ("level", 1),
    ],
)
def test_the_config_a_node_receives_is_typed_at_the_door(key, value):
    wire = FlowerConfig(method="fedncm", clients=3).to_wire()
    with pytest.raises(ConfigError) as exc:
        FlowerConfig.from_wire({**wire, key: value})
    assert key in str(exc.value) and "\n" not in str(exc.value)
    assert FlowerConfig.from_wire(wire) == FlowerConfig(method="fedncm", clients=3)  # the honest one parses


def test_a_node_reports_a_malformed_run_config_from_the_server_in_one_line(digits_cache):
    """A server that sends timeout=true: the node refuses with one line, the server names the node."""
    from flwr.app import ConfigRecord, RecordDict

    grid = LocalGrid(_nodes([0, 1, 2]))
    cfg = FlowerConfig(method="fedncm", clients=3, timeout=10)
    bad = ConfigRecord({**cfg.to_wire(), "timeout": True, "run-nonce": "x"})
    from privfed.flower.transport import exchange

    errors = {}

    def on_reply(node, content):
        errors[node] = str(content["error"]["message"]) if "error" in content else ""

    exchange(grid, {1: RecordDict({"config": bad})}, "query", 10, on_reply, group_id="stats")
    assert "timeout=True must be a float" in errors[1] and "\n" not in errors[1]


def test_nodes_of_more_partitions_than_clients_are_refused_not_half_used(digits_cache, capsys):
    """4 simulated nodes (num-partitions=4) under clients=2 trained on 2 of the 4 partitions and recorded the data
    of a split into 2; the nodes now refuse, naming both numbers, and the server names the nodes it leaves out."""
    with pytest.raises(ConfigError) as exc:
        serve(LocalGrid(_nodes([0, 1, 2, 3], n=4)), FlowerConfig(method="fedncm", clients=2, timeout=10))
    assert "num-partitions=4, but the run config says clients=2" in str(exc.value)
    assert "set clients=4" in str(exc.value)
    assert "WARNING: 4 nodes are connected but clients=2" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"num-partitions=4, but the run config says clients=2"):
        serve(LocalGrid(_nodes([0, 1], n=4)), FlowerConfig(method="fedncm", clients=2, timeout=10))


def test_an_out_that_cannot_take_the_results_is_refused_before_any_node_is_asked(tmp_path, monkeypatch):
    """Found only when writing, a folder of other files threw away a release the nodes had already made."""
    import privfed.flower.server_app as server_app

    def no_node(*a, **k):
        raise AssertionError("the nodes were asked before the output folder was checked")

    monkeypatch.setattr(server_app, "wait_for_nodes", no_node)
    out = tmp_path / "foreign"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cfg = FlowerConfig(method="fedncm", clients=2, epsilon=1.0, clip=10.0, output=str(out))
    with pytest.raises(ConfigError, match=r"holds files privfed did not write \(notes.txt\)"):
        serve(LocalGrid(_nodes([0, 1], n=2)), cfg)
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("dataset", ["digit", "synthetic:64:abc"])
def test_a_misspelt_data_set_is_named_before_the_clip_its_default_would_need(dataset):
    """--dataset digit under DP was refused as a run without clip (the digits default did not apply)."""
    with pytest.raises(ConfigError, match=rf"dataset '?{dataset}'? must|got '{dataset}'"):
        FlowerConfig(method="fedncm", clients=2, epsilon=1.0, dataset=dataset)


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"clip": 1.0}, "clip is a setting of the DP release"),
        ({"trusted_aggregator": True}, "trusted-aggregator is a setting"),
        # (client level with noise needs an aggregate to add it to: here the trusted server's)
        (
            {"level": "client", "max_records": 5, "trusted_aggregator": True},
            "trusted-aggregator, level, max-records are settings",
        ),
        ({"noise_seed": 3}, "noise-seed is a setting"),
        ({"secure": "mask", "dropout_tolerance": 1}, "dropout-tolerance is a setting"),
    ],
)
def test_dp_settings_without_noise_are_refused_not_recorded_as_used(kw, words):
    """eps=inf with clip=1 or noise-seed=3 ran without noise while results.json recorded both (and report.json
    called the noise seeded): they change nothing without noise, so they are refused."""
    with pytest.raises(ConfigError, match=rf"{words}.*no eps is finite \(no noise\)"):
        FlowerConfig(method="fedncm", clients=3, **kw)
    assert FlowerConfig(method="fedncm", clients=3, epsilon=1.0, **{"clip": 1.0, **kw}).private


def test_a_dropout_tolerance_without_secure_aggregation_is_refused():
    with pytest.raises(
        ConfigError, match=r"dropout-tolerance=2 sizes the noise shares of secure aggregation"
    ):
        FlowerConfig(method="fedncm", clients=3, epsilon=1.0, clip=1.0, dropout_tolerance=2)


def test_dp_with_flowers_secaggplus_is_refused_first():
    """With max-records the refusal said to drop it, which only led to the refusal of DP on Flower's SecAgg+."""
    with pytest.raises(ConfigError, match=r"^DP noise is not offered with Flower's SecAgg\+"):
        FlowerConfig(
            method="fedncm",
            clients=4,
            epsilon=1.0,
            clip=10.0,
            max_records=1000,
            secure="flwr-secaggplus-insecure",
        )
