"""A lying server against the keys request a masked run's setup carries (the first sum's key advertisements
ride ``query.setup``), on nodes deployed with the operator's files (roster, identity, ledger).

The node answers a keys request riding the setup with the very handler that answers a stand-alone
``query.keys`` (same identity, roster and checks), so the questions are whether riding the setup gives a
server any request the stand-alone one would not:

1. weaker parameters (t, K, graph, session id, another stage): refused with the stand-alone refusal, word
   for word, and the setup's own answer (shape, bounds, colluders) is unchanged beside the refusal;
2. two key pairs for one sum: a second keys request (another setup or a stand-alone one) for the same
   session id restarts the node with fresh keys; the keys it advertised first are then refused as its own
   (``substituted-key``) and the session the setup opened cannot be resumed after another sum ran;
3. a run that is no masked run: a CKKS setup carrying a keys request advertises nothing;
4. the refusal as an oracle: what a node says to a lying keys request is the same for every node's data and
   every fresh session id (its text names the node's roster index and the request's values only);
5. a node told to fail at keys answers the setup without keys: dropped before its keys, and the printed
   threat model and record follow (t, K from the roster; the summed nodes those that uploaded);
6. a keys request riding a later setup (FedCOF's second sum) or a masked round's own message (multi-round
   FedLog): the node answers it as it answers one alone; the head, and every budget charge, are the honest
   run's;
7. a setup with keys sent after the node uploaded restarts its session: the old one cannot go on, the
   pending DP charge stays at the fewest shares, and no second upload of the release follows.

No lie here gets a node to advertise keys it would refuse alone, to carry two key pairs into one session, or
to release or charge anything more.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")
pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import Message, RecordDict  # noqa: E402
from lying_server import (  # noqa: E402
    FIRST,
    LyingServer,
    TamperingGrid,
    charges,
    deployed_nodes,
    digits_nodes,
    masked_rounds_config,
)

from mechanisms.secagg.masking.server import MaskingServer, keys_request  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.secagg import KEYS_REFUSAL, from_records, to_records  # noqa: E402

K = 4
SESSION = bytes(range(16))


def _deploy(tmp_path, secure="mask", **kw):
    nodes, roster, ids = deployed_nodes(tmp_path, K, **kw)
    cfg = FlowerConfig(method="fedncm", clients=K, secure=secure, timeout=30, degree=roster.degree)
    return LyingServer(LocalGrid(nodes), cfg), roster


def _setup_with_keys(srv: LyingServer, node: int, request: dict):
    """A setup that carries ``request`` as its keys request: the reply's content (or a refusal's text)."""
    return srv.send(node, "query.setup", RecordDict({"config": srv.config, **to_records(request)}))


def _keys_alone(srv: LyingServer, node: int, request: dict):
    return srv.send(node, "query.keys", to_records(request))


def _raw_setup(srv: LyingServer, node: int, content: RecordDict) -> Message:
    (reply,) = srv.grid.send_and_receive([Message(content, dst_node_id=node, message_type="query.setup")])
    return reply


# ------------------------------------------------------------------ 1. weaker parameters at setup
def _lies(roster):
    t, deg = roster.threshold, roster.degree
    return {
        "lower t": lambda m: m.update(t=t - 1),
        "higher t": lambda m: m.update(t=t + 1),
        "smaller roster": lambda m: m.update(K=K - 1),
        "larger roster": lambda m: m.update(K=K + 1),
        "another graph": lambda m: m.update(degree=2) if deg is None else m.pop("degree"),
        "short session id": lambda m: m.update(session=b"\x00" * 15),
        "a shares request": lambda m: m.update(stage="shares"),
        "an unmask request": lambda m: m.update(stage="unmask"),
        "no stage": lambda m: m.pop("stage"),
        "t as text": lambda m: m.update(t=str(t)),
    }


LIES = [
    "lower t",
    "higher t",
    "smaller roster",
    "larger roster",
    "another graph",
    "short session id",
    "a shares request",
    "an unmask request",
    "no stage",
    "t as text",
]


@pytest.mark.parametrize("lie", LIES)
def test_a_lying_keys_request_riding_the_setup_gets_the_stand_alone_refusal(tmp_path, digits_dataset, lie):
    """Each lie is sent twice to the same deployed node: as a stand-alone ``query.keys`` and inside the
    setup.  Both are refused, with the same text; the setup reply still answers the setup (its shape and the
    roster's colluders), carries the refusal under KEYS_REFUSAL and no key advertisement."""
    srv, roster = _deploy(tmp_path)
    assert (roster.threshold, roster.degree) == (3, None) and list(_lies(roster)) == LIES
    req = keys_request(SESSION, K, roster.threshold, roster.degree)
    _lies(roster)[lie](req)
    node = FIRST + 1
    alone = _keys_alone(srv, node, dict(req))
    assert isinstance(alone, str) and "aborts at stage 'keys'" in alone, alone
    got = _setup_with_keys(srv, node, dict(req))
    assert not isinstance(got, str), got  # the setup itself is answered
    assert "secagg" not in got and KEYS_REFUSAL in got, list(got.keys())
    assert str(got[KEYS_REFUSAL]["message"]) == alone
    assert str(got[KEYS_REFUSAL]["kind"]) == "ProtocolAbort"
    assert (int(got["meta"]["d"]), int(got["meta"]["C"]), int(got["meta"]["colluders"])) == (64, 10, 1)


def test_the_honest_request_is_answered_alike_and_a_graph_roster_refuses_the_complete_graph(
    tmp_path, digits_dataset
):
    """The honest keys request gets a signed advertisement either way (fresh keys each time); on a SecAgg+
    roster a setup whose keys request names the complete graph, or another degree, is refused as alone."""
    srv, roster = _deploy(tmp_path)
    req = keys_request(SESSION, K, roster.threshold, None)
    a = from_records(_keys_alone(srv, FIRST, dict(req)))
    b = from_records(_setup_with_keys(srv, FIRST, dict(req)))
    assert set(a) == set(b) == {"u", "c_pk", "s_pk", "sig"}
    assert (a["c_pk"], a["s_pk"]) != (b["c_pk"], b["s_pk"])  # every keys request draws fresh keys

    nodes, graph_roster, _ = deployed_nodes(tmp_path / "graph", 8, degree=4)
    cfg = FlowerConfig(method="fedncm", clients=8, secure="mask", timeout=30, degree=4)
    gsrv = LyingServer(LocalGrid(nodes), cfg)
    for degree in (None, 6):
        req = keys_request(SESSION, 8, graph_roster.threshold, degree)
        alone = _keys_alone(gsrv, FIRST + 2, dict(req))
        got = _setup_with_keys(gsrv, FIRST + 2, dict(req))
        assert "wrong-graph" not in alone and "roster graph is 4" in alone, alone
        assert str(got[KEYS_REFUSAL]["message"]) == alone and "secagg" not in got
    ok = from_records(_setup_with_keys(gsrv, FIRST + 2, keys_request(SESSION, 8, graph_roster.threshold, 4)))
    assert sorted(ok["nbrs"]) == sorted(graph_roster.graph[2])  # the roster's neighbours, never the server's


def test_a_keys_request_in_a_setup_whose_record_is_no_message_is_refused_not_a_crash(
    tmp_path, digits_dataset
):
    """The setup carries ``secagg`` bytes that are no message, or a ``secagg-arrays`` record: the keys
    handler's one-line malformed refusal rides the setup reply (the setup itself answered), never a
    ClientApp crash, which the server would count as a failed setup."""
    from flwr.app import ConfigRecord

    srv, roster = _deploy(tmp_path)
    req = to_records(keys_request(SESSION, K, roster.threshold, None))
    for content in (
        RecordDict({"config": srv.config, "secagg": ConfigRecord({"message": b"\x00junk"})}),
        RecordDict({"config": srv.config, **req, "secagg-arrays": ConfigRecord({"x": 1})}),
    ):
        reply = _raw_setup(srv, FIRST, content)
        assert not reply.has_error(), reply.error
        assert "meta" in reply.content and "secagg" not in reply.content
        assert "malformed" in str(reply.content[KEYS_REFUSAL]["message"])


# ------------------------------------------------------------------ 2. two key pairs for one sum
def _shares_requests(adverts: dict[int, dict], roster, session: bytes) -> dict[int, dict]:
    """The honest server's shares requests for the advertisements ``adverts`` (roster index -> reply)."""
    server = MaskingServer(
        num_nodes=K, threshold=roster.threshold, length=1, session=session, active=True, degree=roster.degree
    )
    for u, adv in adverts.items():
        server.receive(u, adv)
    server.close()
    return server.requests()


@pytest.mark.parametrize("again", ["setup", "keys"])
def test_keys_asked_twice_for_one_session_leave_one_key_pair_the_node_answers_for(
    tmp_path, digits_dataset, again
):
    """The server opens session S with the setup, then asks the victim for keys again for the same S (a
    second setup, or a stand-alone keys request): the victim advertises a fresh pair, signed for S as the
    first.  The server then routes the victim's first pair (the one it kept from the setup): the victim
    finds its own keys changed and aborts before sharing anything, so only one pair per node can carry a
    session forward, and no two views of one sum with one node's two key pairs exist."""
    srv, roster = _deploy(tmp_path)
    req = keys_request(SESSION, K, roster.threshold, None)
    first = {u: from_records(_setup_with_keys(srv, FIRST + u, dict(req))) for u in range(K)}
    victim = 2
    send = _setup_with_keys if again == "setup" else _keys_alone
    second = from_records(send(srv, FIRST + victim, dict(req)))
    assert (second["c_pk"], second["s_pk"]) != (first[victim]["c_pk"], first[victim]["s_pk"])

    requests = _shares_requests(first, roster, SESSION)
    got = srv.send(FIRST + victim, "query.shares", to_records(requests[victim]))
    assert isinstance(got, str), got
    assert "its own advertised keys came back changed" in got, got
    # the others, whose first pairs stand, share as the protocol says
    for u in (0, 1, 3):
        assert not isinstance(srv.send(FIRST + u, "query.shares", to_records(requests[u])), str)


def test_a_session_the_setup_opened_cannot_be_resumed_after_another_sum(tmp_path, digits_dataset):
    """The setup opens session S (the node advertised keys); the server runs a whole sum with a stand-alone
    keys request, then comes back to S with the setup's advertisements: every node refuses (its state is
    that of the finished sum), so the setup's opening is no second, held-open view of the node."""
    from privfed.flower.protocol import sum_vector_length

    srv, roster = _deploy(tmp_path)
    req = keys_request(SESSION, K, roster.threshold, None)
    replies = {u: _setup_with_keys(srv, FIRST + u, dict(req)) for u in range(K)}
    meta = replies[0]["meta"]
    length = sum_vector_length(srv.cfg.make_method(), int(meta["C"]), int(meta["d"]))
    _, total = srv.masked_sum([FIRST + u for u in range(K)], length)
    assert total is not None, srv.refusals
    requests = _shares_requests({u: from_records(r) for u, r in replies.items()}, roster, SESSION)
    for u in range(K):
        got = srv.send(FIRST + u, "query.shares", to_records(requests[u]))
        assert isinstance(got, str) and "request 'shares' in state 'done'" in got, got


def test_keys_asked_at_every_setup_spend_no_budget_and_the_one_release_still_charges_once(
    tmp_path, digits_dataset
):
    """Under DP, on nodes with a lifetime budget: the server sends the setup with a keys request five times
    (five fresh sessions); no node charges anything for them (keys carry nothing of the data), and the one
    masked sum that follows charges each node once."""
    from privfed.flower.protocol import sum_vector_length

    nodes, roster, _ = deployed_nodes(tmp_path, K, budget=(20.0, 1e-5))
    cfg = FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=1e-5, clip=10.0, secure="mask", timeout=30
    )
    srv = LyingServer(LocalGrid(nodes), cfg)
    for _ in range(5):
        replies = {
            u: _setup_with_keys(srv, FIRST + u, keys_request(os.urandom(16), K, roster.threshold, None))
            for u in range(K)
        }
        assert all("secagg" in r for r in replies.values()), replies
    assert all(charges(nodes, FIRST + u) == [] for u in range(K))
    meta = replies[0]["meta"]
    _, total = srv.masked_sum(
        [FIRST + u for u in range(K)], sum_vector_length(cfg.make_method(), int(meta["C"]), int(meta["d"]))
    )
    assert total is not None, srv.refusals
    assert all(len(charges(nodes, FIRST + u)) == 1 for u in range(K))


