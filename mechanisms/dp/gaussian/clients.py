"""The client side of :class:`~mechanisms.dp.gaussian.mechanism.GaussianMechanism`: bounding, sampling, noise shares.

Each client's upload is bounded to ``max_records`` records' worth (client level, and the record-level
``upload`` bound), a trusted aggregator Poisson-samples clients, and under secure aggregation every
client adds its share sigma^2 / (K - t) of the noise, settled from the shares that reached the sum.
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms.dp.ledger import ReleaseEvent
from privfed.errors import ConfigError
from privfed.stats import ClientStats

__all__ = ["ClientBounding"]


class ClientBounding:
    """Per-client bounding, Poisson client sampling and distributed noise shares (a mixin)."""

    def _bound_clients(self, stats: ClientStats) -> ClientStats:
        """Client level: scale each client's statistics to at most ``max_records`` records' worth.

        Client k's counts, sums and second moments are all multiplied by
        min(1, n_max / n_k) before anything is summed, each client kept
        separate (:meth:`ClientStats.scale_clients`), so secure aggregation and
        sampling still see one bounded upload per client whatever its size.
        """
        if stats.is_materialised("counts"):
            n_k = stats.counts.sum(axis=1)
        else:  # the pair layout: no (K, C, d) view
            n_k = np.bincount(stats.pair_client, weights=stats.pair_counts, minlength=stats.num_clients)
        factor = np.minimum(1.0, self.max_records / np.where(n_k > 0, n_k, 1.0))
        if np.all(factor == 1.0):
            return stats
        return stats.scale_clients(factor)

    def _refuse_sampling(self, why: str = "this release path does not subsample clients") -> None:
        if self.sampling_rate < 1:
            raise ConfigError(
                f"sampling_rate={self.sampling_rate} credits amplification by Poisson client sampling, but "
                f"{why}: the noise would not meet the stated guarantee; use sampling_rate=1, or sample "
                "clients with GaussianMechanism(..., level='client', trusted_aggregator=True, "
                "sampling_rate=q) and a sum-only method without secure_agg"
            )

    def _check_sampling(self, name: str, per_client: bool, secure_agg) -> None:
        """Poisson client sampling amplifies only where the server cannot tell who is in the sum."""
        if self.sampling_rate == 1:
            return
        if secure_agg is not None:
            self._refuse_sampling(
                "under secure aggregation the server runs the protocol with the clients "
                "that upload, so it sees who was sampled (amplification does not hold)"
            )
        if per_client or not self.trusted_aggregator:
            self._refuse_sampling(
                f"with local noise (method {name!r}"
                f"{'' if self.trusted_aggregator else ', no trusted aggregator'}) the server "
                "sees each upload and so who was sampled (amplification does not hold)"
            )
        if self.level != "client":
            self._refuse_sampling(
                "client sampling amplifies only client-level guarantees: at record level "
                "the rest of a record's client shows in the sum whether it was sampled, so "
                "only delta is amplified"
            )

    def _poisson_sample(self, stats: ClientStats, rng: np.random.Generator) -> ClientStats:
        """The trusted aggregator keeps each client's upload with probability q, independently.

        The draw comes from fresh OS entropy unless the run is a declared seeded simulation; the kept set
        is neither returned nor stored (only the noisy sum of the kept clients leaves the aggregator).
        """
        gen = rng if self._seeded is not False else np.random.default_rng()  # default_rng(): OS entropy
        self._sampling_seeded = self._sampling_seeded or self._seeded is not False
        keep = gen.random(stats.num_clients) < self.sampling_rate
        self._sampled_pending += 1
        return stats.scale_clients(keep.astype(np.float64))

    def _distributed(self, stats: ClientStats, rng: np.random.Generator) -> ClientStats:
        """Every client adds its share sigma^2 / (K - t); what reaches the sum is settled in :meth:`report`."""
        K = stats.num_clients
        self._check_share_scale(stats.dim, self._share(K))
        out = self._noisy(stats, rng, self.level, share=self._share(K))
        self._pending_secure.append(
            (self.ledger._next_id, K, self._share(K), getattr(self._secagg, "last_run", None))
        )
        self._placements.append("distributed")
        return out

    def node_release(self, stats: ClientStats, num_clients: int, rng: np.random.Generator) -> ClientStats:
        """One node's upload under secure aggregation, as :meth:`before_upload` makes every client's in ``fit``.

        At client level the node's statistics are first bounded to ``max_records`` records' worth; the node
        then adds its share sigma^2 / (K - t) of the noise (K = ``num_clients``; ConfigError when K <= t)
        and the release is booked in this mechanism's ledger.
        """
        if self.bounds_uploads:
            stats = self._bound_clients(stats)
        self._check_share_scale(stats.dim, self._share(int(num_clients)))
        return self._noisy(stats, rng, self.level, share=self._share(int(num_clients)))

    #: Fewest grid steps a discrete-Gaussian noise share's standard deviation may span (see below).
    MIN_SHARE_STEPS = 4.0

    def _check_share_scale(self, dim: int, share: float) -> None:
        """Refuse discrete-Gaussian shares too narrow for their sum to count as one discrete Gaussian.

        With a rounding backend (OpenDP) each share is a discrete Gaussian on the grid, and the sum of K of
        them is not exactly one.  Kairouz, Liu & Steinke ("The distributed discrete Gaussian mechanism",
        ICML 2021) bound the privacy of such a sum by that of the Gaussian of the summed variance plus a term
        in tau = 10 sum_{k<K} exp(-2 pi^2 s^2 k/(k + 1)) <= 10 K exp(-pi^2 s^2) (times sqrt(D) at most), s
        the share's standard deviation in grid steps.  At s >= 4 that is below 1e-60 for any K and D a run
        can have, and the accountant's Gaussian stands; narrower shares are refused.
        """
        grid = getattr(self.backend, "grid", None)
        if grid is None or self.backend.sensitivity_slack(1, "l2") == 0:
            return
        self._ensure(int(dim))
        positive = [s for s in self._sigma.values() if s > 0]
        if not positive:
            return
        steps = min(positive) * math.sqrt(share) / float(grid)
        if steps < self.MIN_SHARE_STEPS:
            raise ConfigError(
                f"each client's discrete-Gaussian noise share spans {steps:.3g} steps of the backend's grid "
                f"({grid:g}), below {self.MIN_SHARE_STEPS:g}: the sum of shares would not count as one "
                "Gaussian; use a finer grid, fewer clients or a smaller epsilon"
            )

    def book_distributed(self, events: list[dict], num_clients: int, protocol) -> None:
        """The server's side of :meth:`node_release`: book the nodes' release once, settled in :meth:`report`.

        ``events`` are one node's release events (every node books the same); ``protocol`` stands for
        the secure-sum protocol: its ``last_run.calls`` (each with ``uploaded``) say whose shares reached
        each sum once it ran, as for ``fit``.
        """
        rid = self.ledger.new_release()
        for e in events:
            self.ledger.record(
                ReleaseEvent(**{**{k: v for k, v in e.items() if k != "release_id"}, "release_id": rid})
            )
        K = int(num_clients)
        self._pending_secure.append((rid, K, self._share(K), getattr(protocol, "last_run", None)))
        self._secagg = protocol
        self.record_placement("distributed")

    def _settle_secure(self) -> None:
        """Rewrite distributed releases with the noise that actually reached the sum.

        Each of the K clients added sigma^2 / (K - t); only the shares of clients whose upload entered
        the sum protect it, so a release with U uploaders carries U / (K - t) sigma^2.
        """
        if not self._pending_secure:
            return
        still = []
        for rid, K, share, run in self._pending_secure:
            current = getattr(self._secagg, "last_run", None)
            calls = getattr(current, "calls", None) if current is not run else None
            if not calls:
                still.append((rid, K, share, run))
                continue
            # The server decodes each part of the uploaders' graph alone (a split SecAgg+ graph): the
            # least-noised sum it holds carries the smallest part's shares.
            present = min(int(c.get("smallest_part", c.get("uploaded", K))) for c in calls)
            parts = max((c.get("parts") or [] for c in calls), key=len, default=[])
            factor = math.sqrt(present * share)
            self.ledger.events = [
                e
                if e.release_id != rid
                else ReleaseEvent(
                    mechanism=e.mechanism,
                    block=e.block,
                    sensitivity=e.sensitivity,
                    scale=e.scale * factor,
                    relation=e.relation,
                    rounds=e.rounds,
                    sampling_rate=e.sampling_rate,
                    release_id=rid,
                )
                for e in self.ledger.events
            ]
            self._settled.append((present, K))
            if len(parts) > 1:
                self._split.append(sorted(int(p) for p in parts))
        self._pending_secure = still

    def _share(self, K: int) -> float:
        """Fraction of sigma^2 each of K clients adds so that K - t of them carry all of it."""
        if K - self.dropout_tolerance < 1:
            raise ConfigError(
                f"dropout_tolerance={self.dropout_tolerance} needs more than that many clients, got K={K}"
            )
        return 1.0 / (K - self.dropout_tolerance)
