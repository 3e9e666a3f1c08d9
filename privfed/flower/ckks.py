"""CKKS secure summation over Flower messages, with the key holder a separate node.

The protocol of :mod:`mechanisms.ckks` between real parties:

``query.ckks_keys``     the key holder (a node, never the server) makes fresh
                        CKKS keys for this sum, keeps the secret key in its own
                        ``context.state`` and replies the public context;
``query.ckks_encrypt``  every node encrypts its statistic under the public
                        context and replies the ciphertexts; the server (the
                        aggregator, public context only) adds each reply into
                        a running ciphertext sum as it arrives and drops it;
``query.ckks_decrypt``  the key holder decrypts the aggregate once, rounds it
                        to the release grid (whole numbers for integer
                        statistics, else 2^-precision_bits), deletes its
                        secret key and replies the sum.

Nodes that do not answer the encryption stage are left out of the sum (the
report says so); if the key holder does not answer, no sum is released.
Threat model: :data:`mechanisms.secagg.THREAT_MODEL_CKKS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from mechanisms.ckks import CKKSAggregator, CKKSParams, _tenseal
from mechanisms.masking import ProtocolAbort
from privfed.errors import InputError
from privfed.flower.transport import Exchange, exchange
from privfed.flower.wire import arrays_record

__all__ = ["CKKSSum", "ckks_sum_over_messages", "holder_decrypt", "holder_keys", "node_encrypt"]

#: The key holder's secret context in its ``context.state``.
SECRET_KEY = "privfed-ckks-secret"


# ------------------------------------------------------------------------------- node side
def holder_keys(params: CKKSParams) -> tuple[bytes, bytes]:
    """Fresh keys: (secret context to keep, public context to send)."""
    ts = _tenseal()
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=params.poly_modulus_degree,
                     coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes))
    ctx.global_scale = 2.0**params.scale_bits
    public = ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                           save_relin_keys=False)
    return ctx.serialize(save_secret_key=True), public


def node_encrypt(public: bytes, x: np.ndarray, params: CKKSParams, num_nodes: int) -> list[bytes]:
    """Encrypt a node's statistic, refused if K such inputs could exceed the CKKS bound."""
    ts = _tenseal()
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise InputError("this node's statistic contains NaN/inf; secure aggregation needs finite values")
    max_abs = float(np.abs(x).max()) if x.size else 0.0
    if not num_nodes * max_abs < 2.0**params.bound_bits:
        raise InputError(
            f"this node's statistic (max |x| = {max_abs:.4g}) could exceed the CKKS bound "
            f"2^{params.bound_bits} summed over {num_nodes} nodes; clip the features"
        )
    ctx = ts.context_from(public)
    if ctx.is_private():
        raise ProtocolAbort("a node was sent a context holding the secret key; aborting")
    s = params.slots
    return [ts.ckks_vector(ctx, x[i : i + s].tolist()).serialize() for i in range(0, x.size, s)]


def holder_decrypt(secret: bytes, aggregate: list[bytes], size: int, params: CKKSParams,
                   integral: bool) -> np.ndarray:
    """Decrypt the aggregate once and round it to the release grid (as ``CKKSKeyHolder.decrypt_sum``)."""
    ts = _tenseal()
    ctx = ts.context_from(secret)
    parts = [np.asarray(ts.ckks_vector_from(ctx, ct).decrypt(), dtype=np.float64) for ct in aggregate]
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
            "protocol": "CKKS (TenSEAL), key holder a separate node",
            "key_holder": self.key_holder,
            "participants": len(self.participants),
            "uploaded": len(self.uploaded),
            "dropped_before_upload": list(self.dropped_before_upload),
            "stages": {k: {"answered": len(v.answered), "failed": v.failed, "silent": v.silent,
                           "seconds": round(v.seconds, 3), "bytes_up": int(sum(v.bytes_up.values()))}
                       for k, v in self.stages.items()},
        }


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
) -> CKKSSum:
    """Run the three stages (see the module docstring) and return the released sum."""
    stages: dict[str, Exchange] = {}
    view: list = []
    holder_reply: dict = {}
    prm = ConfigRecord({"round": round_name, "K": len(nodes)})

    ex = stages["ckks_keys"] = exchange(
        grid, {key_holder: RecordDict({"ckks": prm})}, "query.ckks_keys", timeout,
        lambda node, content: holder_reply.update(public=bytes(content["ckks"]["public"])), group_id=round_name)
    if "public" not in holder_reply:
        raise ProtocolAbort(f"the CKKS key holder (node {key_holder}) did not answer; no sum is released")
    public = holder_reply["public"]
    aggregator = CKKSAggregator(public)  # refuses a context that holds the secret key
    ts = _tenseal()
    acc: list = []
    uploaded: list[int] = []
    n_ct = params.num_ciphertexts(length)

    def on_ct(node, content):
        cts = [bytes(c) for c in content["ckks"]["ct"]]
        if len(cts) != n_ct:
            raise InputError(f"node {node} sent {len(cts)} ciphertexts, expected {n_ct}: the nodes disagree on d or C")
        if keep_view:
            view.append(("ckks_encrypt", node, "ciphertexts", cts))
        vecs = [ts.ckks_vector_from(aggregator.context, c) for c in cts]
        if not acc:
            acc.extend(vecs)
        else:
            for j, v in enumerate(vecs):
                acc[j] += v
        uploaded.append(node)

    contents = {n: RecordDict({"ckks": ConfigRecord({"public": public, "K": len(nodes)}), **payload(n)})
                for n in nodes}
    ex = stages["ckks_encrypt"] = exchange(grid, contents, "query.ckks_encrypt", timeout, on_ct,
                                           group_id=round_name)
    if len(uploaded) < 2:
        raise ProtocolAbort(f"CKKS: {len(uploaded)} node(s) uploaded ({ex.failed or ex.silent}); a sum of fewer "
                            "than 2 inputs is an input, so none is released")
    aggregate = [v.serialize() for v in acc]
    out: dict = {}

    def on_sum(node, content):
        out["total"] = content["sum"]["total"].numpy()

    stages["ckks_decrypt"] = exchange(
        grid, {key_holder: RecordDict({"ckks": ConfigRecord({"aggregate": aggregate, "size": int(length)})})},
        "query.ckks_decrypt", timeout, on_sum, group_id=round_name)
    if "total" not in out:
        raise ProtocolAbort(f"the CKKS key holder (node {key_holder}) did not decrypt; no sum is released")
    if keep_view:
        view.append(("ckks_decrypt", key_holder, "released sum", out["total"]))
    return CKKSSum(total=np.asarray(out["total"], dtype=np.float64), participants=list(nodes),
                   key_holder=key_holder, stages=stages, uploaded=sorted(uploaded),
                   dropped_before_upload=sorted(set(nodes) - set(uploaded)), view=view)


def sum_reply(total: np.ndarray) -> RecordDict:
    return RecordDict({"sum": arrays_record({"total": np.asarray(total, dtype=np.float64)})})
