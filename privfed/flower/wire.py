"""Statistics on Flower messages: ClientStats <-> ArrayRecord, and bytes on the wire.

Arrays travel as float64 (``fit`` counts uploads at 4 bytes a float; the
Flower app keeps full precision so that its head equals ``fit``'s to
1e-9).  :func:`record_bytes` counts the payload Flower serialises for a
record dict: every array's buffer and every config value (Flower's own
``count_bytes``).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from privfed.errors import InputError
from privfed.stats import STAT_FIELDS, ClientStats

__all__ = ["arrays_record", "record_bytes", "stats_from_record", "stats_record"]


def arrays_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of named numpy arrays (copied into Flower's buffers)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def stats_record(stats: ClientStats) -> ArrayRecord:
    """One node's statistics (K = 1 row, or its pseudo-client rows) as an ArrayRecord."""
    arrays = dict(stats.arrays())
    if stats.owners is not None:
        arrays["owners"] = np.asarray(stats.owners, dtype=np.int64)
    return arrays_record(arrays)


def stats_from_record(record: ArrayRecord, where: str) -> ClientStats:
    """The ClientStats in a reply (InputError naming the node when malformed)."""
    try:
        arrays = {k: record[k].numpy() for k in record.keys()}
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a malformed reply
        raise InputError(f"{where}: unreadable statistics ({exc})") from None
    unknown = set(arrays) - set(STAT_FIELDS) - {"owners"}
    if unknown or "counts" not in arrays or "sums" not in arrays:
        raise InputError(f"{where}: malformed statistics with arrays {sorted(arrays)}")
    owners = arrays.pop("owners", None)
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
