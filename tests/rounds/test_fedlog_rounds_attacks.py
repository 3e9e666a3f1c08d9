"""Membership attacks across the R releases of multi-round FedLog (attacks.rounds): a member's signal
accumulates over the sequence, and under the calibrated DP the attacks' AUC stays within the composed
GDP bound Phi(mu_total / sqrt 2).  Tolerances come from the number of pairs P: an AUC estimate of P
members and P non-members has variance at most AUC (1 - AUC) / P <= 1 / (4 P)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from attacks.rounds import RoundsAttackData, differencing_scores, evaluate_rounds_attacks
from privfed.rounds import RoundRelease, RoundsConfig, RoundsDP, run_rounds

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")


def _sd(P: int) -> float:
    """Worst-case standard deviation of an AUC estimate from P members and P non-members."""
    return math.sqrt(1.0 / (4 * P))


def _aug(f: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ones(f.shape[:-1] + (1,)), f], axis=-1)


def _data(rng, *, P, R, d, n, sigma=0.0, corner=None) -> RoundsAttackData:
    """Rows of n records ~ N(0, I_d) drawn afresh every round (a body that changes), the member among them;
    ``corner``: every target sits at the corner (b, ..., b) of the clipping box instead."""
    D = RoundsAttackData(view="uploads", classes=np.zeros(P, int), clients=np.zeros(P, int))
    eye = np.broadcast_to(np.eye(d), (P, d, d))
    for _ in range(R):
        if corner is None:
            mem, hol = rng.normal(size=(P, d)), rng.normal(size=(P, d))
        else:
            mem = hol = np.full((P, d), corner)
        clean = _aug(mem + rng.normal(size=(P, n - 1, d)).sum(1))
        clean[:, 0] = n
        D.phi.append(_aug(np.concatenate([mem, hol])))
        D.clean.append(clean)
        D.released.append(clean + sigma * rng.normal(size=clean.shape))
        D.sigma.append(sigma)
        for pre in ("", "inc_"):
            getattr(D, pre + "one_mean").append(np.zeros((P, d)))
            getattr(D, pre + "one_cov").append(eye)
            getattr(D, pre + "rest_mean").append(np.zeros((P, d)))
            getattr(D, pre + "rest_cov").append((n - 1) * eye)
    return D


def test_clean_sequence_tracing_beats_single_round_tracing():
    P = 400
    out = evaluate_rounds_attacks(
        _data(np.random.default_rng(0), P=P, R=8, d=6, n=5), np.random.default_rng(1)
    )
    t = out["tracing"]
    assert out["differencing"] is None  # exact on a clean release: not a test
    # two AUCs on the same pairs: the difference has sd <= 2 * sd(P); 3 sd
    assert t["sequence"]["auc"] > t["first_round"]["auc"] + 3 * 2 * _sd(P)
    assert t["sequence"]["tpr_at_1pct_fpr"] > t["first_round"]["tpr_at_1pct_fpr"]


@pytest.mark.parametrize("calibration", ["total", "paper"])
def test_differencing_sequence_meets_the_composed_gdp_bound(calibration):
    """Targets at the clip corner attain the sensitivity: the replayed sequence test reaches Phi(mu_total/sqrt 2)
    and no more; one round alone reaches only the one-release bound."""
    P, R, d, b, eps, delta = 2000, 6, 4, 2.0, 4.0, 1e-5
    dp = RoundsDP(
        epsilon=eps,
        delta=delta,
        clip=b,
        rounds=R,
        bodies_trained=False,
        dim=d,
        calibration=calibration,
        record_bound="theorem",
    )
    release = RoundRelease(dp, "none", num_clients=1)
    for _ in range(R):
        release(np.zeros((1, 2, d + 1)), np.random.default_rng(0))
    rep = dp.report()
    D = _data(np.random.default_rng(2), P=P, R=R, d=d, n=5, sigma=dp.sigma, corner=b)
    out = evaluate_rounds_attacks(
        D, np.random.default_rng(3), mu_total=rep.mu_total, mu_per_release=rep.mu_per_release
    )
    bound = norm.cdf(rep.mu_total / math.sqrt(2))
    assert out["auc_bound"] == pytest.approx(bound, rel=1e-12)
    seq, first = (
        out["differencing_replay"]["sequence"]["auc"],
        out["differencing_replay"]["first_round"]["auc"],
    )
    tol = 3 * _sd(P)
    assert abs(seq - bound) <= tol  # the corner record is the worst case: the bound is attained
    assert abs(first - out["auc_bound_one_release"]) <= tol
    assert seq > first + 3 * 2 * _sd(P)  # the signal accumulates over the rounds
    if calibration == "paper":
        # per-round calibration: the sequence beats the per-round epsilon's own bound
        assert seq > out["auc_bound_one_release"] + tol


def test_differencing_scores_are_the_neyman_pearson_statistic():
    rng = np.random.default_rng(4)
    R, P, m = 3, 5, 4
    phi = rng.normal(size=(R, 2 * P, m))
    clean = rng.normal(size=(R, P, m))
    rel = clean + rng.normal(size=clean.shape)
    sigma = np.array([1.0, 2.0, 0.5])
    s = differencing_scores(phi, rel, clean, sigma)
    for r in range(R):
        for p in range(2 * P):
            row = p % P
            z = rel[r, row] - clean[r, row] + (phi[r, p] if p < P else 0.0)
            # log N(z; phi, s^2) - log N(z; 0, s^2)
            ref = (-(z - phi[r, p]) @ (z - phi[r, p]) + z @ z) / (2 * sigma[r] ** 2)
            assert s[r, p] == pytest.approx(ref, rel=1e-12, abs=1e-12)


SMALL = dict(
    clients=6, rounds=2, local_epochs=1, init="scratch", baselines=(), batch_size=16, families=("mlp",)
)


def test_rounds_run_reports_the_attacks_against_the_composed_bound():
    r = run_rounds(**SMALL, attack_pairs=120, epsilon=4.0, max_records=200)
    a = r.attacks
    assert a["view"] == "sum" and a["rounds"] == 2
    assert a["auc_bound"] == pytest.approx(norm.cdf(r.privacy.mu_total / math.sqrt(2)), rel=1e-12)
    P = a["pairs"]
    for attack in ("tracing", "differencing", "differencing_replay"):
        for v in a[attack].values():
            assert 0.0 <= v["auc"] <= 1.0 and 0.0 <= v["tpr_at_1pct_fpr"] <= 1.0
    assert a["differencing_replay"]["sequence"]["auc"] <= a["auc_bound"] + 3 * _sd(P)
    plain = run_rounds(**SMALL, attack_pairs=120)
    assert plain.attacks["view"] == "uploads" and plain.attacks["differencing"] is None


@pytest.mark.parametrize("split", [dict(), dict(clients=100, partition="dirichlet")])
def test_holdouts_are_paired_with_their_member_on_its_row(split):
    from privfed.rounds import RoundRelease, RoundsSetup
    from privfed.rounds.observer import RoundsObserver

    cfg = RoundsConfig(**dict(SMALL, **split), attack_pairs=150).validate()
    setup = RoundsSetup(cfg)
    obs = RoundsObserver(setup, cfg, None, RoundRelease(None, "none", num_clients=cfg.clients))
    y, yt = setup.y_all.numpy(), np.asarray(setup.yt_all)
    assert np.array_equal(y[obs.members], yt[obs.holdouts])  # same class
    assert np.array_equal(
        obs.owner, np.asarray(setup.clients)[obs.members]
    )  # tested on the member's client row
    assert (obs.owner >= 0).all()  # members are uploaded records (a partition may leave some unassigned)
    assert (
        len(set(obs.holdouts.tolist())) == obs.holdouts.size
        and len(set(obs.members.tolist())) == obs.members.size
    )


@pytest.mark.slow
def test_frozen_digits_release_sequence_stays_within_the_composed_bound():
    r = run_rounds(
        clients=6,
        rounds=9,
        local_epochs=0,
        families=("cnn",),
        baselines=(),
        attack_pairs=300,
        epsilon=20.0,
        delta=1e-5,
    )
    a = r.attacks
    P = a["pairs"]
    rep = a["differencing_replay"]
    assert rep["sequence"]["auc"] <= a["auc_bound"] + 3 * _sd(P)
    assert rep["sequence"]["auc"] > rep["first_round"]["auc"] + 3 * 2 * _sd(P)


@pytest.mark.parametrize("placement", ["central", "local", None])
def test_the_observer_reads_the_view_and_its_noise_from_the_round_trace(placement):
    """A trusted aggregator's sum carries sigma; a sum of uploads each noised in full carries sqrt(K) sigma;
    without noise the server saw every upload."""
    from privfed.rounds.observer import RoundsObserver
    from privfed.rounds.release import RoundRelease

    K, d = 4, 3
    dp = (
        None
        if placement is None
        else RoundsDP(
            epsilon=2.0, delta=1e-5, clip=1.0, rounds=2, placement=placement, bodies_trained=False, dim=d
        )
    )
    g = np.random.default_rng(0)  # what clipped records give: counts, and sums within count x clip
    counts = g.integers(1, 5, size=(K, 2)).astype(float)
    A = np.concatenate([counts[..., None], counts[..., None] * g.uniform(-1, 1, size=(K, 2, d))], axis=2)
    head = RoundRelease(dp, "none", num_clients=K).release(A, np.random.default_rng(1))
    view, seen, sigma = RoundsObserver.server_saw(head.trace)
    if dp is None:
        assert view == "uploads" and sigma == 0.0
        np.testing.assert_array_equal(seen, A)
    else:
        assert view == "sum" and seen.shape == (2, d + 1)
        assert sigma == pytest.approx(dp.sigma * (math.sqrt(K) if placement == "local" else 1.0), rel=1e-15)
