"""A masking message on Flower's wire: its arrays in an ArrayRecord, every other field encoded as one bytes
value (:func:`mechanisms.secagg.masking.messages.encode_message`) in one ConfigRecord.

Flower checks and frames every ConfigRecord field and list entry apart, which for the few dozen keys,
signatures, views and ids of a SecAgg+ stage cost more than the message's own work; one encoded value
costs one check.  :func:`from_records` reads what a peer chose: anything but a message is a TypeError
(the node's malformed-request refusal).
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from mechanisms.secagg.masking.messages import decode_message, encode_message
from privfed.flower.wire import arrays_record

__all__ = ["MESSAGE_KEY", "from_records", "to_records"]

#: The one value of a message's ``secagg`` ConfigRecord: the message's fields, encoded.
MESSAGE_KEY = "message"


def to_records(msg: dict) -> RecordDict:
    """A protocol message as Flower records: its arrays in an ArrayRecord, everything else encoded as one
    bytes value (:func:`mechanisms.secagg.masking.messages.encode_message`) in one ConfigRecord."""
    arrays = {k: v for k, v in msg.items() if isinstance(v, np.ndarray)}
    rest = {k: v for k, v in msg.items() if k not in arrays}
    rec = RecordDict({"secagg": ConfigRecord({MESSAGE_KEY: encode_message(rest)})})
    if arrays:
        rec["secagg-arrays"] = arrays_record(arrays)
    return rec


def from_records(content: RecordDict) -> dict:
    """The protocol message in ``content`` (inverse of :func:`to_records`; TypeError when it is malformed)."""
    rec = content["secagg"]
    if MESSAGE_KEY not in rec or len(rec.keys()) != 1:
        raise TypeError(f"the secagg record must hold one {MESSAGE_KEY!r} value and nothing else")
    out = decode_message(rec[MESSAGE_KEY])
    if "secagg-arrays" in content:
        arr = content["secagg-arrays"]
        if not isinstance(arr, ArrayRecord):
            raise TypeError(f"the message's arrays are a {type(arr).__name__}, not an ArrayRecord")
        for k in arr.keys():
            if k in out:
                raise TypeError(f"the message carries {k!r} twice (as a value and as an array)")
            try:
                out[k] = arr[k].numpy()
            except Exception as exc:  # np.load of bytes a peer chose: any failure is a malformed message
                raise TypeError(f"the message's array {k!r} cannot be read ({type(exc).__name__})") from None
    return out
