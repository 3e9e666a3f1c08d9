"""Notes that carry the fact they state: text a person reads, and a kind and count a program reads.

A :class:`Note` is a ``str`` (heads, reports and results keep lists of notes
that people read) that also says, as data, what it records: ``kind`` (one of
:data:`KINDS`) and ``count``.  Tables and summaries read those fields; they
never parse the text.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["KINDS", "Note", "repairs"]

#: The facts notes carry.
KINDS = (
    "dropped_pairs",  # (client, class) pairs left out by a drop rule (FedCOF App. I.1)
    "clipped_counts",  # noisy counts clipped to 0 and not sent (count noise)
    "psd_projection",  # negative eigenvalues raised to 0
    "pseudo_inverse",  # a singular system solved with the pseudo-inverse
)


class Note(str):
    """A note's text, with the fact it states (``kind``, ``count``)."""

    kind: str = ""
    count: int = 0

    def __new__(cls, text: str, kind: str = "", count: int = 0) -> Note:
        if kind and kind not in KINDS:
            raise ValueError(f"note kind must be one of {KINDS}, got {kind!r}")
        out = super().__new__(cls, text)
        out.kind, out.count = kind, int(count)
        return out


def repairs(notes: Iterable[str]) -> tuple[int | None, list[str]]:
    """(pairs dropped or counts clipped, other repairs made) from the facts the notes carry."""
    dropped = None
    kinds: list[str] = []
    for n in notes:
        kind = getattr(n, "kind", "")
        if kind in ("dropped_pairs", "clipped_counts"):
            dropped = (dropped or 0) + n.count
        elif kind == "psd_projection" and "PSD projection" not in kinds:
            kinds.append("PSD projection")
        elif kind == "pseudo_inverse" and "pseudo-inverse" not in kinds:
            kinds.append("pseudo-inverse")
    return dropped, kinds
