"""One node's side of CKKS secure summation: check the key holder's signed context, encrypt once, sign.

:class:`CKKSNode` answers the server's ``ckks_encrypt`` request.  The request
is a dict::

    {"stage": "ckks_encrypt", "public": bytes, "K": int, "holder": int, "sig": bytes, "session": bytes}

(the key holder's public context, the K the server claims, the key holder's
roster index, its signature on the context, the session id) and the reply::

    {"ct": [bytes, ...], "u": int, "sig": bytes, "pin": bytes}

(the ciphertexts, this node's roster index, its signature over them, its
pinned uploader set).  The same class runs in one process
(:func:`mechanisms.secagg.ckks.ckks_sum`) and on every Flower node
(:mod:`privfed.flower.ckks`).

Checks, in order: the roster allows no colluders (CKKS has one key holder,
named by the server); K is the roster's; the public context is signed by the
named key holder's roster key for this session (a substituted key, or one
from another session, is refused before anything is encrypted); K keeps the
release grid above the decryption error; the context holds no secret key.
Then it binds its ledger to this key holder (one per run) and claims the
aggregation id (one encrypted upload per id, ever), before its input is
computed or checked, so a refusal of the input (non-finite, or beyond the
CKKS bound) uses the id up as well; the refusal names the rule broken, never
a value of the input.  Then it encrypts and signs (session, hash of the
public context, hash of the ciphertexts, the digest of what it summed, its
pinned uploader set).

Threat model: a server that deviates in any of these ways is refused with a
:class:`~mechanisms.secagg.crypto.ProtocolAbort` naming this node, the stage
and the deviation; the key holder (:mod:`mechanisms.secagg.ckks.holder`) checks the
rest.  A server colluding with the key holder reads every upload.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from mechanisms.secagg.ckks.scheme import CKKSParams, ckks_encrypt, tenseal_module
from mechanisms.secagg.crypto import ProtocolAbort, as_bytes, as_int, signed_bytes
from mechanisms.secagg.identity import Identity, Roster
from mechanisms.secagg.ledger import SessionLedger
from privfed.errors import ConfigError, InputError

__all__ = ["STAGE", "CKKSNode", "check_num_nodes", "context_bytes", "contribution_bytes", "pin_bytes"]

#: The stage a node answers.
STAGE = "ckks_encrypt"


def check_num_nodes(params: CKKSParams, num_nodes: int) -> None:
    """Refuse K for which the release grid would fall within the decryption error (ConfigError)."""
    top = params.max_precision_bits(num_nodes)
    if top < params.precision_bits:
        raise ConfigError(
            f"CKKS with {num_nodes} nodes: the decryption error of the sum reaches the release grid "
            f"2^-{params.precision_bits} (finest safe grid 2^-{top}), so the released bits would be key-dependent; "
            "use at most 256 nodes with CKKS, or --secure-agg mask"
        )


def pin_bytes(uploaders: list[int] | None) -> bytes:
    """A node's pinned uploader set as it signs it: ``P`` then 4 bytes per roster index (``P`` alone: none yet)."""
    return b"P" + b"".join(int(v).to_bytes(4, "little") for v in sorted(uploaders or []))


def context_bytes(roster: Roster, session: bytes, holder: int, public: bytes) -> bytes:
    """What the key holder signs for its public context."""
    return signed_bytes(
        "ckks-context", roster.fingerprint, bytes(session), int(holder), hashlib.sha256(public).digest()
    )


def contribution_bytes(
    roster: Roster,
    session: bytes,
    u: int,
    cts: list[bytes],
    digest: bytes,
    pin: bytes = b"P",
    *,
    context: bytes,
) -> bytes:
    """What node ``u`` signs for its ciphertexts; ``context`` is the sha256 of the public context it encrypted
    under (the key holder checks it against its own, so ciphertexts made under another key are refused)."""
    h = hashlib.sha256()
    for c in cts:
        h.update(len(c).to_bytes(8, "little") + bytes(c))
    return signed_bytes(
        "ckks-contribution",
        roster.fingerprint,
        bytes(session),
        int(u),
        bytes(context),
        h.digest(),
        bytes(digest),
        bytes(pin),
    )


