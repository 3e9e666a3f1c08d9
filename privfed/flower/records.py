"""A node's records named by content: what its ledger keys a release of its data by (:func:`data_fingerprint`).

Kept apart from :mod:`privfed.flower.node` (which loads the data) so that the charges, which name what a
release spends, read it without importing the node's data path.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib

import numpy as np

__all__ = ["data_fingerprint"]

#: Two fixed directions the rows are projected on to put them in a canonical order (public, not secret).
_DIRECTIONS_SEED = 20261128


def data_fingerprint(path: str) -> str:
    """The records of a node's feature file, named by content whatever their encoding: SHA-256 of the labels
    (int64) and the features rounded to float32 (-0.0 read as 0.0), rows in a canonical order (by label,
    then by two fixed projections of the row).  The same records saved again (another path, compressed, as
    float32, rows shuffled) are the same data to the node's ledger.  Computed once per file version (path,
    modification time, size).  Raises OSError or a privfed InputError where the file cannot be read."""
    file = pathlib.Path(path).expanduser()
    st = file.stat()
    return _fingerprint(str(file), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _fingerprint(path: str, mtime_ns: int, size: int) -> str:
    from privfed.data.npzfile import read_npz

    arrays = read_npz(pathlib.Path(path))
    F = np.asarray(arrays.get("features", np.zeros((0, 0))))
    y = np.asarray(arrays.get("labels", np.zeros(0))).astype(np.int64, copy=False).reshape(-1)
    F = (
        np.ascontiguousarray(F, dtype=np.float32).reshape(len(F), -1)
        if F.ndim
        else np.zeros((0, 0), np.float32)
    )
    F = F + np.float32(0.0)  # -0.0 + 0.0 is 0.0: a sign of zero is no other record
    if F.shape[0] == y.size and y.size > 1:
        r = np.random.default_rng(_DIRECTIONS_SEED).standard_normal((F.shape[1], 2)).astype(np.float32)
        p = F @ r if F.size else np.zeros((y.size, 2), np.float32)
        order = np.lexsort((p[:, 1], p[:, 0], y))
        F, y = F[order], y[order]
    h = hashlib.sha256(b"privfed node records\x00")
    h.update(np.asarray(F.shape, dtype=np.int64).tobytes())
    h.update(y.tobytes())
    h.update(np.ascontiguousarray(F).tobytes())
    return h.hexdigest()
