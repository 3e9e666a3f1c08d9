"""Client statistics: the one object that flows from clients to methods.

:class:`ClientStats` holds the statistics of ``K`` clients (or pseudo-clients,
see FedCOF's multi-mean sampling).  Every field is *additive*: the statistics
of a union of clients are the sum of theirs, so aggregation is a sum
(:meth:`ClientStats.total`, :class:`StatsFold`) and masking, homomorphic
encryption and noise act on the same arrays.  Server-side arrays are float64.

Fields (``K`` clients, ``C`` classes, ``d`` features), as dense views:

``counts``        (K, C)        n_kc, samples of class c on client k
``sums``          (K, C, d)     s_kc = sum of client k's class-c features
``second``        (K, d, d)     G_k = sum_i f_i f_i^T over all of client k's samples
``class_second``  (K, C, d, d)  sum of f f^T over client k's class-c samples
                                (the additive form of per-class scatter, used by
                                the FedCOF oracle / CCVR)

Storage is what exists.  A federation of K clients and C classes in which
only M (client, class) pairs hold data (M = 54,590 of K C = 11.2 million at
iNat-120K) is stored as the pair layout

``pair_client``   (M,)     client of each pair (sorted by client, then class)
``pair_class``    (M,)     class of each pair
``pair_counts``   (M,)     n_kc of each pair
``pair_sums``     (M, d)   s_kc of each pair

plus the summed second moment ``gram()`` = sum_k G_k (d, d).  A pair may be a
*count-only cell*: a noisy count kept for a class the client lacks (count
noise, FedCOF App. I.1) has a zero sum, and such cells are stored without a
row of ``pair_sums`` (:meth:`ClientStats.from_pairs` with ``sum_rows``; at
iNat-120K, Laplace count noise keeps about half of the 11 million empty cells,
56 GB of zero rows at d = 1,280).  Per-client and
per-class second moments are kept only where something asks for them per
client: statistics computed from features build them from the features on
first access.  The dense views above are built on demand (and cached);
one that would exceed :data:`DENSE_VIEW_LIMIT` bytes is refused with an
:class:`~privfed.errors.InputError` naming its size.  Statistics constructed
from dense arrays (as noise mechanisms do) keep them as given (no copy) and
derive the pair layout on demand: a pair is a (client, class) cell whose
count or sum is non-zero.

:class:`StatsFold` folds client statistics in chunk by chunk (memory
O(C d + d^2) for the total, O(M d + d^2) when the pairs are kept): the
aggregation step of the trade-off sweep and of a server receiving client
updates.  :func:`privfed.fit`, which holds every sample, folds them in one
sorted pass into the same result (:func:`privfed.release.pipeline.fold_statistics`).

Optional fields are ``None`` when not computed.  Counts are floats so that
noisy releases (which may be negative or fractional) use the same type.

The package's modules, lowest first: :mod:`~privfed.stats.arrays` (float64, read-only, the
dense-view limit), :mod:`~privfed.stats.algebra` (Gram matrix, sums and second moments by group),
:mod:`~privfed.stats.features`, :mod:`~privfed.stats.layout` (storage and views),
:mod:`~privfed.stats.client_stats` (the algebra of statistics), :mod:`~privfed.stats.checks`
(validation at the door), :mod:`~privfed.stats.fold` and :mod:`~privfed.stats.compute`.
"""

from __future__ import annotations

import sys
from types import ModuleType

from privfed.stats import arrays as _arrays
from privfed.stats.algebra import GramSum as GramSum
from privfed.stats.algebra import add_rows_by as add_rows_by
from privfed.stats.algebra import gram_of as gram_of
from privfed.stats.algebra import sorted_segments as sorted_segments
from privfed.stats.algebra import sum_rows_by as sum_rows_by
from privfed.stats.arrays import dense_view_limit
from privfed.stats.arrays import readonly as readonly
from privfed.stats.client_stats import ClientStats
from privfed.stats.compute import compute_client_stats
from privfed.stats.compute import stats_from_rows as stats_from_rows
from privfed.stats.fold import StatsFold
from privfed.stats.layout import STAT_FIELDS

__all__ = [
    "DENSE_VIEW_LIMIT",
    "STAT_FIELDS",
    "ClientStats",
    "StatsFold",
    "compute_client_stats",
    "dense_view_limit",
]


class _StatsModule(ModuleType):
    """``privfed.stats.DENSE_VIEW_LIMIT`` reads and assigns the limit :func:`dense_view_limit` checks."""

    @property
    def DENSE_VIEW_LIMIT(self) -> int:
        return _arrays.DENSE_VIEW_LIMIT

    @DENSE_VIEW_LIMIT.setter
    def DENSE_VIEW_LIMIT(self, value) -> None:
        _arrays.DENSE_VIEW_LIMIT = value


sys.modules[__name__].__class__ = _StatsModule