# ------------------------------------------------------------------ 3. a setup that is no masked run's
def test_a_ckks_setup_carrying_a_keys_request_advertises_no_masking_keys(tmp_path, digits_dataset):
    """A CKKS run's setup with a masking keys request beside it: the node answers the setup and ignores
    the request (no masking session opens outside a masked run)."""
    srv, roster = _deploy(tmp_path, secure="ckks")
    got = _setup_with_keys(srv, FIRST, keys_request(SESSION, K, roster.threshold, None))
    assert not isinstance(got, str), got
    assert "meta" in got and "secagg" not in got and KEYS_REFUSAL not in got


# ------------------------------------------------------------------ 4. the refusal as an oracle
def test_a_keys_refusal_at_setup_says_nothing_of_the_nodes_data(tmp_path, digits_dataset):
    """Four nodes with four different digits partitions, three fresh session ids each, one lie (t - 1): the
    refusals are one text once the node's roster index is taken out, and the honest advertisements have one
    shape; what a refusal says is fixed by the request and the roster, never by the data."""
    srv, roster = _deploy(tmp_path)
    texts, shapes = set(), set()
    for u in range(K):
        for _ in range(3):
            session = os.urandom(16)
            lie = keys_request(session, K, roster.threshold - 1, None)
            got = _setup_with_keys(srv, FIRST + u, lie)
            texts.add(re.sub(rf"\bnode {u}\b", "node U", str(got[KEYS_REFUSAL]["message"])))
            adv = from_records(
                _setup_with_keys(srv, FIRST + u, keys_request(session, K, roster.threshold, None))
            )
            shapes.add(tuple((k, len(v) if isinstance(v, bytes) else v == u) for k, v in sorted(adv.items())))
    assert len(texts) == 1, texts
    assert len(shapes) == 1, shapes


