"""The shape of the server's requests to a masking node: stage names, session id size, id lists.

Every request :class:`mechanisms.secagg.masking.node.MaskingNode` answers names a
stage of :data:`STAGES` and a session id of :data:`SESSION_BYTES` bytes;
:func:`parse_ids` reads one list of node ids from a request and refuses a
list that repeats an entry.  :func:`pack_view` / :func:`unpack_view` carry
one node's signed view of its group (its U2 and U3) as bytes, which a
Flower ConfigRecord holds in a list (it has no nested lists).
"""

from __future__ import annotations

import struct

from mechanisms.secagg.crypto import ProtocolAbort, as_int

__all__ = ["SESSION_BYTES", "STAGES", "pack_view", "parse_ids", "unpack_view"]

#: The server's requests, in order ("consistency" only in the active version).
STAGES = ("keys", "shares", "masked", "consistency", "unmask")
SESSION_BYTES = 16


def parse_ids(values, what: str, node: int, stage: str) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"the {what} list is a {type(values).__name__}")
    if all(type(v) is int for v in values):  # the common case: plain ints (not bools, a subclass of int)
        out = list(values)
    else:
        out = [as_int(v, f"an entry of the {what} list") for v in values]
    if len(set(out)) != len(out):
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: the {what} list repeats entries",
            node=node,
            stage=stage,
            deviation="malformed-list",
        )
    return out


def pack_view(alive: list[int], uploaded: list[int]) -> bytes:
    """A view (U2, U3) as bytes: the length of U2, then every id, 4 bytes little-endian each."""
    ids = [len(alive), *alive, *uploaded]
    try:
        return struct.pack(f"<{len(ids)}I", *ids)
    except struct.error as exc:
        raise OverflowError(f"a view that is not 4-byte ids ({exc})") from None


def unpack_view(raw: bytes) -> tuple[list[int], list[int]]:
    """The (U2, U3) of :func:`pack_view` (ValueError if the bytes are not one)."""
    if len(raw) < 4 or len(raw) % 4:
        raise ValueError(f"a packed view of {len(raw)} bytes")
    ids = list(struct.unpack(f"<{len(raw) // 4}I", raw))
    n = ids[0]
    if n > len(ids) - 1:
        raise ValueError("a packed view whose U2 runs past its end")
    return ids[1 : 1 + n], ids[1 + n :]
