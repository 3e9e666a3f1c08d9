"""A lying server against the active-adversary version on the roster's SecAgg+ graph.

Threat model (:mod:`mechanisms.secagg.graph`): the operator draws a k-regular graph into the roster; each
node checks every list against its own group (itself and its k neighbours), signs its view of its group,
and unmasks only after t signatures from uploaders of its group on views that agree with its own where the
groups overlap; t >= 2, 2t > k + 1 + n_C.  For every message a node receives the server lies in each way
it could, through the real node code Flower runs, and either the node refuses or the server never holds t
shares of both seeds of an honest node, nor t shares of the mask key of a node whose shares it used.
Run with ``python -m pytest tests/adversarial``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from adversary import FRAC, Federation, only

from mechanisms.secagg import fixed_point, shamir
from mechanisms.secagg.crypto import INFO_PAIR, ProtocolAbort, add_masks, hkdf, private_key, public_key
from mechanisms.secagg.masking import harary_graph
from mechanisms.secagg.masking.messages import pack_view
from mechanisms.secagg.masking.server import MaskingServer

K, DEGREE = 12, 4


def sparse(**kw) -> Federation:
    return Federation(K=K, degree=DEGREE, **kw)


def group(fed: Federation, u: int) -> set[int]:
    return set(fed.roster.graph[u]) | {u}


def non_neighbour(fed: Federation, u: int) -> int:
    return min(set(range(K)) - group(fed, u))


def agrees(fed: Federation, u: int, view_u, w: int, view_w) -> bool:
    """The rule the server must meet, written out: u's and w's views say the same about their common nodes."""
    both = group(fed, u) & group(fed, w)
    return all(set(a) & both == set(b) & both for a, b in zip(view_u, view_w))


def split_run(fed, server, uploaded: dict[int, list[int]], alive=None, forward: str = "agreeing"):
    """From the consistency stage on: each node u signs the uploader list ``uploaded[u]`` it is shown (with
    ``alive[u]`` its survivor list, the honest one by default), then the server forwards to each node the
    signatures of its group's uploaders: with ``forward="agreeing"`` only those whose view agrees with the
    node's own (the best a lying server can do), with ``"all"`` every one.  Returns (what each node
    revealed, the aborts)."""
    if alive is None:
        alive = {u: sorted(group(fed, u) & set(server.U2)) for u in uploaded}
    sigs, aborts, revealed = {}, {}, {}
    for u, U3 in uploaded.items():
        try:
            sigs[u] = fed.send(u, {"stage": "consistency", "session": server.session, "uploaded": U3})["sig"]
        except ProtocolAbort as exc:
            aborts[u] = exc
    for w in sigs:
        mine = (alive[w], uploaded[w])
        signers = [
            u
            for u in sorted(sigs)
            if u in uploaded[w] and (forward == "all" or agrees(fed, u, (alive[u], uploaded[u]), w, mine))
        ]
        msg = {
            "stage": "unmask",
            "session": server.session,
            "uploaded": uploaded[w],
            "signers": signers,
            "sigs": [sigs[u] for u in signers],
            "echoes": [server.echoes[u] for u in uploaded[w]],
            "views": [pack_view(alive[u], uploaded[u]) for u in signers],
            "alive_lists": [pack_view(alive[u], []) for u in uploaded[w]],
        }
        try:
            revealed[w] = fed.send(w, msg)
        except ProtocolAbort as exc:
            aborts[w] = exc
    return revealed, aborts


def shares_held(revealed: dict[int, dict], kind: str, about: int) -> int:
    return sum(
        1 for rep in revealed.values() for w, k in zip(rep["about"], rep["kind"]) if w == about and k == kind
    )


def assert_nobody_exposed(fed: Federation, revealed: dict[int, dict]) -> None:
    for v in range(K):
        b, s = shares_held(revealed, "b", v), shares_held(revealed, "s", v)
        assert not (b >= fed.t and s >= fed.t), f"t shares of both seeds of node {v}"
        if v in revealed:  # a node whose shares the server used is never also "dropped"
            assert s < fed.t, f"node {v} answered the unmask stage, yet its mask key is rebuilt"


def test_threshold_condition_of_the_roster_graph():
    fed = sparse()
    assert fed.t == 3 and 2 * fed.t > DEGREE + 1 and all(len(g) == DEGREE for g in fed.roster.graph)
    with pytest.raises(Exception, match=r"2t > k \+ 1 \+ n_C"):
        sparse(t=2)
    assert sparse(colluders=1).t == 4  # 2t > 4 + 1 + 1


@pytest.mark.parametrize("before, after", [((), ()), ((0,), (6,)), ((0, 4), (8,))])
def test_honest_server_gets_the_exact_sum_of_the_uploaders_with_dropouts(before, after):
    """Dropouts at ring positions 0, 4 and 8: every group (5 consecutive positions) keeps t = 3 signers."""
    fed = sparse()
    before, after = [fed.roster.ring[p] for p in before], [fed.roster.ring[p] for p in after]
    server = fed.server()
    fed.run_until(server, "masked")
    assert not fed.stage(server, skip=frozenset(before))
    assert not fed.stage(server, skip=frozenset(after))  # consistency
    assert not fed.stage(server, skip=frozenset(after))  # unmask
    assert server.done and server.graph == fed.roster.graph  # routed by the graph the nodes named
    got = fixed_point.decode(server.total, FRAC)
    assert np.abs(got - fed.true_sum(set(range(K)) - set(before))).max() <= K * 2.0 ** -(FRAC + 1)


@pytest.mark.parametrize("degree", [None, 6, 2])
def test_a_server_running_another_degree_is_refused(degree):
    fed = sparse()
    server = fed.server()
    reqs = server.requests()
    for msg in reqs.values():
        msg.pop("degree")
        if degree is not None:
            msg["degree"] = degree
    only(fed.stage(server, reqs), "wrong-graph", "keys")
    complete = Federation(K=6)  # a complete-graph roster told of a sparse run
    server = complete.server()
    reqs = {u: dict(m, degree=2) for u, m in server.requests().items()}
    only(complete.stage(server, reqs), "wrong-graph", "keys")


def test_a_server_routing_by_a_graph_of_its_choice_is_refused():
    fed = sparse()
    own = harary_graph(K, DEGREE, np.random.default_rng(99))
    assert own != fed.roster.graph
    server = MaskingServer(
        num_nodes=K, threshold=fed.t, length=fed.length, session=b"g" * 16, active=True, graph=own, degree=4
    )
    assert not fed.stage(server)  # keys: the degree is right
    aborts = fed.stage(server)
    moved = {u for u in range(K) if own[u] != fed.roster.graph[u]}
    assert set(aborts) == moved
    only(aborts, "outside-group", "shares")


def test_a_node_naming_other_neighbours_stops_the_server():
    fed = sparse()
    server = fed.server()
    reqs = server.requests()
    for u, msg in reqs.items():
        reply = fed.send(u, msg)
        if u == 0:
            reply["nbrs"] = sorted(set(reply["nbrs"]) - {reply["nbrs"][0]} | {non_neighbour(fed, 0)})
        server.receive(u, reply)
    with pytest.raises(ProtocolAbort, match="different rosters") as exc:
        server.close()
    assert exc.value.deviation == "wrong-graph"


def test_padded_lists_are_refused_at_every_stage():
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "shares")
    reqs = server.requests()
    z = non_neighbour(fed, 0)
    a = server.adverts[z]  # z's genuine signed advertisement, slipped into node 0's list
    msg = dict(reqs[0])
    msg.update(
        peers=msg["peers"] + [z],
        c_pk=msg["c_pk"] + [a["c_pk"]],
        s_pk=msg["s_pk"] + [a["s_pk"]],
        sig=msg["sig"] + [a["sig"]],
    )
    only(fed.stage(server, {0: msg}), "outside-group", "shares")

    fed = sparse()
    server = fed.server()
    fed.run_until(server, "masked")
    msg, z = server.requests()[0], non_neighbour(fed, 0)
    only(fed.stage(server, {0: dict(msg, alive=sorted(msg["alive"] + [z]))}), "outside-group", "masked")

    fed = sparse()
    server = fed.server()
    fed.run_until(server, "consistency")
    msg, z = server.requests()[0], non_neighbour(fed, 0)
    only(
        fed.stage(server, {0: dict(msg, uploaded=sorted(msg["uploaded"] + [z]))}),
        "unknown-node",
        "consistency",
    )

    fed = sparse()
    server = fed.server()
    fed.run_until(server, "unmask")
    msg, z = server.requests()[0], non_neighbour(fed, 0)
    only(
        fed.stage(server, {0: dict(msg, uploaded=sorted(msg["uploaded"] + [z]))}),
        "inconsistent-lists",
        "unmask",
    )
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "unmask")
    msg, z = server.requests()[0], non_neighbour(fed, 0)
    out = dict(msg, signers=msg["signers"] + [z], sigs=msg["sigs"] + [server.signers[z]])
    only(fed.stage(server, {0: out}), "malformed", "unmask")


def test_a_shrunk_neighbour_list_is_a_dropout_or_refused():
    # Node 0 never hears of neighbour w's keys; the server then lists w alive to it: refused.
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "shares")
    w = min(fed.roster.graph[0])
    reqs = server.requests()
    i = reqs[0]["peers"].index(w)
    reqs[0] = {
        k: (v[:i] + v[i + 1 :] if k in ("peers", "c_pk", "s_pk", "sig") else v) for k, v in reqs[0].items()
    }
    assert not fed.stage(server, reqs)
    aborts = fed.stage(server)  # node 0 is told w survived; w expects node 0's share, never sent
    assert set(aborts) == {0, w}
    assert aborts[0].deviation == "unknown-node" and aborts[w].deviation == "wrong-ids"
    # Below the threshold within the group: a survivor list of t - 1 of node 0's group is refused.
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "masked")
    msg, w = server.requests()[0], min(fed.roster.graph[0])
    keep = [0, w]
    box = dict(zip(msg["from"], msg["ct"]))
    short = dict(msg, alive=keep, **{"from": [w], "ct": [box[w]]})
    only(fed.stage(server, {0: short}), "short-list", "masked")


def test_a_neighbourhood_below_threshold_after_dropouts_aborts():
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "masked")
    gone = sorted(fed.roster.graph[0])[:3]  # 3 of node 0's 4 neighbours do not upload: 2 < t left
    assert not fed.stage(server, skip=frozenset(gone))
    aborts = fed.stage(server)
    assert 0 in aborts
    only(aborts, "short-list", "consistency")


FED = sparse()  # one roster for every split of one test


@pytest.mark.parametrize("forward", ["agreeing", "all"])
@pytest.mark.parametrize("victim", [0, 7])
def test_every_split_of_a_neighbourhood_on_the_victims_upload_exposes_nobody(victim, forward):
    """All 2^k ways of telling the victim's neighbours "it uploaded" or "it dropped": whatever signatures the
    server forwards, it never holds t shares of both seeds of any node."""
    nbrs = sorted(FED.roster.graph[victim])
    for n in range(len(nbrs) + 1):
        for told_dropped in itertools.combinations(nbrs, n):
            fed = sparse()
            fed.roster, fed.ids = FED.roster, FED.ids  # one roster: the same graph for every split
            server = fed.server()
            fed.run_until(server, "consistency")
            honest = {u: m["uploaded"] for u, m in server.requests().items()}
            views = {
                u: [v for v in U3 if not (u in told_dropped and v == victim)] for u, U3 in honest.items()
            }
            revealed, _ = split_run(fed, server, views, forward=forward)
            assert_nobody_exposed(fed, revealed)
            if told_dropped:
                assert (
                    shares_held(revealed, "b", victim) < fed.t or shares_held(revealed, "s", victim) < fed.t
                )


@pytest.mark.parametrize("forward", ["agreeing", "all"])
def test_a_live_node_listed_dropped_to_its_whole_group_keeps_its_self_mask(forward):
    """The victim uploads; every neighbour is told it dropped.  Forwarding the neighbours' (genuine)
    signatures on that view to the victim is refused; without them it has only its own, below t."""
    victim = 0
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "consistency")
    honest = {u: m["uploaded"] for u, m in server.requests().items()}
    views = {u: [v for v in U3 if v != victim or u == victim] for u, U3 in honest.items()}
    revealed, aborts = split_run(fed, server, views, forward=forward)
    expected = "short-list" if forward == "agreeing" else "inconsistent-lists"
    assert victim not in revealed and aborts[victim].deviation == expected
    assert_nobody_exposed(fed, revealed)
    assert shares_held(revealed, "b", victim) < fed.t  # no self-mask seed: the upload stays masked
    key = {
        w + 1: int.from_bytes(bytes(s), "little")
        for w, rep in revealed.items()
        for a, k, s in zip(rep["about"], rep["kind"], rep["share"])
        if a == victim and k == "s"
    }
    assert len(key) >= fed.t
    s_sk = private_key(shamir.combine(key, fed.t))
    y = server.view.masked_uploads[victim].copy()
    nbrs = sorted(fed.roster.graph[victim])
    pair = [
        hkdf(s_sk.exchange(public_key(server.adverts[v]["s_pk"])), INFO_PAIR + server.session) for v in nbrs
    ]
    add_masks(y, pair, [v < victim for v in nbrs])  # every pair mask removed; PRG(b_victim) remains
    assert np.abs(fixed_point.decode(y, FRAC) - fed.x[victim]).max() > 1e3


def test_a_survivor_split_at_the_masked_stage_exposes_nobody():
    """Some of node 3's neighbours are told at the masked stage that it dropped before uploading (they leave
    out its pair mask and expect no share from it) while it uploads."""
    victim = 3
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "masked")
    told = sorted(fed.roster.graph[victim])[:2]
    reqs = server.requests()
    for u in told:
        box = {v: c for v, c in zip(reqs[u]["from"], reqs[u]["ct"]) if v != victim}
        reqs[u] = dict(
            reqs[u],
            alive=[v for v in reqs[u]["alive"] if v != victim],
            **{"from": list(box), "ct": list(box.values())},
        )
    assert not fed.stage(server, reqs)
    honest = {u: m["uploaded"] for u, m in server.requests().items()}
    views = {u: [v for v in U3 if not (u in told and v == victim)] for u, U3 in honest.items()}
    alive = {
        u: [v for v in sorted(group(fed, u) & set(server.U2)) if not (u in told and v == victim)]
        for u in honest
    }
    revealed, aborts = split_run(fed, server, views, alive)
    assert_nobody_exposed(fed, revealed)
    # Those told it dropped reveal nothing about it (it is not in their U2): no mask key share of it at all.
    assert shares_held(revealed, "s", victim) == 0


def _unmask_request(fed: Federation):
    fed_server = fed.server()
    fed.run_until(fed_server, "unmask")
    return fed_server, fed_server.requests()


@pytest.mark.parametrize(
    "lie", ["keys-signature", "other-signer", "random", "other-session", "tampered-view"]
)
def test_forged_or_replayed_consistency_signatures_are_refused(lie):
    fed = sparse()
    server, reqs = _unmask_request(fed)
    w = 0
    msg = dict(reqs[w])
    i = next(i for i, u in enumerate(msg["signers"]) if u != w)
    u = msg["signers"][i]
    sigs, views = list(msg["sigs"]), list(msg["views"])
    if lie == "keys-signature":  # u's signature on its key advertisement, replayed as its consistency one
        sigs[i] = server.adverts[u]["sig"]
    elif lie == "other-signer":
        sigs[i] = server.signers[w]
    elif lie == "random":
        sigs[i] = bytes(64)
    elif lie == "other-session":  # u's signature on the same lists in another session of the same roster
        other = sparse()
        other.roster, other.ids = fed.roster, fed.ids
        s2 = other.server()
        other.run_until(s2, "unmask")
        sigs[i] = s2.signers[u]
    else:  # u's view altered where w cannot see (a node outside w's group dropped from u's lists)
        alive = sorted(group(fed, u) & set(server.U2))
        hidden = max(set(alive) - group(fed, w))
        cut = [v for v in alive if v != hidden]
        views[i] = pack_view(cut, cut)
    only(fed.stage(server, {w: dict(msg, sigs=sigs, views=views)}), "inconsistent-lists", "unmask")
    # Dropping the bad one leaves t - 1 or more: refused below t, accepted at t (the honest signatures).
    keep = [j for j in range(len(msg["signers"])) if j != i][: fed.t - 1]
    fed2 = sparse()
    server2, reqs2 = _unmask_request(fed2)
    m2 = dict(reqs2[w])
    short = {k: [m2[k][j] for j in keep] for k in ("signers", "sigs", "views")}
    only(fed2.stage(server2, {w: dict(m2, **short)}), "short-list", "unmask")


def test_a_split_broadcast_within_a_neighbourhood_is_refused_before_any_share():
    fed = sparse()
    victim = 5
    fed.digest[victim] = b"another broadcast"
    server = fed.server()
    fed.run_until(server, "consistency")
    assert not fed.stage(server)  # each signs what it saw
    aborts = fed.stage(server)
    hit = group(fed, victim)
    assert set(aborts) == hit  # every node of its group notices, each before revealing anything
    assert {e.deviation for e in aborts.values()} <= {"inconsistent-lists", "split-broadcast"}


@pytest.mark.parametrize(
    "tamper, deviation",
    [
        (lambda m: dict(m, alive_lists=m["alive_lists"][:-1]), "malformed"),  # one uploader's list missing
        (lambda m: {k: v for k, v in m.items() if k != "alive_lists"}, "malformed"),  # the field left out
        # a survivor list that carries an uploader list too (the packed view format, misused)
        (
            lambda m: dict(m, alive_lists=[pack_view([0], [0])] + m["alive_lists"][1:]),
            "malformed",
        ),
        # another survivor list for one uploader than it signed in its echo
        (
            lambda m: dict(m, alive_lists=[pack_view(m["uploaded"][:1], [])] + m["alive_lists"][1:]),
            "split-broadcast",
        ),
    ],
)
def test_a_lying_survivor_list_at_unmasking_is_refused(tamper, deviation):
    """Every uploader's survivor list (``alive_lists``, sent on the SecAgg+ graph) is checked against the echo
    it signed: a short, missing, malformed or substituted list aborts the node before it reveals a share."""
    fed = sparse()
    server = fed.server()
    fed.run_until(server, "unmask")
    msg = server.requests()[0]
    assert len(msg["alive_lists"]) == len(msg["uploaded"])
    only(fed.stage(server, {0: tamper(msg)}), deviation, "unmask")
