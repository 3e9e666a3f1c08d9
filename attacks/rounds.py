"""Membership attacks across the R releases of multi-round FedLog (:mod:`privfed.rounds`).

Every round the server sees a new statistic: the per-class sums of the
augmented features phi = [1, f] of every client (plain FedLog: each client's
upload) or only their sum (secure aggregation, central or distributed DP).
A record's membership signal is in every one of them, so an attacker that
takes the whole sequence accumulates it: against Gaussian releases of noise
sigma_r on a statistic the record moves by phi_r, the log-likelihood ratios
of the rounds add and the test's GDP parameter is sqrt(sum_r ||phi_r||^2 /
sigma_r^2) -- at most mu_total = mu sqrt(R) when every release is mu-GDP.

The game.  ``pairs`` member records are drawn from the private records; each
is paired with a holdout record of its class (the test split: never in any
upload), and *both are tested on the row their member counterpart is in*
(the member's client's upload of its class, or the class's row of the sum):
a member is scored against the release that contains it, its holdout
counterpart against the same release, which does not.  The attacker is
white-box on the bodies (it can push any record through client k's body of
round r, as a server holding the bodies could; an auditor's strongest
attacker): its target of round r is phi_r(x) = [1, f_k,r(x)] clipped as the
clients clip.

Tests (score: higher = member), each on one round or on the sequence:

* ``tracing`` -- the Gaussian likelihood ratio (Sankararaman et al. 2009 /
  :func:`attacks.tracing.attack.trace_scores` generalised to sums): the other
  records of the row are modelled as independent draws of the class's
  feature distribution through each contributing client's body (mean and
  Ledoit-Wolf covariance of the *public* split through that body), plus the
  release noise; H1: S = f(x) + (n - 1 records of client k's class c) + the
  other clients' records, H0: S = all n records.  The sequence score is the
  sum of the rounds' log-ratios (exact for the noise, an approximation for
  the records, which repeat).
* ``differencing`` -- the attacker knows every other record's contribution
  (the DP adversary): z_r = S_r - (row without the target) is the target's
  phi_r plus noise under membership, noise alone otherwise; the Neyman-
  Pearson score sum_r <phi_r, z_r>/sigma_r^2 - ||phi_r||^2/(2 sigma_r^2).  It
  needs noise (sigma_r > 0).  Bodies trained on the records make "the row
  without the target" counterfactual; it is taken with the run's bodies.

Two evaluations: on the run's own releases (``released``; pairs that share a
row share its noise draw, so their trials are not independent), and a replay
(``replay``) that draws fresh noise of the run's sigma_r for every pair and
round on the run's clean rows -- independent trials, the one to hold
against the GDP bound Phi(mu_total / sqrt 2) with a tolerance from the number
of pairs.  AUC and TPR at 1% FPR from :mod:`attacks.metrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from attacks.metrics import membership_metrics
from privfed.errors import ConfigError

__all__ = [
    "RoundsAttackData",
    "mean_cov",
    "differencing_scores",
    "tracing_scores",
    "evaluate_rounds_attacks",
]


@dataclass
class RoundsAttackData:
    """What the attacks need, per round r and pair p (members then their holdout counterparts).

    ``phi`` (R, 2P, m): each target's augmented clipped feature through its row's client body;
    ``released`` (R, P, m): the released row each pair is tested on; ``clean`` (R, P, m): that row
    before noise; ``sigma`` (R,): noise standard deviation on the row; ``others_mean`` /
    ``others_cov`` (R, P, d) / (R, P, d, d): the Gaussian model of the row's records except one
    record of the member's client; ``one_mean`` / ``one_cov``: one record of that client's class.
    """

    view: str
    classes: np.ndarray
    clients: np.ndarray
    phi: list = field(default_factory=list)
    released: list = field(default_factory=list)
    clean: list = field(default_factory=list)
    sigma: list = field(default_factory=list)
    one_mean: list = field(default_factory=list)
    one_cov: list = field(default_factory=list)
    rest_mean: list = field(default_factory=list)
    rest_cov: list = field(default_factory=list)
    inc_one_mean: list = field(default_factory=list)
    inc_one_cov: list = field(default_factory=list)
    inc_rest_mean: list = field(default_factory=list)
    inc_rest_cov: list = field(default_factory=list)

    @property
    def pairs(self) -> int:
        return int(self.classes.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            k: np.asarray(getattr(self, k))
            for k in (
                "phi",
                "released",
                "clean",
                "sigma",
                "one_mean",
                "one_cov",
                "rest_mean",
                "rest_cov",
                "inc_one_mean",
                "inc_one_cov",
                "inc_rest_mean",
                "inc_rest_cov",
            )
        }


def mean_cov(F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and Ledoit-Wolf covariance of the rows of F (the attacker's model of one record)."""
    from sklearn.covariance import ledoit_wolf

    F = np.asarray(F, dtype=np.float64)
    if F.shape[0] < 2:
        raise ConfigError(
            f"the attacker's model needs at least 2 public records of a class, got {F.shape[0]}"
        )
    return F.mean(axis=0), ledoit_wolf(F)[0]


