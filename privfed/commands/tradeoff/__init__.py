"""``python -m privfed.tradeoff``: privacy-utility(-attack) curves in one run.

Examples
--------
One budget on the embedded default (scikit-learn digits, offline): one row per
noise placement (each client noises its upload; clients add shares of the
noise under secure aggregation; a trusted aggregator adds it once) beside the
non-private accuracy::

    python -m privfed.tradeoff --method fedlog --eps 0.1

A sweep, written as a tidy CSV, a JSON with the resolved config and a PNG plot
(``--out``, default a fresh ``results/tradeoff-<methods>-eps<range>-<time>``)::

    python -m privfed.tradeoff --method fedcof,fed3r,fedlog --eps 0.05,0.1,0.5,1,4,inf --seeds 5

Every row names its trust model and guarantee: placement, protocol, level,
calibration, the delta used (0 for pure DP) and the epsilon the ledger
computes; heuristics without a guarantee (uniform count noise) show NO DP and
no epsilon.

Settings may also come from a TOML file (``--config sweep.toml``, keys named
like the flags, with underscores or dashes, e.g. ``count_noise = "laplace"``); flags
given on the command line override it, and file values pass the same checks.
The JSON written by a previous run is accepted as ``--config`` too, which
reruns it bit for bit.

Results are written atomically (temporary name, then rename); Ctrl-C and
SIGTERM keep the finished runs in ``results.partial.csv`` / ``.json`` (also
checkpointed every 30 s); ``manifest.json`` lists the files of the run.

``eps = inf`` means *no protection at all* (no clipping, no noise): its rows
equal the method's non-private accuracy exactly.

The package's modules, lowest first: :mod:`~privfed.commands.tradeoff.config` (the settings),
:mod:`~privfed.commands.tradeoff.plan` (placements, clip, seeds, the cost estimate),
:mod:`~privfed.commands.tradeoff.labels` (a row's words), :mod:`~privfed.commands.tradeoff.attack_columns`,
:mod:`~privfed.commands.tradeoff.sweep` (the grid run), :mod:`~privfed.commands.tradeoff.rounds` (``--rounds``: the
same rows from multi-round FedLog), :mod:`~privfed.commands.tradeoff.table` (records, summary, table, condensed
guarantees, CSV), :mod:`~privfed.commands.tradeoff.plot` and :mod:`~privfed.commands.tradeoff.cli`.  The names below are imported on
first use, so ``python -m privfed.tradeoff --help`` loads none of them.
"""

from __future__ import annotations

import importlib

__all__ = ["TradeoffConfig", "build_parser", "main", "run_tradeoff"]

#: public name -> the module of the package that defines it
_HOME = {
    "TradeoffConfig": "config",
    "PLACEMENTS": "config",
    "PLACEMENT_LABEL": "config",
    "resolve_config": "config",
    "digits_public_clip": "plan",
    "placement_variants": "plan",
    "sweep_cost_note": "plan",
    "data_rules": "plan",
    "SWEEP_FLOPS_PER_S": "plan",
    "SWEEP_NOISE_PER_S": "plan",
    "SWEEP_RUN_OVERHEAD_S": "plan",
    "repair_facts": "labels",
    "ATTACK_HEADLINE": "attack_columns",
    "STRONGEST_ATTACKS": "attack_columns",
    "run_tradeoff": "sweep",
    "RECORD_KEYS": "table",
    "TABLE_LEGEND": "table",
    "summarise": "table",
    "format_table": "table",
    "guarantee_lines": "table",
    "condense_guarantees": "table",
    "record_fields": "table",
    "write_csv": "table",
    "below_chance_line": "table",
    "data_line": "table",
    "CHANCE": "plot",
    "accuracy_axis": "plot",
    "eps_ticks": "plot",
    "tradeoff_rounds": "rounds",
    "plot_tradeoff": "plot",
    "plot_title": "plot",
    "PROG": "cli",
    "PARTIAL": "cli",
    "CHECKPOINT_S": "cli",
    "build_parser": "cli",
    "main": "cli",
}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'privfed.commands.tradeoff' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"privfed.commands.tradeoff.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
