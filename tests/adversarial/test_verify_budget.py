"""The signatures a node no longer verifies, and a lying server for each: the attack the check stood against
still fails.

A node verifies 2k signatures a session on the roster's k-regular graph (k on the complete graph of K = k + 1):
its k neighbours' key advertisements, and one signature for every other uploader of its group at unmasking
(t - 1 consistency views, its own counted by comparison, and the echoes of the uploaders whose views it did not
verify).  Three checks went: its own advertisement's signature (its keys are compared byte for byte), the
consistency signatures past the t-th (the decision needs t), and the echo of an uploader whose consistency
view it verified (that view signs the same survivor list and digest).  See
:mod:`mechanisms.secagg.masking.views` and docs/secure-aggregation.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from adversary import FRAC, Federation, only

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import ProtocolAbort, private_key, pub_bytes
from mechanisms.secagg.identity import Roster
from mechanisms.secagg.masking.messages import pack_view


def _counting(monkeypatch) -> list:
    calls = []
    original = Roster.verify

    def verify(self, index, signature, message):
        calls.append(index)
        return original(self, index, signature, message)

    monkeypatch.setattr(Roster, "verify", verify)
    return calls


@pytest.mark.parametrize("K, degree", [(5, None), (12, 4)])
def test_a_node_verifies_two_signatures_per_neighbour(monkeypatch, K, degree):
    calls = _counting(monkeypatch)
    fed = Federation(K=K, degree=degree)
    server = fed.server()
    fed.run_until(server, "done")
    k = K - 1 if degree is None else degree
    assert len(calls) == K * 2 * k
    got = fixed_point.decode(server.total, FRAC)
    assert np.abs(got - fed.true_sum(range(K))).max() <= K * 2.0 ** -(FRAC + 1)


def test_its_own_advertisement_substituted_is_still_refused():
    """The attack the signature on its own advertisement stood against: the server swaps in its own key for
    the node's channel key (to read the shares its neighbours send it).  The node compares its keys byte for
    byte; the neighbours verify the signature."""
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "shares")
    reqs = server.requests()
    own = pub_bytes(private_key(4242).public_key())
    for msg in reqs.values():
        msg["c_pk"][msg["peers"].index(0)] = own
    aborts = fed.stage(server, reqs)
    assert aborts[0].deviation == "substituted-key"
    assert {aborts[u].deviation for u in (1, 2, 3)} == {"bad-signature"}


def test_forged_consistency_signatures_never_make_up_the_t():
    """The attack the signatures past the t-th stood against: forged views counted towards t.  With t - 1
    genuine signatures the node refuses whatever forged ones come before or after them; forged ones after t
    genuine ones are not looked at, and the node reveals exactly what the honest run has it reveal."""
    fed = Federation(K=12, degree=4)
    t = fed.t
    server = fed.server()
    fed.run_until(server, "unmask")
    msg = server.requests()[0]
    assert len(msg["signers"]) == t and msg["signers"][0] == 0  # the server forwards its own and t - 1 more
    others = [v for v in sorted(server.signers) if v in fed.roster.groups[0] and v != 0]
    forged = bytes(64)

    def request(msg, server, signers, sigs):
        return dict(msg, signers=signers, sigs=sigs, views=[pack_view(*_view(server, v)) for v in signers])

    genuine = [0, *others[: t - 2]]  # t - 1 in all
    for pos in (0, len(genuine)):  # a forged one first, or last
        signers = genuine[:pos] + [others[t - 2]] + genuine[pos:]
        sigs = (
            [server.signers[v] for v in genuine[:pos]] + [forged] + [server.signers[v] for v in genuine[pos:]]
        )
        aborts = fed.stage(server, {0: request(msg, server, signers, sigs)})
        assert aborts[0].deviation == "inconsistent-lists"
        fed = Federation(K=12, degree=4, roster=(fed.roster, fed.ids))
        server = fed.server()
        fed.run_until(server, "unmask")
        msg = server.requests()[0]
    honest = fed.send(0, dict(msg))
    fed2 = Federation(K=12, degree=4, roster=(fed.roster, fed.ids))
    server2 = fed2.server()
    fed2.run_until(server2, "unmask")
    msg2 = server2.requests()[0]
    extra = [v for v in others if v not in msg2["signers"]]
    padded = request(msg2, server2, msg2["signers"] + extra, msg2["sigs"] + [forged] * len(extra))
    revealed = fed2.send(0, padded)
    assert revealed["about"] == honest["about"] and revealed["kind"] == honest["kind"]


def _view(server, v):
    g = server.graph[v] | {v}
    return sorted(g & set(server.U2)), sorted(g & set(server.U3))


def test_an_echo_a_verified_view_stands_for_is_not_needed_and_one_it_does_not_is_checked():
    """The attack the echoes stand against: an uploader that masked with other survivors than this node saw.
    A garbled echo of an uploader whose consistency view the node verified changes nothing (the view signs the
    same survivors); a garbled echo of any other uploader still aborts, and the few-survivors attack still
    fails (tests/adversarial/test_secaggplus_review.py)."""
    fed = Federation(K=12, degree=4)
    server = fed.server()
    fed.run_until(server, "unmask")
    msg = server.requests()[0]
    vouched = [v for v in msg["signers"] if v != 0]
    rest = [v for v in msg["uploaded"] if v != 0 and v not in vouched]
    assert vouched and rest
    echoes = list(msg["echoes"])
    echoes[msg["uploaded"].index(vouched[0])] = bytes(64)
    assert fed.send(0, dict(msg, echoes=echoes))["about"]  # revealed, as in the honest run
    fed = Federation(K=12, degree=4, roster=(fed.roster, fed.ids))
    server = fed.server()
    fed.run_until(server, "unmask")
    msg = server.requests()[0]
    echoes = list(msg["echoes"])
    echoes[msg["uploaded"].index(rest[0])] = bytes(64)
    only(fed.stage(server, {0: dict(msg, echoes=echoes)}), "split-broadcast", "unmask")
    with pytest.raises(ProtocolAbort):
        fed.send(0, msg)  # it aborted: no second answer
