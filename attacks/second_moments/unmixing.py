"""Second-moment unmixing: recover individual post-ReLU features from G_k.

G_k = sum_i f_i f_i^T = H H^T with H = [f_1 ... f_n] >= 0 (ReLU features are
non-negative), so a symmetric non-negative factorisation of G_k with n
columns recovers the features up to order (attacks.md, "second-moment
unmixing"; symmetric NMF: Ding, He & Simon, SDM 2005, multiplicative rule
with beta = 1/2, and Kuang, Park & Ding, SDM 2012).

When the client's class sums and counts are released too, the attacker
knows the second moment of the *augmented* records g_i = (f_i, a e_{y_i}):

    sum_i g_i g_i^T = [[G_k, a S_k^T], [a S_k, a^2 diag(n_k)]],

S_k (C, d) the class sums and n_k the counts, because records of different
classes never share an indicator.  Factorising this matrix with n_k = sum_c
n_kc columns recovers each feature together with its class; ``a`` balances
the two blocks (a^2 = tr G_k / n_k, the mean squared feature norm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.base import Attack
from attacks.knowledge import check_truth
from attacks.metrics import identification, matched_cosine
from attacks.params import index_vector
from attacks.view import GroundTruth, ServerView
from mechanisms.dp.calibration import as_real, check_count
from privfed._validation import finite_reals, is_integer
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError, InputError

__all__ = ["SecondMomentUnmixing", "UnmixingResult", "augmented_second_moment", "symmetric_nmf", "unmix"]


#: Default random starts, multiplicative-update iteration cap, convergence tolerance, time cap and number of
#: best starts polished by L-BFGS-B, of :func:`symmetric_nmf`.
NMF_STARTS, NMF_MAX_ITER, NMF_TOL, NMF_MAX_SECONDS, NMF_POLISH = 16, 3000, 1e-6, 20.0, 2


def _finite(value, name: str, shape: tuple, want: str) -> np.ndarray:
    """``value`` as a finite float array of ``shape`` (None: any length there), else one line naming ``name``."""
    a = np.asarray(value)
    if a.ndim != len(shape) or a.size == 0 or any(w not in (None, n) for w, n in zip(shape, a.shape)):
        raise InputError(f"{name} must have shape {want}, got {a.shape}")
    # NaN would fail the eigendecomposition (LinAlgError) or make the features NaN
    return finite_reals(a, name, "pass the released (finite) statistic")


def _second(value, name: str = "second") -> np.ndarray:
    """A square (d, d) second moment as a finite float matrix, else one line naming ``name``."""
    d = np.shape(value)[0] if np.ndim(value) else 0
    return _finite(value, name, (d, d), "(d, d), a square matrix")


def _rank_rng(rank, rng) -> None:
    if not is_integer(rank) or rank < 1:
        raise InputError(f"rank must be an integer >= 1 (the number of records to recover), got {rank!r}")
    check_generator(rng)


def symmetric_nmf(A: np.ndarray, rank: int, *, rng: np.random.Generator, **kw) -> tuple[np.ndarray, float]:
    """H >= 0 (m, rank) minimising ||A - H H^T||_F: see :func:`_symmetric_nmf` for the parameters
    (``n_init``, ``max_iter``, ``tol``, ``max_seconds``, ``polish``).  Runs on one BLAS thread: the
    matrices are small, and more threads only contend."""
    from threadpoolctl import threadpool_limits

    A = _second(A, "A")
    _rank_rng(rank, rng)

    with threadpool_limits(limits=1):
        return _symmetric_nmf(A, rank, rng=rng, **kw)


def _symmetric_nmf(
    A: np.ndarray,
    rank: int,
    *,
    rng: np.random.Generator,
    n_init: int = NMF_STARTS,
    max_iter: int = NMF_MAX_ITER,
    tol: float = NMF_TOL,
    max_seconds: float | None = NMF_MAX_SECONDS,
    polish: int = NMF_POLISH,
) -> tuple[np.ndarray, float]:
    """H >= 0 (m, rank) minimising ||A - H H^T||_F, best of ``n_init`` random starts.

    Multiplicative update H <- H * (1/2 + (A H) / (2 H H^T H)) (Ding et al. 2005),
    on the PSD part of A with negative entries clipped (noise can make both
    appear).  The starts run together (one batched product per iteration);
    every 50 iterations each start's relative residual is checked and a start
    stops once it fell by less than ``tol`` (relative) over those 50, or at
    ``max_iter``.  ``max_seconds`` caps the wall time of the whole call (the
    best start so far is returned; a capped run depends on the machine's
    speed, so pass ``None`` for a reproducible one).  The ``polish`` starts
    with the smallest residuals then run L-BFGS-B with bounds H >= 0 (scipy)
    on ||A+ - H H^T||_F^2 to convergence: the multiplicative rule crawls near
    the optimum (16 starts x 30,000 updates still leave ~5e-4 on digits
    FedCGS clients of 4 records, where the polished factorisation is exact to
    ~1e-5).  Returns H and the relative residual ||A - H H^T||_F / ||A||_F.
    """
    import time

    A = 0.5 * (np.asarray(A, float) + np.asarray(A, float).T)
    if rank < 1:
        raise InputError(f"rank must be >= 1, got {rank}")
    for name, v, low in (("n_init", n_init, 1), ("max_iter", max_iter, 1), ("polish", polish, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ConfigError(f"symmetric NMF {name} must be an integer >= {low}, got {v!r}")
    try:
        tol_ok = as_real(tol) >= 0 and (max_seconds is None or as_real(max_seconds) > 0)
    except (TypeError, ValueError):
        tol_ok = False
    if not tol_ok:
        raise ConfigError(
            f"symmetric NMF needs tol >= 0 and max_seconds > 0 (or None), got {tol!r}, {max_seconds!r}"
        )
    t0 = time.perf_counter()
    w, V = np.linalg.eigh(A)
    Ap = np.maximum((V * np.maximum(w, 0)) @ V.T, 0.0)
    normA = max(np.linalg.norm(Ap), 1e-300)
    scale = np.sqrt(max(Ap.mean(), 1e-300) / rank)
    H = rng.uniform(0.0, 2.0, size=(int(n_init), A.shape[0], rank)) * scale
    active = np.arange(int(n_init))
    prev = np.full(int(n_init), np.inf)
    for it in range(int(max_iter)):
        Ha = H[active]
        AH = Ap @ Ha
        HHH = Ha @ (np.swapaxes(Ha, 1, 2) @ Ha)
        H[active] = Ha * (0.5 + 0.5 * AH / np.maximum(HHH, 1e-300))
        if it % 50 == 49:
            Ha = H[active]
            res = np.linalg.norm(Ap - Ha @ np.swapaxes(Ha, 1, 2), axis=(1, 2)) / normA
            done = prev[active] - res < tol * np.maximum(res, 1e-300)
            prev[active] = res
            active = active[~done]
            if active.size == 0 or (max_seconds is not None and time.perf_counter() - t0 > max_seconds):
                break
    nA = max(np.linalg.norm(A), 1e-300)
    if polish:
        r0 = np.linalg.norm(Ap - H @ np.swapaxes(H, 1, 2), axis=(1, 2))
        for i in np.argsort(r0, kind="stable")[: int(polish)]:
            H[i] = _polish(Ap, H[i])
    res_all = np.linalg.norm(A - H @ np.swapaxes(H, 1, 2), axis=(1, 2)) / nA
    b = int(np.argmin(res_all))
    return H[b], float(res_all[b])


def _polish(Ap: np.ndarray, H: np.ndarray, max_iter: int = 2000) -> np.ndarray:
    """L-BFGS-B with bounds H >= 0 on ||Ap - H H^T||_F^2 from the multiplicative updates' H (scipy)."""
    from scipy.optimize import minimize

    m, r = H.shape
    s2 = max(float(np.sum(Ap * Ap)), 1e-300)

    def fg(x):
        X = x.reshape(m, r)
        E = X @ X.T - Ap
        return float(np.sum(E * E)) / s2, (4.0 * (E @ X)).ravel() / s2

    out = minimize(
        fg,
        H.ravel(),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0.0, None)] * (m * r),
        options={"maxiter": max_iter, "ftol": 1e-15, "gtol": 1e-12},
    )
    X = out.x.reshape(m, r)
    return X if np.sum((X @ X.T - Ap) ** 2) <= np.sum((H @ H.T - Ap) ** 2) else H


