"""Accountants: (eps, delta) of a ledger of releases, and noise calibration over rounds.

* ``gdp``: exact composition of Gaussian releases without subsampling
  (Dong, Roth & Su 2019, Cor. 3.3): mu = sqrt(sum_i T_i (Delta_i/sigma_i)^2),
  converted to (eps, delta) exactly.
* ``pld``: dp-accounting's privacy-loss distributions (Poisson-subsampled
  Gaussian, Laplace, pure eps-DP), the default when some round is
  subsampled or a Laplace / geometric event is present.
* ``prv`` / ``rdp``: opacus' PRV (Gopi et al. 2021) and RDP (Mironov 2017)
  accountants, for Gaussian events; used to cross-check.

Every accountant works with ADD_OR_REMOVE_ONE on the noise multiplier
sigma / Delta, with Delta the L2 sensitivity computed by the mechanism under
its own neighbouring relation (dp-accounting 0.6.0 treats REPLACE_ONE
inconsistently between its PLD and RDP code, so it is never used).

Blocks of one release (same ``release_id``) are sampled together, so they
compose as one Gaussian with mu_round = sqrt(sum_b (Delta_b/sigma_b)^2).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import defaultdict
from collections.abc import Iterable

from mechanisms.dp.calibration import as_real, check_budget, check_delta, check_rounds, gdp_epsilon, gdp_mu
from mechanisms.dp.ledger import ReleaseEvent
from privfed.errors import ConfigError

__all__ = ["ACCOUNTANTS", "calibrate_round_mu", "ledger_epsilon"]

ACCOUNTANTS = ("auto", "gdp", "pld", "prv", "rdp")


def _check_accountant(name: str) -> None:
    if name not in ACCOUNTANTS:
        raise ConfigError(f"unknown accountant {name!r}; choose from {list(ACCOUNTANTS)}")


def _gaussian_groups(events: Iterable[ReleaseEvent]) -> list[tuple[float, int, float]]:
    """(mu per round, rounds, sampling rate) of each Gaussian release (blocks merged)."""
    groups: dict[tuple, float] = defaultdict(float)
    for e in events:
        groups[(e.release_id, e.rounds, e.sampling_rate)] += e.gdp_mu**2
    return [(math.sqrt(m2), rounds, q) for (_, rounds, q), m2 in groups.items()]


def ledger_epsilon(events: list[ReleaseEvent], delta: float, accountant: str = "auto") -> tuple[float, str]:
    """The epsilon at ``delta`` of every event in a ledger, and the accountant used.

    Returns ``(inf, reason)`` when an event carries no guarantee.
    """
    _check_accountant(accountant)
    delta = check_delta(delta)
    # A list, once: an iterator would be spent by the first scan and the rest would see an empty ledger.
    events = list(events)
    wrong = next((e for e in events if not isinstance(e, ReleaseEvent)), None)
    if wrong is not None:
        raise ConfigError(
            f"a ledger holds ReleaseEvent objects (mechanisms.dp.ledger), got a {type(wrong).__name__}: pass "
            "the mechanism's ledger or ReleaseEvent(...) values"
        )
    if not events:
        return 0.0, "empty ledger"
    if any(not e.private for e in events):
        return math.inf, "none"
    gauss = [e for e in events if e.mechanism == "gaussian"]
    other = [e for e in events if e.mechanism != "gaussian"]
    if any(e.mechanism == "gaussian" and e.scale == 0 and e.sensitivity > 0 for e in gauss):
        return math.inf, "none"
    groups = _gaussian_groups(gauss)
    subsampled = any(q < 1 for _, _, q in groups) or any(e.sampling_rate < 1 for e in other)
    if accountant == "auto":
        if not other and not subsampled:
            accountant = "gdp"
        elif not gauss and not subsampled:
            accountant = "pure"
        else:
            accountant = "pld"
    if accountant == "pure":
        return float(sum(e.rounds * _pure_eps(e) for e in other)), "pure (basic composition)"
    if accountant == "gdp":
        if other or subsampled:
            raise ConfigError(
                "accountant='gdp' is exact only for Gaussian releases without subsampling; use 'pld'"
            )
        mu = math.sqrt(sum(r * m**2 for m, r, _ in groups))
        return gdp_epsilon(mu, delta), "gdp (exact)"
    if accountant == "pld":
        # dp-accounting's pessimistic PLD: an upper bound on epsilon at any grid step (loose below ~1e-3)
        return _pld_epsilon(groups, other, delta), "pld (dp-accounting)"
    if other:
        raise ConfigError(f"accountant={accountant!r} handles Gaussian events only; use 'pld'")
    if delta == 0 and any(mu > 0 for mu, _, _ in groups):  # opacus' PRV divides by delta
        return math.inf, f"{accountant} (opacus; a Gaussian release has no epsilon at delta = 0)"
    eps = _opacus_epsilon(groups, delta, accountant)
    if not (math.isfinite(eps) and eps >= 0):
        # Opacus' numerics fail at the edges (PRV returns a negative epsilon for a tiny mu at a large delta):
        # state dp-accounting's PLD value instead of an invalid one.
        return _pld_epsilon(
            groups, [], delta
        ), f"pld (dp-accounting; {accountant} (opacus) returned {eps:.3g})"
    return eps, f"{accountant} (opacus)"


def _pure_eps(e: ReleaseEvent) -> float:
    if e.mechanism == "laplace":
        return e.sensitivity / e.scale if e.scale > 0 else (0.0 if e.sensitivity == 0 else math.inf)
    if e.mechanism == "geometric":
        return e.sensitivity * e.scale
    raise ConfigError(f"no pure-DP bound for {e.mechanism!r} events")


#: The most grid points a PLD may need before it is refused (2^31 float64 values: 16 GiB).
PLD_MAX_POINTS = 2**31


def _pld_epsilon(groups, other, delta: float, discretization: float = 1e-4) -> float:
    # A PLD takes about a second to build: repeated reports of the same ledger (audits, sweeps) reuse it.
    # Its grid spans at least the composed loss's mean, rounds mu^2 / 2, at one point per discretization
    # step: past PLD_MAX_POINTS (16 GiB of float64) it is refused before numpy is asked for the memory.
    need = max((r * mu * mu / 2.0 / discretization for mu, r, q in groups if q >= 1), default=0.0)
    if need > PLD_MAX_POINTS:
        raise ConfigError(
            f"the PLD accountant's privacy-loss grid for this ledger would span about {need:.3g} steps, more "
            "than memory holds (very many rounds or very little noise: a GDP mu above ~650); for Gaussian "
            "releases use accountant='gdp' (exact without subsampling) or 'rdp'"
        )
    try:
        return _pld_epsilon_cached(tuple(groups), tuple(other), float(delta), float(discretization))
    except MemoryError:  # a million rounds, or a GDP mu of 1,000: the distribution's grid outgrows memory
        raise ConfigError(
            "the PLD accountant's privacy-loss grid for this ledger does not fit in memory (very many rounds or "
            "very little noise); for Gaussian releases use accountant='gdp' (exact without subsampling) or 'rdp'"
        ) from None


@functools.lru_cache(maxsize=256)
def _pld_epsilon_cached(groups, other, delta: float, discretization: float) -> float:
    import dp_accounting
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    plds = []
    gauss = [_gaussian_event(mu, rounds, q) for mu, rounds, q in groups if mu > 0]
    if gauss:
        # Gaussian releases through dp-accounting's own events and PLD accountant (add-or-remove-one):
        # a Poisson-sampled release is a PoissonSampledDpEvent of its GaussianDpEvent.
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=discretization)
        acc.compose(dp_accounting.ComposedDpEvent(gauss))
        if not other:
            return float(acc.get_epsilon(delta))
    for mu, rounds, q in groups:  # next to pure-DP events: the same PLDs, composed by hand
        if mu == 0:
            continue
        p = pldlib.from_gaussian_mechanism(
            1.0 / mu, sampling_prob=q, value_discretization_interval=discretization
        )
        plds.append(p.self_compose(rounds) if rounds > 1 else p)
    for e in other:
        if e.mechanism == "laplace" and e.sampling_rate == 1 and e.sensitivity > 0:
            p = pldlib.from_laplace_mechanism(e.scale, sensitivity=e.sensitivity)
        else:
            eps = _pure_eps(e)
            if eps == 0:
                continue
            p = pldlib.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0.0))
        plds.append(p.self_compose(e.rounds) if e.rounds > 1 else p)
    if not plds:
        return 0.0
    total = plds[0]
    for p in plds[1:]:
        total = total.compose(p)
    return float(total.get_epsilon_for_delta(delta))


def _gaussian_event(mu: float, rounds: int, q: float):
    """dp-accounting's event for ``rounds`` Gaussian releases of GDP mu, Poisson-sampled at rate q."""
    import dp_accounting

    event = dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / mu)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(sampling_probability=q, event=event)
    return dp_accounting.SelfComposedDpEvent(event, int(rounds)) if rounds > 1 else event


