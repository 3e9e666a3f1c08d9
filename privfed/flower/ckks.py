"""CKKS secure summation over Flower messages, with the key holder a separate node.

The protocol of :mod:`mechanisms.ckks` between real parties, hardened
against a server that deviates (every signature checked against the
operator's roster, :mod:`mechanisms.secagg_identity`):

``query.ckks_keys``     the key holder (a node, never the server) makes fresh
                        CKKS keys for this sum, keeps the secret key in its own
                        ``context.state`` and replies the public context,
                        signed with its roster identity over (session, hash of
                        the context);
``query.ckks_encrypt``  every node checks that signature against the roster
                        before encrypting (a server that substitutes its own
                        key is refused), checks K against its roster (its
                        bound check uses the configured K), encrypts its
                        statistic once per aggregation id, for one key holder
                        per run, and replies the ciphertexts signed over
                        (session, their hash, the digest of what it summed, its
                        pinned uploader set);
``query.ckks_decrypt``  the server forwards every signed contribution; the key
                        holder checks each signature, that they come from at
                        least t distinct roster nodes, that the set is the one
                        of its earlier sums in the run and of every node's
                        earlier masked sum (its signed pin), adds them itself and
                        decrypts that sum once, rounds it to the release grid,
                        deletes its secret key and replies the sum.  A server
                        that forwards one node's ciphertext as "the sum" (to
                        have it decrypted) is refused.

Nodes that do not answer the encryption stage are left out of the sum (the
report says so); if the key holder does not answer, no sum is released.
The server sums nothing itself: it relays ciphertexts it cannot read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from mechanisms.ckks import CKKSParams, tenseal_module
from mechanisms.secagg_crypto import ProtocolAbort
from mechanisms.secagg_identity import Identity, Roster, signed_bytes
from privfed.errors import ConfigError, InputError
from privfed.flower.transport import Exchange, exchange
from privfed.flower.wire import arrays_record

__all__ = [
    "CKKSSum",
    "check_num_nodes",
    "ckks_sum_over_messages",
    "holder_decrypt",
    "holder_keys",
    "node_encrypt",
    "pin_bytes",
]

#: The key holder's secret context in its ``context.state``.
SECRET_KEY = "privfed-ckks-secret"


def check_num_nodes(params: CKKSParams, num_nodes: int) -> None:
    """Refuse K for which the release grid would fall within the decryption error (ConfigError)."""
    top = params.max_precision_bits(num_nodes)
    if top < params.precision_bits:
        raise ConfigError(
            f"CKKS with {num_nodes} nodes: the decryption error of the sum reaches the release grid "
            f"2^-{params.precision_bits} (finest safe grid 2^-{top}), so the released bits would be key-dependent; "
            "use at most 256 nodes with CKKS, or --secure mask"
        )


def _abort(node: int, stage: str, deviation: str, text: str) -> ProtocolAbort:
    return ProtocolAbort(
        f"node {node} aborts at stage {stage!r}: {text}", node=node, stage=stage, deviation=deviation
    )


# ------------------------------------------------------------------------------- node side
def holder_keys(
    params: CKKSParams, identity: Identity, roster: Roster, session: bytes, num_nodes: int
) -> tuple[bytes, bytes, bytes]:
    """Fresh keys: (secret context to keep, public context to send, signature on it)."""
    if int(num_nodes) != roster.size:
        raise _abort(
            identity.index,
            "ckks_keys",
            "wrong-parameters",
            f"the server asks for K={num_nodes}, the roster has K={roster.size}",
        )
    ts = tenseal_module()
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
    ctx.global_scale = 2.0**params.scale_bits
    public = ctx.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )
    sig = identity.sign(
        signed_bytes(
            "ckks-context",
            roster.fingerprint,
            bytes(session),
            identity.index,
            hashlib.sha256(public).digest(),
        )
    )
    return ctx.serialize(save_secret_key=True), public, sig


def pin_bytes(uploaders: list[int] | None) -> bytes:
    """A node's pinned uploader set as it signs it: ``P`` then 4 bytes per roster index (``P`` alone: none yet)."""
    return b"P" + b"".join(int(v).to_bytes(4, "little") for v in sorted(uploaders or []))


