"""One node's side of pairwise masking (Bonawitz et al., CCS 2017), as a state machine.

:class:`MaskingNode` answers the server's five requests in order; every
request is a dict with a ``stage`` and the ``session`` id, every reply a
dict.  The same class runs in one process (:func:`mechanisms.secagg.masking.masked_sum`)
and on every Flower node (:mod:`privfed.flower.secagg`), which keeps its
:meth:`MaskingNode.state` in the node's ``context.state`` between messages.

``keys``         check K and t against the configuration, draw two X25519 key
                 pairs and a self-mask seed b_u (OS entropy); reply the public
                 keys, signed with the node's roster identity (active version).
``shares``       check the signed advertisements of U1 against the roster;
                 Shamir-share s_u^SK and b_u among U1 (threshold t) and reply
                 each share encrypted for its holder (AES-256-GCM under
                 HKDF(X25519), the session id as associated data).
``masked``       check U2 and that exactly U2's share messages arrived, decrypt
                 them (a tampered one aborts here, naming its sender), claim
                 the aggregation id (one masked upload per aggregation, ever;
                 before the input is computed, so a refused input uses it up),
                 and reply y_u = x_u + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv).
``consistency``  (active version) check U3, that it is the uploader set of
                 any earlier sum this node signed (the ledger's pin: two sums
                 over different sets subtract to one node's input), and sign
                 (U2, U3, the digest of what this node was asked to sum, e.g.
                 FedCOF's broadcast).
``unmask``       (active) check that at least t members of U3 signed the very
                 lists and digest this node signed, and that every uploader's
                 signed echo (sent with its masked input) names the same digest
                 (a split broadcast aborts here) and the same survivors U2
                 where the groups meet (so it masked with this node): 2k verifies a
                 session with its k advertisements, see
                 :func:`~mechanisms.secagg.masking.views.check_unmask`; then reveal, for
                 every v of U2, the share of b_v if v is in U3 and of s_v^SK otherwise:
                 never both kinds for one node.

The request format (stage names, session id size, id lists) is in
:mod:`mechanisms.secagg.masking.messages`; the ids and uploader sets a node has
already answered for are in :mod:`mechanisms.secagg.ledger`.

Every check that fails raises :class:`mechanisms.secagg.crypto.ProtocolAbort`
naming this node, the stage and the deviation, and leaves the node in the
``aborted`` state (it answers nothing more in this session).

Threat model.  Honest-but-curious version (no identity): a server that
follows the protocol learns the sum over U3 and who dropped.  Active
version (identity and roster): a server that deviates in any way (other
K or t, Sybil keys, inconsistent survivor lists or broadcasts, replayed or
tampered messages, a second session) is detected and the node aborts before
revealing any share, or the server learns nothing beyond a sum of at least
t inputs; with up to n_C colluding nodes when t > n_C + (K - n_C)/2.

Active version on a SecAgg+ graph (a roster with a degree k): every list the server sends must lie
within the node's group in the roster's graph, the node signs its view of its group, and it unmasks
only after t signatures from uploaders of its group on views that agree with its own on every node
both groups hold, and after every uploader's echo of the survivors it masked with, which must agree
likewise; t >= 2, 2t > k + 1 + n_C, t <= k + 1 (the argument: :mod:`mechanisms.secagg.graph`; the
checks: :mod:`mechanisms.secagg.masking.views`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mechanisms.secagg import shamir
from mechanisms.secagg.crypto import (
    GCM_NONCE_BYTES,
    ID_BYTES,
    INFO_CHANNEL,
    INFO_PAIR,
    INFO_SELF,
    KeySource,
    ProtocolAbort,
    add_masks,
    as_bytes,
    hkdf,
    private_key,
    pub_bytes,
    public_key,
    signed_bytes,
    signed_parts,
)
from mechanisms.secagg.identity import Identity, Roster
from mechanisms.secagg.ledger import SessionLedger
from mechanisms.secagg.masking.messages import STAGES, parse_ids
from mechanisms.secagg.masking.views import (
    check_keys_request,
    check_unmask,
    check_uploaded,
    echo_bytes,
    view_digest,
)
from privfed.errors import PrivfedError

# STAGES and SessionLedger live in their own modules and are re-exported here (their old import path).
__all__ = ["STAGES", "MaskingNode", "SessionLedger"]


class MaskingNode:
    """One node in one masked sum (see the module docstring).

    Parameters
    ----------
    index : int
        u, this node's index (its roster index in the active version).
    num_nodes, threshold : int
        K and t, from this node's configuration (the roster's in the active
        version); a request with other values is refused.
    identity, roster : optional
        The active version: this node's signing key and the operator's roster.
    neighbours : frozenset, optional
        SecAgg+ graph neighbours (honest-but-curious version); default all.  The
        active version takes them from its roster (a different set is refused).
    keys : KeySource, optional
        Key material (OS entropy by default; a seeded source for tests only).
    ledger : SessionLedger, optional
        Aggregation ids already used (a fresh one by default).
    """

    def __init__(
        self,
        index: int,
        *,
        num_nodes: int,
        threshold: int,
        identity: Identity | None = None,
        roster: Roster | None = None,
        neighbours: frozenset[int] | None = None,
        keys: KeySource | None = None,
        ledger: SessionLedger | None = None,
        state: dict | None = None,
    ) -> None:
        self.u, self.K, self.t = int(index), int(num_nodes), int(threshold)
        self.identity, self.roster = identity, roster
        self.active = roster is not None
        if self.active:
            if (
                identity is None
                or identity.index != self.u
                or roster.size != self.K
                or roster.threshold != self.t
            ):
                raise ProtocolAbort(f"node {self.u}: identity, roster, K and t disagree", node=self.u)
            if neighbours is not None and frozenset(neighbours) != roster.graph[self.u]:
                raise ProtocolAbort(
                    f"node {self.u}: the active version takes its neighbours from the roster's graph; "
                    "other neighbours were given",
                    node=self.u,
                )
            neighbours = roster.graph[self.u]
        self.sparse = self.active and roster.degree is not None
        self.nbrs = frozenset(range(self.K)) - {self.u} if neighbours is None else frozenset(neighbours)
        self.group = self.nbrs | {self.u}
        self.keys = keys if keys is not None else KeySource(None)
        self.ledger = ledger if ledger is not None else SessionLedger()
        self.st: dict = dict(state) if state is not None else {"stage": "new"}
        self._parsed: dict[str, tuple[bytes, object]] = {}  # parsed private keys (see _private)

    # ------------------------------------------------------------------ helpers
    def state(self) -> dict:
        """The node's protocol state as flat values (bytes, ints, lists): what it keeps between messages."""
        return dict(self.st)

    def _abort(self, stage: str, deviation: str, text: str) -> ProtocolAbort:
        self.st = {"stage": "aborted", "why": text}
        return ProtocolAbort(
            f"node {self.u} aborts at stage {stage!r}: {text}", node=self.u, stage=stage, deviation=deviation
        )

    def _private(self, name: str):
        """The X25519 private key object of ``st[name]``, built once (parsing one costs an exchange's time)."""
        raw = self.st[name]
        if self._parsed.get(name, (None,))[0] != raw:
            self._parsed[name] = (raw, private_key(int.from_bytes(raw, "little")))
        return self._parsed[name][1]

    def _channel_keys(self, holders: list[int]) -> list[bytes]:
        """The share-channel key with every other holder: one X25519 agreement each, kept for both directions."""
        c_sk, info = self._private("c_sk"), INFO_CHANNEL + self.st["session"]
        U1 = {v: i for i, v in enumerate(self.st["U1"])}
        return [
            b"" if v == self.u else hkdf(c_sk.exchange(public_key(self.st["c_pk"][U1[v]])), info)
            for v in holders
        ]

    def _echo_bytes(self, U2: list[int] | None = None) -> bytes:
        """The bytes an echo covers (:func:`mechanisms.secagg.masking.views.echo_bytes`), this node's survivors by
        default."""
        return echo_bytes(
            self.roster, self.st["session"], self.st["digest"], self.st["U2"] if U2 is None else U2
        )

    def _echo_prefix(self) -> Callable[[list[int]], bytes]:
        """:meth:`_echo_bytes` of any survivor list, its fixed parts encoded once."""
        head = signed_bytes("echo", self.roster.fingerprint, self.st["session"], self.st["digest"])
        return lambda U2: head + signed_parts(U2)

    def _view_prefix(self) -> Callable[[list[int], list[int]], bytes]:
        """:meth:`_view_digest` of any view, its fixed parts encoded once."""
        head, tail = (
            signed_bytes("consistency", self.roster.fingerprint, self.st["session"]),
            self.st["digest"],
        )
        return lambda U2, U3: head + signed_parts(U2, U3, tail)

    def _view_digest(self, U2: list[int] | None = None, U3: list[int] | None = None) -> bytes:
        """The bytes a consistency signature covers (:func:`mechanisms.secagg.masking.views.view_digest`), this
        node's own view by default."""
        return view_digest(
            self.roster,
            self.st["session"],
            self.st["U2"] if U2 is None else U2,
            self.st["U3"] if U3 is None else U3,
            self.st["digest"],
        )

    def _outside(self, stage: str, ids: list[int], what: str) -> None:
        """Active version: refuse a list naming nodes outside this node's group (the roster's graph)."""
        if self.active and not set(ids) <= self.group:
            raise self._abort(
                stage,
                "outside-group",
                f"the {what} list names node(s) {sorted(set(ids) - self.group)[:5]} outside this node's "
                "group in the roster's graph (the server routes by another graph)",
            )

    # ------------------------------------------------------------------ dispatch
    def handle(
        self,
        msg: dict,
        *,
        ring_input: Callable[[], np.ndarray] | None = None,
        context: bytes = b"",
        aggregation: bytes | None = None,
    ) -> dict:
        """Answer one request; ``ring_input()`` gives the encoded input at the masked stage (a fresh array:
        it is masked in place and becomes the reply), ``context``
        the digest of what this node was asked to sum, ``aggregation`` its aggregation id."""
        stage = str(msg.get("stage", ""))
        expected = {
            "keys": "new",
            "shares": "advertised",
            "masked": "shared",
            "consistency": "masked",
            "unmask": "signed" if self.active else "masked",
        }
        if stage not in expected or (stage == "consistency" and not self.active):
            raise self._abort(stage, "unknown-stage", f"unknown request {stage!r}")
        if self.st["stage"] != expected[stage]:
            raise self._abort(
                stage,
                "out-of-order",
                f"request {stage!r} in state {self.st['stage']!r} (a replayed, repeated or "
                "out-of-order message); no more answers in this session",
            )
        try:
            session = as_bytes(msg.get("session", b""), "the session id")
        except TypeError as exc:
            raise self._abort(stage, "malformed", f"malformed request ({exc})") from None
        if stage != "keys" and session != self.st["session"]:
            raise self._abort(stage, "replay", "the request names another session (a replayed message)")
        try:
            if stage == "keys":
                return self._keys(msg, session)
            if stage == "shares":
                return self._shares(msg)
            if stage == "masked":
                return self._masked(msg, ring_input, context, aggregation)
            if stage == "consistency":
                return self._consistency(msg)
            return self._unmask(msg)
        except PrivfedError as exc:  # ProtocolAbort, or the node's own refusal of its input
            if self.st.get("stage") != "aborted":
                self.st = {"stage": "aborted", "why": str(exc)}
            raise
        except (KeyError, TypeError, ValueError, OverflowError, IndexError) as exc:
            raise self._abort(
                stage, "malformed", f"malformed request ({type(exc).__name__}: {exc})"
            ) from None

    # ------------------------------------------------------------------ stages
    def _keys(self, msg: dict, session: bytes) -> dict:
        check_keys_request(
            msg,
            session,
            K=self.K,
            t=self.t,
            roster=self.roster if self.active else None,
            abort=lambda deviation, text: self._abort("keys", deviation, text),
        )
        c_sk, s_sk, b = self.keys.field_elements(3)
        self.st = {
            "stage": "advertised",
            "session": session,
            "c_sk": c_sk.to_bytes(32, "little"),
            "s_sk": s_sk.to_bytes(32, "little"),
            "b": b.to_bytes(32, "little"),
        }
        c_pk = pub_bytes(self._private("c_sk").public_key())
        s_pk = pub_bytes(self._private("s_sk").public_key())
        self.st.update(own_c_pk=c_pk, own_s_pk=s_pk)
        out = {"u": self.u, "c_pk": c_pk, "s_pk": s_pk}
        if self.active:
            out["sig"] = self.identity.sign(
                signed_bytes("keys", self.roster.fingerprint, session, self.u, c_pk, s_pk)
            )
        if self.sparse:  # the server routes by these (the roster's; a node checks every list against them)
            out["nbrs"] = sorted(self.nbrs)
        return out

    def _shares(self, msg: dict) -> dict:
        U1 = parse_ids(msg["peers"], "key-advertisement", self.u, "shares")
        c_pks = [as_bytes(k, "a public key") for k in msg["c_pk"]]
        s_pks = [as_bytes(k, "a public key") for k in msg["s_pk"]]
        sigs = [as_bytes(s, "a signature") for s in msg.get("sig", [])] if self.active else []
        if len(c_pks) != len(U1) or len(s_pks) != len(U1) or (self.active and len(sigs) != len(U1)):
            raise self._abort("shares", "malformed", "key advertisements of unequal lengths")
        if any(not 0 <= v < self.K for v in U1):
            raise self._abort("shares", "unknown-node", f"advertisements from nodes outside 0..{self.K - 1}")
        self._outside("shares", U1, "key-advertisement")
        if self.u not in U1:
            raise self._abort("shares", "short-list", "its own key advertisement is missing")
        i = U1.index(self.u)
        if (c_pks[i], s_pks[i]) != (self.st["own_c_pk"], self.st["own_s_pk"]):
            raise self._abort("shares", "substituted-key", "its own advertised keys came back changed")
        if self.active:
            # Every other advertisement is verified (its keys receive this node's shares and make its
            # masks); its own came back byte for byte as it sent them, so it needs no signature check.
            head = signed_bytes("keys", self.roster.fingerprint, self.st["session"])
            for v, c, s, sig in zip(U1, c_pks, s_pks, sigs):
                if v != self.u and not self.roster.verify(v, sig, head + signed_parts(v, c, s)):
                    raise self._abort(
                        "shares",
                        "bad-signature",
                        f"node {v}'s key advertisement is not signed by its roster key (a "
                        "substituted key, a Sybil, or a replay from another session)",
                    )
        holders = sorted(self.group & set(U1))
        if len(holders) < self.t:
            raise self._abort(
                "shares", "short-list", f"only {len(holders)} share holders, below the threshold t={self.t}"
            )
        self.st.update(stage="shared", U1=U1, c_pk=c_pks, s_pk=s_pks)
        # The stage's randomness in one draw, read in order: two polynomials' coefficients, a nonce a message.
        sent = sum(v != self.u for v in holders)
        draw = self.keys.ahead(2 * (self.t - 1) * shamir.SHARE_BYTES + GCM_NONCE_BYTES * sent)
        s_shares, b_shares = shamir.split_many(
            [int.from_bytes(self.st["s_sk"], "little"), int.from_bytes(self.st["b"], "little")],
            [v + 1 for v in holders],
            self.t,
            draw,
        )
        channels = self._channel_keys(holders)
        # Kept for decrypting the shares sent to this node (the masked stage): one agreement per pair.
        by_holder = dict(zip(holders, channels))
        self.st["channels"] = [by_holder.get(v, b"") for v in U1]
        to, cts = [], []
        nonces = draw(GCM_NONCE_BYTES * sent)
        for v, channel in zip(holders, channels):
            plain = (
                self.u.to_bytes(ID_BYTES, "little")
                + v.to_bytes(ID_BYTES, "little")
                + s_shares[v + 1].to_bytes(32, "little")
                + b_shares[v + 1].to_bytes(32, "little")
            )
            if v == self.u:
                self.st["own_share"] = plain
                continue
            nonce, nonces = nonces[:GCM_NONCE_BYTES], nonces[GCM_NONCE_BYTES:]
            to.append(v)
            cts.append(nonce + AESGCM(channel).encrypt(nonce, plain, self.st["session"]))
        return {"to": to, "ct": cts}

    def _masked(self, msg: dict, ring_input, context: bytes, aggregation: bytes | None) -> dict:
        U2 = parse_ids(msg["alive"], "survivor", self.u, "masked")
        senders = parse_ids(msg["from"], "sender", self.u, "masked")
        cts = [as_bytes(c, "a share message") for c in msg["ct"]]
        unknown = (set(U2) & self.group) - set(self.st["U1"])
        if unknown or any(not 0 <= v < self.K for v in U2):
            raise self._abort("masked", "unknown-node", f"survivors {sorted(unknown)} never advertised keys")
        self._outside("masked", U2, "survivor")
        if self.u not in U2:
            raise self._abort("masked", "short-list", "the survivor list does not contain this node")
        if len(set(U2) & self.group) < self.t:
            raise self._abort(
                "masked",
                "short-list",
                f"survivor list of {len(set(U2) & self.group)} nodes, below the threshold t={self.t}",
            )
        want = set(U2) & self.nbrs
        if set(senders) != want or len(cts) != len(senders):
            raise self._abort(
                "masked",
                "wrong-ids",
                f"share messages from {sorted(senders)} but the survivors are {sorted(want)}",
            )
        got_from, s_sh, b_sh = [self.u], [self.st["own_share"][8:40]], [self.st["own_share"][40:72]]
        U1 = {v: i for i, v in enumerate(self.st["U1"])}
        for v, ct in zip(senders, cts):
            try:
                plain = AESGCM(self.st["channels"][U1[v]]).decrypt(
                    ct[:GCM_NONCE_BYTES], ct[GCM_NONCE_BYTES:], self.st["session"]
                )
            except InvalidTag:
                raise self._abort(
                    "masked",
                    "tampered-share",
                    f"the share message from node {v} fails authentication (tampered, corrupted "
                    "or from another session); no sum is released",
                ) from None
            if int.from_bytes(plain[:4], "little") != v or int.from_bytes(plain[4:8], "little") != self.u:
                raise self._abort("masked", "wrong-ids", f"the share message from node {v} names other nodes")
            got_from.append(v)
            s_sh.append(plain[8:40])
            b_sh.append(plain[40:72])
        # Claimed before the input is computed or checked: a refusal of the input (say it would overflow
        # the ring) uses the id up too, so a server cannot ask again and again, learning a bit each time.
        if aggregation is not None:
            self.ledger.claim(aggregation, self.u)
        # Masked in place: ring_input() hands over a fresh encoded vector (a copy only if it is of another
        # dtype, layout or read-only), so no second vector is allocated per node.
        x = np.require(ring_input(), dtype=np.uint64, requirements=["C", "W"])
        session = self.st["session"]
        mask_keys, signs = [hkdf(self.st["b"], INFO_SELF + session)], [True]
        s_sk, info = self._private("s_sk"), INFO_PAIR + session
        for v in sorted(set(U2) & self.nbrs):
            mask_keys.append(hkdf(s_sk.exchange(public_key(self.st["s_pk"][U1[v]])), info))
            signs.append(v > self.u)
        add_masks(x, mask_keys, signs)
        self.st.update(
            stage="masked",
            U2=sorted(U2),
            share_from=got_from,
            s_shares=s_sh,
            b_shares=b_sh,
            digest=hashlib.sha256(bytes(context)).digest(),
        )
        for k in ("c_sk", "channels", "own_share", "own_c_pk", "own_s_pk"):  # the channel's work is done
            self.st.pop(k, None)
        if not self.active:
            return {"y": x}
        # The signed echo of what this node summed: every uploader's must match before shares are revealed.
        echo = self.st["echo"] = self.identity.sign(self._echo_bytes())
        return {"y": x, "echo": echo}

    def _check_uploaded(self, stage: str, U3: list[int]) -> None:
        """:func:`mechanisms.secagg.masking.views.check_uploaded` for this node, aborting it on a failure."""
        check_uploaded(
            U3,
            self.st["U2"],
            node=self.u,
            group=self.group,
            t=self.t,
            abort=lambda deviation, text: self._abort(stage, deviation, text),
        )

    def _consistency(self, msg: dict) -> dict:
        U3 = sorted(parse_ids(msg["uploaded"], "uploader", self.u, "consistency"))
        self._check_uploaded("consistency", U3)
        if self.active:
            if self.ledger.uploaders is None and self.ledger.holder is not None:
                raise self._abort(
                    "consistency",
                    "after-ckks",
                    "this node was summed by CKKS before (key holder "
                    f"{self.ledger.holder}) over a set it cannot see; a masked sum over another set "
                    "would subtract from it, so it takes part in no masked sum after it",
                )
            self.ledger.pin(U3, self.u, "consistency")
        self.st.update(stage="signed", U3=U3)
        self.st["sig"] = self.identity.sign(self._view_digest())
        return {"sig": self.st["sig"]}

    def _unmask(self, msg: dict) -> dict:
        U3 = sorted(parse_ids(msg["uploaded"], "uploader", self.u, "unmask"))
        if self.active:
            if U3 != self.st["U3"]:
                raise self._abort(
                    "unmask", "inconsistent-lists", "the uploader list differs from the one this node signed"
                )
            check_unmask(
                self.roster,
                self.group,
                (self.st["U2"], U3),
                self.t,
                msg,
                node=self.u,
                sparse=self.sparse,
                own=(self.st["sig"], self.st["echo"]),
                echo=self._echo_prefix(),
                digest=self._view_prefix(),
                abort=lambda deviation, text: self._abort("unmask", deviation, text),
            )
        else:
            self._check_uploaded("unmask", U3)
        up = set(U3)
        about, kind, share = [], [], []
        by = dict(zip(self.st["share_from"], zip(self.st["s_shares"], self.st["b_shares"])))
        for w in sorted(self.group & set(self.st["U2"])):
            s_share, b_share = by[w]
            about.append(w)
            kind.append("b" if w in up else "s")
            share.append(bytes(b_share if w in up else s_share))
        self.st = {"stage": "done", "session": self.st["session"]}  # the run's secrets are not kept
        return {"about": about, "kind": kind, "share": share}