# ------------------------------------------------------------------ 5. a node told to fail at keys
def test_a_node_told_to_fail_at_keys_answers_the_setup_without_keys_and_the_threat_model_follows(
    digits_dataset,
):
    """``fail-at=keys`` on node 101: its setup reply carries no key advertisement, so the first sum counts it
    silent at keys and dropped before its upload; the printed threat model names the configured K and t and
    the three nodes summed."""
    nodes = digits_nodes(K)
    nodes[101]["fail-at"] = "keys"
    res = serve(LocalGrid(nodes), FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30))
    agg = res.head.secure_aggregation
    (rnd,) = agg["rounds"]
    assert rnd["dropped_before_upload"] == [101] and rnd["uploaded"] == 3
    assert agg["summed_nodes"] == 3 and agg["dropped"] == [101]
    threat = agg["threat"]
    assert (threat["num_nodes"], threat["threshold"], threat["colluders_tolerated"]) == (4, 3, 1)
    assert "(K=4, t=3, complete graph)" in agg["threat_model"]
    assert "This run summed 3 of 4 nodes' inputs" in agg["threat_model"]
    keys = rnd["stages"]["keys"]  # the setup's exchange carried it: the node is silent there, not failed
    assert (keys["answered"], keys["silent"], keys["failed"]) == (3, [101], {})


