"""The sums over samples statistics are made of: Gram matrix, row sums and second moments by group."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.linalg.blas import dsyrk

__all__ = ["GramSum", "add_rows_by", "gram_of", "group_second_moments", "sorted_segments", "sum_rows_by"]

# Memory bound (bytes) of one padded block in the batched d x d products.
_BLOCK_BYTES = 64 * 2**20


def gram_of(F: np.ndarray) -> np.ndarray:
    """F^T F with one BLAS product (numpy's, which computes A^T A as a symmetric rank-k update).

    For a sum over many blocks use :class:`GramSum`, which adds each block in place.
    """
    return F.T @ F


class GramSum:
    """A running X^T X over blocks of rows, each added in place by one BLAS ``dsyrk`` with beta = 1.

    Adding a block costs its product alone: no d x d temporary, no d x d addition and no copy of the
    triangle per block, so many small blocks (cache-sized tiles written just before) cost what one
    product over all the rows costs (measured at iNat-120K's d = 1,280: 53,329 rows in tiles of 512 rows
    1.00-1.03 s against 1.02-1.10 s for one numpy product, and 1.12 s for numpy in five blocks with
    an addition each).  Only one triangle is accumulated; :meth:`result` mirrors it once, in place.

    The product is scipy's BLAS, loaded with this module, so ``threadpoolctl`` limits set after
    ``import privfed`` reach it.  An earlier scipy's two-thread syrk stalled on a loaded machine
    (108 ms for a 1000 x 64 block); scipy 1.17's does not (with another process on one of two cores,
    two threads: median 0.09 ms for that block, as numpy's product, worst of 50 0.4 ms against numpy's
    1.0 ms).
    """

    __slots__ = ("_c", "rows")

    def __init__(self, d: int):
        self._c: np.ndarray | None = np.zeros((d, d), order="F")
        self.rows = 0

    def _acc(self) -> np.ndarray:
        if self._c is None:
            raise RuntimeError("this GramSum's result() was taken; start a new GramSum for a new sum")
        return self._c

    def add(self, X: np.ndarray, sign: float = 1.0) -> None:
        """Adds X^T X (``sign=-1``: subtracts it) for the rows of ``X`` (m, d), float64; C-ordered rows are
        read in place."""
        c = self._acc()
        if X.ndim != 2 or X.shape[1] != c.shape[0]:
            raise ValueError(f"GramSum of d = {c.shape[0]} takes blocks (m, {c.shape[0]}), got {X.shape}")
        if X.shape[0] == 0 or X.shape[1] == 0:  # nothing to add (BLAS refuses empty operands)
            return
        # X^T of a C-ordered X is Fortran-ordered: syrk reads it without a copy (trans=0: A A^T).
        self._c = dsyrk(float(sign), X.T, beta=1.0, c=c, trans=0, lower=0, overwrite_c=1)
        self.rows += X.shape[0]

    def diagonal(self) -> np.ndarray:
        """The diagonal of the sum so far (a copy)."""
        return np.diagonal(self._acc()).copy()

    def result(self) -> np.ndarray:
        """The symmetric sum, C-ordered (d, d); the accumulator is spent (it becomes the result)."""
        # The Fortran-ordered upper triangle is the C-ordered view's lower one: mirror it into the
        # view's upper triangle in 64 x 64 tiles (each tile's reads and writes stay in cache: 3 ms at
        # d = 1,280, against 16 ms for one transposed addition).
        out = self._acc().T
        d, t = out.shape[0], 64
        for a in range(0, d, t):
            b = min(a + t, d)
            for e in range(b, d, t):
                f = min(e + t, d)
                out[a:b, e:f] = out[e:f, a:b].T
            block = out[a:b, a:b]
            upper = np.triu_indices(b - a, 1)
            block[upper] = block.T[upper]
        self._c = None
        return out


def sum_rows_by(F: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum rows of F by group id with one sparse-dense product (no sample loop)."""
    n = F.shape[0]
    onehot = sp.csr_matrix((np.ones(n), (group, np.arange(n))), shape=(num_groups, n))
    return np.asarray(onehot @ F)


def add_rows_by(out: np.ndarray, F: np.ndarray, group: np.ndarray) -> None:
    """``out[g] += `` the sum of the rows of F in group g, in place, touching only the groups present (a
    chunk of uploads adds into its own few rows of ``out``, never a temporary as large as ``out``)."""
    if group.size == 0:
        return
    present, inv = np.unique(group, return_inverse=True)
    out[present] += sum_rows_by(F, inv.reshape(-1), present.size)


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
