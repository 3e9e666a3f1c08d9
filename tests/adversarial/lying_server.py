"""A lying server against deployed Flower nodes: the real ClientApp, nodes configured as an operator deploys
them (roster and identity files, a secure-aggregation ledger file, a lifetime privacy budget), and a server
that builds every message itself.

:func:`deployed_nodes` makes the operator's files the documented way (``make_roster``, ``--init-ledger``,
``privfed.flower.budget init``); :class:`LyingServer` sends the ClientApp's message types one node at a
time over :class:`~privfed.flower.local.LocalGrid` (each message serialised and parsed, as over the wire)
and runs :class:`~mechanisms.secagg.masking.server.MaskingServer` with a hook that may change, hold back or
drop any request before it leaves.  Refusals are collected, never raised: a lying server goes on with the
nodes that answered.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from mechanisms.secagg import fixed_point
from mechanisms.secagg.identity import make_roster
from mechanisms.secagg.ledger import init_ledger_file
from mechanisms.secagg.masking.server import MaskingServer
from privfed.flower.budget import FileBudgetStore, init_ledger
from privfed.flower.local import LocalGrid
from privfed.flower.secagg import from_records, to_records
from privfed.flower.wire import arrays_record

FIRST = 100  # node id of roster index 0


class TamperingGrid(LocalGrid):
    """A LocalGrid whose server side rewrites messages before they leave (``tamper(msg) -> None``): a
    deviating server that runs the honest server's code and changes what it sends."""

    def __init__(self, nodes, tamper, **kw):
        super().__init__(nodes, **kw)
        self.tamper = tamper

    def push_messages(self, messages):
        for m in messages:
            self.tamper(m)
        return super().push_messages(messages)


def digits_nodes(n: int) -> dict[int, dict]:
    """``n`` simulated nodes (Flower ids 100, 101, ...) on the digits partitions."""
    return {100 + i: {"partition-id": i, "num-partitions": n} for i in range(n)}


def serve_tampered(tamper, *, method: str = "fedncm", clients: int = 4):
    """The honest server's masked run over ``clients`` digits nodes, every message it sends changed by
    ``tamper`` first (:class:`TamperingGrid`)."""
    from privfed.flower import FlowerConfig, serve

    return serve(
        TamperingGrid(digits_nodes(clients), tamper),
        FlowerConfig(method=method, clients=clients, secure="mask", timeout=30),
    )


def masked_rounds_config(clients: int, delta: float = 1e-5):
    """Two masked rounds of FedLog under DP (epsilon 4, clip 2) on ``clients`` nodes, no local training: the
    cheapest multi-round run that releases, charges and composes."""
    from privfed.flower import FlowerConfig

    return FlowerConfig(
        method="fedlog",
        clients=clients,
        rounds=2,
        rounds_params={"local_epochs": 0, "families": ["mlp"], "init": "scratch"},
        epsilon=4.0,
        delta=delta,
        clip=2.0,
        secure="mask",
        timeout=30,
    )


def deployed_nodes(
    folder: pathlib.Path,
    K: int,
    *,
    colluders: int | None = None,
    threshold: int | None = None,
    degree: int | None = None,
    budget: tuple[float, float] | None = None,
    **extra,
) -> tuple[dict[int, dict], object, list]:
    """Node configs of K deployed nodes (roster index i is node id FIRST + i, digits partition i of K) with
    the operator's files in ``folder``; ``budget=(epsilon, delta)`` gives each a lifetime budget."""
    folder.mkdir(parents=True, exist_ok=True)
    roster, ids = make_roster(K, threshold, colluders, degree=degree)
    (folder / "roster.json").write_text(roster.to_json())
    nodes = {}
    for i, ident in enumerate(ids):
        (folder / f"node-{i}.json").write_text(ident.to_json())
        ledger = folder / f"ledger-{i}.json"
        if not ledger.exists():
            init_ledger_file(ledger, roster.fingerprint)
        conf = {
            "partition-id": i,
            "num-partitions": K,
            "secagg-identity": str(folder / f"node-{i}.json"),
            "secagg-roster": str(folder / "roster.json"),
            "secagg-ledger": str(ledger),
        }
        if budget is not None:
            path = folder / f"budget-{i}.json"
            if not path.exists():
                init_ledger(path)
            conf.update(
                {"dp-budget-epsilon": budget[0], "dp-budget-delta": budget[1], "dp-budget-ledger": str(path)}
            )
        nodes[FIRST + i] = {**conf, **extra}
    return nodes, roster, ids


def charges(nodes: dict[int, dict], node: int) -> list[dict]:
    """The releases node ``node`` charged to its budget ledger file."""
    return FileBudgetStore(nodes[node]["dp-budget-ledger"]).load()


Tamper = Callable[[str, int, dict], "dict | None"]


class LyingServer:
    """Sends the ClientApp's requests itself (see the module docstring)."""

    def __init__(self, grid: LocalGrid, cfg, nonce: str | None = None, extra: dict | None = None) -> None:
        self.grid, self.cfg = grid, cfg
        self.config = ConfigRecord(
            {**cfg.to_wire(), "run-nonce": nonce or os.urandom(8).hex(), **(extra or {})}
        )
        self.refusals: dict[tuple[str, int], str] = {}

    def send(self, node: int, message_type: str, content: RecordDict):
        """One request to one node: its reply's content, or the refusal's text (a str)."""
        (reply,) = self.grid.send_and_receive([Message(content, dst_node_id=node, message_type=message_type)])
        if reply.has_error():
            return reply.error.reason
        if "error" in reply.content:
            return str(reply.content["error"]["message"])
        return reply.content

    def setup(self, nodes) -> dict[int, object]:
        return {n: self.send(n, "query.setup", RecordDict({"config": self.config})) for n in nodes}

    def masked_sum(
        self,
        nodes: list[int],
        length: int,
        *,
        round_name: str = "sums",
        broadcast: dict | None = None,
        tamper: Tamper | None = None,
        degree: int | None = None,
    ) -> tuple[MaskingServer, np.ndarray | None]:
        """The five masking stages with the roster nodes ``nodes`` (``tamper(stage, u, msg)`` may change a
        request, or return None to hold it back: that node drops).  Returns the server and the decoded sum
        (None when the run stopped below t)."""
        K = self.cfg.clients
        server = MaskingServer(
            num_nodes=K,
            threshold=self.cfg.secagg_threshold if self.cfg.threshold is None else self.cfg.threshold,
            length=length,
            session=os.urandom(16),
            active=True,
            degree=degree,
            frac_bits=self.cfg.frac_bits,
            keep_view=True,
        )
        self.server = (
            server  # what a tamper may read: every signature the server holds, not only those it forwards
        )
        index = {n - FIRST for n in nodes}
        server.alive = sorted(index)
        while not server.done:
            stage = server.stage
            for u, msg in server.requests().items():
                if tamper is not None:
                    msg = tamper(stage, u, dict(msg))
                    if msg is None:
                        continue
                rec = to_records(msg)
                if stage == "masked":
                    rec["config"] = self.config
                    rec["round"] = ConfigRecord({"round": round_name})
                    if broadcast is not None:
                        rec["broadcast"] = arrays_record(broadcast)
                got = self.send(FIRST + u, f"query.{stage}", rec)
                if isinstance(got, str):
                    self.refusals[(stage, FIRST + u)] = got
                    continue
                server.receive(u, from_records(got))
            try:
                server.close()
            except Exception as exc:  # noqa: BLE001 - below t: the lying server got nothing
                self.refusals[(stage, -1)] = str(exc)
                return server, None
        return server, fixed_point.decode(server.total, self.cfg.frac_bits)
