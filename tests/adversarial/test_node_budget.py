"""A server against nodes that keep a lifetime privacy budget: whatever it asks, no node releases past its
budget, across rounds, runs, methods and restarts; a refusal and a budget answer carry no value of the data.

The real ClientApp and ServerApp over the in-process grid; each node's ledger file is made by the operator's
step (``init_ledger``).  A new ``LocalGrid`` is a restart of every node (fresh Flower state, the same node
configs and files).
"""

from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402

from mechanisms.dp.calibration import gdp_epsilon, gdp_mu  # noqa: E402
from privfed.errors import ConfigError, PrivfedError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.budget import FileBudgetStore, init_ledger  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, DELTA = 4, 1e-5
MU1 = gdp_mu(1.0, DELTA)  # one release calibrated for epsilon = 1 alone


def budget_for(releases: float) -> float:
    """The lifetime epsilon whose GDP filter admits ``releases`` releases of MU1 (a fraction: room to spare)."""
    return gdp_epsilon(MU1 * math.sqrt(releases), DELTA)


def _nodes(tmp_path, epsilon, n=K, partition_seed_dir="a", **allow):
    out = {}
    for i in range(n):
        path = tmp_path / partition_seed_dir / f"budget-{i}.json"
        path.parent.mkdir(exist_ok=True)
        if not path.exists():
            init_ledger(path)
        out[100 + i] = {
            "partition-id": i,
            "num-partitions": n,
            "dp-budget-epsilon": epsilon,
            "dp-budget-delta": DELTA,
            "dp-budget-ledger": str(path),
            "allow-seeded-noise": False,  # a deployed node's default (the in-process grid's simulated one allows it)
            **allow,
        }
    return out


def _plain(**kw):
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


class RecordingGrid(LocalGrid):
    """A LocalGrid that keeps every reply the server received (what a refusal gave away, if anything)."""

    def __init__(self, nodes, **kw):
        super().__init__(nodes, **kw)
        self.seen = []

    def pull_messages(self, ids):
        out = super().pull_messages(ids)
        self.seen.extend(out)
        return out


def test_one_release_more_than_the_budget_allows_is_refused_by_every_node_whatever_the_server_changes(
    tmp_path,
):
    """Budget: 3.5 releases of epsilon = 1.  The server asks for three (each run a new process on every node:
    a restart), then for a fourth under other configurations (another method, another split, its own noise
    seed): every node refuses before any statistic leaves it."""
    nodes = _nodes(tmp_path, budget_for(3.5))
    for i, cfg in enumerate((_plain(), _plain(method="fed3r"), _plain(partition_seed=5))):
        res = serve(LocalGrid(nodes), cfg)  # a new grid: every node restarted, its ledger file kept
        assert res.head.privacy.epsilon == pytest.approx(1.0, rel=1e-9)
        answers = res.report["budgets"]["nodes"]
        assert all(a["releases"] == i + 1 and a["releases_run"] == 1 for a in answers.values())
        assert all(a["spent_epsilon_run"] == pytest.approx(1.0, rel=1e-9) for a in answers.values())
        weakest = res.report["budgets"]["weakest"]
        assert weakest["remaining_epsilon"] == pytest.approx(
            gdp_epsilon(MU1 * math.sqrt(3.5 - (i + 1)), DELTA), rel=1e-9
        )
    for again in (_plain(), _plain(method="fedcgs"), _plain(partition_seed=9)):
        grid = RecordingGrid(nodes)
        with pytest.raises(ConfigError, match="refuses a plain .* release .*lifetime privacy budget") as exc:
            serve(grid, again)
        assert "4 node(s) refused the run at stage 'query'" in str(exc.value)
        assert not any(m.has_content() and "stats" in m.content for m in grid.seen)
    assert all(len(FileBudgetStore(c["dp-budget-ledger"]).load()) == 3 for c in nodes.values())


