"""Where a run's results may go: names, space and writability checked before any work, one run per folder.

:func:`check_location` refuses, before the first computation, an output
folder whose names do not fit the file system, whose parent cannot be
written (a probe file, so read-only mounts are caught even for root) or
whose disk has less than :data:`MIN_FREE_BYTES` free.  :class:`FolderLock`
holds a :mod:`filelock` lock on the folder for the whole run, so a second
run on the same folder is refused at once, naming the first one.
:mod:`privfed.results.writer` writes the results themselves.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

from privfed._validation import open_regular
from privfed.errors import ConfigError

__all__ = [
    "LONGEST_INNER_NAME",
    "MIN_FREE_BYTES",
    "STAGING_SUFFIX",
    "WORK_SUFFIX",
    "FolderInUse",
    "FolderLock",
    "check_location",
    "check_names",
    "lock_file",
]

#: Free bytes the output location must have before a run starts.
MIN_FREE_BYTES = 32 * 2**20
#: Longest file name a run writes inside its folder (``grid_<method>_eps<e>_n<n>.png`` and temporaries).
LONGEST_INNER_NAME = 120
#: Suffixes of the folders a run keeps beside its output folder while it runs.
STAGING_SUFFIX = ".privfed-staging"
WORK_SUFFIX = ".privfed-work"
_STAGING = STAGING_SUFFIX


def _existing_ancestor(path: Path) -> Path:
    p = path.absolute()
    while True:
        try:
            if p.exists():
                return p
        except OSError:  # a name too long to even look up
            pass
        p = p.parent


def check_names(path: str | os.PathLike, *, flag: str = "--out") -> None:
    """Refuse a path whose names do not fit the file system (NAME_MAX, PATH_MAX), staging names included."""
    path = Path(path).absolute()
    base = _existing_ancestor(path.parent)
    try:
        name_max = os.pathconf(base, "PC_NAME_MAX")
        path_max = os.pathconf(base, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    longest = max([len(os.fsencode(p)) for p in path.parent.relative_to(base).parts] + [0])
    n = path.name
    # the longest sibling name a run makes: staging, lock record, an interrupted --overwrite's partial folder
    staging = max(
        len(os.fsencode(s))
        for s in (
            f".{n}.4194304{_STAGING}",
            f".{n}.privfed-lock.json",
            f"{n}.partial-20260101-000000",
            f"{n}.interrupted-4194304",
        )
    )
    if longest > name_max or staging > name_max:
        what = (
            f"the folder name is {len(os.fsencode(path.name))} bytes"
            if staging > name_max
            else f"a folder name in it is {longest} bytes"
        )
        raise ConfigError(
            f"{flag} {str(path)!r}: {what}; with the staging folder's name it must stay within this "
            f"file system's {name_max}-byte name limit (a folder name of at most "
            f"{name_max - staging + len(os.fsencode(path.name))} bytes): choose a shorter name"
        )
    full = len(os.fsencode(str(path))) + 1 + LONGEST_INNER_NAME + (staging - len(os.fsencode(path.name)))
    if full > path_max:
        raise ConfigError(
            f"{flag} {str(path)!r} is {len(os.fsencode(str(path)))} bytes long; with the files of a run "
            f"it exceeds this file system's {path_max}-byte path limit: choose a shorter path"
        )


def check_location(path: str | os.PathLike, *, flag: str = "--out", need_bytes: int = MIN_FREE_BYTES) -> None:
    """Refuse, before any work, an output location that cannot take the run's files.

    Checks that every name fits the file system (:func:`check_names`), that
    the nearest existing folder can be written (a probe file is created and
    removed: read-only mounts and missing permissions are caught even for
    root), and that ``need_bytes`` are free there.
    """
    path = Path(path).absolute()
    check_names(path, flag=flag)
    base = _existing_ancestor(path.parent)
    try:
        fd, probe = tempfile.mkstemp(prefix=".privfed-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {str(path)!r}: cannot write in {str(base)!r} ({exc.strerror or exc}); choose "
            "a folder you can write to"
        ) from None
    free = shutil.disk_usage(base).free
    if free < need_bytes:
        raise ConfigError(
            f"{flag} {str(path)!r}: only {free / 2**20:.1f} MiB free on {str(base)!r}, below the "
            f"{need_bytes / 2**20:.0f} MiB a run needs; free some space or choose another disk"
        )


# ---------------------------------------------------------------- the lock
def _lock_paths(path: Path) -> tuple[Path, Path]:
    lock = lock_file(path)
    return lock, lock.with_name(lock.name + ".json")


def lock_file(path: str | os.PathLike) -> Path:
    """The lock file of the output folder ``path`` (``.<name>.privfed-lock`` beside it)."""
    path = Path(path)
    return path.parent / f".{path.name}.privfed-lock"


class FolderInUse(ConfigError):
    """The output folder is locked by another privfed run."""


def _holder(info: Path) -> str:
    try:  # a FIFO or a device in the record's place is not read (a refusal must not hang)
        with open_regular(info, "the lock record") as fh:
            h = json.loads(fh.read(1 << 16))
        return f"pid {h['pid']} on {h['host']}, started {h['started']}: {h['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown (it is starting or its record was removed)"


class FolderLock:
    """An exclusive lock on an output folder (``.<name>.privfed-lock`` beside it) with a record of the holder.

    A second holder is refused at once with a ConfigError naming the folder
    and the first holder's pid, host, start time and command.  The lock file
    and the record are removed on :meth:`release` (while the lock is held:
    filelock retries on an unlinked file, so two runs never both hold it).
    """

    def __init__(self, path: Path, flag: str = "--out", command: str = "") -> None:
        import filelock

        self.file, self.info = _lock_paths(path)
        self._lock = filelock.FileLock(str(self.file), timeout=0)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise FolderInUse(
                f"{flag} {str(path)!r} is in use by another privfed run ({_holder(self.info)}); "
                "wait for it to finish or choose another folder"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"{flag} {str(path)!r}: cannot lock {str(self.file)!r} "
                f"({exc.strerror or exc}); choose a folder you can write to"
            ) from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command,
            "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        with contextlib.suppress(OSError):
            tmp = self.info.with_name(self.info.name + f".{os.getpid()}.privfed-tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.info)

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        with contextlib.suppress(OSError):
            self.info.unlink()
        with contextlib.suppress(OSError):
            self.file.unlink()  # while held: a contender that opened it sees an unlinked inode and retries
        self._lock.release()
