"""Subspace membership on second moments.

A client with n < d samples uploads G_k = sum_i f_i f_i^T, whose range is
exactly span{f_1, ..., f_n} (attacks.md, "subspace membership on G").  The
attacker tests a target y by the fraction of its energy inside the
principal subspace of the released G_k:

    score(y, k) = ||P_k y||^2 / ||y||^2,

P_k the projector on the eigenvectors of G_k whose eigenvalues exceed a
threshold: a relative floor ``rel_tol`` * lambda_max for the clean release,
and, under Gaussian noise of std sigma per entry (upper triangle mirrored),
the bulk edge 2 sigma sqrt(d) of the noise spectrum (a Wigner matrix with
entry variance sigma^2 has spectral norm ~ 2 sigma sqrt(d)).  A member of a
clean G scores 1; a non-member scores below 1 unless it lies in the span.
Targets are tested only against clients that released their class (the
counts say which), so the test is about the record, not its class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.base import Attack
from attacks.knowledge import check_truth
from attacks.metrics import membership_metrics
from attacks.params import check_fprs, check_targets
from attacks.view import GroundTruth, ServerView, membership_targets, paired_mask
from mechanisms.dp.calibration import check_count, check_nonnegative
from privfed._validation import finite_reals
from privfed.errors import InputError

__all__ = ["SubspaceMembership", "SubspaceResult", "signal_projectors"]


def signal_projectors(
    second: np.ndarray, sigma: float = 0.0, rel_tol: float = 1e-8, edge: float = 2.0
) -> tuple[list[np.ndarray], np.ndarray]:
    """Orthonormal bases (d, r_k) of the signal subspace of every G_k, and the ranks r_k."""
    G = np.asarray(second)
    # one (d, d) matrix is no stack of second moments (read as d rows it gives bases of garbage)
    if G.ndim != 3 or G.shape[1] != G.shape[2] or G.shape[2] == 0:
        raise InputError(
            f"second must have shape (K, d, d), one square matrix per released row, got {G.shape}"
        )
    G = finite_reals(G, "second", "pass the released (finite) second moments")
    # a NaN threshold keeps no eigenvalue (or ignores the noise), a negative one every eigenvalue: refused
    sigma, rel_tol, edge = (
        check_nonnegative(v, k) for v, k in ((sigma, "sigma"), (rel_tol, "rel_tol"), (edge, "edge"))
    )
    d = G.shape[-1]
    w, V = np.linalg.eigh(0.5 * (G + np.swapaxes(G, -1, -2)))
    bases, ranks = [], []
    for wk, Vk in zip(w, V):
        thr = max(rel_tol * max(float(wk.max()), 0.0), edge * sigma * np.sqrt(d))
        keep = wk > thr
        bases.append(Vk[:, keep])
        ranks.append(int(keep.sum()))
    return bases, np.array(ranks)


@dataclass(frozen=True, eq=False)
class SubspaceResult:
    target_ids: np.ndarray
    rows: np.ndarray
    owners: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray
    per_client: bool
    partners: np.ndarray | None = None


class SubspaceMembership(Attack):
    """Is the target inside the span the client's second moment reveals?"""

    name = "subspace"
    requires = frozenset({"second"})
    defaults = {"rel_tol": 1e-8, "edge": 2.0, "max_targets": 400, "fprs": (0.01, 0.001)}

    def _validate_params(self) -> None:
        p = self.params
        p["rel_tol"] = check_nonnegative(p["rel_tol"], "rel_tol")  # NaN kept no eigenvalue: auc 0.5
        p["edge"] = check_nonnegative(p["edge"], "edge")
        p["max_targets"] = check_count(p["max_targets"], "max_targets")
        p["fprs"] = check_fprs(p["fprs"])

    def run(
        self,
        view: ServerView,
        rng=None,
        *,
        targets=None,
        target_ids=None,
        target_labels=None,
        partners=None,
        **_,
    ) -> SubspaceResult:
        """Score every (target, client) pair; with ``target_labels``, only clients that released
        the target's class (so members and non-members share the class: record membership, not
        class membership).  ``partners`` is carried to the result for scoring only (the game's pairing,
        :func:`attacks.view.membership_targets`)."""
        self.check(view)
        if targets is None:
            raise InputError("subspace membership needs targets=(n, d) features to test")
        Y, yl, ids = check_targets(view, targets, target_labels, target_ids)
        sigma = float(view.noise.sigma.get("second", view.noise.sigma.get("class_second", 0.0)))
        bases, ranks = signal_projectors(
            view.second_moments(), sigma, self.params["rel_tol"], self.params["edge"]
        )
        yn = np.maximum((Y**2).sum(axis=1), 1e-300)
        S = np.stack([((Y @ B) ** 2).sum(axis=1) / yn for B in bases], axis=1)  # (n, K)
        K = len(bases)
        T, R = np.meshgrid(np.arange(Y.shape[0]), np.arange(K), indexing="ij")
        T, R, S = T.ravel(), R.ravel(), S.ravel()
        part = None if partners is None else np.asarray(partners).astype(np.int64)
        if part is not None and part.shape != (Y.shape[0],):
            raise InputError(
                f"partners must have one entry per target ({Y.shape[0]}), got shape {part.shape}"
            )
        if yl is not None:
            keep = view.stats.counts[R, yl[T]] >= 0.5
            T, R, S = T[keep], R[keep], S[keep]
        owners = R if view.stats.owners is None else view.stats.owners[R]
        return SubspaceResult(
            target_ids=ids[T],
            rows=R,
            owners=owners,
            scores=S,
            ranks=ranks,
            per_client=view.per_client,
            partners=None if part is None else part[T],
        )

    def score(self, result: SubspaceResult, truth: GroundTruth) -> dict:
        member, keep = paired_mask(
            result.target_ids, result.owners, result.per_client, truth, result.partners
        )
        if not (member[keep].any() and (~member[keep]).any()):
            raise InputError("the membership game has no member/non-member pair on a released row")
        out = membership_metrics(result.scores[keep], member[keep], self.params["fprs"])
        out["mean_rank"] = float(result.ranks.mean())
        out["test"] = "subspace"  # what the table's auc[...] names (tracing reports its test the same way)
        return out

    def evaluate(self, view: ServerView, truth: GroundTruth, rng: np.random.Generator) -> dict:
        """Members: uploaded private records; non-members: holdout records of the same class, each tested
        on its member counterpart's rows."""
        check_truth(truth, view)
        targets, labels, ids, partners = membership_targets(
            view, truth, self.params["max_targets"], rng, "subspace"
        )
        return self.score(
            self.run(view, rng, targets=targets, target_ids=ids, target_labels=labels, partners=partners),
            truth,
        )
