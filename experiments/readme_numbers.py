"""Regenerate the numbers README.md and the docs pages quote (see :mod:`experiments.docs_numbers`).

python -m experiments.readme_numbers --check          # exit 1 when a page disagrees
python -m experiments.readme_numbers --write          # rewrite every block in place
python -m experiments.readme_numbers --show NAME      # print one regenerated block
python -m experiments.readme_numbers --list
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ""):  # run as a script: make `experiments` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from experiments.docs_numbers import *  # noqa: E402,F401,F403 - the module's old public names
from experiments.docs_numbers import __all__  # noqa: E402,F401
from experiments.docs_numbers.cli import main  # noqa: E402

if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
