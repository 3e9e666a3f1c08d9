"""A lying server against the active version on the roster's SecAgg+ graph: attacks on one honest node's input.

The protection asserted here is the threat model's (:mod:`mechanisms.secagg.graph`): whatever the server
sends, every sum it can decode holds at least t - n_C honest inputs; in particular it never recovers one
honest node's input from that node's masked upload.  Each test plays the server through the real node code
Flower runs (:class:`adversary.Federation`) and then does the best it can with what the nodes revealed.
Run with ``python -m pytest tests/adversarial``.
"""

from __future__ import annotations

import numpy as np
import pytest
from adversary import FRAC, Federation

from mechanisms.secagg import fixed_point, shamir
from mechanisms.secagg.crypto import (
    INFO_PAIR,
    INFO_SELF,
    ProtocolAbort,
    add_masks,
    hkdf,
    private_key,
    public_key,
)
from mechanisms.secagg.masking.messages import pack_view

K, DEGREE = 12, 4


def group(fed: Federation, u: int) -> set[int]:
    return set(fed.roster.graph[u]) | {u}


def at(fed: Federation, p: int) -> int:
    """The node at ring position p (mod K)."""
    return fed.roster.ring[p % fed.K]


def seed(revealed: dict[int, dict], kind: str, about: int, t: int) -> int | None:
    """The secret (self-mask seed "b" or mask key "s") of node ``about`` rebuilt from t revealed shares, if held."""
    shares = {
        w + 1: int.from_bytes(bytes(s), "little")
        for w, rep in revealed.items()
        for a, k, s in zip(rep["about"], rep["kind"], rep["share"])
        if a == about and k == kind
    }
    return shamir.combine(shares, t) if len(shares) >= t else None


def unmasked_alone(fed, server, revealed: dict[int, dict], victim: int, masked_with: list[int]):
    """The victim's input from its upload alone, if the server holds its self-mask seed and the mask key of
    every node it masked with; else None."""
    b = seed(revealed, "b", victim, fed.t)
    keys = [seed(revealed, "s", w, fed.t) for w in masked_with]
    if b is None or any(k is None for k in keys):
        return None
    y = server.view.masked_uploads[victim].copy()
    own = public_key(server.adverts[victim]["s_pk"])
    pair = [hkdf(private_key(k).exchange(own), INFO_PAIR + server.session) for k in keys]
    add_masks(
        y,
        [hkdf(b.to_bytes(32, "little"), INFO_SELF + server.session), *pair],
        [False, *[w < victim for w in masked_with]],
    )
    return fixed_point.decode(y, FRAC)


def few_survivors(fed: Federation, victim: int, far: list[int]):
    """The attack: the victim is told at the masked stage that only ``far`` (t - 1 of its neighbours) survive,
    so it masks with those alone; its other neighbours are told it is alive, and everyone but the victim is
    told that ``far`` dropped after uploading.  ``far`` sign views agreeing with the victim's (they never
    unmask); every other node signs its own view and is sent the signatures of its group on views agreeing
    with its own (the most a lying server can forward).  Returns (server, revealed, aborts)."""
    near = set(fed.roster.graph[victim]) - set(far)
    server = fed.server()
    fed.run_until(server, "masked")
    reqs = server.requests()
    box = dict(zip(reqs[victim]["from"], reqs[victim]["ct"]))
    reqs[victim] = dict(
        reqs[victim], alive=sorted([victim, *far]), **{"from": far, "ct": [box[w] for w in far]}
    )
    for w in far:  # they agree with the victim where their groups meet, so its view can use theirs
        keep = sorted(group(fed, w) - (near & group(fed, w)))
        box = dict(zip(reqs[w]["from"], reqs[w]["ct"]))
        reqs[w] = dict(reqs[w], alive=keep, **{"from": [v for v in keep if v != w]})
        reqs[w]["ct"] = [box[v] for v in reqs[w]["from"]]
    assert not fed.stage(server, reqs)
    alive = {u: sorted(reqs[u]["alive"]) for u in range(fed.K)}  # what each node masked with (and signed)
    uploaded = {u: sorted(set(alive[u]) - set(far)) for u in range(fed.K)}
    for u in (victim, *far):
        uploaded[u] = alive[u]
    sigs, aborts = {}, {}
    for u in range(fed.K):
        msg = {"stage": "consistency", "session": server.session, "uploaded": uploaded[u]}
        try:
            sigs[u] = fed.send(u, msg)["sig"]
        except ProtocolAbort as exc:  # e.g. too few of its group listed as uploaders for its threshold
            aborts[u] = exc

    def agree(u: int, w: int) -> bool:
        both = group(fed, u) & group(fed, w)
        return all(set(a[u]) & both == set(a[w]) & both for a in (alive, uploaded))

    revealed = {}
    for u in sorted(set(range(fed.K)) - set(far) - set(aborts)):
        signers = [w for w in uploaded[u] if w in sigs and agree(u, w)]
        msg = {
            "stage": "unmask",
            "session": server.session,
            "uploaded": uploaded[u],
            "signers": signers,
            "sigs": [sigs[w] for w in signers],
            "echoes": [server.echoes[w] for w in uploaded[u]],
        }
        if fed.roster.degree is not None:
            msg["views"] = [pack_view(alive[w], uploaded[w]) for w in signers]
            msg["alive_lists"] = [pack_view(alive[w], []) for w in uploaded[u]]
        try:
            revealed[u] = fed.send(u, msg)
        except ProtocolAbort as exc:
            aborts[u] = exc
    return server, revealed, aborts


