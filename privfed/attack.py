"""``python -m privfed.attack``: what a curious server recovers, next to the formal budget.

The public entry point of the attack command; the command itself lives in
:mod:`privfed.commands.attack` (its configuration, runs and report), and every name it offers
(``main``, ``build_parser``, ``AttackConfig``, ``run_attacks``, ...) can be imported from here.
"""

from __future__ import annotations

if __name__ == "__main__":  # --help answers before the imports below, in well under a second
    from privfed.commands.start import quiet_start

    quiet_start("attack")  # Ctrl-C while the imports run: one line and exit 130, no traceback
    from privfed.commands.options import answer_help

    answer_help("attack")

import importlib


def __getattr__(name: str):
    return getattr(importlib.import_module("privfed.commands.attack"), name)


def __dir__() -> list[str]:
    return dir(importlib.import_module("privfed.commands.attack"))


if __name__ == "__main__":
    from privfed.commands.attack.cli import main
    from privfed.commands.start import exit_with

    exit_with(main)
