"""The server's side of CKKS secure summation, as a state machine: it relays and collects, it cannot read.

:class:`CKKSServer` walks three stages: ``ckks_keys`` (ask the key holder
for a signed public context), ``ckks_encrypt`` (send it to every node and
collect their signed ciphertexts) and ``ckks_decrypt`` (forward every signed
contribution to the key holder, which adds them itself and releases the
rounded sum).  ``requests()`` gives the message for every node asked at this
stage, ``receive(node, reply)`` takes one reply and ``close()`` ends the
stage (nodes that did not answer the encryption stage are left out of the
sum; a silent key holder, or fewer than two uploads, release nothing).  The
request and reply formats are those of :mod:`mechanisms.secagg.ckks.node` and
:mod:`mechanisms.secagg.ckks.holder`.

:func:`run_in_process` is the in-process transport (a loop over
:class:`~mechanisms.secagg.ckks.node.CKKSNode` objects and one
:class:`~mechanisms.secagg.ckks.holder.CKKSKeyHolder`); :mod:`privfed.flower.ckks`
carries the same messages over Flower.  The server keeps a
:class:`CKKSServerView` of everything it received.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from mechanisms.secagg.ckks.holder import CKKSKeyHolder
from mechanisms.secagg.ckks.node import CKKSNode, check_num_nodes
from mechanisms.secagg.ckks.scheme import CKKSParams
from mechanisms.secagg.crypto import ProtocolAbort
from privfed.errors import InputError

__all__ = ["STAGES", "CKKSServer", "CKKSServerView", "run_in_process"]

STAGES = ("ckks_keys", "ckks_encrypt", "ckks_decrypt")


@dataclass
class CKKSServerView:
    """What the server received and output: the public context, every node's ciphertexts, the released sum."""

    public_context: bytes = b""
    ciphertexts: dict[int, list[bytes]] = field(default_factory=dict)
    signatures: dict[int, bytes] = field(default_factory=dict)
    result: np.ndarray | None = None

    def arrays(self) -> Iterator[np.ndarray]:
        """Every numeric array in the view (only the released sum)."""
        if self.result is not None:
            yield self.result


