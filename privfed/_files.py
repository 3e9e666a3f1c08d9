"""Input files opened only when they are regular files: a FIFO, a device, a socket or a directory is refused
at once, never waited on (every door of the library and the commands reads its input files through here);
and the signals every command handles: :func:`interruptible` (SIGTERM and SIGHUP as Ctrl-C) and
:func:`signals_held`, for work that a signal must not cut in two (files written as a set, an import)."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import signal
import stat
import threading
from collections.abc import Iterator
from typing import Any

from privfed.errors import InputError

__all__ = [
    "KEEPING",
    "STOPS",
    "TAKEN",
    "TERMINATING",
    "Terminated",
    "interrupt_taken",
    "interruptible",
    "open_regular",
    "path_of",
    "read_regular_text",
    "signals_held",
    "stop_if_taken",
]

_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _not_regular(what: str, mode: int, fix: str) -> InputError:
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a plain file")
    return InputError(f"{what} is {kind}, not a regular file, and is not read; {fix}")


def path_of(path, what: str, fix: str = "pass the path of a regular file") -> pathlib.Path:
    """``path`` (str, bytes or os.PathLike, not empty) as a Path with ``~`` expanded; an :class:`InputError`
    naming ``what`` for anything else (None, a number, an empty string, a NUL: not a file's name) or a
    ``~user`` that names no user."""
    if not isinstance(path, (str, bytes, os.PathLike)) or not os.fsdecode(os.fspath(path)).strip():
        raise InputError(f"{what} is not a file path (got {path!r}); {fix}")
    if "\x00" in os.fsdecode(os.fspath(path)):  # no file system takes one: open() says "embedded null byte"
        raise InputError(f"{what} holds a NUL character ({path!r}), which no file name can; {fix}")
    try:
        return pathlib.Path(os.fsdecode(os.fspath(path))).expanduser()
    except RuntimeError:  # ~nouser/...
        raise InputError(f"{what} names a home folder that does not exist ({path!r}); {fix}") from None


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, batch schedulers) or SIGHUP (the terminal or SSH session closed), handled
    like Ctrl-C; ``signum`` says which."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


#: The signals turned into :class:`Terminated`: without a handler each kills the process at once, leaving
#: the processes it started (a Flower SuperLink and its simulation) running and nothing written.
TERMINATING = tuple(
    getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)
)  # no SIGHUP on Windows


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Terminated` (a KeyboardInterrupt) while the block runs.

    Only in the main thread (where Python delivers signals); the previous
    handlers are restored afterwards, unless the block installed others of its
    own (a command that finished hands its way out to those).  A signal the
    process ignores (a parent's ``nohup`` ignores SIGHUP) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        TAKEN.append(signum)
        raise Terminated(signum)

    caught = [s for s in TERMINATING if signal.getsignal(s) is not signal.SIG_IGN]
    old = {s: signal.signal(s, handler) for s in caught}
    try:
        yield
    finally:
        for s, h in old.items():
            if signal.getsignal(s) is handler:
                signal.signal(s, h)


#: The stops (SIGINT, SIGTERM, SIGHUP) a running command's handlers took, in order.  A handler's exception
#: raised where Python drops it (in a ``__del__``, a weakref callback or a finaliser that the collector ran: it
#: prints "Exception ignored" and goes on) would leave the command running to its end and exit 0 as if no
#: stop had come; the stop stays here, and :func:`stop_if_taken` raises it again at the command's next safe
#: point (between runs, before the results are published).  Emptied when a command starts and ends.
TAKEN: list[int] = []
#: How many commands keep stops now (:func:`privfed.commands.signals.stops_kept`, main thread only): outside
#: them :func:`stop_if_taken` does nothing, so a stop an earlier call noted never stops a later one.
KEEPING = [0]


def interrupt_taken(signum, frame) -> None:
    """A command's Ctrl-C: noted in :data:`TAKEN`, then Python's KeyboardInterrupt."""
    TAKEN.append(signum)
    raise KeyboardInterrupt


def stop_if_taken() -> None:
    """Raise the first stop a handler took whose exception was lost (:data:`TAKEN`), as the command's
    KeyboardInterrupt or :class:`Terminated`; nothing when none was."""
    if TAKEN and KEEPING[0]:
        raise KeyboardInterrupt() if TAKEN[0] == signal.SIGINT else Terminated(TAKEN[0])


#: The signals that stop a command: Ctrl-C, SIGTERM (kill, timeout, a scheduler), SIGHUP (a closed terminal;
#: none on Windows).
STOPS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def signals_held(reraise: bool = True) -> Iterator[list[int]]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while the block runs: each one that arrives is appended to the list
    the block gets (so that it can stop at a point of its choosing) and, with ``reraise``, raised again once
    the block has ended, with the process's own handling (a command's one-line exit, Python's
    KeyboardInterrupt, or the default action).  A signal raised again this way replaces an exception the
    block raised (which stays its ``__context__``).

    Held by swapping the Python-level handlers, not the thread's signal mask: a signal sent to the process
    may be taken by any of its threads (BLAS starts some), and its handler then runs in the main thread
    whatever that thread's mask says.  Only in the main thread (signals are handled only there); a signal
    the process ignores, or one whose handler is not Python's, is left as it is.  Where a wakeup fd is set
    (an asyncio loop's signal handlers), the loop has already been told of a held signal: it is not raised
    a second time."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old: dict[int, Any] = {}
    try:
        for s in STOPS:  # each swap recorded as it is made: a signal between two is restored in finally
            handler = signal.getsignal(s)
            if handler not in (signal.SIG_IGN, None):
                old[s] = handler
                signal.signal(s, lambda signum, frame: got.append(signum))
        yield got
    finally:
        pending: BaseException | None = None
        for s, handler in old.items():  # every handler back, even if a restored one raises meanwhile
            while signal.getsignal(s) is not handler:
                try:
                    signal.signal(s, handler)
                except BaseException as exc:  # noqa: BLE001 (raised again below, once all are restored)
                    pending = pending or exc
        if pending is not None:
            raise pending
        if reraise and not _wakeup_fd_set():
            _raise_each(list(dict.fromkeys(got)))


def _wakeup_fd_set() -> bool:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd != -1


def _raise_each(signals: list[int]) -> None:
    """Raise every signal of ``signals`` in turn, though a handler raise (KeyboardInterrupt): the next is
    raised in a ``finally``, so none is lost."""
    if signals:
        try:
            signal.raise_signal(signals[0])
        finally:
            _raise_each(signals[1:])


def open_regular(path, what: str, fix: str = "pass the path of a regular file") -> io.BufferedReader:
    """``path`` opened for binary reading if it is a regular file (symbolic links are followed).

    A FIFO, a device, a socket or a directory is refused with an :class:`InputError`
    naming ``what`` and the kind of file, before a byte is read: the file is opened
    without blocking (a FIFO with no writer would otherwise wait forever) and checked
    on the descriptor itself, so it cannot be swapped between the check and the read.
    """
    p = os.fspath(path_of(path, what, fix))
    try:
        mode = os.stat(p).st_mode  # a socket cannot be opened at all: named from its metadata
    except FileNotFoundError:
        raise InputError(f"{what} does not exist; check the path ({fix})") from None
    except OSError as exc:
        raise InputError(
            f"{what} cannot be read ({exc.strerror or exc}); check the path and its permissions"
        ) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(what, mode, fix)
    nonblock = getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(p, os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise InputError(f"{what} cannot be opened ({exc.strerror or exc}); check its permissions") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the two looks
            raise _not_regular(what, mode, fix)
        if nonblock:  # reads of a regular file never block; cleared for the file object's sake
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~nonblock)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_text(path, what: str, fix: str = "pass the path of a regular file") -> str:
    """The UTF-8 text of ``path`` if it is a regular file (:func:`open_regular`); one-line errors otherwise."""
    with open_regular(path, what, fix) as fh:
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} is not UTF-8 text; {fix}") from None
