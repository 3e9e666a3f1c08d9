"""Fed3R: federated ridge-regression head (Fani et al., ICML 2024).

Clients upload their second moment G_k = F_k^T F_k and class sums; the
server solves the ridge regression of one-hot labels on features,

    W = (G + lambda I)^-1 B,   G = sum_k G_k,   B = [s_1 ... s_C] = F^T Y,

and normalises each class column (methods.md section 2; FedCOF paper Eq. 7
writes G and B this way).  The official Fed3R code appends a constant-1
feature, so lambda also regularises the bias: with phi = [f, 1] the Gram
matrix gains the row/column [sum_i f_i, N] and B the row [N_1 ... N_C], both
from the summed class sums and counts (no extra upload).  The bias entry is
divided by the norm of its class's weight column (methods.md section 6).
``bias=False`` is FedCOF's re-implementation (no constant feature).
Only sums are needed, so secure aggregation applies as is.
Communication: M d + K d^2 floats (FedCOF paper App. H).
"""

from __future__ import annotations

import numpy as np

from privfed._linalg import (
    MAX_REGULARISER,
    SOLVERS,
    check_choice,
    check_flag,
    check_real,
    normalise_rows,
    solve_head,
)
from privfed.head import LinearHead
from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats

__all__ = ["Fed3R", "ridge_system"]


def ridge_system(
    stats: ClientStats, lam: float, bias: bool, totals: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The regularised Gram matrix and right-hand side of Fed3R from summed statistics.

    Returns ``(G + lam I, B)`` with shapes (p, p) and (p, C), p = d + 1 when
    ``bias`` (constant feature appended last) else d.  ``totals``: ``stats.class_totals()``, when the
    caller has them.
    """
    n, S = stats.class_totals() if totals is None else totals  # (C,), (C, d)
    G = stats.gram()
    if bias:
        s = S.sum(axis=0)
        d = G.shape[0]
        Ga = np.empty((d + 1, d + 1))
        Ga[:d, :d] = G
        Ga[:d, d] = s
        Ga[d, :d] = s
        Ga[d, d] = n.sum()
        G = Ga
        B = np.vstack([S.T, n[None, :]])
        G[np.diag_indices(d + 1)] += lam
    else:
        B = S.T
        G = G + lam * np.eye(G.shape[0])
    return G, B


@register
class Fed3R(Method):
    """Ridge-regression head from summed second moments and class sums.

    Parameters
    ----------
    lam : float, default 0.01
        Ridge penalty lambda >= 0.
    bias : bool, default True
        Append a constant-1 feature (official Fed3R code); ``False`` is FedCOF's
        re-implementation without bias.
    normalise : bool, default True
        Divide each class's weight vector (and its bias) by the vector's L2 norm.
    solver : {"solve", "pinv"}, default "solve"
    """

    name = "fed3r"
    paper = (
        "Fani et al., Accelerating heterogeneous federated learning with closed-form classifiers, ICML 2024"
    )
    requires = frozenset({"counts", "sums", "second"})
    per_client = False
    defaults: dict = {"lam": 0.01, "bias": True, "normalise": True, "solver": "solve"}

    def _validate_params(self) -> None:
        self.params["lam"] = check_real(self.name, "lam", self.params["lam"], low=0.0, high=MAX_REGULARISER)
        self.params["bias"] = check_flag(self.name, "bias", self.params["bias"])
        self.params["normalise"] = check_flag(self.name, "normalise", self.params["normalise"])
        check_choice(self.name, "solver", self.params["solver"], SOLVERS)

    def aggregate(self, stats: ClientStats) -> LinearHead:
        self._check_stats(stats)
        notes: list[str] = []
        totals = stats.class_totals()
        A, B = ridge_system(stats, self.params["lam"], self.params["bias"], totals)
        absent = np.flatnonzero(totals[0] <= 0)
        if absent.size:  # said, as every method says it (it was silent): the row is fitted to no sample
            notes.append(
                f"class(es) {absent[:10].tolist()} have count <= 0 (no data"
                + (", no client uploaded statistics" if stats.num_clients == 0 else "")
                + "); their row of the head is fitted to no sample (zero without noise) and is still the top "
                "score where every other class scores below it"
            )
        self._refuse_non_finite("second moments, class sums or counts", A, B)
        X = solve_head(A, B, solver=self.params["solver"], name="G + lam I", notes=notes).T  # (C, p)
        d = stats.dim
        W, b = (X[:, :d], X[:, d]) if self.params["bias"] else (X, np.zeros(X.shape[0]))
        if self.params["normalise"]:
            W, b = normalise_rows(W, b)
        return self._head(W, b, notes)

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * d + K * d * d
