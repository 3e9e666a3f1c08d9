"""Estimators: Clopper-Pearson lower bounds on mu and epsilon, the power formula, the noise-scale test.

Any mu-GDP mechanism satisfies FNR >= Phi(Phi^-1(1 - FPR) - mu) for every test (Dong, Roth & Su
2019, Def. 2.5), so with Clopper-Pearson upper bounds FPR_ub, FNR_ub (Bonferroni-corrected over
thresholds and audited blocks)

    mu_lb = max_t  Phi^-1(1 - FPR_ub(t)) - Phi^-1(FNR_ub(t))

is a lower bound on mu holding with probability >= 1 - alpha; likewise (eps, delta)-DP forces
FPR + e^eps FNR >= 1 - delta and the swapped inequality (Kairouz et al. 2015; Jagielski et al.
2020), giving eps_lb = max_t max(ln((1 - delta - FPR_ub)/FNR_ub), ln((1 - delta - FNR_ub)/FPR_ub)).

A lower bound above the claim proves the claim false; a bound below it proves nothing.

:func:`draws_for_power` says how many draws per side a test needs to catch a mechanism whose true
mu is ``ratio`` times its claim with probability ``power`` (derived below), and
:func:`audit_gaussian_blocks` takes its draws from it.  :func:`noise_scale_test` checks the noise
actually present in released values against the scale a report states (a one-sided chi-square
bound): less noise than claimed is caught in a few dozen draws, whatever epsilon is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import beta as _beta
from scipy.stats import chi2 as _chi2
from scipy.stats import norm as _norm

from mechanisms.dp.calibration import check_real
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError

__all__ = [
    "DEFAULT_THRESHOLDS",
    "AuditResult",
    "audit",
    "audit_gaussian_blocks",
    "audit_scores",
    "clopper_pearson_upper",
    "draws_for_power",
    "noise_scale_test",
    "upper_triangle",
]

#: Thresholds on the normalised score (in units of the claimed noise scale).
DEFAULT_THRESHOLDS = np.arange(-1.0, 4.0 + 1e-9, 0.5)


@dataclass(frozen=True)
class AuditResult:
    """Lower bounds on the privacy loss, valid with probability >= 1 - alpha.

    Attributes
    ----------
    mu_lb : float
        GDP lower bound (>= 0).
    eps_lb : float
        Epsilon lower bound at ``delta`` (>= 0).
    delta : float
    draws : int
        Releases per side.
    alpha : float
        Total failure probability (before the Bonferroni split).
    comparisons : int
        Number of simultaneous audits the correction covers.
    best_threshold : float
        Threshold attaining ``mu_lb``.
    claimed_mu, claimed_eps : float or None
        What the mechanism claims, when given.
    """

    mu_lb: float
    eps_lb: float
    delta: float
    draws: int
    alpha: float
    comparisons: int
    best_threshold: float
    claimed_mu: float | None = None
    claimed_eps: float | None = None
    fpr_ub: tuple = field(default=(), repr=False)
    fnr_ub: tuple = field(default=(), repr=False)

    @property
    def refutes(self) -> bool:
        """Whether the audit proves the claim false (a lower bound above the claim)."""
        return bool(
            (self.claimed_mu is not None and self.mu_lb > self.claimed_mu)
            or (self.claimed_eps is not None and self.eps_lb > self.claimed_eps)
        )


def clopper_pearson_upper(k, n: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper confidence bound (at level ``level``) of a binomial rate k / n."""
    k = np.asarray(k)
    ub = _beta.ppf(1.0 - level, k + 1, np.maximum(n - k, 1))
    return np.where(k >= n, 1.0, ub)


