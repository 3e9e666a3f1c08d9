"""Pairwise masking over Flower messages: the state machines of :mod:`mechanisms.secagg.masking.node` and
:mod:`mechanisms.secagg.masking.server`, carried as messages.

This module is plumbing only: a request or reply dict becomes a
``RecordDict`` (a ConfigRecord ``secagg`` for ids, keys, ciphertexts,
lists and signatures; an ArrayRecord ``secagg-arrays`` for the masked
vector) and back.  The protocol, its checks and its threat model are the
state machines' (active-adversary version of Bonawitz et al. 2017: every
key advertisement signed with the node's roster identity, a consistency
round before any share leaves a node, K and t from the node's roster, one
masked upload per aggregation id), on the complete graph or on the SecAgg+
graph the operator drew into the roster (``degree``: each node masks with and
shares among its k neighbours, names them in its key advertisement so the
server can route, and refuses any list outside its group; messages are O(k)
per node).

Message types (one per stage): ``query.keys``, ``query.shares``,
``query.masked``, ``query.consistency``, ``query.unmask``; a run's first sum
sends its keys request inside the setup message (:class:`Opening`), so the
key advertisements cost no round trip of their own.  The masked
stage also carries the run config, the round name and any broadcast the
node needs to compute its input; the node hashes them into the digest it
signs in the consistency round, so a server that sends different
broadcasts to different nodes (FedCOF's round 2) is detected before any
share is revealed.

One upload per aggregation, one uploader set per node: the node's ledger lives
in its run state and records the aggregation ids it uploaded for and the
uploader set of the first sum it signed (a later sum over another set, under
any configuration, is refused: two sums over different sets subtract to one
node's input); with ``secagg-ledger=FILE`` in its node config it is also kept
in that file (:class:`privfed.results.ledger.NodeLedger`, created once by the
operator's ``python -m mechanisms.secagg.identity --init-ledger FILE --roster
ROSTER``), so a server that starts another run to repeat a sum is refused too.
A node deployed with a roster needs the file (:func:`node_identity` refuses
otherwise, unless ``allow-ephemeral-ledger=true``), and refuses a file that is
missing, unreadable, damaged or made for another roster: a fresh ledger would
let a server running one session id again and again replay one run's
consistency signatures in another.

The run config a node receives is read whole (an unknown key is refused,
:meth:`privfed.flower.config.FlowerConfig.from_wire`), its frac-bits must be
the roster's, and every check that reads the node's data takes nothing else
the server may vary: what a server can learn is computed for each run
(:mod:`mechanisms.secagg.threat`) and reported by the server.

Identities: a node reads ``secagg-identity`` and ``secagg-roster`` (file
paths, or inline JSON) from its node config (see
:mod:`mechanisms.secagg.identity` for the operator's command), or gets them
from the app (:class:`SimulatedRoster`, simulations only).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.identity import Identity, Roster
from mechanisms.secagg.masking.node import MaskingNode
from mechanisms.secagg.masking.server import MaskingServer, keys_request
from mechanisms.secagg.threat import sum_threshold, survivor_parts
from privfed.errors import ConfigError, InputError
from privfed.flower.kept import KeptNodes, parsed
from privfed.flower.ledger import (
    LEDGER_KEY,
    canonical_config,
    ledger_path,
    lifetime_id,
    node_ledger,
    pin_num_classes,
)
from privfed.flower.masking_wire import MESSAGE_KEY, from_records, to_records
from privfed.flower.provision import SimulatedRoster, simulated_identities
from privfed.flower.transport import Exchange, exchange

__all__ = [
    "KEYS_REFUSAL",
    "LEDGER_KEY",
    "MESSAGE_KEY",
    "STATE_KEY",
    "MaskedSum",
    "Opening",
    "SimulatedRoster",
    "aggregation_digests",
    "encode_for_ring",
    "from_records",
    "lifetime_id",
    "masked_sum_over_messages",
    "node_identity",
    "node_ledger",
    "node_step",
    "pin_num_classes",
    "refusal",
    "ring_limit",
    "simulated_identities",
    "to_records",
]

#: The node's ConfigRecord in ``context.state`` holding its protocol state between messages.
STATE_KEY = "privfed-secagg"


# ------------------------------------------------------------------------------- identities
def node_identity(
    node_config: dict, node_id: int, provision: SimulatedRoster | None = None
) -> tuple[Identity, Roster]:
    """This node's identity and roster: from the app (simulation) or its node config (ConfigError if none)."""
    if provision is not None:
        got = provision.for_node(node_config, node_id)
        if got is not None:
            return got[0].check(got[1]), got[1]
    if "secagg-identity" not in node_config or "secagg-roster" not in node_config:
        raise ConfigError(
            f"node {node_id} has no secure-aggregation identity: start it with --node-config "
            '\'secagg-identity="FILE" secagg-roster="FILE" secagg-ledger="FILE"\' (absolute paths; the '
            "operator writes the first two with "
            "python -m mechanisms.secagg.identity DIR --nodes K); the roster fixes K and t"
        )
    if (
        ledger_path(node_config) is None  # an empty value is refused there, not taken for none
        and str(node_config.get("allow-ephemeral-ledger", "")).lower() != "true"
    ):
        # see the module docstring: a ledger that outlives the run, or no part in secure aggregation
        raise ProtocolAbort(
            f"node {node_id} refuses to take part in secure aggregation without a ledger file: start it with "
            "--node-config 'secagg-ledger=\"FILE\"' (an absolute path, kept across runs: the aggregations it "
            "took part in), or set "
            "allow-ephemeral-ledger=true for a test deployment",
            node=node_id,
            stage="setup",
            deviation="no-ledger",
        )
    roster = parsed(node_config["secagg-roster"], Roster)
    return parsed(node_config["secagg-identity"], Identity).check(roster), roster


