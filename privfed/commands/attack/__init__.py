"""The attack command (``python -m privfed.attack``): what a curious server recovers, next to the budget.

Its modules, lowest first: :mod:`~privfed.commands.attack.config` (the resolved configuration),
:mod:`~privfed.commands.attack.prepare` (what a sweep needs first: decoders, and how long it will
take), :mod:`~privfed.commands.attack.run` (the runs), :mod:`~privfed.commands.attack.report` (the inversion grid figure and a row's summary line)
and :mod:`~privfed.commands.attack.cli` (the command: flags, results folder, checkpoints).  The
names below are imported on first use, so ``python -m privfed.attack --help`` loads none of them.
"""

from __future__ import annotations

import importlib

__all__ = ["AttackConfig", "build_parser", "grid_figure", "main", "resolve_config", "run_attacks"]

#: public name -> the module of the package that defines it
_HOME = {
    "AttackConfig": "config",
    "resolve_config": "config",
    "run_attacks": "run",
    "grid_figure": "report",
    "summary_line": "report",
    "PROG": "cli",
    "PARTIAL": "cli",
    "CHECKPOINT_S": "cli",
    "build_parser": "cli",
    "main": "cli",
}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'privfed.commands.attack' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"privfed.commands.attack.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
