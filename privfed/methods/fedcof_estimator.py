"""FedCOF's estimator in pieces: pure functions of the shared statistics (Eq. 5, 6, 8; App. E, I.1).

:class:`privfed.methods.fedcof.FedCOF` (every server path: dense, streamed, pair
rows) and its two-round secure protocol (:mod:`privfed.methods.fedcof_protocol`)
are built from these; :mod:`privfed.methods.fedcof` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from privfed.stats import ClientStats, GramSum

__all__ = [
    "FedCOFEstimate",
    "bias_from_sums",
    "class_covariances",
    "class_means",
    "class_totals",
    "multi_mean_ids",
    "noise_bias",
    "pair_spread",
    "spread_and_sums",
    "spread_matrix",
    "spread_weights",
    "valid_pairs",
    "within_matrix",
]


# -- estimator components (pure functions of the shared statistics) -------------
def valid_pairs(counts: np.ndarray) -> tuple[np.ndarray, int]:
    """Mask of (client, class) pairs that take part: n_kc > 0 (the drop rule).

    Returns the mask (K, C) and the number of pairs with a non-zero count <= 0
    that were dropped (noisy counts).
    """
    counts = np.asarray(counts, dtype=np.float64)
    mask = counts > 0
    return mask, int(np.count_nonzero(~mask & (counts != 0)))


def class_means(N: np.ndarray, S: np.ndarray) -> np.ndarray:
    """mu_c = S_c / N_c, 0 where N_c <= 0 (shape (C, d)); one C x d array, no temporary."""
    absent = ~(N > 0)
    mu = S / np.where(absent, 1.0, N)[:, None]
    if absent.any():
        mu[absent] = 0.0
    return mu


def class_totals(
    counts: np.ndarray, sums: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """N_c, S_c = N_c mu_c, mu_c (0 where N_c <= 0) and K_c from the valid pairs.

    Shapes: (C,), (C, d), (C, d), (C,).
    """
    n = np.where(mask, counts, 0.0)
    N = n.sum(axis=0)
    S = np.einsum("kc,kcd->cd", mask.astype(np.float64), sums)
    mu = class_means(N, S)
    Kc = mask.sum(axis=0)
    return N, S, mu, Kc


def spread_weights(N: np.ndarray, Kc: np.ndarray) -> np.ndarray:
    """w_c = (N_c - 1)/(K_c - 1) for classes with K_c >= 2 (N_c - 1 clamped at 0), else 0."""
    return np.where(Kc >= 2, np.maximum(N - 1.0, 0.0) / np.maximum(Kc - 1.0, 1.0), 0.0)


def spread_matrix(
    counts: np.ndarray,
    sums: np.ndarray,
    mu: np.ndarray,
    weights: np.ndarray,
    mask: np.ndarray,
    *,
    per_client: bool = False,
) -> np.ndarray:
    """sum_{k,c valid} w_c n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T.

    With ``weights = spread_weights(N, K_c)`` this is sum_c (N_c - 1) Sigma_c
    without shrinkage.  ``per_client=True`` returns each client's term,
    shape (K, d, d) (round 2 of the secure protocol); else the sum (d, d).
    """
    n = np.where(mask, counts, 0.0)
    safe = np.where(mask, counts, 1.0)
    dev = np.where(mask[..., None], sums / safe[..., None] - mu[None], 0.0)  # (K, C, d)
    scale = np.sqrt(n * weights[None, :])  # (K, C), >= 0
    X = dev * scale[..., None]
    if per_client:
        return np.matmul(np.swapaxes(X, 1, 2), X)  # batched BLAS, (K, d, d)
    X2 = X.reshape(-1, X.shape[-1])
    return X2.T @ X2


#: Bytes of the tile of rows :func:`spread_and_sums` and :func:`pair_spread` write (scaled, or centred
#: and scaled) and add to the spread at once (:class:`~privfed.stats.algebra.GramSum`): a tile is
#: written while the product of the previous one has left it in cache, so the rows are read from
#: memory once and never written back.  4 MiB: 409 rows at d = 1,280, 2,048 at d = 256.
SPREAD_TILE_BYTES = 4 * 2**20


def _tile_rows(d: int, rows: int) -> int:
    return max(1, min(SPREAD_TILE_BYTES // (8 * max(d, 1)), rows))


def _scaled_tile(pair_sums, src, contiguous: bool, scale, a: int, e: int, out: np.ndarray) -> np.ndarray:
    """``out`` = the pair sums of rows ``src[a:e]`` each times its ``scale``: one multiply when they are one
    slice (the usual case), else one gather then the multiply."""
    if contiguous:
        return np.multiply(pair_sums[src[0] + a : src[0] + e], scale[a:e, None], out=out)
    np.take(pair_sums, src[a:e], axis=0, out=out, mode="clip")  # indices in range: unbuffered
    out *= scale[a:e, None]
    return out


def pair_spread(
    pair_class: np.ndarray,
    pair_counts: np.ndarray,
    pair_sums: np.ndarray,
    mu: np.ndarray,
    weights: np.ndarray,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`spread_matrix` (summed) over the valid pair rows only: sum_p w_c n_p (m_p - mu_c)(m_p - mu_c)^T.

    ``pair_class`` / ``pair_counts`` describe the pairs with n_p > 0, held in
    ``pair_sums[rows]`` (``rows=None``: all of ``pair_sums``, in order; no
    copy of the M x d block is made either way); rows of classes with
    w_c = 0 are skipped.  Rows are centred and scaled a cache-sized tile at
    a time, (s_p / n_p - mu_c) sqrt(w_c n_p), and each tile is added to the
    spread where it lies (:data:`SPREAD_TILE_BYTES`): memory O(tile + d^2),
    cost X^T X over the rows plus one pass reading them.
    """
    d = mu.shape[1]
    wp = weights[pair_class]
    sel = np.flatnonzero(wp > 0)
    src = sel if rows is None else np.asarray(rows)[sel]  # rows of pair_sums
    contiguous = src.size == 0 or bool(np.all(np.diff(src) == 1))  # one slice (the usual case)
    if sel.size == 0:
        return np.zeros((d, d))
    root = np.sqrt(pair_counts[sel] * wp[sel])  # sqrt(w_c n_p)
    scale = root / pair_counts[sel]
    cls = pair_class[sel]
    tile = _tile_rows(d, sel.size)
    buf, U = np.empty((tile, d)), np.empty((tile, d))
    gram = GramSum(d)
    for t in range(0, sel.size, tile):
        e = min(t + tile, sel.size)
        X = _scaled_tile(pair_sums, src, contiguous, scale, t, e, buf[: e - t])
        V = U[: e - t]
        np.take(mu, cls[t:e], axis=0, out=V, mode="clip")
        V *= root[t:e, None]
        X -= V
        gram.add(X)
    return gram.result()