@pytest.mark.parametrize(
    "kw, text",
    [
        ({"noise_seed": 3}, "noise-seed=3, and noise drawn from a seed the server knows"),
        ({"trusted_aggregator": True}, "operator has not said it trusts the server"),
        (
            {
                "rounds": 2,
                "method": "fedlog",
                "clip": 2.0,
                "rounds_params": {"local_epochs": 0},
                "noise_seed": 1,
            },
            "noise-seed=1",
        ),
    ],
    ids=["seeded", "trusted", "seeded-rounds"],
)
def test_noise_the_server_could_remove_or_skip_is_not_charged_but_refused(tmp_path, kw, text):
    """A server that picks the noise seed (then subtracts the noise) or asks for clean statistics for its own
    noise gets a refusal from a budgeted node, unless the node's operator allows it (simulations, a server
    the operator trusts)."""
    nodes = _nodes(tmp_path, budget_for(3))
    with pytest.raises(ConfigError, match=text):
        serve(LocalGrid(nodes), _plain(**kw))
    allowed = _nodes(
        tmp_path,
        budget_for(3),
        partition_seed_dir="b",
        **{"allow-seeded-noise": True, "dp-trust-server": True},
    )
    serve(LocalGrid(allowed), _plain(**kw))
    assert all(
        len(FileBudgetStore(c["dp-budget-ledger"]).load()) == kw.get("rounds", 1) for c in allowed.values()
    )


def test_a_refusal_depends_on_the_budget_and_the_releases_not_on_the_data(tmp_path):
    """Two federations holding different data (two splits of digits) with the same budgets and the same
    releases spent: every node's refusal is the same line, but for the node's name."""
    refusals = []
    for where, seed in (("a", 0), ("b", 7)):
        nodes = _nodes(tmp_path, budget_for(1.5), partition_seed_dir=where)
        serve(LocalGrid(nodes), _plain(partition_seed=seed))
        grid = RecordingGrid(nodes)
        with pytest.raises(ConfigError):
            serve(grid, _plain(partition_seed=seed))
        refusals.append(
            sorted(
                str(m.content["error"]["message"]).split(":", 1)[1]
                for m in grid.seen
                if m.has_content() and "error" in m.content
            )
        )
    assert len(refusals[0]) == K and refusals[0] == refusals[1]
    assert len(set(refusals[0])) == 1  # every node: the same public numbers


def test_a_masked_release_is_admitted_only_if_it_fits_at_t_shares_and_is_charged_the_shares_present(tmp_path):
    """Distributed noise under masking (K = 4, t = 3): the node charges the release as if only t shares reached
    the sum (the fewest the protocol releases), then, at the unmask stage, the 4 that t signatures confirm.
    A budget of 1.5 releases admits the first (4/3 of MU1^2 at admission), settled to MU1 (the run's
    epsilon), and refuses the second (1 + 4/3 > 1.5)."""
    nodes = _nodes(tmp_path, budget_for(1.5))
    cfg = _plain(secure="mask")
    res = serve(LocalGrid(nodes), cfg)
    for c in nodes.values():
        (charged,) = FileBudgetStore(c["dp-budget-ledger"]).load()
        assert charged["settled"] and charged["mu"] == pytest.approx(MU1, rel=1e-12)
    answers = res.report["budgets"]["nodes"].values()
    assert all(a["spent_epsilon_run"] == pytest.approx(res.head.privacy.epsilon, rel=1e-9) for a in answers)
    with pytest.raises(
        ConfigError, match="stage .masked.: node 100 refuses .*lifetime privacy budget .* would be exceeded"
    ):
        serve(LocalGrid(nodes), cfg)
    for c in nodes.values():  # the refused release is not charged: the aggregation id was, the budget not
        assert len(FileBudgetStore(c["dp-budget-ledger"]).load()) == 1


def test_a_budgeted_federation_runs_a_second_experiment_with_fresh_noise(tmp_path):
    """The reason for the budget: a node that used to keep one DP release per round for life takes part in
    a second run (fresh noise shares: another sum), charged; a sum leaving a node out is still refused."""
    nodes = _nodes(tmp_path, budget_for(10))
    cfg = _plain(secure="mask")
    a = serve(LocalGrid(nodes), cfg)
    b = serve(LocalGrid(nodes), cfg)
    assert abs(a.sums[0] - b.sums[0]).max() > 1e-3  # two releases, two draws of noise
    assert all(x["releases"] == 2 for x in b.report["budgets"]["nodes"].values())