# ------------------------------------------------------------------------------- node side
def aggregation_digests(
    config: dict, round_name: str, broadcast: dict[str, np.ndarray] | None, private: bool
) -> tuple[bytes, bytes]:
    """(aggregation id, context digest) of a masked sum, computed by the node from what it was sent.

    The aggregation id names what is summed: the run config (transport
    settings and the server's nonce left out) and the round; under DP any
    configuration counts as one release of this node's noisy statistics, so
    the id is the round alone.  The context digest adds the broadcast.
    """
    canon = canonical_config(config)
    base = ("dp-release" if private else canon) + "\x00" + round_name
    agg = hashlib.sha256(b"privfed aggregation\x00" + base.encode()).digest()
    h = hashlib.sha256(b"privfed context\x00" + canon.encode() + b"\x00" + round_name.encode())
    for k in sorted(broadcast or {}):
        a = np.ascontiguousarray(broadcast[k], dtype=np.float64)
        h.update(k.encode() + str(a.shape).encode() + a.tobytes())
    return agg, h.digest()


def node_step(
    content: RecordDict,
    context,
    identity: Identity,
    roster: Roster,
    *,
    ring_input: Callable[[], np.ndarray] | None = None,
    context_digest: bytes = b"",
    aggregation: bytes | None = None,
    lifetime: bytes | None = None,
    stage: str | None = None,
) -> RecordDict:
    """Answer one masking request with this node's state machine; its state stays in ``context.state`` (and the
    state machine itself in this process, :class:`privfed.flower.kept.KeptNodes`, while the record there is
    the one it wrote).

    ``stage``: the stage the message came as (its Flower message type); a request whose own stage differs
    aborts the session, since what the node does after answering (settling a charge on the uploaders an
    unmask request names) follows the message type.  A request carries no arrays (a TypeError if it does,
    the node's malformed-request refusal)."""
    if "secagg-arrays" in content:
        raise TypeError("a masking request carries no arrays (the server sent a secagg-arrays record)")
    req = from_records(content)
    ledger = node_ledger(context, roster, lifetime)
    key = (context.run_id, context.node_id, roster.fingerprint, identity.index)
    node = _KEPT.node(
        key,
        context.state[STATE_KEY] if STATE_KEY in context.state else None,
        req.get("stage") == "keys",
        lambda state: MaskingNode(
            identity.index,
            num_nodes=roster.size,
            threshold=roster.threshold,
            identity=identity,
            roster=roster,
            ledger=ledger,
            state=state,
        ),
    )
    node.ledger = ledger
    try:
        if stage is not None and req.get("stage") != stage:
            raise node._abort(
                stage,
                "wrong-stage",
                f"a {str(req.get('stage'))[:20]!r} request came as a {stage!r} message; no more answers in "
                "this session",
            )
        reply = node.handle(req, ring_input=ring_input, context=context_digest, aggregation=aggregation)
    finally:
        record = context.state[STATE_KEY] if STATE_KEY in context.state else None
        context.state[STATE_KEY] = _KEPT.keep(key, node, record, ConfigRecord)
        written = ledger.record()
        if LEDGER_KEY not in context.state or dict(context.state[LEDGER_KEY]) != written:
            context.state[LEDGER_KEY] = ConfigRecord(written)
    return to_records(reply)


