"""The guarantee of multi-round FedLog's releases, composed from the rounds' traces.

Every round of :func:`privfed.rounds.run_rounds` is one run of a
:class:`~privfed.release.ReleasePlan` whose :class:`~privfed.release.ReleaseTrace` records the
privacy events it booked (the noise each release really carried: with distributed noise, only the
shares that reached the sum) and where its randomness came from.  :func:`rounds_report` composes
those events with the shared accountant (:func:`mechanisms.dp.accounting.ledger_epsilon`, GDP exact,
PLD as a cross-check) into a :class:`RoundsPrivacyReport`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from mechanisms.dp.ledger import ReleaseEvent, format_up

__all__ = ["PLD_MAX_MU", "EventTrace", "RoundsPrivacyReport", "rounds_report", "trace_events"]

#: Largest composed GDP mu for which the report cross-checks epsilon with a PLD accountant.
PLD_MAX_MU = 8.0


@dataclass(frozen=True)
class RoundsPrivacyReport:
    """What R releases of the FedLog statistic guarantee, computed from the rounds' traces.

    ``per_round_epsilon`` is the eps each release is calibrated for (what the
    paper states per round); ``per_round_epsilon_exact`` what one release
    alone satisfies exactly (the classic sigma is loose); ``epsilon`` is what
    the releases made compose to (GDP, exact); ``epsilon_pld`` cross-checks
    it with dp-accounting's PLD.
    """

    epsilon: float
    epsilon_pld: float
    per_round_epsilon: float
    per_round_epsilon_exact: float
    target_epsilon: float
    delta: float
    level: str
    placement: str
    calibration: str
    record_bound: str
    sensitivity: float
    sigma: float
    mu_per_release: float
    mu_total: float
    releases: int
    formal: bool
    guarantee: str
    notes: tuple = ()
    #: True when the noise came from a seed (``noise_seed``) or a caller's Generator: a seeded simulation
    simulation: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }

    @property
    def is_private(self) -> bool:
        """Whether the releases carry the stated formal (finite) guarantee."""
        return bool(self.formal) and math.isfinite(self.epsilon)

    @property
    def auc_bound(self) -> float:
        """The largest AUC of any membership test against mu_total-GDP releases: Phi(mu / sqrt(2))."""
        from scipy.stats import norm

        return float(norm.cdf(self.mu_total / math.sqrt(2.0)))

    def describe(self) -> str:
        """Several lines: the guarantee, both epsilons (per round and composed) and the notes."""
        ratio = self.epsilon / self.per_round_epsilon if self.per_round_epsilon > 0 else math.inf
        pld_note = f" skipped: mu > {PLD_MAX_MU:g}" if math.isnan(self.epsilon_pld) else ""
        lines = [
            self.guarantee,
            f"  per-round epsilon (as calibrated / as the paper states): {format_up(self.per_round_epsilon)} "
            f"(one release alone is exactly {format_up(self.per_round_epsilon_exact)}-DP at delta = "
            f"{format_up(self.delta)})",
            f"  composed over {self.releases} release(s): epsilon = {format_up(self.epsilon)} (GDP, exact; "
            f"PLD {format_up(self.epsilon_pld)}{pld_note}), {ratio:.3g} x the per-round epsilon",
            f"  sigma = {self.sigma:.4g} on a sensitivity of {self.sensitivity:.4g} ({self.record_bound} bound)",
            f"  any membership test on all {self.releases} release(s) has AUC <= {self.auc_bound:.4g} "
            f"(mu-GDP: Phi(mu / sqrt 2), mu = {self.mu_total:.4g})",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.guarantee


@dataclass(frozen=True)
class EventTrace:
    """What :func:`rounds_report` reads of one round's trace: its privacy events (dicts) and its randomness.

    A release made in one process leaves a full :class:`~privfed.release.ReleaseTrace`; a round whose
    stages ran on other machines (the Flower server's) states its events and randomness in this.
    """

    events: tuple
    randomness: str = "none"


def trace_events(traces) -> list[ReleaseEvent]:
    """Every privacy event the traces booked, in order (the accountant's input)."""
    return [ReleaseEvent(**e) for t in traces for e in t.events]


def rounds_report(dp, traces) -> RoundsPrivacyReport:
    """The guarantee of the releases the ``traces`` record, under the settings of ``dp`` (a ``RoundsDP``).

    Epsilon, mu and the number of releases come from the traces' events; whether the run is a seeded
    simulation from the traces' randomness (a stage that drew from a seed).
    """
    from mechanisms.dp.accounting import ledger_epsilon
    from mechanisms.dp.calibration import gdp_epsilon

    events = trace_events(traces)
    n = len({e.release_id for e in events})
    eps = ledger_epsilon(events, dp.delta, "gdp")[0] if events else 0.0
    eps_pld = math.nan
    # from the noise each release really carried (distributed shares: only those that reached the sum)
    mu_total = math.sqrt(sum((e.sensitivity / e.scale) ** 2 for e in events)) if events else 0.0
    # dp-accounting's PLD grid grows with the privacy-loss range (~ mu^2): cross-check moderate mu only
    if events and dp.accountant_check and mu_total <= PLD_MAX_MU:
        eps_pld, _ = ledger_epsilon(events, dp.delta, "pld")
    mu1 = dp.mu_per_release
    per_round = dp.epsilon if dp.calibration == "paper" else gdp_epsilon(mu1, dp.delta)
    notes = []
    formal = True
    if dp.level == "record" and dp.record_bound == "theorem" and dp.bodies_trained:
        formal = False
        notes.append(
            "Theorem 3.1's sensitivity assumes a body independent of the private records; these bodies were "
            "trained on them, so one record can move every feature of its client: the epsilons below are "
            "what the paper's accounting gives, NOT a formal guarantee (use record_bound='upload')"
        )
    if dp.record_bound == "upload":
        notes.append(
            f"trained bodies: each client's upload bounded to max_records={dp.max_records} records' "
            "worth; sensitivity = its diameter 2 n_max Delta (valid under adaptive composition)"
        )
    if dp.level == "client":
        notes.append(
            f"client level: each client's upload bounded to max_records={dp.max_records} records' "
            "worth; sensitivity n_max Delta"
        )
    if dp.calibration == "paper" and dp.epsilon > 1:
        notes.append(
            "classic sigma outside its proven range (epsilon > 1): the per-round epsilon is not proven"
        )
    if dp.placement == "distributed":
        if dp.secure_notes:
            notes.extend(dp.secure_notes)
        else:
            notes.append(
                "each client adds N(0, sigma^2/K); holds while secure aggregation hides the individual "
                "uploads and no client drops out or colludes (simulated as a plain sum here)"
            )
    elif dp.placement == "central":
        notes.append("noise on the sum added by a trusted server")
    else:
        notes.append("every client noises its own upload with the full sigma (the sum carries K sigma^2)")
    if dp.backend.secure:
        notes.append(
            f"noise drawn by backend {dp.backend.name!r} (exact discrete samplers on a grid); the sensitivity "
            "includes its rounding slack"
        )
    else:
        notes.append(
            f"floating-point noise (backend {dp.backend.name!r}): not hardened against floating-point attacks, "
            "so the guarantee above does not hold against an attack on the low-order bits of the released values"
        )
    simulation = any(t.randomness == "seeded" for t in traces)
    if simulation:
        src = f"noise_seed={dp.noise_seed}" if dp.noise_seed is not None else "a caller's Generator"
        notes.insert(
            0,
            f"seeded simulation, NOT A RELEASE: the noise was drawn from {src} and can be replayed "
            "by anyone who knows it; run without noise_seed (fresh OS entropy) for a release",
        )
    notes.extend(dp.extra_notes)
    where = {"central": "trusted server", "distributed": "secure aggregation", "local": "local noise"}
    if formal:
        guarantee = (
            f"({format_up(eps)}, {format_up(dp.delta)})-DP at {dp.level} level over {n} release(s) "
            f"(GDP mu = {format_up(mu_total)}); {where[dp.placement]}; {dp.calibration_text}"
        )
    else:
        guarantee = (
            f"NO FORMAL GUARANTEE (bodies trained on the private records): the paper's accounting "
            f"gives eps = {format_up(per_round)} per round, composing to eps = {format_up(eps)} over "
            f"{n} releases at delta = {format_up(dp.delta)}"
        )
    if simulation:
        guarantee = "SIMULATION (seeded simulation, replayable noise): " + guarantee
    return RoundsPrivacyReport(
        epsilon=float(eps),
        epsilon_pld=float(eps_pld),
        per_round_epsilon=float(per_round),
        per_round_epsilon_exact=float(gdp_epsilon(mu1, dp.delta)),
        target_epsilon=dp.epsilon,
        delta=dp.delta,
        level=dp.level,
        placement=dp.placement,
        calibration=dp.calibration_text,
        record_bound=dp.record_bound,
        sensitivity=dp.sensitivity,
        sigma=dp.sigma,
        mu_per_release=mu1,
        mu_total=mu_total,
        releases=n,
        formal=formal,
        guarantee=guarantee,
        notes=tuple(notes),
        simulation=simulation,
    )