def _opacus_epsilon(groups, delta: float, name: str) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant

    acc = PRVAccountant() if name == "prv" else RDPAccountant()
    for mu, rounds, q in groups:
        if mu > 0:
            acc.history.append((1.0 / mu, q, int(rounds)))
    if not acc.history:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta=delta))


def calibrate_round_mu(
    epsilon: float, delta: float, *, rounds: int = 1, sampling_rate: float = 1.0, accountant: str = "auto"
) -> tuple[float, str]:
    """mu of one round (over all blocks together) so that ``rounds`` rounds are (eps, delta)-DP.

    Without subsampling this is exact: mu_round = gdp_mu(eps, delta) / sqrt(rounds)
    (equivalently sigma_T = sqrt(T) sigma_1).  With Poisson client sampling
    at rate q < 1 the noise multiplier is found by an accountant (``pld`` by
    default, or opacus ``prv`` / ``rdp``).

    Returns
    -------
    (mu_round, method) : (float, str)
    """
    _check_accountant(accountant)
    rounds = check_rounds(rounds)
    # Plain floats (a 0-d array cannot key the cache), the budget checked on every accountant's path.
    epsilon, delta = check_budget(epsilon, delta)
    try:
        sampling_rate = as_real(sampling_rate)
    except (TypeError, ValueError):
        raise ConfigError(
            f"sampling_rate must be a number in (0, 1], got sampling_rate={sampling_rate!r}"
        ) from None
    return _calibrate_round_mu(epsilon, delta, rounds, sampling_rate, accountant)


