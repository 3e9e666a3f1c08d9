"""CKKS secure summation over Flower messages, with the key holder a separate node: the transport only.

The protocol is :mod:`mechanisms.secagg.ckks.node` (a node),
:mod:`mechanisms.secagg.ckks.holder` (the key holder) and
:mod:`mechanisms.secagg.ckks.server` (the server); this module carries their
requests and replies as Flower records (the ``ckks`` ConfigRecord; the
released sum as an ArrayRecord), keeps the key holder's state in its
``context.state`` and runs the server's stages over the grid.  The stages,
hardened against a server that deviates (every signature checked against
the operator's roster, :mod:`mechanisms.secagg.identity`):

``query.ckks_keys``     the key holder (a node, never the server) makes fresh
                        CKKS keys for this sum (once per session id), keeps the secret key in its own
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
                        pinned uploader set and the hash of the public
                        context), having claimed the aggregation id before
                        computing its input (a refusal uses the id up);
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

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from mechanisms.secagg.ckks.holder import CKKSKeyHolder
from mechanisms.secagg.ckks.node import CKKSNode, check_num_nodes, pin_bytes
from mechanisms.secagg.ckks.scheme import CKKSParams
from mechanisms.secagg.ckks.server import STAGES, CKKSServer
from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.identity import Identity, Roster
from mechanisms.secagg.ledger import SessionLedger
from privfed.errors import ConfigError
from privfed.flower.transport import Exchange, exchange
from privfed.flower.wire import arrays_record

__all__ = [
    "SECRET_KEY",
    "CKKSSum",
    "check_num_nodes",
    "ckks_limit",
    "ckks_sum_over_messages",
    "holder_decrypt_step",
    "holder_keys_step",
    "node_encrypt_step",
    "pin_bytes",
    "sum_reply",
]

#: The key holder's secret context in its ``context.state``.
SECRET_KEY = "privfed-ckks-secret"


# ------------------------------------------------------------------------------- node side
def ckks_limit(num_nodes: int, params: CKKSParams | None = None) -> float:
    """The largest |x| a node may encrypt so that the sum of K stays within the CKKS bound (public), with a
    margin below the node's strict rule."""
    p = CKKSParams() if params is None else params
    return 2.0**p.bound_bits / int(num_nodes) * (1.0 - 2.0**-20)


def _request(stage: str, content: RecordDict) -> dict:
    return {**dict(content["ckks"]), "stage": stage}


def _holder(params: CKKSParams, identity: Identity, roster: Roster, state, ledger=None) -> CKKSKeyHolder:
    kept = dict(state[SECRET_KEY]) if SECRET_KEY in state else None
    return CKKSKeyHolder(params, identity=identity, roster=roster, ledger=ledger, state=kept)


def holder_keys_step(
    content: RecordDict,
    state,
    identity: Identity,
    roster: Roster,
    params: CKKSParams | None = None,
    *,
    ledger: SessionLedger | None = None,
) -> RecordDict:
    """``query.ckks_keys``: fresh keys, the secret kept in ``state`` (a node's ``context.state``); ``ledger``
    keeps the session ids it made keys for (one key per session id)."""
    holder = CKKSKeyHolder(
        CKKSParams() if params is None else params, identity=identity, roster=roster, ledger=ledger
    )
    reply = holder.keys(_request("ckks_keys", content))
    state[SECRET_KEY] = ConfigRecord(holder.state())
    return RecordDict({"ckks": ConfigRecord(reply)})


def node_encrypt_step(
    content: RecordDict,
    state,
    identity: Identity,
    roster: Roster,
    *,
    values: Callable[[], np.ndarray],
    ledger: SessionLedger,
    digest: bytes = b"",
    aggregation: bytes | None = None,
    params: CKKSParams | None = None,
) -> RecordDict:
    """``query.ckks_encrypt``: :meth:`mechanisms.secagg.ckks.node.CKKSNode.encrypt`; a node that is also the key
    holder notes its digest, which every contribution must carry."""
    params = CKKSParams() if params is None else params
    node = CKKSNode(params, identity=identity, roster=roster, ledger=ledger)
    req = _request("ckks_encrypt", content)
    reply = node.encrypt(req, values, digest=digest, aggregation=aggregation)
    if SECRET_KEY in state and req["holder"] == identity.index:
        holder = _holder(params, identity, roster, state)
        holder.note_digest(digest)
        state[SECRET_KEY] = ConfigRecord(holder.state())
    return RecordDict({"ckks": ConfigRecord(reply)})


def holder_decrypt_step(
    content: RecordDict,
    state,
    identity: Identity,
    roster: Roster,
    *,
    ledger: SessionLedger,
    params: CKKSParams | None = None,
) -> RecordDict:
    """``query.ckks_decrypt``: :meth:`mechanisms.secagg.ckks.holder.CKKSKeyHolder.decrypt`; the key leaves
    ``state`` whatever happens."""
    holder = _holder(CKKSParams() if params is None else params, identity, roster, state, ledger)
    if SECRET_KEY in state:
        del state[SECRET_KEY]  # one aggregate per key, whatever happens next
    return sum_reply(holder.decrypt(_request("ckks_decrypt", content))["total"])


def sum_reply(total: np.ndarray) -> RecordDict:
    return RecordDict({"sum": arrays_record({"total": np.asarray(total, dtype=np.float64)})})


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


def _reply(stage: str, content) -> dict:
    if stage == "ckks_decrypt":
        return {"total": content["sum"]["total"].numpy()}
    return dict(content["ckks"])


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
    """Run :class:`mechanisms.secagg.ckks.server.CKKSServer` over the grid (see the module docstring)."""
    server = CKKSServer(
        nodes,
        key_holder=key_holder,
        length=length,
        params=params,
        session=os.urandom(16),
        num_nodes=num_nodes,
    )
    stages: dict[str, Exchange] = {}
    for stage in STAGES:

        def on_reply(node, content, stage=stage):
            _refused(stage, content, node)
            server.receive(node, _reply(stage, content))

        contents = {}
        for n, req in server.requests().items():
            rec = {k: v for k, v in req.items() if k != "stage"}
            if stage == "ckks_keys":
                rec["round"] = round_name
            extra = payload(n) if stage == "ckks_encrypt" else {}
            contents[n] = RecordDict({"ckks": ConfigRecord(rec), **extra})
        ex = stages[stage] = exchange(
            grid, contents, f"query.{stage}", timeout, on_reply, group_id=round_name
        )
        server.close(detail=str(ex.failed or ex.silent))
    view: list = []
    if keep_view:
        view = [("ckks_encrypt", n, "ciphertexts", cts) for n, cts in server.view.ciphertexts.items()]
        view.append(("ckks_decrypt", key_holder, "released sum", server.total))
    return CKKSSum(
        total=np.asarray(server.total, dtype=np.float64),
        participants=list(nodes),
        key_holder=key_holder,
        stages=stages,
        uploaded=sorted(server.uploaded),
        dropped_before_upload=server.dropped_before_upload,
        view=view,
    )
