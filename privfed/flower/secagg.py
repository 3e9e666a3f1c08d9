"""Pairwise masking (Bonawitz et al., CCS 2017) as four Flower message stages.

The protocol of :mod:`mechanisms.masking`, with its key agreement, PRG,
Shamir sharing and share channel, run between real nodes: each stage is one
message to every surviving node and one reply, each node keeps its secrets
in its own ``context.state`` between stages, and a node that does not answer
a stage (it crashed, was killed, timed out, or its ClientApp failed) is a
dropout handled as in the paper.

``query.keys``    (AdvertiseKeys) the server sends the session id, the node's
                  index u, K and the threshold t; the node draws two X25519
                  key pairs and a self-mask seed b_u (OS entropy) and replies
                  its two public keys.  U1 = the nodes that answered.
``query.shares``  (ShareKeys) the server sends U1's public keys; the node
                  Shamir-shares s_u^SK and b_u among U1 and replies the shares
                  encrypted for each holder (AES-256-GCM), which the server
                  relays without reading.  U2 = the nodes that answered.
``query.masked``  (MaskedInputCollection) the server sends each node its inbox
                  of ciphertexts and U2; the node computes its statistic,
                  encodes it in fixed point and replies
                  y_u = x_u + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv)
                  (mod 2^64).  The server adds y_u to its running sum and
                  drops it.  U3 = the nodes that answered.
``query.unmask``  (Unmasking) the server sends U3; each node answers, for
                  every other node of U2, the share of b_u if u is in U3 and
                  the share of s_u^SK otherwise (never both), and refuses
                  below t.  The server rebuilds the seeds from t shares each,
                  removes the masks and decodes the sum over U3.

If fewer than t nodes answer a stage, or a seed has fewer than t shares, the
run stops with :class:`mechanisms.masking.ProtocolAbort`: it never releases
a wrong sum.  Threat model: :data:`mechanisms.secagg.THREAT_MODEL_MASK`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from flwr.app import ConfigRecord, RecordDict

from mechanisms import fixed_point, shamir
from mechanisms.masking import (
    _INFO_CHANNEL,
    _INFO_PAIR,
    _INFO_SELF,
    GCM_NONCE_BYTES,
    ID_BYTES,
    KeySource,
    ProtocolAbort,
    _add_masks,
    _hkdf,
    _private_key,
    _pub_bytes,
    default_threshold,
)
from privfed.errors import InputError
from privfed.flower.transport import Exchange, exchange
from privfed.flower.wire import arrays_record

__all__ = ["MaskedSum", "NodeMasking", "STATE_KEY", "masked_sum_over_messages"]

#: Name of the node's ConfigRecord in ``context.state`` holding its protocol secrets.
STATE_KEY = "privfed-secagg"


# ------------------------------------------------------------------------------- node side
class NodeMasking:
    """One node's side of one masked sum; all state lives in a ConfigRecord (``context.state``)."""

    def __init__(self, state: ConfigRecord) -> None:
        self.st = state

    # Stage 1
    @classmethod
    def advertise(cls, session: bytes, u: int, K: int, t: int) -> tuple["NodeMasking", dict]:
        keys = KeySource(None)  # the operating system's CSPRNG
        c_sk, s_sk, b = keys.field_element(), keys.field_element(), keys.field_element()
        st = ConfigRecord({
            "session": session, "u": int(u), "K": int(K), "t": int(t),
            "c_sk": c_sk.to_bytes(32, "little"), "s_sk": s_sk.to_bytes(32, "little"),
            "b": b.to_bytes(32, "little"),
        })
        node = cls(st)
        c_pk = _pub_bytes(_private_key(c_sk).public_key())
        s_pk = _pub_bytes(_private_key(s_sk).public_key())
        return node, {"c_pk": c_pk, "s_pk": s_pk}

    def _int(self, key: str) -> int:
        return int.from_bytes(self.st[key], "little")

    def _channel(self, v: int) -> AESGCM:
        peers = list(self.st["peers"])
        c_pk = X25519PublicKey.from_public_bytes(self.st["peer_c_pk"][peers.index(v)])
        secret = _private_key(self._int("c_sk")).exchange(c_pk)
        return AESGCM(_hkdf(secret, _INFO_CHANNEL + self.st["session"]))

    # Stage 2
    def share_keys(self, peers: list[int], c_pks: list[bytes], s_pks: list[bytes]) -> dict[int, bytes]:
        u, t = int(self.st["u"]), int(self.st["t"])
        if u in peers:
            raise ProtocolAbort(f"node {u} was sent its own key as a peer's; aborting")
        if len(peers) + 1 < t:
            raise ProtocolAbort(
                f"node {u} refuses to share: {len(peers) + 1} nodes left, below the threshold t={t}"
            )
        self.st["peers"] = [int(v) for v in peers]
        self.st["peer_c_pk"] = list(c_pks)
        self.st["peer_s_pk"] = list(s_pks)
        holders = sorted([*peers, u])
        keys = KeySource(None)
        s_shares, b_shares = shamir.split_many(
            [self._int("s_sk"), self._int("b")], [v + 1 for v in holders], t, keys
        )
        out = {}
        for v in holders:
            msg = (
                u.to_bytes(ID_BYTES, "little") + v.to_bytes(ID_BYTES, "little")
                + s_shares[v + 1].to_bytes(32, "little") + b_shares[v + 1].to_bytes(32, "little")
            )
            if v == u:
                self.st["own_share"] = msg
                continue
            nonce = keys(GCM_NONCE_BYTES)
            out[v] = nonce + self._channel(v).encrypt(nonce, msg, self.st["session"])
        return out

    # Stage 3
    def masked_input(self, inbox: dict[int, bytes], alive: list[int], x_ring: np.ndarray) -> np.ndarray:
        u = int(self.st["u"])
        self.st["inbox_from"] = [int(v) for v in inbox]
        self.st["inbox_ct"] = list(inbox.values())
        self.st["alive"] = [int(v) for v in alive]
        session = self.st["session"]
        mask_keys = [_hkdf(self.st["b"], _INFO_SELF + session)]
        signs = [True]
        peers = list(self.st["peers"])
        s_sk = _private_key(self._int("s_sk"))
        for v in sorted(set(peers) & set(alive)):
            s_pk = X25519PublicKey.from_public_bytes(self.st["peer_s_pk"][peers.index(v)])
            mask_keys.append(_hkdf(s_sk.exchange(s_pk), _INFO_PAIR + session))
            signs.append(v > u)
        y = np.array(x_ring, dtype=np.uint64, order="C")
        _add_masks(y, mask_keys, signs)
        return y

    # Stage 4
    def unmask(self, uploaded: list[int]) -> dict[int, tuple[str, int]]:
        u, t = int(self.st["u"]), int(self.st["t"])
        uploaded_set = set(uploaded)
        alive = set(self.st["alive"])
        group = set(self.st["peers"]) | {u}
        if len(uploaded_set & group) < t:
            raise ProtocolAbort(
                f"node {u} refuses to unmask: only {len(uploaded_set & group)} nodes uploaded, below the "
                f"threshold t={t}; the sum is not released"
            )
        inbox = dict(zip(self.st["inbox_from"], self.st["inbox_ct"]))
        answers = {}
        for w in sorted(group & alive):
            if w == u:
                msg = self.st["own_share"]
            else:
                ct = inbox[w]
                msg = self._channel(w).decrypt(ct[:GCM_NONCE_BYTES], ct[GCM_NONCE_BYTES:], self.st["session"])
            sender, receiver = int.from_bytes(msg[:4], "little"), int.from_bytes(msg[4:8], "little")
            if sender != w or receiver != u:
                raise ProtocolAbort(f"node {u} got a share message with wrong ids; aborting")
            s_share = int.from_bytes(msg[8:40], "little")
            b_share = int.from_bytes(msg[40:72], "little")
            answers[w] = ("b", b_share) if w in uploaded_set else ("s", s_share)
        return answers


