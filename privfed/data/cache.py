"""On-disk cache of derived artefacts (trained backbones, extracted features).

An artefact is stored under a key that is the SHA-256 of a canonical JSON
description of *everything* that determines it (data set, split, backbone
weights, preprocessing, training hyper-parameters).  Change any of those and
the key changes, so a stale artefact is never reused.

Every cache file is verified when it is read.  A file is one envelope::

    MAGIC (16 bytes) | header length (8 bytes, little-endian) | header (JSON) | payload

where the header holds the canonical description, the payload's format
(``"npz"`` or ``"torch"``), its size and its SHA-256, recorded when the file
was written.  On read the description must match the one asked for and the
payload must hash to the recorded digest; anything else (a flipped bit, a
truncated file, a file of an older format, a key collision) is a cache miss:
the caller rebuilds the artefact and overwrites the file, and one
:class:`CacheIntegrityWarning` line says which file failed and why.  A file
that is simply absent is a silent miss.

Writes are atomic (a temporary file in the same directory, then
:func:`os.replace`), so an interrupted run never leaves a half-written file
under a valid name.  A cache directory that exists but cannot be written to
(a shared, read-only cache) is used for reading; artefacts that are missing
from it are computed in memory and a warning says they could not be stored.

The cache directory is ``$PRIVFED_CACHE`` when set, else the platform's user
cache directory (``~/.cache/privfed`` on Linux).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import struct
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from privfed._validation import open_regular
from privfed.errors import ConfigError, InputError

__all__ = [
    "CacheIntegrityWarning",
    "artefact_path",
    "atomic_write_bytes",
    "cache_key",
    "cached_arrays",
    "canonical_json",
    "default_cache_dir",
    "load_arrays",
    "load_torch",
    "resolve_cache_dir",
    "save_arrays",
    "save_torch",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "PRIVFED_CACHE"

#: First bytes of every cache file (the trailing digit is the envelope version).
MAGIC = b"PRIVFED-CACHE-1\n"
_LEN = struct.Struct("<Q")
#: Largest header accepted (the description is a few hundred bytes).
_MAX_HEADER = 1 << 20


class CacheIntegrityWarning(UserWarning):
    """A cache file failed its integrity check (or could not be written) and is rebuilt."""


def default_cache_dir() -> pathlib.Path:
    """The cache directory: ``$PRIVFED_CACHE`` if set, else the user cache dir.

    Returns
    -------
    pathlib.Path
        ``$PRIVFED_CACHE``; otherwise ``%LOCALAPPDATA%/privfed/Cache`` on
        Windows, ``~/Library/Caches/privfed`` on macOS and
        ``$XDG_CACHE_HOME/privfed`` (default ``~/.cache/privfed``) elsewhere.
        The directory is not created here.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return pathlib.Path(env).expanduser()
    home = pathlib.Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        return (pathlib.Path(base) if base else home / "AppData" / "Local") / "privfed" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "privfed"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else home / ".cache") / "privfed"


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """``cache_dir`` as an existing directory (``None`` -> :func:`default_cache_dir`).

    The directory is created when missing.  One that exists but is read-only
    is returned as is: it is read from, and writes to it are skipped with a
    warning (see :func:`_store`).
    """
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ConfigError(f"cache_dir must be a folder path (str or os.PathLike) or None, got {cache_dir!r}")
    path = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir).expanduser()
    if path.is_dir():
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in the way" if path.exists() or path.is_symlink() else exc.strerror or exc
        raise ConfigError(
            f"cache directory {str(path)!r} cannot be created ({why}); "
            f"set ${CACHE_ENV} to a writable directory (or, from Python, pass cache_dir=)"
        ) from None
    return path


