"""The server's fold of node replies, and its one error for nodes that refused or failed a stage.

Used by the one-shot server (:mod:`privfed.flower.server_app`) and the multi-round one
(:mod:`privfed.flower.rounds`).
"""

from __future__ import annotations

from privfed.errors import ConfigError, InputError
from privfed.stats import ClientStats, StatsFold

__all__ = ["NodeFold", "node_errors"]


class NodeFold:
    """Folds node replies into what the method needs, one reply at a time.

    ``add(node, stats)`` checks the shape against the first reply and hands
    the reply to :class:`privfed.stats.StatsFold`, the fold ``privfed.fit``
    uses: a running total for sum-only methods (O(C d + d^2) memory whatever
    the number of nodes), or the (client, class) pairs for methods that need
    every client's statistics (O(M d + d^2)).  ``result()`` is the
    ClientStats the method aggregates.
    """

    def __init__(self, method) -> None:
        self.method = method
        self.keep = "pairs" if method.per_client else "total"
        self.shape: tuple[int, int] | None = None
        self.fields: frozenset[str] | None = None
        self.fold: StatsFold | None = None
        self.num_pairs = 0
        self.count = 0

    def add(self, key, stats: ClientStats) -> None:
        shape = (stats.num_classes, stats.dim)
        if self.shape is None:
            self.shape, self.fields = shape, stats.available
            self.fold = StatsFold(num_classes=shape[0], dim=shape[1], keep=self.keep)
        elif shape != self.shape or stats.available != self.fields:
            raise ConfigError(
                f"{key} sent statistics with C={shape[0]}, d={shape[1]} ({sorted(stats.available)}) but "
                f"earlier nodes sent C={self.shape[0]}, d={self.shape[1]} ({sorted(self.fields)}): every "
                "node must use the same backbone (d) and num-classes (C)"
            )
        self.num_pairs += stats.num_pairs()
        self.count += 1
        self.fold.add(stats, source=key)  # NaN/inf refused naming the node; a node folded once

    def result(self) -> ClientStats:
        if self.count == 0:
            raise InputError("no statistics arrived; nothing to aggregate")
        return self.fold.result()


def node_errors(errors: dict[int, str], failed: dict[int, str], stage: str) -> None:
    """Raise one ConfigError naming the nodes that refused (``errors``) or failed (``failed``) a stage."""
    if errors:
        items = sorted(errors.items())
        first = "; ".join(f"node {n}: {m}" for n, m in items[:3])
        raise ConfigError(f"{len(items)} node(s) refused the run at stage {stage!r}: {first}")
    if failed:
        items = sorted(failed.items())
        first = "; ".join(f"node {n}: {m.strip().splitlines()[-1] if m.strip() else m}" for n, m in items[:3])
        raise ConfigError(f"{len(items)} node(s) failed at stage {stage!r}: {first}")
