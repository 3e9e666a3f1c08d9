"""Bad parameters and inputs of the attacks: one-line errors naming the argument, never a silent wrong number.

Small synthetic federations (non-negative features, 3 classes, 120 records),
so every test runs in well under a second.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attacks
from attacks.metrics import tpr_at_fpr
from attacks.view import GroundTruth, NoiseSpec, PublicData, clip_rows
from privfed.errors import ConfigError, InputError

N, D, C = 120, 6, 3


def _data(seed=0):
    rng = np.random.default_rng(seed)
    F = np.abs(rng.normal(size=(N, D))) + 0.1
    y = np.arange(N) % C
    H = np.abs(rng.normal(size=(60, D))) + 0.1
    P = np.abs(rng.normal(size=(60, D))) + 0.1
    return F, y, H, np.arange(60) % C, PublicData(labels=np.arange(60) % C, features=P)


def _scenario(method="fedncm", clients=None, **kw):
    F, y, H, yh, pub = _data()
    clients = np.arange(N) % 40 if clients is None else clients  # 3 records per client, one per class
    return attacks.scenario(
        method, F, y, clients, holdout_features=H, holdout_labels=yh, public=pub, rng=0, **kw
    )


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------------------- 1. NoiseSpec
@pytest.mark.parametrize(
    "kw, word",
    [
        ({"blocks": ()}, "blocks"),
        ({"epsilon": -math.inf}, "epsilon"),
        ({"epsilon": True}, "epsilon"),
        ({"epsilon": "1"}, "epsilon"),
        ({"clip": True}, "clip"),
        ({"clip": "1"}, "clip"),
    ],
)
def test_noise_spec_gaussian_refuses_bad_settings(kw, word):
    args = {"epsilon": 1, "delta": 1e-5, "clip": 30.0, **kw}
    with pytest.raises(ConfigError) as exc:
        NoiseSpec.gaussian(**args)
    assert word in _one_line(exc)


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"sigma": {"sums": "1"}}, "sigma"),
        ({"sigma": {"sums": True}}, "sigma"),
        ({"sigma": None}, "sigma"),
        ({"clip": True}, "clip"),
        ({"clip": "1"}, "clip"),
    ],
)
def test_noise_spec_refuses_bad_fields(kw, word):
    with pytest.raises(ConfigError) as exc:
        NoiseSpec(**kw)
    assert word in _one_line(exc)


# ----------------------------------------------------------------------------- 2. max_targets, fprs
@pytest.mark.parametrize("attack", ["tracing", "subspace"])
@pytest.mark.parametrize("value", [-5, True, 2.7, "10", 0])
def test_max_targets_must_be_a_positive_int(attack, value):
    with pytest.raises(ConfigError) as exc:
        attacks.get(attack, max_targets=value)
    assert "max_targets" in _one_line(exc)


@pytest.mark.parametrize("attack", ["tracing", "subspace"])
@pytest.mark.parametrize("value", [(-0.1,), (2.0,), 0.01, (), (math.nan,), (True,)])
def test_fprs_must_be_rates_in_unit_interval(attack, value):
    with pytest.raises(ConfigError) as exc:
        attacks.get(attack, fprs=value)
    assert "fprs" in _one_line(exc)


@pytest.mark.parametrize("fpr", [math.nan, -0.1, 2.0, True, "0.01"])
def test_tpr_at_fpr_refuses_a_bad_rate(fpr):
    scores, members = np.arange(10.0), np.arange(10) >= 5
    with pytest.raises(ConfigError) as exc:
        tpr_at_fpr(scores, members, fpr)
    assert "fpr" in _one_line(exc)


# ----------------------------------------------------------------------------- 3. target labels, ids, rows
def _targets(view):
    F, y, *_ = _data()
    return F[:4], y[:4]


@pytest.mark.parametrize("attack, method", [("tracing", "fedncm"), ("subspace", "fedcgs")])
@pytest.mark.parametrize("bad", [-1, 1.7, True, 12])
def test_target_labels_must_be_classes_of_the_view(attack, method, bad):
    view, _ = _scenario(method)
    Y, lab = _targets(view)
    lab = lab.tolist()
    lab[0] = bad
    kw = {"test": "inner"} if attack == "tracing" else {}
    with pytest.raises(InputError) as exc:
        attacks.get(attack, **kw).run(view, np.random.default_rng(0), targets=Y, target_labels=lab)
    msg = _one_line(exc)
    assert "target_labels" in msg and ("0..2" in msg or "whole numbers" in msg or "integers" in msg)


@pytest.mark.parametrize("ids", [[0, 1], [0, 1, 2, 10**6]])
def test_tracing_target_ids_of_wrong_length_or_out_of_range(ids):
    view, truth = _scenario()
    Y, lab = _targets(view)
    att = attacks.get("tracing", test="inner")
    with pytest.raises(InputError) as exc:
        res = att.run(view, np.random.default_rng(0), targets=Y, target_labels=lab, target_ids=ids)
        att.score(res, truth)
    assert "target_ids" in _one_line(exc)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_tracing_refuses_non_finite_targets(bad):
    view, _ = _scenario()
    Y, lab = _targets(view)
    Y = np.full_like(Y, bad)
    with pytest.raises(InputError) as exc:
        attacks.get("tracing", test="inner").run(view, np.random.default_rng(0), targets=Y, target_labels=lab)
    assert "targets" in _one_line(exc)


@pytest.mark.parametrize("rows", [[-1], [0.5], [999], [True]])
def test_unmixing_rows_must_be_released_rows(rows):
    view, _ = _scenario("fedcgs")
    with pytest.raises(InputError) as exc:
        attacks.get("unmixing").run(view, np.random.default_rng(0), rows=rows)
    assert "rows" in _one_line(exc)


# ----------------------------------------------------------------------------- 4-6. build-time parameters
@pytest.mark.parametrize(
    "attack, kw, word",
    [
        ("subspace", {"rel_tol": math.nan}, "rel_tol"),
        ("subspace", {"rel_tol": -1}, "rel_tol"),
        ("subspace", {"edge": -1}, "edge"),
        ("singleton", {"tolerance": "x"}, "tolerance"),
        ("singleton", {"tolerance": -1}, "tolerance"),
        ("differencing", {"max_added": 0}, "max_added"),
        ("differencing", {"max_added": -3}, "max_added"),
        ("differencing", {"max_added": "a"}, "max_added"),
        ("unmixing", {"max_samples": "x"}, "max_samples"),
        ("unmixing", {"max_clients": 0}, "max_clients"),
        ("unmixing", {"max_clients": -1}, "max_clients"),
    ],
)
def test_bad_parameters_are_refused_when_the_attack_is_built(attack, kw, word):
    with pytest.raises(ConfigError) as exc:
        attacks.get(attack, **kw)
    assert word in _one_line(exc)


def test_unmixing_says_no_client_fits_max_samples():
    view, truth = _scenario("fedcgs")  # every client holds 3 records
    with pytest.raises(InputError) as exc:
        attacks.evaluate("unmixing", view, truth, max_samples=2)
    msg = _one_line(exc)
    assert "max_samples=2" in msg and "raise max_samples" in msg


# ----------------------------------------------------------------------------- 7. GroundTruth
def _truth_kw():
    F, y, H, yh, _ = _data()
    return {
        "features": F,
        "labels": y,
        "clients": np.arange(N) % 40,
        "holdout_features": H,
        "holdout_labels": yh,
    }


@pytest.mark.parametrize(
    "change, word",
    [
        ({"images": np.zeros((N - 1, 8, 8))}, "images"),
        ({"holdout_features": np.full((60, D), math.nan)}, "holdout_features"),
        ({"features": np.full((N, D), math.nan)}, "GroundTruth.features"),
        ({"clients": np.arange(N) % 40 + 0.7}, "clients"),
    ],
)
def test_ground_truth_refuses_bad_data(change, word):
    with pytest.raises(InputError) as exc:
        GroundTruth(**{**_truth_kw(), **change})
    assert word in _one_line(exc)


def test_evaluate_refuses_a_missing_truth():
    view, _ = _scenario()
    with pytest.raises(InputError) as exc:
        attacks.evaluate("singleton", view, None)
    assert "GroundTruth" in _one_line(exc)


# ----------------------------------------------------------------------------- 8. strongest
@pytest.mark.parametrize("fn", [attacks.strongest, attacks.strongest_flat])
@pytest.mark.parametrize("rng", [1.5, "7", -1, True])
def test_strongest_checks_rng_as_evaluate_does(fn, rng):
    view, truth = _scenario()
    with pytest.raises(ConfigError) as exc:
        fn("tracing", view, truth, rng)
    assert "rng" in _one_line(exc)


def test_strongest_refuses_unknown_parameters():
    view, truth = _scenario()
    with pytest.raises(ConfigError) as exc:
        attacks.strongest_flat("tracing", view, truth, 0, bogus=3)
    assert "bogus" in _one_line(exc)


# ----------------------------------------------------------------------------- 9. labels and num_clients
def test_subspace_rows_name_their_test():
    from privfed.commands.attack.report import summary_line

    view, truth = _scenario("fedcgs", clients=np.arange(N) % 60)  # 2 records per client: n < d
    row = attacks.evaluate("subspace", view, truth, max_targets=40)
    line = summary_line(
        {**row, "placement": "none", "protocol": "none", "method": "fedcgs", "epsilon": math.inf, "seed": 0}
    )  # the command adds the run's columns
    assert "[test]" not in line and "auc[subspace]" in line


@pytest.mark.parametrize("k", [True, 2.5])
def test_scenario_refuses_bool_or_fractional_num_clients(k):
    with pytest.raises(ConfigError) as exc:
        _scenario(clients=np.arange(N) % 2, num_clients=k)
    assert f"got {k!r}" in _one_line(exc)


# ----------------------------------------------------------------------------- 10. clipping is not protection
def _clip():
    F, *_ = _data()
    return float(np.median(np.linalg.norm(F, axis=1)))


def test_singleton_scores_against_the_clipped_records():
    c = _clip()
    view, truth = _scenario(privacy=NoiseSpec(clip=c))
    got = attacks.evaluate("singleton", view, truth)
    clipped = GroundTruth(features=clip_rows(truth.features, c), labels=truth.labels, clients=truth.clients)
    ref = attacks.get("singleton").score(attacks.get("singleton").run(view), clipped)
    assert got == ref
    assert got["exposed_fraction"] == 1.0 and got["candidate_precision"] == 1.0  # every record is a singleton


def test_differencing_is_exact_under_clipping_alone():
    c = _clip()
    view, truth = _scenario(privacy=NoiseSpec(clip=c))
    got = attacks.evaluate("differencing", view, truth, rng=0)
    assert got["cells"] == 40 and got["exact_fraction"] == 1.0
    assert got["mean_relative_error"] < 1e-9


def test_a_coordinate_clipped_release_is_scored_as_it_was_clipped():
    """A mechanism clipping each coordinate gave the view no clip (NoiseSpec.clip None), so an exact
    coordinate-clipped release was scored against the unclipped records: 0 exposed, cosine 0.87."""
    from mechanisms import GaussianMechanism

    b = 0.5  # below most coordinates of _data (|N(0, 1)| + 0.1): every record is changed by the clip
    mech = GaussianMechanism(epsilon=math.inf, delta=1e-5, clip=b, clip_norm="coordinate", dim=D)
    view, truth = _scenario(privacy=mech)
    assert (view.noise.clip, view.noise.clip_norm) == (b, "coordinate")
    got = attacks.evaluate("singleton", view, truth)
    assert got["exposed_fraction"] == 1.0 and got["candidate_precision"] == 1.0
    assert attacks.evaluate("differencing", view, truth, rng=0)["exact_fraction"] == 1.0


@pytest.mark.parametrize("clip, blocks", [(1e-90, ("second",)), (1e-200, ("sums",)), (1e200, ("counts",))])
def test_a_gaussian_spec_never_calibrates_to_zero_or_overflows(clip, blocks):
    """clip 1e-200 gave sigma 0 labelled (1, 1e-05)-DP, clip^4 at 1e-90 underflowed the same way, and 1e200 was
    a raw OverflowError; the mechanism's own clip range applies, and the sensitivities join without underflow."""
    if 1e-100 <= clip <= 1e100:
        spec = NoiseSpec.gaussian(epsilon=1.0, delta=1e-5, clip=clip, blocks=blocks)
        from attacks.noise_spec import gaussian_sigma

        # a ratio: approx's absolute tolerance would take 0 for 3.7e-180
        assert spec.sigma["second"] / (clip * clip) == pytest.approx(gaussian_sigma(1.0, 1e-5), rel=1e-12)
    else:
        with pytest.raises(ConfigError, match="is below 1e-100" if clip < 1 else r"is beyond 1e\+100"):
            NoiseSpec.gaussian(epsilon=1.0, delta=1e-5, clip=clip, blocks=blocks)