def test_rounds_are_releases_and_a_second_run_past_the_budget_stops_at_its_first_round(tmp_path):
    """Multi-round FedLog: each round is a release charged to every node.  A budget of 2.5 rounds' worth
    runs one two-round run, then refuses the next run's first round."""
    from privfed.flower.checks import rounds_config
    from privfed.flower.fedlog import make_rounds_dp

    params = {"local_epochs": 1, "families": ["mlp"], "init": "scratch"}
    cfg = FlowerConfig(
        method="fedlog",
        clients=3,
        rounds=2,
        rounds_params=params,
        epsilon=2.0,
        delta=DELTA,
        clip=2.0,
        timeout=60,
    )
    dp = make_rounds_dp(rounds_config(cfg))
    mu_round = dp.mu_per_release
    nodes = _nodes(tmp_path, gdp_epsilon(mu_round * math.sqrt(2.5), DELTA), n=3)
    res = serve(LocalGrid(nodes), cfg)
    spent = [a["spent_epsilon_run"] for a in res.report["budgets"]["nodes"].values()]
    assert spent == pytest.approx([res.head.privacy.epsilon] * 3, rel=1e-9)
    with pytest.raises(
        ConfigError, match="round 0.*refuses round 0 of multi-round FedLog.*would be exceeded"
    ):
        serve(LocalGrid(nodes), cfg)
    # Theorem 3.1's bound on bodies trained on the records: no formal guarantee, nothing the budget can charge
    paper = FlowerConfig(**{**cfg.__dict__, "rounds_params": {**params, "record_bound": "theorem"}})
    with pytest.raises(ConfigError, match="Theorem 3.1's bound gives no formal guarantee"):
        serve(LocalGrid(nodes), paper)


def test_a_missing_ledger_stops_the_node_before_any_release(tmp_path):
    nodes = _nodes(tmp_path, budget_for(3))
    os.unlink(nodes[102]["dp-budget-ledger"])
    for cfg, stage in ((_plain(), "query"), (_plain(secure="mask"), "setup")):
        grid = RecordingGrid(nodes)
        with pytest.raises(ConfigError, match=f"stage '{stage}'.*node 102: .*budget-2.json: no such file"):
            serve(grid, cfg)
        mine = [m for m in grid.seen if m.metadata.src_node_id == 102]
        assert mine and not any(m.has_content() and "stats" in m.content for m in mine)


def test_a_node_with_a_budget_refuses_releases_without_dp_noise(tmp_path):
    nodes = _nodes(tmp_path, budget_for(3))
    for cfg in (
        FlowerConfig(method="fedncm", clients=K, timeout=30),
        FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30),
        FlowerConfig(method="fedlog", clients=K, rounds=2, rounds_params={"local_epochs": 0}, timeout=30),
    ):
        with pytest.raises(PrivfedError, match="keeps a lifetime privacy budget .* without DP noise"):
            serve(LocalGrid(nodes), cfg)
    secaggplus = FlowerConfig(
        method="fedncm", clients=K, secure="flwr-secaggplus-insecure", clip=10.0, max_records=500, timeout=30
    )
    with pytest.raises(PrivfedError, match="refuses a secure fedncm sum: it keeps a lifetime privacy budget"):
        serve(LocalGrid(nodes), secaggplus)
    # a server that skips the setup and asks for Flower's SecAgg+ stages directly
    grid = LocalGrid(nodes)
    (reply,) = grid.send_and_receive([Message(RecordDict({}), dst_node_id=100, message_type="train")])
    assert (
        reply.has_error()
        and "refuses Flower's SecAgg+: it keeps a lifetime privacy budget" in reply.error.reason
    )


def _budget_query(grid, node, content):
    msg = Message(content, dst_node_id=node, message_type="query.budget")
    (reply,) = grid.send_and_receive([msg])
    return reply


