"""The shape of the server's requests to a masking node: stage names, session id size, id lists.

Every request :class:`mechanisms.secagg.masking.node.MaskingNode` answers names a
stage of :data:`STAGES` and a session id of :data:`SESSION_BYTES` bytes;
:func:`parse_ids` reads one list of node ids from a request and refuses a
list that repeats an entry.  :func:`pack_view` / :func:`unpack_view` carry
one node's signed view of its group (its U2 and U3) as bytes, which a
Flower ConfigRecord holds in a list (it has no nested lists).

:func:`encode_message` / :func:`decode_message` carry one protocol message
(every field but numpy arrays) as one bytes value: a message of a SecAgg+
stage has up to eight fields of keys, signatures, views and ids, and a
transport that checks and frames every field and list entry apart (Flower's
ConfigRecord) costs more than the message's own work.  The decoder reads
untrusted bytes: every length is checked against what is left before
anything is read or allocated, and anything else is a :class:`TypeError`
naming what is wrong (the node's malformed-request refusal).
"""

from __future__ import annotations

import struct

from mechanisms.secagg.crypto import ProtocolAbort, as_int

__all__ = [
    "SESSION_BYTES",
    "STAGES",
    "decode_message",
    "encode_message",
    "pack_view",
    "parse_ids",
    "unpack_view",
]

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


# ------------------------------------------------------------------------------------------ one message
#: The first bytes of an encoded message (and its format's version).
MESSAGE_MAGIC = b"PFM1"
_INT64 = (-(2**63), 2**63)


def encode_message(msg: dict) -> bytes:
    """One bytes value for a protocol message whose values are bytes, str, int (int64), float, bool, or
    lists of one of those (the types a Flower ConfigRecord holds, so a server can send a node whatever it
    could before; an empty list decodes as ``[]``).  TypeError for anything else."""
    out = [MESSAGE_MAGIC, struct.pack("<H", len(msg))]
    for key, value in msg.items():
        name = key.encode("ascii")
        if not 0 < len(name) < 256:
            raise TypeError(f"message field name {key!r} must be 1 to 255 ASCII characters")
        out.append(bytes((len(name),)) + name)
        out.append(_encode_value(key, value))
    return b"".join(out)


def _encode_value(key: str, v) -> bytes:
    kind = type(v)
    if kind is bytes:
        return b"b" + struct.pack("<I", len(v)) + v
    if kind is str:
        raw = v.encode("utf-8")
        return b"s" + struct.pack("<I", len(raw)) + raw
    if kind is int:
        if not _INT64[0] <= v < _INT64[1]:
            raise TypeError(f"message field {key!r}: {v} does not fit int64")
        return b"i" + struct.pack("<q", v)
    if kind is float:
        return b"f" + struct.pack("<d", v)
    if kind is bool:
        return b"t" + bytes((v,))
    if kind is list or kind is tuple:
        kinds = set(map(type, v))
        if kinds <= {int}:
            low, high = (min(v), max(v)) if v else (0, 0)
            if 0 <= low and high < 2**16:  # node ids: two bytes each
                return b"H" + struct.pack(f"<I{len(v)}H", len(v), *v)
            if not (_INT64[0] <= low and high < _INT64[1]):
                raise TypeError(f"message field {key!r}: an id does not fit int64")
            return b"I" + struct.pack(f"<I{len(v)}q", len(v), *v)
        if kinds == {bytes}:
            width = len(v[0])
            if width and all(len(x) == width for x in v):  # keys, signatures: one width for all
                return b"E" + struct.pack("<II", len(v), width) + b"".join(v)
            return b"B" + struct.pack(f"<{len(v) + 1}I", len(v), *map(len, v)) + b"".join(v)
        if kinds == {str}:
            raw = [x.encode("utf-8") for x in v]
            return b"S" + struct.pack(f"<{len(raw) + 1}I", len(raw), *map(len, raw)) + b"".join(raw)
        if kinds == {float}:
            return b"F" + struct.pack(f"<I{len(v)}d", len(v), *v)
        if kinds == {bool}:
            return b"T" + struct.pack("<I", len(v)) + bytes(v)
    raise TypeError(f"message field {key!r}: a {kind.__name__} has no encoding (bytes, str, int or a list)")


