"""Long runs and signals: SIGTERM as Ctrl-C, checkpoints, keeping the runs that finished, a heartbeat."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from time import monotonic as time_monotonic
from typing import Any

from privfed._files import (
    KEEPING,
    TAKEN,
    TERMINATING,
    Terminated,
    interrupt_taken,
    interruptible,
    signals_held,
    stop_if_taken,
)
from privfed.errors import PrivfedError
from privfed.results.files import atomic_write
from privfed.results.writer import ResultFolder, ResultsWriteError

__all__ = [
    "TERMINATING",
    "Terminated",
    "heartbeat",
    "interrupt_taken",
    "interruptible",
    "keep_finished",
    "periodic_checkpoint",
    "reporting_finished_run",
    "shown_prog",
    "signals_deferred",
    "spill_rows",
    "stop_if_taken",
    "stops_kept",
]


# ---------------------------------------------------------------- signals
@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT / SIGTERM / SIGHUP while the block runs (writing what finished); raise the first afterwards,
    as the command's KeyboardInterrupt or :class:`Terminated` (:func:`privfed._files.signals_held`)."""
    with signals_held(reraise=False) as got:
        yield
    if got:
        raise KeyboardInterrupt() if got[0] == signal.SIGINT else Terminated(got[0])


@contextlib.contextmanager
def stops_kept() -> Iterator[None]:
    """While a command runs (in the main thread, where signals are handled): a stop whose exception Python
    dropped is kept in :data:`privfed._files.TAKEN` for :func:`stop_if_taken` (the handlers note theirs, and a
    dropped KeyboardInterrupt is noted here whichever handler raised it), and not printed as "Exception
    ignored" with a traceback (the command says "interrupted" itself once it stops); any other dropped
    exception is printed as Python prints it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hook = sys.unraisablehook

    def kept(unraisable) -> None:
        exc = unraisable.exc_value
        if not isinstance(exc, KeyboardInterrupt):
            hook(unraisable)
        elif not TAKEN:  # Python's own Ctrl-C handler (a command called in a Python session) notes nothing
            TAKEN.append(exc.signum if isinstance(exc, Terminated) else signal.SIGINT)

    if not KEEPING[0]:
        TAKEN.clear()  # what calls outside a command noted (a roster draw's SIGTERM) is theirs, not this one's
    KEEPING[0] += 1
    sys.unraisablehook = kept
    try:
        yield
    finally:
        sys.unraisablehook = hook
        KEEPING[0] -= 1
        if not KEEPING[0]:
            TAKEN.clear()


def periodic_checkpoint(write_partial: Callable[[list], None], every: float) -> Callable[[list], None]:
    """A callback for a long sweep: every ``every`` seconds, what finished goes to disk.

    Signals wait while the partial files are written, so a killed sweep keeps them.  The first
    finished run is written at once (a disk that fills early still leaves a checkpoint).
    """
    last = -math.inf

    def checkpoint(records: list) -> None:
        nonlocal last
        stop_if_taken()  # a stop whose exception was dropped stops the sweep here, between two runs
        if time.monotonic() - last >= every:
            with signals_deferred():
                try:
                    write_partial(records)
                except ResultsWriteError as exc:  # a full disk: the sweep goes on; the final write says more
                    print(f"note: checkpoint not written ({exc})", file=sys.stderr)
            last = time.monotonic()

    return checkpoint


def keep_finished(
    out: ResultFolder, done: list, write_partial: Callable[[list], None], command: str, prog: str
) -> None:
    """After an interrupt or a failure: what finished is published (results.partial.*), or no folder is left.

    A second Ctrl-C / SIGTERM waits until what finished is on disk.  When
    even that cannot be written (a full disk), the message names the staging
    folder holding the last checkpoint.
    """
    failed = sys.exc_info()[1]
    if isinstance(failed, ResultsWriteError) and failed.kept is not None:
        # the run was complete and only its move into place failed: it is kept whole where the error says;
        # the scratch and the lock go
        out.salvage()
        return
    with signals_deferred():
        # Final files written before the stop (results.csv / results.json, some figures) go: an interrupted
        # run is described by its partial files alone, never by a results.json that says it completed.
        out.remove([n for n in out.written if not n.startswith("results.partial.")])
        if not done and not out.written:
            out.abandon()
            return
        try:
            if done:
                write_partial(done)
            where = out.finish(command, complete=False)
        except PrivfedError as exc:
            # the partial files were written, only not moved into place
            if getattr(exc, "kept", None) is not None:
                out.salvage()
                print(f"{prog}: the sweep stopped after {len(done)} run(s); {exc}", file=sys.stderr)
                return
            # a full disk: the last checkpoint is moved into place (a rename needs no space), the scratch
            # files and the lock go, and every finished run is written where there is room
            kept = out.salvage()
            spilled = spill_rows(done, command, prog) if done else None
            print(
                f"{prog}: could not write the {len(done)} finished run(s) into {out.path}: {exc}"
                + (f"; the last checkpoint is in {kept}" if kept else "; no checkpoint had been written")
                + (
                    f"; all {len(done)} finished run(s) are in {spilled}"
                    if spilled
                    else ("; they could not be written anywhere else either" if done else "")
                ),
                file=sys.stderr,
            )
            return
        if done:
            print(
                f"{prog}: the sweep stopped after {len(done)} run(s); they are in "
                f"{where}/results.partial.csv and results.partial.json"
                + (f" ({out.path} keeps the previous run)" if where != out.path else ""),
                file=sys.stderr,
            )


def spill_rows(rows: list, command: str, prog: str) -> Path | None:
    """The finished rows as one JSON file outside the full output folder: the system's temporary folder
    (often another file system), else the working folder; returns its path, or None when nothing could
    be written.  Written atomically; inf and NaN as strings, as in every results file."""
    import os
    import tempfile

    from privfed.results.record import json_text

    name = f"privfed-{prog.rsplit('.', 1)[-1]}-finished-{os.getpid()}-{int(time.time())}.json"
    text = json_text({"command": command, "complete": False, "records": rows})
    for folder in (Path(tempfile.gettempdir()), Path.cwd()):
        try:
            return atomic_write(folder / name, lambda p: p.write_text(text))
        except (ResultsWriteError, OSError):
            continue
    return None


@contextlib.contextmanager
def heartbeat(bar: Any, *, after: float = 2.0, every: float = 1.0) -> Iterator[None]:
    """Redraw a progress bar every ``every`` seconds once ``after`` seconds have passed.

    A single run that takes minutes (a model inversion) then still shows its
    elapsed time instead of a frozen or absent bar.
    """
    if getattr(bar, "disable", True):
        yield
        return
    stop = threading.Event()
    t0 = time_monotonic()

    def beat() -> None:
        while not stop.wait(every):
            if time_monotonic() - t0 >= after:
                with contextlib.suppress(Exception):
                    bar.refresh()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def shown_prog(prog: str) -> str:
    """How a command names itself: ``privfed-<command>`` when its installed script started it, else ``prog``."""
    from privfed.commands.names import prog_name

    command = prog.removeprefix("python -m privfed.") if prog.startswith("python -m privfed.") else ""
    return prog_name(command) if command else prog


@contextlib.contextmanager
def reporting_finished_run(prog: str, folder: Any):
    """The console report of a run whose results are published: Ctrl-C, SIGTERM or SIGHUP here says that
    ``folder`` holds the complete results (only the report on the console was cut short) before the command
    exits 128 + the signal, as the Flower command says it.  In a process that ends with the command, the
    handler says so and ends it at once: an exception raised where Python swallows it (a weakref callback)
    printed a traceback and the run went on to exit 0."""
    import os

    from privfed._files import STOPS
    from privfed.commands import start

    line = f"{shown_prog(prog)}: stopped after the run had finished: {folder}/ holds its complete results"

    def said(signum, frame):
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # RuntimeError: a write it interrupted
            sys.stdout.flush()
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            print(line, file=sys.stderr, flush=True)
        os._exit(128 + signum)

    if start.PROCESS_ENDS and threading.current_thread() is threading.main_thread():
        for sig in STOPS:  # until finish_on_signal takes over with the command's own status
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, said)
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):  # after SIGHUP the terminal may be gone
            print(line, file=sys.stderr, flush=True)
        raise
