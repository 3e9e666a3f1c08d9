"""Requests a lying server builds by hand, sent to the real ClientApp over a LocalGrid (each message serialised
and parsed as over the wire): every one gets a refusal in the reply, never an exception escaping the node's
handler (which Flower reports as "ClientApp raised ..." with the node's traceback), and a release the node
cannot stand behind is refused.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402
from lying_server import FIRST, LyingServer, deployed_nodes, digits_nodes  # noqa: E402

from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.rounds import ROUND_STATISTICS, register_round_statistics  # noqa: E402
from privfed.flower.wire import arrays_record  # noqa: E402
from privfed.stats import ClientStats, compute_client_stats  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

STAGES = ("", "round", "setup", "budget", "ckks_keys", "ckks_encrypt", "ckks_decrypt")
STAGES += ("keys", "shares", "masked", "consistency", "unmask")


def _reply(grid: LocalGrid, node: int, message_type: str, content: RecordDict):
    (reply,) = grid.send_and_receive([Message(content, dst_node_id=node, message_type=message_type)])
    assert not reply.has_error(), f"{message_type}: the handler raised: {reply.error.reason[:300]}"
    return reply.content


@pytest.mark.parametrize("stage", STAGES)
def test_a_request_without_its_run_config_is_refused_in_the_reply(stage, tmp_path, digits_cache):
    """query and query.setup let a KeyError escape for a request without a config record."""
    nodes, _, _ = deployed_nodes(tmp_path, 3, budget=(4.0, 1e-5), **{"allow-plain-release": "true"})
    grid = LocalGrid(nodes)
    content = _reply(grid, FIRST, "query" + (f".{stage}" if stage else ""), RecordDict({}))
    assert "error" in content and "malformed" in str(content["error"]["message"])


def _round(srv: LyingServer, node: int, name: str, index) -> object:
    content = RecordDict(
        {
            "config": srv.config,
            "round": ConfigRecord({"name": name, "index": index}),
            "broadcast": arrays_record({"scale": np.ones(1)}),
        }
    )
    return srv.send(node, "query.round", content)


@pytest.mark.parametrize("index", ["abc", b"1", 1.5, -1, True])
def test_a_round_index_that_is_no_round_is_malformed(index, digits_cache):
    """ "abc" escaped as a ValueError; b"1" and 1.5 were read as round 1 and -1 as a round."""
    srv = LyingServer(LocalGrid(digits_nodes(2)), FlowerConfig(method="fedlog", clients=2, timeout=5))
    got = _round(srv, 100, "fedlog-rounds", index)
    assert isinstance(got, str) and "the round index must be an integer >= 0" in got


@pytest.fixture
def scaled_sums():
    @register_round_statistics("test-scaled-sums")
    def node_round(data, cfg, broadcast, r):
        st = compute_client_stats(data.features, data.labels, None, num_classes=data.num_classes)
        return ClientStats(counts=st.counts, sums=st.sums * broadcast["scale"][0])

    yield "test-scaled-sums"
    ROUND_STATISTICS.pop("test-scaled-sums", None)


def test_a_registered_round_is_released_only_without_a_privacy_claim_or_budget(
    tmp_path, scaled_sums, digits_cache
):
    """A registered multi-round method's exact statistics were answered under epsilon = 1, and by a node with
    a lifetime budget, which charged nothing: privfed adds no noise to them."""
    plain = LyingServer(LocalGrid(digits_nodes(2)), FlowerConfig(method="fedlog", clients=2, timeout=5))
    assert not isinstance(_round(plain, 100, scaled_sums, 0), str)  # eps = inf, no budget: answered
    private = FlowerConfig(method="fedlog", clients=2, epsilon=1.0, delta=1e-5, clip=1.0, timeout=5)
    got = _round(LyingServer(LocalGrid(digits_nodes(2)), private), 100, scaled_sums, 0)
    assert isinstance(got, str) and "privfed adds no DP noise to a registered method's statistics" in got
    nodes, _, _ = deployed_nodes(tmp_path, 2, budget=(4.0, 1e-5), **{"allow-plain-release": "true"})
    got = _round(
        LyingServer(LocalGrid(nodes), FlowerConfig(method="fedlog", clients=2, timeout=5)),
        FIRST,
        scaled_sums,
        0,
    )
    assert isinstance(got, str) and "keeps a lifetime privacy budget" in got


@pytest.mark.parametrize(
    "key, meant",
    [
        ("dp_budget_epsilon", "dp-budget-epsilon"),
        ("secagg_roster", "secagg-roster"),
        ("noise_backend", "noise-backend"),
        ("dp-budget-epsilom", "dp-budget-epsilon"),
        ("Allow-Plain-Release", "allow-plain-release"),
    ],
)
@pytest.mark.parametrize("stage", ["", "budget", "setup", "keys"])
def test_a_misspelt_node_config_key_is_refused_not_left_out(key, meant, stage, tmp_path, digits_cache):
    """Underscored budget keys left a node with no budget (five releases of epsilon 1 against an intended
    lifetime 0.5, the ledger untouched), and secagg_roster made a deployed node answer plain queries."""
    nodes = digits_nodes(2)
    nodes[FIRST][key] = "1"
    srv = LyingServer(
        LocalGrid(nodes), FlowerConfig(method="fedncm", clients=2, epsilon=1.0, clip=1.0, timeout=5)
    )
    got = srv.send(FIRST, "query" + (f".{stage}" if stage else ""), RecordDict({"config": srv.config}))
    assert (
        isinstance(got, str) and f"has {key!r}, which privfed does not read: did you mean {meant!r}?" in got
    )


def test_a_key_near_none_the_node_reads_is_left_to_the_apps_sharing_the_node_config(digits_cache):
    nodes = digits_nodes(2)
    nodes[FIRST]["my-app-learning-rate"] = "0.1"
    srv = LyingServer(LocalGrid(nodes), FlowerConfig(method="fedncm", clients=2, timeout=5))
    assert not isinstance(srv.send(FIRST, "query", RecordDict({"config": srv.config})), str)


def test_a_round_of_no_registered_method_is_named_so_under_a_privacy_claim(digits_cache):
    """Under epsilon = 1 a round of an unknown name was refused as "the registered method 'no-such'"."""
    private = FlowerConfig(method="fedlog", clients=2, epsilon=1.0, delta=1e-5, clip=1.0, timeout=5)
    got = _round(LyingServer(LocalGrid(digits_nodes(2)), private), 100, "no-such-method", 0)
    assert isinstance(got, str) and "no per-round statistics registered for 'no-such-method'" in got


def test_every_node_config_key_the_app_reads_is_known_to_the_misspelling_check():
    """A key read somewhere but missing from NODE_CONFIG_KEYS would be refused as a misspelling of another."""
    import pathlib
    import re

    from privfed.flower import budget, charges, dp
    from privfed.flower.values import NODE_CONFIG_KEYS

    source = "\n".join(p.read_text() for p in pathlib.Path(budget.__file__).parent.rglob("*.py"))
    read = set(re.findall(r"(?:node_config|conf)(?:\.get\(|\[)\s*\"([a-z][a-z0-9-]*)\"", source))
    read |= set(re.findall(r"(?:_allows\(context|node_int\([a-z_.]+), \"([a-z][a-z0-9-]*)\"", source))
    read |= {*budget.NODE_KEYS, dp.BACKEND_KEY, charges.UNBUDGETED}
    assert read >= {
        "secagg-roster",
        "dp-budget-ledger",
        "partition-id",
        "allow-plain-release",
    }  # the scan works
    assert read <= set(NODE_CONFIG_KEYS), sorted(read - set(NODE_CONFIG_KEYS))