def _gauss_logpdf(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """log N(x; mean, cov) row by row: x, mean (P, d), cov (P, d, d)."""
    L = np.linalg.cholesky(cov)
    z = np.linalg.solve(L, (x - mean)[..., None])[..., 0]
    logdet = 2.0 * np.log(np.diagonal(L, axis1=-2, axis2=-1)).sum(-1)
    d = x.shape[-1]
    return -0.5 * ((z * z).sum(-1) + logdet + d * math.log(2 * math.pi))


def tracing_scores(
    phi: np.ndarray,
    released: np.ndarray,
    sigma: np.ndarray,
    one_mean: np.ndarray,
    one_cov: np.ndarray,
    rest_mean: np.ndarray,
    rest_cov: np.ndarray,
) -> np.ndarray:
    """Per-round Gaussian log-likelihood ratios (R, 2P) of each target on its pair's row.

    ``phi`` (R, 2P, m) targets (members first); the feature part (columns 1:) is tested.  Row model:
    S = rest + one + noise, rest ~ N(rest_mean, rest_cov), one more record of the member's client
    ~ N(one_mean, one_cov) (H0) or the target itself (H1), noise N(0, sigma^2 I).
    """
    R, P2, m = phi.shape
    P = P2 // 2
    d = m - 1
    out = np.empty((R, P2))
    eye = np.eye(d)
    for r in range(R):
        S = np.concatenate([released[r], released[r]])[:, 1:]
        y = phi[r, :, 1:]
        rm = np.concatenate([rest_mean[r], rest_mean[r]])
        rc = np.concatenate([rest_cov[r], rest_cov[r]])
        om = np.concatenate([one_mean[r], one_mean[r]])
        oc = np.concatenate([one_cov[r], one_cov[r]])
        noise = (float(sigma[r]) ** 2) * eye
        # a jitter of 1e-9 of the scale keeps a clean, low-rank rest covariance positive definite
        jit = 1e-9 * max(float(np.trace(rc.mean(0))) / d, 1e-12) * eye
        h1 = _gauss_logpdf(S, y + rm, rc + noise + jit)
        h0 = _gauss_logpdf(S, om + rm, rc + oc + noise + jit)
        out[r] = h1 - h0
    del P
    return out


def differencing_scores(
    phi: np.ndarray, released: np.ndarray, clean: np.ndarray, sigma: np.ndarray, *, paired: bool = True
) -> np.ndarray:
    """Per-round Neyman-Pearson scores (R, 2P): the attacker subtracts every other record of the row.

    Members: z = released - (clean - phi_member); holdouts: z = released - clean (the row holds
    every record but the holdout).  Score <phi, z>/sigma^2 - ||phi||^2/(2 sigma^2).  ``paired``:
    ``released`` / ``clean`` are (R, P, m), one row per pair; otherwise (R, 2P, m), one per target.
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    if np.any(sigma <= 0):
        raise ConfigError(
            "the differencing attack on the sequence needs noise on every release (sigma > 0): on a "
            "clean release it is exact (AUC 1)"
        )
    R, P2, m = phi.shape
    P = P2 // 2
    if paired:
        released = np.concatenate([released, released], axis=1)
        clean = np.concatenate([clean, clean], axis=1)
    z = released - clean
    z[:, :P] += phi[:, :P]  # a member's row without it is clean - phi
    s2 = sigma[:, None] ** 2
    return (phi * z).sum(-1) / s2 - 0.5 * (phi * phi).sum(-1) / s2


def _metrics(scores: np.ndarray, P: int) -> dict:
    members = np.zeros(2 * P, dtype=bool)
    members[:P] = True
    out = membership_metrics(scores, members, (0.01,))
    return {
        "auc": out["auc"],
        "auc_se": out["auc_se"],
        "tpr_at_1pct_fpr": out["tpr@0.01"],
        "fpr_realised": out["fpr_realised@0.01"],
    }


def evaluate_rounds_attacks(
    data: RoundsAttackData,
    rng: np.random.Generator,
    *,
    mu_total: float | None = None,
    mu_per_release: float | None = None,
) -> dict:
    """AUC and TPR@1%FPR of tracing and differencing on the first round, the last round and the whole sequence.

    With noise, the differencing attack is also replayed with fresh noise per pair (independent trials);
    ``mu_total`` / ``mu_per_release`` add the GDP bounds Phi(mu / sqrt 2) to compare with.
    """
    from scipy.stats import norm

    from attacks.theory import check_budget_value
    from privfed._validation.seeds import check_generator

    rng = check_generator(rng)
    # a negative mu bounded the AUC below one half, NaN gave a NaN bound
    mu_total = None if mu_total is None else check_budget_value(mu_total, "mu_total")
    mu_per_release = None if mu_per_release is None else check_budget_value(mu_per_release, "mu_per_release")
    a = data.arrays()
    sig = np.asarray(a["sigma"], dtype=np.float64)
    if not np.all(np.isfinite(sig) & (sig >= 0)):  # -1 read as "no noise" by one attack, squared by the other
        raise ConfigError(
            f"RoundsAttackData.sigma must be finite and >= 0 in every round, got {sig.tolist()}"
        )
    P = data.pairs
    R = a["phi"].shape[0]
    out: dict = {
        "view": data.view,
        "pairs": P,
        "rounds": R,
        "attacker": "white-box on the bodies; tracing models the other records from the public split "
        "through each client's body; differencing knows every other record",
    }
    tr = tracing_scores(
        a["phi"], a["released"], a["sigma"], a["one_mean"], a["one_cov"], a["rest_mean"], a["rest_cov"]
    )
    out["tracing"] = {
        "first_round": _metrics(tr[0], P),
        "last_round": _metrics(tr[-1], P),
        "sequence": _metrics(tr.sum(0), P),
    }
    if R > 1:
        # the rounds' changes: S_r - S_(r-1) holds the member's own change f_r(x) - f_(r-1)(x); the others'
        # changes are modelled from the public split's changes through the same bodies
        dphi = np.diff(a["phi"], axis=0)
        dS = np.diff(a["released"], axis=0)
        sig = np.sqrt(a["sigma"][1:] ** 2 + a["sigma"][:-1] ** 2)
        inc = tracing_scores(
            dphi,
            dS,
            sig,
            a["inc_one_mean"][1:],
            a["inc_one_cov"][1:],
            a["inc_rest_mean"][1:],
            a["inc_rest_cov"][1:],
        )
        out["tracing"]["increments"] = _metrics(tr[0] + inc.sum(0), P)
    if np.all(a["sigma"] > 0):
        df = differencing_scores(a["phi"], a["released"], a["clean"], a["sigma"])
        out["differencing"] = {
            "first_round": _metrics(df[0], P),
            "last_round": _metrics(df[-1], P),
            "sequence": _metrics(df.sum(0), P),
        }
        # replay: fresh noise of the run's sigma_r for every pair and round, members and holdouts apart
        noise_m = rng.standard_normal(a["released"].shape) * a["sigma"][:, None, None]
        noise_h = rng.standard_normal(a["released"].shape) * a["sigma"][:, None, None]
        rep = differencing_scores(
            a["phi"],
            np.concatenate([a["clean"] + noise_m, a["clean"] + noise_h], axis=1),
            np.concatenate([a["clean"], a["clean"]], axis=1),
            a["sigma"],
            paired=False,
        )
        out["differencing_replay"] = {"first_round": _metrics(rep[0], P), "sequence": _metrics(rep.sum(0), P)}
    else:
        out["differencing"] = None
        out["differencing_replay"] = None
    if mu_total is not None:
        out["auc_bound"] = float(norm.cdf(mu_total / math.sqrt(2.0)))
        out["mu_total"] = float(mu_total)
    if mu_per_release is not None:
        out["auc_bound_one_release"] = float(norm.cdf(mu_per_release / math.sqrt(2.0)))
    # a tolerance for comparing an AUC of P independent pairs with a bound: 3 sd of the worst-case variance
    # of an AUC estimate, AUC(1 - AUC) / min(n1, n0) <= 1 / (4 P)
    out["auc_tolerance_3sd"] = 3.0 * math.sqrt(0.25 / P)
    return out
