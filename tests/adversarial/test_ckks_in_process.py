"""A lying server against the CKKS node and key holder objects, in process (no Flower).

Every message a node or the key holder receives (``ckks_encrypt``; ``ckks_keys``, ``ckks_decrypt``) is sent
here with a deviation; each is refused with a ProtocolAbort naming the party, the stage and the deviation.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("tenseal")

from mechanisms.secagg.ckks import ckks_sum  # noqa: E402
from mechanisms.secagg.ckks.holder import CKKSKeyHolder  # noqa: E402
from mechanisms.secagg.ckks.node import CKKSNode  # noqa: E402
from mechanisms.secagg.ckks.scheme import CKKSParams  # noqa: E402
from mechanisms.secagg.ckks.server import CKKSServer, run_in_process  # noqa: E402
from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.identity import make_roster  # noqa: E402
from mechanisms.secagg.ledger import SessionLedger  # noqa: E402

K = 4
P = CKKSParams()
X = np.arange(4 * 3, dtype=np.float64).reshape(4, 3) / 7


class Run:
    """One honest run's parties: roster, nodes (0 also the key holder), the keys request and reply."""

    def __init__(self, roster=None, ids=None):
        self.roster, self.ids = (roster, ids) if roster is not None else make_roster(K, colluders=0)
        self.ledgers = [SessionLedger() for _ in range(K)]
        self.nodes = [
            CKKSNode(P, identity=self.ids[u], roster=self.roster, ledger=self.ledgers[u]) for u in range(K)
        ]
        self.holder = CKKSKeyHolder(P, identity=self.ids[0], roster=self.roster, ledger=self.ledgers[0])
        self.session = os.urandom(16)
        self.keys = self.holder.keys({"session": self.session, "K": K})

    def encrypt_request(self, **change) -> dict:
        msg = {
            "public": self.keys["public"],
            "K": K,
            "holder": 0,
            "sig": self.keys["sig"],
            "session": self.session,
        }
        return {**msg, **change}

    def contributions(self, among=range(K), digest=b"") -> list[dict]:
        return [self.nodes[u].encrypt(self.encrypt_request(), X[u], digest=digest) for u in among]

    def decrypt_request(self, replies, **change) -> dict:
        msg = {
            "from": [r["u"] for r in replies],
            "ct": [c for r in replies for c in r["ct"]],
            "sigs": [r["sig"] for r in replies],
            "pins": [r["pin"] for r in replies],
            "size": 3,
            "session": self.session,
        }
        return {**msg, **change}


def _aborts(match, deviation, stage, fn, *args, **kw):
    with pytest.raises(ProtocolAbort, match=match) as exc:
        fn(*args, **kw)
    assert exc.value.deviation == deviation and exc.value.stage == stage
    return exc.value


# -- ckks_encrypt: what a node receives -----------------------------------------------------------
def test_a_context_the_server_made_itself_is_refused_before_anything_is_encrypted():
    run = Run()
    fake_roster, fake_ids = make_roster(K, colluders=0)
    own = CKKSKeyHolder(P, identity=fake_ids[0], roster=fake_roster).keys({"session": run.session, "K": K})
    asked = []
    msg = run.encrypt_request(public=own["public"], sig=own["sig"])
    _aborts(
        "node 1 aborts at stage 'ckks_encrypt'.*not signed by key holder 0",
        "substituted-key",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        msg,
        lambda: asked.append(1) or X[1],
    )
    assert asked == []  # the input was never read
    assert run.ledgers[1].holder is None and run.ledgers[1].used == []  # nor the node bound to anything


def test_a_context_signed_for_another_session_is_refused():
    run = Run()
    _aborts(
        "not signed by key holder 0",
        "substituted-key",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(session=os.urandom(16)),
        X[1],
    )


def test_a_context_relabelled_as_another_holders_is_refused():
    run = Run()
    _aborts(
        "not signed by key holder 3",
        "substituted-key",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(holder=3),
        X[1],
    )


def test_a_signed_context_holding_the_secret_key_is_refused():
    """A key holder that ships its secret (so the server could decrypt every upload) is refused too."""
    from mechanisms.secagg.ckks.node import context_bytes
    from mechanisms.secagg.ckks.scheme import new_context

    run = Run()
    private = new_context(P).serialize(save_secret_key=True)
    sig = run.ids[0].sign(context_bytes(run.roster, run.session, 0, private))
    _aborts(
        "holding the secret key",
        "substituted-key",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(public=private, sig=sig),
        X[1],
    )