@functools.lru_cache(maxsize=256)
def _calibrate_round_mu(
    epsilon: float, delta: float, rounds: int, sampling_rate: float, accountant: str
) -> tuple[float, str]:
    if not 0 < sampling_rate <= 1:
        raise ConfigError(f"sampling_rate must lie in (0, 1], got sampling_rate={sampling_rate}")
    if math.isinf(epsilon):
        return math.inf, "none"
    if sampling_rate < 1 and sampling_rate <= delta:
        # Subsampled at q <= delta, a release is (0, delta)-DP with no noise at all (a sampled record could be
        # published as it is): no noise multiplier is the least, and a search for one never ends.
        raise ConfigError(
            f"sampling_rate={sampling_rate} is not above delta={delta}: a release subsampled at that rate is "
            "(0, delta)-DP with no noise at all, which protects nothing; take delta well below the sampling "
            "rate (e.g. below sampling_rate / 100)"
        )
    if sampling_rate == 1 and accountant in ("auto", "gdp"):
        return gdp_mu(epsilon, delta) / math.sqrt(rounds), "gdp (exact)"
    name = "pld" if accountant in ("auto", "gdp") else accountant
    if name == "pld":
        z = _calibrate_pld(epsilon, delta, rounds, sampling_rate)
    else:
        from opacus.accountants.utils import get_noise_multiplier

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                z = get_noise_multiplier(
                    target_epsilon=epsilon,
                    target_delta=delta,
                    sample_rate=sampling_rate,
                    steps=rounds,
                    accountant=name,
                    epsilon_tolerance=0.005,
                )
            except (ValueError, ArithmeticError, RuntimeError) as exc:
                raise ConfigError(
                    f"opacus' {name} accountant found no noise multiplier for epsilon={epsilon}, delta={delta}, "
                    f"{rounds} round(s), sampling_rate={sampling_rate} ({exc}); use accountant='pld' "
                    "(dp-accounting) or a larger budget"
                ) from None
    return 1.0 / float(z), f"{name} accountant"


