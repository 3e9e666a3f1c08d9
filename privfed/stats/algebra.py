"""The sums over samples statistics are made of: Gram matrix, row sums and second moments by group."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["gram_of", "group_second_moments", "sorted_segments", "sum_rows_by"]

# Memory bound (bytes) of one padded block in the batched d x d products.
_BLOCK_BYTES = 64 * 2**20


def gram_of(F: np.ndarray) -> np.ndarray:
    """F^T F with one BLAS GEMM.

    numpy's GEMM, not scipy's ``dsyrk``: scipy ships its own OpenBLAS whose
    threads a caller's ``threadpoolctl`` limit may not reach, and its syrk
    was measured 5-800 times slower than the GEMM with two threads on a
    loaded machine (and no faster with one).
    """
    return F.T @ F


def sum_rows_by(F: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum rows of F by group id with one sparse-dense product (no sample loop)."""
    n = F.shape[0]
    onehot = sp.csr_matrix((np.ones(n), (group, np.arange(n))), shape=(num_groups, n))
    return np.asarray(onehot @ F)


_group_sums = sum_rows_by


def group_second_moments(F: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """sum_i f_i f_i^T per group, as batched matmuls over zero-padded blocks."""
    d = F.shape[1]
    out = np.zeros((num_groups, d, d))
    order = np.argsort(group, kind="stable")
    sizes = np.bincount(group, minlength=num_groups)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    # Groups sorted by size; each block is padded to its largest group and
    # multiplied in one batched BLAS call, the padded block kept under _BLOCK_BYTES.
    nonempty = np.flatnonzero(sizes)
    nonempty = nonempty[np.argsort(sizes[nonempty], kind="stable")]
    Fs = F[order]
    i, m = 0, nonempty.size
    while i < m:
        j = i + 1
        while j < m and (j + 1 - i) * sizes[nonempty[j]] * d * 8 <= _BLOCK_BYTES:
            j += 1
        block = nonempty[i:j]
        n_max = int(sizes[block].max())
        pos = np.arange(n_max)
        valid = pos[None, :] < sizes[block][:, None]
        idx = np.where(valid, starts[block][:, None] + pos[None, :], 0)
        padded = np.where(valid[..., None], Fs[idx], 0.0)
        out[block] = np.matmul(padded.transpose(0, 2, 1), padded)
        i = j
    return out


def sorted_segments(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One stable sort of integer keys: (order, the distinct keys, CSR row pointer of their runs).

    ``key[order[indptr[j]:indptr[j + 1]]]`` all equal the j-th distinct key.
    """
    order = np.argsort(key, kind="stable")
    ks = key[order]
    starts = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1]))) if ks.size else np.zeros(0, np.int64)
    return order, ks[starts], np.concatenate((starts, [ks.size])).astype(np.int64)
