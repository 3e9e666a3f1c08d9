"""Empirical differential-privacy audit: a statistical lower bound on what a mechanism leaks.

Run a mechanism many times on two neighbouring datasets D0 and D1 = D0 plus
one canary record, score each output, and bound the false-positive and
false-negative rates of threshold tests from above (Clopper-Pearson, with a
Bonferroni correction over thresholds and audited blocks).  Any mu-GDP
mechanism satisfies FNR >= Phi(Phi^-1(1 - FPR) - mu) for every test (Dong,
Roth & Su 2019, Def. 2.5), so

    mu_lb = max_t  Phi^-1(1 - FPR_ub(t)) - Phi^-1(FNR_ub(t))

is a lower bound on mu holding with probability >= 1 - alpha; likewise
(eps, delta)-DP forces FPR + e^eps FNR >= 1 - delta and the swapped
inequality (Kairouz et al. 2015; Jagielski et al. 2020), giving

    eps_lb = max_t max( ln((1 - delta - FPR_ub)/FNR_ub), ln((1 - delta - FNR_ub)/FPR_ub) ).

A lower bound above the claimed mu (or eps) proves the claim false: this
is how broken mechanisms (noise halved, clipping skipped, a sensitivity
miscalculated, a statistic left un-noised) are caught.  A bound below the
claim proves nothing: the audit can refute, never certify.

Release-level, black-box audit of the public paths (:func:`audit_release`):
a callable runs a release the way a user does (:func:`fit_release` wraps
``privfed.fit`` with a mechanism and a secure-aggregation protocol;
:func:`tradeoff_release` the trade-off sweep's path through
``tradeoff_privacy.make_privacy``) and returns everything the server or the
user receives.  For each pair of a battery of worst-case neighbours
(:func:`neighbour_battery`), any deterministic difference between the two
outputs (shapes, bytes, notes, errors, warnings, or a released value that
carries no noise) fails at once; otherwise a linear test is learnt and its
threshold chosen on held-out draws, and a Clopper-Pearson lower bound from
fresh draws is compared with the report's *composed* claim (its mu when the
report was computed in Gaussian DP, its epsilon otherwise).

:func:`audit` works on any mechanism: pass a function drawing ``n``
releases on D0 or D1 with an ``rng`` (vectorised).  :func:`audit_gaussian_blocks`
builds the canary experiment of ``../spec/privacy.md`` for
:class:`mechanisms.GaussianMechanism`-like objects, one score per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy.stats import beta as _beta
from scipy.stats import norm as _norm

from privfed.errors import ConfigError

__all__ = [
    "AuditResult",
    "DEFAULT_THRESHOLDS",
    "MIN_META_DRAWS",
    "Neighbours",
    "ReleaseAudit",
    "audit",
    "audit_gaussian_blocks",
    "audit_release",
    "audit_scores",
    "fit_release",
    "neighbour_battery",
    "tradeoff_release",
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


def _cp_upper(k: np.ndarray, n: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper confidence bound of a binomial rate."""
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
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must lie in (0, 1), got alpha={alpha}")
    if not 0 <= delta < 1:
        raise ConfigError(f"delta must lie in [0, 1), got delta={delta}")
    if np.isnan(s0).any() or np.isnan(s1).any():
        raise ConfigError("scores contain NaN; the mechanism produced invalid outputs")
    t = np.asarray(thresholds, dtype=np.float64)
    n = s0.size
    level = alpha / (2 * t.size * max(int(comparisons), 1))
    fp = (s0[None, :] > t[:, None]).sum(axis=1)
    fn = (s1[None, :] <= t[:, None]).sum(axis=1)
    fpr = _cp_upper(fp, n, level)
    fnr = _cp_upper(fn, n, level)
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
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if not (scale > 0):
        raise ConfigError(f"scale must be > 0 (the claimed noise scale), got scale={scale}")
    u = np.asarray(direction, dtype=np.float64).ravel()
    norm = np.linalg.norm(u)
    if norm == 0:
        raise ConfigError("direction must be non-zero")
    u = u / norm
    ref = np.asarray(reference, dtype=np.float64).ravel()
    scores = []
    for side in (0, 1):
        out = np.asarray(release(side, int(draws), rng), dtype=np.float64).reshape(int(draws), -1)
        if out.shape[1] != ref.size:
            raise ConfigError(f"release returned {out.shape[1]} values per draw, reference has {ref.size}")
        scores.append((out - ref) @ u / scale)
    return audit_scores(
        scores[0], scores[1], delta=delta, thresholds=thresholds, alpha=alpha, comparisons=comparisons,
        claimed_mu=claimed_mu, claimed_eps=claimed_eps,
    )


