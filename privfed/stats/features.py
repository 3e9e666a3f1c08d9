"""Features kept by reference, so per-client second moments are built only when asked for."""

from __future__ import annotations

import numpy as np

from privfed.stats.algebra import group_second_moments
from privfed.stats.arrays import check_dense

__all__ = ["FeatureRows"]


class FeatureRows:
    """Features kept by reference to build per-client second moments on first access."""

    def __init__(
        self, F: np.ndarray, client: np.ndarray, label: np.ndarray, weight: np.ndarray | None = None
    ) -> None:
        # ``weight`` (one per client, >= 0): the second moments are those of sqrt(w_k) f, i.e. w_k G_k.
        self.F, self.client, self.label, self.weight = F, client, label, weight

    def _rows(self) -> np.ndarray:
        if self.weight is None:
            return self.F
        return np.asarray(self.F, dtype=np.float64) * np.sqrt(self.weight)[self.client, None]

    def second(self, K: int) -> np.ndarray:
        check_dense("second", (K, self.F.shape[1], self.F.shape[1]))
        return group_second_moments(self._rows(), self.client, K)

    def class_second(self, K: int, C: int) -> np.ndarray:
        d = self.F.shape[1]
        check_dense("class_second", (K, C, d, d))
        return group_second_moments(self._rows(), self.client * C + self.label, K * C).reshape(K, C, d, d)

    def scaled(self, weights: np.ndarray) -> FeatureRows:
        """The same features with client k's second moments multiplied by ``weights[k]``."""
        w = np.asarray(weights, dtype=np.float64)
        return FeatureRows(self.F, self.client, self.label, w if self.weight is None else self.weight * w)

    def subset(self, rows: np.ndarray) -> FeatureRows:
        """Features of clients ``rows`` (distinct), renumbered 0..len(rows)-1."""
        new = np.full(int(max(self.client.max(initial=-1), rows.max(initial=-1))) + 1, -1, dtype=np.int64)
        new[rows] = np.arange(rows.size)
        keep = new[self.client] >= 0
        weight = None if self.weight is None else self.weight[rows]
        return FeatureRows(self.F[keep], new[self.client[keep]], self.label[keep], weight)

    def merged(self) -> FeatureRows:
        if self.weight is not None:  # one client: fold the weights into the rows
            return FeatureRows(self._rows(), np.zeros_like(self.client), self.label)
        return FeatureRows(self.F, np.zeros_like(self.client), self.label)
