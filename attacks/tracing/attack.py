"""Tracing (membership inference) on released class means: the attack, its game and its metrics.

Given a target record y of class c and a released class mean m (sum / count,
per client or the all-client sum under secure aggregation), decide whether y
is among the records averaged into m.  Three tests, each a score (higher =
member):

* ``inner``: T = <y - mu_ref, m - mu_ref> (Dwork, Smith, Steinke, Ullman &
  Vadhan, FOCS 2015, the inner-product tracer), mu_ref the attacker's public
  class mean;
* ``lrt``: the Gaussian likelihood ratio with features ~ N(mu, Sigma)
  (mu, Sigma from public data, Ledoit-Wolf shrinkage):
  H1: m ~ N(y/n + (n - 1) mu / n, (n - 1) Sigma / n^2 + tau^2 I),
  H0: m ~ N(mu, Sigma / n + tau^2 I), with tau = sigma_sums / n the noise std
  of the mean (the attacker knows the mechanism);
* ``homer``: sum_j |y_j - mu_j| - |y_j - m_j| (Homer et al., PLoS Genetics 2008);
* ``support``: post-ReLU features are non-negative, so a member satisfies
  S - y >= 0 in every coordinate of the released sum S = n m (the other
  records' sum).  With Gaussian noise of std sigma on S the test allows
  sigma * ``support_z``; score -max_j(y_j - S_j - tol)_+ (0: consistent);
* ``lrt+support``: the likelihood ratio, with every target the support
  test excludes ranked below every target it keeps (exact on a clean sum:
  no member is ever excluded);
* ``sum``: <y, S> on the released sum S = n m.  Under add/remove-one
  neighbours the member's sum is the non-member's plus y, so this is the
  Neyman-Pearson test when nothing else is in the sum (n = 1): against a
  Gaussian release of noise sigma it reaches AUC = Phi(||y|| / (sigma sqrt 2)),
  the GDP bound when ||y|| equals the clip bound.  It audits the noise;
* ``learned``: a classifier trained on public simulations (Shokri et al.,
  S&P 2017, shadow models; here the shadow releases are cheap): the attacker
  simulates releases of its public records with the released rows' counts
  and the view's noise (members: a record in the simulated sum; non-members:
  another public record of the class), computes :func:`pair_features` of
  each (mean, candidate) pair (likelihood ratio, inner product, cosine,
  support violations, the sum statistic, the count) and trains a small MLP
  (scikit-learn) on them; the score is the classifier's log-odds.  It reads
  only the view and the public data.

Scores are measured by AUC and TPR at low FPR (:mod:`attacks.metrics`) and
compared with the closed form and the DP bounds of :mod:`attacks.theory`.
:func:`tracing_game` runs the membership game many times on a pool of
records, for curves and for the statistical tests.  The tests' scores and
the learned test live in :mod:`attacks.tracing.scores` (re-exported here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as _beta

from attacks.base import Attack
from attacks.knowledge import check_truth
from attacks.metrics import membership_metrics
from attacks.params import check_fprs, check_targets
from attacks.tracing.scores import (
    PAIR_FEATURES,
    REFERENCES,
    TESTS,
    LearnedTest,
    ReferenceModel,
    learned_test,
    pair_features,
    reference_model,
    trace_scores,
)
from attacks.view import GroundTruth, PublicData, ServerView, membership_targets
from mechanisms.dp.calibration import as_real, check_count, check_nonnegative
from privfed._validation import check_features, is_integer
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError, InputError

__all__ = [
    "PAIR_FEATURES",
    "REFERENCES",
    "TESTS",
    "LearnedTest",
    "ReferenceModel",
    "Tracing",
    "TracingResult",
    "learned_test",
    "pair_features",
    "reference_model",
    "trace_scores",
    "tracing_game",
]


@dataclass(frozen=True, eq=False)
class TracingResult:
    """Scores of every (target, released row) pair the attacker could test."""

    target_ids: np.ndarray
    rows: np.ndarray
    owners: np.ndarray
    scores: np.ndarray
    test: str
    per_client: bool
    #: Per pair, the member record whose rows the target is tested on (the game's pairing), if given.
    partners: np.ndarray | None = None


def _noise_tau(view: ServerView, counts: np.ndarray) -> np.ndarray:
    s = float(view.noise.sigma.get("sums", 0.0))
    return s / np.maximum(counts, 1.0)


class Tracing(Attack):
    """Trace target records in the released class means (per client, or the secure sum)."""

    name = "tracing"
    requires = frozenset({"counts", "sums", "public"})
    defaults = {
        "test": "lrt",
        "shrinkage": "ledoit-wolf",
        "max_targets": 400,
        "fprs": (0.01, 0.001),
        "reference": "public",
        "support_z": 4.0,
        "sims": 600,
        "seed": 0,
    }

    @property
    def knowledge(self) -> str:
        """What this attacker uses, in words."""
        ref = (
            "the other released rows' pooled class mean"
            if self.params["reference"] == "aggregate"
            else "the public class mean"
        )
        if self.params["test"] == "learned":
            return (
                "released class sums and counts + public features: a classifier trained on simulated "
                "releases of public records with the released counts and the view's noise"
            )
        return (
            f"released class sums and counts + public features (covariance); test {self.params['test']!r}, "
            f"reference {ref}"
        )

    def _validate_params(self) -> None:
        if self.params["test"] not in TESTS:
            raise ConfigError(f"unknown tracing test {self.params['test']!r}; choose from {list(TESTS)}")
        if self.params["reference"] not in REFERENCES:
            raise ConfigError(
                f"unknown tracing reference {self.params['reference']!r}; choose from {list(REFERENCES)}"
            )
        z = self.params["support_z"]
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not z >= 0:
            raise ConfigError(
                f"support_z must be a number >= 0 (inf switches the support test off), got {z!r}"
            )
        for key, low in (("sims", 10), ("seed", 0)):
            v = self.params[key]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ConfigError(f"tracing {key} must be an integer >= {low}, got {v!r}")
        self.params["max_targets"] = check_count(self.params["max_targets"], "max_targets")
        self.params["fprs"] = check_fprs(self.params["fprs"])

    def models(self, public: PublicData, num_classes: int) -> list[ReferenceModel]:
        out = []
        for c in range(num_classes):
            F = public.features[public.labels == c]
            if F.shape[0] < 2:
                raise InputError(
                    f"public data has {F.shape[0]} record(s) of class {c}; tracing needs at least 2"
                )
            out.append(reference_model(F, self.params["shrinkage"]))
        return out

    def run(
        self,
        view: ServerView,
        rng=None,
        *,
        targets=None,
        target_labels=None,
        target_ids=None,
        partners=None,
        **_,
    ) -> TracingResult:
        """Score every target against every released row of its class.

        ``partners`` (optional, one per target) is carried to the result for
        scoring only: the member record whose rows each target is tested on
        (:func:`attacks.view.membership_targets`); the scores do not read it.
        Runs on one BLAS thread (d x d matrices: more threads only contend).
        """
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            return self._run(view, targets, target_labels, target_ids, partners)

    def _run(self, view: ServerView, targets, target_labels, target_ids, partners) -> TracingResult:
        self.check(view)
        if targets is None or target_labels is None:
            raise InputError("tracing needs targets=(n, d) features and target_labels=(n,) classes to test")
        Y, yl, ids = check_targets(view, targets, target_labels, target_ids)
        part = None if partners is None else np.asarray(partners).astype(np.int64)
        if part is not None and part.shape != (Y.shape[0],):
            raise InputError(
                f"partners must have one entry per target ({Y.shape[0]}), got shape {part.shape}"
            )
        models = self.models(view.public, view.num_classes)
        counts, sums = view.stats.counts, view.stats.sums
        K = counts.shape[0]
        # count noise of FedCOF App. I.1 rescales the clean sums (n~ * mean): S is then not the records' sum
        noisy_counts = view.noise.count_kind is not None and view.noise.sigma.get("sums", 0.0) <= 0
        z = self.params["support_z"] if not noisy_counts else math.inf
        learned = None
        if self.params["test"] == "learned":
            from attacks.view import clip_rows

            pub = view.public
            pools, cnts = {}, {}
            for c in np.unique(yl):
                P = pub.features[pub.labels == c]
                pools[c] = clip_rows(P, view.noise.clip, view.noise.clip_norm)
                cnts[c] = counts[counts[:, c] >= 0.5, c]
            # seeded simulation: the attacker's own randomness, reproducible (it is not a release)
            learned = learned_test(
                pools,
                {c: models[c] for c in pools},
                cnts,
                sigma=float(view.noise.sigma.get("sums", 0.0)),
                count_sigma=float(view.noise.sigma.get("counts", 0.0)),
                sims=int(self.params["sims"]),
                support_z=z if math.isfinite(z) else 4.0,
                rng=np.random.default_rng(int(self.params["seed"])),
            )
        all_t, all_r, all_s = [], [], []
        for c in np.unique(yl):
            tix = np.flatnonzero(yl == c)
            rows = np.flatnonzero(counts[:, c] >= 0.5)  # a cell clipped to 0 is not sent
            if rows.size == 0:
                continue
            T, R = np.meshgrid(tix, rows, indexing="ij")
            T, R = T.ravel(), R.ravel()
            n = counts[R, c]
            M = sums[R, c] / np.maximum(n, 1.0)[:, None]
            ref = None
            if self.params["reference"] == "aggregate" and rows.size > 1:
                # leave-one-row-out pooled mean of the class: the private distribution's mean, not the public's
                tot_s, tot_n = sums[rows, c].sum(0), counts[rows, c].sum()
                ref = (tot_s[None] - sums[R, c]) / np.maximum(tot_n - n, 1.0)[:, None]
            if learned is not None:
                s = learned.score(Y[T], M, n, models[c], tau=_noise_tau(view, n))
            else:
                s = trace_scores(
                    Y[T],
                    M,
                    n,
                    models[c],
                    tau=_noise_tau(view, n),
                    test=self.params["test"],
                    support_z=z,
                    ref_means=ref,
                )
            all_t.append(T), all_r.append(R), all_s.append(s)
        if not all_s:
            raise InputError("no released class mean matches any target's class")
        rows = np.concatenate(all_r)
        owners = rows if view.stats.owners is None else view.stats.owners[rows]
        tix = np.concatenate(all_t)
        del K
        return TracingResult(
            target_ids=ids[tix],
            rows=rows,
            owners=owners,
            scores=np.concatenate(all_s),
            test=self.params["test"],
            per_client=view.per_client,
            partners=None if part is None else part[tix],
        )

    def score(self, result: TracingResult, truth: GroundTruth) -> dict:
        """AUC / TPR at low FPR over the scored pairs: with the game's pairing, each member on its own rows
        against its non-member counterpart on the same rows; without, every pair."""
        return _paired_metrics(result, truth, self.params["fprs"], test=result.test)

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        """Members: uploaded private records; non-members: holdout records of the same class, each tested
        on its member counterpart's rows."""
        check_truth(truth, view)
        targets, labels, ids, partners = membership_targets(
            view, truth, self.params["max_targets"], rng, "tracing"
        )
        return self.score(
            self.run(view, rng, targets=targets, target_ids=ids, target_labels=labels, partners=partners),
            truth,
        )


