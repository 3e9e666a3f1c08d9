"""A deviating server against pairwise masking (active-adversary version): every deviation aborts or learns
nothing beyond a sum of at least t inputs.  Run with ``python -m pytest tests/adversarial``."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from adversary import FRAC, Federation, only
from flwr.app import ConfigRecord

from mechanisms.secagg import fixed_point, shamir
from mechanisms.secagg.crypto import (
    INFO_PAIR,
    ProtocolAbort,
    add_masks,
    hkdf,
    private_key,
    pub_bytes,
    public_key,
    signed_bytes,
)
from mechanisms.secagg.masking.server import MaskingServer


def test_honest_server_gets_exactly_the_sum_and_nothing_per_node():
    fed = Federation(K=5)
    server = fed.server()
    fed.run_until(server, "done")
    got = fixed_point.decode(server.total, FRAC)
    assert np.abs(got - fed.true_sum(range(5))).max() <= 5 * 2.0 ** -(FRAC + 1)
    for u, y in server.view.masked_uploads.items():  # each upload alone is a uniform ring element
        assert np.abs(fixed_point.decode(y, FRAC) - fed.x[u]).max() > 1e3


def test_server_asking_for_a_lower_threshold_or_another_K_is_refused():
    fed = Federation(K=5)  # roster: t = 3
    for change in ({"t": 2}, {"t": 1}, {"K": 4}, {"K": 6, "t": 4}):
        fed = Federation(K=5)
        server = MaskingServer(
            num_nodes=change.get("K", 5),
            threshold=change.get("t", 3),
            length=fed.length,
            session=b"s" * 16,
            active=True,
        )
        reqs = {u: m for u, m in server.requests().items() if u < 5}
        only(fed.stage(server, reqs), "wrong-parameters", "keys")


def test_a_roster_with_a_minority_threshold_cannot_be_made():
    from privfed.errors import ConfigError

    for K, t in ((6, 3), (4, 2), (2, 1), (7, 4 - 1)):
        with pytest.raises(ConfigError, match="t > n_C"):
            Federation(K=K, t=t)


def test_substituted_or_sybil_keys_are_refused():
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "shares")
    reqs = server.requests()
    # The server swaps node 2's advertised keys for its own (to read the shares sent to node 2).
    own = private_key(12345).public_key()
    for msg in reqs.values():
        i = msg["peers"].index(2)
        msg["c_pk"][i] = pub_bytes(own)
    aborts = fed.stage(server, {u: m for u, m in reqs.items() if u != 2})
    only(aborts, "bad-signature", "shares")
    assert all("node 2's key advertisement is not signed" in str(e) for e in aborts.values())


def test_a_sybil_outside_the_roster_is_refused():
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "shares")
    reqs = server.requests()
    for msg in reqs.values():  # a fifth "node" the roster does not list
        msg["peers"].append(4)
        msg["c_pk"].append(msg["c_pk"][0])
        msg["s_pk"].append(msg["s_pk"][0])
        msg["sig"].append(msg["sig"][0])
    only(fed.stage(server, reqs), "unknown-node", "shares")


def test_a_short_alive_list_is_refused():
    fed = Federation(K=5)  # t = 3
    server = fed.server()
    fed.run_until(server, "masked")
    victim = 0
    reqs = server.requests()
    # Told that only it is alive (the rest "dropped"), the victim would upload x + PRG(b) only.
    short = dict(reqs[victim], alive=[victim], **{"from": [], "ct": []})
    only(fed.stage(server, {victim: short}), "short-list", "masked")
    # A list of t nodes that leaves the victim out: every node on it refuses (it must contain itself).
    fed = Federation(K=5)
    server = fed.server()
    fed.run_until(server, "masked")
    reqs = server.requests()
    for u in (0, 1):
        box = dict(zip(reqs[u]["from"], reqs[u]["ct"]))
        keep = [v for v in (2, 3, 4) if v != u]
        reqs[u] = dict(reqs[u], alive=[2, 3, 4], **{"from": keep, "ct": [box[v] for v in keep]})
    only(fed.stage(server, {0: reqs[0], 1: reqs[1]}), "short-list", "masked")


def test_an_uploader_list_that_omits_or_repeats_a_node_is_refused():
    fed = Federation(K=5)
    server = fed.server()
    fed.run_until(server, "consistency")
    reqs = server.requests()
    only(fed.stage(server, {0: dict(reqs[0], uploaded=[1, 2, 3, 4])}), "drop-claim", "consistency")
    fed = Federation(K=5)
    server = fed.server()
    fed.run_until(server, "consistency")
    reqs = server.requests()
    only(fed.stage(server, {1: dict(reqs[1], uploaded=[0, 1, 1, 2])}), "malformed-list", "consistency")


def test_inconsistent_uploader_lists_abort_before_any_share_is_revealed():
    """The attack of the issue: K = 6, t = 4; half the nodes see the victim as an uploader (they would reveal
    its self-mask share), the other half see it dropped (its key share).  Everyone signs what it saw; nobody
    collects t signatures on its own view, so nobody reveals anything."""
    fed = Federation(K=6)
    assert fed.t == 4
    server = fed.server()
    fed.run_until(server, "consistency")
    everyone = [0, 1, 2, 3, 4, 5]  # node 0 is the victim
    views = {u: (everyone if u in (1, 2, 3) else [1, 2, 3, 4, 5]) for u in range(1, 6)}
    sigs = {}
    for u in range(1, 6):
        sigs[u] = fed.send(u, dict(server.requests()[u], uploaded=views[u]))["sig"]
    revealed = {}
    aborts = {}
    for u in range(1, 6):
        signers = [v for v in range(1, 6)]  # the server forwards every signature it has
        msg = {
            "stage": "unmask",
            "session": server.session,
            "uploaded": views[u],
            "signers": signers,
            "sigs": [sigs[v] for v in signers],
        }
        try:
            revealed[u] = fed.send(u, msg)
        except Exception as exc:  # noqa: BLE001 - collected and checked below
            aborts[u] = exc
    assert not revealed
    only(aborts, "inconsistent-lists", "unmask")
    # Forwarding only the signatures that match each node's view: 3 < t for one half, 2 < t for the other.
    fed2 = Federation(K=6)
    server = fed2.server()
    fed2.run_until(server, "consistency")
    sigs = {u: fed2.send(u, dict(server.requests()[u], uploaded=views[u]))["sig"] for u in range(1, 6)}
    for u in range(1, 6):
        same = [v for v in range(1, 6) if views[v] == views[u]]
        with pytest.raises(Exception) as exc:
            fed2.send(
                u,
                {
                    "stage": "unmask",
                    "session": server.session,
                    "uploaded": views[u],
                    "signers": same,
                    "sigs": [sigs[v] for v in same],
                },
            )
        assert exc.value.deviation == "short-list" and exc.value.node == u


def test_a_consistent_drop_claim_gives_the_server_only_the_sum_of_the_others():
    """Claiming a live node dropped (to all, consistently) yields its pair-mask key, never its self-mask seed:
    the server holds the sum of the other nodes and an upload still masked by PRG(b_victim)."""
    victim = 0
    fed = Federation(K=5)
    server = fed.server()
    fed.run_until(server, "consistency")
    server.U3 = [1, 2, 3, 4]  # the server's claim; the victim's upload is kept aside
    y_victim = server.view.masked_uploads[victim]
    server.total = sum((server.view.masked_uploads[u] for u in server.U3), np.zeros(fed.length, np.uint64))
    assert not fed.stage(server, skip=frozenset({victim}))
    assert not fed.stage(server)  # unmask: the nodes agree on U3 = {1..4} and reveal accordingly
    assert server.done
    got = fixed_point.decode(server.total, FRAC)
    assert np.abs(got - fed.true_sum([1, 2, 3, 4])).max() <= 4 * 2.0 ** -(FRAC + 1)
    # What the server holds about the victim: t key shares, no self-mask seed share at all.
    assert len(server.view.key_shares[victim]) >= fed.t
    assert victim not in server.view.self_seed_shares
    # Its best use of them: remove every pair mask from the victim's upload.  PRG(b_victim) remains.
    s_sk = private_key(shamir.combine(server.view.key_shares[victim], fed.t))
    y = y_victim.copy()
    keys = [
        hkdf(s_sk.exchange(public_key(server.adverts[v]["s_pk"])), INFO_PAIR + server.session)
        for v in (1, 2, 3, 4)
    ]
    add_masks(y, keys, [v < victim for v in (1, 2, 3, 4)])  # undo the victim's +/- masks
    assert np.abs(fixed_point.decode(y, FRAC) - fed.x[victim]).max() > 1e3


def test_a_second_session_for_the_same_aggregation_is_refused():
    fed = Federation(K=4)
    first = fed.server()
    fed.run_until(first, "done")
    second = fed.server()  # a fresh session id, the same aggregation (e.g. to leave the victim out)
    fed.run_until(second, "masked")
    reqs = second.requests()
    aborts = fed.stage(second, reqs)
    only(aborts, "second-session", "masked")
    assert set(aborts) == set(range(4))


def test_replayed_messages_from_another_session_are_refused():
    fed = Federation(K=4)
    old = fed.server()
    fed.run_until(old, "shares")
    old_shares = old.requests()
    fed2 = Federation(K=4)
    fed2.roster, fed2.ids, fed2.ctx = fed.roster, fed.ids, fed.ctx  # the same nodes, a new session
    new = fed2.server()
    fed2.run_until(new, "shares")
    # 1. The whole old request: it names the old session.
    only(fed2.stage(new, {0: old_shares[0]}), "replay", "shares")
    # 2. The old signed advertisements under the new session id: the signatures cover the old session.
    fed3 = Federation(K=4)
    new = fed3.server()
    fed3.run_until(new, "shares")
    fed_old = Federation(K=4)
    fed_old.roster, fed_old.ids = fed3.roster, fed3.ids
    old = fed_old.server()
    fed_old.run_until(old, "shares")
    stale = old.requests()[1]
    reqs = new.requests()
    msg = dict(reqs[0])
    i = msg["peers"].index(1)
    for key in ("c_pk", "s_pk", "sig"):
        msg[key] = list(msg[key])
        msg[key][i] = stale[key][stale["peers"].index(1)]
    only(fed3.stage(new, {0: msg}), "bad-signature", "shares")


def test_a_replayed_or_tampered_share_message_aborts_naming_node_and_stage():
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "masked")
    reqs = server.requests()
    msg = dict(reqs[0], ct=list(reqs[0]["ct"]))
    i = msg["from"].index(3)
    ct = bytearray(msg["ct"][i])
    ct[20] ^= 0x40
    msg["ct"][i] = bytes(ct)
    aborts = fed.stage(server, {0: msg})
    only(aborts, "tampered-share", "masked")
    assert "from node 3 fails authentication" in str(aborts[0])
    # Shares relabelled (node 1's ciphertext presented as node 3's): authentication fails too.
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "masked")
    reqs = server.requests()
    msg = dict(reqs[0], ct=list(reqs[0]["ct"]))
    a, b = msg["from"].index(1), msg["from"].index(3)
    msg["ct"][a], msg["ct"][b] = msg["ct"][b], msg["ct"][a]
    only(fed.stage(server, {0: msg}), "tampered-share", "masked")
    # Share messages from nodes other than the survivors (wrong ids).
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "masked")
    reqs = server.requests()
    msg = dict(reqs[0], **{"from": reqs[0]["from"][:-1], "ct": reqs[0]["ct"][:-1]})
    only(fed.stage(server, {0: msg}), "wrong-ids", "masked")


def test_a_split_broadcast_aborts_before_any_share_is_revealed():
    """FedCOF's round 2: the victim is sent another broadcast (mu = 0) than the others.  Each node signs the
    digest of what it was asked to sum with the lists; the victim's signature does not verify on the others'
    view (nor theirs on its), so a server that forwards all signatures meets an abort at every node."""
    fed = Federation(K=4)  # t = 3
    victim = 0
    fed.digest[victim] = b"a different broadcast"
    server = fed.server()
    fed.run_until(server, "unmask")  # every node signed its own view
    aborts = fed.stage(server)
    only(aborts, "inconsistent-lists", "unmask")
    assert set(aborts) == set(range(4))
    # Forwarding only the t = 3 consistency signatures on the others' view does not help: the victim's signed
    # echo, sent with its upload, names its own broadcast, and the server cannot forge another.
    fed = Federation(K=4)
    fed.digest[victim] = b"a different broadcast"
    server = fed.server()
    fed.run_until(server, "unmask")
    reqs = server.requests()
    others = [1, 2, 3]
    for u in others:
        reqs[u] = dict(reqs[u], signers=others, sigs=[server.signers[v] for v in others])
    aborts = fed.stage(server, {u: reqs[u] for u in others})
    only(aborts, "split-broadcast", "unmask")
    assert "uploader(s) [0] did not sum what this node summed" in str(aborts[1])
    # And an echo copied from another node does not verify under the victim's roster key.
    fed = Federation(K=4)
    fed.digest[victim] = b"a different broadcast"
    server = fed.server()
    fed.run_until(server, "unmask")
    reqs = server.requests()
    for u in others:
        echoes = list(reqs[u]["echoes"])
        echoes[0] = echoes[1]
        reqs[u] = dict(reqs[u], signers=others, sigs=[server.signers[v] for v in others], echoes=echoes)
    only(fed.stage(server, {u: reqs[u] for u in others}), "split-broadcast", "unmask")


def test_a_node_asked_out_of_order_or_twice_stops():
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "unmask")
    reqs = server.requests()
    first = fed.send(1, reqs[1])
    assert sorted(first["kind"]) == ["b"] * 4
    with pytest.raises(Exception) as exc:
        fed.send(1, dict(reqs[1], uploaded=[0, 1, 2]))  # now "0 dropped": would be its key share too
    assert exc.value.deviation == "out-of-order"
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, "shares")
    with pytest.raises(Exception) as exc:
        fed.send(0, {"stage": "unmask", "session": server.session, "uploaded": [0, 1, 2, 3]})
    assert exc.value.deviation == "out-of-order"


@pytest.mark.parametrize(
    "stage, field, value",
    [
        ("keys", "K", float("inf")),  # int() of it raised a raw OverflowError
        ("keys", "session", -1),  # bytes(-1): a raw ValueError, outside the node's checks
        ("keys", "session", 16),  # bytes(16) is 16 zero bytes: taken as a session id
        ("shares", "c_pk", [1 << 30] * 4),  # bytes(n) of an int allocates n bytes before any check
        ("masked", "alive", [False, True, True, True]),  # bools taken as ids 0 and 1
        ("masked", "ct", [1 << 30] * 3),
        ("unmask", "sigs", [1 << 30] * 4),
    ],
)
def test_wrongly_typed_fields_end_in_a_clean_abort_without_allocating_what_the_server_asks(
    stage, field, value
):
    """A field of the wrong type (a ConfigRecord can carry an int where bytes are expected) is refused as
    malformed before it is used: never a raw traceback, never bytes(n) of a server's n."""
    fed = Federation(K=4)
    server = fed.server()
    fed.run_until(server, stage)
    reqs = server.requests()
    u = 1 if stage == "masked" else 0
    msg = {**reqs[u], field: value}
    with pytest.raises(ProtocolAbort) as exc:
        fed.send(u, msg)
    assert exc.value.node == u and exc.value.stage == stage and exc.value.deviation == "malformed", str(
        exc.value
    )
    assert f"node {u} aborts at stage {stage!r}: malformed request" in str(exc.value)


