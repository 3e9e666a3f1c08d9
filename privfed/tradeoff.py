"""``python -m privfed.tradeoff``: accuracy against a privacy budget, for each place the noise can be added.

The public entry point of the trade-off command; the command itself lives in
:mod:`privfed.commands.tradeoff` (its configuration, sweep, table and plot), and every name it
offers (``run_tradeoff``, ``TradeoffConfig``, ``main``, ...) can be imported from here.
"""

from __future__ import annotations

if __name__ == "__main__":  # --help answers before the imports below, in well under a second
    from privfed.commands.start import quiet_start

    quiet_start("tradeoff")  # Ctrl-C while the imports run: one line and exit 130, no traceback
    from privfed.commands.options import answer_help

    answer_help("tradeoff")

import importlib


def __getattr__(name: str):
    return getattr(importlib.import_module("privfed.commands.tradeoff"), name)


def __dir__() -> list[str]:
    return dir(importlib.import_module("privfed.commands.tradeoff"))


if __name__ == "__main__":
    from privfed.commands.start import exit_with
    from privfed.commands.tradeoff.cli import main

    exit_with(main)
