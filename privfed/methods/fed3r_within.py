"""Fed3R-within: Fed3R's uploads with the between-class scatter removed.

Not in any paper's code: the variant suggested in the FedCOF peer reviews
(``/papers`` 001) and restated in methods.md section 2.  With the summed
second moment G, class sums and counts the server forms

    G_btw = sum_c N_c (mu_c - mu_g)(mu_c - mu_g)^T,
    G_hat = G - G_btw = sum_c (N_c - 1) S_c + N mu_g mu_g^T,

which is FedCOF's Eq. 8 matrix with the *exact* pooled within-class
covariances S_c, and W = (G_hat + sum_c (N_c - 1) gamma I + lam I)^-1 B,
columns normalised.  ``gamma`` is FedCOF's per-class shrinkage (Eq. 6: each
class covariance gets + gamma I), default 1 as FedCOF, so ``fed3r-within``
with ``gamma=g`` equals ``fedcof-oracle`` with ``gamma=g`` exactly; with
``gamma=0`` it is the plain formula.  All uploads
are sums, so it runs under secure aggregation with FedCOF's accuracy gain.
``lam`` (default 0) adds plain ridge shrinkage.  When G_hat is singular
(gamma = lam = 0 and d > N - C, or dead features) the solver falls back to
the pseudo-inverse and says so.
Communication: M d + K d^2 floats plus M counts.
"""

from __future__ import annotations

import numpy as np

from privfed._linalg import (
    MAX_REGULARISER,
    SOLVERS,
    check_choice,
    check_flag,
    check_real,
    minus_between,
    normalise_rows,
    solve_head,
)
from privfed.head import LinearHead
from privfed.methods import register
from privfed.methods.base import Method
from privfed.stats import ClientStats

__all__ = ["Fed3RWithin"]


@register
class Fed3RWithin(Method):
    """Within-class-scatter ridge head from summed G, class sums and counts.

    Parameters
    ----------
    gamma : float, default 1.0
        Per-class covariance shrinkage as FedCOF's Eq. 6 (adds
        sum_c (N_c - 1) gamma I to G_hat).
    lam : float, default 0.0
        Ridge penalty added to G_hat.
    solver : {"solve", "pinv"}, default "solve"
    normalise : bool, default True
    """

    name = "fed3r-within"
    paper = "Fed3R (Fani et al., 2024) with FedCOF's within-class matrix (Goswami et al., Eq. 8)"
    requires = frozenset({"counts", "sums", "second"})
    per_client = False
    defaults: dict = {"gamma": 1.0, "lam": 0.0, "solver": "solve", "normalise": True}

    def _validate_params(self) -> None:
        p = self.params
        p["gamma"] = check_real(self.name, "gamma", p["gamma"], low=0.0, high=MAX_REGULARISER)
        p["lam"] = check_real(self.name, "lam", p["lam"], low=0.0, high=MAX_REGULARISER)
        check_choice(self.name, "solver", p["solver"], SOLVERS)
        p["normalise"] = check_flag(self.name, "normalise", p["normalise"])

    def aggregate(self, stats: ClientStats) -> LinearHead:
        self._check_stats(stats)
        notes: list[str] = []
        N, S = stats.class_totals()
        self._refuse_non_finite("class counts or sums", N, S)
        present = N > 0
        if (~present).any():
            notes.append(
                f"class(es) {np.flatnonzero(~present).tolist()} have count <= 0; they are left out of "
                "the between-class scatter and their weight row is zero"
            )
        Np = np.where(present, N, 1.0)
        # G - sum_c N_c mu_c mu_c^T + N mu_g mu_g^T  (= G - G_btw)
        Sp = S if present.all() else S[present]
        G_hat = minus_between(stats.gram(), Sp, Np[present])
        self._refuse_non_finite("second moments", G_hat)
        Ntot = N[present].sum()
        if Ntot > 0:
            s = Sp.sum(axis=0)
            G_hat += np.outer(s, s / Ntot)
        shrink = self.params["gamma"] * np.maximum(N[present] - 1.0, 0.0).sum() + self.params["lam"]
        G_hat[np.diag_indices(stats.dim)] += shrink
        B = S.T if present.all() else np.where(present[:, None], S, 0.0).T
        W = solve_head(G_hat, B, solver=self.params["solver"], name="G_hat", notes=notes).T
        if self.params["normalise"]:
            W = normalise_rows(W)
        return self._head(W, np.zeros(W.shape[0]), notes)

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * d + K * d * d + M
