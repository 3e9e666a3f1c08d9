"""The GDP privacy filter of a lifetime budget (mechanisms.dp.filter), against independent accountants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms.dp.accounting import ledger_epsilon
from mechanisms.dp.calibration import gdp_epsilon, gdp_mu
from mechanisms.dp.filter import GaussianFilter, release_mu, releases_mu
from mechanisms.dp.ledger import ReleaseEvent
from privfed.errors import ConfigError

DELTA = 1e-5


def _event(sens, sigma, rid, relation="record", block="augmented", **kw):
    return ReleaseEvent(
        mechanism="gaussian",
        block=block,
        sensitivity=sens,
        scale=sigma,
        relation=relation,
        release_id=rid,
        **kw,
    )


def _events(seed=0, n=7):
    """n releases of made-up sensitivities and noise, some of two blocks (released together)."""
    rng = np.random.default_rng(seed)
    out = []
    for rid in range(1, n + 1):
        out.append(_event(float(rng.uniform(0.5, 3)), float(rng.uniform(2, 20)), rid, block="sums"))
        if rid % 2:
            out.append(_event(float(rng.uniform(0.5, 3)), float(rng.uniform(2, 20)), rid, block="counts"))
    return out


def test_release_mu_composes_the_blocks_of_each_release_as_ledger_epsilon_does():
    events = _events()
    mus = releases_mu(events)
    assert len(mus) == 7
    # by hand: sqrt(sum (Delta / sigma)^2) within each release id
    for rid, mu in zip(range(1, 8), mus):
        own = [e for e in events if e.release_id == rid]
        assert mu == pytest.approx(math.sqrt(sum((e.sensitivity / e.scale) ** 2 for e in own)), rel=1e-12)
    filt = GaussianFilter(epsilon=50.0, delta=DELTA)
    assert filt.spent_epsilon(mus) == pytest.approx(ledger_epsilon(events, DELTA, "gdp")[0], rel=1e-12)


def test_the_composed_epsilon_equals_dp_accountings_exact_gaussian_and_its_pld():
    """Independent accountants: dp-accounting's closed-form privacy loss of the Gaussian mechanism (the
    composition of Gaussians is one Gaussian of mu = sqrt(sum mu_i^2)) gives back the budget's delta at the
    filter's epsilon to 1e-9; its PLD accountant composing the releases one by one (pessimistic, grid 1e-4)
    gives an epsilon at or above the exact one, by at most one grid step of privacy loss a composition."""
    import dp_accounting
    from dp_accounting.pld import privacy_loss_mechanism as plm

    events = _events(seed=3)
    mus = releases_mu(events)
    filt = GaussianFilter(epsilon=50.0, delta=DELTA)
    eps = filt.spent_epsilon(mus)
    mu = filt.spent_mu(mus)
    loss = plm.GaussianPrivacyLoss(standard_deviation=1.0 / mu, sensitivity=1.0)
    assert loss.get_delta_for_epsilon(eps) == pytest.approx(DELTA, rel=1e-9)

    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for m in mus:
        acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / m))
    eps_pld = acc.get_epsilon(DELTA)
    assert eps - 1e-9 <= eps_pld <= eps + len(mus) * 1e-4


def test_the_filter_admits_exactly_what_the_budget_allows_whatever_order_the_server_picks():
    filt = GaussianFilter(epsilon=2.0, delta=DELTA)
    assert filt.mu == gdp_mu(2.0, DELTA)
    # releases chosen adaptively: four of mu_B / 2.1 fit (4 / 4.41 < 1), a fifth does not
    one = filt.mu / 2.1
    spent = []
    for _ in range(4):
        assert filt.admits(spent, one)
        spent.append(one)
    assert not filt.admits(spent, one)
    # the largest release still admitted: exactly what is left of mu_B^2
    left = filt.remaining_mu(spent)
    assert left == pytest.approx(math.sqrt(filt.mu**2 - 4 * one**2), rel=1e-12)
    assert filt.admits(spent, left * (1 - 1e-9)) and not filt.admits(spent, left * (1 + 1e-9))
    assert filt.remaining_epsilon(spent) == pytest.approx(gdp_epsilon(left, DELTA), rel=1e-12)
    # spending it all composes to the budget itself
    assert filt.spent_epsilon([*spent, left]) == pytest.approx(2.0, rel=1e-9)
    # the order does not matter, only the sum of squares
    assert filt.admits([one, 2 * one], one) == filt.admits([2 * one, one], one)
    assert not filt.admits([], math.inf) and not filt.admits([], math.nan)


def test_client_level_releases_count_twice_at_record_level_and_record_releases_not_at_all_per_client():
    client = [_event(4.0, 8.0, 1, relation="client")]
    assert release_mu(client, "record") == pytest.approx(1.0, rel=1e-15)  # 2 * 4 / 8
    assert release_mu(client, "client") == pytest.approx(0.5, rel=1e-15)
    with pytest.raises(ConfigError, match="client-level budget cannot charge"):
        release_mu([_event(1.0, 2.0, 1)], "client")
    assert release_mu([_event(1.0, 2.0, 1, rounds=4)]) == pytest.approx(1.0, rel=1e-15)  # sqrt(4) / 2


@pytest.mark.parametrize(
    "event, text",
    [
        (
            ReleaseEvent(mechanism="laplace", block="counts", sensitivity=1.0, scale=1.0),
            "Gaussian releases only",
        ),
        (ReleaseEvent(mechanism="none", block="sums", sensitivity=1.0, scale=0.0), "no Gaussian DP"),
        (ReleaseEvent(mechanism="gaussian", block="sums", sensitivity=1.0, scale=0.0), "no Gaussian DP"),
        (
            ReleaseEvent(mechanism="gaussian", block="sums", sensitivity=1.0, scale=2.0, sampling_rate=0.5),
            "Poisson sampling",
        ),
    ],
)
def test_what_the_gdp_filter_cannot_charge_is_refused(event, text):
    with pytest.raises(ConfigError, match=text):
        release_mu([event])


def test_a_bad_budget_is_refused():
    for eps, delta in ((math.inf, DELTA), (0.0, DELTA), (1.0, 0.0), (1.0, 1.0)):
        with pytest.raises(ConfigError):
            GaussianFilter(epsilon=eps, delta=delta)
    with pytest.raises(ConfigError, match="unit must be one of"):
        GaussianFilter(epsilon=1.0, delta=DELTA, unit="node")


@pytest.mark.parametrize("entry", ["0.5", float("nan"), -0.1, math.inf, True, None])
def test_a_spent_entry_that_is_no_mu_is_named_not_read(entry):
    """Text in a ledger ("0.5") was read as a spend of 0.5 and a NaN made every question "not admitted" with
    NaN in the refusal: a spent entry that is no finite mu >= 0 is a damaged record, named."""
    f = GaussianFilter(epsilon=1.0, delta=1e-5)
    for ask in (
        lambda: f.admits([0.1, entry], 0.1),
        lambda: f.spent_mu([entry]),
        lambda: f.remaining_mu([entry]),
    ):
        with pytest.raises(ConfigError, match=r"spent release \d has mu="):
            ask()
    assert not f.admits([0.1], "0.1") and not f.admits([0.1], float("nan"))  # a question that is no mu
    assert f.admits([0.1], 0.1) and f.spent_mu([np.float64(0.3), 0.4]) == pytest.approx(0.5, abs=1e-15)


def test_a_huge_mu_is_not_admitted_and_a_huge_spend_is_a_damaged_ledger():
    """Before: admits([], 1e200) and spent_mu([1e200]) raised Python's OverflowError from mu ** 2."""
    from mechanisms.dp.filter import GaussianFilter

    f = GaussianFilter(epsilon=1.0, delta=1e-5)
    assert (
        f.admits([], 1e200) is False
        and f.admits([], f.mu) is True
        and f.admits([], f.mu * (1 + 1e-15)) is False
    )
    for call in (
        f.spent_mu,
        f.spent_epsilon,
        f.remaining_mu,
        lambda s: f.admits(s, 0.1),
        lambda s: f.admits(s, 1e200),
    ):
        with pytest.raises(ConfigError, match=r"spent release 1 has mu=1e\+200, above any release's"):
            call([0.1, 1e200])