@pytest.mark.parametrize("word, same_as", [("none", False), ("mask", True)])
def test_secure_agg_takes_the_commands_words_as_the_command_does(word, same_as):
    """secure_agg="none" was truthy: the server saw only the sum and the singleton attack reported exposure 0."""
    F, y, H, yh, pub = _data()
    k = np.arange(N) % 40
    got = attacks.evaluate_federation("singleton", "fedncm", F, y, k, secure_agg=word)
    want = attacks.evaluate_federation("singleton", "fedncm", F, y, k, secure_agg=same_as)
    same = got.keys() == want.keys() and all(
        got[m] == want[m] or (got[m] != got[m] and want[m] != want[m]) for m in got
    )
    assert same and (got["exposed_fraction"] > 0) is (word == "none"), (got, want)


@pytest.mark.parametrize("value", ["no", "false", "MASK", 1, object()])
def test_secure_agg_refuses_what_it_does_not_know(value):
    F, y, *_ = _data()
    with pytest.raises(ConfigError, match="secure_agg must be True, False, 'none', 'mask', 'ckks'") as exc:
        attacks.scenario("fedncm", F, y, np.arange(N) % 40, secure_agg=value)
    _one_line(exc)


@pytest.mark.parametrize("value", ["foo", {"eps": 1}, 1.0])
def test_privacy_must_be_a_noise_spec_or_a_mechanism(value):
    F, y, *_ = _data()
    with pytest.raises(ConfigError, match="privacy must be a NoiseSpec or a mechanism") as exc:
        attacks.scenario("fedncm", F, y, np.arange(N) % 40, privacy=value)
    _one_line(exc)


