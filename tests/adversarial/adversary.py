"""A malicious server in one process, driving the real node code that Flower runs.

:class:`Federation` holds K nodes, each with its roster identity and its own
``flwr.app.Context``; every request reaches a node through
:func:`privfed.flower.secagg.node_step` (the ClientApp's handler: records in,
state machine, records out).  A test plays the server: it builds the
requests an honest :class:`~mechanisms.secagg.masking.server.MaskingServer` would
send, changes them the way a deviating server would, delivers them, and
either sees the nodes abort or inspects what it holds.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from flwr.app import Context, RecordDict

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.graph import group_size
from mechanisms.secagg.identity import make_roster, min_threshold
from mechanisms.secagg.masking.server import MaskingServer
from privfed.flower.secagg import from_records, node_step, to_records

FRAC = 16


class Federation:
    """K simulated nodes (real node code) with inputs ``x[u]`` and a roster with threshold t
    (and with ``degree``, the roster's SecAgg+ graph); ``roster=(roster, identities)`` takes one made by
    the caller."""

    def __init__(
        self,
        K: int = 5,
        t: int | None = None,
        length: int = 6,
        seed: int = 0,
        colluders: int = 0,
        degree: int | None = None,
        roster=None,
    ) -> None:
        self.K, self.length = K, length
        if roster is not None:  # (roster, identities) made by the caller, e.g. make_roster's defaults
            self.roster, self.ids = roster
        else:
            # t defaults to the smallest the declared colluders allow (below the default one: declared)
            n = group_size(K, degree)
            t = min_threshold(n, colluders) if t is None else t
            self.roster, self.ids = make_roster(K, t, colluders, degree=degree)
        self.t = self.roster.threshold
        rng = np.random.default_rng(seed)
        self.x = rng.normal(0, 10, size=(K, length))
        self.ctx = [
            Context(run_id=1, node_id=100 + u, node_config={}, state=RecordDict(), run_config={})
            for u in range(K)
        ]
        self.aggregation = hashlib.sha256(b"adversarial test run").digest()
        self.digest = {u: b"the same broadcast" for u in range(K)}

    def server(self, session: bytes | None = None) -> MaskingServer:
        return MaskingServer(
            num_nodes=self.K,
            threshold=self.t,
            length=self.length,
            session=session or os.urandom(16),
            active=True,
            degree=self.roster.degree,
            frac_bits=FRAC,
        )

    def send(self, u: int, msg: dict) -> dict:
        """Deliver one request to node u as Flower would (records both ways); ProtocolAbort on refusal."""
        reply = node_step(
            to_records(msg),
            self.ctx[u],
            self.ids[u],
            self.roster,
            ring_input=lambda: fixed_point.encode(self.x[u], FRAC),
            context_digest=self.digest[u],
            aggregation=self.aggregation,
        )
        assert isinstance(reply, RecordDict)
        return from_records(reply)

    def stage(
        self,
        server: MaskingServer,
        requests: dict[int, dict] | None = None,
        skip: frozenset[int] = frozenset(),
    ) -> dict[int, ProtocolAbort]:
        """One stage: deliver ``requests`` (default: the honest server's), feed replies back, close it.

        Returns the nodes' aborts (node -> exception); the stage is closed only if none aborted.
        """
        requests = server.requests() if requests is None else requests
        aborts = {}
        for u, msg in requests.items():
            if u in skip:
                continue
            try:
                server.receive(u, self.send(u, msg))
            except ProtocolAbort as exc:
                aborts[u] = exc
        if not aborts:
            server.close()
        return aborts

    def run_until(self, server: MaskingServer, stage: str) -> None:
        """Run the honest protocol until ``server.stage == stage``."""
        while server.stage != stage:
            assert not self.stage(server)

    def true_sum(self, who) -> np.ndarray:
        return self.x[sorted(who)].sum(axis=0)


def only(aborts: dict, deviation: str, stage: str) -> None:
    """Every abort names this deviation and stage, and at least one node aborted."""
    assert aborts, "no node noticed the deviation"
    for u, exc in aborts.items():
        assert exc.node == u and exc.stage == stage and exc.deviation == deviation, (
            u,
            exc.deviation,
            str(exc),
        )
        assert f"node {u} aborts at stage {stage!r}" in str(exc)
