"""What an attack sweep needs before its first attack: its decoders, and how long it will take.

The inversion suite (:data:`attacks.strongest.SUITES`) reads decoders trained
on the public split: the feature decoder, and a set decoder for every number
of records n (2 to ``max_set``) a released cell holds where the counts are
exact.  :func:`plan_sweep` finds which ones the sweep's releases need (the
same releases and challenges the sweep draws, from the same seeds) and which
of them the cache already holds; :func:`cost_note` says before the sweep
starts how long it will take and why; :func:`train_decoders` trains the
missing ones first, each with its own progress bar, so that the sweep's bar
counts attacks only and its ETA does not swing when a decoder trains.

The time is an estimate from CPU rates measured on a 2-core machine
(``python experiments/attack_cost.py --record``: :data:`RATES`, one torch
thread); a busy machine takes longer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privfed.commands.attack.config import AttackConfig

__all__ = ["RATES", "SweepPlan", "cell_records", "cost_note", "plan_sweep", "train_decoders"]

#: CPU seconds on one torch thread, measured by ``python experiments/attack_cost.py --record``
#: (experiments/results/attack_cost.json; a test holds them equal): one training step of the feature
#: decoder and of the set decoder for means of n, the inversion suite per released cell (n records in
#: the cell: its joint searches grow with n), and the attack alone (pixel backend) per cell; the fixed
#: cost of training a decoder (its bank's features and validation set) by kind ("feature" or n), and the
#: choice of a new decoder's refinement on public simulations (once, at its first use).
RATES: dict[str, Any] = {
    "feature_step_s": 0.00254,
    "set_step_s": {
        "2": 0.011438,
        "3": 0.012591,
        "4": 0.013696,
        "5": 0.018341,
        "6": 0.016328,
        "7": 0.019129,
        "8": 0.020788,
    },
    "decoder_fixed_s": {
        "feature": 2.450318,
        "2": 0.914537,
        "3": 0.87039,
        "4": 0.954133,
        "5": 0.880376,
        "6": 1.023757,
        "7": 0.973615,
        "8": 0.939706,
    },
    "suite_cell_s": 0.0,
    "suite_cell_per_record_s": 0.885731,
    "attack_cell_s": 0.01795,
    "refinement_s": 7.158714,
}


@dataclass
class SweepPlan:
    """The decoders a sweep needs (``(kind, n)``: ``("feature", None)`` or ``("set", n)``) and its cost."""

    needed: list[tuple[str, int | None]] = field(default_factory=list)
    missing: list[tuple[str, int | None]] = field(default_factory=list)
    releases: int = 0
    cells: list[int] = field(default_factory=list)  # records per attacked cell, over every release
    train_s: float = 0.0
    attack_s: float = 0.0


def cell_records(view, truth, cells) -> np.ndarray:
    """The number of private records in each attacked cell (row, class) of ``view``."""
    rows, classes = cells
    C = view.num_classes
    keep = truth.clients >= 0
    if view.per_client:
        n = np.bincount(truth.clients[keep] * C + truth.labels[keep], minlength=view.stats.num_clients * C)
        return n.reshape(-1, C)[rows, classes]
    return np.bincount(truth.labels[keep], minlength=C)[classes]


def _decoder_config(cfg: AttackConfig):
    import attacks

    common = {k: v for k, v in cfg.attack_params.items() if k not in ("backend", "source")}
    att = attacks.get("inversion", **common)
    return att, att.decoder_config()


def plan_sweep(cfg: AttackConfig, sweep: list[tuple], build) -> SweepPlan:
    """The decoders and the time the sweep needs.

    ``sweep`` is the sweep's (method, eps, n, seed) runs; ``build(run) -> (view, truth, challenge)`` draws
    a run's release and challenge exactly as the sweep will (its seeds).
    """
    from attacks.inversion.decoders import decoder_cached
    from attacks.strongest import SUITES

    plan = SweepPlan(releases=len(sweep))
    inversion = cfg.attack == "inversion"
    if not (inversion and cfg.strongest):  # nothing to train, and the attack alone answers in seconds
        return plan
    att, dcfg = _decoder_config(cfg) if inversion else (None, None)
    set_ns: set[int] = set()
    for run in sweep:
        view, truth, challenge = build(run)
        n = cell_records(view, truth, challenge.get("cells", (np.zeros(0, int), np.zeros(0, int))))
        plan.cells += [int(v) for v in n]
        exact = view.noise.count_kind is None and view.noise.sigma.get("counts", 0.0) <= 0.25
        if inversion and cfg.strongest and exact:
            set_ns |= {int(v) for v in n if 2 <= v <= int(att.params["max_set"])}
    if inversion and cfg.strongest:
        plan.needed = [("feature", None), *(("set", k) for k in sorted(set_ns))]
        bb, public, C = build.context
        plan.missing = [d for d in plan.needed if not decoder_cached(bb, public, C, dcfg, d[1])]
        from attacks.inversion.training import TYPICAL_STOP

        for kind, n in plan.missing:
            steps = TYPICAL_STOP[f"{kind}-decoder"] if dcfg == type(dcfg)() else dcfg.feature_steps
            rate = RATES["feature_step_s"] if kind == "feature" else RATES["set_step_s"].get(str(n), 0.0)
            fixed = RATES["decoder_fixed_s"].get("feature" if kind == "feature" else str(n), 0.0)
            plan.train_s += (
                steps * rate + fixed + RATES["refinement_s"]
            )  # its refinement, chosen at first use
    per_cell = (
        [RATES["suite_cell_s"] + RATES["suite_cell_per_record_s"] * n for n in plan.cells]
        if cfg.strongest and cfg.attack in SUITES and inversion
        else [RATES["attack_cell_s"]] * len(plan.cells)
    )
    plan.attack_s = float(sum(per_cell))
    return plan


def _minutes(s: float) -> str:
    return f"{max(1, round(s / 60))} minute" + ("s" if round(s / 60) > 1 else "")


def cost_note(cfg: AttackConfig, plan: SweepPlan) -> str | None:
    """One line saying, before the sweep starts, how long it will take and why (None when it is quick)."""
    total = plan.train_s + plan.attack_s
    if total < 120 or not math.isfinite(total):
        return None
    parts = []
    if plan.missing:
        names = ", ".join("the feature decoder" if k == "feature" else f"n={n}" for k, n in plan.missing)
        sets = sum(k == "set" for k, _ in plan.missing)
        what = names if not sets else names.replace(", n=", ", set decoders for n=", 1)
        parts.append(
            f"it first trains {len(plan.missing)} decoder(s) on the public split ({what}; about "
            f"{_minutes(plan.train_s)}, once: they are cached)"
        )
    if cfg.strongest:
        parts.append(
            f"then runs the {cfg.attack} suite of attacks on {len(plan.cells)} cell(s) of {plan.releases} "
            f"release(s) (about {_minutes(plan.attack_s)})"
        )
    return (
        f"this sweep takes about {_minutes(total)} of computing on one core (a busy machine takes longer): "
        + "; ".join(parts)
        + ". --no-strongest runs the chosen attack alone"
        + (f" (about {_minutes(RATES['attack_cell_s'] * len(plan.cells))})" if RATES["attack_cell_s"] else "")
    )


def train_decoders(cfg: AttackConfig, plan: SweepPlan, backbone, public, num_classes: int) -> None:
    """Train the missing decoders now, in the order the suite needs them (each with its own bar)."""
    from attacks.inversion.learned import feature_decoder, set_decoder

    if not plan.missing:  # another attack's parameters are no inversion's (they would be refused as such)
        return
    _, dcfg = _decoder_config(cfg)
    for kind, n in plan.missing:
        if kind == "feature":
            feature_decoder(backbone, public, num_classes, dcfg)
        else:
            set_decoder(backbone, public, num_classes, int(n), dcfg)
