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
import stat
from collections.abc import Sequence
from pathlib import Path

from privfed.errors import ConfigError

__all__ = ["ROSTER_FILE", "write_roster_folder"]

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
    # (path, device, inode) of each file this call created (no inode yet: named, being created)
    written: list[tuple[Path, int | None, int | None]] = []
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
            # named before it is created: a Ctrl-C or SIGTERM between creating it and recording its inode
            # must not leave it (the folder held no roster file when the call began)
            written.append((out / name, None, None))
            fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            st = os.fstat(fd)
            written[-1] = (out / name, st.st_dev, st.st_ino)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException as exc:
        if isinstance(exc, FileExistsError):  # the last name is another writer's file, not this call's
            written.pop()
        for path, dev, ino in written:  # no folder is left with part of a roster; only files this call made
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == (dev, ino) or (dev is None and stat.S_ISREG(st.st_mode)):
                    path.unlink()
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
    return out
