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
Round ``fedcof-2``  every node checks the broadcast against public values only
                    (:meth:`FedCOFNode.check_broadcast`) and sends its d x d spread
                    sum_c w_c n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T, w_c = (N_c - 1)/(K_c - 1)
                    (floored at 1 with exact counts), then one value: 1 if the node had to
                    clip its spread to the encodable range, else 0 (d^2 + 1 values).
Head                the server adds sum_c (N_c - 1)(gamma - beta_c) I + N mu_g mu_g^T (Eq. 8)
                    and solves (:meth:`FedCOFServer.head`): the head of
                    :meth:`~privfed.methods.fedcof.FedCOF.aggregate`.

Threat model: :func:`threat_model`, computed with the bounds the nodes check (the Flower report
states it with every two-round run).
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
    "BroadcastRefused",
    "FedCOFNode",
    "FedCOFServer",
    "node_rows",
    "round_lengths",
    "run_in_process",
    "threat_model",
]


def threat_model(
    max_means: int | None = None,
    max_count: float | None = None,
    *,
    exact: bool = True,
    max_ratio: float | None = None,
) -> str:
    """What the two-round protocol protects, on top of the secure sums' own threat model, with the public
    bounds the nodes check (``max_means`` on K_c, ``max_count`` on N_c, ``max_ratio`` on the ratio of the
    largest class weight to the smallest, :meth:`mechanisms.secagg.bounds.PublicBounds.fedcof_tilt`; None:
    unchecked) and whether counts are exact (no DP noise: the nodes then floor every class weight at 1)."""
    tilt = None
    if exact and max_ratio is not None:
        tilt = float(max_ratio)
    elif exact and max_count is not None:
        tilt = max(float(max_count) - 1, 1)
    if tilt is not None:
        source = (
            "the roster's weight ratio" if max_ratio is not None else "N_c - 1 at the roster's bound on N_c"
        )
        reweight = (
            f"every class weight the nodes accept is at least 1 and at most {tilt:.6g} times the smallest "
            f"({source}; weights floored at 1, which changes no honest sum: with exact counts N_c >= K_c, and a "
            "class of one mean adds nothing), so the server can tilt the round-2 sum toward one class by at most "
            f"{tilt:.6g}: divided by that weight, the sum is the class's scatter about a mu_c it chose plus "
            f"at least {1 / tilt:.3g} times the other classes' scatters, and without DP a class's second moment over its "
            f"holders is read to within that ratio (with round 1 and two holders, both holders' class means, up "
            "to the split of its count), never alone; only DP protects a class against it"
        )
    elif exact:
        reweight = (
            "every class weight is floored at 1 but not bounded above (no public bound on counts): a class's "
            "scatter can be weighted far above the others and read approximately"
        )
    else:
        reweight = (
            "with noisy counts (DP) the weights cannot be checked: K_c = 1 gives a class weight 0, so a broadcast "
            "can leave one class's scatter alone in the sum (each node's noisy statistics protect it; the Flower "
            "app refuses DP on this protocol)"
        )
    bound = (
        ""
        if max_means is None and max_count is None and max_ratio is None
        else " Public bounds: "
        + ", ".join(
            x
            for x in (
                None if max_means is None else f"K_c <= {int(max_means)}",
                None if max_count is None else f"N_c <= {float(max_count):.6g}",
                None
                if max_ratio is None or not exact
                else f"class weights within {float(max_ratio):.6g}-fold",
            )
            if x
        )
        + " (the operator's roster, never the server's)."
    )
    return (
        "FedCOF two-round protocol (App. I.2): the server learns the round-1 sum (N_c, S_c and K_c, how many "
        "means each class has) and the round-2 sum of the nodes' spreads, each over the secure sum's uploaders. "
        "A broadcast split between nodes is caught by the transport: every node signs the digest of what it "
        "summed and reveals no share unless every uploader's echo matches (the CKKS key holder checks the same "
        "digests). Every check a node makes on the broadcast reads the broadcast and public values only, never "
        "the node's own statistics, so a refusal says nothing about its data: wrong shapes, non-finite values, "
        "fractional or negative K_c, a class with no mean but a count, values above the public bounds, and "
        "with exact counts fractional N_c or N_c below K_c (each mean counts a record) are refused before the "
        "node computes anything; a round-2 input that would leave the encodable range is clipped to it and "
        "counted in one extra summed value, so the server learns only how many nodes of the sum were clipped "
        "(it then releases no head)."
        + bound
        + " Not prevented: a false but plausible broadcast sent to every "
        "node (masking has no integrity, so no node can check round 1's sum). A false mu_c is a shift the "
        "server can undo from N_c and S_c; a false N_c or K_c reweights the classes: "
        + reweight
        + ". Every class's term is still a sum over all its holders that upload, never one node's term; a "
        "server that runs the protocol again under other configurations with other weights gets other "
        "weighted sums of the classes' scatters (without DP nothing bounds what several runs reveal together)."
    )


