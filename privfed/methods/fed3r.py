"""Fed3R aggregation (placeholder while the implementation lands)."""

from __future__ import annotations

from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats


@register
class Fed3R(Method):
    name = "fed3r"
    requires = frozenset({"counts", "sums", "second"})
    per_client = False
    defaults: dict = {"lam": 0.01, "bias": True, "normalise": True}

    def aggregate(self, stats: ClientStats):
        raise NotImplementedError("fed3r is not implemented yet")

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * d + K * d * d