def test_a_lying_server_asking_for_budgets_learns_only_the_budgets(tmp_path):
    """query.budget from a server that invents a run, repeats the question or sends no config: the answers
    are the budgets and what was charged, equal for nodes holding different data, never a statistic."""
    nodes = _nodes(tmp_path, budget_for(3))
    grid = LocalGrid(nodes)
    serve(grid, _plain())
    made_up = RecordDict({"config": ConfigRecord({**_plain().to_wire(), "run-nonce": "00" * 8})})
    answers = [dict(_budget_query(grid, n, made_up).content["budget"]) for n in sorted(nodes)]
    assert all(a == answers[0] for a in answers)  # four nodes, four data sets: one answer
    assert answers[0]["releases"] == 1 and answers[0]["releases_run"] == 0
    assert set(answers[0]) == {
        "budgeted",
        "unit",
        "epsilon",
        "delta",
        "releases",
        "spent_epsilon",
        "releases_run",
        "spent_epsilon_run",
        "remaining_epsilon",
    }
    again = dict(_budget_query(grid, 100, made_up).content["budget"])
    assert again == answers[0]  # asking again charges nothing and changes nothing
    bad = _budget_query(grid, 100, RecordDict({}))
    assert "malformed request" in str(bad.content["error"]["message"])
    unbudgeted = LocalGrid({200 + i: {"partition-id": i, "num-partitions": K} for i in range(2)})
    assert dict(_budget_query(unbudgeted, 200, made_up).content["budget"]) == {"budgeted": False}


@pytest.mark.parametrize(
    "kw, factor, settled",
    [
        ({}, 1.0, True),  # local noise: the node's own sigma
        ({"trusted_aggregator": True}, 1.0, True),  # the noise the trusted server declares on the sum
        ({"secure": "ckks"}, math.sqrt(4 / 3), False),  # CKKS: at least t = 3 contributions, never seen
    ],
    ids=["local", "trusted", "ckks"],
)
def test_each_placement_charges_the_noise_its_release_declares(tmp_path, kw, factor, settled):
    nodes = _nodes(tmp_path, budget_for(3), **{"dp-trust-server": True})
    serve(LocalGrid(nodes), _plain(**kw))
    for c in nodes.values():
        (charged,) = FileBudgetStore(c["dp-budget-ledger"]).load()
        assert charged["declared_mu"] == pytest.approx(MU1, rel=1e-12)
        assert charged["mu"] == pytest.approx(MU1 * factor, rel=1e-12) and charged["settled"] is settled


def test_a_node_that_drops_is_not_charged_and_the_survivors_are_charged_the_shares_present(tmp_path):
    """One node fails its masked stage (it never uploads): it is charged nothing; the three survivors settle
    at the unmask stage to the three shares their sum carried (4/3 of MU1^2): the epsilon the server
    reports for the run."""
    from privfed.flower.client_app import make_client_app

    nodes = _nodes(tmp_path, budget_for(3))
    res = serve(LocalGrid(nodes, make_client_app(faults={3: "masked"})), _plain(secure="mask"))
    assert res.head.secure_aggregation["summed_nodes"] == 3
    charged = {n: FileBudgetStore(c["dp-budget-ledger"]).load() for n, c in nodes.items()}
    assert charged[103] == []
    for n in (100, 101, 102):
        assert charged[n][0]["mu"] == pytest.approx(MU1 * math.sqrt(4 / 3), rel=1e-12)
        answer = res.report["budgets"]["nodes"][str(n)]
        assert answer["spent_epsilon_run"] == pytest.approx(res.head.privacy.epsilon, rel=1e-9)


def test_a_deployed_node_without_a_budget_refuses_dp_releases_unless_its_operator_allows_them(tmp_path):
    """A node deployed with a roster and no budget used to keep "one DP release per round name for life",
    which bounds nothing (the server names the rounds).  It now refuses every DP release with one line naming
    the node-config keys of a budget; a run without DP, or the operator's explicit allow-unbudgeted-dp=true,
    still runs."""
    from lying_server import deployed_nodes

    nodes, _, _ = deployed_nodes(tmp_path / "plain", K, colluders=0)
    dp = _plain(secure="mask")
    grid = RecordingGrid(nodes)
    with pytest.raises(
        ConfigError, match="stage 'setup'.*deployed .* keeps no lifetime privacy budget"
    ) as exc:
        serve(grid, dp)
    assert "dp-budget-epsilon, dp-budget-delta and dp-budget-ledger" in str(exc.value)
    assert "allow-unbudgeted-dp=true" in str(exc.value)
    assert not any(m.has_content() and "meta" in m.content for m in grid.seen)  # not even its shape
    serve(LocalGrid(nodes), FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30))  # no DP
    allowed = {n: {**c, "allow-unbudgeted-dp": "true"} for n, c in nodes.items()}
    assert serve(LocalGrid(allowed), dp).head.privacy.epsilon == pytest.approx(1.0, rel=1e-9)
