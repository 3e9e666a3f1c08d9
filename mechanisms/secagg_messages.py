"""The shape of the server's requests to a masking node: stage names, session id size, id lists.

Every request :class:`mechanisms.secagg_node.MaskingNode` answers names a
stage of :data:`STAGES` and a session id of :data:`SESSION_BYTES` bytes;
:func:`parse_ids` reads one list of node ids from a request and refuses a
list that repeats an entry.
"""

from __future__ import annotations

from mechanisms.secagg_crypto import ProtocolAbort, as_int

__all__ = ["SESSION_BYTES", "STAGES", "parse_ids"]

#: The server's requests, in order ("consistency" only in the active version).
STAGES = ("keys", "shares", "masked", "consistency", "unmask")
SESSION_BYTES = 16


def parse_ids(values, what: str, node: int, stage: str) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"the {what} list is a {type(values).__name__}")
    out = [as_int(v, f"an entry of the {what} list") for v in values]
    if len(set(out)) != len(out):
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: the {what} list repeats entries",
            node=node,
            stage=stage,
            deviation="malformed-list",
        )
    return out
