"""What multi-round FedLog refuses, and what it says about the releases it makes (a fault battery's finds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privfed.errors import ConfigError, InputError, PrivfedError
from privfed.rounds import RoundsConfig, run_rounds
from privfed.rounds.release import RoundRelease, RoundsDP

FAST = {"clients": 3, "rounds": 2, "local_epochs": 1, "families": ("mlp",), "init": "scratch"}


def _stat(K: int, d: int, b: float, g: np.random.Generator) -> np.ndarray:
    """(K, 2, d + 1) statistics clipped records give: counts, and sums within count x b per coordinate."""
    counts = g.integers(1, 6, size=(K, 2)).astype(float)
    return np.concatenate([counts[..., None], counts[..., None] * g.uniform(-b, b, size=(K, 2, d))], axis=2)


def test_a_round_release_refuses_releases_its_guarantee_does_not_cover():
    """RoundRelease made ten releases of a RoundsDP for two (its guarantee then read "over 10 release(s) ...
    total budget over 2"), and released sums of unclipped features (2e6 against a bound of 20) with the
    guarantee printed beside them."""
    g = np.random.default_rng(0)
    dp = RoundsDP(epsilon=1.0, delta=1e-5, clip=2.0, rounds=2, bodies_trained=False, dim=4)
    release = RoundRelease(dp, "none", num_clients=3)
    bad = _stat(3, 4, 2.0, g)
    bad[1, 0, 2] = bad[1, 0, 0] * 2.0 * 1.01  # one coordinate 1% past count x clip
    with pytest.raises(
        InputError, match=r"client 1's statistic for class 0 sums to .* past its .* records x clip 2"
    ):
        release(bad, g)
    negative = _stat(3, 4, 2.0, g)
    negative[2, 1, 0] = -1.0
    with pytest.raises(InputError, match="negative count"):
        release(negative, g)
    for _ in range(2):  # within the bound, at it (every feature at +-b): released
        ok = _stat(3, 4, 2.0, g)
        ok[0, 0, 1:] = ok[0, 0, 0] * 2.0
        release(ok, g)
    with pytest.raises(ConfigError, match=r"covers 2 release\(s\) and 2 were made"):
        release(_stat(3, 4, 2.0, g), g)
    assert len(dp.traces) == 2 and "over 2 release(s)" in dp.report().guarantee


def test_the_one_shot_baseline_says_it_is_a_release_of_its_own():
    """The one-shot baseline spent its own (eps, delta) on the same records while the run's notes named
    only the non-private baselines."""
    res = run_rounds(**FAST, epsilon=1.0, noise_seed=0, baselines=("oneshot",))
    base = res.baselines["oneshot"]["privacy"]
    assert base is not None and base.epsilon > 0
    said = [n for n in res.notes if n.startswith("the one-shot baseline is a release of its own")]
    assert len(said) == 1 and f"({base.epsilon:.4g}, 1e-05)-DP" in said[0]
    assert not any("one-shot baseline" in n for n in run_rounds(**FAST, baselines=("oneshot",)).notes)


def test_rounds_past_what_the_accounting_holds_are_refused_before_any_training():
    """tradeoff --rounds 10**20 --eps 1 ran its release-free run first, for ever: the count is refused at once."""
    with pytest.raises(ConfigError, match=r"rounds must be an integer in \[1, 2\*\*53\]"):
        RoundsConfig(**{**FAST, "rounds": 10**20}).validate()


def test_a_local_epochs_0_run_is_replayed_from_its_record(tmp_path):
    """--local-epochs 0 ran, but --config of its results.json refused it (>= 1 there)."""
    from privfed.tradeoff import main

    out = tmp_path / "a"
    argv = ["--method", "fedlog", "--rounds", "2", "--clients", "3", "--local-epochs", "0", "--eps", "inf"]
    assert main([*argv, "--seeds", "1", "--quiet", "--no-plot", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())
    assert (
        main(["--config", str(out / "results.json"), "--quiet", "--no-plot", "--out", str(tmp_path / "b")])
        == 0
    )


def test_the_estimator_names_labels_that_cannot_be_ordered():
    from privfed.estimators import FederatedHeadClassifier

    X = np.random.default_rng(0).random((60, 4))
    with pytest.raises(
        PrivfedError, match=r"y mixes labels of types \['int', 'str'\] that cannot be ordered"
    ):
        FederatedHeadClassifier().fit(X, np.array(["a", 1] * 30, dtype=object))
    with pytest.raises(PrivfedError, match=r"Expected 2D array.*one feature: X.reshape\(-1, 1\)"):
        FederatedHeadClassifier().fit(X[:, 0], np.arange(60) % 3)


def test_features_clipped_in_float32_pass_the_release_check_and_l2_is_checked_in_norm():
    """The bodies clip in float32: a feature saturated at clip 0.1 is float32(0.1), 1.5e-8 above it, and the
    check refused such runs; under clip_norm='l2' it checked coordinates only (a norm of 7.2 passed clip 1)."""
    for clip in (0.1, 0.3):
        res = run_rounds(clients=4, rounds=1, local_epochs=0, epsilon=1.0, clip=clip, noise_seed=0)
        assert res.privacy is not None and len(res.history) == 1
    dp = RoundsDP(epsilon=1.0, delta=1e-5, clip=1.0, clip_norm="l2", rounds=1, bodies_trained=False, dim=64)
    A = np.zeros((1, 2, 65))
    A[0, :, 0], A[0, :, 1:] = 1.0, 0.9  # one record a class, every coordinate 0.9: norm 7.2
    with pytest.raises(InputError, match=r"sums to 7\.2 in norm, past its 1 records x clip 1"):
        RoundRelease(dp, "none", num_clients=1).release(A, np.random.default_rng(0))
    A[0, :, 1:] = 0.9 / np.sqrt(64 * 0.81)  # norm 1: released
    RoundRelease(dp, "none", num_clients=1).release(A, np.random.default_rng(0))


def test_a_zero_initial_head_is_a_setting():
    assert RoundsConfig(**FAST, head_init_scale=0.0).validate().head_init_scale == 0.0


def test_the_per_round_functions_refuse_bad_arguments_in_a_line():
    """The per-round API (privfed.rounds' own loop, for users who run it themselves) gave numpy's, torch's
    and Python's errors, or took a bad value: assign_families(-1) was [], epochs=-3 trained nothing."""
    import torch

    from privfed.rounds import (
        assign_families,
        client_statistic,
        client_update,
        initial_head,
        make_body,
        noise_generator,
        server_step,
    )

    dp = RoundsDP(epsilon=1.0, delta=1e-5, clip=2.0, rounds=1, bodies_trained=False)
    body = make_body("mlp")
    x = torch.zeros((4, 1, 8, 8))
    nan_x = x.clone()
    nan_x[2, 0, 3, 3] = float("nan")
    huge = make_body("mlp")
    with torch.no_grad():
        for p in huge.parameters():
            p.fill_(1e30)
    cases = [
        (lambda: initial_head(-1, 0), r"num_classes must be an integer in \[1, 2\*\*53\]"),
        (lambda: initial_head(10, -1), "seed must be an integer"),
        (lambda: initial_head(10, 0, dim=-5), "dim must be an integer"),
        (lambda: initial_head(10, 0, scale=float("nan")), "scale must be finite and >= 0, got nan"),
        (lambda: noise_generator(-1, 5), "noise_seed must be an integer"),
        (lambda: assign_families(-1, ("mlp",), 0), "num_clients must be an integer"),
        (lambda: assign_families(3, ("mlp",), -1), "seed must be an integer"),
        (lambda: server_step(np.ones(65)), r"total must be the \(C, d \+ 1\) released sum"),
        (lambda: server_step("abc"), r"total must be the \(C, d \+ 1\) released sum"),
        (lambda: RoundRelease(dp, "none", num_clients="3"), "num_clients must be an integer"),
        (lambda: RoundRelease(dp, "none", num_clients=0), "num_clients must be an integer"),
        (
            lambda: RoundRelease(dp, "none", num_clients=1).release(np.zeros((1, 10, 65)), None),
            "rng must be a numpy.random.Generator",
        ),
        (
            lambda: RoundRelease(dp, "none", num_clients=1).release("x", np.random.default_rng(0)),
            "statistics must be a",
        ),
        (
            lambda: client_statistic(body, x, np.array([0, 1, 2, 12])),
            r"y must hold one label in 0..9 per sample of x \(4\)",
        ),
        (lambda: client_statistic(body, x, np.array([0, 1, -1, 2])), "y must hold one label"),
        (lambda: client_statistic(body, x, np.array([0, 1])), "y must hold one label"),
        # before: NaN ran through the body into the upload's sums without a word
        (lambda: client_statistic(body, nan_x, np.array([0, 1, 2, 1])), "x holds 1 NaN or infinite value"),
        (lambda: client_statistic(body, nan_x.numpy(), np.array([0, 1, 2, 1])), "x holds 1 NaN"),
        (
            lambda: client_statistic(huge, x + 1, np.array([0, 1, 2, 1])),
            "features of this client's images are not finite",
        ),
    ]
    opt = torch.optim.SGD(body.parameters(), lr=0.1)
    update = dict(head_eta=np.zeros((10, 65)), generator=torch.Generator().manual_seed(0))
    cases += [
        (
            lambda: client_update(
                body, opt, x, torch.zeros(4, dtype=torch.long), epochs=1, batch_size=0, **update
            ),
            "batch_size must be an integer",
        ),
        (
            lambda: client_update(
                body, opt, x, torch.zeros(4, dtype=torch.long), epochs=-3, batch_size=2, **update
            ),
            "epochs must be an integer",
        ),
    ]
    for call, match in cases:
        with pytest.raises(PrivfedError, match=match):
            call()


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"batch_size": -1}, "batch_size must be an integer >= 1"),  # trained on nothing, silently
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"batch_size": 2.5}, "batch_size must be an integer >= 1"),
        ({"batch_size": True}, "batch_size must be an integer >= 1"),
        ({"clients": 0}, "clients must be an integer >= 1"),
        ({"baselines": None}, "baselines must be a list of names"),
        ({"families": None}, "families must be a list of names"),
        ({"epsilonn": 1.0}, r"unknown setting\(s\) \['epsilonn'\]"),
    ],
)
def test_run_rounds_refuses_settings_a_battery_found_unchecked(kw, word):
    with pytest.raises(ConfigError, match=word):
        run_rounds(**{"clients": 2, "rounds": 2, "families": ("mlp",), "init": "scratch", **kw})


