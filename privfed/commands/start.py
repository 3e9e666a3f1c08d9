"""The first lines every command runs: Ctrl-C during start-up exits 130 with one line, never a traceback.

Imports three small standard modules (``os``, ``signal``, ``threading``) and :mod:`privfed.commands.names`
only, so the handler is in place before the heavy imports (argparse, numpy, ...).
"""

from __future__ import annotations

import os
import signal
import threading

from privfed.commands.names import prog_name

__all__ = ["attack_script", "exit_with", "flower_script", "quiet_start", "run_script", "tradeoff_script"]


def quiet_start(command: str) -> None:
    """Until the command's own handling takes over (:func:`privfed.commands.common.cli_entry`), Ctrl-C
    during start-up (the imports of the first second) exits 130 with one line, never a traceback.

    Nothing is written before the command's body runs, so there is nothing to clean up; the handler is
    marked so that ``cli_entry`` replaces it with Python's own (KeyboardInterrupt) once its body starts.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):  # a parent that ignores SIGINT (nohup, a background job) keeps it ignored
        return

    def interrupted(signum, frame):
        os.write(2, f"{prog_name(command)}: interrupted\n".encode())
        os._exit(130)

    interrupted.privfed_start = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, interrupted)


def exit_with(code: int) -> None:
    """Leave a command with ``code``.  An interrupted command (130) that has said so and kept what finished
    exits 130 itself, after the exit handlers ran: CPython otherwise re-raises SIGINT at exit (status -2)
    when the interrupt landed inside code a library ran through ``PyRun_*``, even though it was handled."""
    import sys

    if code == 130:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)
    sys.exit(code)


def _script(command: str, module: str) -> None:
    """An installed script (``privfed-<command>``) starts as ``python -m privfed.<command>`` does: Ctrl-C during
    start-up is one line and 130, ``--help`` answers before the heavy imports, the exit status is the
    command's (an interrupted run exits 130 itself, not killed by the signal)."""
    quiet_start(command)
    from privfed.commands.options import answer_help

    answer_help(command)
    import importlib

    exit_with(importlib.import_module(module).main())


def tradeoff_script() -> None:
    """The ``privfed-tradeoff`` script."""
    _script("tradeoff", "privfed.commands.tradeoff.cli")


def attack_script() -> None:
    """The ``privfed-attack`` script."""
    _script("attack", "privfed.commands.attack.cli")


def flower_script() -> None:
    """The ``privfed-flower`` script."""
    _script("flower", "privfed.commands.flower")


def run_script(main) -> None:
    """Run an experiment script's ``main()`` and exit with its status: a bad value of one of its flags (a privfed
    error) is one line and status 2, Ctrl-C one line and 130, never a traceback."""
    import sys

    from privfed.errors import PrivfedError

    prog = os.path.basename(sys.argv[0]) or "script"
    try:
        code = main()
    except PrivfedError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
