"""The server's side of pairwise masking (Bonawitz et al., CCS 2017), as a state machine.

:class:`MaskingServer` walks the stages of :mod:`mechanisms.secagg.masking.node`:
``requests()`` gives the message for every node still in the run,
``receive(u, reply)`` takes one node's reply, ``close()`` ends the stage
(nodes that did not reply are dropouts; fewer than t survivors abort), and
after ``unmask`` :attr:`MaskingServer.total` is the ring sum over U3 with
every mask removed.  :func:`run_in_process` is the in-process transport (a
loop over :class:`~mechanisms.secagg.masking.node.MaskingNode` objects);
:mod:`privfed.flower.secagg` carries the same messages over Flower.

The server keeps a :class:`ServerView` of everything it received, which the
tests (and the adversarial suite) inspect.

On a SecAgg+ graph the server routes every list by the graph: each node
hears only about its group (itself and its neighbours), so its messages
are O(k).  In the active version the graph is the roster's: the server is
given it (in process) or takes it from the nodes' key advertisements, each
of which names the node's neighbours from its roster (``degree``, checked
symmetric); the nodes check every list against their own roster anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from mechanisms.secagg import shamir
from mechanisms.secagg.crypto import (
    ID_BYTES,
    INFO_PAIR,
    INFO_SELF,
    PUBLIC_KEY_BYTES,
    UNMASK_ANSWER_BYTES,
    ProtocolAbort,
    add_masks,
    hkdf,
    private_key,
    public_key,
)
from mechanisms.secagg.identity import SIGNATURE_BYTES
from mechanisms.secagg.masking.messages import pack_view

__all__ = ["MaskingServer", "ServerView", "keys_request", "reply_bytes", "request_bytes", "run_in_process"]


@dataclass
class ServerView:
    """Everything the server received during one run, and the sum it output.

    No field holds an individual client's statistic: uploads are masked ring
    elements, shares arrive encrypted, and the unmasking answers are shares
    of seeds (self-mask seeds of uploaders, mask keys of dropped clients).
    """

    num_clients: int
    frac_bits: int
    public_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    encrypted_shares: dict[tuple[int, int], bytes] = field(default_factory=dict)
    masked_uploads: dict[int, np.ndarray] = field(default_factory=dict)
    uploaded: tuple[int, ...] = ()
    answered: tuple[int, ...] = ()
    self_seed_shares: dict[int, dict[int, int]] = field(default_factory=dict)
    key_shares: dict[int, dict[int, int]] = field(default_factory=dict)
    consistency_signatures: dict[int, bytes] = field(default_factory=dict)
    result: np.ndarray | None = None

    def arrays(self) -> Iterator[np.ndarray]:
        """Every numeric array in the view (masked uploads and the result)."""
        yield from self.masked_uploads.values()
        if self.result is not None:
            yield self.result


def reply_bytes(stage: str, reply: dict) -> int:
    """Bytes of one node's reply on the wire (ids 4 bytes, keys 32, signatures 64, ring values 8)."""
    if stage == "keys":
        return (
            2 * PUBLIC_KEY_BYTES
            + (SIGNATURE_BYTES if "sig" in reply else 0)
            + ID_BYTES * len(reply.get("nbrs", ()))
        )
    if stage == "shares":
        return sum(ID_BYTES + len(c) for c in reply["ct"])
    if stage == "masked":
        return int(np.asarray(reply["y"]).nbytes) + (SIGNATURE_BYTES if "echo" in reply else 0)
    if stage == "consistency":
        return SIGNATURE_BYTES
    return len(reply["about"]) * UNMASK_ANSWER_BYTES


def request_bytes(stage: str, msg: dict, u: int) -> int:
    """Bytes of one request to node u that carry protocol data (peers' keys, shares, lists, signatures)."""
    if stage == "shares":
        per = ID_BYTES + 2 * PUBLIC_KEY_BYTES + (SIGNATURE_BYTES if msg.get("sig") else 0)
        return per * (len(msg["peers"]) - 1)
    if stage == "masked":
        return sum(ID_BYTES + len(c) for c in msg["ct"])
    if stage == "consistency":
        return ID_BYTES * len(msg["uploaded"])
    if stage == "unmask":
        return (
            ID_BYTES * len(msg["uploaded"])
            + (ID_BYTES + SIGNATURE_BYTES) * len(msg.get("signers", []))
            + SIGNATURE_BYTES * len(msg.get("echoes", []))
            + sum(len(v) for v in msg.get("views", []))
            + sum(len(v) for v in msg.get("alive_lists", []))
        )
    return 0