def _contribution_bytes(
    roster: Roster, session: bytes, u: int, cts: list[bytes], digest: bytes, pin: bytes = b"P"
) -> bytes:
    h = hashlib.sha256()
    for c in cts:
        h.update(len(c).to_bytes(8, "little") + bytes(c))
    return signed_bytes(
        "ckks-contribution", roster.fingerprint, bytes(session), u, h.digest(), bytes(digest), bytes(pin)
    )


def node_encrypt(
    public: bytes,
    x: np.ndarray,
    params: CKKSParams,
    *,
    identity: Identity,
    roster: Roster,
    holder: int,
    signature: bytes,
    session: bytes,
    num_nodes: int,
    digest: bytes = b"",
    pin: bytes = b"P",
) -> tuple[list[bytes], bytes]:
    """Check the holder's signed context, then encrypt this node's statistic; returns (ciphertexts, signature).

    The signature covers the ciphertexts and ``digest``, the hash of what this node summed (run config,
    round, broadcast): the key holder checks it against its own, so a split broadcast is refused.  It also
    covers ``pin`` (:func:`pin_bytes`), the uploader set of this node's earlier sums in the run: the key
    holder refuses to add it to a sum over another set.

    Refused if K (from the roster, not the server) such inputs could exceed the CKKS bound.
    """
    u = identity.index
    if roster.colluders > 0:
        raise _abort(
            u,
            "ckks_encrypt",
            "colluders",
            f"its roster allows {roster.colluders} node(s) to collude with the server, and CKKS has one key "
            "holder, named by the server: a colluding holder decrypts every upload; nothing is encrypted "
            "(use --secure mask, whose threshold covers colluders)",
        )
    if int(num_nodes) != roster.size:
        raise _abort(
            u,
            "ckks_encrypt",
            "wrong-parameters",
            f"the server asks for K={num_nodes}, the roster has K={roster.size}",
        )
    if not roster.verify(
        int(holder),
        bytes(signature),
        signed_bytes(
            "ckks-context", roster.fingerprint, bytes(session), int(holder), hashlib.sha256(public).digest()
        ),
    ):
        raise _abort(
            u,
            "ckks_encrypt",
            "substituted-key",
            f"the CKKS public context is not signed by key holder {holder}'s roster key (a substituted "
            "key, or one from another session): nothing is encrypted",
        )
    check_num_nodes(params, roster.size)
    ts = tenseal_module()
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise InputError("this node's statistic contains NaN/inf; secure aggregation needs finite values")
    max_abs = float(np.abs(x).max()) if x.size else 0.0
    if not roster.size * max_abs < 2.0**params.bound_bits:
        raise InputError(
            f"this node's statistic (max |x| = {max_abs:.4g}) could exceed the CKKS bound "
            f"2^{params.bound_bits} summed over {roster.size} nodes; clip the features"
        )
    ctx = ts.context_from(public)
    if ctx.is_private():
        raise _abort(u, "ckks_encrypt", "substituted-key", "it was sent a context holding the secret key")
    s = params.slots
    cts = [ts.ckks_vector(ctx, x[i : i + s].tolist()).serialize() for i in range(0, x.size, s)]
    return cts, identity.sign(_contribution_bytes(roster, session, u, cts, digest, pin))