def augmented_second_moment(
    second: np.ndarray, sums: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, float]:
    """The (d + C) x (d + C) second moment of (f, a e_y) and the scale a (see the module docstring)."""
    second = _second(second)
    d = second.shape[0]
    sums = _finite(sums, "sums", (None, d), f"(C, {d}), one class sum per row")
    counts = _finite(counts, "counts", (sums.shape[0],), f"({sums.shape[0]},), one count per class sum")
    n = np.maximum(counts, 0.0)
    N = max(float(n.sum()), 1.0)
    a = float(np.sqrt(max(np.trace(second), 1e-300) / N))
    C = n.shape[0]
    A = np.zeros((d + C, d + C))
    A[:d, :d] = second
    A[d:, :d] = a * sums
    A[:d, d:] = a * sums.T
    A[d:, d:] = a * a * np.diag(n)
    return A, a


def unmix(
    second: np.ndarray,
    rank: int,
    *,
    rng: np.random.Generator,
    sums=None,
    counts=None,
    n_init: int = NMF_STARTS,
    max_iter: int = NMF_MAX_ITER,
    max_seconds: float | None = NMF_MAX_SECONDS,
    polish: int = NMF_POLISH,
) -> tuple[np.ndarray, np.ndarray | None, float]:
    """Recover ``rank`` features from one second moment (and, if given, class sums and counts).

    Returns the features (rank, d), their classes (or ``None`` without sums)
    and the relative residual of the factorisation.
    """
    second = _second(second)
    _rank_rng(rank, rng)
    if (sums is None) != (counts is None):
        raise InputError("unmix: pass sums and counts together (the class sums and their counts), or neither")
    d = second.shape[0]
    if sums is None:
        H, res = symmetric_nmf(
            second, rank, rng=rng, n_init=n_init, max_iter=max_iter, max_seconds=max_seconds, polish=polish
        )
        return H.T, None, res
    A, a = augmented_second_moment(second, np.asarray(sums, float), np.asarray(counts, float))
    H, res = symmetric_nmf(
        A, rank, rng=rng, n_init=n_init, max_iter=max_iter, max_seconds=max_seconds, polish=polish
    )
    ind = H[d:].T  # (rank, C)
    labels = ind.argmax(axis=1)
    scale = ind.max(axis=1) / a  # should be 1: the indicator's scale fixes the feature's
    feats = H[:d].T / np.where(scale > 1e-12, scale, 1.0)[:, None]
    return feats, labels, res


