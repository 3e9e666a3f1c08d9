"""FedCOF-oracle: the FedCOF classifier from the clients' true class covariances.

Goswami et al. (FedCOF paper), Eq. 24 (the CCVR aggregation of Luo et al.,
2021): clients share full class covariances Sigma_kc with their means and
counts, and the server pools them exactly,

    Sigma_c = sum_k (n_kc - 1)/(N_c - 1) Sigma_kc + sum_k n_kc/(N_c - 1) mu_kc mu_kc^T
              - N_c/(N_c - 1) mu_c mu_c^T,

then adds gamma I and builds the head with Eq. 8 (as FedCOF).  Here clients
upload the additive per-class second moments sum_{i in class c} f_i f_i^T
(``class_second``), from which (N_c - 1) Sigma_c = sum_k class_second_kc -
N_c mu_c mu_c^T; Eq. 24 is the same quantity written with per-client
covariances.  Summable, so secure aggregation applies as is.

The server never needs the per-class d x d matrices: with exact class
second moments, sum_c (N_c - 1) Sigma_c = G - sum_c N_c mu_c mu_c^T where
G = sum_c sum_k class_second_kc is the total second moment (classes with one
sample contribute f f^T - f f^T = 0 on both sides), which is fed3r-within's
G_hat.  So when the per-class second moments come from features (they are
then built only if someone asks for them) the head is computed from their
sum alone, in O(d^2) memory; per-class values handed over as arrays (e.g.
noisy ones) are pooled class by class as Eq. 24 writes.
Communication: M (d + d^2) floats (App. H).
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

__all__ = ["FedCOFOracle", "pooled_class_covariances"]


def pooled_class_covariances(stats: ClientStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact pooled class covariances from summed ``class_second`` (Eq. 24).

    Returns ``(N, mu, Sigma)`` with shapes (C,), (C, d), (C, d, d); Sigma_c is
    0 for classes with N_c <= 1.
    """
    N, S = stats.class_totals()
    mu = np.where(N[:, None] > 0, S / np.where(N > 0, N, 1.0)[:, None], 0.0)
    scatter = stats.class_second.sum(axis=0) - N[:, None, None] * np.einsum("cd,ce->cde", mu, mu)
    Sigma = np.where((N > 1)[:, None, None], scatter / np.where(N > 1, N - 1.0, 1.0)[:, None, None], 0.0)
    return N, mu, Sigma


@register
class FedCOFOracle(Method):
    """Eq. 8 head from exactly pooled class covariances (Eq. 24).

    Parameters
    ----------
    gamma : float, default 1.0
        Shrinkage added to every class covariance.
    solver : {"pinv", "solve"}, default "pinv"
    normalise : bool, default True
    """

    name = "fedcof-oracle"
    paper = "Goswami et al., FedCOF (Eq. 24, oracle aggregation of class covariances as CCVR)"
    requires = frozenset({"counts", "sums", "class_second"})
    per_client = False
    defaults: dict = {"gamma": 1.0, "solver": "pinv", "normalise": True}

    def _validate_params(self) -> None:
        p = self.params
        p["gamma"] = check_real(self.name, "gamma", p["gamma"], low=0.0, high=MAX_REGULARISER)
        check_choice(self.name, "solver", p["solver"], SOLVERS)
        p["normalise"] = check_flag(self.name, "normalise", p["normalise"])

    def aggregate(self, stats: ClientStats) -> LinearHead:
        self._check_stats(stats)
        notes: list[str] = []
        d = stats.dim
        if stats.is_materialised("class_second"):
            N, mu, Sigma = pooled_class_covariances(stats)
            present = N > 0
            w = np.where(present, np.maximum(N - 1.0, 0.0), 0.0)
            G_hat = np.einsum("c,cde->de", w, Sigma)
            self._refuse_non_finite("class counts, sums or second moments", N, mu, G_hat)
        else:
            # sum_c (N_c - 1) Sigma_c from the total second moment (module docstring).
            N, S = stats.class_totals()
            present = N > 0
            Np = np.where(present, N, 1.0)
            w = np.where(present, np.maximum(N - 1.0, 0.0), 0.0)
            G_hat = minus_between(stats.gram(), S if present.all() else S[present], Np[present])
            self._refuse_non_finite("class counts, sums or second moments", N, S, G_hat)
            if (
                present.all()
            ):  # B = N_c mu_c is S itself (its transpose a Fortran-ordered view): no temporaries
                self._finish_gram(G_hat, S.sum(axis=0), N.sum(), w, d)
                W = solve_head(G_hat, S.T, solver=self.params["solver"], name="G_hat", notes=notes).T
                if self.params["normalise"]:
                    W = normalise_rows(W)
                return self._head(W, np.zeros(W.shape[0]), notes)
            mu = np.where(present[:, None], S / Np[:, None], 0.0)
        if (~present).any():
            absent = np.flatnonzero(~present).tolist()
            notes.append(f"class(es) {absent} have no data; their weight row is zero")
        Ntot = N[present].sum()
        s = (mu * N[:, None])[present].sum(axis=0)
        self._finish_gram(G_hat, s, Ntot, w, d)
        B = (mu * np.where(present, N, 0.0)[:, None]).T
        W = solve_head(G_hat, B, solver=self.params["solver"], name="G_hat", notes=notes).T
        if self.params["normalise"]:
            W = normalise_rows(W)
        return self._head(W, np.zeros(W.shape[0]), notes)

    def _finish_gram(self, G_hat: np.ndarray, s: np.ndarray, Ntot: float, w: np.ndarray, d: int) -> None:
        """In place: G_hat += gamma sum_c (N_c - 1) I + N mu_g mu_g^T (s = N mu_g, the sum of the class sums)."""
        G_hat[np.diag_indices(d)] += self.params["gamma"] * w.sum()
        if Ntot > 0:
            G_hat += np.outer(s, s / Ntot)

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * (d + d * d)
