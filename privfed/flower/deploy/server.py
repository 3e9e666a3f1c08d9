"""The deployed ServerApp: privfed's server, talking only to nodes whose Flower key is bound to the roster.

``privfed/flower/app`` names :data:`app`.  It reads the run config as the plain ServerApp
(:mod:`privfed.flower.server_app`) does, plus one key of its own, ``node-keys``: the path, on the
SuperLink machine, of the operator's verified list (:class:`privfed.flower.deploy.auth.NodeKeys`,
written by ``python -m privfed.flower.deploy.auth verify``).  Without it a run on a SuperLink stops
before any message is sent (a deployment fails closed); only on Flower's simulation runtime, whose nodes
are virtual and hold no keys, does the app run without it (``flwr run`` with the app's defaults), and
its report says so.  The server then sees the SuperLink's nodes through
:class:`AuthenticatedGrid`: a node whose Flower public key (the key the SuperLink authenticated its
requests with, reported by ``grid.get_nodes()``) is not in the list is never sent a message, and the
report's ``node_authentication`` names the roster index of every node used and every node left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from privfed.errors import ConfigError
from privfed.flower.config import FlowerConfig
from privfed.flower.deploy.auth import NodeKeys
from privfed.flower.server_app import FlowerResult, check_output, run_line, serve, write_outputs

__all__ = ["NODE_KEYS", "AuthenticatedGrid", "app", "config_from_roster", "serve_authenticated"]

#: The run-config key naming the verified node-key list on the SuperLink machine.
NODE_KEYS = "node-keys"


class AuthenticatedGrid:
    """A Flower grid that shows the server only nodes whose Flower key ``keys`` binds to a roster index.

    ``get_node_ids`` asks the SuperLink for every node's public key (``get_nodes``) and keeps the
    bound ones; sending to any other node is refused.  Everything else is the wrapped grid's.
    """

    def __init__(self, grid, keys: NodeKeys) -> None:
        if not callable(getattr(grid, "get_nodes", None)):
            raise ConfigError(
                "this Flower grid does not report the nodes' public keys (get_nodes); the deployed ServerApp "
                "runs on a SuperLink (flwr run), not in a simulation"
            )
        self._grid = grid
        self.keys = keys
        #: node id -> roster index, for every bound node seen
        self.admitted: dict[int, int] = {}
        #: node id -> why it was left out
        self.refused: dict[int, str] = {}
        #: every node the server sent a message to
        self.messaged: set[int] = set()

    def get_node_ids(self) -> list[int]:
        ids = []
        for info in self._grid.get_nodes():
            node = int(info.node_id)
            index = self.keys.index_of(bytes(info.public_key)) if info.public_key else None
            if index is None:
                self.refused[node] = "its Flower key is not bound to the roster (not in node-keys)"
                continue
            self.admitted[node] = index
            ids.append(node)
        return ids

    def _check(self, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        stray = sorted({int(m.metadata.dst_node_id) for m in messages} - set(self.admitted))
        if stray:
            raise ConfigError(
                f"the server tried to message node(s) {stray}, whose Flower key is not bound to the roster; "
                "only nodes in node-keys take part"
            )
        self.messaged.update(int(m.metadata.dst_node_id) for m in messages)
        return messages

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(self._check(messages))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self._grid.send_and_receive(self._check(messages), timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def summary(self) -> dict[str, Any]:
        """The report entry: the roster, the roster index of each node messaged, the nodes left out and why."""
        return {
            "mechanism": "Flower SuperNode keys, each signed by the node's roster identity (node-keys)",
            "roster": self.keys.roster.fingerprint.hex(),
            "bound_keys": len(self.keys.bindings),
            "nodes": {str(n): self.admitted[n] for n in sorted(self.messaged)},
            "refused": {str(n): why for n, why in sorted(self.refused.items())},
        }


def _simulated(grid) -> bool:
    """Whether ``grid`` is Flower's simulation runtime (virtual nodes in one process, no node keys)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return isinstance(grid, InMemoryGrid)


def config_from_roster(cfg: FlowerConfig, roster) -> FlowerConfig:
    """A masked run's threshold and SecAgg+ degree from the operator's roster when the run config leaves them
    unset: the nodes hold the roster and refuse any other t or graph, so the roster is what the run must ask."""
    if cfg.secure != "mask":
        return cfg
    changes: dict[str, Any] = {}
    if cfg.threshold is None and roster.threshold != cfg.secagg_threshold:
        changes["threshold"] = int(roster.threshold)
    if cfg.degree is None and roster.degree is not None:
        changes["degree"] = int(roster.degree)
    return dataclasses.replace(cfg, **changes) if changes else cfg


def serve_authenticated(grid: Grid, run_config: dict[str, Any]) -> FlowerResult:
    """One run of :func:`privfed.flower.server_app.serve` over :class:`AuthenticatedGrid` (see the module docstring)."""
    rc = dict(run_config)
    path = str(rc.pop(NODE_KEYS, "")).strip()
    if path.lower() in ("", "none", "null") and _simulated(grid):
        cfg = FlowerConfig.from_run_config(rc)
        check_output(cfg.output)
        result = serve(grid, dataclasses.replace(cfg, output=None))  # written below, with what follows
        result.report["config"] = cfg.to_wire()  # with its output, as the deployed path records it
        result.report["node_authentication"] = {
            "mechanism": "none: Flower's simulation runtime (virtual nodes, no Flower keys, no roster binding)"
        }
        if cfg.output:
            write_outputs(result, cfg.output, cfg)
        return result
    if path.lower() in ("", "none", "null"):
        raise ConfigError(
            f"run-config {NODE_KEYS} is not set: the deployed app talks only to nodes whose Flower key the operator "
            "bound to the roster; write the list with python -m privfed.flower.deploy.auth verify and pass "
            f"--run-config '{NODE_KEYS}=\"/path/on/the/superlink/node-keys.json\"'"
        )
    keys = NodeKeys.load(path)
    cfg = config_from_roster(FlowerConfig.from_run_config(rc), keys.roster)
    if cfg.clients > len(keys.bindings):
        raise ConfigError(
            f"clients={cfg.clients} but {NODE_KEYS}={path} binds only {len(keys.bindings)} node key(s); "
            "lower clients or have the operator verify and register the missing nodes' keys"
        )
    check_output(cfg.output)
    bound = AuthenticatedGrid(grid, keys)
    result = serve(bound, dataclasses.replace(cfg, output=None))
    result.report["config"] = cfg.to_wire()
    result.report["node_authentication"] = {**bound.summary(), "node_keys": path}
    if cfg.output:
        write_outputs(result, cfg.output, cfg)
    return result


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    res = serve_authenticated(grid, dict(context.run_config))
    auth = res.report["node_authentication"]
    nodes = (
        f"roster nodes {sorted(auth['nodes'].values())}, {len(auth['refused'])} unbound node(s) left out"
        if "nodes" in auth
        else "simulated nodes, no node authentication"
    )
    print(run_line(res, res.report.get("config", {}).get("output"), nodes), flush=True)
