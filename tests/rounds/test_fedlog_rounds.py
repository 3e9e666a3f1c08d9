"""Multi-round FedLog (privfed.rounds): the one-shot limit, the MAP fixed point each round,
DP composed over the releases, reproducibility and the end-to-end audit of a 3-round release."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

import privfed
from mechanisms import GaussianMechanism
from privfed.audit import audit
from privfed.errors import ConfigError
from privfed.rounds import (
    FEATURE_DIM,
    RoundRelease,
    RoundsConfig,
    RoundsDP,
    RoundsSetup,
    assign_families,
    run_rounds,
)
from privfed.rounds.release import AugmentedFedLog, augmented
from privfed.stats import ClientStats

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

#: A small run (scratch bodies: no public pre-training) for the structural tests.
SMALL = dict(clients=6, rounds=2, local_epochs=1, init="scratch", baselines=(), batch_size=16)


def _gdp_eps_closed_form(mu: float, delta: float) -> float:
    """eps with delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth & Su, Cor. 2.13)."""
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return brentq(f, 0.0, 100.0, xtol=1e-14, rtol=1e-14)


def test_one_round_with_frozen_bodies_is_the_one_shot_head(digits_dataset):
    r = run_rounds(rounds=1, local_epochs=0, families=("cnn",), baselines=())
    clients = RoundsSetup(RoundsConfig(families=("cnn",)).validate()).clients
    ref = privfed.fit(
        "fedlog", digits_dataset.train_features, digits_dataset.train_labels, clients, num_classes=10
    )
    np.testing.assert_allclose(r.head.weight, ref.weight, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.head.bias, ref.bias, rtol=0, atol=1e-9)


def test_head_is_the_map_fixed_point_of_every_round():
    r = run_rounds(**SMALL, families=("cnn-narrow", "mlp"))
    assert len(r.history) == 2
    for h in r.history:
        eta, a, nu_n = h["eta"], h["statistic"], h["nu_plus_n"]
        assert nu_n == pytest.approx(
            1.0 + a[:, 0].sum(), rel=0, abs=1e-9
        )  # nu = 1 plus the counts coordinate
        q = np.sum(eta * eta, axis=1) / 4
        p = np.exp(q - q.max())
        p /= p.sum()
        # stationarity of Eq. 15: eta_y = 2 a_y / ((nu + n) p_y)
        np.testing.assert_allclose(eta, 2 * a / (nu_n * p[:, None]), rtol=1e-9, atol=1e-9 * np.abs(eta).max())
    # the heads differ between rounds: the bodies moved
    assert not np.allclose(r.history[0]["eta"], r.history[1]["eta"])


def test_seeded_runs_are_bit_reproducible():
    kw = dict(SMALL, families=("cnn", "cnn-narrow", "mlp"), epsilon=2.0, max_records=200, noise_seed=4)
    a, b = run_rounds(**kw), run_rounds(**kw)
    assert np.array_equal(a.head.weight, b.head.weight) and np.array_equal(a.head.bias, b.head.bias)
    assert [h["personalised"] for h in a.history] == [h["personalised"] for h in b.history]
    c = run_rounds(**dict(kw, seed=1))
    assert not np.array_equal(a.head.weight, c.head.weight)


def test_unseeded_noise_is_fresh_and_a_seeded_run_says_it_is_a_simulation():
    kw = dict(SMALL, rounds=1, local_epochs=0, families=("mlp",), epsilon=2.0, max_records=200)
    a, b = run_rounds(**kw), run_rounds(**kw)
    # Same data, bodies and seed: only the noise differs, and it does (not seed 0 twice).
    assert not np.array_equal(a.history[0]["statistic"], b.history[0]["statistic"])
    for r in (a, b):
        rep = r.privacy
        assert not rep.simulation and "simulation" not in (rep.guarantee + rep.describe()).lower()
    s = run_rounds(**dict(kw, noise_seed=9)).privacy
    assert s.simulation and s.guarantee.startswith("SIMULATION (seeded simulation")
    assert "seeded simulation" in s.describe() and "noise_seed=9" in s.describe()
    assert s.as_dict()["simulation"] is True


def test_max_records_defaults_to_a_public_constant_not_the_largest_client():
    from privfed.rounds import DEFAULT_MAX_RECORDS

    sensitivities = set()
    for partition in ("shards", "iid", "dirichlet"):  # client sizes differ; n_max does not
        r = run_rounds(
            **dict(
                SMALL,
                rounds=1,
                local_epochs=0,
                families=("mlp",),
                partition=partition,
                level="client",
                epsilon=1.0,
            )
        )
        rep = r.privacy
        sensitivities.add(rep.sensitivity)
        assert rep.sensitivity == pytest.approx(
            DEFAULT_MAX_RECORDS * math.sqrt(1 + FEATURE_DIM * 4.0), rel=1e-12
        )
        assert any(f"public default {DEFAULT_MAX_RECORDS}" in n for n in rep.notes)
    assert len(sensitivities) == 1
    with pytest.raises(ConfigError, match="max_records"):
        run_rounds(**dict(SMALL, epsilon=1.0, max_records=0))
    with pytest.raises(ConfigError, match="noise_seed"):
        run_rounds(**dict(SMALL, epsilon=1.0, noise_seed=-1))


def test_families_are_assigned_by_a_seeded_balanced_rule():
    f = assign_families(20, ("cnn", "cnn-narrow", "mlp"), seed=0)
    assert f == assign_families(20, ("cnn", "cnn-narrow", "mlp"), seed=0)
    assert sorted(np.unique(f, return_counts=True)[1].tolist()) == [6, 7, 7]
    assert f != assign_families(20, ("cnn", "cnn-narrow", "mlp"), seed=1)


@pytest.mark.parametrize("R", [1, 5, 20])
def test_total_calibration_composes_to_the_budget_in_gdp(R):
    eps, delta, b = 1.0, 1e-5, 2.0
    dp = RoundsDP(epsilon=eps, delta=delta, clip=b, clip_norm="coordinate", rounds=R, bodies_trained=False)
    # the same sigma as the mechanisms' Gaussian on the joint statistic of Theorem 3.1
    mech = GaussianMechanism(
        epsilon=eps, delta=delta, clip=b, clip_norm="coordinate", split="joint", rounds=R, dim=FEATURE_DIM
    )
    assert dp.sigma == pytest.approx(mech.sigma["sums"], rel=1e-12)
    assert dp.sensitivity == pytest.approx(math.sqrt(1 + FEATURE_DIM * b * b), rel=1e-15)
    rng = np.random.default_rng(0)
    release = RoundRelease(dp, "none", num_clients=3)
    for _ in range(R):
        release(np.zeros((3, 10, FEATURE_DIM + 1)), rng)
    rep = dp.report()
    mu_total = math.sqrt(R) * dp.sensitivity / dp.sigma
    assert rep.mu_total == pytest.approx(mu_total, rel=1e-12)
    assert rep.epsilon == pytest.approx(_gdp_eps_closed_form(mu_total, delta), rel=1e-9)
    assert rep.epsilon == pytest.approx(eps, rel=1e-9)
    assert rep.epsilon_pld == pytest.approx(eps, rel=2e-3)
    assert rep.formal and rep.releases == R


def test_paper_mode_reports_per_round_and_composed_epsilon():
    eps, delta, b, R = 1.0, 0.01, 2.0, 10
    dp = RoundsDP(
        epsilon=eps,
        delta=delta,
        clip=b,
        clip_norm="coordinate",
        rounds=R,
        calibration="paper",
        record_bound="theorem",
        bodies_trained=False,
    )
    m = FEATURE_DIM + 1
    assert dp.sigma == pytest.approx(
        math.sqrt(2 * (1 + (m - 1) * b * b) * math.log(1.25 / delta)) / eps, rel=1e-12
    )
    rng = np.random.default_rng(1)
    release = RoundRelease(dp, "none", num_clients=2)
    for _ in range(R):
        release(np.zeros((2, 10, m)), rng)
    rep = dp.report()
    mu = eps / math.sqrt(2 * math.log(1.25 / delta))  # the classic sigma's GDP mu per release
    composed = _gdp_eps_closed_form(math.sqrt(R) * mu, delta)
    assert rep.per_round_epsilon == eps
    assert rep.per_round_epsilon_exact == pytest.approx(_gdp_eps_closed_form(mu, delta), rel=1e-9)
    assert rep.epsilon == pytest.approx(composed, rel=1e-9)
    assert rep.epsilon > eps  # 10 releases at eps = 1 each compose to more than 1 ...
    text = rep.describe()
    assert f"{eps:.4g}" in text and f"{composed:.4g}" in text and f"{composed / eps:.3g} x" in text


def test_paper_mode_with_trained_bodies_says_no_formal_guarantee():
    r = run_rounds(
        **SMALL, families=("mlp",), epsilon=1.0, delta=0.01, calibration="paper", record_bound="theorem"
    )
    assert not r.privacy.formal
    assert r.privacy.guarantee.startswith("NO FORMAL GUARANTEE")
    assert r.privacy.releases == SMALL["rounds"]


def test_trained_bodies_default_to_the_upload_bound():
    r = run_rounds(**SMALL, families=("mlp",), epsilon=1.0, max_records=50)
    rep = r.privacy
    assert rep.formal and rep.record_bound == "upload"
    assert rep.sensitivity == pytest.approx(2 * 50 * math.sqrt(1 + FEATURE_DIM * 4.0), rel=1e-12)
    assert rep.epsilon == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("placement", ["central", "distributed", "local"])
def test_three_round_release_passes_the_audit(placement):
    """End-to-end audit of 3 releases: the canary record moves each release's statistic by T(x)."""
    eps, delta, b, R, C, d = 4.0, 1e-5, 2.0, 3, 2, 4  # a small statistic keeps 20k draws fast
    m = d + 1
    rng = np.random.default_rng(5)
    K = 1 if placement == "local" else 3  # local: the canary's client's own upload is what the server sees
    base = rng.uniform(0, b, size=(K, C, m))
    base[..., 0] = 5.0
    canary = np.zeros((C, m))
    canary[0, 0] = 1.0
    canary[0, 1:] = b  # the corner of the clipping box: attains the sensitivity
    D0, D1 = base, base.copy()
    D1[0] += canary

    def run(claimed_sigma_factor):
        """The release through the mechanism's hooks (every draw a row); the claim made for sigma x factor."""
        dp = RoundsDP(
            epsilon=eps, delta=delta, clip=b, rounds=R, placement=placement, bodies_trained=False, dim=d
        )
        mech, method = dp.mechanism, AugmentedFedLog()

        def rows(A):
            return ClientStats(counts=A[..., 0].reshape(-1, C), sums=A[..., 1:].reshape(-1, C, d))

        def one(A, n, g):
            if placement == "central":  # the trusted aggregator's noise on each draw's sum
                return augmented(mech.after_aggregate(rows(A.sum(1)), method, g))
            if placement == "local":  # every client's upload noised in full, then summed
                return augmented(mech.before_upload(rows(A), method, g)).reshape(n, K, C, m).sum(1)
            return augmented(mech.node_release(rows(A), K, g)).reshape(n, K, C, m).sum(1)  # shares of sigma^2

        def release(side, n, g):
            A = np.broadcast_to((D0, D1)[side], (n,) + D0.shape)
            return np.concatenate([one(A, n, g).reshape(n, -1) for _ in range(R)], axis=1)

        claimed = math.sqrt(R) * dp.sensitivity / (dp.sigma * claimed_sigma_factor)
        return audit(
            release,
            reference=np.tile(D0.sum(0).ravel(), R),
            direction=np.tile(canary.ravel(), R),
            scale=dp.sigma,
            draws=20000,
            rng=np.random.default_rng(6),
            claimed_mu=claimed,
        )

    ok = run(1.0)
    assert ok.mu_lb <= ok.claimed_mu
    assert ok.mu_lb > 0.6 * ok.claimed_mu  # power: the canary attains the sensitivity
    broken = run(2.0)  # a claim made for twice the noise: refuted
    assert broken.mu_lb > broken.claimed_mu