#: :func:`spread_and_sums` keeps its one-product spread only when the rounding bound of that product and
#: its C-row correction is at most this share of the spread (else the caller centres the rows first).
SPREAD_RTOL = 1e-9


def spread_and_sums(
    pair_class: np.ndarray,
    pair_counts: np.ndarray,
    pair_sums: np.ndarray,
    weights: np.ndarray,
    class_counts: np.ndarray,
    rows: np.ndarray | None = None,
    class_sums: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The class sums S_c and Eq. 6's spread as one X^T X: ``(S, spread)``, ``spread`` None when inexact.

    Over the pairs of class c (n_p > 0, sums in ``pair_sums[rows]``; ``rows=None``: all rows in order)
    and N_c = ``class_counts`` (every valid pair's count, count-only cells included), with
    S_c = sum_p s_p = N_c mu_c:

        sum_p w_c n_p (m_p - mu_c)(m_p - mu_c)^T = sum_p (w_c / n_p) s_p s_p^T - sum_c w_c N_c mu_c mu_c^T,

    so the rows need no centring: S is one sparse-dense product over the sums, the rows
    s_p sqrt(w_c / n_p) are written a cache-sized tile at a time (one multiply, no gather when they are
    one slice) and each tile is added to the spread where it lies (:class:`~privfed.stats.algebra.GramSum`),
    and the C-row correction Z^T Z (Z_c = S_c sqrt(w_c / N_c)) is subtracted in the same sum at the end.  Memory: one
    tile (:data:`SPREAD_TILE_BYTES`) and d x d; cost one X^T X, one pass reading the rows for the
    tiles and one for S, one C-row product.

    The difference loses what the uncentred product holds beyond the spread: each entry's rounding
    error is at most (m + C + 16) eps max_i (X^T X)_ii (a sum of m products in any order, the
    correction's C, the scaling and the subtraction), and the largest entry of the spread is a
    diagonal one.  When that bound exceeds :data:`SPREAD_RTOL` of it (class means long against the
    spread), ``spread`` is None and the caller centres the rows on mu_c first (:func:`pair_spread`).

    ``class_sums``: S over these very pairs when the server folded it as they arrived (then the rows are
    read once, for the tiles); returned as given.
    """
    C, d = weights.shape[0], pair_sums.shape[1]
    src_all = np.arange(pair_class.size) if rows is None else np.asarray(rows)
    if class_sums is None:
        onehot = sp.csr_matrix(
            (np.ones(pair_class.size), (pair_class, src_all)), shape=(C, pair_sums.shape[0])
        )
        S = np.asarray(onehot @ pair_sums)
        del onehot
    else:
        S = class_sums
    wp = weights[pair_class]
    sel = np.flatnonzero(wp > 0)
    if sel.size == 0:
        return S, np.zeros((d, d))
    src = src_all[sel]  # rows of pair_sums
    contiguous = bool(np.all(np.diff(src) == 1))  # one slice (the usual case): no gather
    scale = np.sqrt(wp[sel] / pair_counts[sel])
    tile = _tile_rows(d, sel.size)
    buf = np.empty((tile, d))
    gram = GramSum(d)
    for a in range(0, sel.size, tile):
        e = min(a + tile, sel.size)
        gram.add(_scaled_tile(pair_sums, src, contiguous, scale, a, e, buf[: e - a]))
    del buf
    top = float(np.max(gram.diagonal()))
    present = np.flatnonzero(weights > 0)
    Z = S[present] * np.sqrt(weights[present] / class_counts[present])[:, None]
    gram.add(Z, sign=-1.0)
    out = gram.result()
    bound = (sel.size + C + 16) * np.finfo(np.float64).eps * top
    if not bound <= SPREAD_RTOL * float(np.max(np.diagonal(out))):
        return S, None
    return S, out


def noise_bias(counts: np.ndarray, mask: np.ndarray, noise_var: float) -> np.ndarray:
    """Per-class bias of Eq. 6 when each class sum carries iid noise of variance ``noise_var``.

    A noisy sum s_kc + e_kc, e_kc ~ (0, sigma^2 I), moves the shared mean by
    e_kc / n_kc and the global mean by sum_k e_kc / N_c; the expected extra
    spread is sigma^2 * (sum_k 1/n_kc - K_c/N_c) I, so Sigma_c is inflated by
    beta_c I with

        beta_c = sigma^2 / (K_c - 1) * (sum_k 1/n_kc - K_c / N_c)

    (methods.md section 4 states the leading term sigma^2/(K_c - 1) sum_k 1/n_kc).
    Returns beta (C,), 0 for classes with K_c < 2.
    """
    if noise_var == 0:
        return np.zeros(counts.shape[1])
    n = np.where(mask, counts, 0.0)
    inv = np.where(mask, 1.0 / np.where(mask, counts, 1.0), 0.0).sum(axis=0)
    N = n.sum(axis=0)
    Kc = mask.sum(axis=0)
    return bias_from_sums(inv, N, Kc, noise_var)


def bias_from_sums(inv_sum: np.ndarray, N: np.ndarray, Kc: np.ndarray, noise_var: float) -> np.ndarray:
    ok = (Kc >= 2) & (N > 0)
    return np.where(ok, noise_var * (inv_sum - Kc / np.where(N > 0, N, 1.0)) / np.maximum(Kc - 1.0, 1.0), 0.0)


def within_matrix(
    N: np.ndarray,
    S: np.ndarray,
    Kc: np.ndarray,
    spread: np.ndarray,
    gamma: float,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """G_hat = spread + sum_c (N_c - 1)(gamma - beta_c [K_c >= 2]) I + N mu_g mu_g^T  (Eq. 8).

    ``spread`` is :func:`spread_matrix` with :func:`spread_weights`; classes
    with N_c <= 0 are absent; (N_c - 1) is clamped at 0.
    """
    d = S.shape[1]
    present = N > 0
    w = np.where(present, np.maximum(N - 1.0, 0.0), 0.0)
    diag = gamma * w.sum()
    if bias is not None:
        diag -= float(np.sum(w * np.where(Kc >= 2, bias, 0.0)))
    Ntot = N[present].sum()
    s = S[present].sum(axis=0)
    out = np.outer(s, s / Ntot) if Ntot > 0 else np.zeros((d, d))  # the one d x d array made here
    out += spread
    out[np.diag_indices(d)] += diag
    return out


def class_covariances(stats: ClientStats, gamma: float = 0.0, noise_var: float = 0.0) -> np.ndarray:
    """Every class's Sigma_c of Eq. 6 (shape (C, d, d)), for analysis and tests.

    Classes with K_c < 2 get gamma I; absent classes gamma I too.
    """
    mask, _ = valid_pairs(stats.counts)
    N, S, mu, Kc = class_totals(stats.counts, stats.sums, mask)
    beta = noise_bias(stats.counts, mask, noise_var)
    C, d = mu.shape
    out = np.empty((C, d, d))
    for c in range(C):
        m = mask[:, c]
        if Kc[c] >= 2:
            dev = stats.sums[m, c] / stats.counts[m, c][:, None] - mu[c]
            out[c] = (dev.T * stats.counts[m, c]) @ dev / (Kc[c] - 1) + (gamma - beta[c]) * np.eye(d)
        else:
            out[c] = gamma * np.eye(d)
    return out


def multi_mean_ids(
    labels: np.ndarray,
    clients: np.ndarray,
    num_classes: int,
    num_clients: int,
    means: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Pseudo-client id of every sample for multi-mean sampling (App. E).

    Client k's class-c samples (n of them) are permuted at random and cut
    into g = max(1, min(means, n // 2)) contiguous near-equal chunks (each of
    at least 2 samples when n >= 2); chunk j of every class of client k goes
    to pseudo-client ``offset_k + j``.

    Returns (pseudo id per sample, owners: real client of each pseudo-client).
    """
    C = num_classes
    n = labels.shape[0]
    # Over the (client, class) cells that hold samples only: O(N log N), never a K x C array; each
    # N-long intermediate is written in place or freed when done (a few N-long integer arrays at once).
    cell, inv, sizes = np.unique(clients * C + labels, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    order = np.lexsort((rng.random(n), inv))
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    chunk = np.empty(n, dtype=np.int64)  # the rank of each sample within its cell, then its chunk
    chunk[order] = np.arange(n)
    del order
    chunk -= starts[inv]
    g = np.maximum(1, np.minimum(means, sizes // 2))
    chunk *= g[inv]
    chunk //= sizes[inv]
    del inv
    per_client = np.ones(num_clients, dtype=np.int64)  # a client without samples keeps one (empty) row
    np.maximum.at(per_client, cell // C, g)
    offset = np.concatenate(([0], np.cumsum(per_client)[:-1]))
    chunk += offset[clients]
    pseudo = chunk
    owners = np.repeat(np.arange(num_clients), per_client)
    return pseudo, owners


@dataclass
class FedCOFEstimate:
    """The server's intermediate quantities (returned in the head's ``extras``)."""

    N: np.ndarray  # (C,) class counts used
    mu: np.ndarray  # (C, d) global class means
    Kc: np.ndarray  # (C,) number of means per class
    G_hat: np.ndarray  # (d, d)
    notes: list[str] = field(default_factory=list)
    spread: np.ndarray | None = None  # (d, d) Eq. 6's sum_c (N_c - 1) Sigma_c before shrinkage
