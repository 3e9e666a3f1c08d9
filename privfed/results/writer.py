"""Result folders written as one atomic unit: the one writer every privfed command uses.

A run never writes into its output folder directly.  It writes into a
staging folder beside it (``.<name>.<pid>.privfed-staging``, same parent,
same file system) and, when it ends, the staging folder is renamed into
place in one step; ``manifest.json`` is written last and lists every file
with its size and SHA-256, so a reader can check what it reads
(:func:`verify_folder`).  What an operator can rely on:

* ``<out>`` appears only as a whole: the finished run (``complete: true``),
  or, after SIGTERM / Ctrl-C, the runs that finished (``results.partial.*``,
  ``complete: false``).  A run that finished nothing leaves no folder.
* ``--overwrite`` never mixes two runs: the previous folder stays untouched
  until the new run is complete, then the two are swapped and the old one
  removed.  An interrupted ``--overwrite`` keeps the old folder and puts the
  new run's finished part beside it in ``<out>.partial-<time>``.
* One run per folder: a lock (:mod:`filelock`) on ``<out>`` refuses a
  second concurrent run at once, naming the folder and the holder's pid,
  host, start time and command (``.<name>.privfed-lock`` beside the folder).
* Before the first computation the location is checked: the parent can be
  written, every name fits the file system's name and path limits, and at
  least 32 MiB are free (:mod:`privfed.results.guard`).
* A killed run (SIGKILL, power loss) leaves its staging folder, holding the
  last checkpoint with a ``complete: false`` manifest; the next run on the
  same ``<out>`` renames it to ``<out>.interrupted-<pid>`` and says so.
* A failed write (a full disk, a read-only file system) is one clear error
  naming the file and the folder that keeps what finished.

Atomic writes and the manifest check live in :mod:`privfed.results.files` (re-exported here).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from privfed.errors import ConfigError
from privfed.results.files import (
    MANIFEST,
    OUTPUT_NAMES,
    ResultsWriteError,
    atomic_write,
    fsync_dir,
    manifest_names,
    previous_run_files,
    sha256_file,
    verify_folder,
)
from privfed.results.guard import (
    MIN_FREE_BYTES,
    STAGING_SUFFIX,
    WORK_SUFFIX,
    FolderInUse,
    FolderLock,
    check_location,
    check_names,
)

__all__ = [
    "MANIFEST",
    "MIN_FREE_BYTES",
    "OUTPUT_NAMES",
    "ResultFolder",
    "ResultsWriteError",
    "atomic_write",
    "check_location",
    "check_names",
    "check_out_path",
    "leftover_runs",
    "manifest_names",
    "rescue_killed_runs",
    "sha256_file",
    "verify_folder",
]

_STAGING = STAGING_SUFFIX
_WORK = WORK_SUFFIX


# ---------------------------------------------------------------- where the folder goes
def check_out_path(out: str | os.PathLike, *, overwrite: bool, flag: str = "--out") -> tuple[Path, set[str]]:
    """Validate an output folder before any work: returns (path, files of a previous run it replaces).

    Refused with one line: a path that is a file, a path under a file, an
    existing non-empty folder without ``overwrite``, and (with ``overwrite``)
    a folder holding anything privfed did not write.  A symbolic link stands
    for its target: the returned path is the target, which the run fills.
    """
    path = Path(out).expanduser()  # a quoted "~/runs" is the home folder, as every other path privfed reads
    if str(out).strip() == "":
        raise ConfigError(f"{flag} is empty; pass a folder path such as results/run1")
    if path.name in ("", ".", ".."):
        # a run is staged beside its folder and moved in whole: the current folder, its parent or the root
        # cannot be replaced that way, so the message names a folder inside the one meant
        raise ConfigError(
            f"{flag} {str(out)!r} names the folder {os.path.abspath(path)!r} itself, which a run cannot be "
            f"moved into (each run gets a folder of its own, made whole at the end); name one inside it, such "
            f"as {os.path.join(os.path.normpath(path), 'run1')!r}"
        )
    check_names(path, flag=flag)
    if path.is_symlink():
        # a link names the folder the user means: the run is written into its target (staged beside the
        # target, on its file system) and the link stays a link
        try:
            path = Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:  # a dangling link: the run makes its target
            path = Path(os.path.realpath(path))
        except OSError as exc:  # a loop (ELOOP) used to be found only when the finished run was moved in
            raise ConfigError(
                f"{flag} {str(out)!r} is a symbolic link that cannot be followed ({exc.strerror or exc}); "
                "point it at a folder or choose another path"
            ) from None
        if path.name in ("", ".", ".."):
            raise ConfigError(f"{flag} {str(out)!r} links to {str(path)!r}, which is no folder to write into")
    check_names(path, flag=flag)
    try:
        return _check_out_path(path, overwrite, flag)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {str(path)!r} cannot be used ({exc.strerror or exc}); choose another path"
        ) from None


def _check_out_path(path: Path, overwrite: bool, flag: str) -> tuple[Path, set[str]]:
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            raise ConfigError(
                f"{flag} {str(path)!r}: {str(parent)!r} is a file, so no folder can be made "
                "under it; choose another path"
            )
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{flag} {str(path)!r} is a file, not a folder; choose a folder path (--overwrite "
            "replaces a previous run's folder, never a file)"
        )
    if not path.exists() or not any(path.iterdir()):
        return path, set()
    if not overwrite:
        raise ConfigError(
            f"{flag} {str(path)!r} already exists and is not empty; choose a new folder or pass --overwrite"
        )
    ours, foreign = previous_run_files(path)
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise ConfigError(
            f"{flag} {str(path)!r} holds files privfed did not write ({shown}); --overwrite only "
            "replaces a previous privfed run: choose another folder or move them"
        )
    return path, ours


def leftover_runs(out: str | os.PathLike) -> list[Path]:
    """Staging and work folders of killed runs on ``out`` (only meaningful while holding its lock)."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    prefix = f".{out.name}."
    return sorted(
        p
        for p in out.parent.iterdir()
        if p.name.startswith(prefix) and p.name.endswith((_STAGING, _WORK)) and p.is_dir()
    )


