"""The auditors against careless callers (a fault battery's findings; each case failed before).

privfed.testing.audit compared a release's own report with the claim only on the pairs given the statistical
test, so statistical="none" passed a release reporting epsilon 1 for a claim of 0.1; audit_release with one
held-out draw a side called a correct release a deterministic leak; audit_scores read a NaN threshold as a
refutation; noise_scale_test skipped samples it could not read and passed on nothing.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import privfed
from mechanisms import GaussianMechanism
from privfed.audit import audit_release, audit_scores, neighbour_battery, noise_scale_test
from privfed.errors import ConfigError
from privfed.testing import audit


def _fedncm(epsilon):
    def release(data, seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mech = GaussianMechanism(epsilon=epsilon, delta=1e-5, clip=1.0)
            return privfed.fit("fedncm", privacy=mech, random_state=seed, **data)

    return release


@pytest.mark.parametrize("statistical", ["none", "first"])
def test_a_report_stating_more_than_the_claim_fails_on_every_pair(statistical):
    pairs = neighbour_battery()[:2]
    with pytest.raises(AssertionError) as exc:
        audit(
            _fedncm(1.0),
            epsilon=0.1,
            delta=1e-5,
            neighbours=pairs,
            statistical=statistical,
            draws=50,
            heldout=20,
        )
    assert str(exc.value).count("the release's report states epsilon 1 > claimed 0.1") == 2, str(exc.value)
    assert len(audit(_fedncm(1.0), epsilon=1.0, delta=1e-5, neighbours=pairs, statistical="none")) == 2


def test_audit_refuses_what_it_cannot_read():
    for kw, word in (
        ({"level": "clinet"}, "level must be 'record' or 'client'"),
        ({"epsilon": "1"}, "need epsilon > 0"),
        ({"delta": None}, "need epsilon > 0"),
    ):
        args = {"epsilon": 1.0, "delta": 1e-5, "statistical": "none", **kw}
        with pytest.raises(ConfigError, match=word):
            audit(_fedncm(1.0), **args)


def test_audit_release_needs_two_held_out_draws_a_side():
    run = lambda data, seed: {"arrays": [np.zeros(3)], "meta": (), "report": None}  # noqa: E731
    for heldout in (0, 1, 2.5):
        with pytest.raises(ConfigError, match="heldout must be an int >= 2"):
            audit_release(run, neighbour_battery()[:1], draws=20, heldout=heldout)
    with pytest.raises(ConfigError, match="pairs must be Neighbours"):
        audit_release(run, [("a", {}, {})], draws=0)


def test_audit_scores_refuses_thresholds_and_settings_that_mean_nothing():
    rng = np.random.default_rng(0)
    s0, s1 = rng.normal(size=500), rng.normal(size=500)  # the same distribution: mu = 0
    assert audit_scores(s0, s1, thresholds=[0.0]).mu_lb < 0.5
    for kw, word in (
        ({"thresholds": [np.nan]}, "thresholds must be a non-empty list of finite numbers"),
        ({"thresholds": []}, "thresholds must be a non-empty list"),
        ({"alpha": "0.05"}, "alpha must be a number"),
        ({"delta": None}, "delta must be a number"),
        ({"comparisons": -5}, "comparisons must be an int >= 1"),
        ({"claimed_mu": -1}, "claimed_mu must be a number >= 0"),
    ):
        with pytest.raises(ConfigError, match=word):
            audit_scores(s0, s1, **kw)


def test_noise_scale_test_refuses_samples_it_would_skip():
    rng = np.random.default_rng(0)
    thin = 0.01 * rng.normal(size=(50, 4, 5))  # 100x less noise than claimed
    with pytest.raises(ConfigError, match=r"samples\[0\] has shape \(50, 4, 5\)"):
        noise_scale_test([thin], 1.0)
    with pytest.raises(ConfigError, match="a list of arrays"):
        noise_scale_test(thin.reshape(50, -1), 1.0)
    assert noise_scale_test([thin.reshape(50, -1)], 1.0)["below"]  # read as it should be: flagged
    for kw in ({"claimed_std": np.nan}, {"alpha": 1.0}):
        with pytest.raises(ConfigError, match="claimed_std must be a finite number"):
            noise_scale_test([thin.reshape(50, -1)], **{"claimed_std": 1.0, **kw})


def test_draws_for_power_refuses_what_it_cannot_size():
    from privfed.audit import draws_for_power

    assert draws_for_power(0.155) > 1000
    for kw, word in (
        ({"ratio": np.inf}, "ratio must be finite"),
        ({"alpha": 0}, "alpha must lie in"),
        ({"alpha": 5}, "alpha must lie in"),
        ({"thresholds": 0}, "thresholds must be an int >= 1"),
        ({"claimed_mu": 1e-300}, "more draws than can be counted"),
        ({"claimed_mu": "0.5"}, "claimed_mu must be a number"),
        ({"claimed_mu": True}, "claimed_mu must be a number"),
    ):
        with pytest.raises(ConfigError, match=word):
            draws_for_power(**{"claimed_mu": 0.155, **kw})


def test_audit_refuses_draws_scale_and_a_direction_it_cannot_use():
    from privfed.audit import audit as audit_mechanism

    def release(side, n, rng):
        return rng.normal(size=(n, 3)) + side

    kw = dict(reference=np.zeros(3), direction=np.ones(3), scale=1.0, rng=np.random.default_rng(0))
    assert audit_mechanism(release, draws=200, **kw).mu_lb > 0
    for bad, word in (
        ({"draws": 0}, "draws must be an int >= 1"),
        ({"draws": 2.7}, "draws must be an int >= 1"),
        ({"scale": "1"}, "scale must be a number"),
        ({"direction": np.ones(4)}, "direction has 4 values and reference 3"),
    ):
        with pytest.raises(ConfigError, match=word):
            audit_mechanism(release, **{"draws": 200, **kw, **bad})


def test_held_out_draws_are_checked_only_for_the_statistical_test():
    """The review of the checks above: audit_sweep's default (draws=0, heldout=0) stopped at its first pair."""
    run = lambda data, seed: {"arrays": [np.zeros(3)], "meta": (), "report": None}  # noqa: E731
    assert [r.verdict for r in audit_release(run, neighbour_battery()[:1], draws=0, heldout=0)] == [
        "metadata only"
    ]
    with pytest.raises(ConfigError, match="scale_alpha must lie in"):
        audit_release(run, neighbour_battery()[:1], draws=0, heldout=0, scale_alpha=0.6)


@pytest.mark.parametrize("statistical", ["none", "first"])
def test_a_release_that_refuses_every_draw_is_not_said_to_report_no_guarantee(statistical):
    from privfed.errors import InputError

    def refuses(data, seed):  # a refusal whose text varies from draw to draw: no report is ever seen
        raise InputError(f"the noisy total {np.random.default_rng().normal():.3f} is too small to release")

    out = audit(refuses, epsilon=1.0, delta=1e-5, neighbours=neighbour_battery()[:1], draws=40, heldout=20,
                statistical=statistical)  # fmt: skip
    assert [r.verdict for r in out] == ["metadata only" if statistical == "none" else "no claim"]