#: The masking state machines this process keeps between a node's messages.
_KEPT = KeptNodes()


def ring_limit(frac_bits: int, num_nodes: int) -> float:
    """The largest |x| a node may encode so that K such inputs cannot wrap the ring (public: f and the roster's
    K), with a margin below :func:`encode_for_ring`'s strict rule."""
    return (2.0**63 / int(num_nodes) - 1.0) * 2.0 ** -int(frac_bits) * (1.0 - 2.0**-20)


def encode_for_ring(x: np.ndarray, frac_bits: int, num_nodes: int) -> np.ndarray:
    """Fixed-point encoding of a node's statistic, refused if K such inputs could overflow the ring.

    Every node checks its own |x| 2^f + 1/2 < 2^63 / K with K from its
    roster (not from the server), a public rule, so the sum of K inputs
    cannot wrap around; nothing about x is revealed but the refusal itself
    (its text holds no value measured from x, and the masked stage claims
    the aggregation id before asking for the input, so it cannot be asked
    twice).
    """
    f = fixed_point.check_frac_bits(frac_bits)
    x = np.asarray(x, dtype=np.float64).ravel()
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)  # NaN propagates through both
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InputError("this node's statistic contains NaN/inf; secure aggregation needs finite values")
    max_abs = max(-lo, hi)
    if not max_abs * 2.0**f + 0.5 < 2.0**63 / num_nodes:  # the refusal names the rule, never max_abs
        raise InputError(
            f"this node's statistic could overflow the 2^64 ring with {num_nodes} nodes at "
            f"frac-bits={f}; lower frac-bits or clip the features"
        )
    return fixed_point.encode(x, f)


# ------------------------------------------------------------------------------- server side
@dataclass
class MaskedSum:
    """One masked sum run over messages: the sum and what the server saw."""

    total: np.ndarray
    participants: list[int]
    threshold: int
    stages: dict[str, Exchange]
    degree: int | None
    uploaded: list[int]
    dropped_before_upload: list[int]
    dropped_after_upload: list[int]
    view: list[tuple[str, int, str, object]] = field(default_factory=list)
    #: The parts the uploaders' graph falls into (Flower node ids): the server decodes each part's sum alone.
    parts: list[list[int]] = field(default_factory=list)
    #: Every roster index's neighbours, as the nodes named them (the roster's graph), and roster index -> node.
    graph: list[frozenset[int]] = field(default_factory=list, repr=False)
    roster_index: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def smallest_part(self) -> int:
        return min((len(p) for p in self.parts), default=len(self.uploaded))

    def record(self) -> dict:
        return {
            "protocol": "pairwise masking (Bonawitz et al. 2017), active-adversary version: signed keys "
            "checked against the roster, consistency round, "
            + (
                "complete graph"
                if self.degree is None
                else f"the roster's {self.degree}-regular SecAgg+ graph (Bell et al. 2020)"
            ),
            "participants": len(self.participants),
            "threshold": self.threshold,
            "uploaded": len(self.uploaded),
            "dropped_before_upload": list(self.dropped_before_upload),
            "dropped_after_upload": list(self.dropped_after_upload),
            "parts": [len(p) for p in self.parts],
            "smallest_part": self.smallest_part,
            "stages": {k: v.summary() for k, v in self.stages.items()},
        }