def audit_scores(
    scores0: np.ndarray,
    scores1: np.ndarray,
    *,
    delta: float = 0.0,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    alpha: float = 0.05,
    comparisons: int = 1,
    claimed_mu: float | None = None,
    claimed_eps: float | None = None,
) -> AuditResult:
    """Lower bounds from scores on D0 (``scores0``) and D1 (``scores1``).

    A test says "D1" when the score exceeds a threshold.  ``comparisons`` is
    the number of audits run together (e.g. blocks); the level alpha is split
    over comparisons x thresholds x the two error rates.
    """
    s0 = np.asarray(scores0, dtype=np.float64).ravel()
    s1 = np.asarray(scores1, dtype=np.float64).ravel()
    if s0.size != s1.size or s0.size == 0:
        raise ConfigError(f"need the same positive number of scores per side, got {s0.size} and {s1.size}")
    alpha, delta = check_real(alpha, "alpha"), check_real(delta, "delta")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must lie in (0, 1), got alpha={alpha}")
    if not 0 <= delta < 1:
        raise ConfigError(f"delta must lie in [0, 1), got delta={delta}")
    if isinstance(comparisons, bool) or not isinstance(comparisons, (int, np.integer)) or comparisons < 1:
        raise ConfigError(f"comparisons must be an int >= 1, got comparisons={comparisons!r}")
    for name, claim in (("claimed_mu", claimed_mu), ("claimed_eps", claimed_eps)):
        if claim is not None and not check_real(claim, name) >= 0:
            raise ConfigError(f"{name} must be a number >= 0 (or None), got {name}={claim!r}")
    if np.isnan(s0).any() or np.isnan(s1).any():
        raise ConfigError("scores contain NaN; the mechanism produced invalid outputs")
    try:
        t = np.asarray(thresholds, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        t = np.array([np.nan])
    if t.size == 0 or not np.isfinite(t).all():  # a NaN threshold says "D0" always: a false refutation
        raise ConfigError(f"thresholds must be a non-empty list of finite numbers, got {thresholds!r}")
    n = s0.size
    level = alpha / (2 * t.size * int(comparisons))
    fp = (s0[None, :] > t[:, None]).sum(axis=1)
    fn = (s1[None, :] <= t[:, None]).sum(axis=1)
    fpr = clopper_pearson_upper(fp, n, level)
    fnr = clopper_pearson_upper(fn, n, level)
    with np.errstate(divide="ignore", invalid="ignore"):
        mus = _norm.ppf(1.0 - fpr) - _norm.ppf(fnr)
        e1 = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
        e2 = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
    mus = np.where(np.isfinite(mus), mus, -np.inf)
    eps = np.where(np.isfinite(e1), e1, -np.inf)
    eps = np.maximum(eps, np.where(np.isfinite(e2), e2, -np.inf))
    i = int(np.argmax(mus))
    return AuditResult(
        mu_lb=float(max(mus[i], 0.0)),
        eps_lb=float(max(eps.max(), 0.0)),
        delta=float(delta),
        draws=n,
        alpha=float(alpha),
        comparisons=int(comparisons),
        best_threshold=float(t[i]),
        claimed_mu=claimed_mu,
        claimed_eps=claimed_eps,
        fpr_ub=tuple(map(float, fpr)),
        fnr_ub=tuple(map(float, fnr)),
    )


def draws_for_power(
    claimed_mu: float,
    *,
    ratio: float = 1.25,
    power: float = 0.99,
    alpha: float = 0.05,
    thresholds: int = len(DEFAULT_THRESHOLDS),
    comparisons: int = 1,
) -> int:
    """Draws per side for :func:`audit_scores` to refute a claim ``claimed_mu`` when the truth is ``ratio`` x it.

    At the threshold t ~ mu / 2 (scores N(0, 1) and N(mu, 1), small mu) both error rates are ~1/2 and
    Phi^-1 of an estimated rate p has standard deviation sqrt(p (1 - p) / N) / phi(Phi^-1(p)) =
    sqrt(pi / (2 N)) (delta method).  The bound subtracts z_a times that from each of the two terms
    (z_a: the Bonferroni-corrected Clopper-Pearson level alpha / (2 x thresholds x comparisons)), and
    the estimate itself moves by sqrt(pi / N); so the claim is refuted with probability ``power``
    when (ratio - 1) mu_c >= (2 z_a sqrt(pi / 2) + z_b sqrt(pi)) / sqrt(N), z_b = Phi^-1(power):

        N = ((2 z_a sqrt(pi / 2) + z_b sqrt(pi)) / ((ratio - 1) mu_c))^2.

    At eps = 1, delta = 1e-5, three blocks with equal shares (mu_c = 0.155 each) and ratio 1.25 (noise
    scaled by 0.8) this asks for about 1e5 draws per side.
    """
    claimed_mu, ratio = check_real(claimed_mu, "claimed_mu"), check_real(ratio, "ratio")
    power, alpha = check_real(power, "power"), check_real(alpha, "alpha")
    if not (claimed_mu > 0 and math.isfinite(claimed_mu)):
        raise ConfigError(f"claimed_mu must be finite and > 0, got {claimed_mu}")
    if not (ratio > 1 and math.isfinite(ratio)):
        raise ConfigError(
            f"ratio must be finite and > 1 (the true mu as a multiple of the claim), got ratio={ratio}"
        )
    if not 0 < power < 1:
        raise ConfigError(f"power must lie in (0, 1), got power={power}")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must lie in (0, 1), got alpha={alpha}")
    for name, v in (("thresholds", thresholds), ("comparisons", comparisons)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {name}={v!r}")
    z_a = _norm.ppf(1 - alpha / (2 * int(thresholds) * int(comparisons)))
    z_b = _norm.ppf(power)
    num = 2 * z_a * math.sqrt(math.pi / 2) + z_b * math.sqrt(math.pi)
    with np.errstate(over="ignore"):
        n = float((np.float64(num) / ((ratio - 1) * claimed_mu)) ** 2)
    if not math.isfinite(n):  # a claim so small no number of draws refutes it at this ratio
        raise ConfigError(
            f"claimed_mu={claimed_mu:g} at ratio={ratio:g} needs more draws than can be counted"
        )
    return math.ceil(n)


def noise_scale_test(samples: Sequence[np.ndarray], claimed_std: float, *, alpha: float = 1e-6) -> dict:
    """One-sided test that released values carry at least the noise a report claims.

    ``samples`` holds, per dataset, an array (draws, values) of independent releases of the same
    statistic on that dataset (so the spread across draws is the noise alone; a Poisson-sampled
    release only adds spread).  The pooled sample variance s^2 over ``dof`` degrees of freedom
    satisfies dof s^2 / sigma^2 ~ chi^2(dof) for Gaussian noise of standard deviation sigma, so
    ``sigma_ub`` = sqrt(dof s^2 / chi2.ppf(alpha, dof)) is an upper confidence bound on the noise
    present; ``below`` is True when it is under ``claimed_std`` (less noise than the report states).
    """
    claimed_std, alpha = check_real(claimed_std, "claimed_std"), check_real(alpha, "alpha")
    if not (claimed_std > 0 and math.isfinite(claimed_std)) or not 0 < alpha < 0.5:
        raise ConfigError(
            f"claimed_std must be a finite number > 0 and alpha lie in (0, 0.5), got claimed_std={claimed_std}, "
            f"alpha={alpha}"
        )
    # one array would be read as its rows, each a 1-D array: nothing tested
    if isinstance(samples, np.ndarray):
        raise ConfigError("samples must be a list of arrays (draws, values), one per dataset, not one array")
    ss, dof = 0.0, 0
    for i, a in enumerate(samples):
        a = np.asarray(a, dtype=np.float64)
        if a.ndim != 2:  # (draws, C, d) would be skipped and the test pass on nothing: reshape it first
            raise ConfigError(
                f"samples[{i}] has shape {a.shape}; each must be (draws, values): reshape it to "
                "(draws, -1) first"
            )
        if a.shape[0] < 2 or a.shape[1] == 0:
            continue
        ss += float(((a - a.mean(axis=0)) ** 2).sum())
        dof += (a.shape[0] - 1) * a.shape[1]
    if dof == 0:
        return {
            "dof": 0,
            "std": math.nan,
            "sigma_ub": math.inf,
            "claimed": float(claimed_std),
            "below": False,
        }
    s2 = ss / dof
    sigma_ub = math.sqrt(ss / _chi2.ppf(alpha, dof)) if ss > 0 else 0.0
    return {
        "dof": dof,
        "std": math.sqrt(s2),
        "sigma_ub": sigma_ub,
        "claimed": float(claimed_std),
        "below": bool(sigma_ub < claimed_std),
    }


def audit(
    release: Callable[[int, int, np.random.Generator], np.ndarray],
    *,
    reference: np.ndarray,
    direction: np.ndarray,
    scale: float,
    draws: int = 20000,
    rng: np.random.Generator,
    delta: float = 0.0,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    alpha: float = 0.05,
    comparisons: int = 1,
    claimed_mu: float | None = None,
    claimed_eps: float | None = None,
) -> AuditResult:
    """Audit any mechanism from its releases on D0 and D1.

    Parameters
    ----------
    release : callable ``(neighbour, n, rng) -> array (n, ...)``
        Draws ``n`` independent releases on D0 (``neighbour=0``) or D1 (``1``).
    reference : array
        The noiseless statistic on D0 (same shape as one release).
    direction : array
        Where the canary moves the statistic (normalised here).
    scale : float
        The claimed noise scale (sigma, or the Laplace scale); scores are
        ``<release - reference, direction> / scale``.
    draws : int
        Releases per side.
    rng : numpy.random.Generator
    """
    check_generator(rng)
    scale = check_real(scale, "scale")
    if not (scale > 0 and math.isfinite(scale)):
        raise ConfigError(f"scale must be finite and > 0 (the claimed noise scale), got scale={scale}")
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise ConfigError(f"draws must be an int >= 1, got draws={draws!r}")  # 2.7 was cut to 2
    u = np.asarray(direction, dtype=np.float64).ravel()
    norm = np.linalg.norm(u)
    if norm == 0 or not np.isfinite(norm):
        raise ConfigError("direction must be non-zero and finite")
    u = u / norm
    ref = np.asarray(reference, dtype=np.float64).ravel()
    if ref.size != u.size:
        raise ConfigError(f"direction has {u.size} values and reference {ref.size}; they must match")
    scores = []
    for side in (0, 1):
        out = np.asarray(release(side, int(draws), rng), dtype=np.float64).reshape(int(draws), -1)
        if out.shape[1] != ref.size:
            raise ConfigError(f"release returned {out.shape[1]} values per draw, reference has {ref.size}")
        scores.append((out - ref) @ u / scale)
    return audit_scores(
        scores[0],
        scores[1],
        delta=delta,
        thresholds=thresholds,
        alpha=alpha,
        comparisons=comparisons,
        claimed_mu=claimed_mu,
        claimed_eps=claimed_eps,
    )


def upper_triangle(a: np.ndarray) -> np.ndarray:
    """Upper triangle (with diagonal) of the last two axes, flattened: where symmetric noise is iid."""
    d = a.shape[-1]
    iu = np.triu_indices(d)
    return a[..., iu[0], iu[1]]


def audit_gaussian_blocks(
    make_mechanism: Callable[[], object],
    *,
    rng: np.random.Generator,
    draws: int | None = None,
    ratio: float = 1.25,
    power: float = 0.99,
    num_records: int = 50,
    dim: int = 4,
    num_classes: int = 3,
    canary_scale: float = 100.0,
    alpha: float = 0.05,
    blocks: Sequence[str] | None = None,
    max_draws: int = 400_000,
) -> dict[str, AuditResult]:
    """The canary audit (docs: privacy, "Auditing") for a Gaussian mechanism on clipped statistics.

    A per-block unit check of ``release()`` against the mechanism's own sigma, with one canary: it
    cannot see a block noised only in part (the diagonal of the second moment, one class, one
    coordinate) nor anything the public path adds.  Judge a configuration with
    :func:`privfed.audit.audit_release`, which audits the public path against the report's claim.

    D0 holds ``num_records`` random records; D1 adds a canary of class 0 far
    outside the clip (``canary_scale`` times the bound, along e1 for L2
    clipping, along (1, ..., 1) for coordinate clipping).  Each block is
    audited separately against the claim Delta_b / sigma_b, with one
    Bonferroni correction over all blocks.

    ``draws=None`` (default) takes the draws per side from :func:`draws_for_power`: enough to refute,
    with probability ``power``, a mechanism whose true mu is ``ratio`` times the smallest block claim
    (ratio 1.25: noise scaled by 0.8), capped at ``max_draws``.

    Parameters
    ----------
    make_mechanism : callable
        Returns a fresh mechanism exposing ``release(features, labels, rng=,
        num_classes=, draws=)``, ``clip``, ``sigma``, ``sensitivity`` and
        ``blocks`` (as :class:`mechanisms.GaussianMechanism`).  The claims are
        read from the mechanism; a broken variant may release differently.
    """
    data_rng = np.random.default_rng(12345)
    mech = make_mechanism()
    F0 = data_rng.normal(size=(num_records, dim))
    y0 = data_rng.integers(0, num_classes, size=num_records)
    bound = float(mech.clip_bound)
    if getattr(mech.clipping, "norm", "l2") == "coordinate":
        canary = np.full(dim, canary_scale * bound)
    else:
        canary = np.zeros(dim)
        canary[0] = canary_scale * bound
    F1 = np.vstack([F0, canary])
    y1 = np.append(y0, 0)
    mech.clip(F0)  # resolves the dimension-dependent calibration
    sigma, sens = dict(mech.sigma), dict(mech.sensitivity)
    blocks = list(blocks or mech.blocks)
    claims = {b: (math.inf if sigma[b] == 0 else sens[b] / sigma[b]) for b in blocks}
    if draws is None:
        finite = [c for c in claims.values() if math.isfinite(c) and c > 0]
        draws = (
            2000
            if not finite
            else min(
                int(max_draws),
                draws_for_power(min(finite), ratio=ratio, power=power, alpha=alpha, comparisons=len(blocks)),
            )
        )
    from privfed.stats import compute_client_stats

    fields = ("counts", "sums", "second") if "second" in mech.blocks else ("counts", "sums")
    clip = mech.clipping
    ref = compute_client_stats(clip(F0), y0, None, num_classes=num_classes, fields=fields)
    alt = compute_client_stats(clip(F1), y1, None, num_classes=num_classes, fields=fields)

    def flat(stats, block):
        a = getattr(stats, block)
        return upper_triangle(a) if block == "second" else a.reshape(a.shape[0], -1)

    outs = {}
    for side, (F, y) in enumerate(((F0, y0), (F1, y1))):
        m = make_mechanism()
        outs[side] = m.release(F, y, rng=rng, num_classes=num_classes, draws=int(draws))
    results = {}
    for block in blocks:
        r = flat(ref, block)[0]
        u = flat(alt, block)[0] - r
        u = u / np.linalg.norm(u)
        s0 = (flat(outs[0], block) - r) @ u / sigma[block]
        s1 = (flat(outs[1], block) - r) @ u / sigma[block]
        results[block] = audit_scores(s0, s1, alpha=alpha, comparisons=len(blocks), claimed_mu=claims[block])
    return results
