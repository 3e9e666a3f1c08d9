"""``python -m privfed.tradeoff``: see :mod:`privfed.tradeoff.cli`."""

from __future__ import annotations

if __name__ == "__main__":  # --help answers before the imports below, in well under a second
    from privfed.cli_args import answer_help

    answer_help("tradeoff")

import sys

from privfed.tradeoff.cli import main

if __name__ == "__main__":
    sys.exit(main())