def keys_request(session: bytes, num_nodes: int, threshold: int, degree: int | None) -> dict:
    """The first request of a session, the same for every node: K, t and (on a SecAgg+ graph) the degree."""
    msg = {"stage": "keys", "session": session, "K": int(num_nodes), "t": int(threshold)}
    if degree is not None:
        msg["degree"] = int(degree)
    return msg


class MaskingServer:
    """The server of one masked sum (see the module docstring).

    Parameters
    ----------
    num_nodes, threshold : int
        K and t (the nodes check both against their configuration).
    length : int
        Public length of every node's input vector.
    session : bytes
        Fresh 16-byte session id.
    active : bool
        Run the consistency round (active-adversary version).
    graph : list of frozenset, optional
        SecAgg+ neighbour sets; default complete (or, with ``degree`` in the
        active version, the sets the nodes name from their roster).
    degree : int, optional
        Active version on a SecAgg+ graph: the roster's degree k, sent with
        the keys request (a node whose roster says otherwise refuses).
    frac_bits : int
        Recorded in the view.
    name : str
        What is summed (error messages).
    keep_view : bool
        Keep every masked upload and relayed share message in :attr:`view`
        (for tests and audits).  Without, each upload is added to the
        running total as it arrives and dropped: the server holds one
        vector of d ring elements whatever the number of nodes, and the
        share messages only until it relays them.
    """

    def __init__(
        self,
        *,
        num_nodes: int,
        threshold: int,
        length: int,
        session: bytes,
        active: bool,
        graph: list[frozenset[int]] | None = None,
        degree: int | None = None,
        frac_bits: int = 0,
        name: str = "statistic",
        keep_view: bool = True,
    ) -> None:
        self.keep_view = bool(keep_view)
        self.K, self.t, self.length, self.session = (
            int(num_nodes),
            int(threshold),
            int(length),
            bytes(session),
        )
        self.active, self.name = bool(active), name
        self.degree = None if degree is None else int(degree)
        self.learn_graph = graph is None and self.degree is not None
        if graph is not None:
            self.graph = graph
        elif self.learn_graph:  # learned from the key advertisements (keys stage), O(k) a node
            self.graph = [frozenset()] * self.K
        else:  # the complete graph
            self.graph = [frozenset(range(self.K)) - {u} for u in range(self.K)]
        self.stages = ["keys", "shares", "masked"] + (["consistency"] if active else []) + ["unmask"]
        self.stage = "keys"
        self.view = ServerView(num_clients=self.K, frac_bits=frac_bits)
        self.alive: list[int] = list(range(self.K))
        self._got: dict[int, dict] = {}
        self.adverts: dict[int, dict] = {}
        self.inbox: dict[int, dict[int, bytes]] = {}
        self.U1: list[int] = []
        self.U2: list[int] = []
        self.U3: list[int] = []
        self.signers: dict[int, bytes] = {}
        self.echoes: dict[int, bytes] = {}
        self.total = np.zeros(self.length, dtype=np.uint64)
        self.done = False
        self.bytes_up: dict[int, dict[str, int]] = {u: {} for u in range(self.K)}
        self.bytes_down: dict[int, int] = {u: 0 for u in range(self.K)}

    # ------------------------------------------------------------------ messages
    def requests(self) -> dict[int, dict]:
        """This stage's request to every node still in the run."""
        s = self.stage
        base = {"stage": s, "session": self.session}
        if s == "keys":
            one = keys_request(self.session, self.K, self.t, self.degree)
            return {u: dict(one) for u in self.alive}
        out = {}
        # Each node hears only about its own group (itself and its neighbours; everyone on the complete
        # graph): what it checks and answers depends on nothing else, and its messages stay O(k) on a
        # SecAgg+ graph.
        mine = lambda u, members: sorted((self.graph[u] | {u}) & members)  # noqa: E731
        U1, U2, U3, signed = set(self.U1), set(self.U2), set(self.U3), set(self.signers)
        if s == "unmask" and self.degree is not None:  # each node's view and survivors, packed once
            survivors = {v: mine(v, U2) for v in self.U3}
            views = {v: pack_view(survivors[v], mine(v, U3)) for v in self.signers}
            alive = {v: pack_view(survivors[v], []) for v in self.U3}
        for u in self.alive:
            if s == "shares":
                peers = mine(u, U1)
                msg = {
                    **base,
                    "peers": peers,
                    "c_pk": [self.adverts[v]["c_pk"] for v in peers],
                    "s_pk": [self.adverts[v]["s_pk"] for v in peers],
                }
                if self.active:
                    msg["sig"] = [self.adverts[v]["sig"] for v in peers]
            elif s == "masked":
                box = {v: ct for v, ct in self.inbox[u].items() if v in U2}
                msg = {**base, "alive": mine(u, U2), "from": list(box), "ct": list(box.values())}
            elif s == "consistency":
                msg = {**base, "uploaded": mine(u, U3)}
            else:
                msg = {**base, "uploaded": mine(u, U3)}
                if self.active:
                    # t signatures of its group, its own first: all a node checks (it stops at t agreeing)
                    group = mine(u, signed)
                    signers = ([u] if u in self.signers else []) + [v for v in group if v != u]
                    signers = signers[: self.t]
                    msg["signers"], msg["sigs"] = signers, [self.signers[v] for v in signers]
                    msg["echoes"] = [self.echoes[v] for v in msg["uploaded"]]
                    if self.degree is not None:  # each signer's view of its own group, as it signed it
                        msg["views"] = [views[v] for v in signers]
                        # and each uploader's survivors, as its echo names them
                        msg["alive_lists"] = [alive[v] for v in msg["uploaded"]]
            out[u] = msg
        for u, msg in out.items():
            self.bytes_down[u] += request_bytes(s, msg, u)
        return out

    def receive(self, u: int, reply: dict) -> None:
        """One node's reply to this stage (the Flower transport maps node ids to u first)."""
        s = self.stage
        if u not in self.alive or u in self._got:
            raise ProtocolAbort(f"{self.name}: unexpected {s!r} reply from node {u}", stage=s)
        if s == "masked":
            y = np.asarray(reply["y"])
            if y.dtype != np.uint64 or y.shape != (self.length,):
                raise ProtocolAbort(
                    f"node {u} uploaded a masked statistic of shape {y.shape} ({y.dtype}), "
                    f"expected ({self.length},) uint64: the nodes disagree on d or C",
                    stage=s,
                )
            self.bytes_up[u][s] = reply_bytes(s, reply)
            # Folded as it arrives: the server never holds more uploads than it keeps in its view.
            np.add(self.total, y, out=self.total)
            if self.keep_view:
                self.view.masked_uploads[u] = y
            self._got[u] = {k: v for k, v in reply.items() if k != "y"}
            return
        self._got[u] = reply
        self.bytes_up[u][s] = reply_bytes(s, reply)

    def close(self, detail: str = "") -> None:
        """End this stage: its repliers go on; below t the run aborts with no sum."""
        s, got = self.stage, self._got
        self._got = {}
        if len(got) < self.t:
            raise ProtocolAbort(
                f"secure aggregation aborted at stage {s!r}: {len(got)} node(s) answered, below the threshold "
                f"t={self.t}{detail}; no sum is released",
                stage=s,
                deviation="dropouts",
            )
        if s == "keys":
            self.U1 = sorted(got)
            if self.learn_graph:
                self._graph_from(got)
            # what the later stages relay or use: the keys and their signature (not the neighbour list)
            self.adverts = {u: {k: a[k] for k in ("c_pk", "s_pk", "sig") if k in a} for u, a in got.items()}
            if self.keep_view:
                for u, a in got.items():
                    self.view.public_keys[u] = (bytes(a["c_pk"]), bytes(a["s_pk"]))
            self.inbox = {u: {} for u in self.U1}
        elif s == "shares":
            for u, rep in got.items():
                for v, ct in zip(rep["to"], rep["ct"]):
                    if int(v) in self.inbox:
                        self.inbox[int(v)][u] = bytes(ct)
                        if self.keep_view:
                            self.view.encrypted_shares[(u, int(v))] = self.inbox[int(v)][u]
            self.U2 = sorted(got)
        elif s == "masked":
            for u in sorted(got):
                if self.active:
                    self.echoes[u] = bytes(got[u]["echo"])
            self.U3 = sorted(got)
            self.view.uploaded = tuple(self.U3)
            self.inbox = {}  # relayed: the share messages are no longer the server's to hold
        elif s == "consistency":
            self.signers = {u: bytes(got[u]["sig"]) for u in sorted(got)}
            if self.keep_view:
                self.view.consistency_signatures = dict(self.signers)
        else:
            self._unmask(got)
        self.alive = sorted(got)
        i = self.stages.index(s)
        self.stage = self.stages[i + 1] if i + 1 < len(self.stages) else "done"
        self.done = self.stage == "done"

    def _graph_from(self, got: dict[int, dict]) -> None:
        """The roster graph as the advertising nodes name it: k neighbours each, symmetric."""
        nbrs = {u: frozenset(int(v) for v in rep.get("nbrs", ())) for u, rep in got.items()}
        for u, mine in nbrs.items():
            odd = [v for v in mine if v in nbrs and u not in nbrs[v]]
            if len(mine) != min(self.degree, self.K - 1) or odd or not all(0 <= v < self.K for v in mine):
                raise ProtocolAbort(
                    f"{self.name}: node {u} names neighbours {sorted(mine)[:8]} that do not form the "
                    f"{self.degree}-regular graph of one roster (asymmetric with {odd[:3]} or the wrong "
                    "count): the nodes hold different rosters",
                    stage="keys",
                    deviation="wrong-graph",
                )
        self.graph = [nbrs.get(u, frozenset()) for u in range(self.K)]

    # ------------------------------------------------------------------ unmasking
    def _unmask(self, got: dict[int, dict]) -> None:
        self.view.answered = tuple(sorted(got))
        up = set(self.U3)
        b_shares: dict[int, dict[int, int]] = {u: {} for u in self.U3}
        s_shares: dict[int, dict[int, int]] = {u: {} for u in sorted(set(self.U2) - up)}
        for v in sorted(got):
            rep = got[v]
            for w, kind, share in zip(rep["about"], rep["kind"], rep["share"]):
                w, val = int(w), int.from_bytes(bytes(share), "little")
                if val >= shamir.PRIME:  # no share of a field element: a forged or damaged answer, named
                    raise ProtocolAbort(
                        f"{self.name}: node {v} answered a share of node {w} outside the field; no sum is released",
                        stage="unmask",
                    )
                if kind == "b" and w in b_shares:
                    b_shares[w][v + 1] = val
                elif kind == "s" and w in s_shares:
                    s_shares[w][v + 1] = val
        self.view.self_seed_shares, self.view.key_shares = b_shares, s_shares
        cache: dict[tuple[int, ...], list[int]] = {}

        def recover(shares: dict[int, int], u: int, what: str) -> int:
            if len(shares) < self.t:
                raise ProtocolAbort(
                    f"{self.name}: the {what} of node {u} cannot be rebuilt: {len(shares)} of its share holders "
                    f"answered, below the threshold t={self.t} (too many dropouts); no sum is released",
                    stage="unmask",
                    deviation="dropouts",
                )
            xs = tuple(list(shares)[: self.t])
            if xs not in cache:
                cache[xs] = shamir.lagrange_at_zero(xs)
            return shamir.combine(shares, self.t, cache[xs])

        keys, signs = [], []
        for u in self.U3:
            b = recover(b_shares[u], u, "self-mask seed")
            keys.append(hkdf(b.to_bytes(32, "little"), INFO_SELF + self.session))
            signs.append(False)
        for u in sorted(set(self.U2) - up):
            s_sk = private_key(recover(s_shares[u], u, "mask key"))
            for v in sorted(self.graph[u] & up):
                keys.append(
                    hkdf(s_sk.exchange(public_key(self.adverts[v]["s_pk"])), INFO_PAIR + self.session)
                )
                signs.append(u < v)  # v added +m if u > v, -m if u < v: undo it
        add_masks(self.total, keys, signs)


def run_in_process(
    server: MaskingServer,
    nodes: dict,
    *,
    inputs: Callable[[int], np.ndarray],
    silent: Callable[[str, int], bool] = lambda stage, u: False,
    contexts: Callable[[int], bytes] = lambda u: b"",
    aggregation: bytes | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Run ``server`` with ``nodes`` (u -> MaskingNode) in this process; returns the ring sum.

    ``inputs(u)`` is node u's encoded input (asked at the masked stage),
    ``silent(stage, u)`` says that node u does not answer that stage (a
    dropout), ``contexts(u)`` is the digest of what node u was asked to sum.
    """
    while not server.done:
        stage = server.stage
        for u, msg in server.requests().items():
            if silent(stage, u):
                continue
            reply = nodes[u].handle(
                msg, ring_input=lambda u=u: inputs(u), context=contexts(u), aggregation=aggregation
            )
            server.receive(u, reply)
        server.close()
        if on_stage is not None:
            on_stage(stage)
    return server.total
