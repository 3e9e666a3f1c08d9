"""The operator's roster folder on disk: ``roster.json`` and one private identity file per node, written as a set.

:func:`write_roster_folder` is what ``python -m mechanisms.secagg.identity DIR --nodes K`` writes with.  A
folder that already holds a roster's files is refused: a new roster there would replace every node's identity
and void every Flower key and ledger bound to the old one.  Each file is created new (``O_EXCL``, never through
a link or over an existing file, so an identity is never left readable by others: mode 0600), and a failure
part-way removes what this call wrote, so no folder is left with a mix of two rosters.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path

from privfed._files import Terminated, read_regular_text, signals_held
from privfed.errors import ConfigError, PrivfedError

__all__ = ["ROSTER_FILE", "holds_roster", "write_roster_folder"]

#: The roster's file name in the operator's folder.
ROSTER_FILE = "roster.json"
_IDENTITY = re.compile(r"node-\d+\.json")


def write_roster_folder(
    directory: str | os.PathLike, roster_json: str, identities: Sequence[tuple[int, str]]
) -> Path:
    """Write ``roster.json`` and ``node-<i>.json`` (mode 0600) for every ``(i, json)`` into ``directory``."""
    if not str(directory).strip():
        raise ConfigError("DIR is empty: name the folder the roster and identities go to, e.g. ids")
    out = Path(directory).expanduser()
    files = [(f"node-{int(i)}.json", text, 0o600) for i, text in identities] + [
        (ROSTER_FILE, roster_json, 0o644)
    ]
    # A Ctrl-C, SIGTERM or SIGHUP while the files are written (or removed) is held: the call stops after the
    # file it is writing, removes every file it wrote, and the signal is then raised again with the
    # process's own handling.  So no interrupt falls between creating a file and recording it for removal,
    # and a second one cannot cut the removal short.
    with signals_held() as stops:
        _write_files(out, files, stops)
    if stops:  # the signal's own handling did not stop the process (its handler returned)
        raise KeyboardInterrupt() if stops[0] == signal.SIGINT else Terminated(stops[0])
    return out


class _Stopped(Exception):
    """A held signal came while the files were written: stop, and remove them."""


def _write_files(out: Path, files: list[tuple[str, str, int]], stops: list[int]) -> None:
    """Create every file of ``files`` (name, text, mode) in ``out``, or none: on any failure, or when
    ``stops`` (the signals held) is not empty after a file, every file this call created is removed."""
    written: list[tuple[Path, int, int]] = []  # (path, device, inode) of each file this call created
    try:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{out} is a file, not a folder: choose a folder for the roster and identities")
        held = (
            sorted(n for n in os.listdir(out) if n == ROSTER_FILE or _IDENTITY.fullmatch(n))
            if out.is_dir()
            else []
        )
        if held:
            raise ConfigError(
                f"{out} already holds a roster's files ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}; "
                "identities without roster.json are what an interrupted run leaves): a new roster there would "
                "replace every node's identity and void the keys and ledgers bound to the old one; choose a new "
                "folder (or move the old files away first)"
            )
        out.mkdir(parents=True, exist_ok=True)
        for name, text, mode in files:
            if stops:
                raise _Stopped
            fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            st = os.fstat(fd)
            written.append((out / name, st.st_dev, st.st_ino))
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        if stops:  # a signal while the last file was written: the roster is not kept either
            raise _Stopped
    except BaseException as exc:
        for path, dev, ino in written:  # no folder is left with part of a roster; only files this call made
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == (dev, ino):
                    path.unlink()
        if isinstance(exc, _Stopped):
            return
        if isinstance(exc, FileExistsError):
            raise ConfigError(
                f"{exc.filename} appeared while the roster was written into {out}; nothing of this roster is "
                "left there: choose a folder no one else writes to"
            ) from None
        if isinstance(exc, OSError):
            raise ConfigError(
                f"cannot write the roster into {out} ({exc.strerror or exc}"
                + (f": {exc.filename}" if getattr(exc, "filename", None) else "")
                + "); choose a folder this user can write"
            ) from None
        raise


def holds_roster(directory: str | os.PathLike, roster_json: str) -> bool:
    """Whether ``directory`` holds this roster's file, written last: then the roster and its identities are
    whole (a call that stopped removed it with the rest)."""
    try:  # a regular file only: a FIFO put there is not waited on
        return read_regular_text(Path(directory).expanduser() / ROSTER_FILE, ROSTER_FILE) == roster_json
    except (OSError, PrivfedError):
        return False
