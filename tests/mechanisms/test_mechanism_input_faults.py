"""Bad arguments to the DP helpers, the fixed-point ring and the secure sums' noise hook: each is refused in
one line naming the argument, never answered with a number, a NaN or a raw numpy error."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mechanisms as M
from mechanisms import GaussianMechanism
from mechanisms.secagg import fixed_point as fp
from mechanisms.secagg import masked_sum
from privfed.errors import ConfigError, InputError

NAN = float("nan")


# ------------------------------------------------------------------------------------ calibrate_round_mu
@pytest.mark.parametrize("accountant", ["prv", "rdp"])
def test_calibrate_round_mu_checks_the_budget_on_the_opacus_paths(accountant):
    """A NaN epsilon got a finite noise multiplier from opacus; a NaN delta failed after ~30 s as 'budget
    too low'."""
    with pytest.raises(ConfigError, match="epsilon"):
        M.calibrate_round_mu(NAN, 1e-5, sampling_rate=0.5, accountant=accountant)
    with pytest.raises(ConfigError, match="delta"):
        M.calibrate_round_mu(1.0, NAN, sampling_rate=0.5, accountant=accountant)
    with pytest.raises(ConfigError, match="epsilon"):
        M.calibrate_round_mu(-1.0, 1e-5, sampling_rate=0.5, accountant=accountant)


# ----------------------------------------------------------------------------------------- fixed point
def test_decode_refuses_fractional_and_non_finite_ring_values():
    """Floats were truncated ([1.7, -3.2] -> [1, -3]) and NaN read as -2^63."""
    for bad in (np.array([1.7, -3.2]), np.array([NAN]), np.array([math.inf]), np.array(["1"])):
        with pytest.raises(InputError, match="ring_values"):
            fp.decode(bad, 0)


def test_decode_keeps_integer_words_and_whole_floats():
    x = np.array([1.5, -2.25, 0.0, 1e6])
    words = fp.encode(x, 4)
    for given in (words, words.view(np.int64), words.view(np.int64).astype(np.float64)):
        assert fp.decode(given, 4).tolist() == x.tolist()


@pytest.mark.parametrize("clients", [-5, 0, 2.5, True, "3"])
def test_check_ring_bound_refuses_a_client_count_that_is_no_count(clients):
    """-5 clients gave a negative bound that passed, and 2.5 clients were accepted."""
    with pytest.raises(ConfigError, match="num_clients"):
        fp.check_ring_bound(1.0, clients, 16)


@pytest.mark.parametrize("noise", [NAN, -1.0, math.inf])
def test_check_ring_bound_names_a_bad_noise_bound(noise):
    """A NaN noise_bound gave an overflow message about the clients' values."""
    with pytest.raises(ConfigError, match="noise_bound"):
        fp.check_ring_bound(1.0, 3, 16, noise_bound=noise)


def test_check_ring_bound_valid_calls_unchanged():
    assert fp.check_ring_bound(1.0, 3, 16) == 3 * (2.0**16 + 0.5)
    assert fp.check_ring_bound(1.0, np.int64(3), 16, noise_bound=5.0) == 3 * (2.0**16 + 0.5) + 5.0


# ----------------------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("bad", [NAN, math.inf, -math.inf])
def test_clip_coordinates_refuses_non_finite_features_as_clip_l2_does(bad):
    """NaN passed through coordinate clipping ([[nan, 5]] -> [[nan, 1]])."""
    F = np.array([[bad, 5.0]])
    with pytest.raises(InputError, match="features"):
        M.clip_l2(F, 1.0)
    with pytest.raises(InputError, match="features"):
        M.clip_coordinates(F, 1.0)
    # no bound (c = inf) is no clipping, not a way past the check
    with pytest.raises(InputError, match="features hold NaN/inf"):
        M.clip_l2(F, math.inf)
    assert M.clip_coordinates(np.array([[0.5, 5.0, -7.0]]), 1.0).tolist() == [[0.5, 1.0, -1.0]]
    assert M.clip_l2(np.array([[3.0, 4.0]]), math.inf).tolist() == [[3.0, 4.0]]


