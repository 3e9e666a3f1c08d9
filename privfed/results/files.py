"""One result file written atomically, and a finished folder checked against its manifest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privfed._files import open_regular, read_regular_text
from privfed.errors import InputError, PrivfedError
from privfed.results.guard import STAGING_SUFFIX, WORK_SUFFIX

__all__ = [
    "MANIFEST",
    "OUTPUT_NAMES",
    "ResultsWriteError",
    "atomic_write",
    "fsync_dir",
    "in_saved_run",
    "intact_names",
    "previous_run_files",
    "written_name",
    "manifest_names",
    "sha256_file",
    "verify_folder",
]

MANIFEST = "manifest.json"
#: Names privfed writes into a result folder (besides ``grid_*.png``).
OUTPUT_NAMES = (
    "results.csv",
    "results.json",
    "results.partial.csv",
    "results.partial.json",
    "config.json",
    "tradeoff.png",
    "manifest.json",
    "head.npz",
    "report.json",
)
TMP_SUFFIX = ".privfed-tmp"


class ResultsWriteError(PrivfedError):
    """A result file could not be written (full disk, read-only or vanished folder).

    ``kept``: where a finished run was kept instead of its folder (its move into place failed), else None.
    """

    def __init__(self, message: str, *, kept=None) -> None:
        super().__init__(message)
        self.kept = kept


# ---------------------------------------------------------------- files
def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open_regular(path, f"result file {str(path)!r}") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(final: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Write one file through ``write(tmp_path)`` into a hidden sibling, fsync it, rename it into place.

    A failure (a full disk: ``OSError`` ENOSPC) leaves the previous file, if
    any, as it was and raises :class:`ResultsWriteError` naming the file.
    """
    final = Path(final)
    tmp = final.with_name(f".{final.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as exc:
        raise ResultsWriteError(f"could not write {str(final)!r}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    fsync_dir(final.parent)
    return final


def is_sha256_hex(value: Any) -> bool:
    """Whether ``value`` is a SHA-256 digest as privfed writes it: 64 lowercase hexadecimal digits."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _malformed_entry(folder: Path, entry: dict[str, Any]) -> str | None:
    """Why one manifest entry is not one privfed writes (a plain file name in the folder, its size, its hash), or None."""
    name, size, digest = entry["name"], entry["bytes"], entry["sha256"]
    if not isinstance(name, str) or not name:
        return f"name {name!r} is not a file name"
    if any(c in name for c in "/\\\0") or name in (".", "..", MANIFEST) or os.path.isabs(name):
        return f"{name!r} is not a file of the folder itself (a path, or outside it)"
    if (folder / name).is_symlink():
        try:
            inside = (folder / name).resolve().is_relative_to(folder.resolve())
        except (OSError, RuntimeError):  # a loop of links
            inside = False
        if not inside:
            return f"{name!r} is a symbolic link that leads out of the folder"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"the size of {name!r} is {size!r}, not an integer number of bytes"
    if not is_sha256_hex(digest):
        return f"the sha256 of {name!r} is not 64 hexadecimal digits"
    return None


def verify_folder(folder: str | os.PathLike) -> dict[str, Any]:
    """Check a result folder against its manifest; returns the manifest.

    Raises :class:`InputError` naming the first file that is missing, was
    changed (size or SHA-256) or is not listed, or a missing / unreadable manifest.
    """
    folder = Path(folder)
    where = f"result folder {str(folder)!r}"
    try:
        if not (folder / MANIFEST).exists():
            raise FileNotFoundError
        manifest = json.loads(read_regular_text(folder / MANIFEST, f"{where}: {MANIFEST}"))
    except FileNotFoundError:
        raise InputError(f"{where} has no {MANIFEST}; it was not written by a finished privfed run") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{where}: {MANIFEST} cannot be read ({exc})") from None
    if not isinstance(manifest, dict):
        raise InputError(
            f"{where}: {MANIFEST} is a JSON {type(manifest).__name__}, not a privfed manifest (a JSON object); "
            "it was not written by privfed: rerun the command to write the folder again"
        )
    files = manifest.get("files")
    if (
        manifest.get("tool") != "privfed"
        or not isinstance(files, list)
        or not all(isinstance(f, dict) and {"name", "bytes", "sha256"} <= set(f) for f in files)
    ):
        raise InputError(
            f"{where}: {MANIFEST} is not a privfed manifest with file hashes; rerun the command to write "
            "the folder again"
        )
    for i, f in enumerate(files):
        why = _malformed_entry(folder, f)
        if why:
            raise InputError(
                f"{where}: {MANIFEST} is malformed (entry {i}: {why}); it was not written by privfed or was "
                "edited: rerun the command to write the folder again"
            )
    for f in files:
        p = folder / f["name"]
        if not p.is_file():
            raise InputError(f"{where}: {f['name']!r} is listed in {MANIFEST} but missing")
        if p.stat().st_size != f["bytes"] or sha256_file(p) != f["sha256"]:
            raise InputError(
                f"{where}: {f['name']!r} does not match its SHA-256 in {MANIFEST}; the file was "
                "changed or damaged after the run wrote it"
            )
    listed = {str(f["name"]) for f in files} | {MANIFEST}
    extra = sorted(e.name for e in folder.iterdir() if e.name not in listed)
    if extra:
        raise InputError(f"{where} holds files its {MANIFEST} does not list ({', '.join(extra[:4])})")
    return manifest


def in_saved_run(path: Path) -> bool:
    """Whether the file at ``path`` belongs to a saved run whose folder must match its manifest: the folder has
    privfed's manifest and the file is listed in it or bears a name privfed writes (an entry dropped from the
    manifest is no way past the check), or the manifest no longer reads as a manifest at all (damaged to
    ``[]`` or emptied) and the file bears such a name.  Another tool's manifest (a JSON object naming
    another ``tool``) makes no privfed run of the folder."""
    if not (path.parent / MANIFEST).exists():
        return False
    listed = manifest_names(path.parent)
    if listed is not None:
        return path.name in listed or path.name in OUTPUT_NAMES
    try:
        data = json.loads(read_regular_text(path.parent / MANIFEST, MANIFEST))
    except (ValueError, OSError, InputError):
        data = None
    foreign = isinstance(data, dict) and isinstance(data.get("tool"), str) and data["tool"] != "privfed"
    return path.name in OUTPUT_NAMES and not foreign


def manifest_names(folder: Path) -> set[str] | None:
    """The file names a privfed manifest in ``folder`` lists (old and new formats), or None."""
    try:
        data = json.loads(read_regular_text(folder / MANIFEST, f"{MANIFEST} in {str(folder)!r}"))
    except (ValueError, OSError, InputError):
        return None
    if not (isinstance(data, dict) and data.get("tool") == "privfed" and isinstance(data.get("files"), list)):
        return None
    names = (f.get("name") if isinstance(f, dict) else f for f in data["files"])
    return {n for n in names if isinstance(n, str)} | {MANIFEST}


def written_name(name: str, *, before_manifests: bool = False) -> bool:
    """Whether ``name`` is one the commands write into a result folder: :data:`OUTPUT_NAMES` and the figures
    (``tradeoff`` and the attack's ``grid_<method>_eps<eps>[_n<n>]``, as png, pdf and svg); with
    ``before_manifests``, the names a run wrote before folders had a manifest (no pdf or svg figures)."""
    if name in OUTPUT_NAMES:
        return True
    stem, _, ext = name.rpartition(".")
    if before_manifests:
        return stem.startswith("grid_") and ext == "png"
    grid = re.fullmatch(r"grid_[a-z0-9-]+_eps[0-9a-z.+-]+(_n\d+)?", stem) is not None
    return ext in ("png", "pdf", "svg") and (stem == "tradeoff" or grid)


def intact_names(folder: Path) -> set[str]:
    """The files a privfed manifest in ``folder`` lists that still hold what the run wrote (their recorded size
    and SHA-256), with the manifest itself; empty without a privfed manifest.  A listed file that was changed
    is not counted: what a run may replace is what it wrote, not a user's file a manifest names."""
    try:
        data = json.loads(read_regular_text(folder / MANIFEST, f"{MANIFEST} in {str(folder)!r}"))
    except (ValueError, OSError, InputError):
        return set()
    if not (isinstance(data, dict) and data.get("tool") == "privfed" and isinstance(data.get("files"), list)):
        return set()
    out = {MANIFEST}
    for f in data["files"]:
        with contextlib.suppress(OSError):  # a name too long for the file system, say: not the run's file
            entry = isinstance(f, dict) and {"name", "bytes", "sha256"} <= set(f)
            if not entry or _malformed_entry(folder, f):
                continue
            p = folder / f["name"]
            if p.is_file() and p.stat().st_size == f["bytes"] and sha256_file(p) == f["sha256"]:
                out.add(f["name"])
    return out


def _is_ours(name: str) -> bool:
    return name.startswith(".") and name.endswith((TMP_SUFFIX, STAGING_SUFFIX, WORK_SUFFIX))


def previous_run_files(path: Path) -> tuple[set[str], list[str]]:
    """Split a folder's entries into (files a previous privfed run wrote, everything else): what ``--overwrite``
    may replace, and what makes it refuse."""
    names = manifest_names(path)
    listed = intact_names(path) | set(filter(written_name, names or ()))
    # without a manifest, a run written before manifests existed: its results.json / config.json say so
    legacy, markers = False, ("results.json", "results.partial.json", "config.json", "report.json")
    for marker in markers if names is None else ():
        try:
            if not (path / marker).exists():
                continue
            data = json.loads(read_regular_text(path / marker, f"{marker} in {str(path)!r}"))
        except (ValueError, OSError, InputError):
            continue
        if isinstance(data, dict) and "versions" in data and ("config" in data or "attack" in data):
            legacy = True
    ours, foreign = set(), []
    for entry in sorted(path.iterdir()):
        n = entry.name
        mine = n in listed or _is_ours(n) or (legacy and written_name(n, before_manifests=True))
        if entry.is_file() and not entry.is_symlink() and mine:
            ours.add(n)
        else:
            foreign.append(n)
    return ours, foreign