def rescue_killed_runs(root: str | os.PathLike, prefix: str) -> list[str]:
    """Rescue the finished runs that killed runs left in ``root`` under default names (``<prefix>-...-<date>-<time>``,
    which no later run names again): each staging folder whose run is gone becomes ``<name>.interrupted-<pid>``
    beside it, as a later run on the same ``--out`` would rescue it.  A folder a user named, and a run still
    holding its lock, are left alone.  Returns the notes said (also printed)."""
    import re

    root = Path(root)
    if not root.is_dir():
        return []
    default = re.compile(rf"{re.escape(prefix)}-.*-\d{{8}}-\d{{6}}(-\d+)?")
    names = set()
    for p in root.iterdir():
        n = p.name
        if n.startswith(".") and n.endswith(_STAGING):
            name, _, pid = n[1:].removesuffix(_STAGING).rpartition(".")
            if pid.isdigit() and default.fullmatch(name) and manifest_names(p):  # a committed checkpoint
                names.add(name)
    notes: list[str] = []
    for name in sorted(names):
        try:
            folder = ResultFolder(root / name, command="rescue of a killed run's staging folder")
        except (FolderInUse, ConfigError):  # still running, or nothing a run may take over: left as it is
            continue
        notes.extend(folder.notes)
        folder.discard()
    return notes


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _replace_dir(new: Path, old: Path, aside: Path) -> None:
    """Put folder ``new`` where folder ``old`` is, in one step where the system allows; the old one is removed.

    Without an atomic exchange, ``old`` is renamed to ``aside`` first, so at
    every instant one of the two complete folders exists under a known name.
    """
    if _exchange(new, old):
        shutil.rmtree(new, ignore_errors=True)  # now the old one
        return
    os.rename(old, aside)
    try:
        os.rename(new, old)
    except OSError:
        os.rename(aside, old)
        raise
    shutil.rmtree(aside, ignore_errors=True)


