"""Computing client statistics from features, in one sorted pass (the pair layout)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

from privfed._validation import check_dataset, check_memory
from privfed.errors import InputError
from privfed.stats.algebra import gram_of, sorted_segments
from privfed.stats.arrays import readonly
from privfed.stats.client_stats import ClientStats
from privfed.stats.features import FeatureRows
from privfed.stats.layout import STAT_FIELDS

__all__ = ["compute_client_stats", "stats_from_rows"]


def stats_from_rows(
    F: np.ndarray, y: np.ndarray, k: np.ndarray, C: int, K: int, fields, owners=None
) -> ClientStats:
    """Pair-layout statistics of validated rows (F float64, y and k int64 in range)."""
    d = F.shape[1]
    key = k * C + y if K > 1 else y
    # One sort: the CSR one-hot of samples into pairs, then one sparse-dense product.
    order, uniq, indptr = sorted_segments(key)
    counts = np.diff(indptr).astype(np.float64)
    onehot = sp.csr_matrix((np.ones(key.size), order, indptr), shape=(uniq.size, key.size))
    S = np.asarray(onehot @ F) if uniq.size else np.zeros((0, d))
    pcl = uniq // C if K > 1 else np.zeros(uniq.size, dtype=np.int64)
    pairs = tuple(readonly(a) for a in (pcl, uniq % C, counts, S))
    out_fields = {"counts", "sums"} | (set(fields) & {"second", "class_second"})
    features = gram = None
    if out_fields - {"counts", "sums"}:
        check_memory(
            8.0 * d * d,
            f"the summed second moment of d={d:,} features (a d x d matrix)",
            "compute fields=('counts', 'sums') only, or reduce the feature dimension",
        )
        features = FeatureRows(F, k, y)
        gram = readonly(gram_of(F))
    return ClientStats._new(
        K, C, d, pairs=pairs, gram=gram, features=features, fields=out_fields, owners=owners
    )


def compute_client_stats(
    features,
    labels,
    clients=None,
    *,
    num_classes: int | None = None,
    num_clients: int | None = None,
    fields: Iterable[str] = ("counts", "sums"),
) -> ClientStats:
    """Compute every client's statistics at once (vectorised, float64, pair layout).

    Per-client and per-class second moments, when requested, are built from
    ``features`` on first access (their sum, ``gram()``, is computed now);
    do not modify ``features`` while the statistics are in use.

    Parameters
    ----------
    features : array, shape (N, d)
    labels : int array, shape (N,)
    clients : int array, shape (N,), optional
        Client id of each sample (0..K-1); ``None`` puts every sample on one client.
    num_classes, num_clients : int, optional
        Override C and K (useful when some ids have no sample).
    fields : iterable of str
        Which statistics to compute, among :data:`STAT_FIELDS`.

    Returns
    -------
    ClientStats
    """
    fields = {fields} if isinstance(fields, str) else set(fields)  # "second" is one name, not six letters
    unknown = fields - set(STAT_FIELDS)
    if unknown:
        raise InputError(f"unknown statistic(s) {sorted(unknown)}; choose from {list(STAT_FIELDS)}")
    if clients is None:
        F, y, k, C, _ = check_dataset(features, labels, None, num_classes)
        K = 1
    else:
        from privfed._validation import as_int_vector, check_features, check_labels

        F = check_features(features)
        y, C = check_labels(labels, F.shape[0], num_classes)
        k = as_int_vector(clients, "clients")
        if k.shape[0] != F.shape[0]:
            raise InputError(
                f"clients has {k.shape[0]} entries but features has {F.shape[0]} rows; they must match"
            )
        if k.size and k.min() < 0:
            raise InputError("clients must be >= 0")
        K = int(k.max()) + 1
    if num_clients is not None:
        from privfed._validation import check_num_classes

        num_clients = check_num_classes(num_clients, "num_clients")  # 3.5 was cut to 3, "3" a TypeError
        if num_clients < K:
            raise InputError(f"num_clients={num_clients} but client ids go up to {K - 1}")
        K = int(num_clients)
    return stats_from_rows(F, y, k, C, K, fields)