def test_run_rounds_reads_one_name_as_a_list_of_one_and_refuses_a_dict_config():
    cfg = RoundsConfig(baselines="oneshot", families="mlp").validate()
    assert cfg.baselines == ("oneshot",) and cfg.families == ("mlp",)  # were ('o', 'n', 'e', ...)
    with pytest.raises(ConfigError, match="run_rounds takes a RoundsConfig"):
        run_rounds({"rounds": 2})


def test_rounds_dp_reads_dim_and_bodies_trained_as_given_or_refuses_them():
    """Before: dim=2.7 was cut to 2 and dim='3' read as 3; bodies_trained='no' (a non-empty string) read as
    True and chose the trained bodies' sensitivity bound."""
    base = dict(epsilon=1.0, delta=1e-5, clip=2.0, rounds=2)
    for dim in (2.7, "3", 0, True):
        with pytest.raises(ConfigError, match="dim must be an integer >= 1"):
            RoundsDP(**base, dim=dim, bodies_trained=False)
    with pytest.raises(ConfigError, match="bodies_trained must be True or False"):
        RoundsDP(**base, dim=4, bodies_trained="no")
    assert RoundsDP(**base, dim=np.int64(4), bodies_trained=np.False_).record_bound == "theorem"


@pytest.mark.parametrize("dtype", [complex, bool])
def test_a_round_release_refuses_statistics_that_are_not_real_numbers(dtype):
    """Before: complex statistics were released with their imaginary parts dropped, booleans as 0 and 1."""
    from privfed.rounds.release import noise_generator

    dp = RoundsDP(epsilon=1.0, delta=1e-5, clip=1.0, rounds=2, dim=3, bodies_trained=False)
    dp.declare_randomness(seeded=True, noise_seed=0)
    A = np.zeros((2, 4, 4))
    A[:, :, 0], A[:, :, 1:] = 3, 0.5
    with pytest.raises(InputError, match="array of numbers"):
        RoundRelease(dp, "none", num_clients=2).release(A.astype(dtype), noise_generator(0, 1))
    assert dp.report().releases == 0