#: The protocol's secure sums, in order.
ROUNDS = ("fedcof-1", "fedcof-2")
#: What the server broadcasts between the rounds.
BROADCAST_FIELDS = ("N", "mu", "Kc")
#: Slack of the whole-number checks on a broadcast's N_c with exact counts: the ring encoding of whole
#: counts is exact at any f, CKKS releases integer statistics rounded to whole numbers.
COUNT_SLACK = 1e-6


class BroadcastRefused(InputError):
    """A node refuses the round-2 broadcast; ``deviation`` names what was wrong."""

    def __init__(self, message: str, *, deviation: str) -> None:
        super().__init__(message)
        self.deviation = deviation


def round_lengths(C: int, d: int, noise_aware: bool) -> dict[str, int]:
    """Values each node sends in each round: 2C + C d (+ C when noise-aware), then d^2 + 1 (the spread and
    whether it was clipped)."""
    return {"fedcof-1": 2 * C + C * d + (C if noise_aware else 0), "fedcof-2": d * d + 1}


class FedCOFNode:
    """One node of the protocol: its own rows (one per pseudo-client of multi-mean sampling).

    Every check the node makes on the server's broadcast reads the broadcast and the public values given
    here, never the node's own statistics: a server asking again with another broadcast learns nothing
    from a refusal.

    Parameters
    ----------
    counts : array (R, C)
        The node's counts n_kc, one row per (pseudo-)client; R = 0 for a node without data.
    sums : array (R, C, d)
        The matching class sums n_kc mu_kc.
    noise_aware : bool
        Send sum_k 1/n_kc too (``noise_var > 0``).
    max_means : int, optional
        A public bound on any K_c (the number of (pseudo-)client rows of the whole run: on Flower the
        roster's K times its means per node); a broadcast above it is refused.  None: unchecked.
    max_count : float, optional
        A public bound on any N_c (on Flower the roster's K times its records per node); a broadcast
        above it is refused.  None: unchecked.
    max_records : int, optional
        A public bound on the records behind one mean (on Flower the roster's records per node): with exact
        counts a broadcast's N_c above K_c times it is refused.  None: unchecked.
    max_ratio : float, optional
        A public bound on the ratio of the largest class weight to the smallest (on Flower the roster's
        ``weight_ratio``): a broadcast beyond it is refused, so the server can tilt round 2 toward one class
        at most that much.  None: unchecked.
    exact : bool, optional
        Whether the run's counts are exact whole numbers (no DP noise): a broadcast's N_c must then be
        whole and at least K_c, and every class weight is floored at 1 (no honest weight is below it), so
        no broadcast can give a class weight 0.  Deployments say it from their configuration; None (in
        one process) reads it from the counts.
    limit : float, optional
        The largest magnitude of a round-2 value the transport encodes (the ring's or CKKS's, from public
        K and frac-bits): larger values are clipped to it and the extra value says so.  None: no clipping.
    """

    def __init__(
        self,
        counts: np.ndarray,
        sums: np.ndarray,
        *,
        noise_aware: bool = False,
        max_means: int | None = None,
        max_count: float | None = None,
        exact: bool | None = None,
        limit: float | None = None,
        max_records: int | None = None,
        max_ratio: float | None = None,
    ) -> None:
        counts = np.asarray(counts, dtype=np.float64)
        sums = np.asarray(sums, dtype=np.float64)
        if counts.ndim != 2 or sums.ndim != 3 or sums.shape[:2] != counts.shape:
            raise InputError(
                f"a FedCOF node needs counts (R, C) and sums (R, C, d), got {counts.shape} and {sums.shape}"
            )
        self.counts, self.sums = counts, sums
        self.noise_aware = bool(noise_aware)
        for name, bound in (
            ("max_means", max_means),
            ("max_count", max_count),
            ("max_records", max_records),
            ("max_ratio", max_ratio),
        ):
            if bound is not None and not (np.isfinite(bound) and bound >= 1):
                raise InputError(
                    f"a FedCOF node's {name} must be a finite number >= 1 or None, got {bound!r}"
                )
        if limit is not None and not (np.isfinite(limit) and limit > 0):
            raise InputError(f"a FedCOF node's limit must be a finite number > 0 or None, got {limit!r}")
        self.max_means, self.max_count, self.limit = max_means, max_count, limit
        self.max_records, self.max_ratio = max_records, max_ratio
        self.exact = bool(np.all(counts == np.round(counts))) if exact is None else bool(exact)
        self.valid, self.dropped = valid_pairs(counts)  # the drop rule: pairs with n_kc <= 0 are not sent
        self.C, self.d = counts.shape[1], sums.shape[2]

    @classmethod
    def from_stats(
        cls,
        stats,
        method,
        *,
        max_means: int | None = None,
        max_count: float | None = None,
        exact: bool | None = None,
        limit: float | None = None,
        max_records: int | None = None,
        max_ratio: float | None = None,
    ) -> FedCOFNode:
        """The node holding ``stats`` (its ClientStats) for ``method`` (a FedCOF); the bounds as above."""
        return cls(
            stats.counts,
            stats.sums,
            noise_aware=method.params["noise_var"] > 0,
            max_means=max_means,
            max_count=max_count,
            exact=exact,
            limit=limit,
            max_records=max_records,
            max_ratio=max_ratio,
        )

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
        """(N, mu, Kc) from the server's broadcast, or :class:`BroadcastRefused` naming the rule broken.

        Every rule reads the broadcast and the public values of the constructor only.
        """
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
        if self.max_means is not None and np.any(Kc > self.max_means):
            refuse(f"a K_c is above {self.max_means:g}, the public bound on a class's means")
        if self.max_count is not None and np.any(N > self.max_count):
            refuse(f"an N_c is above {self.max_count:g}, the public bound on a class's count")
        if self.exact:
            whole = np.abs(N - np.round(N)) <= COUNT_SLACK * np.maximum(np.abs(N), 1.0)
            if not np.all(whole) or np.any(N < Kc - COUNT_SLACK):
                refuse("with exact counts every N_c is a whole number and at least K_c, one record per mean")
            if self.max_records is not None and np.any(N > np.maximum(Kc, 1.0) * self.max_records):
                refuse(
                    f"an N_c is above K_c times {self.max_records:g}, the public bound on a mean's records"
                )
            w = self.weights(N, Kc)  # each at least 1
            if self.max_ratio is not None and w.max() > self.max_ratio * w.min() * (1 + COUNT_SLACK):
                raise BroadcastRefused(
                    f"its class weights (N_c - 1)/(K_c - 1) differ {w.max() / w.min():.4g}-fold, above "
                    f"{self.max_ratio:g}, the roster's public bound (a larger ratio would tilt the round-2 sum "
                    "toward one class; an operator whose classes' records per node differ more raises it with "
                    "--max-weight-ratio when writing the roster)",
                    deviation="tilted-weights",
                )
        empty = np.flatnonzero((Kc == 0) & ((N != 0) | np.any(mu != 0, axis=1)))
        if empty.size:  # the broadcast alone, nothing of this node's: the class may be named
            c = int(empty[0])
            raise BroadcastRefused(
                f"broadcast class {c} has K_c = 0 (no mean) but a non-zero N_c or mu_c; the node aborts",
                deviation="implausible-broadcast",
            )
        return N, mu, Kc

    def weights(self, N: np.ndarray, Kc: np.ndarray) -> np.ndarray:
        """Round 2's class weights w_c = (N_c - 1)/(K_c - 1), floored at 1 with exact counts; a class of at most
        one mean takes the least weight of the others (1 if there are none).

        An honest class of one mean adds nothing (its mean is mu_c), so neither rule changes an honest sum; the
        floor stops a broadcast zeroing a class (N_c = 1), the second a rare class counting against the
        roster's weight ratio and a claimed K_c = 1 tilting the sum toward a class many nodes hold.
        """
        if not self.exact:
            return spread_weights(N, Kc)
        w = np.maximum(np.maximum(N - 1.0, 0.0) / np.maximum(Kc - 1.0, 1.0), 1.0)
        few = Kc <= 1
        if few.any():
            w[few] = w[~few].min() if (~few).any() else 1.0
        return w

    def round2(self, broadcast: Mapping) -> np.ndarray:
        """This node's d x d spread sum_c w_c n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T from the checked broadcast,
        flattened, then 1.0 if it was clipped to ``limit`` (else 0.0): d^2 + 1 values."""
        N, mu, Kc = self.check_broadcast(broadcast)
        w = self.weights(N, Kc)
        if self.counts.shape[0] == 0:
            return np.zeros(self.d * self.d + 1)
        spread = spread_matrix(self.counts, self.sums, mu, w, self.valid, per_client=True).sum(axis=0).ravel()
        clipped = 0.0
        if self.limit is not None and not np.all(np.abs(spread) <= self.limit):
            # Clipped, never refused: a refusal would tell the server whether this node's spread, under a
            # broadcast it chose, exceeds the bound; the count reaches it only summed over the uploaders.
            spread = np.clip(np.nan_to_num(spread, nan=0.0), -self.limit, self.limit)
            clipped = 1.0
        return np.concatenate([spread, [clipped]])


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
        """{N, mu, Kc}; a class of one mean is sent N_c = 1 (weight 1): its term is zero whatever its weight
        (its one mean is mu_c), and its own count as weight could exceed the nodes' public weight ratio."""
        if self.N is None:
            raise InputError("FedCOF's broadcast needs round 1's sum first (fold_round1)")
        N = np.where(self.Kc == 1, 1.0, self.N)
        return {"N": N, "mu": self.mu.copy(), "Kc": self.Kc.copy()}

    def head(self, spread: np.ndarray, notes: list | None = None) -> LinearHead:
        """Eq. 8 from round 1's sums and round 2's sum (d^2 spread values and the count of clipped nodes)."""
        if self.N is None:
            raise InputError("FedCOF's head needs round 1's sum first (fold_round1)")
        d = self.d
        v = np.asarray(spread, dtype=np.float64).ravel()
        if v.size != d * d + 1:
            raise InputError(f"FedCOF's round-2 sum has {v.size} values, expected d^2 + 1 = {d * d + 1}")
        clipped = int(np.rint(v[-1]))
        if clipped:
            raise InputError(
                f"{clipped} node(s) clipped their FedCOF round-2 spread to the encodable range (the broadcast "
                "weights, or frac-bits, are too large for their statistics); no head is released: lower "
                "frac-bits in the roster"
            )
        G = v[:-1].reshape(d, d)
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
    (K, 2C + C d [+ C]), round 2's (K, d^2 + 1).  The note on dropped pairs counts what the nodes held back.
    """
    rows = node_rows(stats)
    # every node knows the run's number of (pseudo-)client rows: no class has more means than that; the
    # counts are exact unless DP noised them (read here from the whole run: one process, no server to ask)
    exact = bool(np.all(stats.counts == np.round(stats.counts)))
    nodes = [
        FedCOFNode(c, s, noise_aware=method.params["noise_var"] > 0, max_means=stats.num_clients, exact=exact)
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