def _upper(a: np.ndarray) -> np.ndarray:
    """Upper triangle (with diagonal) of the last two axes, flattened: where the noise is iid."""
    d = a.shape[-1]
    iu = np.triu_indices(d)
    return a[..., iu[0], iu[1]]


def audit_gaussian_blocks(
    make_mechanism: Callable[[], object],
    *,
    rng: np.random.Generator,
    draws: int = 20000,
    num_records: int = 50,
    dim: int = 4,
    num_classes: int = 3,
    canary_scale: float = 100.0,
    alpha: float = 0.05,
    blocks: Sequence[str] | None = None,
) -> dict[str, AuditResult]:
    """The canary audit of ``../spec/privacy.md`` for a Gaussian mechanism on clipped statistics.

    A per-block unit check of ``release()`` against the mechanism's own sigma, with one canary: it
    cannot see a block noised only in part (the diagonal of the second moment, one class, one
    coordinate) nor anything the public path adds.  Judge a configuration with
    :func:`audit_release`, which audits the public path against the report's composed claim.

    D0 holds ``num_records`` random records; D1 adds a canary of class 0 far
    outside the clip (``canary_scale`` times the bound, along e1 for L2
    clipping, along (1, ..., 1) for coordinate clipping).  Each block is
    audited separately against the claim Delta_b / sigma_b, with one
    Bonferroni correction over all blocks.

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
    # Noiseless statistics on D0 and D1 with the claimed clipping: the reference and the direction.
    from privfed.stats import compute_client_stats

    fields = ("counts", "sums", "second") if "second" in mech.blocks else ("counts", "sums")
    clip = mech.clipping
    ref = compute_client_stats(clip(F0), y0, None, num_classes=num_classes, fields=fields)
    alt = compute_client_stats(clip(F1), y1, None, num_classes=num_classes, fields=fields)

    def flat(stats, block):
        a = getattr(stats, block)
        return _upper(a) if block == "second" else a.reshape(a.shape[0], -1)

    outs = {}
    for side, (F, y) in enumerate(((F0, y0), (F1, y1))):
        m = make_mechanism()
        outs[side] = m.release(F, y, rng=rng, num_classes=num_classes, draws=draws)
    results = {}
    for block in blocks:
        r = flat(ref, block)[0]
        u = flat(alt, block)[0] - r
        u = u / np.linalg.norm(u)
        s0 = (flat(outs[0], block) - r) @ u / sigma[block]
        s1 = (flat(outs[1], block) - r) @ u / sigma[block]
        results[block] = audit_scores(
            s0, s1, alpha=alpha, comparisons=len(blocks),
            claimed_mu=(math.inf if sigma[block] == 0 else sens[block] / sigma[block]),
        )
    return results


# =========================================================================== release-level audit
_NUM = __import__("re").compile(r"[-+]?\d[\d.eE+-]*")


def _norm_text(text: str) -> str:
    """Text with numbers masked: noisy numbers in notes must not count as a deterministic difference."""
    return _NUM.sub("#", str(text))


@dataclass(frozen=True)
class Neighbours:
    """Two datasets that differ by one unit of the neighbouring relation (``fit`` keyword arguments)."""

    name: str
    d0: dict
    d1: dict


def neighbour_battery(
    level: str = "record",
    *,
    seed: int = 0,
    dim: int = 4,
    num_classes: int = 3,
    num_clients: int = 4,
    per_client: int = 9,
    canary: float = 100.0,
    max_records: int = 20,
) -> list[Neighbours]:
    """Worst-case neighbour pairs for ``level`` (``"record"`` or ``"client"``).

    Record level: canaries far outside any clip in several classes and
    directions (class 0 along e1, class 1 along e2, class 2 along -e_d,
    class 1 along the diagonal, which moves every off-diagonal entry of a
    second moment), in a
    class its client lacked, a client's only record, a class's only record,
    and a record that changes how a class would be cut into chunks.  Client
    level: one client's whole data against none (the client still takes part:
    the client set is public), and a client holding ``max_records`` canaries
    of one class along e1 against none (it moves the sums and counts by
    exactly the client-level sensitivity).
    ``num_classes`` and ``num_clients`` are passed as public parameters.
    """
    rng = np.random.default_rng(seed)
    C, K, d = int(num_classes), int(num_clients), int(dim)
    n = K * per_client
    y = np.arange(n) % C
    k = (np.arange(n) // C) % K
    F = rng.normal(size=(n, d))
    # Client 0 lacks the last class; class C-1 exists elsewhere.
    drop = (k == 0) & (y == C - 1)
    F, y, k = F[~drop], y[~drop], k[~drop]
    pub = {"num_classes": C, "num_clients": K}

    def ds(F_, y_, k_):
        return {"features": F_, "labels": y_, "clients": k_, **pub}

    def e(j, sign=1.0):
        v = np.zeros(d)
        v[j % d] = sign * canary
        return v

    def add(rec, cls, cl):
        return ds(np.vstack([F, rec]), np.append(y, cls), np.append(k, cl))

    base = ds(F, y, k)
    if level == "client":
        keep = k != K - 1
        whole = Neighbours("whole client (zero-out)", ds(F[keep], y[keep], k[keep]), base)
        m = int(max_records)
        cans = np.tile(e(0), (m, 1))
        canary_client = Neighbours(
            f"client of {m} canaries (zero-out)",
            ds(F[keep], y[keep], k[keep]),
            ds(np.vstack([F[keep], cans]), np.append(y[keep], np.zeros(m, int)), np.append(k[keep], np.full(m, K - 1))),
        )
        return [whole, canary_client]
    pairs = [
        Neighbours("canary class 0 along e1", base, add(e(0), 0, 1)),
        Neighbours("canary class 1 along e2", base, add(e(1), 1 % C, 2 % K)),
        Neighbours(f"canary class {C - 1} along -e{d}", base, add(e(d - 1, -1.0), C - 1, 1)),
        Neighbours("canary in a class its client lacked", base, add(e(1), C - 1, 0)),
        Neighbours("canary class 1 along (1, ..., 1)", base, add(np.full(d, canary), 1 % C, 3 % K)),
    ]
    # A client's only record: client K-2 holds one record in D1 and none in D0.
    solo = k != K - 2
    pairs.append(Neighbours(
        "a client's only record",
        ds(F[solo], y[solo], k[solo]),
        ds(np.vstack([F[solo], e(2)]), np.append(y[solo], 0), np.append(k[solo], K - 2)),
    ))
    # A class's only record: class C-1 absent in D0.
    nolast = y != C - 1
    pairs.append(Neighbours(
        "a class's only record",
        ds(F[nolast], y[nolast], k[nolast]),
        ds(np.vstack([F[nolast], e(0)]), np.append(y[nolast], C - 1), np.append(k[nolast], 1)),
    ))
    # A record that changes chunking: client 1's class 0 goes from 3 to 4 records (min(M, n // 2) chunks).
    sel = np.flatnonzero((k == 1) & (y == 0))
    keep = np.ones(y.size, bool)
    keep[sel[3:]] = False
    three = ds(F[keep], y[keep], k[keep])
    four = ds(np.vstack([F[keep], F[sel[0]]]), np.append(y[keep], 0), np.append(k[keep], 1))
    pairs.append(Neighbours("a record that changes chunking", three, four))
    return pairs


@dataclass(frozen=True)
class ReleaseAudit:
    """The audit of one neighbour pair.

    ``verdict`` is ``"refused"`` (both sides refused with the same error:
    nothing released), ``"no claim"`` (the report claims no protection),
    ``"deterministic difference"`` (fails), ``"metadata only"`` (no
    difference found and no statistical test asked for), or ``"statistical"``
    (with lower bounds compared to the claim).
    """

    pair: str
    verdict: str
    reason: str
    claimed_eps: float = math.nan
    claimed_mu: float = math.nan
    eps_lb: float = 0.0
    mu_lb: float = 0.0
    draws: int = 0

    @property
    def flagged(self) -> bool:
        if self.verdict == "deterministic difference":
            return True
        if self.verdict != "statistical":
            return False
        if math.isfinite(self.claimed_mu):
            return self.mu_lb > self.claimed_mu
        return self.eps_lb > self.claimed_eps


def _one(run, data: dict, seed: int) -> dict:
    """Run one release; errors and warnings are part of what the user receives."""
    import warnings as _w

    from privfed.errors import PrivfedError

    with _w.catch_warnings(record=True) as caught:
        _w.simplefilter("always")
        try:
            out = dict(run(data, seed))
            out["error"] = None
        except PrivfedError as exc:
            out = {"arrays": [], "meta": (), "report": None, "error": f"{type(exc).__name__}: {exc}"}
    msgs = sorted({_norm_text(w.message) for w in caught if "noise backend 'numpy'" not in str(w.message)})
    out["warnings"] = tuple(msgs)
    return out


def _atoms(out: dict) -> set:
    """What a user sees of one run, as atoms: an atom seen in every draw on one side and in none on the
    other is a deterministic difference (a random one, e.g. a note that depends on the noise, is not)."""
    atoms = {("error", None if out["error"] is None else _norm_text(out["error"]))}
    atoms |= {("shape", i, tuple(np.shape(a))) for i, a in enumerate(out["arrays"])}
    atoms.add(("arrays", len(out["arrays"])))
    for i, m in enumerate(out.get("meta", ())):
        items = m if isinstance(m, tuple) and not all(isinstance(x, (int, np.integer)) for x in m) else (m,)
        for x in items:
            atoms.add(("meta", i, _norm_text(x) if isinstance(x, str) else x))
    rep = out.get("report")
    if rep is not None:
        atoms |= {("guarantee", _norm_text(rep.guarantee)), ("epsilon", rep.epsilon), ("delta", rep.delta),
                  ("placement", rep.placement)}
        atoms |= {("report note", _norm_text(n)) for n in rep.notes}
    atoms |= {("warning", w) for w in out["warnings"]}
    return atoms


def _flat(out: dict) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in out["arrays"]]) if out["arrays"] else np.zeros(0)


#: Fewest draws per side from which an atom is called deterministic (constant in every draw).  An
#: atom of probability p on both sides looks constant-present on one and constant-absent on the other
#: with probability 2 p^n (1 - p)^n <= 2 * 4^-n: 5e-10 at n = 16.
MIN_META_DRAWS = 16


def _deterministic_differences(atoms: list[list[set]]) -> list[str]:
    """Atoms constant on both sides (in every draw or in none) whose presence differs between them."""
    n0, n1 = len(atoms[0]), len(atoms[1])
    seen = set().union(*atoms[0], *atoms[1])
    count = [{a: sum(a in d for d in atoms[side]) for a in seen} for side in (0, 1)]
    return sorted(str(a) for a in seen
                  if (count[0][a] == n0 and count[1][a] == 0) or (count[0][a] == 0 and count[1][a] == n1))


def _random_atoms(atoms: list[list[set]]) -> list:
    """Atoms that vary between draws (present in some but not all): they go to the statistical test."""
    every = set.intersection(*atoms[0], *atoms[1])
    seen = set().union(*atoms[0], *atoms[1])
    return sorted(seen - every, key=str)


def _features(outs: list[dict], length: int, random_atoms: list) -> np.ndarray:
    """One row per draw: the released values (zero-padded to ``length``), their count, and an indicator
    per random metadata atom, so a metadata difference that is only random is still tested."""
    rows = np.zeros((len(outs), length + 1 + len(random_atoms)))
    for i, o in enumerate(outs):
        v = _flat(o)[:length]
        rows[i, :v.size] = v
        rows[i, length] = _flat(o).size
        if random_atoms:
            have = _atoms(o)
            rows[i, length + 1:] = [a in have for a in random_atoms]
    return rows


def audit_release(
    run: Callable[[dict, int], dict],
    pairs: Sequence[Neighbours],
    *,
    draws: int = 600,
    heldout: int = 300,
    meta_draws: int = MIN_META_DRAWS,
    alpha: float = 0.05,
    seed: int = 0,
) -> list[ReleaseAudit]:
    """Black-box audit of a release path on every neighbour pair.

    Parameters
    ----------
    run : callable ``(dataset kwargs, seed) -> dict``
        Runs the release as a user does.  ``dataset kwargs`` are the keyword
        arguments of :func:`privfed.fit` that describe the data
        (``features``, ``labels``, ``clients``, ``num_classes``,
        ``num_clients``); ``seed`` (an int) drives the run's randomness, so
        draws are reproducible.  It returns a dict with ``arrays`` (a list of
        every numeric array the server or the user receives), ``meta`` (a
        tuple of hashable metadata: shapes, bytes, notes; a tuple of strings
        is taken item by item) and ``report`` (the privacy report, an object
        with ``guarantee``, ``epsilon``, ``delta``, ``accountant``,
        ``placement``, ``notes`` and ``is_private``, or ``None``).  A
        :class:`privfed.errors.PrivfedError` it raises is an output too, and
        so are the warnings it emits.  :func:`fit_release` and
        :func:`tradeoff_release` build such callables.
    pairs : sequence of Neighbours
    draws, heldout : int
        Fresh draws per side for the bound, and held-out draws per side to
        learn the test direction and threshold; ``draws=0`` checks only for
        deterministic differences.
    meta_draws : int
        Draws per side compared for deterministic differences; at least
        :data:`MIN_META_DRAWS` (smaller values are raised to it).  An atom
        (error, shape, bytes, note, warning, report text) is deterministic
        only when it is constant over every draw of a side; only a difference
        between two such constants fails at once.  Atoms that vary are random:
        they enter the statistical test as indicators, with the released
        values.
    alpha : float
        Failure probability of each lower bound (FPR and FNR bounds at alpha / 2 each).

    Returns
    -------
    list of ReleaseAudit
    """
    meta_draws = max(int(meta_draws), MIN_META_DRAWS)
    results = []
    for p_i, pair in enumerate(pairs):
        base = seed * 1_000_003 + p_i * 100_003
        meta = [[_one(run, pair.d0 if side == 0 else pair.d1, base + i) for i in range(meta_draws)] for side in (0, 1)]
        atoms = [[_atoms(o) for o in meta[side]] for side in (0, 1)]
        only = _deterministic_differences(atoms)
        errs = [{o["error"] for o in meta[side]} for side in (0, 1)]
        if only:
            results.append(ReleaseAudit(pair.name, "deterministic difference",
                                        f"constant over {meta_draws} draws of each side and different: "
                                        f"{'; '.join(only)}"[:800]))
            continue
        if None not in errs[0] and errs[0] == errs[1]:
            results.append(ReleaseAudit(pair.name, "refused", sorted(e for e in errs[0] if e)[0][:300]))
            continue
        if draws == 0:
            results.append(ReleaseAudit(pair.name, "metadata only", "no deterministic difference in "
                                        f"{meta_draws} draws per side; no statistical test asked for"))
            continue
        reps = [o["report"] for side in (1, 0) for o in meta[side] if o["error"] is None]
        rep = reps[0] if reps else None
        if rep is None or not rep.is_private:
            results.append(ReleaseAudit(pair.name, "no claim", "" if rep is None else rep.guarantee[:300]))
            continue
        claimed_eps = float(rep.epsilon)
        claimed_mu = math.nan
        if str(rep.accountant).startswith("gdp"):
            from mechanisms.calibration import gdp_mu

            claimed_mu = float(gdp_mu(claimed_eps, rep.delta))
        random_atoms = _random_atoms(atoms)
        length = max(_flat(o).size for side in (0, 1) for o in meta[side])

        def sample(side, n, off):
            data = pair.d0 if side == 0 else pair.d1
            return _features([_one(run, data, base + off + i) for i in range(n)], length, random_atoms)

        H0, H1 = sample(0, heldout, 10_000), sample(1, heldout, 10_000)
        m0, m1 = H0.mean(axis=0), H1.mean(axis=0)
        v0, v1 = H0.var(axis=0), H1.var(axis=0)
        exact = (v0 == 0) & (v1 == 0) & (m0 != m1)
        if exact.any():
            j = int(np.flatnonzero(exact)[0])
            what = f"released value {j}" if j < length else ("the number of released values" if j == length
                                                             else f"metadata {random_atoms[j - length - 1]}")
            results.append(ReleaseAudit(
                pair.name, "deterministic difference",
                f"{int(exact.sum())} output(s) constant over {heldout} draws of each side and different "
                f"(first: {what}, {m0[j]:.6g} vs {m1[j]:.6g})",
                claimed_eps=claimed_eps, claimed_mu=claimed_mu, eps_lb=math.inf, mu_lb=math.inf, draws=heldout,
            ))
            continue
        var = np.maximum((v0 + v1) / 2, 1e-300)
        diff = m1 - m0
        tstat = np.abs(diff) / np.sqrt(2 * var / heldout)
        keep = tstat > 4.0
        if not keep.any():
            keep = tstat >= np.sort(tstat)[-min(3, tstat.size)]
        w = np.where(keep, diff / var, 0.0)
        s0h, s1h = (H0 - m0) @ w, (H1 - m0) @ w
        cands = np.quantile(np.concatenate([s0h, s1h]), np.linspace(0.02, 0.98, 49))
        fpr = np.clip((s0h[None, :] > cands[:, None]).mean(axis=1), 1.0 / heldout, 1 - 1.0 / heldout)
        fnr = np.clip((s1h[None, :] <= cands[:, None]).mean(axis=1), 1.0 / heldout, 1 - 1.0 / heldout)
        if math.isfinite(claimed_mu):
            crit = _norm.ppf(1 - fpr) - _norm.ppf(fnr)
        else:
            crit = np.maximum(np.log((1 - fpr) / fnr), np.log((1 - fnr) / fpr))
        thr = float(cands[int(np.argmax(crit))])
        T0, T1 = sample(0, draws, 50_000), sample(1, draws, 50_000)
        res = audit_scores((T0 - m0) @ w, (T1 - m0) @ w, delta=float(rep.delta), thresholds=[thr],
                           alpha=alpha, claimed_mu=claimed_mu if math.isfinite(claimed_mu) else None,
                           claimed_eps=None if math.isfinite(claimed_mu) else claimed_eps)
        results.append(ReleaseAudit(
            pair.name, "statistical", f"threshold {thr:.4g} chosen on {heldout} held-out draws per side"
            + (f"; {len(random_atoms)} random metadata atom(s) tested with the values" if random_atoms else ""),
            claimed_eps=claimed_eps, claimed_mu=claimed_mu, eps_lb=res.eps_lb, mu_lb=res.mu_lb, draws=draws,
        ))
    return results


class _Tap:
    """Wraps a privacy hook or a protocol and keeps what the server receives; delegates everything else."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.uploads = None
        self.aggregate = None
        self.sums: list = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @property
    def stream_target(self):
        """The hook whose streamed release the pipeline may take (through this tap's recording wrappers)."""
        return self._inner

    def fold_local_upload(self, stats, method, rng, *, chunk_bytes=None):
        """The inner streamed release (sum-only methods), recording every client's noisy upload."""
        parts: dict = {}

        def record(block, k0, k1, values):
            parts.setdefault(block, []).append(np.array(values))

        out = self._inner.fold_local_upload(stats, method, rng, chunk_bytes=chunk_bytes, observe=record)
        self.uploads = _uploads(parts, stats)
        return out

    def local_upload_stream(self, stats, rng, *, chunk_bytes=None):
        """The inner streamed release (per-client methods), recording every client's noisy upload."""
        counts, chunks = self._inner.local_upload_stream(stats, rng, chunk_bytes=chunk_bytes)
        tap = self

        def recording():
            sums = []
            for k0, k1, values in chunks:
                sums.append(np.array(values))
                yield k0, k1, values
            tap.uploads = _uploads({"counts": [counts], "sums": sums}, stats)

        return counts, recording()

    def before_upload(self, stats, method, rng):
        out = self._inner.before_upload(stats, method, rng)
        self.uploads = out
        return out

    def after_aggregate(self, total, method, rng):
        out = self._inner.after_aggregate(total, method, rng)
        self.aggregate = out
        return out

    def secure_sum(self, rng):
        fn = self._inner.secure_sum(rng)
        tap = self

        def wrapped(stack):
            total = fn(stack)
            tap.sums.append(np.array(total, dtype=np.float64))
            return total

        return wrapped

    def report(self, *args, **kwargs):
        return self._inner.report(*args, **kwargs)


