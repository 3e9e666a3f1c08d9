"""FedLog's noise path in the mechanism itself: one sigma on the augmented statistic [counts, sums].

``GaussianMechanism(split="augmented")`` noises FedLog's statistic phi (x) e_y, phi = [1, f], in one
draw of one sigma, booked as one event of its joint sensitivity f sqrt(1 + c^2) (Theorem 3.1 of the
FedLog paper, with f = 1 for a record, n_max for a client and 2 n_max for an upload bounded to
n_max records' worth).  Checked here, not only through the rounds and the Flower app:

* the noise on the counts and on the sums has that sigma (a chi-square test of the variances, at a
  false-alarm rate of 1e-6 per test, from exact statistics computed independently);
* sigma and the booked sensitivity for each bound and clipping norm, against an independent
  calibration of the analytic Gaussian (bisection on its exact (eps, delta) curve, to 1e-9);
* under secure aggregation each client adds sigma^2 / (K - t), and when more than t clients drop
  before uploading the ledger books only the shares that reached the sum (and epsilon grows).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import chi2, norm

import privfed
from mechanisms import GaussianMechanism, clip_l2
from mechanisms.secagg import PairwiseMasking
from privfed.stats import ClientStats

EPS, DELTA, CLIP = 1.0, 1e-5, 0.5
ALPHA = 1e-6  # false-alarm rate of each variance test


def _delta_of(eps: float, mu: float) -> float:
    """Exact delta(eps) of mu-GDP (the Gaussian mechanism with Delta / sigma = mu)."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def _mu_for(eps: float, delta: float) -> float:
    return brentq(lambda mu: _delta_of(eps, mu) - delta, 1e-6, 50.0, xtol=1e-14, rtol=1e-15)


def _eps_for(mu: float, delta: float) -> float:
    return brentq(lambda e: _delta_of(e, mu) - delta, 1e-9, 200.0, xtol=1e-14, rtol=1e-15)


def _variance_ok(noise: np.ndarray, sigma: float) -> bool:
    """The sample variance (known mean 0) within the two-sided chi-square interval at ALPHA."""
    n = noise.size
    s = float(np.sum(noise**2)) / sigma**2
    return chi2.ppf(ALPHA / 2, n) <= s <= chi2.ppf(1 - ALPHA / 2, n)


def _data(n: int = 40, d: int = 3, C: int = 3, K: int = 4):
    rng = np.random.default_rng(11)
    F = rng.normal(size=(n, d))
    return F, np.arange(n) % C, np.arange(n) % K


def _quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the numpy backend's floating-point warning
        return fn()


# ---------------------------------------------------------------- the noise on counts and sums
def test_one_sigma_noises_both_the_counts_and_the_sums():
    F, y, _ = _data()
    mech = GaussianMechanism(epsilon=EPS, delta=DELTA, clip=CLIP, split="augmented")
    draws = 4000
    out = _quiet(lambda: mech.release(F, y, rng=np.random.default_rng(0), num_classes=3, draws=draws))
    Fc = clip_l2(F, CLIP)
    counts = np.bincount(y, minlength=3).astype(float)
    sums = np.stack([Fc[y == c].sum(axis=0) for c in range(3)])
    n_counts = out.counts - counts[None]
    n_sums = out.sums - sums[None]
    sigma = math.sqrt(1 + CLIP**2) / _mu_for(EPS, DELTA)
    assert (
        mech.sigma["counts"] == pytest.approx(sigma, rel=1e-9) and mech.sigma["sums"] == mech.sigma["counts"]
    )
    assert _variance_ok(n_counts, sigma), np.std(n_counts) / sigma
    assert _variance_ok(n_sums, sigma), np.std(n_sums) / sigma
    # one draw per coordinate: counts and sums noised independently (no shared values), zero mean
    corr = np.corrcoef(n_counts.ravel(), n_sums[..., 0].ravel())[0, 1]
    assert abs(corr) < 5.0 / math.sqrt(n_counts.size)
    for noise in (n_counts, n_sums):
        assert abs(noise.mean()) < 5.0 * sigma / math.sqrt(noise.size)
    (event,) = {(e.block, e.rounds) for e in mech.ledger.events}
    assert event == ("augmented", draws)


# ---------------------------------------------------------------- the sensitivity factor of each bound
BOUNDS = {
    "record": ({}, 1.0),
    "client": ({"level": "client", "max_records": 7, "trusted_aggregator": True}, 7.0),
    "upload": ({"record_bound": "upload", "max_records": 7}, 14.0),
}


