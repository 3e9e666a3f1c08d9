"""The default roster against a server with one colluding node: the issue's two attacks, through the real node
code Flower runs (:class:`adversary.Federation`).

The attack: the colluder sits in the victim's group and hands the server both kinds of its shares.  The
server shows the honest members of the group two kinds of view -- some see the victim among the uploaders
(they reveal its self-mask seed share), the others see it dropped (they reveal its mask-key share) -- and
gives each node the signatures of its group on views that agree with its own where the groups meet
(the colluder signs whatever is asked).  With t shares of both seeds the server opens the victim's upload
alone.  The roster's threshold stops it when 2t > n + c (n the group size): the default roster declares
one colluder and takes the smallest such t (:func:`mechanisms.secagg.threat.default_threshold`).

Two rosters each: the default one (make_roster with no threshold and no colluders), under which every
split of the victim's group fails, and one whose operator declared no colluder (t = 3), under which one of
the splits recovers the victim's input to the fixed-point step (so the attack here is the issue's, and
would find the input if the threshold allowed it).  Before this change the default roster was the
second one.
"""

from __future__ import annotations

import hashlib
import itertools

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
from mechanisms.secagg.identity import make_roster
from mechanisms.secagg.masking.messages import pack_view
from mechanisms.secagg.masking.views import agrees, view_digest
from mechanisms.secagg.threat import colluders_tolerated, default_threshold, masking_threat


def _group(fed, u):
    return frozenset(fed.roster.graph[u]) | {u}


def _leaked(fed, c):
    """A colluder's shares of every member of its group, both kinds (read from its state after the masked stage)."""
    from privfed.flower.secagg import STATE_KEY

    st = dict(fed.ctx[c].state[STATE_KEY])
    who = [int(w) for w in st["share_from"]]
    return {
        "about": who + who,
        "kind": ["b"] * len(who) + ["s"] * len(who),
        "share": [bytes(s) for s in st["b_shares"]] + [bytes(s) for s in st["s_shares"]],
    }


def _secret(revealed, kind, about, t):
    shares = {
        w + 1: int.from_bytes(bytes(s), "little")
        for w, rep in revealed.items()
        for a, k, s in zip(rep["about"], rep["kind"], rep["share"])
        if a == about and k == kind
    }
    return (shamir.combine(shares, t) if len(shares) >= t else None), len(shares)


def split_attack(fed: Federation, victim: int, colluder: int, dropped_side: set[int]):
    """Run the attack with the honest members ``dropped_side`` of the victim's group seeing it dropped.
    Returns (the victim's input if the server opened its upload alone, else None; the shares it held of the
    victim's self-mask seed and of its mask key)."""
    server = fed.server()
    fed.run_until(server, "consistency")
    alive = {u: sorted(_group(fed, u)) for u in range(fed.K)}  # everybody uploaded
    uploaded = {u: [w for w in alive[u] if not (u in dropped_side and w == victim)] for u in range(fed.K)}
    honest = [u for u in range(fed.K) if u != colluder]
    sigs = {u: fed.send(u, dict(server.requests()[u], uploaded=uploaded[u]))["sig"] for u in honest}
    digest = hashlib.sha256(fed.digest[victim]).digest()
    revealed, refused = {}, {}
    for u in honest:
        signers, sig_list, views = [], [], []
        for w in uploaded[u]:
            if w == colluder:  # it signs the view agreeing with u's on its group
                U2 = sorted(set(alive[u]) & _group(fed, w))
                U3 = sorted(set(uploaded[u]) & _group(fed, w))
                sig = fed.ids[w].sign(view_digest(fed.roster, server.session, U2, U3, digest))
            elif agrees(fed.roster, _group(fed, u), alive[u], uploaded[u], w, alive[w], uploaded[w]):
                U2, U3, sig = alive[w], uploaded[w], sigs[w]
            else:
                continue
            signers.append(w)
            sig_list.append(sig)
            views.append(pack_view(U2, U3))
        msg = {
            "stage": "unmask",
            "session": server.session,
            "uploaded": uploaded[u],
            "signers": signers,
            "sigs": sig_list,
            "echoes": [server.echoes[w] for w in uploaded[u]],
        }
        if fed.roster.degree is not None:
            msg["views"] = views
            msg["alive_lists"] = [pack_view(alive[w], []) for w in uploaded[u]]
        try:
            revealed[u] = fed.send(u, msg)
        except ProtocolAbort as exc:
            refused[u] = exc
    revealed[colluder] = _leaked(fed, colluder)
    b, nb = _secret(revealed, "b", victim, fed.t)
    s, ns = _secret(revealed, "s", victim, fed.t)
    if b is None or s is None:
        return None, (nb, ns)
    y = server.view.masked_uploads[victim].copy()
    mine = private_key(s)
    peers = [w for w in alive[victim] if w != victim]
    pair = [
        hkdf(mine.exchange(public_key(server.adverts[w]["s_pk"])), INFO_PAIR + server.session) for w in peers
    ]
    add_masks(
        y,
        [hkdf(b.to_bytes(32, "little"), INFO_SELF + server.session), *pair],
        [False, *[w < victim for w in peers]],
    )
    return fixed_point.decode(y, FRAC), (nb, ns)