def decode_message(raw) -> dict:
    """The message :func:`encode_message` encoded (TypeError naming what is wrong when ``raw`` is not one).

    Every length is checked against the bytes left before it is used, so a message cannot make the
    reader run past its end or allocate more than the message's own size."""
    if not isinstance(raw, (bytes, bytearray)):
        raise TypeError(f"the message is a {type(raw).__name__}, not bytes")
    buf = bytes(raw)
    end = len(buf)
    if end < 6 or buf[:4] != MESSAGE_MAGIC:
        raise TypeError("malformed message: not a privfed secure-aggregation message (bad header)")
    (count,) = struct.unpack_from("<H", buf, 4)
    at, out = 6, {}
    for _ in range(count):
        if at >= end:
            raise TypeError("malformed message: fewer fields than its header counts")
        n = buf[at]
        key_end = at + 1 + n
        if key_end + 1 > end:
            raise TypeError("malformed message: a field name runs past its end")
        try:
            key = buf[at + 1 : key_end].decode("ascii")
        except UnicodeDecodeError:
            raise TypeError("malformed message: a field name that is not ASCII") from None
        if not key or key in out:
            raise TypeError(f"malformed message: an empty or repeated field name {key!r}")
        tag, at = buf[key_end], key_end + 1
        if tag in (0x69, 0x66):  # "i", "f"
            if at + 8 > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            (out[key],) = struct.unpack_from("<q" if tag == 0x69 else "<d", buf, at)
            at += 8
            continue
        if tag == 0x74:  # "t"
            if at + 1 > end or buf[at] > 1:
                raise TypeError(f"malformed message: field {key!r} is not a bool")
            out[key] = buf[at] == 1
            at += 1
            continue
        if at + 4 > end:
            raise TypeError(f"malformed message: field {key!r} runs past its end")
        (size,) = struct.unpack_from("<I", buf, at)
        at += 4
        if tag in (0x62, 0x73):  # "b", "s"
            if at + size > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            value = buf[at : at + size]
            at += size
            if tag == 0x73:
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise TypeError(f"malformed message: field {key!r} is not UTF-8 text") from None
            out[key] = value
        elif tag == 0x48:  # "H"
            if at + 2 * size > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            out[key] = list(struct.unpack_from(f"<{size}H", buf, at))
            at += 2 * size
        elif tag == 0x45:  # "E"
            if at + 4 > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            (width,) = struct.unpack_from("<I", buf, at)
            at += 4
            if width == 0 or at + size * width > end:  # a width of 0 would let a count allocate
                raise TypeError(f"malformed message: field {key!r} runs past its end or has no width")
            out[key] = [buf[a : a + width] for a in range(at, at + size * width, width)]
            at += size * width
        elif tag in (0x49, 0x46):  # "I", "F"
            if at + 8 * size > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            out[key] = list(struct.unpack_from(f"<{size}{'q' if tag == 0x49 else 'd'}", buf, at))
            at += 8 * size
        elif tag == 0x54:  # "T"
            if at + size > end or any(b > 1 for b in buf[at : at + size]):
                raise TypeError(f"malformed message: field {key!r} is not a list of bools")
            out[key] = [b == 1 for b in buf[at : at + size]]
            at += size
        elif tag in (0x42, 0x53):  # "B", "S"
            if at + 4 * size > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            lengths = struct.unpack_from(f"<{size}I", buf, at)
            at += 4 * size
            if at + sum(lengths) > end:
                raise TypeError(f"malformed message: field {key!r} runs past its end")
            items = []
            for n in lengths:
                items.append(buf[at : at + n])
                at += n
            if tag == 0x53:
                try:
                    items = [x.decode("utf-8") for x in items]
                except UnicodeDecodeError:
                    raise TypeError(
                        f"malformed message: field {key!r} holds text that is not UTF-8"
                    ) from None
            out[key] = items
        else:
            raise TypeError(f"malformed message: field {key!r} has an unknown type tag {bytes((tag,))!r}")
    if at != end:
        raise TypeError(f"malformed message: {end - at} byte(s) after its last field")
    return out
