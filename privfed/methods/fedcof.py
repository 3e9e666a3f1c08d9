"""FedCOF aggregation (placeholder while the implementation lands)."""

from __future__ import annotations

from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats


@register
class FedCOF(Method):
    name = "fedcof"
    requires = frozenset({"counts", "sums"})
    per_client = True
    defaults: dict = {"gamma": 1.0, "means_per_client": 1, "solver": "pinv", "normalise": True, "noise_var": 0.0}

    def aggregate(self, stats: ClientStats):
        raise NotImplementedError("fedcof is not implemented yet")

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * d