def test_a_wrong_number_of_nodes_is_refused_by_node_and_key_holder():
    run = Run()
    _aborts(
        "asks for K=3",
        "wrong-parameters",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(K=3),
        X[1],
    )
    _aborts(
        "asks for K=5", "wrong-parameters", "ckks_keys", run.holder.keys, {"session": run.session, "K": 5}
    )


def test_a_second_session_for_the_same_aggregation_id_is_refused():
    run = Run()
    agg = os.urandom(16)
    run.nodes[1].encrypt(run.encrypt_request(), X[1], aggregation=agg)
    again = Run(run.roster, run.ids)
    again.ledgers[1] = run.ledgers[1]
    node = CKKSNode(P, identity=run.ids[1], roster=run.roster, ledger=run.ledgers[1])
    _aborts(
        "second masked session",
        "second-session",
        "masked",
        node.encrypt,
        again.encrypt_request(),
        X[1],
        aggregation=agg,
    )


def test_another_key_holder_later_in_the_run_is_refused():
    run = Run()
    run.nodes[1].encrypt(run.encrypt_request(), X[1])
    other = CKKSKeyHolder(P, identity=run.ids[2], roster=run.roster).keys({"session": run.session, "K": K})
    _aborts(
        "names key holder 2.*encrypted for key holder 0",
        "other-key-holder",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(public=other["public"], sig=other["sig"], holder=2),
        X[1],
    )


def test_a_roster_with_colluders_is_refused():
    roster, ids = make_roster(K, colluders=1)
    run = Run(roster, ids)
    _aborts(
        "its roster allows 1 node",
        "colluders",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(),
        X[1],
    )


@pytest.mark.parametrize("field, value", [("session", -1), ("holder", "0"), ("K", 2.5), ("public", None)])
def test_wrongly_typed_encrypt_fields_are_refused_as_malformed(field, value):
    run = Run()
    _aborts(
        "aborts at stage 'ckks_encrypt': malformed request",
        "malformed",
        "ckks_encrypt",
        run.nodes[1].encrypt,
        run.encrypt_request(**{field: value}),
        X[1],
    )


# -- ckks_decrypt: what the key holder receives ---------------------------------------------------
def test_one_nodes_ciphertext_forwarded_as_the_sum_is_not_decrypted():
    run = Run()
    replies = run.contributions()
    _aborts(
        "sum of 1 contribution.*below the threshold",
        "short-list",
        "ckks_decrypt",
        run.holder.decrypt,
        run.decrypt_request(replies[1:2]),
    )
    assert run.holder.state() == {}  # and the key is gone: nothing else is decrypted with it


def test_a_relabelled_contribution_is_refused():
    run = Run()
    replies = run.contributions()
    req = run.decrypt_request(replies)
    req["from"] = [1, 0, 2, 3]
    _aborts("said to be node 1's is not signed", "bad-signature", "ckks_decrypt", run.holder.decrypt, req)


def test_one_contribution_counted_twice_is_refused():
    run = Run()
    replies = run.contributions()
    req = run.decrypt_request(replies[1:] + replies[1:2])
    _aborts("appears twice", "malformed-list", "ckks_decrypt", run.holder.decrypt, req)


def test_contributions_over_another_digest_are_refused():
    """A split broadcast: the nodes summed something other than what the key holder summed."""
    run = Run()
    run.holder.note_digest(b"what the key holder summed")
    replies = run.contributions(digest=b"what the others were sent")
    _aborts(
        "split broadcast", "bad-signature", "ckks_decrypt", run.holder.decrypt, run.decrypt_request(replies)
    )


def test_a_second_decryption_and_another_sessions_request_are_refused():
    run = Run()
    replies = run.contributions()
    total = run.holder.decrypt(run.decrypt_request(replies))["total"]
    assert np.abs(total - X.sum(axis=0)).max() <= 2.0**-21 + P.poly_modulus_degree * 2 * 2.0**-P.scale_bits
    _aborts(
        "holds no key", "second-session", "ckks_decrypt", run.holder.decrypt, run.decrypt_request(replies)
    )
    run2 = Run()
    _aborts(
        "another session",
        "replay",
        "ckks_decrypt",
        run2.holder.decrypt,
        run2.decrypt_request(run2.contributions(), session=os.urandom(16)),
    )


