"""A lying server against the active version on the roster's SecAgg+ graph: attacks on one honest node's input.

The protection asserted here is the threat model's (:mod:`mechanisms.secagg_graph`): whatever the server
sends, every sum it can decode holds at least t - n_C honest inputs; in particular it never recovers one
honest node's input from that node's masked upload.  Each test plays the server through the real node code
Flower runs (:class:`adversary.Federation`) and then does the best it can with what the nodes revealed.
Run with ``python -m pytest tests/adversarial``.
"""

from __future__ import annotations

import numpy as np
from adversary import FRAC, Federation

from mechanisms import fixed_point, shamir
from mechanisms.secagg_crypto import (
    INFO_PAIR,
    INFO_SELF,
    ProtocolAbort,
    add_masks,
    hkdf,
    private_key,
    public_key,
)
from mechanisms.secagg_messages import pack_view

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


def test_a_victim_masking_with_a_few_neighbours_told_dropped_keeps_its_input():
    """The victim (ring position 0) is told at the masked stage that only its neighbours at positions +-2
    survive, so it masks with those two alone; its neighbours at +-1 are told it is alive, and everyone else
    is told that +-2 dropped after uploading.  The nodes at +-2 sign a view agreeing with the victim's
    (they never unmask); every other node signs its own view and gets t signatures on agreeing views from
    its group (the victim's own signature is not one of them: it disagrees with +-1 about whether they
    survived, and the server does not forward it).  Then +-1 and the victim reveal the victim's self-mask
    seed and +-1, +-3, +-4 the mask keys of +-2: the victim's upload alone would open."""
    fed = Federation(K=K, degree=DEGREE)
    assert fed.t == 3
    victim, near, far = at(fed, 0), {at(fed, 1), at(fed, -1)}, [at(fed, 2), at(fed, -2)]
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
    alive = {u: sorted(reqs[u]["alive"]) for u in range(K)}  # what each node masked with (and signed)
    uploaded = {u: sorted(set(alive[u]) - set(far)) for u in range(K)}
    for u in (victim, *far):
        uploaded[u] = alive[u]
    sigs = {}
    for u in range(K):
        msg = {"stage": "consistency", "session": server.session, "uploaded": uploaded[u]}
        sigs[u] = fed.send(u, msg)["sig"]

    def agree(u: int, w: int) -> bool:
        both = group(fed, u) & group(fed, w)
        return all(set(a[u]) & both == set(a[w]) & both for a in (alive, uploaded))

    revealed, aborts = {}, {}
    for u in sorted(set(range(K)) - set(far)):
        signers = [w for w in uploaded[u] if agree(u, w)]
        msg = {
            "stage": "unmask",
            "session": server.session,
            "uploaded": uploaded[u],
            "signers": signers,
            "sigs": [sigs[w] for w in signers],
            "views": [pack_view(alive[w], uploaded[w]) for w in signers],
            "echoes": [server.echoes[w] for w in uploaded[u]],
            "alive_lists": [pack_view(alive[w], []) for w in uploaded[u]],
        }
        try:
            revealed[u] = fed.send(u, msg)
        except ProtocolAbort as exc:
            aborts[u] = exc
    got = unmasked_alone(fed, server, revealed, victim, far)
    assert got is None or np.abs(got - fed.x[victim]).max() > 1e3, "the victim's input, alone"
    # The neighbours it did not mask with refuse: its signed echo names the survivors it masked with.
    assert near <= set(aborts) and {aborts[u].deviation for u in near} == {"split-survivors"}
