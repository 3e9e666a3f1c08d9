"""The first lines every command runs: Ctrl-C during start-up exits 130 with one line, never a traceback.

Imports three small standard modules (``os``, ``signal``, ``threading``) and :mod:`privfed.commands.names`
only, so the handler is in place before the heavy imports (argparse, numpy, ...).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

from privfed.commands.names import prog_name

__all__ = [
    "attack_script",
    "exit_with",
    "finish_on_signal",
    "flower_script",
    "quiet_start",
    "run_script",
    "tradeoff_script",
]


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


#: Set by :func:`exit_with` given the command itself: the command's process ends when it returns, so
#: :func:`~privfed.commands.common.cli_entry` hands a signal that comes after its body finished to
#: :func:`finish_on_signal` (a command called in a Python session, as the tests do, leaves the handlers alone).
PROCESS_ENDS = False


def exit_with(code: int | Callable[[], int]) -> None:
    """Leave a command with ``code`` (or with what ``code()``, the command's ``main``, returns): its own
    threads joined and the exit handlers run, as the interpreter's exit does, then the process ends with the
    code without tearing the interpreter down.

    The teardown (freeing torch, numpy and the rest: most of a second) would otherwise leave a window in which
    Ctrl-C, SIGTERM or SIGHUP kills a run that has finished and published its results (status -2, -15 or -1,
    nothing said); and CPython re-raises SIGINT at exit (status -2) when an interrupt landed inside code a
    library ran through ``PyRun_*``, even though the command handled it (130)."""
    import atexit
    import sys

    global PROCESS_ENDS
    if callable(code):
        PROCESS_ENDS = True
        code = code()
    if threading.current_thread() is threading.main_thread():
        finish_on_signal(code)  # first: from here a signal ends the process with this code

    def flush() -> bool:
        ok = True
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, ValueError):  # no stream, or one the command closed
                pass
            except OSError as exc:  # a full disk under '> log': the report is lost, so the run is no success
                ok = False
                with contextlib.suppress(OSError):
                    os.write(2, f"error: could not write the command's output ({exc})\n".encode())
        return ok

    failed = not flush()
    shutdown = getattr(threading, "_shutdown", None)  # as at the interpreter's exit: the atexit hooks of
    if shutdown is not None:  # threading (an executor's shutdown), then the command's own threads
        shutdown()
    else:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    failed |= not flush()
    os._exit(1 if failed and code == 0 else code)


def finish_on_signal(code: int) -> None:
    """From here on, Ctrl-C, SIGTERM or SIGHUP ends the process with the command's own ``code`` at once: the
    command has finished (what it wrote is published), and only its way out remains, which the signal would
    otherwise turn into a failure status.  A signal the process ignores (nohup, a background job) stays
    ignored."""

    def finished(signum, frame):  # the results are on disk; console output Python still buffers is dropped
        os._exit(code)

    from privfed._files import STOPS  # loaded by then: the command has run

    for sig in STOPS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, finished)


def _script(command: str, module: str) -> None:
    """An installed script (``privfed-<command>``) starts as ``python -m privfed.<command>`` does: Ctrl-C during
    start-up is one line and 130, ``--help`` answers before the heavy imports, the exit status is the
    command's (an interrupted run exits 130 itself, not killed by the signal)."""
    quiet_start(command)
    from privfed.commands.options import answer_help

    answer_help(command)
    import importlib

    exit_with(importlib.import_module(module).main)


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