# ------------------------------------------------------------------ 6. keys riding a setup for a later sum
class _KeysAsSetup:
    """A tamper that sends every stand-alone keys request as a setup carrying it (with the run config the
    first message that carried one had): the server opens each later sum (FedCOF's
    second, every multi-round FedLog round's) the way the first one is opened."""

    def __init__(self):
        self.config, self.moved = None, 0

    def __call__(self, msg):
        kind = msg.metadata.message_type
        if kind != "query.keys" and self.config is None and "config" in msg.content:
            self.config = msg.content["config"]
        if kind == "query.keys":
            msg.metadata.message_type = "query.setup"
            msg.content["config"] = self.config
            self.moved += 1


def test_fedcofs_second_sum_opened_by_a_setup_is_the_stand_alone_one(digits_dataset):
    """FedCOF's second sum, its keys request sent inside a second setup: the nodes answer it as they answer a
    stand-alone one; the head is the honest run's (nothing but keys changed hands, no second upload)."""
    cfg = FlowerConfig(method="fedcof", clients=K, secure="mask", timeout=30)
    honest = serve(LocalGrid(digits_nodes(K)), cfg)
    tamper = _KeysAsSetup()
    moved = serve(TamperingGrid(digits_nodes(K), tamper), cfg)
    assert tamper.moved == K  # the second sum's keys requests, one a node
    assert moved.head.secure_aggregation["summed_nodes"] == K
    np.testing.assert_allclose(moved.head.weight, honest.head.weight, atol=1e-6)