def test_upload_bytes_count_what_is_sent():
    r = run_rounds(**SMALL, families=("mlp",))
    per_client = 4 * ((FEATURE_DIM + 1) * 10 + 1)  # per-class sums of [1, f] (counts inside) and n_k, float32
    assert r.bytes["upload_per_client_round"] == per_client
    assert r.bytes["upload_total"] == per_client * SMALL["clients"] * SMALL["rounds"]


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(clients=0), "clients"),
        (dict(families=("resnet",)), "families"),
        (dict(init="imagenet"), "init"),
        (dict(baselines=("fedprox",)), "baseline"),
        (dict(epsilon=1.0, placement="everywhere"), "placement"),
        (dict(epsilon=1.0, level="client", placement="local"), "client"),
        (dict(epsilon=-1.0), "epsilon"),
        # -inf once passed as "no DP" (math.isinf) and ran without noise or a note; a string was a TypeError
        (dict(epsilon=-math.inf), "epsilon must be > 0"),
        (dict(epsilon="1"), "epsilon must be a number"),
        (dict(epsilon=True), "epsilon must be a number"),
    ],
)
def test_bad_settings_raise_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        run_rounds(**dict(SMALL, rounds=1, **bad))


@pytest.mark.slow
def test_default_run_is_fast_and_training_beats_the_one_shot_head():
    r = run_rounds(baselines=("oneshot",))
    assert r.timing["cpu_s"] < 120  # CPU time of the one-thread run: what a free 2-core machine needs
    assert r.personalised_accuracy > r.baselines["oneshot"]["personalised"] + 0.01


