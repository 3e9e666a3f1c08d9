"""How a command is named to its user: ``python -m privfed.<command>``, or its installed script's name.

Imports ``os`` and ``sys`` only: :mod:`privfed.commands.start` names the command in its interruption message
before anything else is imported.
"""

from __future__ import annotations

import os

__all__ = ["prog_name"]


def prog_name(command: str) -> str:
    """How the user started ``command``: ``privfed-<command>`` from its installed script, else ``python -m
    privfed.<command>`` (what its usage line, errors and interruption message call it)."""
    import sys

    script = f"privfed-{command}"
    if sys.argv and os.path.basename(sys.argv[0]) in (script, script + ".exe"):
        return script
    return f"python -m privfed.{command}"
