"""The contract every attack implements (attacking and scoring kept apart).

An attack declares ``requires``: the statistics (``counts``, ``sums``,
``second``, ``class_second``) and context (``per_client``, ``backbone``,
``public``, ``public_images``) it reads from a :class:`attacks.view.ServerView`;
:meth:`Attack.run` refuses a view without them, naming what is missing.
``run`` returns data (reconstructions, scores) and never sees the truth;
``score`` compares that data with a :class:`attacks.view.GroundTruth`
(breaching's ``reconstruct`` / ``analysis.report`` split).  ``evaluate`` does
both for the trade-off tables, building the challenge (e.g. which records
to trace) from the truth.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from attacks.view import GroundTruth, ServerView
from privfed.errors import ConfigError

__all__ = ["Attack"]


class Attack(abc.ABC):
    """Base class of attacks: parameters stored at construction, validated once."""

    name: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self.defaults)
        if unknown:
            allowed = ", ".join(sorted(self.defaults)) or "none"
            raise ConfigError(
                f"attack {self.name!r} got unknown parameter(s) {sorted(unknown)}; it accepts: {allowed}"
            )
        self.params: dict[str, Any] = {**self.defaults, **params}
        self._validate_params()

    def _validate_params(self) -> None:
        """Check ``self.params``; raise ConfigError naming the bad one."""

    def check(self, view: ServerView) -> None:
        """Refuse a view that lacks what this attack reads."""
        if not isinstance(view, ServerView):
            raise ConfigError(f"attack {self.name!r} needs a ServerView, got {type(view).__name__}")
        view.require(self.requires, self.name)

    @abc.abstractmethod
    def run(self, view: ServerView, rng: np.random.Generator, **inputs: Any) -> Any:
        """Attack the view; return data (no truth is read here)."""

    @abc.abstractmethod
    def score(self, result: Any, truth: GroundTruth) -> dict:
        """Metrics of ``result`` against the truth."""

    @abc.abstractmethod
    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        """Build the challenge from ``truth``, run, score: a flat dict of metrics."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"
