"""Where :class:`~mechanisms.dp.gaussian.mechanism.GaussianMechanism` adds its noise, and how it books each release.

The privacy hooks the release plan calls (``before_upload``, ``after_aggregate``) and the streamed
local release (``fold_local_upload``, ``local_upload_stream``: every client noises its own upload,
folded a chunk of clients at a time) draw the noise through the mechanism's backend and record one
release per call in its ledger.  ``split="augmented"`` draws one sigma on FedLog's augmented
statistic [counts, sums] (C, d + 1) in a single draw.
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms.dp.ledger import ReleaseEvent
from privfed.stats import ClientStats

__all__ = ["GaussianNoise"]


class GaussianNoise:
    """The noise hooks and the streamed local release of the mechanism (a mixin)."""

    def _noisy(
        self,
        stats: ClientStats,
        rng: np.random.Generator,
        relation: str,
        *,
        share: float = 1.0,
        copies: int = 1,
        sampling_rate: float = 1.0,
    ) -> ClientStats:
        """Add noise to every row of every block and record one release in the ledger.

        Each row gets N(0, share * sigma_b^2); ``share = 1/K`` when K clients
        split the noise of one sum (the ledger records the sigma_b the sum
        carries).  ``copies`` independent releases are recorded as that many
        rounds.  ``sampling_rate`` is the Poisson rate this release was actually sampled at (the ledger
        credits amplification only for sampling that happened).
        """
        self._ensure(stats.dim)
        if (
            self.bounds_uploads
            and self._num_classes != stats.num_classes
            and self.backend.sensitivity_slack(1, "l2") > 0
        ):
            self._num_classes = stats.num_classes
            self._resolve(stats.dim)
        rid = self.ledger.new_release()
        if self._weights == "augmented":
            return self._noisy_augmented(stats, rng, relation, share, copies, sampling_rate, rid)
        out: dict[str, np.ndarray] = {}
        for block in self.blocks:
            arr = getattr(stats, block)
            if arr is None:
                continue
            s = self._sigma[block]
            out[block] = self._add_noise(arr, block, s * math.sqrt(share), rng)
            # The sensitivity includes the backend's rounding slack (calibrated for in _resolve).
            # Each call is ONE release; ``rounds`` is what sigma was calibrated for, not what happened.
            self.ledger.record(
                ReleaseEvent(
                    mechanism="gaussian" if s > 0 else "none",
                    block=block,
                    sensitivity=self._sens[block],
                    scale=s,
                    relation=relation,
                    rounds=copies,
                    sampling_rate=sampling_rate,
                    release_id=rid,
                )
            )
        return stats.with_arrays(**out)

    def _noisy_augmented(self, stats, rng, relation, share, copies, sampling_rate, rid) -> ClientStats:
        """One draw on FedLog's augmented statistic [counts, sums] (K, C, d + 1), one event of its sensitivity."""
        s = self._sigma["sums"]
        A = np.concatenate([stats.counts[..., None], stats.sums], axis=-1)
        A = self._add_noise(A, "augmented", s * math.sqrt(share), rng)
        self.ledger.record(
            ReleaseEvent(
                mechanism="gaussian" if s > 0 else "none",
                block="augmented",
                sensitivity=self._joint_sens,
                scale=s,
                relation=relation,
                rounds=copies,
                sampling_rate=sampling_rate,
                release_id=rid,
            )
        )
        return stats.with_arrays(counts=A[..., 0].copy(), sums=A[..., 1:].copy())

    def _add_noise(self, arr: np.ndarray, block: str, sigma: float, rng: np.random.Generator) -> np.ndarray:
        if sigma == 0:
            return np.array(arr, dtype=np.float64)
        if block != "second":
            return self.backend.add_gaussian(arr, sigma, rng)
        # Symmetric matrices: noise the upper triangle (with diagonal) and mirror it.
        d = arr.shape[-1]
        iu = np.triu_indices(d)
        upper = self.backend.add_gaussian(arr[..., iu[0], iu[1]], sigma, rng)
        out = np.empty(arr.shape, dtype=np.float64)
        out[..., iu[0], iu[1]] = upper
        out[..., iu[1], iu[0]] = upper
        return out

    def before_upload(self, stats: ClientStats, method, rng: np.random.Generator) -> ClientStats:
        """Client side: bound (client level) and noise each upload where clients add the noise."""
        per_client = bool(getattr(method, "per_client", False))
        if self.record_bound == "upload":
            stats = self._bound_clients(stats)
        if self.level == "client":
            stats = self._bound_clients(stats)
            if self._secure:
                return self._distributed(stats, rng)
            if self.sampling_rate < 1 and self.trusted_aggregator and not per_client:
                return self._poisson_sample(stats, rng)  # the aggregator's sampling, before the sum
            return stats
        if self._secure:
            return self._distributed(stats, rng)
        if self.trusted_aggregator and not per_client:
            return stats
        self._placements.append("local")
        return self._noisy(stats, rng, "record")

    def after_aggregate(self, total: ClientStats, method, rng: np.random.Generator) -> ClientStats:
        """Server side: noise on the sum when a trusted aggregator adds it."""
        if self.trusted_aggregator and not self._secure:
            q = 1.0
            if self.sampling_rate < 1:
                if not self._sampled_pending:
                    self._refuse_sampling("no client sampling preceded this sum")
                self._sampled_pending -= 1
                q = self.sampling_rate
            self._placements.append("central")
            return self._noisy(total, rng, self.level, sampling_rate=q)
        return total

    def streams_upload(self, method) -> bool:
        """Whether each client noises its own upload and the server needs only their sum.

        Record level without a trusted aggregator or secure aggregation, and a
        method that aggregates sums (``per_client = False``): the uploads can be
        noised and folded a chunk of clients at a time
        (:meth:`fold_local_upload`), memory independent of K.
        """
        return (
            self.level == "record"
            and self.record_bound == "theorem"
            and self._weights != "augmented"
            and not self._secure
            and not self.trusted_aggregator
            and not bool(getattr(method, "per_client", False))
        )

    def streams_pairs(self, method) -> bool:
        """Whether each client noises its own upload and a per-client method folds the noisy uploads.

        Record level without a trusted aggregator or secure aggregation, and a
        per-client method with a streamed server (FedCOF's ``aggregate_stream``):
        the noisy counts of every client come first (K C values), then the
        noisy sums a chunk of clients at a time (:meth:`local_upload_stream`).
        """
        return (
            self.level == "record"
            and self.record_bound == "theorem"
            and self._weights != "augmented"
            and not self._secure
            and not self.trusted_aggregator
            and bool(getattr(method, "per_client", False))
            and callable(getattr(method, "aggregate_stream", None))
        )

    def local_upload_stream(
        self, stats: ClientStats, rng: np.random.Generator, *, chunk_bytes: int | None = None
    ):
        """(counts, sum chunks): the clients' noisy uploads, for :meth:`streams_pairs` methods.

        One release, as :meth:`local_noise_blocks` (``order=("counts", "sums")``):
        the (K, C) noisy counts of every client, then an iterator of
        ``(k0, k1, sums)`` with the noisy (k1 - k0, C, d) sums of clients
        k0..k1-1, each drawn when the server asks for it.
        """
        stream = self.local_noise_blocks(stats, rng, chunk_bytes=chunk_bytes, order=("counts", "sums"))
        parts, first = [], None  # blocks always hold "counts" and "sums": every count chunk comes first
        for item in stream:
            if item[0] != "counts":
                first = item
                break
            parts.append(item[3])
        counts = np.concatenate(parts)

        def sums():
            yield first[1:]
            for _, k0, k1, values in stream:
                yield k0, k1, values

        return counts, sums()

    def local_noise_blocks(
        self,
        stats: ClientStats,
        rng: np.random.Generator,
        *,
        chunk_bytes: int | None = None,
        order: tuple[str, ...] | None = None,
    ):
        """The clients' noisy uploads (record level, local noise), one block and chunk of clients at a time.

        Every client noises every class it could hold (zeros included) and its
        second moment when released: its upload is C (d + 1) (+ d^2) values
        whatever it holds.  The whole stream is the ONE release
        :meth:`before_upload` makes, booked in the ledger when the stream
        starts, with the same noise drawn in the same order: block by block
        (``sums``, ``counts``, ``second``), clients in order within a block,
        so the values equal ``before_upload``'s bit for bit whatever
        ``chunk_bytes`` is (a chunk holds at most that many bytes of one
        block's dense uploads, at least one client; ``None``: all at once).
        ``order`` draws the blocks in another order (the same distribution,
        other values): a server that needs every count before the sums.

        Yields
        ------
        (block, k0, k1, values)
            ``values`` are the noisy ``block`` uploads of clients ``k0..k1-1``.
        """
        self._ensure(stats.dim)
        K, C, d = stats.num_clients, stats.num_classes, stats.dim
        booked = [b for b in self.blocks if b in stats.available]
        blocks = [b for b in (order or self.blocks) if b in booked]
        rid = self.ledger.new_release()
        for block in booked:  # the ledger lists the blocks as before_upload does, whatever the draw order
            s = self._sigma[block]
            self.ledger.record(
                ReleaseEvent(
                    mechanism="gaussian" if s > 0 else "none",
                    block=block,
                    sensitivity=self._sens[block],
                    scale=s,
                    relation="record",
                    rounds=1,
                    sampling_rate=self.sampling_rate,
                    release_id=rid,
                )
            )
        self._placements.append("local")
        per_client = {"sums": C * d, "counts": C, "second": d * d}
        for block in blocks:
            step = K if chunk_bytes is None else max(1, int(chunk_bytes) // (8 * per_client[block]))
            for k0 in range(0, K, step):
                k1 = min(K, k0 + step)
                values = _client_block(stats, block, k0, k1)
                yield block, k0, k1, self._add_noise(values, block, self._sigma[block], rng)

    def fold_local_upload(
        self,
        stats: ClientStats,
        method,
        rng: np.random.Generator,
        *,
        chunk_bytes: int | None = None,
        observe=None,
    ) -> ClientStats:
        """The sum of the clients' noisy uploads, folded chunk by chunk (:meth:`local_noise_blocks`).

        Memory O(chunk + C d + d^2), independent of K; no (K, C, d) stack.
        Returns the aggregate (K = 1) that summing :meth:`before_upload`'s
        output gives (same noise values, summed in the same client order).
        ``observe(block, k0, k1, values)``, if given, sees every chunk of
        uploads as the server receives it (an audit recording them).
        """
        C, d = stats.num_classes, stats.dim
        total = {"sums": np.zeros((C, d)), "counts": np.zeros(C), "second": np.zeros((d, d))}
        kept = 0
        for block, k0, k1, values in self.local_noise_blocks(stats, rng, chunk_bytes=chunk_bytes):
            if observe is not None:
                observe(block, k0, k1, values)
            for row in values:  # clients in order: the summation order of one (K, ...) reduction
                total[block] += row
            if block == "counts":
                kept += int(np.count_nonzero(values > 0))
        second = total["second"][None] if "second" in stats.available and "second" in self.blocks else None
        out = ClientStats(counts=total["counts"][None], sums=total["sums"][None], second=second)
        object.__setattr__(out, "folded_pairs", kept)
        return out


def _client_block(stats: ClientStats, block: str, k0: int, k1: int) -> np.ndarray:
    """Dense ``block`` of clients k0..k1-1, built from what ``stats`` stores (no other block copied)."""
    if (k0, k1) == (0, stats.num_clients) or stats.is_materialised(block):
        return getattr(stats, block)[k0:k1]
    if block == "second":
        return stats.clients(np.arange(k0, k1)).second
    pc = stats.pair_client  # sorted by client
    a, b = np.searchsorted(pc, [k0, k1])
    if block == "counts":
        out = np.zeros((k1 - k0, stats.num_classes))
        out[pc[a:b] - k0, stats.pair_class[a:b]] = stats.pair_counts[a:b]
    else:
        out = np.zeros((k1 - k0, stats.num_classes, stats.dim))
        out[pc[a:b] - k0, stats.pair_class[a:b]] = stats.pair_sums[a:b]
    return out