def holder_decrypt(
    secret: bytes,
    contributions: list[tuple[int, list[bytes], bytes, bytes]],
    size: int,
    params: CKKSParams,
    *,
    identity: Identity,
    roster: Roster,
    session: bytes,
    integral: bool = False,
    digest: bytes = b"",
    ledger=None,
) -> np.ndarray:
    """Check every signed contribution (at least t distinct roster nodes, each over the same ``digest`` of
    what was summed as the key holder's own, each node's pinned uploader set empty or this sum's set; with
    ``ledger``, the key holder's own pin too), add them, decrypt once, round.  Each contribution is
    (node, ciphertexts, signature, pin)."""
    me = identity.index
    seen = [u for u, _, _, _ in contributions]
    if len(set(seen)) != len(seen):
        raise _abort(me, "ckks_decrypt", "malformed-list", "a node's contribution appears twice")
    if len(seen) < roster.threshold:
        raise _abort(
            me,
            "ckks_decrypt",
            "short-list",
            f"asked to decrypt a sum of {len(seen)} contribution(s), below the threshold "
            f"t={roster.threshold}: it could be one node's input",
        )
    n_ct = params.num_ciphertexts(size)
    for u, cts, sig, pin in contributions:
        if len(cts) != n_ct or not roster.verify(
            int(u), bytes(sig), _contribution_bytes(roster, session, u, cts, digest, pin)
        ):
            raise _abort(
                me,
                "ckks_decrypt",
                "bad-signature",
                f"the contribution said to be node {u}'s is not signed by it for this session and for what "
                "the key holder summed (a forged or relabelled contribution, or a split broadcast)",
            )
    members = pin_bytes(seen)
    other = sorted(u for u, _, _, pin in contributions if bytes(pin) not in (pin_bytes(None), members))
    if other:
        raise _abort(
            me,
            "ckks_decrypt",
            "other-uploaders",
            f"node(s) {other} were summed over another uploader set earlier in the run than this sum's "
            f"{sorted(seen)}; the difference of the two sums would be one node's input",
        )
    if ledger is not None:
        ledger.pin(seen, me, "ckks_decrypt")
    ts = tenseal_module()
    ctx = ts.context_from(secret)
    acc = None
    for _, cts, _, _ in contributions:
        vecs = [ts.ckks_vector_from(ctx, c) for c in cts]
        if acc is None:
            acc = vecs
        else:
            for j, v in enumerate(vecs):
                acc[j] += v
    parts = [np.asarray(v.decrypt(), dtype=np.float64) for v in acc or []]
    out = np.concatenate(parts)[:size] if parts else np.zeros(0)
    if integral:
        return np.rint(out)
    grid = 2.0**params.precision_bits
    return np.rint(out * grid) / grid


# ------------------------------------------------------------------------------- server side
@dataclass
class CKKSSum:
    """One CKKS sum over messages: the sum and what the aggregator saw."""

    total: np.ndarray
    participants: list[int]
    key_holder: int
    stages: dict[str, Exchange]
    uploaded: list[int]
    dropped_before_upload: list[int]
    dropped_after_upload: list[int] = field(default_factory=list)
    view: list = field(default_factory=list)

    def record(self) -> dict:
        return {
            "protocol": "CKKS (TenSEAL), key holder a separate node; public context and contributions signed "
            "with roster identities, the key holder adds the signed contributions itself",
            "key_holder": self.key_holder,
            "participants": len(self.participants),
            "uploaded": len(self.uploaded),
            "dropped_before_upload": list(self.dropped_before_upload),
            "stages": {
                k: {
                    "answered": len(v.answered),
                    "failed": v.failed,
                    "silent": v.silent,
                    "seconds": round(v.seconds, 3),
                    "bytes_up": int(sum(v.bytes_up.values())),
                }
                for k, v in self.stages.items()
            },
        }


def _refused(stage: str, content, node) -> None:
    if "error" in content:
        kind = str(content["error"].get("kind", ""))
        msg = f"node {node} refused secure aggregation at stage {stage!r}: {content['error']['message']}"
        if kind == "ProtocolAbort":
            raise ProtocolAbort(msg + "; no sum is released", node=node, stage=stage)
        raise ConfigError(msg)


