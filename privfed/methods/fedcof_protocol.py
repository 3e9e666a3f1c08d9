"""FedCOF's two-round secure protocol (FedCOF paper, App. I.2), written once as a node and a server.

Both transports run these two classes: :meth:`privfed.methods.fedcof.FedCOF.secure_aggregate`
in one process (:func:`run_in_process`, each secure sum a ``SecureSum`` call), and the
Flower apps (:mod:`privfed.flower.protocol`), where each secure sum is a masked or CKKS sum
over messages and the round-2 broadcast travels with the masked stage.

Round ``fedcof-1``  every node sends one vector of 2C + C d values (3C + C d with
                    ``noise_var > 0``), summed over its valid (pseudo-)client rows
                    (n_kc > 0, the drop rule):

                        [ n_c  |  s_c = n_c mu_c (C x d)  |  presence #{rows with n_kc > 0}  |  sum 1/n_kc ]

                    One secure sum: the protocol overhead (keys, shares, unmasking) is
                    paid once, not once per array; every value is encoded as before, so
                    the decoded sums, and the head, are the same as three separate sums.
Broadcast           the server (:meth:`FedCOFServer.fold_round1`) reads N_c, S_c, K_c
                    (rounded) and mu_c = S_c / N_c from the sum and sends N_c, mu_c, K_c.
Round ``fedcof-2``  every node checks the broadcast (:meth:`FedCOFNode.check_broadcast`)
                    and sends its d x d spread
                    sum_c (N_c - 1)/(K_c - 1) n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T.
Head                the server adds sum_c (N_c - 1)(gamma - beta_c) I + N mu_g mu_g^T (Eq. 8)
                    and solves (:meth:`FedCOFServer.head`): the head of
                    :meth:`~privfed.methods.fedcof.FedCOF.aggregate`.

Threat model: :data:`THREAT_MODEL` (the Flower report states it with every
two-round run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from privfed.errors import InputError
from privfed.head import LinearHead
from privfed.methods.fedcof_estimator import (
    FedCOFEstimate,
    bias_from_sums,
    class_means,
    spread_matrix,
    spread_weights,
    valid_pairs,
    within_matrix,
)
from privfed.notes import Note

__all__ = [
    "BROADCAST_FIELDS",
    "COUNT_SLACK",
    "ROUNDS",
    "THREAT_MODEL",
    "BroadcastRefused",
    "FedCOFNode",
    "FedCOFServer",
    "node_rows",
    "round_lengths",
    "run_in_process",
]

#: What the protocol protects, on top of the secure sums' own threat model.
THREAT_MODEL = (
    "FedCOF two-round protocol (App. I.2): the server learns the round-1 sum (N_c, S_c and K_c, how many "
    "means each class has) and the round-2 sum of the nodes' spreads, each over at least t nodes under "
    "masking. A broadcast split between nodes (say mu = 0 for a victim, which would release its own "
    "sum_c w_c n_c mu_c mu_c^T) is caught by the transport: every node signs the digest of what it summed and "
    "reveals no share unless every uploader's echo matches (the CKKS key holder checks the same digests). "
    "A broadcast that is malformed or contradicts a node's own round-1 input (wrong shapes, non-finite "
    "values, fractional or negative K_c, K_c below the node's own means of a class, N_c below its own count, a "
    "class with no mean but a count) is refused before the node computes anything; so is a round the method "
    "does not run. A node told it sent every mean of a class it holds (K_c equal to its own means, which "
    "gives the class weight 0 when that is one) requires N_c and N_c mu_c to be its own count and sum (the "
    "pairs other nodes drop send nothing, so this holds exactly in an honest run, noisy counts included, up "
    "to the secure sum's encoding): the same broadcast cannot zero a class held by two or more nodes to "
    "isolate another class's scatter (the rank-one n_a n_b / N (mu_a - mu_b)(mu_a - mu_b)^T of a class "
    "held by two, which gives both means), since one of its holders refuses. Where a public bound is "
    "configured, K_c above it (the run's number of rows in process; on Flower the roster's K times the "
    "means per node) or N_c above it is refused. Refusal "
    "texts name the rule broken, never a value of the node. Not prevented: a false but plausible broadcast "
    "sent to every node (masking has no integrity, so no node can check round 1's sum). A false mu_c is a "
    "shift the server can undo from N_c and S_c, so it learns nothing more; a false N_c or K_c reweights "
    "the classes: w_c = (N_c - 1)/(K_c - 1) rises without limit with N_c (no public bound on counts unless "
    "one is configured, e.g. under DP) and falls with K_c up to the public bound on means, so one class's "
    "scatter can be weighted far above the others' and read approximately, to within the ratio of the "
    "weights. Every class's term is still a sum over all its holders that upload, and the round-2 sum one "
    "over at least t nodes, never one node's term."
)
#: The protocol's secure sums, in order.
ROUNDS = ("fedcof-1", "fedcof-2")
#: What the server broadcasts between the rounds.
BROADCAST_FIELDS = ("N", "mu", "Kc")
#: Relative slack (of max(|own value|, 1)) of the node's checks N_c >= its own count and, when it is a
#: class's only contributor, N_c == its count and N_c mu_c == its sum: the ring encoding rounds each summed
#: value by at most 2^-(f+1) (whole counts are exact at any f), so K 2^-(f+1) stays far below it for K up
#: to 10^5 nodes at f = 32, and CKKS releases on the 2^-20 grid (2^-21 < 1e-6); a lie that moves a weight
#: (N_c below a node's own count, another node's count or sum in a sole holder's class) is far above it.
COUNT_SLACK = 1e-6


class BroadcastRefused(InputError):
    """A node refuses the round-2 broadcast; ``deviation`` names what was wrong."""

    def __init__(self, message: str, *, deviation: str) -> None:
        super().__init__(message)
        self.deviation = deviation


def round_lengths(C: int, d: int, noise_aware: bool) -> dict[str, int]:
    """Values each node sends in each round: 2C + C d (+ C when noise-aware), then d^2."""
    return {"fedcof-1": 2 * C + C * d + (C if noise_aware else 0), "fedcof-2": d * d}


class FedCOFNode:
    """One node of the protocol: its own rows (one per pseudo-client of multi-mean sampling).

    Parameters
    ----------
    counts : array (R, C)
        The node's counts n_kc, one row per (pseudo-)client; R = 0 for a node without data.
    sums : array (R, C, d)
        The matching class sums n_kc mu_kc.
    noise_aware : bool
        Send sum_k 1/n_kc too (``noise_var > 0``).
    max_means : int, optional
        A public bound on any K_c (the number of (pseudo-)client rows of the whole run); a broadcast above
        it is refused.  None: unchecked.
    max_count : float, optional
        A public bound on any N_c (e.g. the number of nodes times ``max_records`` under DP, plus the
        noise's reach); a broadcast above it is refused.  None: unchecked.
    """

    def __init__(
        self,
        counts: np.ndarray,
        sums: np.ndarray,
        *,
        noise_aware: bool = False,
        max_means: int | None = None,
        max_count: float | None = None,
    ) -> None:
        counts = np.asarray(counts, dtype=np.float64)
        sums = np.asarray(sums, dtype=np.float64)
        if counts.ndim != 2 or sums.ndim != 3 or sums.shape[:2] != counts.shape:
            raise InputError(
                f"a FedCOF node needs counts (R, C) and sums (R, C, d), got {counts.shape} and {sums.shape}"
            )
        self.counts, self.sums = counts, sums
        self.noise_aware = bool(noise_aware)
        for name, bound in (("max_means", max_means), ("max_count", max_count)):
            if bound is not None and not (np.isfinite(bound) and bound >= 1):
                raise InputError(
                    f"a FedCOF node's {name} must be a finite number >= 1 or None, got {bound!r}"
                )
        self.max_means, self.max_count = max_means, max_count
        self.valid, self.dropped = valid_pairs(counts)  # the drop rule: pairs with n_kc <= 0 are not sent
        self.C, self.d = counts.shape[1], sums.shape[2]

    @classmethod
    def from_stats(cls, stats, method, *, max_means: int | None = None) -> FedCOFNode:
        """The node holding ``stats`` (its ClientStats) for ``method`` (a FedCOF); ``max_means`` as above."""
        return cls(stats.counts, stats.sums, noise_aware=method.params["noise_var"] > 0, max_means=max_means)

    # -- round 1 -------------------------------------------------------------------
    def round1(self) -> np.ndarray:
        """[counts C | sums C d | presence C | (sum 1/n_kc C)] over this node's valid rows."""
        v = self.valid
        parts = [
            np.where(v, self.counts, 0.0).sum(axis=0),
            np.where(v[..., None], self.sums, 0.0).sum(axis=0).ravel(),
            v.sum(axis=0, dtype=np.float64),
        ]
        if self.noise_aware:
            parts.append(np.where(v, 1.0 / np.where(v, self.counts, 1.0), 0.0).sum(axis=0))
        return np.concatenate(parts)

    # -- round 2 -------------------------------------------------------------------
    def check_broadcast(self, broadcast: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N, mu, Kc) from the server's broadcast, or :class:`BroadcastRefused` naming the deviation."""
        if not isinstance(broadcast, Mapping):
            raise BroadcastRefused(
                f"the round-2 broadcast is a {type(broadcast).__name__}, not N, mu and Kc",
                deviation="malformed",
            )
        if set(broadcast) != set(BROADCAST_FIELDS):
            raise BroadcastRefused(
                f"the round-2 broadcast carries {sorted(broadcast)}, expected exactly {list(BROADCAST_FIELDS)}",
                deviation="malformed",
            )
        C, d = self.C, self.d
        want = {"N": (C,), "mu": (C, d), "Kc": (C,)}
        got = {}
        for k, shape in want.items():
            try:
                a = np.asarray(broadcast[k], dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise BroadcastRefused(
                    f"broadcast {k} is not numeric ({exc})", deviation="malformed"
                ) from None
            if a.shape != shape:
                raise BroadcastRefused(
                    f"broadcast {k} has shape {a.shape}, expected {shape} (C={C}, d={d})",
                    deviation="malformed",
                )
            if not np.all(np.isfinite(a)):
                raise BroadcastRefused(f"broadcast {k} holds NaN or inf values", deviation="non-finite")
            got[k] = a
        N, mu, Kc = got["N"], got["mu"], got["Kc"]

        def refuse(rule: str):
            raise BroadcastRefused(
                f"the round-2 broadcast breaks a rule ({rule}): it is not round 1's sum, and the node aborts",
                deviation="implausible-broadcast",
            )

        if np.any(Kc < 0) or np.any(Kc != np.round(Kc)):
            raise BroadcastRefused(
                "broadcast K_c must be whole numbers >= 0 (the number of means of each class)",
                deviation="implausible-broadcast",
            )
        # From here every check compares the broadcast with this node's own input: a refusal names the
        # rule only (no class, count or mean), since its text goes back to the server.
        own_n = np.where(self.valid, self.counts, 0.0).sum(axis=0)
        own_s = np.where(self.valid[..., None], self.sums, 0.0).sum(axis=0)
        own_k = self.valid.sum(axis=0)
        if np.any(Kc < own_k):
            refuse("a K_c is below the number of means this node alone sent of that class")
        if np.any(N < own_n - COUNT_SLACK * np.maximum(np.abs(own_n), 1.0)):
            refuse("an N_c is below this node's own count of that class")
        sole = (own_k > 0) & (Kc == own_k)
        if sole.any():
            n_off = np.abs(N - own_n) > COUNT_SLACK * np.maximum(np.abs(own_n), 1.0)
            s_off = np.abs(N[:, None] * mu - own_s) > COUNT_SLACK * np.maximum(np.abs(own_s), 1.0)
            if np.any(sole & (n_off | s_off.any(axis=1))):
                refuse(
                    "a K_c says this node sent every mean of a class it holds, but N_c and N_c mu_c are "
                    "not its own count and sum of that class"
                )
        if self.max_means is not None and np.any(Kc > self.max_means):
            refuse(f"a K_c is above {self.max_means:g}, the public bound on a class's means")
        if self.max_count is not None and np.any(N > self.max_count):
            refuse(f"an N_c is above {self.max_count:g}, the public bound on a class's count")
        empty = np.flatnonzero((Kc == 0) & ((N != 0) | np.any(mu != 0, axis=1)))
        if empty.size:  # the broadcast alone, nothing of this node's: the class may be named
            c = int(empty[0])
            raise BroadcastRefused(
                f"broadcast class {c} has K_c = 0 (no mean) but a non-zero N_c or mu_c; the node aborts",
                deviation="implausible-broadcast",
            )
        return N, mu, Kc

    def round2(self, broadcast: Mapping) -> np.ndarray:
        """This node's d x d spread sum_c w_c n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T from the checked broadcast."""
        N, mu, Kc = self.check_broadcast(broadcast)
        w = spread_weights(N, Kc)
        if self.counts.shape[0] == 0:
            return np.zeros((self.d, self.d))
        return spread_matrix(self.counts, self.sums, mu, w, self.valid, per_client=True).sum(axis=0)


class FedCOFServer:
    """The server of the protocol: folds round 1, forms the broadcast, decodes the head.

    ``method`` is the :class:`~privfed.methods.fedcof.FedCOF` whose parameters
    (gamma, noise_var, solver, normalise) build the head; C and d are public.
    """

    def __init__(self, method, C: int, d: int) -> None:
        self.method = method
        self.C, self.d = int(C), int(d)
        self.noise_aware = method.params["noise_var"] > 0
        self.lengths = round_lengths(self.C, self.d, self.noise_aware)
        self.N = self.S = self.mu = self.Kc = self.inv = None

    def fold_round1(self, total: np.ndarray) -> dict[str, np.ndarray]:
        """Read round 1's sum; returns the broadcast {N, mu, Kc} every node gets in round 2."""
        C, d = self.C, self.d
        v = np.asarray(total, dtype=np.float64).ravel()
        if v.size != self.lengths["fedcof-1"]:
            raise InputError(
                f"FedCOF's round-1 sum has {v.size} values, expected {self.lengths['fedcof-1']} (C={C}, d={d})"
            )
        self.N = v[:C].copy()
        self.S = v[C : C + C * d].reshape(C, d).copy()
        self.Kc = np.rint(v[C + C * d : 2 * C + C * d])
        self.inv = v[2 * C + C * d :].copy() if self.noise_aware else None
        self.mu = class_means(self.N, self.S)
        return self.broadcast()

    def broadcast(self) -> dict[str, np.ndarray]:
        if self.N is None:
            raise InputError("FedCOF's broadcast needs round 1's sum first (fold_round1)")
        return {"N": self.N.copy(), "mu": self.mu.copy(), "Kc": self.Kc.copy()}

    def head(self, spread: np.ndarray, notes: list | None = None) -> LinearHead:
        """Eq. 8 from round 1's sums and round 2's summed spread (d x d or d^2 values)."""
        if self.N is None:
            raise InputError("FedCOF's head needs round 1's sum first (fold_round1)")
        d = self.d
        G = np.asarray(spread, dtype=np.float64)
        if G.size != d * d:
            raise InputError(f"FedCOF's round-2 sum has {G.size} values, expected d^2 = {d * d}")
        G = G.reshape(d, d)
        p = self.method.params
        notes = list(notes or [])
        beta = None
        if self.noise_aware:
            beta = bias_from_sums(self.inv, self.N, self.Kc, p["noise_var"])
            notes.append(f"noise-aware: subtracted the noise bias (sigma^2={p['noise_var']:g})")
        notes += self.method.class_notes(self.N, self.Kc)
        G_hat = within_matrix(self.N, self.S, self.Kc, G, p["gamma"], beta)
        est = FedCOFEstimate(N=self.N, mu=self.mu, Kc=self.Kc, G_hat=G_hat, notes=notes)
        return self.method.finish(est, rounds=2)


def node_rows(stats) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each real client's (counts, sums) rows: pseudo-clients grouped by ``stats.owners`` (none: one row each).

    Owners are numbered 0..max; an owner without rows is a node without data (it sends zeros).
    """
    if stats.owners is None:
        return [(stats.counts[k : k + 1], stats.sums[k : k + 1]) for k in range(stats.num_clients)]
    owners = np.asarray(stats.owners, dtype=np.int64)
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(int(owners.max()) + 2))
    groups = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return [(stats.counts[rows], stats.sums[rows]) for rows in groups]


def run_in_process(method, stats, secure_sum: Callable[[np.ndarray], np.ndarray]) -> LinearHead:
    """The protocol with every node in this process: two ``secure_sum`` calls over the nodes' stack.

    ``secure_sum`` sums a (K, ...) stack (pairwise masking, CKKS or a plain sum); round 1's stack is
    (K, 2C + C d [+ C]), round 2's (K, d, d).  The note on dropped pairs counts what the nodes held back.
    """
    rows = node_rows(stats)
    # every node knows the run's number of (pseudo-)client rows: no class has more means than that
    nodes = [
        FedCOFNode(c, s, noise_aware=method.params["noise_var"] > 0, max_means=stats.num_clients)
        for c, s in rows
    ]
    server = FedCOFServer(method, stats.num_classes, stats.dim)
    broadcast = server.fold_round1(secure_sum(np.stack([n.round1() for n in nodes])))
    spread = secure_sum(np.stack([n.round2(broadcast) for n in nodes]))
    dropped = sum(n.dropped for n in nodes)
    notes: list = []
    if dropped:
        notes.append(
            Note(
                f"{dropped} (client, class) pair(s) with count <= 0 were not sent (App. I.1 drop rule)",
                "dropped_pairs",
                dropped,
            )
        )
    return server.head(spread, notes)