def _paired_metrics(result, truth: GroundTruth, fprs, **extra) -> dict:
    from attacks.view import paired_mask

    member, keep = paired_mask(
        result.target_ids, result.owners, result.per_client, truth, getattr(result, "partners", None)
    )
    if not (member[keep].any() and (~member[keep]).any()):
        raise InputError(
            "the membership game has no member/non-member pair on a released row "
            "(every member's row was withheld)"
        )
    out = membership_metrics(result.scores[keep], member[keep], fprs)
    out.update(empirical_epsilon(result.scores[keep], member[keep], fprs[0]))
    out.update(extra)
    return out


def empirical_epsilon(scores, members, fpr: float, confidence: float = 0.95) -> dict:
    """A lower bound on epsilon from the threshold test at ``fpr`` (Clopper-Pearson, one-sided).

    eps_lb = ln(TPR_lb / FPR_ub) with TPR_lb, FPR_ub the ``confidence`` one-sided
    Clopper-Pearson bounds at the realised threshold (delta taken as 0).
    """
    from attacks.metrics import tpr_at_fpr

    try:
        conf_ok = 0.0 < as_real(confidence) < 1.0
    except (TypeError, ValueError):
        conf_ok = False
    # NaN, 0 or 1 would give a bound of 0 that reads as "no privacy loss found"
    if not conf_ok:
        raise ConfigError(
            f"confidence must be a number strictly between 0 and 1 (e.g. 0.95), got {confidence!r}"
        )
    r = tpr_at_fpr(scores, members, fpr)
    m = np.asarray(members, bool)
    n1, n0 = int(m.sum()), int((~m).sum())
    tp, fp = round(r["tpr"] * n1), round(r["fpr"] * n0)
    a = 1 - confidence
    tpr_lb = _beta.ppf(a, tp, n1 - tp + 1) if tp > 0 else 0.0
    fpr_ub = _beta.ppf(1 - a, fp + 1, n0 - fp) if fp < n0 else 1.0
    eps = math.log(tpr_lb / fpr_ub) if tpr_lb > 0 and fpr_ub > 0 else 0.0
    return {"eps_lower_bound": max(eps, 0.0)}