def test_a_mechanism_with_a_named_secure_sum_runs():
    """A mechanism with secure_agg='mask' was an AttributeError ('str' object has no attribute 'secure_sum')."""
    from mechanisms import GaussianMechanism

    F, y, *_ = _data()
    view, _ = attacks.scenario(
        "fedncm",
        F,
        y,
        np.arange(N) % 40,
        privacy=GaussianMechanism(epsilon=1.0, delta=1e-5, clip=5.0),
        secure_agg="mask",
    )
    assert view.secure_agg is True and not view.per_client


def test_metrics_refuse_non_finite_images_and_vectors():
    """A NaN reconstruction scored inf dB (an exact copy) and a NaN cosine scored 0."""
    from attacks.metrics import cosine, psnr

    with pytest.raises(InputError, match="NaN or inf"):
        psnr(np.full((1, 8, 8), np.nan), np.zeros((1, 8, 8)))
    with pytest.raises(InputError, match="NaN or inf"):
        cosine(np.full((1, 3), np.nan), np.ones((1, 3)))
    assert psnr(np.zeros((1, 8, 8)), np.zeros((1, 8, 8)))[0] == np.inf  # an exact copy, as documented


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"lr": -1.0}, "lr must be a finite number > 0"),
        ({"lr": math.nan}, "lr must be a finite number > 0"),
        ({"tv": math.nan}, "tv must be a finite number >= 0"),
        ({"tv": -5.0}, "tv must be a finite number >= 0"),
        ({"anchor": "x"}, "anchor must be a finite number >= 0"),
        ({"max_count": -1}, "max_count must be a finite number > 0"),
        ({"joint_lrs": (0.1, -1)}, "joint_lrs[1] must be a finite number > 0"),
    ],
)
def test_inversion_settings_are_checked_when_built(kw, word):
    """lr, tv and anchor reached torch's or scipy's errors; tv = -5 and max_count = -1 ran."""
    with pytest.raises(ConfigError) as exc:
        attacks.get("inversion", **kw)
    assert word in _one_line(exc)


def test_evaluate_refuses_what_is_not_a_view_and_attack_params_that_are_not_a_dict():
    F, y, H, yh, pub = _data()
    view, truth = _scenario()
    with pytest.raises(InputError, match="view must be a ServerView"):
        attacks.evaluate("tracing", "x", truth)
    with pytest.raises(ConfigError, match="attack_params must be a dict"):
        attacks.evaluate_federation("labels", "fedncm", F, y, np.arange(N) % 40, attack_params=[1])


def test_inversion_numbers_may_be_floats_numpy_scalars_or_0d_arrays():
    """max_count is a bound on released counts (compared as a float): 2.5 ran before the checks and must still."""
    for kw in (
        {"max_count": 2.5},
        {"max_count": np.float64(4)},
        {"lr": np.array(0.1)},
        {"joint_lrs": (np.float32(0.02),)},
    ):
        attacks.get("inversion", **kw)