class CKKSNode:
    """One node encrypting its statistic for one CKKS sum (see the module docstring).

    Parameters
    ----------
    params : CKKSParams
    identity, roster
        This node's signing key and the operator's roster.
    ledger : SessionLedger, optional
        Aggregation ids used, the pinned uploader set and key holder (a fresh one by default).
    release_grid : bool
        The key holder releases on the 2^-precision_bits grid (refuse K whose decryption error reaches
        it); ``False`` when the sum is released as whole numbers.
    contexts : dict, optional
        Parsed public contexts by the hash of their bytes, shared by nodes in one process (parsing one
        costs about as much as encrypting a few ciphertexts); each node checks the signature on the bytes
        first.
    """

    def __init__(
        self,
        params: CKKSParams,
        *,
        identity: Identity,
        roster: Roster,
        ledger: SessionLedger | None = None,
        release_grid: bool = True,
        contexts: dict | None = None,
    ) -> None:
        self.params, self.identity, self.roster = params, identity, roster
        self.u = identity.index
        self.ledger = ledger if ledger is not None else SessionLedger()
        self.release_grid = bool(release_grid)
        self.contexts = {} if contexts is None else contexts

    def _abort(self, deviation: str, text: str) -> ProtocolAbort:
        return ProtocolAbort(
            f"node {self.u} aborts at stage {STAGE!r}: {text}", node=self.u, stage=STAGE, deviation=deviation
        )

    def encrypt(
        self,
        msg: dict,
        values: Callable[[], np.ndarray] | np.ndarray,
        *,
        digest: bytes = b"",
        aggregation: bytes | None = None,
    ) -> dict:
        """Check the request, then encrypt ``values`` (or ``values()``, asked only once every check passed).

        ``digest`` is the hash of what this node was asked to sum (run config, round, broadcast): the key
        holder checks it against its own, so a split broadcast is refused.  ``aggregation`` is the id this
        upload claims in the ledger.
        """
        try:
            public, holder = as_bytes(msg["public"], "public"), as_int(msg["holder"], "holder")
            signature, session = as_bytes(msg["sig"], "sig"), as_bytes(msg["session"], "session")
            K = as_int(msg["K"], "K")
        except (KeyError, TypeError) as exc:
            raise self._abort("malformed", f"malformed request ({type(exc).__name__}: {exc})") from None
        roster = self.roster
        if roster.colluders > 0:
            raise self._abort(
                "colluders",
                f"its roster allows {roster.colluders} node(s) to collude with the server, and CKKS has one key "
                "holder, named by the server: a colluding holder decrypts every upload; nothing is encrypted "
                "(use --secure-agg mask, whose threshold covers colluders)",
            )
        if K != roster.size:
            raise self._abort(
                "wrong-parameters", f"the server asks for K={K}, the roster has K={roster.size}"
            )
        if not roster.verify(holder, signature, context_bytes(roster, session, holder, public)):
            raise self._abort(
                "substituted-key",
                f"the CKKS public context is not signed by key holder {holder}'s roster key (a substituted "
                "key, or one from another session): nothing is encrypted",
            )
        if self.release_grid:
            check_num_nodes(self.params, roster.size)
        key = hashlib.sha256(public).digest()
        if key not in self.contexts:
            self.contexts[key] = tenseal_module().context_from(public)
        ctx = self.contexts[key]
        if ctx.is_private():
            raise self._abort("substituted-key", "it was sent a context holding the secret key")
        # One key holder per run (it keeps one set); bound once its signed context checked out.
        self.ledger.bind_holder(holder, self.u, STAGE)
        if aggregation is not None:
            # Claimed before the input is computed or checked: a refusal uses the id up too, so a server
            # cannot ask again and again for one aggregation, learning one bit of the input each time.
            self.ledger.claim(aggregation, self.u)  # one encrypted upload per aggregation id
        x = np.asarray(values() if callable(values) else values, dtype=np.float64).ravel()
        # The refusals name the rule, never a value measured from this node's data.
        if not np.all(np.isfinite(x)):
            raise InputError("this node's statistic contains NaN/inf; secure aggregation needs finite values")
        if not (roster.size * float(np.abs(x).max()) if x.size else 0.0) < 2.0**self.params.bound_bits:
            raise InputError(
                f"this node's statistic could exceed the CKKS bound 2^{self.params.bound_bits} summed over "
                f"{roster.size} nodes; clip the features"
            )
        pin = pin_bytes(self.ledger.uploaders)
        cts = ckks_encrypt(ctx, x, self.params.slots)
        sig = self.identity.sign(contribution_bytes(roster, session, self.u, cts, digest, pin, context=key))
        return {"ct": cts, "u": self.u, "sig": sig, "pin": pin}