def test_a_victim_masking_with_a_few_neighbours_told_dropped_keeps_its_input():
    """On the 4-regular graph of 12 nodes (t = 3) the victim at ring position 0 masks with +-2 alone.  Each
    node but +-2 gets t agreeing signatures from its group (the victim's own is not among +-1's: it
    disagrees with them about whether they survived), so +-1 and the victim would reveal the victim's
    self-mask seed and +-1, +-3, +-4 the mask keys of +-2: the victim's upload alone would open.  Its
    signed echo names the survivors it masked with, and +-1 refuse."""
    fed = Federation(K=K, degree=DEGREE)
    assert fed.t == 3
    victim, near, far = at(fed, 0), {at(fed, 1), at(fed, -1)}, [at(fed, 2), at(fed, -2)]
    server, revealed, aborts = few_survivors(fed, victim, far)
    got = unmasked_alone(fed, server, revealed, victim, far)
    assert got is None or np.abs(got - fed.x[victim]).max() > 1e3, "the victim's input, alone"
    assert near <= set(aborts) and {aborts[u].deviation for u in near} == {"split-survivors"}


@pytest.mark.parametrize("K_, degree", [(5, None), (5, 4), (7, None), (7, 6)])
def test_on_the_complete_graph_or_degree_K_minus_1_the_same_attack_finds_too_few_signers(K_, degree):
    """There every view must agree in full: the nodes told the victim lives sign one view, too few for t (the
    victim and ``far`` sign the other, and the victim reveals only self-mask seed shares by it)."""
    fed = Federation(K=K_, degree=degree)
    victim = 0
    far = sorted(fed.roster.graph[victim])[: fed.t - 1]
    server, revealed, aborts = few_survivors(fed, victim, far)
    assert unmasked_alone(fed, server, revealed, victim, far) is None
    assert set(revealed) == {victim} and set(revealed[victim]["kind"]) == {"b"}
    assert set(aborts) == set(range(K_)) - {victim, *far}
    assert {e.deviation for e in aborts.values()} == {"short-list"}


def _leaked(fed: Federation, c: int) -> dict:
    """What a colluding node hands the server once it holds its shares (after the masked stage): the share of
    both secrets of every member of its group, in the form the unmask replies take."""
    from privfed.flower.secagg import STATE_KEY

    st = dict(fed.ctx[c].state[STATE_KEY])
    who = [int(w) for w in st["share_from"]]
    return {
        "about": who + who,
        "kind": ["b"] * len(who) + ["s"] * len(who),
        "share": [bytes(s) for s in st["b_shares"]] + [bytes(s) for s in st["s_shares"]],
    }


@pytest.mark.parametrize("position", [1, -1, 2, -2])
def test_with_a_colluding_neighbour_the_victim_still_keeps_its_input(position):
    """A roster for one colluder (n_C = 1: t = 4 on the 4-regular graph of 12 nodes).  The same attack, the
    victim masking with t - 1 neighbours told dropped, while one of its neighbours colludes and hands over
    both kinds of its shares of every member of its group.  The server adds those to whatever the honest
    nodes reveal; the victim's upload alone still does not open.  By counting: the victim and the neighbours
    told it lives are k + 1 - (t - 1) = 2 < t (2t > k + 1 + n_C), so even with the colluder's share the
    victim's self-mask seed cannot be rebuilt."""
    fed = Federation(K=K, degree=DEGREE, colluders=1)
    assert fed.t == 4
    victim = at(fed, 0)
    colluder = at(fed, position)
    nbrs = [at(fed, p) for p in (1, -1, 2, -2)]
    far = [w for w in nbrs if w != colluder][: fed.t - 1]  # the victim masks with these alone
    leaked = {}
    original = fed.send

    def send(u, msg):  # the colluder's shares, taken once it holds them (after the masked stage)
        if msg["stage"] == "consistency" and colluder not in leaked:
            leaked[colluder] = _leaked(fed, colluder)
        return original(u, msg)

    fed.send = send
    server, revealed, aborts = few_survivors(fed, victim, far)
    assert victim in leaked[colluder]["about"]  # the colluder holds both kinds of the victim's shares
    assert seed({**revealed, **leaked}, "b", victim, fed.t) is None
    got = unmasked_alone(fed, server, {**revealed, **leaked}, victim, far)
    assert got is None or np.abs(got - fed.x[victim]).max() > 1e3, "the victim's input, alone"