@pytest.mark.parametrize("clip_norm", ["l2", "coordinate"])
@pytest.mark.parametrize("bound", list(BOUNDS))
def test_each_bound_books_its_factor_on_the_joint_sensitivity(bound, clip_norm):
    kw, factor = BOUNDS[bound]
    F, y, k = _data()
    d = F.shape[1]
    c = CLIP if clip_norm == "l2" else CLIP * math.sqrt(d)  # the L2 bound of a clipped record
    joint = factor * math.sqrt(1.0 + c * c)
    mech = GaussianMechanism(
        epsilon=EPS, delta=DELTA, clip=CLIP, clip_norm=clip_norm, split="augmented", dim=d, **kw
    )
    assert mech.joint_sensitivity == pytest.approx(joint, rel=1e-12)
    sigma = joint / _mu_for(EPS, DELTA)
    assert mech.sigma == pytest.approx({"sums": sigma, "counts": sigma}, rel=1e-9)
    head = _quiet(
        lambda: privfed.fit("fedlog", F, y, k, num_classes=3, num_clients=4, privacy=mech, random_state=1)
    )
    assert np.all(np.isfinite(head.weight))
    (ev,) = mech.ledger.events  # one event for both blocks: one draw on the augmented statistic
    assert ev.block == "augmented" and ev.relation == mech.level
    assert ev.sensitivity == pytest.approx(joint, rel=1e-12) and ev.scale == pytest.approx(sigma, rel=1e-12)
    assert head.privacy.epsilon == pytest.approx(EPS, rel=1e-9)


# ---------------------------------------------------------------- distributed noise and dropped shares
def test_each_client_adds_its_share_of_sigma_squared():
    K, t = 60, 30  # each share is sigma^2 / 30: twice what a share of K would be
    mech = GaussianMechanism(
        epsilon=EPS,
        delta=DELTA,
        clip=CLIP,
        split="augmented",
        level="client",
        max_records=5,
        dropout_tolerance=t,
    )
    method = privfed.methods.get("fedlog")
    mech.check(method, PairwiseMasking())
    zero = ClientStats(counts=np.zeros((K, 4)), sums=np.zeros((K, 4, 25)))
    out = _quiet(lambda: mech.before_upload(zero, method, np.random.default_rng(2)))
    share = mech.sigma["sums"] / math.sqrt(K - t)
    assert _variance_ok(out.counts, share) and _variance_ok(out.sums, share)
    assert not _variance_ok(out.sums, mech.sigma["sums"] / math.sqrt(K))  # the share is of K - t, not K


@pytest.mark.parametrize("dropped, tolerated", [(0, 2), (2, 2), (3, 2), (3, 1)])
def test_dropped_shares_are_booked_as_the_noise_that_reached_the_sum(dropped, tolerated):
    K = 8  # masking's default threshold is 5: up to 3 clients may drop before uploading
    F, y, k = _data(n=80, K=K)
    mech = GaussianMechanism(
        epsilon=EPS,
        delta=DELTA,
        clip=CLIP,
        split="augmented",
        level="client",
        max_records=10,
        dropout_tolerance=tolerated,
    )
    secure = PairwiseMasking(dropouts=dropped, dropout_phase="before_upload")
    head = _quiet(
        lambda: privfed.fit(
            "fedlog", F, y, k, num_classes=3, num_clients=K, privacy=mech, secure_agg=secure, random_state=3
        )
    )
    rep = head.privacy
    present = K - dropped
    sigma = mech.sigma["sums"]
    booked = sigma * math.sqrt(present / (K - tolerated))
    assert {e.block for e in mech.ledger.events} == {"augmented"}
    for e in mech.ledger.events:
        assert e.scale == pytest.approx(booked, rel=1e-12) and e.sensitivity == pytest.approx(
            10.0 * math.sqrt(1 + CLIP**2), rel=1e-12
        )
    want = _eps_for(mech.joint_sensitivity / booked, DELTA)
    assert rep.epsilon == pytest.approx(want, rel=1e-9)
    if dropped <= tolerated:
        assert rep.epsilon <= EPS * (1 + 1e-9)
    else:  # more dropped than tolerated: less noise reached the sum, and the report says so
        assert rep.epsilon > EPS
        assert any(f"only {present} of {K} clients' noise shares reached the sum" in n for n in rep.notes)
