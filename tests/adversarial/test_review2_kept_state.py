"""The masking state machine a Flower node keeps in its process between messages, against a server that mixes
runs and sessions.

A node's process keeps its :class:`~mechanisms.secagg.masking.node.MaskingNode` between messages
(:class:`privfed.flower.kept.KeptNodes`), keyed by run id, node id, roster and roster index, and uses it
only while the state record in that node's ``context.state`` carries the token of the write that kept it.
Run ids are the SuperLink's, so a deviating server can give two runs one run id; every node of
:class:`adversary.Federation` has run id 1.  Each test checks that a kept state machine is never
carried into a context that did not write it: two sessions interleaved under one run id each continue
from their own state and give the exact sums; a request of one session delivered into another context is
refused (another session, or nothing to continue); and a node that aborted in one context answers nothing
more there while the other context's session goes on.
"""

from __future__ import annotations

import numpy as np
import pytest
from adversary import FRAC, Federation

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.identity import make_roster

K = 5


def _pair():
    roster_ids = make_roster(K)
    a = Federation(K=K, roster=roster_ids, seed=1)
    b = Federation(K=K, roster=roster_ids, seed=2)
    return a, b


def _exact(fed, server):
    got = fixed_point.decode(server.total, FRAC)
    return np.abs(got - fed.true_sum(range(K))).max() <= K * 2.0 ** -(FRAC + 1)


def test_two_sessions_interleaved_under_one_run_id_each_continue_from_their_own_state():
    a, b = _pair()
    sa, sb = a.server(), b.server()
    a.run_until(sa, "masked")  # every node of a kept at "shared"
    b.run_until(sb, "consistency")  # the same nodes (run id, node id, roster) kept for b, past a's stage
    while not (sa.done and sb.done):
        for fed, server in ((a, sa), (b, sb)):
            if not server.done:
                assert not fed.stage(server)
    assert _exact(a, sa) and _exact(b, sb)


def test_a_request_delivered_into_another_context_is_refused():
    a, b = _pair()
    sa, sb = a.server(), b.server()
    a.run_until(sa, "masked")
    b.run_until(sb, "masked")
    masked_a = sa.requests()
    # a's masked request in b's context (its own session at the same stage): another session, refused
    with pytest.raises(ProtocolAbort) as exc:
        b.send(0, masked_a[0])
    assert exc.value.deviation == "replay"
    # in a context that never took part (a fresh one: no state, the kept machine of a is not used)
    fresh = Federation(K=K, roster=(a.roster, a.ids), seed=3)
    with pytest.raises(ProtocolAbort) as exc:
        fresh.send(1, masked_a[1])
    assert exc.value.deviation == "out-of-order"
    # b's node 0 aborted and answers nothing more, whatever comes; a's session goes on untouched
    with pytest.raises(ProtocolAbort):
        b.send(0, sb.requests()[0])
    a.run_until(sa, "done")
    assert _exact(a, sa)


def test_a_finished_state_machine_is_not_reused_by_a_later_session_of_the_same_id():
    """After a session is done the node keeps no secret of it: a server that starts the same session id
    again in the same context must begin at the keys stage, with fresh keys (a second masked request for the
    same aggregation is refused by the ledger)."""
    a, _ = _pair()
    session = bytes(range(16))
    first = a.server(session)
    a.run_until(first, "done")
    keys_before = dict(first.adverts)
    again = a.server(session)
    with pytest.raises(ProtocolAbort) as exc:
        a.send(0, {"stage": "masked", "session": session, "alive": list(range(K)), "from": [], "ct": []})
    assert exc.value.deviation == "out-of-order"
    a.run_until(again, "masked")  # a keys request starts a fresh state machine in the same context
    assert all(again.adverts[u]["c_pk"] != keys_before[u]["c_pk"] for u in range(K))
    aborts = a.stage(again)
    assert sorted(aborts) == list(range(K))
    assert {e.deviation for e in aborts.values()} == {"second-session"}