def canonical_json(description: Mapping[str, Any]) -> str:
    """Sorted-key, whitespace-free JSON of ``description`` (the hashed form)."""
    try:
        return json.dumps(
            description, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cache key description is not plain JSON data: {exc}") from None


def cache_key(description: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of :func:`canonical_json` of ``description``."""
    return hashlib.sha256(canonical_json(description).encode("ascii")).hexdigest()


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a cache (or a package file) is readable by others
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _artefact_path(cache_dir: pathlib.Path, kind: str, key: str, suffix: str) -> pathlib.Path:
    return cache_dir / f"{kind}-{key[:32]}{suffix}"


# -- the verified envelope --------------------------------------------------------
def _envelope(payload: bytes, fmt: str, description: Mapping[str, Any]) -> bytes:
    header = {
        "description": json.loads(canonical_json(description)),
        "format": fmt,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "size": len(payload),
    }
    head = canonical_json(header).encode("ascii")
    return MAGIC + _LEN.pack(len(head)) + head + payload


def _notice(path: pathlib.Path, why: str) -> None:
    warnings.warn(f"privfed cache: {path.name} {why}; rebuilding it", CacheIntegrityWarning, stacklevel=4)


def _open_envelope(path: pathlib.Path, fmt: str, description: Mapping[str, Any] | None) -> bytes | None:
    """The verified payload of a cache file; ``None`` (with a notice unless absent) otherwise."""
    if not os.path.lexists(path):
        return None
    try:  # a FIFO or a device under an artefact's name is refused, never read (or waited on)
        with open_regular(path, path.name) as fh:
            data = fh.read()
    except InputError as exc:
        _notice(path, str(exc).removeprefix(path.name + " ").split(";")[0])
        return None
    except OSError as exc:
        _notice(path, f"cannot be read ({exc.strerror or exc})")
        return None
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LEN.size:
        _notice(path, "has no integrity record (corrupt, or written by an older version)")
        return None
    (n,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if n > _MAX_HEADER or start + n > len(data):
        _notice(path, "has a damaged header")
        return None
    try:
        header = json.loads(data[start : start + n].decode("ascii"))
        digest, size, stored_fmt = header["sha256"], int(header["size"]), header["format"]
        stored_desc = header["description"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        _notice(path, "has a damaged header")
        return None
    payload = data[start + n :]
    if stored_fmt != fmt:
        _notice(path, f"holds a {stored_fmt!r} artefact where {fmt!r} was expected")
        return None
    if description is not None and canonical_json(stored_desc) != canonical_json(description):
        _notice(path, "was built from another description (a key collision)")
        return None
    if len(payload) != size:
        _notice(path, f"is truncated ({len(payload)} of {size} payload bytes)")
        return None
    if hashlib.sha256(payload).hexdigest() != digest:
        _notice(path, "failed its SHA-256 check (the file changed after it was written)")
        return None
    return payload


def _store(path: pathlib.Path, blob: bytes) -> bool:
    """Write a cache file atomically; a read-only cache dir gives a warning, not an error."""
    try:
        atomic_write_bytes(path, blob)
        return True
    except OSError as exc:
        warnings.warn(
            f"privfed cache: cannot write {path.name} to {str(path.parent)!r} ({exc.strerror or exc}); "
            f"the result is used without being cached (set ${CACHE_ENV} to a writable directory to keep it)",
            CacheIntegrityWarning,
            stacklevel=3,
        )
        return False


def save_arrays(path: pathlib.Path, arrays: Mapping[str, np.ndarray], description: Mapping[str, Any]) -> bool:
    """Store ``arrays`` (``.npz`` payload) with ``description`` and its SHA-256, atomically.

    Returns whether the file was written (``False`` for a read-only cache).
    """
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return _store(pathlib.Path(path), _envelope(buf.getvalue(), "npz", description))


def load_arrays(
    path: pathlib.Path, description: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray] | None:
    """Read arrays saved by :func:`save_arrays`; ``None`` when missing or failing verification.

    When ``description`` is given, the stored description must equal it
    (guards against a truncated-key collision).
    """
    path = pathlib.Path(path)
    payload = _open_envelope(path, "npz", description)
    if payload is None:
        return None
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):  # pragma: no cover - hash-checked
        _notice(path, "cannot be parsed")
        return None


def save_torch(
    path: pathlib.Path, state: Mapping[str, Any], description: Mapping[str, Any] | None = None
) -> bool:
    """Store a ``state_dict``-like mapping (:func:`torch.save` payload) with its SHA-256, atomically."""
    import torch

    buf = io.BytesIO()
    torch.save(dict(state), buf)
    return _store(pathlib.Path(path), _envelope(buf.getvalue(), "torch", description or {}))


def load_torch(path: pathlib.Path, description: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Read a mapping saved by :func:`save_torch` (tensors only); ``None`` if missing or failing verification."""
    import torch

    path = pathlib.Path(path)
    payload = _open_envelope(path, "torch", description)
    if payload is None:
        return None
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception:  # pragma: no cover - hash-checked; any unreadable payload is a miss
        _notice(path, "cannot be parsed")
        return None
    return state if isinstance(state, dict) else None


def cached_arrays(
    kind: str,
    description: Mapping[str, Any],
    compute: Callable[[], Mapping[str, np.ndarray]],
    cache_dir: str | os.PathLike | None = None,
    validate: Callable[[Mapping[str, np.ndarray]], bool] | None = None,
) -> tuple[dict[str, np.ndarray], str, bool]:
    """Return the arrays for ``description``, computing and storing them on a miss.

    Parameters
    ----------
    kind : str
        A short prefix of the file name (e.g. ``"digits-features"``).
    description : mapping
        JSON data naming everything that determines the arrays.
    compute : callable
        Builds the arrays on a cache miss.
    cache_dir : path, optional
        Defaults to :func:`default_cache_dir`.
    validate : callable, optional
        Extra check of verified arrays (shapes); a ``False`` is a miss.

    Returns
    -------
    arrays : dict
    key : str
        The SHA-256 cache key.
    hit : bool
        Whether the arrays came from the cache.
    """
    key = cache_key(description)
    path = _artefact_path(resolve_cache_dir(cache_dir), kind, key, ".npz")
    got = load_arrays(path, description)
    if got is not None:
        if validate is None or validate(got):
            return got, key, True
        _notice(path, "holds arrays of the wrong shape")
    arrays = {k: np.asarray(v) for k, v in compute().items()}
    save_arrays(path, arrays, description)
    return arrays, key, False


def artefact_path(
    kind: str, description: Mapping[str, Any], suffix: str, cache_dir=None
) -> tuple[pathlib.Path, str]:
    """Path (in the created cache dir) and key of an artefact of ``kind``."""
    key = cache_key(description)
    return _artefact_path(resolve_cache_dir(cache_dir), kind, key, suffix), key