@dataclass(frozen=True, eq=False)
class UnmixingResult:
    rows: np.ndarray
    owners: np.ndarray
    features: list
    labels: list
    residuals: np.ndarray
    per_client: bool


class SecondMomentUnmixing(Attack):
    """Factor each client's G_k (augmented by its class sums and counts) into its features."""

    name = "unmixing"
    requires = frozenset({"second", "counts", "per_client"})
    defaults = {
        "use_sums": True,
        "max_samples": 32,
        "n_init": NMF_STARTS,
        "max_iter": NMF_MAX_ITER,
        "max_seconds": NMF_MAX_SECONDS,
        "polish": NMF_POLISH,
        "max_clients": 50,
    }

    def _validate_params(self) -> None:
        for key in ("max_samples", "max_clients"):  # 'x' was a ValueError, 0 clients a misleading refusal
            self.params[key] = check_count(self.params[key], key)

    def run(self, view: ServerView, rng: np.random.Generator, *, rows=None, **_) -> UnmixingResult:
        self.check(view)
        st = view.stats
        n_k = np.rint(np.maximum(st.counts, 0)).sum(axis=1).astype(int)
        if rows is None:
            cap = self.params["max_samples"]
            rows = np.flatnonzero((n_k >= 1) & (n_k <= cap))[: self.params["max_clients"]]
            if rows.size == 0:
                raise InputError(
                    f"no client's released counts total 1..max_samples={cap} records (the largest total: {int(n_k.max())}); "
                    "raise max_samples (the attack's parameter; python -m privfed.attack takes it from its --config "
                    "file's [attack_params] table, e.g. max_samples = 128) or attack clients holding fewer records"
                )
        else:  # -1 attacked the last client, 0.5 client 0
            K = n_k.shape[0]
            rows = index_vector(rows, "rows", K, what="released rows (clients)")
        feats, labs, res = [], [], []
        G = view.second_moments()
        for k in rows:
            f, lab, r = unmix(
                G[k],
                int(max(n_k[k], 1)),
                rng=rng,
                sums=st.sums[k] if self.params["use_sums"] else None,
                counts=st.counts[k] if self.params["use_sums"] else None,
                n_init=int(self.params["n_init"]),
                max_iter=int(self.params["max_iter"]),
                max_seconds=self.params["max_seconds"],
                polish=int(self.params["polish"]),
            )
            feats.append(f), labs.append(lab), res.append(r)
        owners = rows if st.owners is None else st.owners[rows]
        return UnmixingResult(
            rows=rows,
            owners=owners,
            features=feats,
            labels=labs,
            residuals=np.array(res),
            per_client=view.per_client,
        )

    def score(self, result: UnmixingResult, truth: GroundTruth) -> dict:
        """Identification (the matched recovered feature's nearest private feature is the true one) and the
        relative error ||f_hat - f|| / ||f|| after Hungarian matching; the matched cosine is kept, but it says
        little on its own (same-class post-ReLU features have mean cosine ~0.96)."""
        keep = truth.clients >= 0
        pool = truth.features[keep]
        pool_idx = np.flatnonzero(keep)
        cos_all, ident_all, lab_all, sizes, rel_all = [], [], [], [], []
        for own, f, lab in zip(result.owners, result.features, result.labels):
            idx = np.flatnonzero(truth.clients[pool_idx] == own)
            if idx.size == 0:
                continue
            true = pool[idx]
            mc, match = matched_cosine(f, true)
            cos_all.append(mc)
            ok = match >= 0
            rel_all += list(
                np.linalg.norm(f[match[ok]] - true[ok], axis=1)
                / np.maximum(np.linalg.norm(true[ok], axis=1), 1e-300)
            )
            hits = identification(f[match[ok]], [[i] for i in idx[ok]], pool, metric="cosine")
            ident_all.append(hits.sum() / idx.size)
            if lab is not None:
                lab_all.append(np.mean(lab[match[ok]] == truth.labels[pool_idx][idx[ok]]))
            sizes.append(idx.size)
        if not cos_all:
            raise InputError(
                "no unmixed client matches the truth; check the view and the truth belong together"
            )
        return {
            "matched_cosine": float(np.mean(cos_all)),
            "relative_error": float(np.mean(rel_all)),
            "identification": float(np.mean(ident_all)),
            "label_accuracy": float(np.mean(lab_all)) if lab_all else float("nan"),
            "clients": len(cos_all),
            "mean_samples": float(np.mean(sizes)),
            "mean_residual": float(np.mean(result.residuals)),
        }

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        check_truth(truth, view)
        return self.score(self.run(view, rng), truth)