def test_a_clients_round_refuses_a_head_it_cannot_train_against_and_reads_numpy_images():
    """Before: a head of the wrong shape was torch's matmul error, a NaN head trained into an all-NaN statistic,
    and numpy images were a TypeError from inside the body."""
    import torch

    from privfed.rounds import client_statistic, client_update, make_body

    torch.manual_seed(0)
    body = make_body("mlp")
    x, y = torch.rand(5, 1, 8, 8), torch.tensor([0, 1, 2, 1, 0])
    A = client_statistic(body, x, y, num_classes=3)
    np.testing.assert_array_equal(client_statistic(body, x.numpy(), y, num_classes=3), A)
    opt = torch.optim.Adam(body.parameters())
    kw = dict(epochs=1, batch_size=2, generator=torch.Generator(), num_classes=3)
    for eta, word in ((np.zeros((3, 5)), r"got shape \(3, 5\)"), (np.full(A.shape, np.nan), "NaN or inf")):
        with pytest.raises(InputError, match=word):
            client_update(body, opt, x, y, eta, **kw)
    with pytest.raises(InputError, match="x must be the client's images"):
        client_statistic(body, [[1.0]] * 5, y, num_classes=3)


@pytest.mark.parametrize(
    "kw, text",
    [
        # before: validate() passed all three; clip=nan then ran whenever epsilon was inf
        ({"clip": float("nan")}, "clip must be finite and >= 0, got nan"),
        ({"clip": 0.0}, "clip must be a finite number > 0, got clip=0.0"),
        ({"alpha": "x"}, "alpha must be a number, got 'x'"),
        ({"classes_per_client": 2.5}, "classes_per_client must be an integer >= 1"),
    ],
)
def test_the_config_checks_its_clip_alpha_and_classes_with_or_without_noise(kw, text):
    from privfed.rounds.config import RoundsConfig

    with pytest.raises(ConfigError, match=text):
        RoundsConfig(epsilon=float("inf"), **kw).validate()
