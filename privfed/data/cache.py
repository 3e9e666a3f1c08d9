"""On-disk cache of derived artefacts (trained backbones, extracted features).

An artefact is stored under a key that is the SHA-256 of a canonical JSON
description of *everything* that determines it (data set, split, backbone,
weights, preprocessing, training hyper-parameters, library versions).  Change
any of those and the key changes, so a stale artefact is never reused.

Writes are atomic (a temporary file in the same directory, then
:func:`os.replace`), so an interrupted run never leaves a half-written file
under a valid name.  A file that cannot be read back (truncated, corrupt, the
wrong format) is treated as missing: the caller recomputes and overwrites it.

The cache directory is ``$PRIVFED_CACHE`` when set, else the platform's user
cache directory (``~/.cache/privfed`` on Linux).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from privfed.errors import ConfigError

__all__ = [
    "default_cache_dir",
    "resolve_cache_dir",
    "cache_key",
    "canonical_json",
    "atomic_write_bytes",
    "save_arrays",
    "load_arrays",
    "save_torch",
    "load_torch",
    "cached_arrays",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "PRIVFED_CACHE"


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
    """``cache_dir`` as a created directory (``None`` -> :func:`default_cache_dir`)."""
    path = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cache directory {str(path)!r} cannot be created ({exc.strerror or exc}); "
            f"pass cache_dir= or set ${CACHE_ENV} to a writable directory"
        ) from None
    if not os.access(path, os.W_OK):
        raise ConfigError(
            f"cache directory {str(path)!r} is not writable; pass cache_dir= or set ${CACHE_ENV} "
            "to a writable directory"
        )
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
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _artefact_path(cache_dir: pathlib.Path, kind: str, key: str, suffix: str) -> pathlib.Path:
    return cache_dir / f"{kind}-{key[:32]}{suffix}"


def save_arrays(path: pathlib.Path, arrays: Mapping[str, np.ndarray], description: Mapping[str, Any]) -> None:
    """Store ``arrays`` and the JSON ``description`` in one ``.npz`` file, atomically."""
    buf = io.BytesIO()
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    payload["__description__"] = np.frombuffer(canonical_json(description).encode("ascii"), dtype=np.uint8)
    np.savez(buf, **payload)
    atomic_write_bytes(path, buf.getvalue())


def load_arrays(
    path: pathlib.Path, description: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray] | None:
    """Read arrays saved by :func:`save_arrays`; ``None`` when missing or unreadable.

    When ``description`` is given, the stored description must equal it
    (guards against a truncated-key collision); otherwise ``None``.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):
        return None
    stored = out.pop("__description__", None)
    if description is not None:
        if stored is None or bytes(stored.astype(np.uint8)).decode("ascii", "replace") != canonical_json(
            description
        ):
            return None
    return out


def save_torch(path: pathlib.Path, state: Mapping[str, Any]) -> None:
    """Store a ``state_dict``-like mapping with :func:`torch.save`, atomically."""
    import torch

    buf = io.BytesIO()
    torch.save(dict(state), buf)
    atomic_write_bytes(path, buf.getvalue())


def load_torch(path: pathlib.Path) -> dict[str, Any] | None:
    """Read a mapping saved by :func:`save_torch` (tensors only); ``None`` if missing or corrupt."""
    import torch

    path = pathlib.Path(path)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # any unreadable file is a cache miss, recomputed by the caller
        return None
    return state if isinstance(state, dict) else None


def cached_arrays(
    kind: str,
    description: Mapping[str, Any],
    compute: Callable[[], Mapping[str, np.ndarray]],
    cache_dir: str | os.PathLike | None = None,
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
        return got, key, True
    arrays = {k: np.asarray(v) for k, v in compute().items()}
    save_arrays(path, arrays, description)
    return arrays, key, False


def artefact_path(
    kind: str, description: Mapping[str, Any], suffix: str, cache_dir=None
) -> tuple[pathlib.Path, str]:
    """Path (in the created cache dir) and key of an artefact of ``kind``."""
    key = cache_key(description)
    return _artefact_path(resolve_cache_dir(cache_dir), kind, key, suffix), key
