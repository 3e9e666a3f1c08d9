"""FedLog aggregation (placeholder while the implementation lands)."""

from __future__ import annotations

from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats


@register
class FedLog(Method):
    name = "fedlog"
    requires = frozenset({"counts", "sums"})
    per_client = False
    defaults: dict = {"chi": 0.0, "nu": 1.0}

    def aggregate(self, stats: ClientStats):
        raise NotImplementedError("fedlog is not implemented yet")

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return K * ((d + 1) * C + 1)