def test_baselines_run_only_when_asked_and_are_timed_apart():
    """run_rounds runs FedLog alone by default; a baseline asked for is reported and timed on its own."""
    from privfed.rounds import RoundsConfig

    assert RoundsConfig().baselines == ()
    plain = run_rounds(**{k: v for k, v in SMALL.items() if k != "baselines"})
    assert plain.baselines == {} and set(plain.timing) == {"fedlog_s", "total_s", "cpu_s"}
    both = run_rounds(**dict(SMALL, baselines=("oneshot", "local")))
    assert set(both.baselines) == {"oneshot", "local"} and {"oneshot_s", "local_s"} <= set(both.timing)
    assert "fedavg_s" not in both.timing and set(both.summary()) == {"fedlog", "oneshot", "local"}
    # the baselines run after FedLog and do not change it
    assert both.personalised_accuracy == plain.personalised_accuracy
    assert both.history[-1]["head_norm"] == plain.history[-1]["head_norm"]


@pytest.mark.slow
def test_a_fresh_default_run_reproduces_the_recorded_compare_row():
    """The record's 10-round FedLog (heterogeneous bodies, seed 0) is what a fresh run gives, bit for bit.

    The record was made with the membership attack observing every round (attack_pairs=200) and the
    three baselines; neither may change FedLog's numbers, so the plain default run must match.
    """
    import json
    from pathlib import Path

    rec = json.loads(
        (Path(__file__).resolve().parents[2] / "experiments" / "results" / "fedlog_rounds.json").read_text()
    )
    row = next(
        r for r in rec["compare"] if r["method"] == "fedlog" and "+" in r["families"] and r["seed"] == 0
    )
    r = run_rounds(
        clients=rec["config"]["clients"],
        rounds=rec["config"]["rounds"],
        local_epochs=rec["config"]["local_epochs"],
    )
    assert r.personalised_accuracy == row["personalised"] and r.common_accuracy == row["common"]