def test_a_sum_over_another_set_than_the_first_is_refused():
    """The key holder pins its first sum's contributor set; a second sum without node 3 would subtract to it."""
    run = Run()
    run.holder.decrypt(run.decrypt_request(run.contributions()))
    second = Run(run.roster, run.ids)
    second.holder = CKKSKeyHolder(P, identity=run.ids[0], roster=run.roster, ledger=run.ledgers[0])
    second.keys = second.holder.keys({"session": second.session, "K": K})
    replies = second.contributions(among=[0, 1, 2])
    _aborts(
        "earlier sum covered",
        "other-uploaders",
        "ckks_decrypt",
        second.holder.decrypt,
        second.decrypt_request(replies),
    )


def test_a_node_pinned_to_another_set_is_not_summed():
    run = Run()
    run.ledgers[2].pin([0, 1, 2], 2, "consistency")  # node 2's earlier masked sum covered {0, 1, 2}
    replies = run.contributions()
    _aborts(
        "node\\(s\\) \\[2\\] were summed over another",
        "other-uploaders",
        "ckks_decrypt",
        run.holder.decrypt,
        run.decrypt_request(replies),
    )


@pytest.mark.parametrize("field, value", [("size", 2.5), ("session", 7), ("ct", [1]), ("from", ["0"])])
def test_wrongly_typed_decrypt_fields_are_refused_as_malformed(field, value):
    run = Run()
    req = run.decrypt_request(run.contributions(), **{field: value})
    _aborts("aborts at stage 'ckks_decrypt': malformed", "malformed", "ckks_decrypt", run.holder.decrypt, req)


def test_a_real_valued_release_of_a_sum_whose_error_reaches_the_grid_is_refused():
    """With 300 contributions the decryption error reaches the 2^-20 grid (Li-Micciancio): a server that
    asks for a real-valued release of an integer sum is refused; whole numbers stay far above the error."""
    roster, ids = make_roster(300, colluders=0)
    holder = CKKSKeyHolder(P, identity=ids[0], roster=roster)
    session = os.urandom(16)
    keys = holder.keys({"session": session, "K": 300})
    msg = {"public": keys["public"], "K": 300, "holder": 0, "sig": keys["sig"], "session": session}
    contexts: dict = {}
    replies = []
    for u in range(300):
        node = CKKSNode(P, identity=ids[u], roster=roster, release_grid=False, contexts=contexts)
        replies.append(node.encrypt(msg, np.ones(2)))
    req = {
        "from": [r["u"] for r in replies],
        "ct": [c for r in replies for c in r["ct"]],
        "sigs": [r["sig"] for r in replies],
        "pins": [r["pin"] for r in replies],
        "size": 2,
        "session": session,
    }
    _aborts("within their decryption error", "fine-grid", "ckks_decrypt", holder.decrypt, dict(req))
    assert holder.state() == {}  # and the key is gone


# -- the in-process loop -------------------------------------------------------------------------
class ForwardOne(CKKSServer):
    """A server that forwards one node's ciphertext as the sum."""

    def requests(self):
        out = super().requests()
        if self.stage == "ckks_decrypt":
            msg = out[self.key_holder]
            n = len(msg["ct"]) // len(msg["from"])
            msg.update({"from": msg["from"][1:2], "ct": msg["ct"][n : 2 * n], "sigs": msg["sigs"][1:2]})
        return out


def test_the_in_process_loop_stops_a_lying_server():
    run = Run()
    server = ForwardOne(list(range(K)), key_holder=0, length=3, params=P, session=os.urandom(16))
    with pytest.raises(ProtocolAbort, match="below the threshold") as exc:
        run_in_process(server, dict(enumerate(run.nodes)), run.holder, inputs=lambda u: X[u])
    assert exc.value.node == 0 and exc.value.stage == "ckks_decrypt"
    assert server.total is None


def test_the_in_process_sum_needs_two_uploads():
    run = Run()
    server = CKKSServer(list(range(K)), key_holder=0, length=3, params=P, session=os.urandom(16))
    with pytest.raises(ProtocolAbort, match="1 node\\(s\\) uploaded"):
        run_in_process(
            server,
            dict(enumerate(run.nodes)),
            run.holder,
            inputs=lambda u: X[u],
            silent=lambda stage, u: stage == "ckks_encrypt" and u > 0,
        )


def test_ckks_sum_is_the_honest_loop():
    assert np.array_equal(ckks_sum(np.ones((3, 2)), integers=True).total, [3.0, 3.0])