def test_multi_round_fedlog_rounds_carrying_their_keys_charge_one_release_a_round(tmp_path):
    """Multi-round masked FedLog under DP on deployed nodes with a lifetime budget: every round's message
    carries its masked sum's keys request.  The keys draw no release: each node's budget holds one charge a
    round, the same for both rounds, and the same charges and epsilon as a second run on twin nodes."""
    cfg = masked_rounds_config(K)
    honest_nodes, _, _ = deployed_nodes(tmp_path / "honest", K, colluders=0, budget=(40.0, 1e-5))
    honest = serve(LocalGrid(honest_nodes), cfg)
    carried = []

    def count(msg):
        if msg.metadata.message_type == "query.round" and "secagg" in msg.content:
            carried.append(msg.metadata.dst_node_id)

    nodes, _, _ = deployed_nodes(tmp_path / "counted", K, colluders=0, budget=(40.0, 1e-5))
    run = serve(TamperingGrid(nodes, count), cfg)
    assert sorted(carried) == sorted(list(nodes) * 2)  # one keys request a node a round, in its round
    assert run.head.privacy.epsilon == pytest.approx(honest.head.privacy.epsilon, rel=1e-12)
    for n in nodes:
        got, want = charges(nodes, n), charges(honest_nodes, n)
        assert len(got) == len(want) == 2, (got, want)
        assert got[0]["mu"] == pytest.approx(got[1]["mu"], rel=1e-12) and got[0]["mu"] > 0
        assert [c["mu"] for c in got] == pytest.approx([c["mu"] for c in want], rel=1e-12)


# ------------------------------------------------------------------ 7. a setup that restarts a live session
def test_a_setup_with_keys_after_the_upload_neither_undercharges_nor_opens_a_second_upload(tmp_path):
    """Under DP with lifetime budgets: the victim uploads, then, before it signs the consistency round, the
    server sends it a setup with a fresh keys request (a new session starts; the live one is gone).  The
    victim refuses to go on with the old session; its pending charge stays at the fewest shares the sum
    could carry (never below what the summed shares cost); and a whole new sum of the same release is
    refused at its masked stage (one upload per aggregation, whatever session opened it)."""
    from mechanisms.dp.calibration import gdp_epsilon, gdp_mu
    from privfed.flower.protocol import sum_vector_length

    delta, victim = 1e-5, 1
    nodes, roster, _ = deployed_nodes(
        tmp_path, K, budget=(gdp_epsilon(gdp_mu(1.0, delta) * 10, delta), delta)
    )
    cfg = FlowerConfig(
        method="fedncm", clients=K, epsilon=1.0, delta=delta, clip=10.0, secure="mask", timeout=30
    )
    srv = LyingServer(LocalGrid(nodes), cfg)
    meta = next(iter(srv.setup(sorted(nodes)).values()))["meta"]
    length = sum_vector_length(cfg.make_method(), int(meta["C"]), int(meta["d"]))
    restarted = []

    def tamper(stage, u, msg):
        if stage == "consistency" and u == victim:
            restarted.append(
                _setup_with_keys(srv, FIRST + victim, keys_request(os.urandom(16), K, roster.threshold, None))
            )
        return msg

    server, total = srv.masked_sum(sorted(nodes), length, tamper=tamper)
    assert "secagg" in restarted[0]  # the victim advertised keys for the new session
    assert "request 'consistency' in state 'advertised'" in srv.refusals[("consistency", FIRST + victim)]
    assert total is not None and sorted(server.U3) == list(range(K))  # the others unmasked the four uploads
    (charged,) = charges(nodes, FIRST + victim)
    assert not charged["settled"]
    assert charged["mu"] >= charged["declared_mu"] * (1 - 1e-12)  # all K shares summed: the least it costs
    _, again = srv.masked_sum(sorted(nodes), length)
    assert again is None
    assert "second masked session" in srv.refusals[("masked", FIRST + victim)]
    assert len(charges(nodes, FIRST + victim)) == 1