def _every_split(roster_ids, K, degree, victim, colluder):
    """The attack for every split of the victim's honest group members: {side: (recovered input, shares)}."""
    out = {}
    fed0 = Federation(K=K, degree=degree, roster=roster_ids)
    others = sorted(_group(fed0, victim) - {victim, colluder})
    for r in range(len(others) + 1):
        for side in itertools.combinations(others, r):
            fed = Federation(K=K, degree=degree, roster=roster_ids)
            out[side] = (split_attack(fed, victim, colluder, set(side)), fed.x[victim])
    return out


@pytest.mark.parametrize("K, degree", [(5, None), (12, 4)], ids=["complete K=5", "SecAgg+ K=12 k=4"])
def test_one_colluder_cannot_unmask_a_victim_under_the_default_roster(K, degree):
    roster_ids = make_roster(K, degree=degree)  # the defaults: no threshold, no colluders given
    roster = roster_ids[0]
    n = roster.group_size
    assert roster.threshold == default_threshold(n) == 4 and colluders_tolerated(n, roster.threshold) == 2
    # the threat model the run prints says so
    assert masking_threat(K, roster.threshold, degree).colluders_tolerated == 2
    victim = roster.ring[0] if degree else 0
    colluder = roster.ring[1] if degree else K - 1
    results = _every_split(roster_ids, K, degree, victim, colluder)
    assert len(results) == 2 ** (n - 2)
    for side, ((got, (nb, ns)), _) in results.items():
        assert got is None, side  # never both secrets
        assert min(nb, ns) < roster.threshold


@pytest.mark.parametrize("K, degree", [(5, None), (12, 4)], ids=["complete K=5", "SecAgg+ K=12 k=4"])
def test_the_same_attack_unmasks_a_victim_when_the_operator_declared_no_colluder(K, degree):
    roster_ids = make_roster(K, 3, 0, degree=degree)  # t = 3: the old default, now an explicit choice
    assert colluders_tolerated(roster_ids[0].group_size, 3) == 0
    victim = roster_ids[0].ring[0] if degree else 0
    colluder = roster_ids[0].ring[1] if degree else K - 1
    results = _every_split(roster_ids, K, degree, victim, colluder)
    opened = [(side, got, x) for side, ((got, _), x) in results.items() if got is not None]
    assert opened, "the attack found no split"
    for _, got, x in opened:
        assert (
            np.abs(got - x).max() <= 2.0 ** -(FRAC + 1) * 1.01
        )  # the victim's input, to the fixed-point step
