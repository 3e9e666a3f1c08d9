"""Statistics on Flower messages: ClientStats <-> ArrayRecord, and bytes on the wire.

A node's one-row upload can travel compactly (:func:`stats_record` with
``held_only`` / ``dtype``): only the rows of the classes it holds, with
their indices (``classes``, int32), and values in float32 -- the layout
``fit``'s byte model counts (4 bytes a float over the M (client, class)
pairs with data).  Under DP every class is sent (zeros noised too, as in
``fit``), so the shapes never depend on the data.  The default stays
float64 and dense, so that the head equals ``fit``'s to 1e-9; float32
rounds every value to 2^-24 relative (the counts, integers below 2^24, are
exact without DP).  :func:`record_bytes` counts the payload Flower
serialises for a record dict: every array's buffer and every config value
(Flower's own ``count_bytes``).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from privfed.errors import InputError
from privfed.stats import STAT_FIELDS, ClientStats

__all__ = ["arrays_record", "payload_bytes", "record_bytes", "stats_from_record", "stats_record"]


def arrays_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of named numpy arrays (copied into Flower's buffers)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


#: Statistics with a class axis after the client axis (sent row by row when ``held_only``).
_PER_CLASS = ("counts", "sums", "class_second")


def stats_record(stats: ClientStats, *, held_only: bool = False, dtype=np.float64) -> ArrayRecord:
    """One node's statistics (K = 1 row, or its pseudo-client rows) as an ArrayRecord.

    ``held_only`` (one-row uploads without DP): only the classes with data,
    their indices in ``classes``; ``dtype`` the values' type on the wire.
    """
    arrays = dict(stats.arrays())
    if held_only and stats.num_clients == 1 and stats.owners is None:
        held = np.flatnonzero(stats.counts[0] > 0)
        arrays = {k: (v[0, held] if k in _PER_CLASS else v[0]) for k, v in arrays.items()}
        arrays["classes"] = held.astype(np.int32)
    arrays = {k: (v.astype(dtype) if k != "classes" else v) for k, v in arrays.items()}
    if stats.owners is not None:
        arrays["owners"] = np.asarray(stats.owners, dtype=np.int64)
    return arrays_record(arrays)


def payload_bytes(record: ArrayRecord) -> dict[str, int]:
    """Bytes of each array's values in a statistics record (the buffers, without Flower's framing)."""
    return {k: int(record[k].numpy().nbytes) for k in record.keys()}


def stats_from_record(record: ArrayRecord, where: str, num_classes: int | None = None) -> ClientStats:
    """The ClientStats in a reply (InputError naming the node when malformed), as float64.

    A held-classes-only reply (``classes``) is spread back over ``num_classes`` classes.
    """
    try:
        arrays = {k: record[k].numpy() for k in record.keys()}
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a malformed reply
        raise InputError(f"{where}: unreadable statistics ({exc})") from None
    unknown = set(arrays) - set(STAT_FIELDS) - {"owners", "classes"}
    if unknown or "counts" not in arrays or "sums" not in arrays:
        raise InputError(f"{where}: malformed statistics with arrays {sorted(arrays)}")
    owners = arrays.pop("owners", None)
    classes = arrays.pop("classes", None)
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    if classes is not None:
        C = num_classes
        M = arrays["counts"].shape[0] if arrays["counts"].ndim == 1 else -1
        if (
            C is None
            or classes.ndim != 1
            or classes.size != M
            or (M and (classes.min() < 0 or classes.max() >= C))
            or np.unique(classes).size != classes.size
        ):
            raise InputError(
                f"{where}: malformed held-classes statistics (classes {classes.tolist()[:10]}, C={C})"
            )
        dense = {}
        for k, v in arrays.items():
            if k in _PER_CLASS:
                out = np.zeros((1, C) + v.shape[1:])
                out[0, classes] = v
                dense[k] = out
            else:
                dense[k] = v[None]
        arrays = dense
    return ClientStats(**arrays, owners=None if owners is None else np.zeros_like(owners))


def record_bytes(content: RecordDict) -> int:
    """Payload bytes of a record dict as Flower counts them (arrays, config values, keys)."""
    total = 0
    for rec in content.values():
        total += int(rec.count_bytes())
    return total


def config_record(values: dict) -> ConfigRecord:
    """A ConfigRecord of str / int / float / bool / bytes values (``None`` dropped)."""
    return ConfigRecord({k: v for k, v in values.items() if v is not None})


def round_index(info) -> int:
    """The round index of a ``query.round`` request's ``round`` record: an int >= 0 (text, bytes, a float or a
    bool is a malformed request, never read as a round)."""
    from mechanisms.secagg.crypto import ProtocolAbort

    value = info["index"]
    if type(value) is not int or value < 0:
        raise ProtocolAbort(
            f"malformed request: the round index must be an integer >= 0, got {value!r}",
            stage="round",
            deviation="malformed",
        )
    return value