class CKKSServer:
    """One CKKS sum seen from the server (see the module docstring).

    Parameters
    ----------
    nodes : list of int
        The nodes asked to encrypt (transport ids: roster indices in process, Flower node ids over Flower).
    key_holder : int
        The node asked for keys and for the decryption.
    length : int
        Values per node.
    params : CKKSParams
    session : bytes
        This sum's session id (fresh, from OS entropy).
    num_nodes : int, optional
        K sent to the nodes (default ``len(nodes)``); each checks it against its roster.
    integral : bool
        Ask the key holder to round the sum to whole numbers (integer statistics).
    """

    def __init__(
        self,
        nodes: list[int],
        *,
        key_holder: int,
        length: int,
        params: CKKSParams,
        session: bytes,
        num_nodes: int | None = None,
        integral: bool = False,
    ) -> None:
        self.nodes, self.key_holder = list(nodes), key_holder
        self.length, self.params, self.session = int(length), params, bytes(session)
        self.K = len(self.nodes) if num_nodes is None else int(num_nodes)
        self.integral = bool(integral)
        if not self.integral:
            check_num_nodes(params, self.K)
        self.stage = STAGES[0]
        self.view = CKKSServerView()
        self.holder_reply: dict = {}
        self.contributions: list[tuple[int, list[bytes], bytes, bytes]] = []
        self.uploaded: list[int] = []
        self.bytes_up: dict[str, dict[int, int]] = {s: {} for s in STAGES}
        self.total: np.ndarray | None = None

    @property
    def done(self) -> bool:
        return self.stage == "done"

    @property
    def dropped_before_upload(self) -> list[int]:
        return sorted(set(self.nodes) - set(self.uploaded))

    def requests(self) -> dict[int, dict]:
        """The request for every node asked at this stage."""
        if self.stage == "ckks_keys":
            return {self.key_holder: {"stage": "ckks_keys", "K": self.K, "session": self.session}}
        if self.stage == "ckks_encrypt":
            h = self.holder_reply
            msg = {
                "stage": "ckks_encrypt",
                "public": h["public"],
                "K": self.K,
                "holder": h["holder"],
                "sig": h["sig"],
                "session": self.session,
            }
            return {n: dict(msg) for n in self.nodes}
        if self.stage == "ckks_decrypt":
            msg = {
                "stage": "ckks_decrypt",
                "from": [u for u, _, _, _ in self.contributions],
                "ct": [c for _, cts, _, _ in self.contributions for c in cts],
                "sigs": [s for _, _, s, _ in self.contributions],
                "pins": [p for _, _, _, p in self.contributions],
                "size": self.length,
                "session": self.session,
            }
            if self.integral:
                msg["integral"] = True
            return {self.key_holder: msg}
        return {}

    def receive(self, node: int, reply: dict) -> None:
        """Take ``node``'s reply to this stage's request."""
        if self.stage == "ckks_keys":
            self.holder_reply = {
                "public": bytes(reply["public"]),
                "holder": int(reply["u"]),
                "sig": bytes(reply["sig"]),
            }
            self.view.public_context = self.holder_reply["public"]
            self.bytes_up["ckks_keys"][node] = len(self.holder_reply["public"]) + len(
                self.holder_reply["sig"]
            )
        elif self.stage == "ckks_encrypt":
            cts = [bytes(c) for c in reply["ct"]]
            n_ct = self.params.num_ciphertexts(self.length)
            if len(cts) != n_ct:
                raise InputError(
                    f"node {node} sent {len(cts)} ciphertexts, expected {n_ct}: the nodes disagree on d or C"
                )
            sig, pin = bytes(reply["sig"]), bytes(reply.get("pin", b""))
            self.contributions.append((int(reply["u"]), cts, sig, pin))
            self.uploaded.append(node)
            self.view.ciphertexts[node] = cts
            self.view.signatures[node] = sig
            self.bytes_up["ckks_encrypt"][node] = sum(len(c) for c in cts)
        elif self.stage == "ckks_decrypt":
            self.total = np.asarray(reply["total"], dtype=np.float64)
            self.view.result = self.total
        else:
            raise ProtocolAbort("the CKKS sum is over; no more replies are taken")

    def close(self, detail: str = "") -> None:
        """End this stage; a silent key holder or fewer than two uploads release nothing (ProtocolAbort)."""
        if self.stage == "ckks_keys":
            if not self.holder_reply:
                raise ProtocolAbort(
                    f"the CKKS key holder (node {self.key_holder}) did not answer; no sum is released"
                )
            self.stage = "ckks_encrypt"
        elif self.stage == "ckks_encrypt":
            if len(self.uploaded) < 2:
                raise ProtocolAbort(
                    f"CKKS: {len(self.uploaded)} node(s) uploaded ({detail}); a sum of fewer than 2 inputs is "
                    "an input, so none is released"
                )
            self.uploaded.sort()
            self.stage = "ckks_decrypt"
        elif self.stage == "ckks_decrypt":
            if self.total is None:
                raise ProtocolAbort(
                    f"the CKKS key holder (node {self.key_holder}) did not decrypt; no sum is released"
                )
            self.stage = "done"


def run_in_process(
    server: CKKSServer,
    nodes: dict[int, CKKSNode],
    holder: CKKSKeyHolder,
    *,
    inputs: Callable[[int], np.ndarray],
    silent: Callable[[str, int], bool] = lambda stage, u: False,
    digests: Callable[[int], bytes] = lambda u: b"",
    aggregation: bytes | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Run ``server`` with ``nodes`` (u -> CKKSNode) and the key holder ``holder`` in this process.

    ``inputs(u)`` is node u's statistic (asked once its checks passed), ``silent(stage, u)`` says that node
    u does not answer that stage, ``digests(u)`` is the digest of what node u was asked to sum.  Returns the
    released sum.
    """
    while not server.done:
        stage = server.stage
        for u, msg in server.requests().items():
            if silent(stage, u):
                continue
            if stage == "ckks_keys":
                reply = holder.keys(msg)
            elif stage == "ckks_encrypt":
                reply = nodes[u].encrypt(
                    msg, lambda u=u: inputs(u), digest=digests(u), aggregation=aggregation
                )
                if u == server.key_holder:
                    holder.note_digest(digests(u))
            else:
                reply = holder.decrypt(msg)
            server.receive(u, reply)
        server.close()
        if on_stage is not None:
            on_stage(stage)
    return server.total
