"""``python -m privfed.flower``: one privfed aggregation as a Flower app (see :mod:`privfed.commands.flower`)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The ``privfed-flower`` script of an install made when it pointed here (it now points to
    :func:`privfed.commands.flower.main`): the same command, not an ImportError."""
    from privfed.commands.flower import main as flower_main

    return flower_main(argv)


if __name__ == "__main__":  # --help answers before Flower is imported, in well under a second
    from privfed.commands.start import quiet_start

    quiet_start("flower")  # Ctrl-C while the imports run: one line and exit 130, no traceback
    from privfed.commands.options import answer_help

    answer_help("flower")

    from privfed.commands.flower import main
    from privfed.commands.start import exit_with

    exit_with(main)