def _uploads(parts: dict, stats):
    """The clients' recorded uploads (dense, one array per block) as a ClientStats."""
    from privfed.stats import ClientStats

    arrays = {block: np.concatenate(values) for block, values in parts.items()}
    return ClientStats(counts=arrays["counts"], sums=arrays["sums"], second=arrays.get("second"),
                       owners=stats.owners)


def _server_view(head, ptap: _Tap, stap: "_Tap | None") -> dict:
    rep = head.privacy
    if stap is not None and stap.sums:
        arrays = list(stap.sums)
    elif rep is not None and rep.placement == "central" and ptap.aggregate is not None:
        arrays = list(ptap.aggregate.arrays().values())
    elif ptap.uploads is not None:
        arrays = list(ptap.uploads.arrays().values())
    else:
        arrays = []
    up = head.upload_bytes or {}
    meta = (
        head.weight.shape,
        tuple(sorted((str(k), v) for k, v in up.items())),
        tuple(head.notes),
    )
    return {"arrays": arrays, "meta": meta, "report": rep}


def fit_release(method: str, make_privacy: Callable[[], object], make_secure_agg: Callable[[], object] | None = None,
                **params) -> Callable[[dict, int], dict]:
    """A release through :func:`privfed.fit`, as a user runs it, for :func:`audit_release`.

    ``make_privacy`` / ``make_secure_agg`` build fresh objects per draw; the
    returned arrays are what the server receives (each noisy upload with
    local noise, the noisy aggregate with a trusted aggregator, the secure
    sums under secure aggregation).
    """
    import privfed

    def run(data: dict, seed: int) -> dict:
        ptap = _Tap(make_privacy())
        stap = None if make_secure_agg is None else _Tap(make_secure_agg())
        head = privfed.fit(method, random_state=seed, privacy=ptap, secure_agg=stap, **data, **params)
        return _server_view(head, ptap, stap)

    return run


