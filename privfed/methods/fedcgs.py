"""FedCGS: Gaussian (shared-covariance) classifier from global statistics.

Guan et al., "A one-shot federated learning framework with global
statistics" (the FedCGS paper in ``/papers``).  Clients upload class sums
A_kc = s_kc, class counts and one second moment B_k = G_k; the server
rebuilds the exact global statistics

    mu_c = A_c / N_c,   mu = A / N,   Sigma = (B - N mu mu^T) / (N - 1)   (total covariance)

and the Gaussian classifier with shared covariance

    w_c = Sigma^-1 mu_c,   b_c = log(N_c / N) - 1/2 mu_c^T Sigma^-1 mu_c

(the paper prints Sigma where Sigma^-1 is meant; methods.md section 2).
``covariance="within"`` (beyond the paper) uses the pooled within-class
covariance (B - sum_c N_c mu_c mu_c^T) / (N - C), i.e. proper LDA.
``shrinkage`` a in [0, 1] uses (1 - a) Sigma + a (tr Sigma / d) I (the
Ledoit-Wolf target, as scikit-learn's LDA); with a = 0 a singular Sigma
(e.g. d > N - C) is an error telling to set shrinkage > 0.  The official
code uses a = 0 and ``inv``.  Summable statistics: secure aggregation
applies as is.  Communication: K ((C + d) d + C) floats (upper bound).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from privfed._linalg import check_choice, check_real, minus_between, project_psd, try_cholesky_solve
from privfed.errors import InputError
from privfed.head import LinearHead
from privfed.methods import register
from privfed.methods.base import Method
from privfed.notes import Note
from privfed.stats import ClientStats

__all__ = ["FedCGS", "global_covariance"]


def _whole_counts(N: np.ndarray) -> bool:
    """Whether the class counts are positive whole numbers, as exact (noise-free, unscaled) counts are."""
    return bool(np.all(N > 0) and np.all(N == np.round(N)))


def global_covariance(
    stats: ClientStats, covariance: str = "total", notes: list | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N_c, mu_c, Sigma) from summed statistics; classes with N_c <= 0 are left out.

    Returns shapes (C,), (C, d) (zero rows for absent classes) and (d, d).  The divisor N - 1
    (N - C for ``"within"``) of noisy counts may fall to 0 or below although the data hold many
    samples: with ``notes`` it is then raised to 1 and a note says so (exact counts that leave no
    divisor mean too little data and are refused).
    """
    N, S = stats.class_totals()
    present = N > 0
    Np = np.where(present, N, 1.0)
    mu = np.where(present[:, None], S / Np[:, None], 0.0)
    Ntot = N[present].sum()
    G = stats.gram()
    if covariance == "total":
        u = S[present].sum(axis=0) / np.sqrt(Ntot) if Ntot > 0 else np.zeros(S.shape[1])
        denom = Ntot - 1.0
        scatter = np.outer(u, u)  # s s^T / N, exactly symmetric; the one d x d array made here
        np.subtract(G, scatter, out=scatter)
    else:
        denom = Ntot - int(present.sum())
        scatter = minus_between(G, S if present.all() else S[present], Np[present])  # one syrk over C rows
    if denom <= 0 and (notes is None or _whole_counts(N)):
        raise InputError(
            f"fedcgs: the {covariance} covariance needs more samples than "
            f"{'1' if covariance == 'total' else 'classes'} (got {Ntot:g} sample(s) in "
            f"{int(present.sum())} class(es)); add data"
        )
    if denom <= 0:
        notes.append(
            f"the noisy class counts sum to {Ntot:.3g} over {int(present.sum())} class(es), leaving the "
            f"{covariance} covariance's divisor at {denom:.3g}; it was raised to 1"
        )
        denom = 1.0
    scatter /= denom
    Sigma = np.add(scatter, scatter.T)
    Sigma *= 0.5
    return N, mu, Sigma


