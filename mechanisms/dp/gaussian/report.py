"""The guarantee of :class:`~mechanisms.dp.gaussian.mechanism.GaussianMechanism`'s releases, computed from its ledger."""

from __future__ import annotations

import math

from mechanisms.dp.accounting import ledger_epsilon
from mechanisms.dp.ledger import NEIGHBOURING, PrivacyReport, format_up

__all__ = ["GaussianReport"]


class GaussianReport:
    """The mechanism's report (a mixin)."""

    def report(self) -> PrivacyReport:
        """The guarantee of every release recorded so far, computed from the ledger."""
        self._settle_secure()
        events = self.ledger.events
        eps, acc = ledger_epsilon(events, self.delta, self.accountant)
        notes = []
        placement = (
            "none"
            if not self._placements
            else (
                self._placements[0]
                if len(set(self._placements)) == 1
                else "mixed: " + ", ".join(sorted(set(self._placements)))
            )
        )
        # OpenDP draws from the OS CSPRNG whatever the seed: only a seeded numpy backend is replayable.
        sampled = any(e.sampling_rate < 1 for e in events)
        simulation = self._seeded is not False and (not self.backend.secure or self._sampling_seeded)
        if simulation and events:
            notes.append(
                "SIMULATION, NOT A RELEASE: the noise was drawn from a seed (or a caller's Generator) and can be "
                "replayed by anyone who knows it; run with random_state=None (fresh OS entropy) or "
                "backend='opendp' for a release"
            )
        # A protocol whose key material comes from a seed (PairwiseMasking(key_seed=...)): whoever knows the
        # seed removes the masks and sees every client's upload with only its own noise share.
        key_seed = getattr(self._secagg, "key_seed", None)
        if key_seed is not None and events:
            simulation = True
            notes.append(
                f"SIMULATION, NOT A RELEASE: secure aggregation ran with key_seed={key_seed!r}; its masks are "
                "replayable from the seed, so against anyone who knows it each upload is seen with its own "
                "noise share only (the guarantee above does not hold against them); use key_seed=None"
            )
        if "distributed" in self._placements:
            t = self.dropout_tolerance
            notes.append(
                f"noise split across the K clients (each adds sigma^2/(K - {t})); holds while secure aggregation "
                "hides individual uploads; epsilon is computed from the shares that reached the sum; "
                "against the server plus c colluding clients (who know their own "
                "shares) only the other shares count"
            )
            for parts in self._split:
                notes.append(
                    f"the uploaders' graph split into parts of {', '.join(map(str, parts))} clients: the server "
                    f"decodes each part's sum alone, so epsilon is that of the least-noised part ({min(parts)} "
                    "noise shares)"
                )
            for present, K in self._settled:
                if present < K - t:
                    where = "are in the least-noised part's sum" if self._split else "reached the sum"
                    notes.append(
                        f"only {present} of {K} clients' noise shares {where} (more than the tolerated "
                        f"{t} missing): the noise present is {present}/{K - t} of sigma^2 and epsilon is "
                        "recomputed from it"
                    )
        if sampled:
            notes.append(
                f"the trusted aggregator kept each client in the sum independently with probability "
                f"{self.sampling_rate:g} ({'seeded simulation' if self._sampling_seeded else 'OS entropy'}); "
                "which clients, and how many, is not released; epsilon credits amplification by Poisson "
                "subsampling"
            )
        if self.record_bound == "upload":
            notes.append(
                f"each client's upload bounded to max_records={self.max_records} records' worth; sensitivity "
                "= its diameter 2 n_max Delta (valid when the features come from bodies trained on the records)"
            )
        if self.level == "client":
            notes.append(
                f"each client's contribution is bounded to max_records={self.max_records} records' worth"
            )
            notes.append("neighbouring clients: " + NEIGHBOURING["client"])
        if "central" in self._placements:
            notes.append("noise on the aggregate is added by a trusted aggregator (it sees exact statistics)")
        if "local" in self._placements:
            notes.append("each client adds the full noise to its own upload (local DP at record level)")
            if self.trusted_aggregator and "central" not in self._placements:  # asked for, and never what ran
                notes.append(
                    "trusted_aggregator=True was not used: the noise was added to each upload (a method whose "
                    "server needs every client's own statistics, or a release of one client's data), more "
                    "noise than on the sum"
                )
        if self.dropout_tolerance and events and "distributed" not in self._placements:
            notes.append(
                f"dropout_tolerance={self.dropout_tolerance} sizes the noise shares of a secure sum; without "
                "secure aggregation it was not used"
            )
        if self.rounds > 1 and events:
            releases = len({e.release_id for e in events})
            notes.append(
                f"noise calibrated so that {self.rounds} releases together meet the target epsilon="
                f"{self.epsilon:g}; {releases} recorded so far (epsilon above is for those)"
            )
        if self.backend.sensitivity_slack(1, "l2") > 0 and self._base_sens:
            notes.append(
                "sensitivity includes the rounding slack of backend "
                f"{self.backend.name!r} over the coordinates that move (calibrated for)"
            )
        if not self.backend.secure and math.isfinite(self.epsilon):
            notes.append(
                "floating-point noise (backend 'numpy'): not hardened against floating-point attacks, so the "
                "guarantee above does not hold against an attack on the low-order bits of the released values "
                "(use backend 'opendp')"
            )
        if self.calibration == "classic" and self.epsilon > 1:
            notes.append("classic calibration outside its proven range (epsilon > 1)")
        lvl = NEIGHBOURING[self.level]
        if not events:
            guarantee = "nothing released yet"
        elif math.isinf(eps):
            guarantee = (
                f"NO DP GUARANTEE: no noise (epsilon = inf); statistics clipped to {self.clip_bound} "
                f"({self.clipping.norm}) but released exactly"
            )
        else:
            releases = len({e.release_id for e in events})
            guarantee = (
                ("SIMULATION (seeded noise, replayable): " if simulation else "")
                + f"({format_up(eps)}, {format_up(self.delta)})-DP at {self.level} level ({lvl})"
                + f" over {releases} release(s)"
                + f"; Gaussian noise ({placement}) on {', '.join(self.blocks)}"
                + (
                    f"; clients Poisson-sampled at rate {self.sampling_rate:g} (amplification credited)"
                    if sampled
                    else ""
                )
                + f"; accountant: {acc}"
            )
        return PrivacyReport(
            epsilon=eps,
            delta=self.delta,
            level=self.level,
            mechanism=f"gaussian ({self.clipping.norm} clip {self.clip_bound})",
            calibration=self._calibrated_by,
            sigma=dict(self._sigma or {}),
            sensitivity=dict(self._sens or {}),
            rounds=self.rounds,
            sampling_rate=min((e.sampling_rate for e in events), default=self.sampling_rate),
            accountant=acc,
            guarantee=guarantee,
            target_epsilon=self.epsilon,
            num_events=len(events),
            notes=tuple(notes),
            placement=placement,
            simulation=bool(simulation and events),
        )