def test_after_a_ckks_sum_a_node_signs_no_masked_uploader_list():
    """A node that encrypted for a CKKS key holder (its ledger names the holder, not the set) refuses to sign
    a masked sum's uploaders: it cannot tell whether they differ from the CKKS sum's."""
    fed = Federation(K=4)
    for c in fed.ctx:
        c.state["privfed-secagg-ledger"] = ConfigRecord({"used": [], "holder": 1})
    server = fed.server()
    fed.run_until(server, "consistency")
    only(fed.stage(server), "after-ckks", "consistency")


@pytest.mark.parametrize("K, colluders", [(4, 0), (5, 0), (6, 0), (7, 0), (5, 1), (6, 1), (7, 2)])
def test_split_uploader_lists_at_the_minimum_threshold_never_give_both_kinds_of_share(K, colluders):
    """Every split of the honest nodes into "victim uploaded" / "victim dropped" views, at t = the roster's
    minimum for K (odd and even) and n_C colluders that sign both views and hand the server their own shares:
    each honest node gets every signature that verifies on its view.  The server never holds t shares of the
    victim's self-mask seed and t of its mask key together."""
    victim = 0
    bad = list(range(K - colluders, K))
    honest = [u for u in range(1, K) if u not in bad]
    for k in range(len(honest) + 1):
        fed = Federation(K=K, colluders=colluders)
        t = fed.t
        assert 2 * t > K + colluders
        server = fed.server()
        fed.run_until(server, "consistency")
        everyone, without = list(range(K)), [u for u in range(K) if u != victim]
        view = {u: everyone for u in [victim, *honest[:k]]} | {u: without for u in honest[k:]}
        sigs = {u: fed.send(u, dict(server.requests()[u], uploaded=view[u]))["sig"] for u in view}
        digest = hashlib.sha256(fed.digest[victim]).digest()
        for c in bad:  # a colluder signs both views
            for U3 in (everyone, without):
                sigs[(c, tuple(U3))] = fed.ids[c].sign(
                    signed_bytes("consistency", fed.roster.fingerprint, server.session, everyone, U3, digest)
                )
        kinds = {"b": colluders, "s": colluders}  # the colluders' own shares of the victim's secrets
        for u, U3 in view.items():
            signers = [v for v in view if view[v] == U3] + bad
            msg = {
                "stage": "unmask",
                "session": server.session,
                "uploaded": U3,
                "signers": signers,
                "sigs": [sigs[v] if v in view else sigs[(v, tuple(U3))] for v in signers],
                "echoes": [server.echoes[v] for v in U3],
            }
            try:
                reply = fed.send(u, msg)
            except ProtocolAbort as exc:
                assert exc.node == u and exc.stage == "unmask" and exc.deviation == "short-list", str(exc)
                continue
            kinds[reply["kind"][reply["about"].index(victim)]] += 1
        assert min(kinds.values()) < t, (K, colluders, k, kinds)