@register
class FedCGS(Method):
    """Shared-covariance Gaussian classifier from summed global statistics.

    Parameters
    ----------
    covariance : {"total", "within"}, default "total"
        The paper's total covariance, or the pooled within-class one (LDA).
    shrinkage : float in [0, 1], default 1e-4
        Weight of the scaled identity in (1 - a) Sigma + a (tr Sigma / d) I.
    """

    name = "fedcgs"
    paper = "Guan et al., A one-shot federated learning framework with global statistics (FedCGS)"
    requires = frozenset({"counts", "sums", "second"})
    per_client = False
    defaults: dict = {"covariance": "total", "shrinkage": 1e-4}

    def scale_invariant(self) -> bool:
        return True

    def _validate_params(self) -> None:
        p = self.params
        check_choice(self.name, "covariance", p["covariance"], ("total", "within"))
        p["shrinkage"] = check_real(self.name, "shrinkage", p["shrinkage"], low=0.0, high=1.0)

    def aggregate(self, stats: ClientStats) -> LinearHead:
        self._check_stats(stats)
        notes: list[str] = []
        N, S = stats.class_totals()
        if not (np.isfinite(N).all() and np.isfinite(S).all()):
            self._refuse_non_finite_totals(N, S)
        if not np.any(N > 0):  # noise took every count to 0 or below: no class to estimate
            dropped = int(np.count_nonzero(N != 0))
            return self._head(
                np.zeros((N.size, stats.dim)),
                np.zeros(N.size),
                [
                    f"{dropped} class count(s) <= 0 after noise were treated as absent",
                    f"class(es) {list(range(N.size))} have no data; their weight row is zero",
                ],
            )
        N, mu, Sigma = global_covariance(stats, self.params["covariance"], notes)
        self._refuse_non_finite("second moments", Sigma)
        self._refuse_rounding_only(stats, N, Sigma)
        present = N > 0
        a = self.params["shrinkage"]
        P = self._cholesky(Sigma, mu, a)
        if P is None:
            notes.append(
                "Cholesky of the covariance failed; checked and solved by eigendecomposition instead"
            )
            P = self._eigen(Sigma, mu, a, N, notes)
        Ntot = N[present].sum()
        b = np.full(N.shape, 0.0)
        b[present] = np.log(N[present] / Ntot) - 0.5 * np.einsum("cd,cd->c", mu[present], P[present])
        if (~present).any():
            floor = b[present].min() - np.log(2.0 * Ntot) if present.any() else 0.0
            b[~present] = floor
            P[~present] = 0.0
            notes.append(
                f"class(es) {np.flatnonzero(~present).tolist()} have count <= 0; weight set to zero and "
                "bias below every other class's (still the top score where every present class scores below it)"
            )
        return self._head(P, b, notes)

    def _refuse_rounding_only(self, stats: ClientStats, N: np.ndarray, Sigma: np.ndarray) -> None:
        """Exact counts whose covariance is within rounding of zero (constant features): refused, not fitted.

        G - s s^T / N sums N products per entry, so its trace is off by up to about 2 N eps tr(G); a
        covariance below twice that cannot be told from zero, and a head fitted on it is rounding noise.
        A trace that low with an eigenvalue below minus that bound is no zero covariance but a second
        moment no data produces (negative variance): refused as such.
        """
        if not _whole_counts(N):
            return
        n = float(N.sum())
        scale = 4.0 * n * np.finfo(np.float64).eps * float(np.trace(stats.gram()))
        if float(np.trace(Sigma)) * max(n - 1.0, 1.0) <= scale:
            low = float(np.linalg.eigvalsh(Sigma)[0])
            if low * max(n - 1.0, 1.0) < -scale:  # beyond rounding: a negative variance, not a zero one
                raise InputError(
                    f"fedcgs: the {self.params['covariance']} covariance implied by the second moment and the "
                    f"class sums is not positive semi-definite (most negative eigenvalue {low:.4g}, trace "
                    f"{float(np.trace(Sigma)):.4g}), which no data produces: the second moments or sums are "
                    "corrupt, or noise on them exceeds the features' spread; check them"
                )
            raise InputError(
                f"fedcgs: the {self.params['covariance']} covariance is zero (every feature is constant "
                "across the samples, e.g. all-zero features, or their spread is below float64's precision "
                "relative to their mean), so no shrinkage makes it invertible; check the features, and if they "
                "do vary, centre them on a public offset first (e.g. subtract the mean of public data): the "
                "uncentred second moment loses a spread that is small against the mean to rounding"
            )

    @staticmethod
    def _cholesky(Sigma: np.ndarray, mu: np.ndarray, a: float) -> np.ndarray | None:
        """Sigma^-1 mu_c by Cholesky when Sigma is positive definite (so no PSD repair applies)."""
        if a > 0:  # is Sigma itself positive definite?  (else the eigen path projects it first)
            try:
                scipy.linalg.cholesky(Sigma.T, lower=False, check_finite=False)  # symmetric: no C -> F copy
            except (np.linalg.LinAlgError, scipy.linalg.LinAlgError, ValueError):
                return None
            d = Sigma.shape[0]
            t = np.trace(Sigma) / d
            Sigma = (1.0 - a) * Sigma
            Sigma[np.diag_indices(d)] += a * t
        else:  # the factorisation below is Sigma's own: one Cholesky
            Sigma = Sigma.copy()
        res = try_cholesky_solve(Sigma, mu.T, overwrite=True)
        return res.T if isinstance(res, np.ndarray) else None

    def _eigen(self, Sigma, mu, a, N, notes) -> np.ndarray:
        present = N > 0
        d = Sigma.shape[0]
        w_eig = np.linalg.eigvalsh(Sigma)
        tol = 10 * d * np.finfo(np.float64).eps * max(float(np.abs(w_eig).max()), 1e-300)
        if w_eig.min() < -tol:
            Sigma, raised = project_psd(Sigma)
            notes.append(
                Note(
                    f"covariance had {raised} negative eigenvalue(s); projected to the PSD cone "
                    "(with noisy statistics a larger shrinkage, e.g. 0.1, keeps the inverse stable)",
                    "psd_projection",
                    raised,
                )
            )
            w_eig = np.linalg.eigvalsh(Sigma)
        noisy = not _whole_counts(N)  # counts that are not positive whole numbers were noised or scaled
        if not np.trace(Sigma) > 0 and noisy:  # the noise left no positive variance: a nearest-mean head
            notes.append(
                "the noisy covariance had no positive variance left after the PSD projection; the identity "
                "was used instead (nearest class mean, with the class priors)"
            )
            return mu.copy()
        if not np.trace(Sigma) > 0:  # every feature constant: no shrinkage can help
            raise InputError(
                f"fedcgs: the {self.params['covariance']} covariance is zero (every feature is constant "
                "across the samples, e.g. all-zero features, or noise left no positive variance), so no "
                "shrinkage makes it invertible; check the features"
            )
        if a > 0:
            Sigma = (1.0 - a) * Sigma + a * (np.trace(Sigma) / d) * np.eye(d)
        w_eig = np.linalg.eigvalsh(Sigma)
        singular = w_eig.max() <= 0 or w_eig.min() <= d * np.finfo(np.float64).eps * w_eig.max()
        if singular and noisy:  # noise projected away some directions: solve in the others
            notes.append(
                Note(
                    "the noisy covariance is singular after the PSD projection; solved with the pseudo-inverse "
                    f"(a shrinkage > 0, e.g. {max(1e-3, 10 * a):.3g}, keeps it invertible)",
                    "pseudo_inverse",
                    1,
                )
            )
            return (np.linalg.pinv(Sigma, hermitian=True) @ mu.T).T
        if singular:
            Ntot = N[present].sum()
            raise InputError(
                f"fedcgs: the {self.params['covariance']} covariance is singular (d = {d}, N = {Ntot:g}, "
                f"C = {int(present.sum())}; it needs N - C >= d and no constant feature); set shrinkage > 0, "
                f"e.g. shrinkage={max(1e-3, 10 * a):.3g}"
            )
        return np.linalg.solve(Sigma, mu.T).T  # (C, d) = Sigma^-1 mu_c

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return K * ((C + d) * d + C)
