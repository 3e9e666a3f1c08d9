"""The CKKS key holder's side: fresh keys, a signed public context, one checked sum decrypted once.

:class:`CKKSKeyHolder` answers two requests (dicts with a ``stage``):

``ckks_keys``     ``{"K": int, "session": bytes}``: check K against the
                  roster and that it never made keys for this session id
                  (one key per session: a second would let contributions
                  made under the first be decrypted under the second), make
                  fresh CKKS keys for this sum, keep the secret
                  key in its state and reply ``{"public", "u", "sig"}``: the
                  public context signed with its roster identity over
                  (session, hash of the context).
``ckks_decrypt``  ``{"from": [int], "ct": [bytes] (n per node), "sigs": [bytes],
                  "pins": [bytes], "size": int, "session": bytes}``: forget
                  the secret key whatever happens next (one aggregate per
                  key), check the session, that every contribution is signed
                  by its roster node over this session, the hash of the key
                  holder's own public context and its own digest of what was
                  summed, that at least t distinct roster
                  nodes contributed, that a real-valued release grid lies
                  above the decryption error of that many (``"integral": True``
                  rounds to whole numbers), that every node's pinned uploader set is
                  empty or this sum's and (with a ledger) that the set is the
                  one of its earlier sums; then add them itself, decrypt once,
                  round to the release grid and reply ``{"total": array}``.

The same class runs in one process (:func:`mechanisms.secagg.ckks.ckks_sum`) and
on the Flower node the server names (:mod:`privfed.flower.ckks`), which keeps
:meth:`CKKSKeyHolder.state` in its ``context.state`` between messages.

Threat model: a server that substitutes, relabels or forges contributions,
forwards one node's ciphertext as the sum, replays another session or asks
for a second decryption is refused with a
:class:`~mechanisms.secagg.crypto.ProtocolAbort`.  A malicious key holder
could release a wrong value; a key holder colluding with the server reads
every upload (nodes refuse CKKS when the roster allows colluders).
"""

from __future__ import annotations

import hashlib
import time

from mechanisms.secagg.ckks.node import context_bytes, contribution_bytes, pin_bytes
from mechanisms.secagg.ckks.scheme import (
    CKKSParams,
    add_ciphertexts,
    decrypt_rounded,
    new_context,
    public_bytes,
    tenseal_module,
)
from mechanisms.secagg.crypto import ProtocolAbort, as_bytes, as_int
from mechanisms.secagg.identity import Identity, Roster
from mechanisms.secagg.ledger import SessionLedger

__all__ = ["CKKSKeyHolder"]