def ckks_sum_over_messages(
    grid,
    nodes: list[int],
    *,
    key_holder: int,
    length: int,
    params: CKKSParams,
    timeout: float,
    payload: Callable[[int], dict],
    round_name: str,
    keep_view: bool = False,
    num_nodes: int | None = None,
) -> CKKSSum:
    """Run the three stages (see the module docstring) and return the released sum."""
    K = len(nodes) if num_nodes is None else int(num_nodes)
    check_num_nodes(params, K)
    stages: dict[str, Exchange] = {}
    view: list = []
    session = os.urandom(16)
    holder_reply: dict = {}

    def on_keys(node, content):
        _refused("ckks_keys", content, node)
        rec = content["ckks"]
        holder_reply.update(public=bytes(rec["public"]), holder=int(rec["u"]), sig=bytes(rec["sig"]))

    prm = ConfigRecord({"round": round_name, "K": K, "session": session})
    stages["ckks_keys"] = exchange(
        grid,
        {key_holder: RecordDict({"ckks": prm})},
        "query.ckks_keys",
        timeout,
        on_keys,
        group_id=round_name,
    )
    if "public" not in holder_reply:
        raise ProtocolAbort(f"the CKKS key holder (node {key_holder}) did not answer; no sum is released")
    public = holder_reply["public"]
    contributions: list[tuple[int, list[bytes], bytes, bytes]] = []
    uploaded: list[int] = []
    n_ct = params.num_ciphertexts(length)

    def on_ct(node, content):
        _refused("ckks_encrypt", content, node)
        rec = content["ckks"]
        cts = [bytes(c) for c in rec["ct"]]
        if len(cts) != n_ct:
            raise InputError(
                f"node {node} sent {len(cts)} ciphertexts, expected {n_ct}: the nodes disagree on d or C"
            )
        if keep_view:
            view.append(("ckks_encrypt", node, "ciphertexts", cts))
        contributions.append((int(rec["u"]), cts, bytes(rec["sig"]), bytes(rec.get("pin", b""))))
        uploaded.append(node)

    contents = {
        n: RecordDict(
            {
                "ckks": ConfigRecord(
                    {
                        "public": public,
                        "K": K,
                        "holder": holder_reply["holder"],
                        "sig": holder_reply["sig"],
                        "session": session,
                    }
                ),
                **payload(n),
            }
        )
        for n in nodes
    }
    ex = stages["ckks_encrypt"] = exchange(
        grid, contents, "query.ckks_encrypt", timeout, on_ct, group_id=round_name
    )
    if len(uploaded) < 2:
        raise ProtocolAbort(
            f"CKKS: {len(uploaded)} node(s) uploaded ({ex.failed or ex.silent}); a sum of fewer "
            "than 2 inputs is an input, so none is released"
        )
    out: dict = {}

    def on_sum(node, content):
        _refused("ckks_decrypt", content, node)
        out["total"] = content["sum"]["total"].numpy()

    request = ConfigRecord(
        {
            "from": [u for u, _, _, _ in contributions],
            "ct": [c for _, cts, _, _ in contributions for c in cts],
            "sigs": [s for _, _, s, _ in contributions],
            "pins": [p for _, _, _, p in contributions],
            "size": int(length),
            "session": session,
        }
    )
    stages["ckks_decrypt"] = exchange(
        grid,
        {key_holder: RecordDict({"ckks": request})},
        "query.ckks_decrypt",
        timeout,
        on_sum,
        group_id=round_name,
    )
    if "total" not in out:
        raise ProtocolAbort(f"the CKKS key holder (node {key_holder}) did not decrypt; no sum is released")
    if keep_view:
        view.append(("ckks_decrypt", key_holder, "released sum", out["total"]))
    return CKKSSum(
        total=np.asarray(out["total"], dtype=np.float64),
        participants=list(nodes),
        key_holder=key_holder,
        stages=stages,
        uploaded=sorted(uploaded),
        dropped_before_upload=sorted(set(nodes) - set(uploaded)),
        view=view,
    )


def sum_reply(total: np.ndarray) -> RecordDict:
    return RecordDict({"sum": arrays_record({"total": np.asarray(total, dtype=np.float64)})})