def tracing_game(
    pool: np.ndarray,
    model: ReferenceModel,
    *,
    n: int,
    trials: int,
    rng: np.random.Generator,
    test: str = "lrt",
    sigma: float = 0.0,
    count_sigma: float | None = None,
    clip: float | None = None,
    design: str = "replace",
    support_z: float = 4.0,
) -> dict:
    """Play the membership game ``trials`` times per side on records drawn from ``pool``.

    Member trial: the release is the sum of the target and n - 1 other pool
    records.  Non-member trial: the target is not in the release, which holds
    n other records (``design="replace"``, the closed form's model) or n - 1
    (``design="add-remove"``, the DP neighbouring relation).  Noise: N(0,
    sigma^2) per sum coordinate and, if ``count_sigma`` is given, on the count
    (otherwise the count is released exactly).  ``clip`` clips every record
    first.  The attacker forms m = S / max(n~, 1) and its noise std sigma / n~.

    Returns
    -------
    dict with ``scores`` (2 * trials,), ``members`` (bool), ``counts`` (released).
    """
    P = check_features(pool, "pool")
    if clip is not None:
        from attacks.view import clip_rows

        P = clip_rows(P, clip)
    N, d = P.shape
    if not is_integer(n) or n < 1 or n + 1 > N:
        raise InputError(f"n must be an integer in 1..{N - 1} for a pool of {N} records, got {n!r}")
    trials = check_count(trials, "trials")
    # a negative or NaN sigma would add no noise while the test assumes some
    sigma = check_nonnegative(sigma, "sigma")
    if count_sigma is not None:
        count_sigma = check_nonnegative(count_sigma, "count_sigma")
    check_generator(rng)
    if design not in ("replace", "add-remove"):
        raise ConfigError(f"design must be 'replace' or 'add-remove', got {design!r}")
    # One random ordering per trial: the target first, then distinct others.
    order = np.argsort(rng.random((2 * trials, N)), axis=1)[:, : n + 1]
    tgt = P[order[:, 0]]
    member = np.zeros(2 * trials, dtype=bool)
    member[:trials] = True
    S = np.empty((2 * trials, d))
    cnt = np.empty(2 * trials)
    # member: target + (n - 1) others
    S[:trials] = tgt[:trials] + P[order[:trials, 1:n]].sum(axis=1)
    cnt[:trials] = n
    k = n if design == "replace" else n - 1
    S[trials:] = P[order[trials:, 1 : 1 + k]].sum(axis=1)
    cnt[trials:] = k
    if sigma > 0:
        S = S + rng.normal(0.0, sigma, size=S.shape)
    if count_sigma is not None and count_sigma > 0:
        cnt = cnt + rng.normal(0.0, count_sigma, size=cnt.shape)
    n_rel = np.maximum(cnt, 1.0)
    M = S / n_rel[:, None]
    scores = trace_scores(tgt, M, n_rel, model, tau=sigma / n_rel, test=test, support_z=support_z)
    return {"scores": scores, "members": member, "counts": cnt}