class CKKSKeyHolder:
    """The node that holds the secret key of one CKKS sum (see the module docstring).

    Parameters
    ----------
    params : CKKSParams
    identity, roster
        The key holder's signing key and the operator's roster.
    ledger : SessionLedger, optional
        The key holder's ledger: it pins the contributor set of its first sum.
    state : dict, optional
        What :meth:`state` returned after the keys stage (``{}``: no key held).
    """

    def __init__(
        self,
        params: CKKSParams,
        *,
        identity: Identity,
        roster: Roster,
        ledger: SessionLedger | None = None,
        state: dict | None = None,
    ) -> None:
        self.params, self.identity, self.roster = params, identity, roster
        self.u = identity.index
        self.ledger = ledger
        self.st: dict = dict(state) if state else {}
        self.key_sessions: set[bytes] = (
            set()
        )  # sessions this object made keys for (its ledger keeps them too)
        self.seconds: dict[str, float] = {}  # the last decryption's check / sum / decrypt times

    def state(self) -> dict:
        """The secret context, session and digest kept between messages (``{}`` once the key is gone)."""
        return dict(self.st)

    def note_digest(self, digest: bytes) -> None:
        """The digest of what this node (also a contributor) was asked to sum: every contribution must match it."""
        if self.st:
            self.st["digest"] = bytes(digest)

    def _abort(self, stage: str, deviation: str, text: str) -> ProtocolAbort:
        return ProtocolAbort(
            f"node {self.u} aborts at stage {stage!r}: {text}", node=self.u, stage=stage, deviation=deviation
        )

    # ------------------------------------------------------------------ keys
    def keys(self, msg: dict) -> dict:
        """Fresh keys for this sum; reply the signed public context."""
        try:
            session, K = as_bytes(msg["session"], "session"), as_int(msg["K"], "K")
        except (KeyError, TypeError) as exc:
            raise self._abort(
                "ckks_keys", "malformed", f"malformed request ({type(exc).__name__}: {exc})"
            ) from None
        if K != self.roster.size:
            raise self._abort(
                "ckks_keys",
                "wrong-parameters",
                f"the server asks for K={K}, the roster has K={self.roster.size}",
            )
        if session in self.key_sessions or (self.ledger is not None and self.ledger.has_key_session(session)):
            raise self._abort(
                "ckks_keys",
                "second-session",
                "it already made keys for this session id; a second key for one session would let "
                "contributions made under one key be decrypted under another (use a fresh session id)",
            )
        if self.ledger is not None:
            self.ledger.claim_key_session(session)
        self.key_sessions.add(session)
        ctx = new_context(self.params)
        public = public_bytes(ctx)
        sig = self.identity.sign(context_bytes(self.roster, session, self.u, public))
        self.st = {
            "secret": ctx.serialize(save_secret_key=True),
            "session": session,
            "digest": b"",
            "public": hashlib.sha256(public).digest(),
        }
        return {"public": public, "u": self.u, "sig": sig}

    # ------------------------------------------------------------------ decrypt
    def decrypt(self, msg: dict) -> dict:
        """Check the contributions, add them, decrypt once, round; reply ``{"total": array}``."""
        stage = "ckks_decrypt"
        if not self.st:
            raise self._abort(
                stage,
                "second-session",
                "it holds no key (each key decrypts one aggregate; use fresh keys for every aggregation)",
            )
        kept, self.st = self.st, {}  # one aggregate per key, whatever happens next
        t0 = time.perf_counter()
        try:
            session, size = as_bytes(msg["session"], "session"), as_int(msg["size"], "size")
            cts = [as_bytes(c, "a ciphertext") for c in msg["ct"]]
            senders = [as_int(u, "a sender") for u in msg["from"]]
            sigs = [as_bytes(s, "a signature") for s in msg["sigs"]]
            pins = [as_bytes(p, "a pin") for p in msg["pins"]]
            integral = msg.get("integral", False) is True
        except (KeyError, TypeError) as exc:
            raise self._abort(
                stage, "malformed", f"malformed request ({type(exc).__name__}: {exc})"
            ) from None
        if session != bytes(kept["session"]):
            raise self._abort(stage, "replay", "another session's aggregate")
        n = self.params.num_ciphertexts(size)
        if size < 0 or len(cts) != n * len(senders) or min(len(sigs), len(pins)) < len(senders):
            raise self._abort(stage, "malformed", "malformed contributions")
        contributions = [
            (u, cts[i * n : (i + 1) * n], sg, pn) for i, (u, sg, pn) in enumerate(zip(senders, sigs, pins))
        ]
        if not integral and self.params.max_precision_bits(len(senders)) < self.params.precision_bits:
            raise self._abort(
                stage,
                "fine-grid",
                f"asked to release a sum of {len(senders)} contributions on the 2^-{self.params.precision_bits} "
                "grid, within their decryption error: the released bits would depend on the secret key",
            )
        self._check(contributions, session, bytes(kept.get("digest", b"")), bytes(kept.get("public", b"")))
        t1 = time.perf_counter()
        ts = tenseal_module()
        ctx = ts.context_from(bytes(kept["secret"]))
        acc = add_ciphertexts(ctx, [c for _, c, _, _ in contributions])
        t2 = time.perf_counter()
        total = decrypt_rounded(acc, size, self.params, integral=integral)
        self.seconds = {"check": t1 - t0, "sum": t2 - t1, "decrypt": time.perf_counter() - t2}
        return {"total": total}

    def _check(
        self,
        contributions: list[tuple[int, list[bytes], bytes, bytes]],
        session: bytes,
        digest: bytes,
        public: bytes,
    ):
        stage, roster = "ckks_decrypt", self.roster
        seen = [u for u, _, _, _ in contributions]
        if len(set(seen)) != len(seen):
            raise self._abort(stage, "malformed-list", "a node's contribution appears twice")
        if len(seen) < roster.sum_threshold:  # a SecAgg+ roster's t is per group: a majority of K here
            raise self._abort(
                stage,
                "short-list",
                f"asked to decrypt a sum of {len(seen)} contribution(s), below the threshold "
                f"t={roster.sum_threshold}: it could be one node's input",
            )
        for u, cts, sig, pin in contributions:
            if not roster.verify(
                u, sig, contribution_bytes(roster, session, u, cts, digest, pin, context=public)
            ):
                raise self._abort(
                    stage,
                    "bad-signature",
                    f"the contribution said to be node {u}'s is not signed by it for this session, this key "
                    "holder's public context and what the key holder summed (a forged or relabelled "
                    "contribution, one encrypted under another key, or a split broadcast)",
                )
        members = pin_bytes(seen)
        other = sorted(u for u, _, _, pin in contributions if pin not in (pin_bytes(None), members))
        if other:
            raise self._abort(
                stage,
                "other-uploaders",
                f"node(s) {other} were summed over another uploader set earlier in the run than this sum's "
                f"{sorted(seen)}; the difference of the two sums would be one node's input",
            )
        if self.ledger is not None:
            self.ledger.pin(seen, self.u, stage)
