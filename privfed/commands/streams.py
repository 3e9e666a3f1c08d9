"""What the commands do with their standard streams: text an encoding cannot hold is spelt plainly, a standard
output that refuses a write is told apart from the run's own file errors, and a standard error that refuses
one is not allowed to stop the run."""

from __future__ import annotations

import codecs
import sys
from typing import Any

__all__ = [
    "PLAIN_SPELLINGS",
    "QuietStderr",
    "StdoutFailed",
    "GuardedStdout",
    "plain_errors",
    "silence_stdout",
    "stdout_reader_gone",
]


#: Plain spellings of the few non-ASCII characters the commands print, for a terminal whose encoding
#: lacks them (a C or Latin-1 locale): the text stays readable instead of raising UnicodeEncodeError.
PLAIN_SPELLINGS = {"ε": "eps", "δ": "delta", "±": "+/-", "×": "x", "—": "--", "≤": "<=", "≥": ">="}


def _plain_spelling(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start : exc.end]
    return "".join(
        PLAIN_SPELLINGS.get(ch, ch.encode("ascii", "backslashreplace").decode()) for ch in text
    ), exc.end


codecs.register_error("privfed-plain", _plain_spelling)


def plain_errors(streams) -> list[tuple[Any, str]]:
    """Make each text stream write a plain spelling of what its encoding cannot hold; the previous settings."""
    kept = []
    for stream in streams:
        errors = getattr(stream, "errors", None)
        if errors not in ("strict", None):
            continue  # the user chose a handler (PYTHONIOENCODING=...:replace): kept
        try:
            stream.reconfigure(errors="privfed-plain")
        except (AttributeError, ValueError, OSError):
            continue
        kept.append((stream, errors))
    return kept


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (``| head`` that has read enough)."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, ValueError, OSError):
        return False


class StdoutFailed(Exception):
    """Standard output refused a write (a full disk behind ``> log``, a device error)."""


class GuardedStdout:
    """Standard output whose write errors (other than a closed pipe) are :class:`StdoutFailed`, so that
    they are told apart from the run's own file errors."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _guard(self, name: str, *args):
        try:
            return getattr(self._stream, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutFailed(exc.strerror or str(exc)) from None

    def write(self, text: str):
        return self._guard("write", text)

    def flush(self) -> None:
        self._guard("flush")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def silence_stdout() -> None:
    """Point standard output at /dev/null so the interpreter's last flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, ValueError, OSError):
        pass


class QuietStderr:
    """Standard error whose write errors are dropped: a note, a progress bar or a warning that cannot be
    shown (a full disk behind ``2> log``) must not stop a run that can still finish and keep its results; the
    exit status still tells how it ended.  A closed pipe is not dropped: nobody reads the run any more."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:  # its reader is gone (``2>&1 | head``): the command stops, as on stdout
            raise
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError:
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
