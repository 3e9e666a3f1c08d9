"""FedCOFOracle aggregation (placeholder while the implementation lands)."""

from __future__ import annotations

from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats


@register
class FedCOFOracle(Method):
    name = "fedcof-oracle"
    requires = frozenset({"counts", "sums", "class_second"})
    per_client = False
    defaults: dict = {"gamma": 1.0, "solver": "pinv", "normalise": True}

    def aggregate(self, stats: ClientStats):
        raise NotImplementedError("fedcof-oracle is not implemented yet")

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * (d + d * d)
