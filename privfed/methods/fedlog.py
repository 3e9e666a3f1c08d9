"""FedLog: Bayesian logistic-regression head from summed sufficient statistics.

Yu, Zhang and Poupart (the FedLog paper in ``/papers``).  With the augmented
feature phi = [1, f] (m = d + 1 entries, constant first) one record's
sufficient statistic is T(phi, y) = phi (x) e_y; clients send the sums
S_k = sum_i T(phi_i, y_i) and their count n_k.  Here that is the per-class
statistic Phi_y = sum over class-y samples of phi = [N_y, s_y], built from the
shared counts and class sums; n = sum_y N_y is read from the count
coordinate (so under DP it is the sum of the noisy counts, post-processing).
The server's head is the MAP of the conjugate posterior (Eq. 15)

    eta* = argmax_eta  sum_y eta_y^T (chi_y + Phi_y) - (nu + n) log sum_y exp(eta_y^T eta_y / 4),

a concave objective (linear minus a log-sum-exp of convex functions).  Its
stationarity condition eta_y = 2 a_y / ((nu + n) p_y), a_y = chi_y + Phi_y,
p = softmax_y(eta_y^T eta_y / 4), says eta_y = t_y a_y with t_y > 0; writing
A_y = |a_y|^2 / 4 and lambda = log(2 Z / (nu + n)) each t_y solves
log t_y + A_y t_y^2 = lambda (a Lambert-W equation, increasing in t_y) and
lambda is the unique root of sum_y 1 / t_y(lambda) = (nu + n) / 2.  The
default ``solver="exact"`` solves this one-dimensional equation to machine
precision; ``solver="lbfgs"`` maximises Eq. 15 with scipy's L-BFGS and the
exact gradient (a cross-check).  The head is bias = eta_y[0], weight =
eta_y[1:], prediction softmax_y(eta_y^T phi).  Summable statistics: secure
aggregation applies as is.  Communication: K (m C + 1) floats a round.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
from scipy.special import logsumexp

from privfed._linalg import check_choice, check_real, row_squares
from privfed.errors import ConfigError, InputError
from privfed.head import LinearHead
from privfed.methods import register
from privfed.methods.base import Method
from privfed.scaling import check_feature_scale, fedlog_scale_from, fedlog_scale_note_from, median_mean_norm
from privfed.stats import ClientStats

__all__ = [
    "FedLog",
    "fedlog_gradient",
    "fedlog_objective",
    "fedlog_statistic",
    "map_gradient_norm",
    "map_multipliers",
    "solve_map",
]


def fedlog_statistic(stats: ClientStats) -> tuple[np.ndarray, float]:
    """Phi (C, m) with Phi_y = [N_y, s_y], and n = sum_y N_y, from summed statistics."""
    N, S = stats.class_totals()
    Phi = np.concatenate([N[:, None], S], axis=1)
    return Phi, float(N.sum())


def fedlog_objective(eta: np.ndarray, a: np.ndarray, nu_n: float) -> float:
    """Eq. 15: sum_y eta_y . a_y - (nu + n) logsumexp_y(|eta_y|^2 / 4), with a = chi + Phi."""
    return float(np.sum(eta * a) - nu_n * logsumexp(np.sum(eta * eta, axis=1) / 4.0))


def fedlog_gradient(eta: np.ndarray, a: np.ndarray, nu_n: float) -> np.ndarray:
    """Gradient of :func:`fedlog_objective`: a_y - (nu + n) p_y eta_y / 2."""
    # a - nu_n * p[:, None] * eta / 2.0, the same operations in one (C, m) array instead of four; r without
    # the (C, m) square (einsum: within an ulp or two of np.sum's order).
    r = np.einsum("ij,ij->i", eta, eta) / 4.0
    p = np.exp(r - logsumexp(r))
    g = np.multiply(nu_n * p[:, None], eta)
    g /= 2.0
    return np.subtract(a, g, out=g)


def _inv_t(lam: float, logA2: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """1 / t_y(lambda) where log t + A t^2 = lambda (logA2 = log(2 A_y))."""
    L = 2.0 * lam + logA2
    u = np.where(L <= 1.0, L, np.log(np.maximum(L, 1.0)))  # right of the root of e^u + u = L
    for _ in range(100):
        step = (np.exp(u) + u - L) / (np.exp(u) + 1.0)
        u = u - step
        if np.all(np.abs(step) <= 1e-15 * np.maximum(1.0, np.abs(u))):
            break
    log_t = 0.5 * (u - logA2)
    return np.where(zero, np.exp(-lam), np.exp(-np.where(zero, 0.0, log_t)))


#: The gradient norm of Eq. 15, as a share of |a|, above which an L-BFGS solution is reported as short of the
#: maximum (converged runs reach 1e-8 or less of it; the exact solver about 1e-12).
LBFGS_RTOL = 1e-6


def solve_map(a: np.ndarray, nu_n: float, solver: str = "exact") -> np.ndarray:
    """The maximiser eta (C, m) of Eq. 15 for a = chi + Phi and nu + n > 0."""
    if nu_n <= 0:
        raise ValueError("nu + n must be > 0")
    if solver == "lbfgs":
        shape = a.shape

        def f(x):
            eta = x.reshape(shape)
            return -fedlog_objective(eta, a, nu_n), -fedlog_gradient(eta, a, nu_n).ravel()

        res = scipy.optimize.minimize(
            f,
            np.zeros(a.size),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 100000, "maxcor": 50, "gtol": 1e-13, "ftol": 1e-16},
        )
        return res.x.reshape(shape)
    with np.errstate(over="ignore", invalid="ignore"):
        A = np.sum(a * a, axis=1) / 4.0  # as written: einsum sums in another order (the MAP moves by ~1e-13)
    if not np.isfinite(A).all():
        raise InputError(
            "FedLog's statistic [N_y, s_y / feature_scale] has squared norms beyond the float range "
            f"(largest |entry| {float(np.max(np.abs(a))):.3g}); pass feature_scale='auto' (it rescales "
            "the features to a median class-mean norm of 30) or a feature_scale near the features' norm"
        )
    return map_multipliers(A, nu_n)[:, None] * a


def _newton_u(u: np.ndarray, L: np.ndarray) -> np.ndarray | None:
    """The root of e^u + u = L by Newton from ``u`` right of it (monotone there); ``None`` if it stalls."""
    for _ in range(100):
        e = np.exp(u)
        step = (e + u - L) / (e + 1.0)
        u = u - step
        if np.all(np.abs(step) <= 1e-15 * np.maximum(1.0, np.abs(u))):
            return u
    return None


def _newton_lambda(lam: float, logA2: np.ndarray, zero: np.ndarray, target: float) -> float | None:
    """The root of g(lambda) = sum_y 1 / t_y(lambda) - target by Newton from ``lam`` (g(lam) > 0).

    1 / t_y(lambda) is decreasing and convex in lambda (its inverse lambda = -log v + A v^-2 is), so
    g is too and Newton from the left of the root climbs to it without overshooting.  Each t_y is
    followed by Newton on u = log(2 A_y t_y^2) (e^u + u = 2 lambda + log 2 A_y) from the tangent
    prediction, which lies right of the new root (u is concave in lambda): a step or two each.
    Returns ``None`` (the caller falls back to Brent's method) on anything non-finite or a stall.
    """
    L = 2.0 * lam + logA2
    u = _newton_u(np.where(L <= 1.0, L, np.log(np.maximum(L, 1.0))), L)
    for _ in range(200):
        if u is None:
            return None
        e = np.exp(u)
        v = np.where(zero, np.exp(-lam), np.exp(-0.5 * (u - logA2)))  # 1 / t_y
        g = float(np.sum(v)) - target
        dg = -float(np.sum(np.where(zero, v, v / (1.0 + e))))
        if not (np.isfinite(g) and np.isfinite(dg) and dg < 0):
            return None
        step = -g / dg
        if not step > 4 * np.finfo(float).eps * max(abs(lam), 1e-300):
            return lam
        lam += step
        L_new = 2.0 * lam + logA2
        u = _newton_u(u + (L_new - L) / (e + 1.0), L_new)
        L = L_new
    return None


def map_multipliers(A: np.ndarray, nu_n: float) -> np.ndarray:
    """t (C,) with eta_y = t_y a_y the maximiser of Eq. 15, from A_y = |a_y|^2 / 4 and nu + n > 0.

    The exact solver: lambda is the root of sum_y 1 / t_y(lambda) = (nu + n) / 2 (Newton's method
    from the left, see :func:`_newton_lambda`, Brent's method where it cannot go on; each step O(C)),
    and t_y solves log t + A_y t^2 = lambda.  Where A_y = 0, t_y is returned as 0: eta_y = 0 there
    whatever t_y (e^lambda, which can overflow) is.
    """
    if nu_n <= 0:
        raise ValueError("nu + n must be > 0")
    zero = A <= 0
    logA2 = np.log(np.where(zero, 1.0, 2.0 * A))
    target = nu_n / 2.0

    def h(lam: float) -> float:
        return float(np.sum(_inv_t(lam, logA2, zero)) - target)

    # left of the root: with t0 = C / target, lambda_0 = min_y log t0 + A_y t0^2 gives every t_y <= t0
    t0 = A.size / target
    lam = _newton_lambda(float(np.log(t0) + np.min(A) * t0 * t0), logA2, zero, target)
    if lam is None:
        lo, step = -1.0, 1.0
        while h(lo) <= 0:
            step *= 2.0
            lo -= step
        hi, step = 1.0, 1.0
        while h(hi) >= 0:
            step *= 2.0
            hi += step
        lam = scipy.optimize.brentq(h, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
    inv = _inv_t(lam, logA2, zero)
    # a_y = 0 (an absent class): eta_y = t_y a_y = 0 whatever t_y = e^lambda, which may overflow
    return np.divide(1.0, inv, out=np.zeros_like(inv), where=~zero)


def map_gradient_norm(t: np.ndarray, A: np.ndarray, nu_n: float) -> float:
    """||grad of Eq. 15|| at eta = t a, from t and A = |a|^2 / 4 alone (no (C, m) array).

    The gradient a_y - (nu + n) p_y eta_y / 2 is a_y (1 - (nu + n) p_y t_y / 2) there, with
    p = softmax_y(t_y^2 A_y): its norm is sqrt(sum_y c_y^2 |a_y|^2), c_y that factor.
    """
    r = t * t * A
    p = np.exp(r - r.max())  # the softmax shifted by its largest exponent (logsumexp's own shift, no call)
    p /= p.sum()
    c = 1.0 - nu_n * p * t / 2.0
    return float(np.sqrt(np.sum(c * c * (4.0 * A))))


@register
class FedLog(Method):
    """MAP head of Bayesian logistic regression from summed statistics (Eq. 15).

    Parameters
    ----------
    chi : float or array broadcastable to (C, d + 1), default 0.0
        Prior pseudo-statistic (first column: the constant feature).
    nu : float >= 0, default 1.0
        Prior pseudo-count (the official code uses a flat prior, nu = 0).
    solver : {"exact", "lbfgs"}, default "exact"
    feature_scale : float > 0 or "auto", default 1.0
        The model's feature is [1, f / feature_scale]; the head returned is
        for f.  ``"auto"`` makes the median class mean of norm 30 (see
        :mod:`privfed.scaling`); ``notes`` say when the default is ill-posed.
    """

    name = "fedlog"
    paper = "Yu, Zhang, Poupart, FedLog: federated learning with sufficient statistics (Eq. 15)"
    requires = frozenset({"counts", "sums"})
    per_client = False
    defaults: dict = {"chi": 0.0, "nu": 1.0, "solver": "exact", "feature_scale": 1.0}

    def scale_invariant(self) -> bool:
        """With ``feature_scale="auto"`` the features are normalised first: any common scale cancels."""
        return self.params.get("feature_scale") == "auto"

    def _validate_params(self) -> None:
        p = self.params
        p["nu"] = check_real(self.name, "nu", p["nu"], low=0.0)
        p["feature_scale"] = check_feature_scale(p["feature_scale"])
        check_choice(self.name, "solver", p["solver"], ("exact", "lbfgs"))
        try:
            if np.asarray(p["chi"]).dtype.kind not in "iuf":  # "1" or True is no number, as for nu
                raise TypeError(p["chi"])
            chi = np.asarray(p["chi"], dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(
                f"method {self.name!r}: chi must be a number or a numeric array, got {p['chi']!r}"
            ) from None
        if not np.all(np.isfinite(chi)):
            raise ConfigError(f"method {self.name!r}: chi must be finite")

    def aggregate(self, stats: ClientStats) -> LinearHead:
        self._check_stats(stats)
        N, S = stats.class_totals()
        if not np.isfinite(
            N
        ).all():  # C numbers: checked always (the sums only where the server cannot vouch)
            self._refuse_non_finite_totals(N, S)
        sq = row_squares(S)  # ||s_y||^2: the one read of S before the solve
        median = median_mean_norm(N, S, sq)
        scale = fedlog_scale_from(median, self.params["feature_scale"])
        ill_posed = fedlog_scale_note_from(median, scale)
        chi = np.asarray(self.params["chi"], dtype=np.float64)
        shape = (S.shape[0], S.shape[1] + 1)
        try:
            fits = np.broadcast_shapes(chi.shape, shape) == shape
        except ValueError:
            fits = False
        if not fits:
            raise ConfigError(
                f"method {self.name!r}: chi has shape {chi.shape}, which does not broadcast to "
                f"(C, d + 1) = {shape}"
            )
        notes: list[str] = []
        if (N <= 0).any():
            notes.append(
                f"class(es) {np.flatnonzero(N <= 0).tolist()} have count <= 0 (noise); "
                "used as they are in the sufficient statistic"
            )
        nu_n = self.params["nu"] + float(N.sum())
        if nu_n <= 0:
            repaired = self.params["nu"] + float(np.clip(N, 0.0, None).sum())
            repaired = repaired if repaired > 0 else 1.0
            notes.append(
                f"nu + n = {nu_n:.4g} <= 0 (noisy counts) makes Eq. 15 unbounded; "
                f"used nu + n = {repaired:.4g} (nu plus the positive counts, at least 1)"
            )
            nu_n = repaired
        with np.errstate(over="ignore", invalid="ignore"):
            A = (N * N + sq / scale / scale) / 4.0  # |a_y|^2 / 4 with a_y = [N_y, s_y / scale]
        # finite sums over a feature_scale so small that s_y / scale overflows (inf sums: the NaN-or-inf refusal)
        if np.isinf(A).any() and np.isfinite(sq).all():
            raise InputError(
                f"FedLog's statistic [N_y, s_y / feature_scale] at feature_scale={scale:g} has squared norms "
                "beyond the float range; pass feature_scale='auto' (it rescales the features to a median "
                "class-mean norm of 30) or a feature_scale near the features' norm"
            )
        tiny = np.flatnonzero(sq <= 2.0**-900)  # zero rows, or squares that underflowed
        exact_sq = np.all(sq < np.inf) and not (tiny.size and S[tiny].any())
        if self.params["solver"] == "exact" and not chi.any() and exact_sq:
            # chi = 0: eta_y = t_y a_y, so the weight is t_y s_y / scale^2, written in one pass over S
            t = map_multipliers(A, nu_n)
            factor = t if scale == 1.0 else t / scale / scale
            weight = np.multiply(S, factor[:, None])
            bias, grad_norm = t * N, map_gradient_norm(t, A, nu_n)
            # |w_yj| = |factor_y| |s_yj| <= |factor_y| ||s_y||, and every ||s_y||^2 is finite here (so is S):
            # a bound far below the largest float proves the weight finite without reading it again
            with np.errstate(over="ignore", invalid="ignore"):
                proved = bool((np.abs(factor) * np.sqrt(sq) < 2.0**1000).all())
        else:  # a prior, the L-BFGS cross-check or squares out of float range: eta over the (C, m) statistic
            if not exact_sq:
                self._refuse_non_finite_totals(N, S)
            a = np.concatenate([N[:, None], S / scale], axis=1)
            a += chi
            big = float(np.max(np.abs(chi))) if chi.size else 0.0
            limit = float(np.sqrt(np.finfo(float).max / a.shape[1]))  # a row of such entries squares in range
            if not big < limit:  # the prior alone takes a = chi + [N_y, s_y / scale] past the float range
                raise ConfigError(
                    f"chi (FedLog's prior, largest |entry| {big:.3g}) makes a = chi + [N_y, s_y / feature_scale] "
                    f"square beyond the float range; pass a chi with entries below {limit:.3g} (0 for no prior)"
                )
            eta = solve_map(a, nu_n, self.params["solver"])
            weight, bias = eta[:, 1:] / scale, eta[:, 0]
            proved = False
            grad_norm = float(np.linalg.norm(fedlog_gradient(eta, a, nu_n)))
            if self.params["solver"] == "lbfgs":  # the exact solver needs no such check
                size = float(np.linalg.norm(a))
                if not grad_norm <= LBFGS_RTOL * size:
                    notes.append(
                        f"solver='lbfgs' stopped short of Eq. 15's maximum: its gradient norm is {grad_norm:.3g}, "
                        f"{grad_norm / size if size else math.inf:.2g} of |chi + [N_y, s_y / feature_scale]| (above "
                        f"{LBFGS_RTOL:g}), so the head may be far from the MAP; use solver='exact'"
                    )
        if ill_posed:
            notes.append(ill_posed)
        return self._head(
            weight,
            bias,
            notes,
            weight_proved_finite=proved,
            nu_plus_n=nu_n,
            feature_scale=scale,
            gradient_norm=grad_norm,
        )

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return K * ((d + 1) * C + 1)