def encode_for_ring(x: np.ndarray, frac_bits: int, num_nodes: int) -> np.ndarray:
    """Fixed-point encoding of a node's statistic, refused if K such inputs could overflow the ring.

    Every node checks its own |x| 2^f + 1/2 < 2^63 / K, a public rule, so the
    sum of K inputs cannot wrap around; nothing about x is revealed but the
    refusal itself.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise InputError("this node's statistic contains NaN/inf; secure aggregation needs finite values")
    max_abs = float(np.abs(x).max()) if x.size else 0.0
    if not max_abs * 2.0**frac_bits + 0.5 < 2.0**63 / num_nodes:
        raise InputError(
            f"this node's statistic (max |x| = {max_abs:.4g}) could overflow the 2^64 ring with "
            f"{num_nodes} nodes at frac-bits={frac_bits}; lower frac-bits or clip the features"
        )
    return fixed_point.encode(x, frac_bits)


# ------------------------------------------------------------------------------- server side
@dataclass
class MaskedSum:
    """One masked sum run over messages: the sum and what the server saw."""

    total: np.ndarray
    participants: list[int]
    threshold: int
    stages: dict[str, Exchange]
    uploaded: list[int]
    dropped_before_upload: list[int]
    dropped_after_upload: list[int]
    view: list[tuple[str, int, str, object]] = field(default_factory=list)

    def record(self) -> dict:
        return {
            "protocol": "pairwise masking (Bonawitz et al. 2017), complete graph",
            "participants": len(self.participants),
            "threshold": self.threshold,
            "uploaded": len(self.uploaded),
            "dropped_before_upload": list(self.dropped_before_upload),
            "dropped_after_upload": list(self.dropped_after_upload),
            "stages": {
                k: {"answered": len(v.answered), "failed": v.failed, "silent": v.silent,
                    "seconds": round(v.seconds, 3), "bytes_up": int(sum(v.bytes_up.values())),
                    "bytes_down": int(sum(v.bytes_down.values()))}
                for k, v in self.stages.items()
            },
        }


def _need(stage: str, have: list[int], t: int, ex: Exchange) -> None:
    if len(have) < t:
        why = "; ".join(f"node {n}: {r}" for n, r in list(ex.failed.items())[:3])
        raise ProtocolAbort(
            f"secure aggregation aborted at stage {stage!r}: {len(have)} node(s) answered, below the "
            f"threshold t={t} ({len(ex.silent)} silent, {len(ex.failed)} failed{': ' + why if why else ''}); "
            "no sum is released"
        )


def masked_sum_over_messages(
    grid,
    nodes: list[int],
    *,
    length: int,
    frac_bits: int,
    threshold: int | None,
    timeout: float,
    masked_payload: Callable[[int], dict],
    round_name: str,
    keep_view: bool = False,
) -> MaskedSum:
    """Run the four stages with ``nodes`` and return the decoded sum (see the module docstring).

    ``masked_payload(node)`` gives the extra records (name -> record) the
    masked stage carries (which statistic, the broadcast of an earlier round);
    ``length`` is the public length of every node's statistic vector.
    """
    K = len(nodes)
    t = default_threshold(K) if threshold is None else int(threshold)
    if not 1 <= t <= K:
        raise ProtocolAbort(f"threshold t={t} must lie in 1..{K} (the number of nodes)")
    index = {n: i for i, n in enumerate(nodes)}
    session = os.urandom(16)
    stages: dict[str, Exchange] = {}
    view: list = []

    def seen(stage, node, name, value):
        if keep_view:
            view.append((stage, node, name, value))

    # Stage 1: advertise keys.
    pub: dict[int, tuple[bytes, bytes]] = {}

    def on_keys(node, content):
        rec = content["keys"]
        pub[index[node]] = (bytes(rec["c_pk"]), bytes(rec["s_pk"]))
        seen("keys", node, "public_keys", pub[index[node]])

    contents = {n: RecordDict({"secagg": ConfigRecord({"session": session, "u": index[n], "K": K, "t": t,
                                                         "round": round_name})}) for n in nodes}
    ex = stages["keys"] = exchange(grid, contents, "query.keys", timeout, on_keys, group_id=round_name)
    U1 = sorted(pub)
    _need("keys", U1, t, ex)

    # Stage 2: share keys (the server relays ciphertexts it cannot read).
    inbox: dict[int, dict[int, bytes]] = {u: {} for u in U1}
    shared: list[int] = []

    def on_shares(node, content):
        u = index[node]
        rec = content["shares"]
        for v, ct in zip(rec["to"], rec["ct"]):
            if int(v) in inbox:
                inbox[int(v)][u] = bytes(ct)
                seen("shares", node, f"share_for_{int(v)}", bytes(ct))
        shared.append(u)

    contents = {}
    for u in U1:
        peers = [v for v in U1 if v != u]
        contents[nodes[u]] = RecordDict({"secagg": ConfigRecord({
            "peers": peers, "c_pk": [pub[v][0] for v in peers], "s_pk": [pub[v][1] for v in peers],
        })})
    ex = stages["shares"] = exchange(grid, contents, "query.shares", timeout, on_shares, group_id=round_name)
    U2 = sorted(shared)
    _need("shares", U2, t, ex)

    # Stage 3: masked inputs, folded into the running sum as they arrive.
    total = np.zeros(length, dtype=np.uint64)
    uploaded: list[int] = []

    def on_masked(node, content):
        y = content["masked"]["y"].numpy()
        if y.dtype != np.uint64 or y.shape != (length,):
            raise InputError(
                f"node {node} uploaded a masked statistic of shape {y.shape} ({y.dtype}), expected "
                f"({length},) uint64: the nodes disagree on d or C"
            )
        seen("masked", node, "y", y.copy())
        np.add(total, y, out=total)
        uploaded.append(index[node])

    contents = {}
    for u in U2:
        box = {v: ct for v, ct in inbox[u].items() if v in U2}
        extra = masked_payload(nodes[u])
        contents[nodes[u]] = RecordDict({"secagg": ConfigRecord({
            "from": list(box), "ct": list(box.values()), "alive": U2}), **extra})
    ex = stages["masked"] = exchange(grid, contents, "query.masked", timeout, on_masked, group_id=round_name)
    U3 = sorted(uploaded)
    _need("masked", U3, t, ex)

    # Stage 4: unmasking.
    b_shares: dict[int, dict[int, int]] = {u: {} for u in U3}
    s_shares: dict[int, dict[int, int]] = {u: {} for u in set(U2) - set(U3)}
    answered: list[int] = []

    def on_unmask(node, content):
        v = index[node]
        rec = content["unmask"]
        for w, kind, share in zip(rec["about"], rec["kind"], rec["share"]):
            w, s = int(w), int.from_bytes(share, "little")
            if kind == "b" and w in b_shares:
                b_shares[w][v + 1] = s
            elif kind == "s" and w in s_shares:
                s_shares[w][v + 1] = s
            seen("unmask", node, f"{kind}_share_of_{w}", s)
        answered.append(v)

    contents = {nodes[u]: RecordDict({"secagg": ConfigRecord({"uploaded": U3})}) for u in U3}
    ex = stages["unmask"] = exchange(grid, contents, "query.unmask", timeout, on_unmask, group_id=round_name)
    _need("unmask", sorted(answered), t, ex)

    def recover(shares: dict[int, int], u: int, what: str) -> int:
        if len(shares) < t:
            raise ProtocolAbort(
                f"the {what} of node {nodes[u]} cannot be rebuilt: {len(shares)} shares arrived, below the "
                f"threshold t={t}; no sum is released"
            )
        return shamir.combine(dict(list(shares.items())[:t]), t)

    mask_keys, signs = [], []
    for u in U3:
        b = recover(b_shares[u], u, "self-mask seed")
        mask_keys.append(_hkdf(b.to_bytes(32, "little"), _INFO_SELF + session))
        signs.append(False)
    for u in sorted(set(U2) - set(U3)):
        s_sk = _private_key(recover(s_shares[u], u, "mask key"))
        for v in U3:
            peer = X25519PublicKey.from_public_bytes(pub[v][1])
            mask_keys.append(_hkdf(s_sk.exchange(peer), _INFO_PAIR + session))
            signs.append(u < v)
    _add_masks(total, mask_keys, signs)
    result = fixed_point.decode(total, frac_bits)
    answered_set = set(answered)
    return MaskedSum(
        total=result,
        participants=list(nodes),
        threshold=t,
        stages=stages,
        uploaded=[nodes[u] for u in U3],
        dropped_before_upload=[nodes[u] for u in sorted(set(range(K)) - set(U3))],
        dropped_after_upload=[nodes[u] for u in U3 if u not in answered_set],
        view=view,
    )


def masked_reply(y: np.ndarray) -> RecordDict:
    return RecordDict({"masked": arrays_record({"y": y})})
