"""Server-side message exchange with a deadline: every wait ends.

:func:`wait_for_nodes` polls the grid until the expected number of nodes
has registered; :func:`exchange` pushes one message per node and hands each
reply to a callback as it arrives (so the server can fold it and drop it),
until every node answered or the deadline passed.  Nodes that did not answer
in time, and nodes whose ClientApp failed, are returned, never waited on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flwr.app import Message, RecordDict

from privfed.errors import ConfigError
from privfed.flower.wire import record_bytes

__all__ = ["Exchange", "exchange", "poll_interval", "wait_for_nodes"]

#: Seconds between two polls of the grid (the least; see :func:`poll_interval`).
POLL_SECONDS = 0.05
#: Replies pending per second of interval between polls: each poll asks after every pending message, so
#: with a thousand pending a poll every half second, with a hundred or fewer every POLL_SECONDS.
PENDING_PER_SECOND = 2000


def poll_interval(pending: int) -> float:
    """Seconds to wait before polling again for ``pending`` replies: each poll costs the grid a look at every
    pending message, so the interval grows with them (between POLL_SECONDS and one second)."""
    return min(1.0, max(POLL_SECONDS, pending / PENDING_PER_SECOND))


def wait_for_nodes(grid, expected: int, timeout: float) -> list[int]:
    """The ids of the first ``expected`` nodes to register (ConfigError after ``timeout`` s); more registered
    nodes than ``expected`` are named in a warning (their data is left out of this run)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) > expected:
            print(
                f"privfed: WARNING: {len(nodes)} nodes are connected but clients={expected}: the run uses the "
                f"first {expected} and leaves the data of {len(nodes) - expected} out; set clients={len(nodes)} "
                "to use every node",
                flush=True,
            )
        if len(nodes) >= expected:
            return nodes[:expected]
        if time.monotonic() > deadline:
            raise ConfigError(
                f"only {len(nodes)} of the {expected} expected nodes connected within {timeout:g} s; "
                "start more SuperNodes (or lower clients) or raise connect-timeout"
            )
        time.sleep(POLL_SECONDS)


@dataclass
class Exchange:
    """What one stage returned: who answered, who failed (with Flower's reason), who was silent."""

    stage: str
    answered: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    silent: list[int] = field(default_factory=list)
    bytes_down: dict[int, int] = field(default_factory=dict)
    bytes_up: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict:
        """The stage as a report entry: how many answered, who failed or was silent, seconds, bytes each way."""
        return {
            "answered": len(self.answered),
            "failed": self.failed,
            "silent": self.silent,
            "seconds": round(self.seconds, 3),
            "bytes_up": int(sum(self.bytes_up.values())),
            "bytes_down": int(sum(self.bytes_down.values())),
        }


def exchange(
    grid,
    contents: dict[int, RecordDict],
    message_type: str,
    timeout: float,
    on_reply: Callable[[int, RecordDict], None],
    *,
    group_id: str = "",
) -> Exchange:
    """Send ``contents[node]`` to every node; call ``on_reply(node, content)`` as replies arrive.

    Returns after every node answered or ``timeout`` seconds.  Replies that
    carry a Flower error (the ClientApp raised or died) are recorded in
    ``failed`` with Flower's reason and not passed to ``on_reply``.
    """
    t0 = time.monotonic()
    out = Exchange(stage=message_type)
    messages = []
    for node, content in contents.items():
        out.bytes_down[node] = record_bytes(content)
        messages.append(Message(content, dst_node_id=int(node), message_type=message_type, group_id=group_id))
    ids = [i for i in grid.push_messages(messages) if i]
    pending = set(ids)
    deadline = t0 + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            pending.discard(reply.metadata.reply_to_message_id)
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                out.failed[node] = str(reply.error.reason)
                continue
            out.bytes_up[node] = record_bytes(reply.content)
            out.answered.append(node)
            on_reply(node, reply.content)
        if pending:
            time.sleep(poll_interval(len(pending)))
    done = set(out.answered) | set(out.failed)
    out.silent = sorted(set(contents) - done)
    out.seconds = time.monotonic() - t0
    return out
