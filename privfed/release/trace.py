"""What one release did, as data: a record per stage and what the server received.

A :class:`ReleaseTrace` is written by the stages of a
:class:`~privfed.release.plan.ReleasePlan` as they run, and read by
everyone who needs to know what happened: the head's report, the auditor
(which compares the traces of neighbouring datasets), the attacks (which
read :meth:`ReleaseTrace.server_view`, never a rebuilt copy of the release)
and the results writers (:meth:`ReleaseTrace.to_dict`).

Each :class:`StageRecord` says what a stage did: the clients that went in
and came out, the bound or sigma it applied, where its randomness came from
(``"none"``, ``"os-entropy"``, ``"seeded"``), and the privacy events it
booked (the accountant composes those, see :mod:`mechanisms.dp.accounting`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from privfed.stats import ClientStats

__all__ = ["RANDOMNESS", "ReleaseTrace", "ServerReceived", "StageRecord"]

#: Where a stage's randomness came from.
RANDOMNESS = ("none", "os-entropy", "seeded")

#: What the server received, by kind.
RECEIVED_KINDS = (
    "uploads",  # every client's own (possibly noised) statistics
    "sum",  # the plain sum the server formed itself from the uploads (it saw the uploads too)
    "noisy-sum",  # a trusted aggregator's noisy sum: the server learns only this
    "secure-sums",  # the outputs of a secure-sum protocol (one array per summed statistic)
    "not-kept",  # a streamed release whose uploads were folded without being kept
)


@dataclass(frozen=True)
class StageRecord:
    """One stage of a release, after it ran.

    Attributes
    ----------
    stage : str
        The stage's name (``"clip"``, ``"statistics"``, ``"client-release"``,
        ``"secure-sum"``, ``"sum"``, ``"central-noise"``, ``"method"``, ...).
    detail : str
        One line a person can read: what the stage did.
    clients_in, clients_out : int or None
        Clients (rows) that entered and left the stage.
    randomness : str
        ``"none"``, ``"os-entropy"`` or ``"seeded"`` (see :data:`RANDOMNESS`).
    values : dict
        The numbers the stage applied (bound, sigma per block, bytes, ...),
        plain JSON-able values.
    events : tuple of dict
        The privacy events the stage booked (as :class:`mechanisms.dp.ledger.ReleaseEvent` dicts).
    """

    stage: str
    detail: str
    clients_in: int | None = None
    clients_out: int | None = None
    randomness: str = "none"
    values: dict[str, Any] = field(default_factory=dict)
    events: tuple[dict, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["events"] = [dict(e) for e in self.events]
        return out


@dataclass(frozen=True, eq=False)
class ServerReceived:
    """What the server received in one release.

    Attributes
    ----------
    kind : str
        One of :data:`RECEIVED_KINDS`.
    stats : ClientStats or None
        ``"uploads"``: every client's upload (K rows); ``"sum"`` and
        ``"noisy-sum"``: the sum (one row); otherwise ``None``.
    arrays : tuple of ndarray
        ``"secure-sums"``: each output of the protocol, in the order the
        method asked for them.
    """

    kind: str
    stats: ClientStats | None = None
    arrays: tuple[np.ndarray, ...] = ()

    def values(self) -> list[np.ndarray]:
        """Every array the server received, in a fixed order (for audits)."""
        if self.stats is not None:
            return list(self.stats.arrays().values())
        return list(self.arrays)


class ReleaseTrace:
    """The records of one release, in the order its stages ran."""

    def __init__(self, plan_name: str) -> None:
        self.plan = plan_name
        self.records: list[StageRecord] = []
        self._received: ServerReceived | None = None
        self._released: ServerReceived | None = None

    def record(self, stage: str, detail: str, **kw: Any) -> StageRecord:
        if kw.get("randomness", "none") not in RANDOMNESS:
            raise ValueError(f"randomness must be one of {RANDOMNESS}, got {kw['randomness']!r}")
        rec = StageRecord(stage=stage, detail=detail, **kw)
        self.records.append(rec)
        return rec

    def received(self, kind: str, *, stats: ClientStats | None = None, arrays=()) -> None:
        """Set what the server received (the last stage that hands data to the server calls this)."""
        if kind not in RECEIVED_KINDS:
            raise ValueError(f"kind must be one of {RECEIVED_KINDS}, got {kind!r}")
        self._received = ServerReceived(kind, stats, tuple(np.asarray(a) for a in arrays))

    def add_sum_output(self, array: np.ndarray) -> None:
        """Append one secure-sum output to what the server received."""
        prev = (
            self._received.arrays
            if self._received is not None and self._received.kind == "secure-sums"
            else ()
        )
        self._received = ServerReceived("secure-sums", None, (*prev, np.array(array, dtype=np.float64)))

    def released(self, stats: ClientStats) -> None:
        """Set what leaves a trusted aggregator (its noisy sum), where that differs from what it received."""
        self._released = ServerReceived("noisy-sum", stats)

    def server_view(self) -> ServerReceived:
        """What the server received (an attack's input): with a trusted aggregator, the uploads it noises."""
        if self._received is None:
            return ServerReceived("not-kept")
        return self._received

    def release_view(self) -> ServerReceived:
        """What anyone outside the server sees: a trusted aggregator's noisy sum, else :meth:`server_view`.

        The auditor's input: a guarantee with central noise protects the release, not the aggregator's inputs.
        """
        return self._released if self._released is not None else self.server_view()

    def stage(self, name: str) -> StageRecord:
        """The record of the named stage (the last one, if it ran more than once)."""
        for rec in reversed(self.records):
            if rec.stage == name:
                return rec
        raise KeyError(f"no stage {name!r} in this release; stages: {[r.stage for r in self.records]}")

    @property
    def events(self) -> tuple[dict, ...]:
        """Every privacy event the release booked, in order."""
        return tuple(e for r in self.records for e in r.events)

    @property
    def randomness(self) -> str:
        """``"seeded"`` if any stage drew from a seed, else ``"os-entropy"`` if any drew, else ``"none"``."""
        kinds = {r.randomness for r in self.records}
        return "seeded" if "seeded" in kinds else "os-entropy" if "os-entropy" in kinds else "none"

    def to_dict(self) -> dict[str, Any]:
        view = self.server_view()
        return {
            "plan": self.plan,
            "randomness": self.randomness,
            "stages": [r.to_dict() for r in self.records],
            "server_received": view.kind,
            "released": self.release_view().kind,
        }

    def describe(self) -> str:
        """The release, a line a stage."""
        return "\n".join(f"{i + 1}. {r.stage}: {r.detail}" for i, r in enumerate(self.records))

    def __repr__(self) -> str:
        return f"ReleaseTrace({self.plan!r}, stages={[r.stage for r in self.records]})"