# ------------------------------------------------------------------------------- classic calibration
def test_classic_calibration_refuses_an_epsilon_whose_sigma_overflows():
    """epsilon=1e-320 gave sigma = inf; the fit then blamed the data."""
    with pytest.raises(ConfigError, match="epsilon"):
        GaussianMechanism(epsilon=1e-320, delta=1e-5, clip=3.0, calibration="classic")
    with pytest.raises(ConfigError, match="epsilon"):
        M.classic_sigma(1e-310, 1e-5)
    assert math.isfinite(M.classic_sigma(1e-300, 1e-5))
    # refused for the noise it would need, not for being small: 1e-302 still has a finite sigma
    tiny = GaussianMechanism(epsilon=1e-302, delta=1e-5, clip=3.0, calibration="classic").sigma
    assert all(math.isfinite(v) and v > 1e300 for v in tiny.values())
    sigma = GaussianMechanism(epsilon=0.5, delta=1e-5, clip=3.0, calibration="classic").sigma
    assert all(math.isfinite(v) and v > 0 for v in sigma.values())


def test_a_sigma_beyond_float64_is_refused_naming_epsilon():
    """Classic calibration at the epsilon floor over 2**53 rounds: each round's sigma overflows."""
    with pytest.raises(ConfigError, match="epsilon"):
        GaussianMechanism(epsilon=1e-300, delta=1e-5, clip=3.0, calibration="classic", rounds=2**53)


# --------------------------------------------------------------------------------------- DP helpers
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: M.gdp_epsilon(True, 1e-5), "mu"),
        (lambda: M.gdp_epsilon("1", 1e-5), "mu"),
        (lambda: M.gdp_epsilon(None, 1e-5), "mu"),
        (lambda: M.gaussian_delta(True, True, True), "epsilon"),
        (lambda: M.gaussian_delta(1.0, "2"), "sigma"),
        (lambda: M.gaussian_delta(None, 1.0), "epsilon"),
        (lambda: M.gaussian_delta(1.0, 2.0, "1"), "sensitivity"),
        (lambda: M.gaussian_delta(1.0, np.array([1.0, 2.0])), "sigma"),
    ],
)
def test_dp_helpers_refuse_non_numbers_naming_the_argument(call, name):
    """Bools were read as 1; strings and None raised a bare TypeError from a comparison."""
    with pytest.raises(ConfigError, match=name):
        call()


def test_dp_helpers_valid_calls_unchanged():
    assert M.gaussian_delta(np.float64(1.0), 3.7306) == M.gaussian_delta(1.0, 3.7306)
    assert M.gdp_epsilon(np.float64(0.5), 1e-5) == M.gdp_epsilon(0.5, 1e-5)


# ------------------------------------------------------------------------------- secure sums' add_noise
def _bad_hooks():
    return [
        (lambda r, s, g: r[:1], "add_noise"),
        ("x", "add_noise"),
        (lambda r, s, g: None, "add_noise"),
        (lambda r, s, g: r + np.nan, "add_noise"),
        (lambda r, s, g: r.astype(str), "add_noise"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_hooks())))
def test_ckks_sum_names_a_bad_add_noise(case):
    """A short row was a raw 'cannot reshape', a string "'str' object is not callable", None 'NaN/inf'."""
    pytest.importorskip("tenseal")
    from mechanisms.secagg.ckks import ckks_sum

    hook, name = _bad_hooks()[case]
    S = np.array([[1.5, 2.0], [0.25, -1.0], [3.0, 4.0]])
    with pytest.raises(ConfigError, match=name):
        ckks_sum(S, noise_std=1.0, add_noise=hook)


@pytest.mark.parametrize("case", range(len(_bad_hooks())))
def test_masked_sum_names_a_bad_add_noise(case):
    hook, name = _bad_hooks()[case]
    S = np.array([[1.5, 2.0], [0.25, -1.0], [3.0, 4.0]])
    with pytest.raises(ConfigError, match=name):
        masked_sum(S, noise_std=1.0, add_noise=hook, key_seed=1)


def test_masked_sum_with_a_good_add_noise_still_sums():
    S = np.array([[1.5, 2.0], [0.25, -1.0], [3.0, 4.0]])
    res = masked_sum(S, noise_std=1e-9, add_noise=lambda r, s, g: r + 0.0, key_seed=1)
    assert np.abs(res.total - S.sum(axis=0)).max() <= 3 * 2.0**-32


def test_a_noise_std_past_float64_is_refused_naming_noise_std_not_an_inner_bound():
    """noise_std=1e300 made the noise shares' bound inf, refused as 'noise_bound must be finite', a name the
    caller never passed."""
    from mechanisms.secagg import masked_sum

    X = np.random.default_rng(0).normal(size=(5, 3))
    for std in (1e200, 1e300):
        with pytest.raises(InputError, match="could overflow the 2\\^64 ring.*lower noise_std$") as exc:
            masked_sum(X, noise_std=std, key_seed=1)
        assert "noise_bound" not in str(exc.value)
