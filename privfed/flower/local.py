"""An in-process Flower grid: the real ClientApp and ServerApp code, without the Flower runtime.

:class:`LocalGrid` implements the part of Flower's ``Grid`` that
:func:`privfed.flower.server_app.serve` uses (``get_node_ids``,
``push_messages``, ``pull_messages``) by handing each message straight to
the ClientApp with that node's own :class:`flwr.app.Context` (its node
config and its persistent ``state``), in this process.  A ClientApp that
raises is a node that never answers, as a crashed node is under Flower.

Runs take milliseconds instead of a simulation's start-up of tens of
seconds: tests of error paths, and the end-to-end auditor
(:mod:`privfed.flower.audit`), which runs thousands of releases.
"""

from __future__ import annotations

import itertools

from flwr.app import Context, RecordDict

from privfed.flower.client_app import make_client_app

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
    """

    def __init__(self, node_configs: dict[int, dict], app=None) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        if TaskIdentity._run_id is None:  # what a ServerApp process has set before it creates messages
            TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.app = app or make_client_app()
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=c, state=RecordDict(), run_config={})
                         for n, c in node_configs.items()}
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
                reply = self.app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception:  # noqa: BLE001 - a failing ClientApp is a node that never answers
                reply = None
            if reply is not None:
                self.replies[mid] = reply
            out.append(mid)
        return out

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]
