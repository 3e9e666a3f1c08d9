"""FedCGS aggregation (placeholder while the implementation lands)."""

from __future__ import annotations

from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats


@register
class FedCGS(Method):
    name = "fedcgs"
    requires = frozenset({"counts", "sums", "second"})
    per_client = False
    defaults: dict = {"covariance": "total", "shrinkage": 1e-6}

    def aggregate(self, stats: ClientStats):
        raise NotImplementedError("fedcgs is not implemented yet")

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return K * ((C + d) * d + C)
