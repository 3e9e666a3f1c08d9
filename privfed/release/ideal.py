"""The ideal functionality of secure aggregation: the server learns the sum and nothing else.

:class:`IdealSecureSum` is a protection for analyses, not for deployment: it
hands the server exactly the sum of the uploads, as a secure-aggregation
protocol does when it succeeds, without running one (no keys, no masks, no
bytes).  The attacks' view (``ServerView.from_federation(..., secure_agg=True)``)
runs the release plan with it so that the server's view under secure
aggregation comes from the same release as every other view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["IdealSecureSum"]


@dataclass
class _Run:
    calls: list[dict] = field(default_factory=list)

    def __call__(self, stack: np.ndarray) -> np.ndarray:
        stack = np.asarray(stack, dtype=np.float64)
        K = int(stack.shape[0])
        self.calls.append(
            {
                "call": len(self.calls),
                "shape": tuple(stack.shape[1:]),
                "clients": K,
                "uploaded": K,
                "dropped_before_upload": [],
                "dropped_after_upload": [],
            }
        )
        return stack.sum(axis=0)


class IdealSecureSum:
    """Secure aggregation as its ideal functionality: every call returns the exact sum of its stack."""

    name = "ideal"
    noise = None
    key_seed = None
    threat_model = (
        "ideal functionality: the server learns only the sum of the uploads (no protocol is run); a per-class "
        "coordinate of the sum covers only the nodes holding that class, so a class one node alone holds is that "
        "node's statistic, read exactly without DP; only DP protects a class few nodes hold"
    )

    def __init__(self) -> None:
        self.last_run: _Run | None = None

    def secure_sum(self, rng: np.random.Generator) -> _Run:
        self.last_run = _Run()
        return self.last_run

    def report(self, method: Any, stats: Any) -> dict:
        calls = [] if self.last_run is None else list(self.last_run.calls)
        return {"protocol": self.name, "threat_model": self.threat_model, "calls": calls}