# ---------------------------------------------------------------- the folder
class ResultFolder:
    """The files of one run, published as one unit (see the module docstring).

    Writes go to a work folder; :meth:`checkpoint` commits it, with its
    manifest, as the staging folder in one step, and :meth:`publish` commits
    and moves the staging folder to ``path``.  So the staging folder and the
    published one only ever hold a manifest that matches every file in them.

    Parameters
    ----------
    path : path
        The output folder (validated with :func:`check_out_path`).
    overwrite : bool
        ``path`` may hold a previous privfed run, replaced when this one ends.
    command : str
        The command line, recorded in the manifest and the lock.
    flag : str
        How the folder was named, for messages.
    need_bytes : int
        Free space required before the run starts.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        command: str = "",
        flag: str = "--out",
        need_bytes: int = MIN_FREE_BYTES,
    ) -> None:
        self.path, self._old = check_out_path(path, overwrite=overwrite, flag=flag)
        self.flag, self.command = flag, command
        check_location(self.path, flag=flag, need_bytes=need_bytes)
        self._made: list[Path] = []
        p = self.path.absolute().parent
        while not p.exists():
            self._made.append(p)
            p = p.parent
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            dangling = next((p for p in self._made if p.is_symlink()), None)
            why = (
                f"it is a link to {os.readlink(dangling)!r}, which does not exist: create that folder or remove the link"
                if dangling is not None
                else exc.strerror or str(exc)
            )
            raise ConfigError(
                f"{flag} {str(self.path)!r}: cannot create {str(dangling or self.path.parent)!r} ({why})"
            ) from None
        self._lock = FolderLock(self.path, flag, command)
        self.notes: list[str] = []
        try:
            self.path, self._old = check_out_path(
                path, overwrite=overwrite, flag=flag
            )  # again, under the lock
            self._rescue_leftovers()
        except BaseException:
            self._release()
            raise
        stem = f".{self.path.name}.{os.getpid()}"
        self.staging = self.path.parent / f"{stem}{_STAGING}"
        self._work = self.path.parent / f"{stem}{_WORK}"
        self._aside = self.path.parent / f"{stem}-old{_STAGING}"
        self.written: list[str] = []
        self.published: Path | None = None
        # where a finished run stays after its move failed (beside path): never moved or removed
        self.kept: Path | None = None

    def _rescue_leftovers(self) -> None:
        for old in leftover_runs(self.path):
            if old.name.endswith(_WORK) or not manifest_names(old):  # never committed: nothing verified in it
                shutil.rmtree(old, ignore_errors=True)
                continue
            pid = old.name[len(self.path.name) + 2 : -len(_STAGING)]
            dest = self.path.with_name(f"{self.path.name}.interrupted-{pid}")
            with contextlib.suppress(OSError):
                os.rename(old, dest)
                self.notes.append(
                    f"a killed run on {self.path} had left its finished runs in a staging folder; "
                    f"they are now in {dest}"
                )
                print(f"note: {self.notes[-1]}", file=sys.stderr)

    # -- writing -------------------------------------------------------
    def _open_work(self) -> None:
        if self._work.is_dir():
            return
        try:
            self._work.mkdir()
            if self.staging.is_dir():  # the next generation starts from the committed one (hard links)
                for n in self.written:
                    if n == MANIFEST:
                        continue
                    try:
                        os.link(self.staging / n, self._work / n)
                    except OSError:
                        shutil.copy2(self.staging / n, self._work / n)
        except OSError as exc:
            raise ResultsWriteError(f"could not prepare {str(self._work)!r}: {exc.strerror or exc}") from None

    def write(self, name: str, write: Callable[[Path], None]) -> Path:
        """Write ``name`` into the run through ``write(tmp_path)``; visible at the next checkpoint / publish."""
        if "/" in name or name in ("", ".", "..", MANIFEST) or name.startswith("."):
            raise ValueError(f"not a result file name: {name!r}")  # a programming error, not user input
        self._open_work()
        try:
            final = atomic_write(self._work / name, write)
        except (
            ResultsWriteError
        ) as exc:  # named as the file of the output folder, not the scratch path it had
            why = str(exc).rpartition(": ")[2]
            raise ResultsWriteError(f"could not write {name} of {str(self.path)!r}: {why}") from None
        if name not in self.written:
            self.written.append(name)
        return final

    def remove(self, names: Iterable[str]) -> None:
        """Drop files this run wrote earlier (a checkpoint superseded by the final results)."""
        names = [n for n in names if n in self.written]
        if not names:
            return
        self._open_work()
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self._work / name).unlink()
            self.written.remove(name)

    def _commit(self, complete: bool) -> None:
        """Manifest into the work folder, then the work folder becomes the staging folder in one step."""
        self._open_work()
        names = [n for n in self.written if n != MANIFEST]
        try:
            files = [
                {"name": n, "bytes": (self._work / n).stat().st_size, "sha256": sha256_file(self._work / n)}
                for n in names
            ]
        except OSError as exc:
            raise ResultsWriteError(
                f"could not read back {str(self._work)!r}: {exc.strerror or exc}"
            ) from None
        payload = {
            "tool": "privfed",
            "command": self.command,
            "complete": complete,
            "files": files,
            "written": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        atomic_write(self._work / MANIFEST, lambda p: p.write_text(json.dumps(payload, indent=2) + "\n"))
        fsync_dir(self._work)
        try:
            if self.staging.is_dir():
                _replace_dir(self._work, self.staging, self._aside)
            else:
                os.rename(self._work, self.staging)
        except OSError as exc:
            raise ResultsWriteError(
                f"could not commit {str(self.staging)!r}: {exc.strerror or exc}"
            ) from None
        fsync_dir(self.staging.parent)
        self.written = names + [MANIFEST]

    def checkpoint(self) -> None:
        """Commit what was written so far (``complete: false``): a killed run leaves it, verified, behind."""
        self._commit(False)

    # -- ending --------------------------------------------------------
    def publish(self, *, complete: bool) -> Path:
        """Commit with the manifest written last, then move the run into place; returns where it went.

        Complete, or into a new folder: ``path`` (a previous run there is
        swapped out in one step and removed).  An incomplete run over a
        previous one: ``<path>.partial-<time>``, the previous run untouched.
        """
        self._commit(complete)
        dest = self.path
        try:
            if self.path.exists() and not complete and self._old:
                stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
                dest = self.path.with_name(f"{self.path.name}.partial-{stamp}")
                os.rename(self.staging, dest)
            elif self.path.exists():
                _, foreign = previous_run_files(self.path) if any(self.path.iterdir()) else (set(), [])
                if foreign:  # something appeared there since the start: never deleted, and this run kept
                    why = f"it now holds files privfed did not write: {', '.join(foreign[:4])}"
                    raise FileExistsError(errno.EEXIST, why)
                _replace_dir(self.staging, self.path, self._aside)
            else:
                os.rename(self.staging, self.path)
        except OSError as exc:
            kept = self.path.with_name(
                f"{self.path.name}.unplaced-{_dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
            )
            with contextlib.suppress(OSError):
                os.rename(self.staging, kept)
            self.kept = kept = kept if kept.is_dir() else self.staging
            why = f"could not move the run into {str(dest)!r} ({exc.strerror or exc})"
            raise ResultsWriteError(f"{why}; its files are kept in {str(kept)!r}", kept=kept) from None
        fsync_dir(self.path.parent)
        self.published = dest
        self._release()
        return dest

    def salvage(self) -> Path | None:
        """After a write failed (a full disk): keep what was committed, leave no scratch, release the lock.

        The last committed checkpoint (a staging folder with its manifest) is moved into place by a
        rename, which needs no new space (beside a previous run: ``<path>.partial-<time>``); the uncommitted
        work folder and its temporary files are removed.  Returns where the checkpoint is, or None if none.
        """
        shutil.rmtree(self._work, ignore_errors=True)
        kept: Path | None = None
        if self.kept is None and (self.staging / MANIFEST).is_file():
            kept = self.staging
            dest = self.path
            if dest.exists():
                stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
                dest = self.path.with_name(f"{self.path.name}.partial-{stamp}")
            with contextlib.suppress(OSError):
                os.rename(self.staging, dest)
                kept = dest
        elif self.kept is None:
            shutil.rmtree(self.staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            shutil.rmtree(self._aside)
        self.published = kept
        self._release()
        if kept is None:
            for p in self._made:
                with contextlib.suppress(OSError):
                    p.rmdir()
        return kept

    def discard(self) -> None:
        """A run that finished nothing: remove its folders (and the parents this run created)."""
        for p in (self._work, self.staging if self.kept is None else self._work):
            shutil.rmtree(p, ignore_errors=True)
        self._release()
        for p in self._made:
            with contextlib.suppress(OSError):
                p.rmdir()

    def _release(self) -> None:
        self._lock.release()

    def files(self) -> list[str]:
        """What this run wrote, in order (the manifest last)."""
        return [n for n in self.written if n != MANIFEST] + ([MANIFEST] if MANIFEST in self.written else [])
