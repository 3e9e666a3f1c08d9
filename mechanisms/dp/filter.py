"""A privacy filter for Gaussian releases: a lifetime budget that stays valid when the next release is
chosen after seeing the earlier ones.

Which theorem.  Smith & Thakurta, "Fully adaptive composition for Gaussian differential privacy"
(arXiv:2210.17520, 2022), main theorem: an analyst chooses, one round after another and from everything
released so far, a mechanism M_i and a parameter mu_i such that M_i is mu_i-GDP (given the past); a
curator that runs M_i only while ``mu_1^2 + ... + mu_i^2 <= mu^2`` (and stops otherwise) makes the whole
interaction mu-GDP.  These are the parameters of non-adaptive GDP composition (Dong, Roth & Su 2019,
Cor. 3.3): the adaptivity costs nothing.  mu-GDP is (eps, delta)-DP for every delta with
``eps = gdp_epsilon(mu, delta)`` (Dong, Roth & Su 2019, Cor. 2.13), so a budget (eps_B, delta_B) is the
filter's mu_B = ``gdp_mu(eps_B, delta_B)``.

Why this filter.  Every release a privfed node makes is a Gaussian mechanism without subsampling: a
statistic of L2 sensitivity Delta plus N(0, sigma^2) noise, exactly mu-GDP with mu = Delta / sigma
(Dong, Roth & Su 2019, Thm. 2.7; blocks released together compose to sqrt(sum_b (Delta_b/sigma_b)^2)).
GDP is then exact, and its filter admits exactly what non-adaptive composition would: the composed
epsilon equals :func:`mechanisms.dp.accounting.ledger_epsilon` (``gdp``) on the same events.  An
(eps, delta) filter (Rogers, Roth, Ullman & Vadhan 2016) would charge the sum of per-release epsilons
(or advanced composition), and a Renyi filter (Feldman & Zrnic 2021; Whitehouse et al. 2023) converts
to (eps, delta) less tightly for Gaussians.  What the GDP filter does not cover is refused: events that
are not Gaussian, that credit amplification by subsampling (a subsampled Gaussian is not mu-GDP for a
closed-form mu, and the natural f-DP filter is not valid for it in general), or that carry no guarantee.

Units.  The filter protects one neighbouring relation, the unit of its budget.  A record-level event
counts as booked (add or remove one record).  A client-level event (zero-out: the node's whole data
replaced by none, sensitivity Delta_c) also bounds every record-level pair: two data sets D and D' that
differ in one record are both zero-out neighbours of the empty one, so
``||f(D) - f(D')|| <= 2 Delta_c`` and a client-level mu_c is at most ``2 mu_c`` at record level (a valid,
loose bound).  :func:`release_mu` applies it.

The module is pure: :class:`GaussianFilter` decides from the budget and the list of mu already spent;
persistence and refusals belong to the caller (a Flower node: :mod:`privfed.flower.budget`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mechanisms.dp.calibration import as_real, check_budget, gdp_epsilon, gdp_mu
from mechanisms.dp.ledger import ReleaseEvent
from privfed.errors import ConfigError

__all__ = ["UNITS", "GaussianFilter", "release_mu", "releases_mu"]

#: Neighbouring relations a filter's budget can be kept in.
UNITS = ("record", "client")


def release_mu(events: Iterable[ReleaseEvent | dict], unit: str = "record") -> float:
    """The GDP mu, in ``unit``, of the releases ``events`` record (blocks of one release compose together).

    Each event is one block of one release (``release_id``); ``rounds`` identical copies count ``rounds``
    times.  The result is ``sqrt(sum_e rounds_e (Delta_e / sigma_e)^2)``, client-level events doubled at
    record level (the module docstring says why), so for record-level events it is the mu
    :func:`mechanisms.dp.accounting.ledger_epsilon` composes.

    Raises
    ------
    ConfigError
        An event the GDP filter cannot charge: not Gaussian, subsampled, without noise, or (at client level)
        a record-level event, which bounds nothing about a whole node's data.
    """
    if unit not in UNITS:
        raise ConfigError(f"unit must be one of {list(UNITS)}, got unit={unit!r}")
    if events is None or isinstance(events, (str, bytes, dict, ReleaseEvent)):
        raise ConfigError(f"events must be a list of release events, got {type(events).__name__}")
    total = []
    for e in events:
        try:
            ev = e if isinstance(e, ReleaseEvent) else ReleaseEvent(**dict(e))
        except (TypeError, ValueError) as exc:  # a key ReleaseEvent has not, a value that is no mapping
            raise ConfigError(
                f"a release event must be a ReleaseEvent or its fields, got {e!r} ({exc})"
            ) from None
        if ev.mechanism != "gaussian" or not ev.private:
            raise ConfigError(
                f"a {ev.mechanism!r} release of {ev.block!r} has no Gaussian DP guarantee; the budget's GDP "
                "filter charges Gaussian releases only"
            )
        if ev.sampling_rate < 1:
            raise ConfigError(
                f"a release that credits Poisson sampling (rate {ev.sampling_rate:g}) is not mu-GDP for a "
                "closed-form mu; the budget's GDP filter charges releases without subsampling only"
            )
        mu = ev.gdp_mu
        if ev.relation != unit:
            if unit == "client":
                raise ConfigError(
                    "a record-level release bounds nothing about a node's whole data: a client-level budget "
                    "cannot charge it"
                )
            mu *= 2.0  # a zero-out (client-level) bound, at record level: the triangle inequality
        total.append(int(ev.rounds) * mu * mu)
    if not total:  # nothing noised: no guarantee to charge (a release without noise is refused, not free)
        raise ConfigError("a release without any noised block has no Gaussian DP guarantee to charge")
    return math.sqrt(math.fsum(total))


def releases_mu(events: Iterable[ReleaseEvent | dict], unit: str = "record") -> list[float]:
    """The mu of each release in ``events`` (grouped by ``release_id``, in order of first appearance)."""
    groups: dict[int, list] = defaultdict(list)
    for e in events:
        ev = e if isinstance(e, ReleaseEvent) else ReleaseEvent(**dict(e))
        groups[ev.release_id].append(ev)
    return [release_mu(g, unit) for g in groups.values()]


@dataclass(frozen=True)
class GaussianFilter:
    """The GDP filter of a lifetime budget (epsilon, delta) (Smith & Thakurta 2022; module docstring).

    ``spent`` arguments are the mu of every release admitted so far (any order: only their squares'
    sum matters).  A release of mu is admitted while ``sum(spent^2) + mu^2 <= mu_B^2``, exactly: no
    tolerance, so the composed epsilon never exceeds the budget by a rounding.
    """

    epsilon: float
    delta: float
    unit: str = "record"

    def __post_init__(self) -> None:
        eps, dl = check_budget(self.epsilon, self.delta, allow_inf=False)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", dl)
        if self.unit not in UNITS:
            raise ConfigError(f"unit must be one of {list(UNITS)}, got unit={self.unit!r}")

    @property
    def mu(self) -> float:
        """mu_B: the largest composed GDP mu the budget allows (``gdp_mu(epsilon, delta)``)."""
        return gdp_mu(self.epsilon, self.delta)

    @staticmethod
    def spent_mu(spent: Sequence[float]) -> float:
        """The composed mu of the releases spent: sqrt(sum mu_i^2)."""
        return math.sqrt(math.fsum(m**2 for m in _spent(spent)))

    def admits(self, spent: Sequence[float], mu: float) -> bool:
        """Whether a release of ``mu`` keeps the composed mu within the budget (a mu that is no finite
        number >= 0 is not admitted; a spent entry that is none is a ConfigError)."""
        spent = _spent(spent)  # a damaged ledger is said whatever the release asked
        try:
            mu = as_real(mu)
        except (TypeError, ValueError):
            return False
        # a mu alone above the budget is refused before it is squared (its square may overflow)
        if not (mu >= 0 and math.isfinite(mu)) or mu > self.mu:
            return False
        return math.fsum([*(m**2 for m in spent), mu**2]) <= self.mu**2

    def spent_epsilon(self, spent: Sequence[float]) -> float:
        """The epsilon at the budget's delta of everything spent (exact GDP composition)."""
        return gdp_epsilon(self.spent_mu(spent), self.delta)

    def remaining_mu(self, spent: Sequence[float]) -> float:
        """The mu of the largest single release still admitted: sqrt(mu_B^2 - sum mu_i^2), at least 0."""
        return math.sqrt(max(0.0, self.mu**2 - math.fsum(m**2 for m in _spent(spent))))

    def remaining_epsilon(self, spent: Sequence[float]) -> float:
        """The epsilon (at the budget's delta) of the largest single release still admitted."""
        return gdp_epsilon(self.remaining_mu(spent), self.delta)

    def release_epsilon(self, mu: float) -> float:
        """The epsilon at the budget's delta of one release of ``mu`` alone."""
        return gdp_epsilon(mu, self.delta)


#: A spent mu above this is a damaged record (its square nears float64's limit; a budget of epsilon 1e100 at
#: delta 1e-300 is a mu far below it).
MAX_SPENT_MU = 1e100


def _spent(spent: Sequence[float]) -> list[float]:
    """The mu of every release spent, each a finite number >= 0 (else a ConfigError naming it: the text "0.5"
    or a NaN in a ledger is a damaged record, never read as a spend of 0.5 or of nothing)."""
    if spent is None or isinstance(spent, (str, bytes)) or not hasattr(spent, "__iter__"):
        raise ConfigError(f"spent must be the list of the mu of every release spent, got {spent!r}")
    out = []
    for i, m in enumerate(spent):
        try:
            v = as_real(m)
        except (TypeError, ValueError):
            v = math.nan
        if not (v >= 0 and math.isfinite(v)):
            raise ConfigError(f"spent release {i} has mu={m!r}, not a finite number >= 0 (a damaged ledger?)")
        if v > MAX_SPENT_MU:  # its square would overflow the composition; no release spends anything near it
            raise ConfigError(f"spent release {i} has mu={m!r}, above any release's (a damaged ledger?)")
        out.append(v)
    return out
