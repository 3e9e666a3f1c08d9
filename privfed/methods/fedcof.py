"""FedCOF: classifier from covariances estimated with client class means only.

Goswami et al., "FedCOF: Federated learning with covariances from first-order
statistics" (the FedCOF paper in ``/papers``), Alg. 1.  Each client shares the
class means mu_kc and counts n_kc (here as the additive sums s_kc = n_kc mu_kc
and counts).  Per class c with K_c >= 2 means the server estimates

    mu_c    = sum_k n_kc mu_kc / N_c                                        (Eq. 5)
    Sigma_c = 1/(K_c - 1) sum_k n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T + gamma I  (Eq. 6)

which without shrinkage (gamma = 0) is unbiased when class-c features are iid
across clients (Proposition 1).  The paper writes K where K_c is meant.  The
classifier uses only within-class covariances (Prop. 2, Eq. 8):

    G_hat = sum_c (N_c - 1) Sigma_c + N mu_g mu_g^T,   B = [N_c mu_c],   W = G_hat^-1 B,

columns normalised.  A class seen by one client has no spread to estimate
from and gets gamma I alone (as the official code); the head's notes name it.

Multi-mean sampling (App. E): with ``means_per_client = M > 1`` each client
splits each class's samples into g = min(M, floor(n/2)) disjoint random
subsets of near-equal size (so each has at least 2 samples; a class with one
sample gives its one mean) and shares each subset's mean as a pseudo-client.

Secure aggregation (App. I.2): :meth:`FedCOF.secure_aggregate` runs the
two-round protocol of :mod:`privfed.methods.fedcof_protocol` - round 1
secure-sums one vector of counts, sums and presence indicators [n_kc > 0],
round 2 secure-sums each client's d x d spread matrix
sum_c (N_c - 1)/(K_c - 1) n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T - and gives the
same head as :meth:`FedCOF.aggregate`; the Flower apps run the same node and
server over messages.

Noisy statistics: pairs with n_kc <= 0 are dropped (the rule of App. I.1,
Eq. 23: a clipped class is not sent), fractional counts are used as they
are, classes with N_c < 1 get weight (N_c - 1) clamped to 0, and an
indefinite G_hat is projected to the PSD cone.  With ``noise_var`` (the
per-coordinate variance of independent zero-mean noise on each shared class
sum, counts taken as exact) the known bias of the spread is subtracted
(:func:`noise_bias`) before the projection - the noise-aware estimator of
methods.md section 4, beyond the paper.
Communication: M d floats (App. H), the same as FedNCM.
"""

from __future__ import annotations

import numpy as np

from privfed._linalg import (
    MAX_REGULARISER,
    SOLVERS,
    check_choice,
    check_flag,
    check_real,
    normalise_rows,
    solve_head,
)
from privfed._validation import scratch_rows
from privfed.errors import ConfigError
from privfed.head import LinearHead
from privfed.methods import register
from privfed.methods.base import Method, SecureSum
from privfed.methods.fedcof_estimator import (
    SPREAD_TILE_BYTES,
    FedCOFEstimate,
    bias_from_sums,
    class_covariances,
    class_means,
    class_totals,
    multi_mean_ids,
    noise_bias,
    pair_spread,
    spread_and_sums,
    spread_matrix,
    spread_weights,
    valid_pairs,
    within_matrix,
)
from privfed.methods.fedcof_protocol import run_in_process
from privfed.notes import Note
from privfed.stats import ClientStats, GramSum, sum_rows_by

__all__ = [
    "FedCOF",
    "FedCOFEstimate",
    "class_covariances",
    "class_means",
    "class_totals",
    "multi_mean_ids",
    "noise_bias",
    "pair_spread",
    "spread_and_sums",
    "spread_matrix",
    "spread_weights",
    "valid_pairs",
    "within_matrix",
]


