"""FedNCM: federated nearest class mean (Legate et al., 2023).

Clients share class sums and counts; the server forms global class means
mu_c = sum_k s_kc / N_c and the classifier W_c = mu_c / ||mu_c||, predicting
argmax_c W_c^T f (methods.md section 2).  Needs only summed statistics, so it
runs under secure aggregation as it stands.  Communication: M d floats
(FedCOF paper, App. H).
"""

from __future__ import annotations

import numpy as np

from privfed._linalg import normalise_rows, safe_counts
from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats

__all__ = ["FedNCM"]


@register
class FedNCM(Method):
    """Nearest class mean with unit-norm class means as the linear head."""

    name = "fedncm"
    paper = (
        "Legate et al., Guiding the last layer in federated learning with pre-trained models, NeurIPS 2023"
    )
    requires = frozenset({"counts", "sums"})
    per_client = False
    defaults: dict = {}

    def scale_invariant(self) -> bool:
        return True

    def aggregate(self, stats: ClientStats) -> LinearHead:  # noqa: F821
        self._check_stats(stats)
        N, S = stats.class_totals()
        if not np.isfinite(
            N
        ).all():  # C numbers: checked always (the sums only where the server cannot vouch)
            self._refuse_non_finite_totals(N, S)
        counts, dropped = safe_counts(N)
        notes = []
        if dropped:
            notes.append(f"{dropped} class count(s) <= 0 after noise were treated as absent")
        missing = np.flatnonzero(counts == 0)
        if missing.size:
            notes.append(f"class(es) {missing.tolist()} have no data; their weight row is zero")
        # mu_c / ||mu_c|| = s_c / ||s_c|| for N_c > 0: the means are never formed (one pass over S
        # instead of three; within a few ulps of normalising S / N_c, see tests/methods/test_servers.py)
        W, finite = normalise_rows(S, certify=True)
        if not finite:  # a NaN or inf row would be zeroed by the normalisation: refuse it instead
            self._refuse_non_finite_totals(N, S)
        W[missing] = 0.0
        return self._head(W, np.zeros(W.shape[0]), notes, weight_proved_finite=finite)

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * d
