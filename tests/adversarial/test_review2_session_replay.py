"""A session id the server reuses in a later run, to replay what a node signed in the earlier one.

The session id is the server's choice, and the bytes a node signs (its key advertisement, its echo, its
consistency view) name the roster and the session but not the run.  A server that runs two sessions under
one id can therefore hand the nodes of the second one a node's signed key advertisement from the first:
its signature verifies.  The attack it would serve: a "ghost" node that takes no part in the second run,
yet is listed among its survivors (and uploaders), with keys the server may know more about.  It fails
because a survivor is one whose share messages every neighbour decrypted under a channel key agreed with
its own fresh key of this session: a share message replayed from the earlier run fails authentication at
every node, which aborts before it claims the aggregation or computes its input; and leaving the ghost's
shares out makes it a dropout, whose absence the sum honestly shows.
"""

from __future__ import annotations

import os

import numpy as np
from adversary import FRAC, Federation

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.identity import make_roster

K, GHOST = 5, 4


def _first_run(roster_ids, session):
    """An honest session: the ghost's key advertisement and the share messages it sent, as the server saw them."""
    fed = Federation(K=K, roster=roster_ids)
    server = fed.server(session)
    fed.run_until(server, "shares")
    ghost_advert = {"u": GHOST, **server.adverts[GHOST]}
    fed.stage(server)  # the shares stage: every node's share messages reach the server
    sent = {v: ct for (u, v), ct in server.view.encrypted_shares.items() if u == GHOST}
    return ghost_advert, sent


def _second_run(roster_ids, session, ghost_advert):
    """The same session id, the ghost offline: its earlier advertisement stands in for it at the keys stage."""
    fed = Federation(K=K, roster=roster_ids, seed=1)
    server = fed.server(session)
    for u, msg in server.requests().items():
        if u != GHOST:
            server.receive(u, fed.send(u, msg))
    server.receive(GHOST, dict(ghost_advert))
    server.close()
    return fed, server


def test_a_replayed_advertisement_makes_no_ghost_whose_shares_the_nodes_accept():
    roster_ids = make_roster(K)  # the defaults: t = 4
    session = os.urandom(16)
    ghost_advert, sent = _first_run(roster_ids, session)
    fed, server = _second_run(roster_ids, session, ghost_advert)
    aborts = {}
    for u, msg in server.requests().items():
        if u != GHOST:
            try:
                server.receive(u, fed.send(u, msg))
            except ProtocolAbort as exc:
                aborts[u] = exc
    if not aborts:  # the replayed advertisement passed the signature check (it names the same session)
        # the shares stage is the server's to fake too: the ghost's share messages of the first run, relayed
        server.receive(GHOST, {"to": list(sent), "ct": list(sent.values())})
        server.close()
        requests = server.requests()
        assert all(GHOST in msg["alive"] for u, msg in requests.items() if u != GHOST)
        aborts = fed.stage(server, {u: m for u, m in requests.items() if u != GHOST})
        assert sorted(aborts) == [u for u in range(K) if u != GHOST]
        assert {a.deviation for a in aborts.values()} == {"tampered-share"}
    # nothing was uploaded: no node reached its masked input
    assert not server.view.masked_uploads


def test_without_the_ghosts_shares_it_is_a_dropout_and_the_sum_is_the_others():
    roster_ids = make_roster(K)
    session = os.urandom(16)
    ghost_advert, _ = _first_run(roster_ids, session)
    fed, server = _second_run(roster_ids, session, ghost_advert)
    assert not fed.stage(server, skip=frozenset({GHOST}))
    fed.run_until(server, "done")
    assert GHOST not in server.U2 and GHOST not in server.U3
    got = fixed_point.decode(server.total, FRAC)
    assert np.abs(got - fed.true_sum(range(K - 1))).max() <= (K - 1) * 2.0 ** -(FRAC + 1)
