"""Public bounds a node applies to what the server sends: fixed by the operator's roster, never by the server.

A node's checks must not read a knob the server turns: a refusal that depends on the node's data and on
a value the server may vary is an oracle (ask again with another value, learn a bit each time).  So the
numbers the checks compare with are the roster's:

* ``max_records`` -- the most records one node holds: FedCOF's round-2 broadcast may claim at most
  K * max_records records of a class (N_c), which bounds the class weights the server can set;
* ``means_per_node`` -- FedCOF's means per node (multi-mean sampling): at most K * means_per_node means
  of a class (K_c);
* ``weight_ratio`` -- the most FedCOF's round-2 class weights w_c = (N_c - 1)/(K_c - 1) may differ: a
  broadcast whose largest weight is more than ``weight_ratio`` times its smallest is refused, which bounds
  how far the server can tilt the round-2 sum toward one class (:meth:`PublicBounds.fedcof_tilt`).  Honest
  weights are about a class's records per holding node, so the default, 2^10, admits honest runs whose
  classes' records per holder differ up to a thousandfold; from ``max_records`` alone an honest weight can
  reach 2 max_records - 1 (N_c <= K_c max_records);
* ``frac_bits`` -- the fixed-point fractional bits of every masked statistic: a run config asking for
  others is refused (the server could otherwise dial the ring-overflow rule).

The operator sets them when it writes the roster (``python -m mechanisms.secagg.identity ...
--max-records N --means-per-node M --max-weight-ratio R --frac-bits F``); a roster that names none has
:data:`DEFAULTS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from privfed.errors import ConfigError

__all__ = ["DEFAULTS", "PublicBounds"]


@dataclass(frozen=True)
class PublicBounds:
    """The roster's public bounds (see the module docstring)."""

    max_records: int = 1 << 20
    means_per_node: int = 1
    frac_bits: int = 32
    weight_ratio: int = 1 << 10

    def __post_init__(self) -> None:
        for name, low in (("max_records", 1), ("means_per_node", 1), ("weight_ratio", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"roster bound {name}={v!r} must be an integer >= {low}")
        f = self.frac_bits
        if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f <= 53:
            raise ConfigError(f"roster bound frac_bits={f!r} must be an integer in [0, 53]")

    def max_count(self, num_nodes: int) -> int:
        """The largest N_c a broadcast may claim: K * max_records."""
        return int(num_nodes) * self.max_records

    def max_means(self, num_nodes: int) -> int:
        """The largest K_c a broadcast may claim: K * means_per_node."""
        return int(num_nodes) * self.means_per_node

    def fedcof_tilt(self) -> int:
        """How many times one class's round-2 weight can exceed another's in a broadcast the nodes accept:
        the roster's ``weight_ratio``, or 2 max_records - 1 if smaller (every weight is at least 1, and at
        most (K_c max_records - 1)/(K_c - 1) <= 2 max_records - 1 once N_c <= K_c max_records)."""
        return min(self.weight_ratio, max(2 * self.max_records - 1, 1))

    @property
    def is_default(self) -> bool:
        return self == DEFAULTS

    def as_dict(self) -> dict[str, int]:
        return {
            "max_records": self.max_records,
            "means_per_node": self.means_per_node,
            "frac_bits": self.frac_bits,
            "weight_ratio": self.weight_ratio,
        }

    @classmethod
    def from_dict(cls, raw: Any, source: str = "roster") -> PublicBounds:
        if raw is None:
            return DEFAULTS
        if not isinstance(raw, dict) or set(raw) - {
            "max_records",
            "means_per_node",
            "frac_bits",
            "weight_ratio",
        }:
            raise ConfigError(
                f"{source}: bounds must be an object with max_records, means_per_node, frac_bits and "
                f"weight_ratio, got {raw!r}"
            )
        return cls(**raw)


#: The bounds of a roster that names none.
DEFAULTS = PublicBounds()
