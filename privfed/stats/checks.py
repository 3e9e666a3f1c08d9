"""Validation at the door: an upload holding NaN or inf is refused, naming who sent it and where."""

from __future__ import annotations

import numpy as np

from privfed.errors import InputError
from privfed.stats.client_stats import ClientStats

__all__ = ["check_upload_finite", "first_bad"]


def first_bad(a: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN / inf of ``a`` (checked block by block), or None."""
    if a is None or a.size == 0:
        return None
    flat = a.reshape(-1)
    step = 1 << 21
    for s in range(0, flat.size, step):
        bad = ~np.isfinite(flat[s : s + step])
        if bad.any():
            return tuple(int(j) for j in np.unravel_index(s + int(np.flatnonzero(bad)[0]), a.shape))
    return None


def check_upload_finite(
    chunk: ClientStats, where: str, ids: list | None, instead: str = "being folded into the head"
) -> None:
    """Refuse a chunk holding NaN / inf, naming the sender, the client, the statistic and the class (``instead``:
    what would have been done with it)."""

    def who(row: int) -> str:
        owner = row if chunk._owners is None else int(chunk._owners[row])
        return f"client {ids[owner]!r}" if ids is not None else f"client {owner} of {where}"

    def refuse(stat: str, row: int | None, cls: int | None, value) -> None:
        at = (f" from {who(row)}" if row is not None else "") + (f", class {cls}" if cls is not None else "")
        raise InputError(
            f"{where}: statistic {stat!r}{at} holds {float(value)!r}; NaN/inf is not a statistic "
            f"(a corrupt or overflowed upload), so it is refused instead of {instead}"
        )

    for stat, arr in (("counts", chunk._counts), ("sums", chunk._sums)):
        i = first_bad(arr)
        if i is not None:
            refuse(stat, i[0], i[1], arr[i])
    if chunk._pairs is not None and chunk._sums is None:  # the pairs hold the sums (counts may be cached)
        pc, pk, n, S = chunk._pairs
        i = first_bad(n)
        if i is not None:
            refuse("counts", int(pc[i[0]]), int(pk[i[0]]), n[i])
        i = first_bad(S)
        if i is not None:
            p = i[0] if chunk._sum_rows is None else int(np.flatnonzero(chunk._sum_rows == i[0])[0])
            refuse("sums", int(pc[p]), int(pk[p]), S[i])
    for stat, arr in (("second", chunk._second), ("class_second", chunk._class_second)):
        i = first_bad(arr)
        if i is not None:
            refuse(stat, i[0], i[1] if stat == "class_second" else None, arr[i])
    i = first_bad(chunk._gram)
    if i is not None:
        refuse("second (summed)", None, None, chunk._gram[i])