def _calibrate_pld(epsilon: float, delta: float, rounds: int, q: float) -> float:
    """Smallest noise multiplier (to 0.1%) whose PLD epsilon is <= the target.

    The search uses a coarser discretisation; dp-accounting's pessimistic
    estimate upper-bounds epsilon at any discretisation, so the result is
    valid (and the finer report then states an epsilon at most the target).
    """
    coarse = min(1e-3, epsilon / 50)  # a grid step well below the target epsilon

    def eps_of(z: float) -> float:
        return _pld_epsilon([(1.0 / z, rounds, q)], [], delta, discretization=coarse)

    def reported(z: float) -> float:  # what ledger_epsilon will state for this multiplier
        return ledger_epsilon(
            [
                ReleaseEvent(
                    mechanism="gaussian",
                    block="all",
                    sensitivity=1.0,
                    scale=z,
                    relation="record",
                    rounds=rounds,
                    sampling_rate=q,
                    release_id=1,
                )
            ],
            delta,
            "pld",
        )[0]

    from scipy.optimize import brentq

    # Without amplification the exact GDP multiplier is the answer; the PLD's pessimistic discretisation
    # puts its epsilon slightly above the target, so the upper bracket is grown until it is within it.
    hi = math.sqrt(rounds) / gdp_mu(epsilon, delta)
    for _ in range(200):
        if eps_of(hi) <= epsilon:
            break
        hi *= 1.01
    else:  # pragma: no cover - 200 steps multiply the noise by 7: no accepted budget gets here
        raise ConfigError(
            f"the PLD accountant found no noise multiplier meeting epsilon={epsilon}, delta={delta} over "
            f"{rounds} round(s) at sampling_rate={q}; use accountant='gdp' (exact without sampling)"
        )
    lo = hi / 2  # halved until its epsilon exceeds the target: a lower bracket
    for _ in range(64):
        if eps_of(lo) > epsilon:
            break
        hi, lo = lo, lo / 2
    else:  # 2^-64 of the unamplified noise still meets the target: nothing to calibrate (delta near q)
        raise ConfigError(
            f"epsilon={epsilon} at delta={delta} is met at sampling_rate={q} with almost no noise; take delta "
            "well below the sampling rate (e.g. below sampling_rate / 100)"
        )
    # Brent's method on log z (a few PLDs instead of a dozen bisection steps), then step up to a
    # multiplier whose epsilon is checked to be within the target.
    root = math.exp(
        brentq(lambda t: eps_of(math.exp(t)) - epsilon, math.log(lo), math.log(hi), xtol=2e-4, rtol=1e-6)
    )
    z = min(root * (1 + 5e-4), hi)
    while eps_of(z) > epsilon:
        z *= 1.001
    # The report uses the finer discretisation; where epsilon is comparable to the coarse grid the two
    # can disagree: step up until the report's own value meets the target too.
    for _ in range(2000):
        if reported(z) <= epsilon:
            return z
        z *= 1.001
    raise ConfigError(
        f"epsilon={epsilon} is below the resolution of the PLD accountant's report (grid 1e-4) for {rounds} "
        f"round(s) at sampling_rate={q}; use a larger epsilon, or accountant='gdp' without sampling"
    )