def refusal(content: RecordDict) -> str | None:
    """A node's own refusal carried in its reply (``error`` record), or None."""
    if "error" in content:
        return f"{content['error']['message']}"
    return None


def _raise_refusals(refused: dict[int, tuple[str, str]], stage: str) -> None:
    if not refused:
        return
    n, (kind, text) = sorted(refused.items())[0]
    more = f" ({len(refused) - 1} more node(s) refused too)" if len(refused) > 1 else ""
    msg = f"node {n} refused secure aggregation at stage {stage!r}: {text}{more}; no sum is released"
    if kind == "ProtocolAbort":
        raise ProtocolAbort(msg, node=n, stage=stage)
    raise ConfigError(msg)


#: The record of a setup reply holding the node's refusal of the keys request it carried.
KEYS_REFUSAL = "keys-error"


@dataclass
class Opening:
    """The first stage of a masked sum carried by an earlier exchange (the run's setup, a masked round's
    message): the key advertisement request every node is sent with it, and each node's reply (Flower node
    id -> records).

    A masked sum that opens with one (:func:`masked_sum_over_messages`'s ``opening``) starts at the shares
    stage: a round trip fewer, the same messages."""

    num_nodes: int
    threshold: int
    degree: int | None
    #: The message type that carries the keys request (the run's setup, or a multi-round method's round).
    carrier: str = "query.setup"
    session: bytes = field(default_factory=lambda: os.urandom(16), repr=False)
    replies: dict[int, RecordDict] = field(default_factory=dict, repr=False)
    #: Nodes whose key advertisement was refused: node -> (error kind, its message).
    refused: dict[int, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def make(
        cls, num_nodes: int, threshold: int | None, degree: int | None, carrier: str = "query.setup"
    ) -> Opening:
        """The opening of a sum over a roster of ``num_nodes`` (t: ``threshold`` or the default), its keys
        request carried by a ``carrier`` message."""
        return cls(int(num_nodes), sum_threshold(num_nodes, threshold, degree), degree, carrier)

    def request(self) -> RecordDict:
        """The key advertisement request, as the records to send beside the setup."""
        return to_records(keys_request(self.session, self.num_nodes, self.threshold, self.degree))

    def take(self, node: int, content: RecordDict) -> None:
        """Keep ``node``'s key advertisement (the ``secagg`` records of its setup reply) or its refusal of the
        keys request (:data:`KEYS_REFUSAL`); a reply with neither is a node that sent no keys."""
        if KEYS_REFUSAL in content:
            why = content[KEYS_REFUSAL]
            self.refused[node] = (str(why.get("kind", "")), str(why.get("message", "")))
        elif "secagg" in content:
            self.replies[node] = RecordDict({k: v for k, v in content.items() if k.startswith("secagg")})


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
    num_nodes: int | None = None,
    degree: int | None = None,
    opening: Opening | None = None,
) -> MaskedSum:
    """Run the five stages with ``nodes`` and return the decoded sum over U3.

    ``opening``: the key advertisements already exchanged (with the run's setup, :class:`Opening`), so the
    sum starts at the shares stage; its K, t and degree are the sum's.

    ``num_nodes`` is K, the roster size (default ``len(nodes)``);
    ``masked_payload(node)`` gives the extra records (name -> record) the
    masked stage carries (the run config, the round, a broadcast);
    ``length`` is the public length of every node's statistic vector;
    ``degree`` the roster's SecAgg+ degree (the server routes by the
    neighbours each node names from its roster; None: the complete graph).
    """
    K = len(nodes) if num_nodes is None else int(num_nodes)
    t = sum_threshold(K, threshold, degree)
    if opening is not None and (opening.num_nodes, opening.threshold, opening.degree) != (K, t, degree):
        raise ValueError("the opening's K, t and degree are not the sum's")
    server = MaskingServer(
        num_nodes=K,
        threshold=t,
        length=length,
        session=os.urandom(16) if opening is None else opening.session,
        active=True,
        degree=degree,
        frac_bits=frac_bits,
        name=round_name,
        keep_view=keep_view,
    )
    stages: dict[str, Exchange] = {}
    node_of: dict[int, int] = {}  # u -> Flower node id
    index_of: dict[int, int] = {}  # Flower node id -> u

    while not server.done:
        stage = server.stage
        requests = server.requests()
        refused: dict[int, tuple[str, str]] = {}
        if stage == "keys":
            one = next(iter(requests.values()))
            contents = {} if opening is not None else {n: to_records(one) for n in nodes}
        else:
            contents = {}
            for u, msg in requests.items():
                rec = to_records(msg)
                if stage == "masked":
                    for k, v in masked_payload(node_of[u]).items():
                        rec[k] = v
                contents[node_of[u]] = rec

        def on_reply(node, content, stage=stage, refused=refused):
            why = refusal(content)
            if why is not None:
                refused[node] = (str(content["error"].get("kind", "")), why)
                return
            reply = from_records(content)
            if stage == "keys":
                u = int(reply["u"])
                if u in node_of or not 0 <= u < K:
                    raise ProtocolAbort(
                        f"node {node} claims roster index {u}, taken or outside 0..{K - 1}", stage=stage
                    )
                node_of[u], index_of[node] = node, u
            else:
                u = index_of[node]
            server.receive(u, reply)

        if stage == "keys" and opening is not None:  # carried by an earlier message: its replies
            _raise_refusals(opening.refused, stage)
            ex = stages[stage] = Exchange(stage=opening.carrier)
            for node in nodes:
                if node in opening.replies:
                    on_reply(node, opening.replies[node])
                    ex.answered.append(node)
                else:
                    ex.silent.append(node)
        else:
            ex = stages[stage] = exchange(
                grid, contents, f"query.{stage}", timeout, on_reply, group_id=round_name
            )
        _raise_refusals(refused, stage)
        why = "; ".join(f"node {n}: {r}" for n, r in list(ex.failed.items())[:3])
        server.close(f" ({len(ex.silent)} silent, {len(ex.failed)} failed{': ' + why if why else ''})")

    view: list = []
    if keep_view:
        v = server.view
        view += [("keys", node_of[u], "public_keys", pk) for u, pk in v.public_keys.items()]
        view += [("shares", node_of[u], f"share_for_{w}", ct) for (u, w), ct in v.encrypted_shares.items()]
        view += [("masked", node_of[u], "y", y.copy()) for u, y in v.masked_uploads.items()]
        view += [("consistency", node_of[u], "sig", s) for u, s in v.consistency_signatures.items()]
        for kind, shares in (("b", v.self_seed_shares), ("s", v.key_shares)):
            view += [
                ("unmask", node_of[x - 1], f"{kind}_share_of_{w}", s)
                for w, per in shares.items()
                for x, s in per.items()
            ]
    answered = set(server.view.answered)
    U3 = list(server.U3)
    parts = [[node_of[u] for u in p] for p in survivor_parts(server.graph, U3)]
    return MaskedSum(
        total=fixed_point.decode(server.total, frac_bits),
        participants=list(nodes),
        threshold=t,
        stages=stages,
        degree=degree,
        uploaded=[node_of[u] for u in U3],
        dropped_before_upload=sorted(n for n in nodes if n not in {node_of[u] for u in U3}),
        dropped_after_upload=[node_of[u] for u in U3 if u not in answered],
        view=view,
        parts=parts,
        graph=list(server.graph),
        roster_index={u: n for u, n in node_of.items()},
    )
