"""Bad input to the attacks' public helpers: one line naming the argument and the fix, never a raw numpy,
scipy or scikit-learn error, a silent NaN or a wrong number.

Data arrays (scores, vectors, covariances, second moments, targets, means, a truth of another federation)
are refused with an :class:`InputError`; settings (rates, budgets, noise scales, counts of trials) with a
:class:`ConfigError`, as :func:`attacks.params.check_fpr` refuses a false-positive rate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attacks
from attacks import metrics, theory
from attacks.second_moments import subspace, unmixing
from attacks.tracing import attack as tracing_attack
from attacks.tracing import scores as tracing_scores
from attacks.view import GroundTruth, PublicData
from privfed.errors import ConfigError, InputError

_R = np.random.default_rng(0)
#: Five records of four non-negative features, their second moment and one class sum / count.
F5 = np.abs(_R.normal(size=(5, 4))) + 0.1
G = F5[:3].T @ F5[:3]
SUMS, COUNTS = F5[:3].sum(0, keepdims=True), np.array([3.0])
POOL = np.abs(_R.normal(size=(30, 4))) + 0.1
MODEL = tracing_scores.reference_model(POOL)
Y4, M4, N4 = POOL[:4], POOL[4:8], np.full(4, 3.0)
SC, MB = np.arange(10.0), np.arange(10) >= 5
NAN_ROW = np.array([[math.nan, 1.0, 1.0, 1.0]])


def _gen():
    return np.random.default_rng(0)


def _nmf(A, rank=3, **kw):
    return unmixing.symmetric_nmf(A, rank, rng=kw.pop("rng", _gen()), n_init=2, max_iter=50, polish=0, **kw)


def _unmix(second=G, rank=3, **kw):
    return unmixing.unmix(second, rank, rng=_gen(), n_init=2, max_iter=50, polish=0, **kw)


def _game(**kw):
    args = {"pool": POOL, "model": MODEL, "n": 3, "trials": 5, "rng": _gen(), **kw}
    return tracing_attack.tracing_game(**args)


def _learned(**kw):
    args = {"pools": {0: POOL}, "models": {0: MODEL}, "counts": {0: N4}, "rng": _gen(), "sims": 10, **kw}
    return tracing_scores.learned_test(**args)


CASES = [
    # ---------------------------------------------------------------- attacks.metrics
    ("auc-text-scores", lambda: metrics.auc(["a"] * 10, MB), InputError, "scores must be real"),
    ("auc-table-scores", lambda: metrics.auc(np.ones((2, 5)), MB), InputError, "scores must be a 1-D"),
    ("auc-members-2", lambda: metrics.auc(SC, np.arange(10) % 3), InputError, "members must be"),
    ("auc-members-half", lambda: metrics.auc(SC, np.full(10, 0.5)), InputError, "members must be"),
    (
        "auc-members-nan",
        lambda: metrics.auc(SC, np.r_[np.ones(5), [math.nan] * 5]),
        InputError,
        "members must be",
    ),
    ("tpr-text-scores", lambda: metrics.tpr_at_fpr(["a"] * 10, MB, 0.1), InputError, "scores must be"),
    ("auc_se-nan", lambda: metrics.auc_se(math.nan, 5, 5), InputError, "a must be an AUC"),
    ("auc_se-above-1", lambda: metrics.auc_se(1.5, 5, 5), InputError, "a must be an AUC"),
    ("auc_se-text", lambda: metrics.auc_se("x", 5, 5), InputError, "a must be an AUC"),
    ("auc_se-no-members", lambda: metrics.auc_se(0.7, 0, 5), InputError, "n_pos must be"),
    ("auc_se-fraction", lambda: metrics.auc_se(0.7, 5, 2.5), InputError, "n_neg must be"),
    ("cosine-rows", lambda: metrics.cosine(np.ones((3, 4)), np.ones((2, 4))), InputError, "cosine: a"),
    ("cosine-width", lambda: metrics.cosine(np.ones((3, 4)), np.ones((3, 5))), InputError, "cosine: a"),
    ("cosine-3d", lambda: metrics.cosine(np.ones((2, 3, 4)), np.ones((2, 3, 4))), InputError, "cosine: a"),
    ("cosine-text", lambda: metrics.cosine("ab", "cd"), InputError, "cosine: a"),
    ("matched-nan", lambda: metrics.matched_cosine(np.r_[NAN_ROW, F5[:1]], F5[:2]), InputError, "recovered"),
    (
        "matched-inf-true",
        lambda: metrics.matched_cosine(F5[:2], F5[:2] * np.inf),
        InputError,
        "true contains",
    ),
    ("matched-width", lambda: metrics.matched_cosine(F5[:2], F5[:2, :3]), InputError, "recovered .* true"),
    ("matched-empty", lambda: metrics.matched_cosine(np.ones((0, 4)), F5[:2]), InputError, "non-empty"),
    ("matched-3d", lambda: metrics.matched_cosine(np.ones((2, 3, 4)), F5[:2]), InputError, "recovered"),
    ("ident-nan-recon", lambda: metrics.identification(np.r_[NAN_ROW], [[0]], F5), InputError, "recon"),
    ("ident-nan-pool", lambda: metrics.identification(F5[:1], [[0]], np.r_[F5, NAN_ROW]), InputError, "pool"),
    (
        "ident-width",
        lambda: metrics.identification(F5[:2], [[0], [1]], F5[:, :3]),
        InputError,
        "recon .* pool",
    ),
    ("ident-short-index", lambda: metrics.identification(F5[:3], [[0], [1]], F5), InputError, "member_index"),
    (
        "ident-long-index",
        lambda: metrics.identification(F5[:2], [[0], [1], [2]], F5),
        InputError,
        "member_index",
    ),
    (
        "ident-out-of-range",
        lambda: metrics.identification(F5[:1], [[99]], F5),
        InputError,
        r"member_index\[0\]",
    ),
    ("ident-no-index", lambda: metrics.identification(F5[:1], None, F5), InputError, "member_index"),
    ("ident-empty-pool", lambda: metrics.identification(F5[:1], [[0]], np.ones((0, 4))), InputError, "pool"),
    ("ident-scalar", lambda: metrics.identification(1.0, [[0]], F5), InputError, "recon"),
    ("psnr-empty", lambda: metrics.psnr(np.ones((0, 8, 8)), np.ones((0, 8, 8))), InputError, "images"),
    ("psnr-text", lambda: metrics.psnr([["a"]], [["b"]]), InputError, "images"),
    (
        "ssim-even-window",
        lambda: metrics.ssim(np.ones((1, 8, 8)), np.ones((1, 8, 8)), 4),
        InputError,
        "win_size",
    ),
    (
        "ssim-small-image",
        lambda: metrics.ssim(np.ones((1, 4, 4)), np.ones((1, 4, 4))),
        InputError,
        "win_size",
    ),
    # ---------------------------------------------------------------- attacks.theory
    ("d_eff-nan", lambda: theory.effective_dimension(np.full((3, 3), math.nan)), InputError, "cov contains"),
    ("d_eff-inf", lambda: theory.effective_dimension(np.diag([math.inf, 1, 1])), InputError, "cov contains"),
    ("d_eff-not-square", lambda: theory.effective_dimension(np.ones((2, 3))), InputError, "cov must be"),
    ("d_eff-vector", lambda: theory.effective_dimension(np.ones(3)), InputError, "cov must be"),
    ("d_eff-negative", lambda: theory.effective_dimension(-np.eye(3)), InputError, "cov has a negative"),
    ("snr-zero-cov", lambda: theory.tracing_snr(np.zeros((3, 3)), 5), InputError, "cov has zero trace"),
    ("snr-n-nan", lambda: theory.tracing_snr(np.eye(3), math.nan), InputError, "n must be"),
    ("snr-n-inf", lambda: theory.tracing_snr(np.eye(3), math.inf), InputError, "n must be"),
    ("snr-n-text", lambda: theory.tracing_snr(np.eye(3), "5"), InputError, "n must hold"),
    ("snr-tau-nan", lambda: theory.tracing_snr(np.eye(3), 5, math.nan), InputError, "tau must be"),
    ("snr-tau-negative", lambda: theory.tracing_snr(np.eye(3), 5, -1.0), InputError, "tau must be"),
    ("snr-offset-width", lambda: theory.tracing_snr(np.eye(3), 5, 0.0, np.ones(4)), InputError, "offset"),
    ("snr-offset-nan", lambda: theory.tracing_snr(np.eye(3), 5, 0.0, [math.nan] * 3), InputError, "offset"),
    ("tpr-fpr-2", lambda: theory.tracing_tpr(np.eye(3), 5, 2.0), ConfigError, "fpr must be"),
    ("tpr-fpr-nan", lambda: theory.tracing_tpr(np.eye(3), 5, math.nan), ConfigError, "fpr must be"),
    ("gdp-mu-nan", lambda: theory.gdp_auc_bound(math.nan), ConfigError, "mu must be"),
    ("gdp-mu-negative", lambda: theory.gdp_auc_bound(-1.0), ConfigError, "mu must be"),
    ("gdp-mu-text", lambda: theory.gdp_auc_bound("1"), ConfigError, "mu must be"),
    ("gdp-tpr-fpr-2", lambda: theory.gdp_tpr_bound(1.0, 2.0), ConfigError, "fpr must be"),
    ("pure-eps-nan", lambda: theory.pure_dp_auc_bound(math.nan), ConfigError, "epsilon must be"),
    ("pure-eps-negative", lambda: theory.pure_dp_auc_bound(-1000), ConfigError, "epsilon must be"),
    ("approx-eps-nan", lambda: theory.approx_dp_tpr_bound(math.nan, 1e-5, 0.1), ConfigError, "epsilon"),
    ("approx-delta-negative", lambda: theory.approx_dp_tpr_bound(1, -0.5, 0.1), ConfigError, "delta"),
    ("approx-fpr-negative", lambda: theory.approx_dp_tpr_bound(1, 1e-5, -0.1), ConfigError, "fpr must be"),
    ("approx-fpr-nan", lambda: theory.approx_dp_tpr_bound(1, 1e-5, math.nan), ConfigError, "fpr must be"),
    # ---------------------------------------------------------------- attacks.second_moments
    ("nmf-nan", lambda: _nmf(np.full((4, 4), math.nan)), InputError, "A contains NaN"),
    ("nmf-not-square", lambda: _nmf(np.ones((4, 5))), InputError, "A must have shape"),
    ("nmf-stack", lambda: _nmf(np.ones((2, 4, 4))), InputError, "A must have shape"),
    ("nmf-empty", lambda: _nmf(np.ones((0, 0))), InputError, "A must have shape"),
    ("nmf-rank-fraction", lambda: _nmf(G, 2.5), InputError, "rank must be"),
    ("nmf-rank-bool", lambda: _nmf(G, True), InputError, "rank must be"),
    ("nmf-no-rng", lambda: _nmf(G, rng=None), ConfigError, "rng must be"),
    ("nmf-text-max-seconds", lambda: _nmf(G, max_seconds="1"), ConfigError, "max_seconds"),
    (
        "aug-sums-width",
        lambda: unmixing.augmented_second_moment(G, np.ones((1, 3)), COUNTS),
        InputError,
        "sums",
    ),
    (
        "aug-counts-length",
        lambda: unmixing.augmented_second_moment(G, SUMS, np.ones(2)),
        InputError,
        "counts",
    ),
    (
        "aug-sums-nan",
        lambda: unmixing.augmented_second_moment(G, SUMS * math.nan, COUNTS),
        InputError,
        "sums",
    ),
    ("aug-counts-nan", lambda: unmixing.augmented_second_moment(G, SUMS, [math.nan]), InputError, "counts"),
    (
        "aug-second-not-square",
        lambda: unmixing.augmented_second_moment(G[:3], SUMS, COUNTS),
        InputError,
        "second",
    ),
    ("unmix-nan", lambda: _unmix(np.full((4, 4), math.nan)), InputError, "second contains"),
    ("unmix-sums-alone", lambda: _unmix(sums=SUMS), InputError, "sums and counts together"),
    ("unmix-counts-alone", lambda: _unmix(counts=COUNTS), InputError, "sums and counts together"),
    ("unmix-rank-fraction", lambda: _unmix(rank=2.5), InputError, "rank must be"),
    (
        "projectors-one-matrix",
        lambda: subspace.signal_projectors(G),
        InputError,
        r"second must have shape \(K",
    ),
    (
        "projectors-nan",
        lambda: subspace.signal_projectors(np.full((2, 4, 4), math.nan)),
        InputError,
        "second",
    ),
    ("projectors-not-square", lambda: subspace.signal_projectors(np.ones((2, 4, 3))), InputError, "second"),
    ("projectors-sigma-nan", lambda: subspace.signal_projectors(G[None], math.nan), ConfigError, "sigma"),
    (
        "projectors-rel_tol-nan",
        lambda: subspace.signal_projectors(G[None], 0.0, math.nan),
        ConfigError,
        "rel_tol",
    ),
    (
        "projectors-edge-negative",
        lambda: subspace.signal_projectors(G[None], 1.0, 1e-8, -1),
        ConfigError,
        "edge",
    ),
    # ---------------------------------------------------------------- attacks.tracing.scores
    ("reference-nan", lambda: tracing_scores.reference_model(np.r_[POOL, NAN_ROW]), InputError, "features"),
    (
        "reference-text",
        lambda: tracing_scores.reference_model([["a", "b"], ["c", "d"]]),
        InputError,
        "features",
    ),
    ("reference-no-columns", lambda: tracing_scores.reference_model(np.ones((5, 0))), InputError, "features"),
    (
        "trace-targets-width",
        lambda: tracing_scores.trace_scores(Y4[:, :3], M4, N4, MODEL),
        InputError,
        "targets",
    ),
    ("trace-targets-rows", lambda: tracing_scores.trace_scores(Y4[:3], M4, N4, MODEL), InputError, "targets"),
    ("trace-means-width", lambda: tracing_scores.trace_scores(Y4, M4[:, :3], N4, MODEL), InputError, "model"),
    ("trace-counts-length", lambda: tracing_scores.trace_scores(Y4, M4, N4[:3], MODEL), InputError, "counts"),
    (
        "trace-counts-length-inner",
        lambda: tracing_scores.trace_scores(Y4, M4, N4[:3], MODEL, test="inner"),
        InputError,
        "counts",
    ),
    (
        "trace-counts-nan",
        lambda: tracing_scores.trace_scores(Y4, M4, [3, 3, 3, math.nan], MODEL),
        InputError,
        "counts",
    ),
    (
        "trace-targets-nan",
        lambda: tracing_scores.trace_scores(Y4 * math.nan, M4, N4, MODEL),
        InputError,
        "targets",
    ),
    (
        "trace-means-nan",
        lambda: tracing_scores.trace_scores(Y4, M4 * math.nan, N4, MODEL),
        InputError,
        "means",
    ),
    (
        "trace-tau-nan",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, tau=math.nan),
        InputError,
        "tau",
    ),
    (
        "trace-tau-negative",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, tau=-1.0),
        InputError,
        "tau",
    ),
    ("trace-tau-text", lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, tau="1"), InputError, "tau"),
    (
        "trace-tau-inf-lrt",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, tau=math.inf),
        InputError,
        "tau",
    ),
    (
        "trace-support_z-nan",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, test="support", support_z=math.nan),
        ConfigError,
        "support_z",
    ),
    (
        "trace-support_z-negative",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, test="support", support_z=-1),
        ConfigError,
        "support_z",
    ),
    (
        "trace-ref_means-width",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, test="inner", ref_means=np.ones((4, 3))),
        InputError,
        "ref_means",
    ),
    (
        "trace-ref_means-nan",
        lambda: tracing_scores.trace_scores(Y4, M4, N4, MODEL, test="inner", ref_means=M4 * math.nan),
        InputError,
        "ref_means",
    ),
    ("trace-no-model", lambda: tracing_scores.trace_scores(Y4, M4, N4, "model"), InputError, "model must be"),
    (
        "pairs-targets-nan",
        lambda: tracing_scores.pair_features(Y4 * math.nan, M4, N4, MODEL),
        InputError,
        "targets",
    ),
    (
        "pairs-support_z-nan",
        lambda: tracing_scores.pair_features(Y4, M4, N4, MODEL, support_z=math.nan),
        ConfigError,
        "support_z",
    ),
    ("learned-pools-list", lambda: _learned(pools=[POOL]), InputError, "pools must be a mapping"),
    ("learned-no-model", lambda: _learned(models={}), InputError, "models and counts"),
    ("learned-pool-nan", lambda: _learned(pools={0: np.r_[POOL, NAN_ROW]}), InputError, r"pools\[0\]"),
    ("learned-counts-nan", lambda: _learned(counts={0: [math.nan]}), InputError, r"counts\[0\]"),
    ("learned-model-width", lambda: _learned(pools={0: POOL[:, :3]}), InputError, r"models\[0\]"),
    ("learned-sims-0", lambda: _learned(sims=0), ConfigError, "sims"),
    ("learned-sigma-nan", lambda: _learned(sigma=math.nan), ConfigError, "sigma"),
    ("learned-rng-seed", lambda: _learned(rng=0), ConfigError, "rng must be"),
    (
        "learned-count-past-memory",
        lambda: _learned(counts={0: [1e12]}),
        InputError,
        r"^learned_test: simulating a released row of 1,000,000,000,000 records \(counts\[0\]\) needs about",
    ),
    # ---------------------------------------------------------------- attacks.tracing.attack
    ("game-n-fraction", lambda: _game(n=2.5), InputError, "n must be an integer"),
    ("game-n-bool", lambda: _game(n=True), InputError, "n must be an integer"),
    ("game-trials-0", lambda: _game(trials=0), ConfigError, "trials"),
    ("game-trials-negative", lambda: _game(trials=-1), ConfigError, "trials"),
    ("game-pool-nan", lambda: _game(pool=np.r_[POOL, NAN_ROW]), InputError, "pool"),
    ("game-pool-vector", lambda: _game(pool=np.ones(30)), InputError, "pool"),
    ("game-pool-width", lambda: _game(pool=POOL[:, :3]), InputError, "model"),
    ("game-sigma-nan", lambda: _game(sigma=math.nan), ConfigError, "sigma"),
    ("game-sigma-negative", lambda: _game(sigma=-1.0), ConfigError, "sigma"),
    ("game-count_sigma-nan", lambda: _game(count_sigma=math.nan), ConfigError, "count_sigma"),
    ("game-rng-seed", lambda: _game(rng=0), ConfigError, "rng must be"),
    (
        "epsilon-confidence-nan",
        lambda: tracing_attack.empirical_epsilon(SC, MB, 0.1, math.nan),
        ConfigError,
        "confidence",
    ),
    (
        "epsilon-confidence-1",
        lambda: tracing_attack.empirical_epsilon(SC, MB, 0.1, 1.0),
        ConfigError,
        "confidence",
    ),
    (
        "epsilon-members-2",
        lambda: tracing_attack.empirical_epsilon(SC, np.arange(10) % 3, 0.1),
        InputError,
        "members",
    ),
]


@pytest.mark.parametrize("call, error, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_helper_refuses_bad_input_in_one_line(call, error, match):
    with pytest.raises(error, match=match) as exc:
        call()
    assert "\n" not in str(exc.value)


def test_valid_input_still_scores_as_before():
    """The checks refuse, they never change a number: known values of each helper on valid input."""
    assert metrics.auc(SC, MB) == 1.0 and metrics.auc(SC[:, None], MB.astype(int)) == 1.0
    mc, match = metrics.matched_cosine(np.eye(3)[:2], np.eye(3))
    assert mc == 1.0 and match.tolist() == [0, 1, -1]
    assert metrics.identification(F5[:2], [[0], [1]], F5).tolist() == [True, True]
    assert metrics.cosine(F5[0], F5[:2])[0] == pytest.approx(1.0)
    assert theory.tracing_snr(np.eye(4), 4) == 1.0
    # e^1000 overflowed float64
    assert theory.approx_dp_tpr_bound(1000, 1e-5, 0.1) == 1.0
    assert theory.approx_dp_tpr_bound(1.0, 0.0, 0.1) == math.exp(1.0) * 0.1
    assert theory.gdp_tpr_bound(math.inf, 0.0) == 1.0 and theory.pure_dp_auc_bound(math.inf) == 1.0
    # one target against every mean
    one = tracing_scores.trace_scores(Y4[0], M4, N4, MODEL, test="inner")
    assert np.array_equal(
        one, tracing_scores.trace_scores(np.tile(Y4[0], (4, 1)), M4, N4, MODEL, test="inner")
    )


# ---------------------------------------------------------------- a truth of another federation
N, D, C = 120, 6, 3


def _federation():
    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(size=(N, D))) + 0.1
    H = np.abs(rng.normal(size=(60, D))) + 0.1
    pub = PublicData(labels=np.arange(60) % C, features=np.abs(rng.normal(size=(60, D))) + 0.1)
    truth = {
        "features": F,
        "labels": np.arange(N) % C,
        "holdout_features": H,
        "holdout_labels": np.arange(60) % C,
    }
    view, _ = attacks.scenario("fedncm", clients=np.arange(N) % 40, public=pub, rng=0, **truth)
    return view, truth


@pytest.mark.parametrize(
    "change, match",
    [
        ({"clients": np.arange(N) % 80}, r"GroundTruth.clients holds client 79 but the view has 40 clients"),
        (
            {"labels": np.arange(N) % 5},
            r"GroundTruth.labels holds classes 0..4 but the view has num_classes=3",
        ),
        ({"wider": True}, r"GroundTruth.features has 7 columns but the view has d=6"),
    ],
    ids=["clients", "labels", "features"],
)
@pytest.mark.parametrize("attack", ["singleton", "tracing", "labels", "strongest"])
def test_a_truth_of_another_federation_is_refused(attack, change, match):
    """A truth with more clients was scored silently (its extra records counted as not exposed: exposure 2/3
    instead of 1), one with more classes too; a wider one was a raw numpy broadcast error."""
    view, kw = _federation()
    kw, change = {**kw, "clients": np.arange(N) % 40}, dict(change)
    if change.pop("wider", False):
        kw["features"] = np.c_[kw["features"], kw["features"][:, :1]]
        kw["holdout_features"] = np.c_[kw["holdout_features"], kw["holdout_features"][:, :1]]
    truth = GroundTruth(**{**kw, **change})
    with pytest.raises(InputError, match=match) as exc:
        if attack == "strongest":
            attacks.strongest_flat("tracing", view, truth, 0)
        else:
            attacks.evaluate(attack, view, truth)
    assert "truth of its own federation" in str(exc.value) and "\n" not in str(exc.value)


def test_the_attack_evaluate_methods_check_the_truth_too():
    view, kw = _federation()
    truth = GroundTruth(**{**kw, "clients": np.arange(N) % 80})
    for name in ("singleton", "tracing", "labels"):
        with pytest.raises(InputError, match="GroundTruth.clients"):
            attacks.get(name).evaluate(view, truth, np.random.default_rng(0))
    # scored directly, past evaluate: a one-line refusal, not numpy's reshape error
    labels = attacks.get("labels")
    with pytest.raises(InputError, match="GroundTruth.clients holds client 79 but the view has 40"):
        labels.score(labels.run(view), truth)
    with pytest.raises(InputError, match="GroundTruth.labels holds class 4 but the view has 3"):
        labels.score(
            labels.run(view), GroundTruth(**{**kw, "clients": np.arange(N) % 40, "labels": np.arange(N) % 5})
        )


def test_a_truth_of_the_same_federation_with_unused_client_ids_still_scores():
    """num_clients above the largest id gives the view empty rows: a truth without those clients matches."""
    view, kw = _federation()
    view, truth = attacks.scenario("fedncm", clients=np.arange(N) % 40, num_clients=45, rng=0, **kw)
    assert view.stats.num_clients == 45
    assert attacks.evaluate("singleton", view, truth)["exposed_fraction"] == 1.0


def test_public_images_outside_the_pixel_range_are_refused():
    """Before: PublicData took images of 0..16 (load_digits' own scale) and the inversions scored against them."""
    from attacks.knowledge import PublicData

    F, y = np.zeros((2, 3)), np.array([0, 1])
    with pytest.raises(
        InputError, match=r"PublicData.images holds pixels in \[0, 16\]; .* divide them by 16"
    ):
        PublicData(labels=y, features=F, images=np.full((2, 8, 8), 16.0) * np.arange(2)[:, None, None])
    assert PublicData(labels=y, features=F, images=np.full((2, 8, 8), 1.0)).images.max() == 1.0
    with pytest.raises(InputError, match=r"holds pixels in \[0, 255\]; images are values in \[0, 1\]$"):
        PublicData(labels=y, features=F, images=np.full((2, 8, 8), 255.0) * np.arange(2)[:, None, None])
