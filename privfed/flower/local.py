"""An in-process Flower grid: the real ClientApp and ServerApp code, without the Flower runtime.

:class:`LocalGrid` implements the part of Flower's ``Grid`` that
:func:`privfed.flower.server_app.serve` uses (``get_node_ids``,
``push_messages``, ``pull_messages``) by handing each message straight to
the ClientApp with that node's own :class:`flwr.app.Context` (its node
config and its persistent ``state``), in this process, each node a copy of
the message (serialised and parsed, as over the wire).  A ClientApp that
raises answers with an error carrying the exception, as Flower's runtime does.

Runs take milliseconds instead of a simulation's start-up of tens of
seconds: tests of error paths, and the end-to-end auditor
(:mod:`privfed.flower.audit`), which runs thousands of releases.
"""

from __future__ import annotations

import itertools

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto

from privfed.flower.client_app import make_client_app
from privfed.flower.provision import simulated_identities

__all__ = ["LocalGrid"]


class LocalGrid:
    """Delivers each message to the ClientApp in this process (see the module docstring).

    Parameters
    ----------
    node_configs : dict
        node id -> that node's node config (``partition-id`` / ``num-partitions``,
        or ``features=PATH``).
    app : ClientApp, optional
        Defaults to :func:`privfed.flower.client_app.make_client_app` ().
    degree : int, optional
        The SecAgg+ degree of the simulated roster's graph (``secure=mask`` with ``degree``).
    """

    def __init__(self, node_configs: dict[int, dict], app=None, degree: int | None = None) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        if TaskIdentity._run_id is None:  # what a ServerApp process has set before it creates messages
            TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.app = app or make_client_app()
        # Secure aggregation needs each node's identity and the roster: an in-process simulation makes them
        # (t the majority threshold) unless the node configs bring their own.
        node_configs = simulated_identities(node_configs, degree=degree)
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config=c, state=RecordDict(), run_config={})
            for n, c in node_configs.items()
        }
        self.ids = itertools.count(1)
        self.replies: dict[str, object] = {}

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        out = []
        for msg in messages:
            mid = f"m{next(self.ids)}"
            msg.metadata.__dict__["_message_id"] = mid
            try:
                # Each node gets its own copy, as over the wire (a handler may change what it received).
                delivered = message_from_proto(message_to_proto(msg))
                delivered.metadata.__dict__["_message_id"] = mid
                reply = self.app(delivered, self.contexts[msg.metadata.dst_node_id])
            except Exception as exc:  # noqa: BLE001 - as Flower's runtime: an error reply with the reason
                reply = Message(
                    Error(code=0, reason=f"ClientApp raised {type(exc).__name__}: {exc}"), reply_to=msg
                )
            if reply is not None:
                self.replies[mid] = reply
            out.append(mid)
        return out

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        """Push, then pull every reply there is (delivery is immediate: nothing more will come)."""
        return self.pull_messages(self.push_messages(messages))