#: Bytes of the row buffer :meth:`FedCOF.estimate_pairs` fills (centred and scaled) before it adds the
#: rows to the spread (:class:`~privfed.stats.algebra.GramSum`, whose blocks of a few hundred rows cost
#: what one product costs): at most the server's tile (:data:`~privfed.methods.fedcof_estimator.SPREAD_TILE_BYTES`,
#: cache-sized, so the rows are written and read back in cache: 409 rows at iNat-120K's d = 1,280) ...
_STREAM_BUFFER_BYTES = SPREAD_TILE_BYTES
#: ... and at most this share of the M x d pair sums it stands for (they are never held), so that a
#: small fit keeps within the same allowance above its input as a large one (368 rows at d = 256).
_STREAM_SHARE = 1 / 32


#: Rows centred at once on their class references in :meth:`FedCOF.estimate_pairs` (64 KiB).
_CENTRE_TILE_BYTES = 64 * 2**10


@register
class FedCOF(Method):
    """FedCOF head from client class means and counts (Eq. 6 and 8).

    Parameters
    ----------
    gamma : float, default 1.0
        Shrinkage added to every class covariance (paper: 1 for SqueezeNet and
        ViT-B/16, 0.1 for MobileNetV2).
    means_per_client : int, default 1
        M of multi-mean sampling (App. E); 1 is plain FedCOF.
    solver : {"pinv", "solve"}, default "pinv"
        How G_hat is inverted (the official code uses ``pinv``).
    normalise : bool, default True
        Unit-norm class weight vectors.
    noise_var : float, default 0.0
        Known per-coordinate variance of independent noise on each shared class
        sum; its bias is subtracted from Eq. 6 (noise-aware estimator).
    """

    name = "fedcof"
    paper = "Goswami et al., FedCOF: covariances from first-order statistics (Alg. 1, Eq. 6, 8; App. E, I.2)"
    requires = frozenset({"counts", "sums"})
    per_client = True
    secure_protocol = "fedcof-two-round"
    #: d x d matrices its server holds at once (the spread of Eq. 6, G_hat, and the solver's two), which
    #: privfed.fit checks against the memory available before any work
    server_squares = 4
    defaults: dict = {
        "gamma": 1.0,
        "means_per_client": 1,
        "solver": "pinv",
        "normalise": True,
        "noise_var": 0.0,
    }

    def _validate_params(self) -> None:
        p = self.params
        p["gamma"] = check_real(self.name, "gamma", p["gamma"], low=0.0, high=MAX_REGULARISER)
        m = p["means_per_client"]
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ConfigError(f"method {self.name!r}: means_per_client must be an integer >= 1, got {m!r}")
        p["means_per_client"] = int(m)
        check_choice(self.name, "solver", p["solver"], SOLVERS)
        p["normalise"] = check_flag(self.name, "normalise", p["normalise"])
        p["noise_var"] = check_real(self.name, "noise_var", p["noise_var"], low=0.0, high=MAX_REGULARISER)

    def regrouping(self) -> str | None:
        m = self.params["means_per_client"]
        if m == 1:
            return None
        return (
            f"means_per_client={m} cuts each class into min(M, n // 2) chunks, so one record changes how the "
            "other records are split (and how many rows a client uploads); use means_per_client=1"
        )

    # -- client side -------------------------------------------------------------
    def row_groups(self, labels, clients, *, num_classes, num_clients, rng):
        """Pseudo-clients of multi-mean sampling (:func:`multi_mean_ids`) when ``means_per_client > 1``."""
        M = self.params["means_per_client"]
        if M == 1:
            return super().row_groups(
                labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng
            )
        labels = np.asarray(labels, dtype=np.int64)
        clients = np.asarray(clients, dtype=np.int64)
        return multi_mean_ids(labels, clients, num_classes, num_clients, M, rng)

    # -- server side -------------------------------------------------------------
    def estimate(self, stats: ClientStats) -> FedCOFEstimate:
        """Eq. 5, 6 and 8 from per-client (or pseudo-client) statistics."""
        self._check_stats(stats)
        notes: list[str] = []
        C = stats.num_classes
        n_all = stats.pair_counts
        self._refuse_non_finite("class counts", n_all)  # a NaN count is no "count <= 0" for the drop rule
        valid = self._drop_rule(n_all, notes)
        _, pk_all, _, sums, sum_rows = stats._pair_block()  # never copied: rows are picked by index
        if sum_rows is None:
            rows = None if valid.all() else np.flatnonzero(valid)
            pk, n = (pk_all, n_all) if rows is None else (pk_all[rows], n_all[rows])
            pk_s, n_s, rows_s = pk, n, rows
            count_only = np.zeros(C)
        else:  # count-only cells (zero sums, no stored row): their mean is 0, their deviation -mu_c
            has = sum_rows >= 0
            pk, n = pk_all[valid], n_all[valid]
            summed = valid & has
            pk_s, n_s, rows_s = pk_all[summed], n_all[summed], sum_rows[summed]
            zero = valid & ~has
            count_only = np.bincount(pk_all[zero], weights=n_all[zero], minlength=C)
        N = np.bincount(pk, weights=n, minlength=C)
        Kc = np.bincount(pk, minlength=C)
        w = spread_weights(N, Kc)
        # One X^T X over the rows s_p sqrt(w_c / n_p) less a C-row correction (count-only cells, whose
        # sums are zero, enter through N_c alone); rows centred on mu_c first only when that
        # difference would lose accuracy (class means long against the spread).
        # S_c over these pairs: the class sums the server folded as the pairs arrived, over the pairs with a
        # count > 0 (valid_pairs' rule), when it kept them; else summed here
        S, spread = spread_and_sums(pk_s, n_s, sums, w, N, rows=rows_s, class_sums=stats._stored_class_sums())
        mu = class_means(N, S)
        if spread is None:
            spread = pair_spread(pk_s, n_s, sums, mu, w, rows=rows_s)
            if count_only.any():  # sum over those cells of w_c n (0 - mu_c)(0 - mu_c)^T: one C-row product
                Z = mu * np.sqrt(np.where(w > 0, w, 0.0) * count_only)[:, None]  # w_c <= 0: skipped
                spread += Z.T @ Z
        inv_sum = np.bincount(pk, weights=1.0 / n, minlength=C) if self.params["noise_var"] > 0 else None
        return self._estimate(N, S, mu, Kc, spread, inv_sum, notes)

    @staticmethod
    def _drop_rule(counts: np.ndarray, notes: list[str]) -> np.ndarray:
        """Which pairs take part (:func:`valid_pairs`), with the note on those dropped."""
        valid, dropped = valid_pairs(counts)
        if dropped:
            notes.append(
                Note(
                    f"{dropped} (client, class) pair(s) with count <= 0 were dropped (App. I.1 drop rule)",
                    "dropped_pairs",
                    dropped,
                )
            )
        return valid

    def _estimate(self, N, S, mu, Kc, spread, inv_sum, notes) -> FedCOFEstimate:
        """Eq. 8 from the class totals and means, the spread and (noise-aware) sum_k 1/n_kc per class."""
        self._refuse_non_finite("class counts, sums or their spread", N, S, spread)
        C = N.shape[0]
        if self.params["noise_var"] > 0:
            beta = bias_from_sums(inv_sum, N, Kc, self.params["noise_var"])
        else:
            beta = np.zeros(C)
        notes += self.class_notes(N, Kc)
        if self.params["noise_var"] > 0:
            mean_bias = float(beta[Kc >= 2].mean()) if (Kc >= 2).any() else 0.0
            notes.append(
                "noise-aware: subtracted the noise bias sigma^2/(K_c-1)(sum_k 1/n_kc - K_c/N_c) from each "
                f"class covariance (sigma^2={self.params['noise_var']:g}, mean bias {mean_bias:.3g})"
            )
        G_hat = within_matrix(N, S, Kc, spread, self.params["gamma"], beta)
        return FedCOFEstimate(N=N, mu=mu, Kc=Kc, G_hat=G_hat, notes=notes, spread=spread)

    def aggregate_stream(self, counts: np.ndarray, sum_chunks) -> LinearHead:
        """The head from noisy uploads that arrive a chunk of clients at a time (:meth:`estimate_stream`)."""
        return self.finish(self.estimate_stream(counts, sum_chunks))

    def estimate_stream(self, counts: np.ndarray, sum_chunks) -> FedCOFEstimate:
        """Eq. 5, 6 and 8 from uploads that arrive a chunk of clients at a time (local noise, streamed).

        ``counts`` (K, C): every client's (noisy) count of every class, known
        first; ``sum_chunks`` yields ``(k0, k1, sums)`` with the (noisy) sums
        (k1 - k0, C, d) of clients k0..k1-1, in order.  Each chunk is folded and
        dropped: memory O(K C + chunk + C d + d^2), never (K, C, d).  The drop
        rule, N_c, K_c and w_c come from the counts alone, so each valid row
        enters the spread as it arrives, centred on a per-class reference r_c
        (the class's first valid mean): sum_p w_c n_p (m_p - r_c)(m_p - r_c)^T -
        sum_c w_c N_c (mu_c - r_c)(mu_c - r_c)^T, which is Eq. 6's sum of
        w_c n_p (m_p - mu_c)(m_p - mu_c)^T (the tests hold it to the per-pair
        estimator at 1e-9, with class means far longer than the spread too).
        """
        n_all = np.asarray(counts, dtype=np.float64)
        if n_all.ndim != 2 or n_all.shape[0] == 0:
            raise ValueError(f"counts must have shape (K >= 1, C), got {n_all.shape}")
        C = n_all.shape[1]
        notes: list[str] = []
        valid = self._drop_rule(n_all, notes)
        n_valid = np.where(valid, n_all, 0.0)
        N = n_valid.sum(axis=0)
        Kc = valid.sum(axis=0)
        w = np.maximum(spread_weights(N, Kc), 0.0)
        S = gram = ref = None
        seen = np.zeros(C, dtype=bool)
        done = 0
        for k0, k1, sums in sum_chunks:
            if k0 != done:
                raise ValueError(f"sum chunks must arrive in client order: expected client {done}, got {k0}")
            done = k1
            sums = np.asarray(sums, dtype=np.float64)
            if gram is None:
                d = sums.shape[2]
                S, gram, ref = np.zeros((C, d)), GramSum(d), np.zeros((C, d))
            kk, cc = np.nonzero(valid[k0:k1])
            rows = sums[kk, cc]  # the valid rows of this chunk
            n = n_all[k0:k1][kk, cc]
            S += sum_rows_by(rows, cc, C)
            # Each class is centred on the mean of its first valid row (a reference r_c fixed before
            # that row is folded), so the spread is accumulated as sum w n (m - r)(m - r)^T and
            # corrected by sum_c w_c N_c (mu_c - r_c)(mu_c - r_c)^T at the end: no cancellation when
            # class means are long against the spread.
            new, first = np.unique(cc, return_index=True)
            fresh = ~seen[new]
            ref[new[fresh]] = rows[first[fresh]] / n[first[fresh], None]
            seen[new[fresh]] = True
            rows -= n[:, None] * ref[cc]
            rows *= np.sqrt(w[cc] / n)[:, None]
            gram.add(rows)
        if done != n_all.shape[0]:
            raise ValueError(f"sum chunks covered clients 0..{done - 1} of {n_all.shape[0]}")
        mu = class_means(N, S)
        gram.add((mu - ref) * np.sqrt(w * N)[:, None], sign=-1.0)
        spread = gram.result()
        inv_sum = (
            np.where(valid, 1.0 / np.where(valid, n_all, 1.0), 0.0).sum(axis=0)
            if self.params["noise_var"] > 0
            else None
        )
        return self._estimate(N, S, mu, Kc, spread, inv_sum, notes)

    def aggregate(self, stats: ClientStats) -> LinearHead:
        est = self.estimate(stats)
        return self.finish(est)

    def aggregate_pairs(
        self, pair_class: np.ndarray, pair_counts: np.ndarray, blocks, num_classes: int
    ) -> LinearHead:
        """The head from pair sums that arrive a block of whole pairs at a time (:meth:`estimate_pairs`)."""
        return self.finish(self.estimate_pairs(pair_class, pair_counts, blocks, num_classes))

    def estimate_pairs(
        self, pair_class: np.ndarray, pair_counts: np.ndarray, blocks, num_classes: int
    ) -> FedCOFEstimate:
        """Eq. 5, 6 and 8 in one pass over the pair sums, which are never all held (``privfed.fit``'s path).

        ``pair_class`` / ``pair_counts`` (M,): the class and count of every
        (pseudo-)client-class pair, known before any sum; ``blocks`` yields
        ``(p0, sums)`` with the sums of pairs p0..p0 + len(sums) - 1, in
        order.  Each row is centred on its class's reference r_c (the mean of
        the class's first pair, as :meth:`estimate_stream`), scaled by
        sqrt(w_c n_p) into one cache-sized row buffer (:data:`_STREAM_BUFFER_BYTES`, :data:`_STREAM_SHARE`), and the
        buffer enters the spread (:class:`~privfed.stats.algebra.GramSum`) when full; the end subtracts
        sum_c w_c N_c (mu_c - r_c)(mu_c - r_c)^T.  Memory O(buffer + C d + d^2)
        beside the blocks, never M x d; cost one X^T X over the rows with
        w_c > 0, one C-row product and one pass over the sums.
        """
        n_all = np.asarray(pair_counts, dtype=np.float64)
        pc_all = np.asarray(pair_class, dtype=np.int64)
        C = int(num_classes)
        notes: list[str] = []
        valid = self._drop_rule(n_all, notes)
        N = np.bincount(pc_all[valid], weights=n_all[valid], minlength=C)
        Kc = np.bincount(pc_all[valid], minlength=C)
        w = np.maximum(spread_weights(N, Kc), 0.0)
        root = np.where(
            valid, np.sqrt(w[pc_all] * np.where(valid, n_all, 0.0)), 0.0
        )  # sqrt(w_c n_p), 0: skipped
        S = gram = ref = buf = U = None
        seen = np.zeros(C, dtype=bool)
        fill = done = 0
        for p0, sums in blocks:
            if p0 != done:
                raise ValueError(f"pair blocks must arrive in order: expected pair {done}, got {p0}")
            m = sums.shape[0]
            done = p0 + m
            if gram is None:
                d = sums.shape[1]
                S, gram, ref = np.zeros((C, d)), GramSum(d), np.zeros((C, d))
                rows_needed = max(1, int(np.count_nonzero(root > 0)))
                cap = scratch_rows(8 * d * n_all.size, 8 * d, _STREAM_BUFFER_BYTES, _STREAM_SHARE)
                buf = np.empty((min(cap, rows_needed), d))
            pc, n, r = pc_all[p0:done], n_all[p0:done], root[p0:done]
            ok = valid[p0:done]
            if not ok.all():
                sums, pc, n, r = sums[ok], pc[ok], n[ok], r[ok]
            classes, first, inv = np.unique(pc, return_index=True, return_inverse=True)
            S[classes] += sum_rows_by(sums, inv.reshape(-1), classes.size)
            fresh = ~seen[classes]
            ref[classes[fresh]] = sums[first[fresh]] / n[first[fresh], None]
            seen[classes[fresh]] = True
            use = np.flatnonzero(r > 0)
            for a in range(0, use.size, buf.shape[0]):
                rows = use[a : a + buf.shape[0]]
                if fill + rows.size > buf.shape[0]:
                    gram.add(buf[:fill])
                    fill = 0
                k = rows.size
                X = buf[fill : fill + k]
                whole = k == m  # every row of the block: no gather
                pcs, rs = (pc, r) if whole else (pc[rows], r[rows])
                np.multiply(sums if whole else sums[rows], (rs / (n if whole else n[rows]))[:, None], out=X)
                if U is None:
                    U = np.empty((max(1, min(buf.shape[0], _CENTRE_TILE_BYTES // (8 * d))), d))
                for t in range(0, k, U.shape[0]):  # X -= r_p ref_c, a cache-sized tile at a time
                    e = min(t + U.shape[0], k)
                    V = U[: e - t]
                    np.take(ref, pcs[t:e], axis=0, out=V, mode="clip")
                    V *= rs[t:e, None]
                    X[t:e] -= V
                fill += k
        if done != n_all.shape[0]:
            raise ValueError(f"pair blocks covered pairs 0..{done - 1} of {n_all.shape[0]}")
        if gram is None:
            raise ValueError("no pair sums arrived")
        gram.add(buf[:fill])
        del buf, U  # before the C x d arrays below
        mu = class_means(N, S)
        Z = np.subtract(mu, ref, out=ref)  # (mu_c - r_c) sqrt(w_c N_c), in the references' array
        Z *= np.sqrt(w * N)[:, None]
        gram.add(Z, sign=-1.0)
        spread = gram.result()
        del ref, Z
        inv_sum = (
            np.bincount(pc_all[valid], weights=1.0 / n_all[valid], minlength=C)
            if self.params["noise_var"] > 0
            else None
        )
        return self._estimate(N, S, mu, Kc, spread, inv_sum, notes)

    def secure_aggregate(self, stats: ClientStats, secure_sum: SecureSum) -> LinearHead:
        """Two-round secure protocol of App. I.2 (same head as :meth:`aggregate`), every node in this process.

        The node and server of :mod:`privfed.methods.fedcof_protocol` (the
        code the Flower apps run): round 1 secure-sums one vector per real
        client (pseudo-client rows are combined by their owner first) of
        counts, class sums and presence counts [n_kc > 0] (plus sum_k 1/n_kc
        when ``noise_var > 0``); the server derives N_c, mu_c, K_c and
        broadcasts them; round 2 secure-sums each client's d x d matrix
        sum_c (N_c - 1)/(K_c - 1) n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T; the
        server adds the shrinkage and N mu_g mu_g^T terms.
        """
        self._check_stats(stats)
        return run_in_process(self, stats, secure_sum)

    def class_notes(self, N: np.ndarray, Kc: np.ndarray) -> list[str]:
        """The head's notes on classes with no data left, one mean (gamma I alone) or N_c < 1."""
        notes = []
        absent = np.flatnonzero(N <= 0)
        if absent.size:
            notes.append(f"class(es) {absent.tolist()} have no data left; their weight row is zero")
        single = np.flatnonzero((Kc == 1) & (N > 0))
        if single.size:
            notes.append(
                f"class(es) {single.tolist()} are seen by one client (one mean): no spread to estimate, "
                f"their covariance is gamma I = {self.params['gamma']:g} I"
            )
        small = np.flatnonzero((N > 0) & (N < 1))
        if small.size:
            notes.append(
                f"class(es) {small.tolist()} have N_c < 1 after noise; their weight N_c - 1 is clamped to 0"
            )
        return notes

    def finish(self, est: FedCOFEstimate, **extras) -> LinearHead:
        """The head W = G_hat^-1 B (columns normalised) from an estimate; ``extras`` go to the head."""
        notes = list(est.notes)
        B = (est.mu * est.N[:, None]).T
        W = solve_head(est.G_hat, B, solver=self.params["solver"], name="G_hat", notes=notes).T
        if self.params["normalise"]:
            W = normalise_rows(W)
        return self._head(W, np.zeros(W.shape[0]), notes, N=est.N, Kc=est.Kc, **extras)

    @classmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        return M * d