def tradeoff_release(cfg, method: str, epsilon: float, clip: float | None, secure: str = "none",
                     **params) -> Callable[[dict, int], dict]:
    """The trade-off sweep's path (``tradeoff_privacy.make_privacy`` + the pipeline's two stages)."""
    from privfed import methods as _methods
    from privfed.pipeline import client_statistics, server_head
    from privfed.tradeoff_privacy import make_privacy, make_secure_agg

    def run(data: dict, seed: int) -> dict:
        m = _methods.get(method, **params)
        sa = make_secure_agg(secure)
        stap = None if sa is None else _Tap(sa)
        ptap = _Tap(make_privacy(cfg, m, epsilon, clip, secure_agg=stap))
        declare = getattr(ptap, "declare_randomness", None)
        if declare is not None:
            declare(seeded=True)
        K, C = int(data["num_clients"]), int(data["num_classes"])
        rng = np.random.default_rng(seed)
        stats = client_statistics(m, np.asarray(data["features"], float), np.asarray(data["labels"]),
                                  np.asarray(data["clients"]), num_classes=C, num_clients=K, rng=rng,
                                  privacy=ptap, secure_agg=stap)
        head = server_head(m, stats, num_clients=K, rng=rng, privacy=ptap, secure_agg=stap)
        return _server_view(head, ptap, stap)

    return run