def test_tradeoff_command_runs_multi_round_fedlog_beside_the_one_shot(tmp_path, capsys, digits_cache):
    import json

    from privfed.tradeoff import main

    out = tmp_path / "tr"
    rc = main(
        [
            "--method",
            "fedlog",
            "--eps",
            "1",
            "--rounds",
            "2",
            "--seeds",
            "1",
            "--clients",
            "4",
            "--partition",
            "iid",
            "--local-epochs",
            "1",
            "--families",
            "cnn",
            "--init",
            "scratch",
            "--trusted-aggregator",
            "--no-plot",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads((out / "results.json").read_text())["records"]
    # the one-shot sweep's rows: the method, its rounds, the ledger's (composed) epsilon
    assert {(r["method"], r["rounds"]) for r in rows} == {("fedlog", 2), ("fedlog", 1)}
    multi = next(r for r in rows if r["rounds"] == 2)
    assert multi["epsilon_reported"] == pytest.approx(1.0, rel=1e-9)  # the total budget over both releases
    assert multi["epsilon_per_round"] < 1.0
    assert "composed over 2 release(s): epsilon = 1 " in multi["describe"]
    printed = capsys.readouterr().out
    assert "central" not in printed.split("\n")[0]
    # The sweep draws its noise from --seeds: the printed guarantee and the rows (CSV, JSON) say so.
    assert "seeded simulation" in printed
    assert all(r["simulation"] and "seeded simulation" in r["guarantee"] for r in rows if r["rounds"] == 2)
    assert "seeded simulation" in (out / "results.csv").read_text()


def test_tradeoff_multi_round_refuses_other_datasets(tmp_path):
    from privfed.tradeoff import main

    rc = main(
        [
            "--method",
            "fedlog",
            "--eps",
            "1",
            "--rounds",
            "2",
            "--dataset",
            "file:/nonexistent.npz",
            "--quiet",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert rc != 0


def test_auc_bound_is_the_gdp_trade_off_curve_area():
    # AUC of the optimal test between N(0, 1) and N(mu, 1): P(X1 > X0) = Phi(mu / sqrt 2), integrated independently
    dp = RoundsDP(epsilon=2.0, delta=1e-5, clip=2.0, rounds=4, bodies_trained=False)
    release = RoundRelease(dp, "none", num_clients=1)
    for _ in range(4):
        release(np.zeros((1, 2, FEATURE_DIM + 1)), np.random.default_rng(0))
    rep = dp.report()
    t = np.linspace(-12, 12, 200001)
    auc = np.trapezoid(norm.pdf(t - rep.mu_total) * norm.cdf(t), t)
    assert rep.auc_bound == pytest.approx(auc, abs=1e-9)


def test_large_mu_skips_the_pld_cross_check_but_keeps_the_exact_gdp_epsilon():
    # classic sigma at eps = 20 per release: mu ~ 6.4 per release, 11 over 3 releases (a PLD grid grows as mu^2)
    dp = RoundsDP(epsilon=20.0, delta=0.01, clip=2.0, rounds=3, calibration="paper", bodies_trained=False)
    release = RoundRelease(dp, "none", num_clients=1)
    for _ in range(3):
        release(np.zeros((1, 2, FEATURE_DIM + 1)), np.random.default_rng(0))
    rep = dp.report()
    assert math.isnan(rep.epsilon_pld) and "skipped" in rep.describe()
    assert rep.epsilon == pytest.approx(_gdp_eps_closed_form(rep.mu_total, 0.01), rel=1e-9)
