"""Attacks on shared statistics: the server view, the statistics-only attacks, metrics and theory.

Digits default (scikit-learn digits through the public-trained CNN), CPU,
fixed seeds.  Every statistical tolerance is derived in a comment next to
the assertion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

import attacks
from attacks.metrics import auc, auc_se, lpips_distance, matched_cosine, membership_metrics, tpr_at_fpr
from attacks.second_moments.unmixing import augmented_second_moment, symmetric_nmf, unmix
from attacks.singleton import singleton_fraction
from attacks.theory import (
    effective_dimension,
    gdp_auc_bound,
    gdp_tpr_bound,
    pure_dp_auc_bound,
    tracing_auc,
    tracing_snr,
    tracing_tpr,
)
from attacks.tracing.attack import reference_model, tracing_game
from attacks.view import GroundTruth, NoiseSpec, ServerView, class_groups, clip_rows, count_noise
from privfed.errors import ConfigError, InputError, MissingDependencyError
from privfed.stats import compute_client_stats


# ----------------------------------------------------------------------------- helpers (fixtures: conftest.py)
def _scenario(d, method, clients, **kw):
    return attacks.scenario(
        method,
        d["Fp"],
        d["yp"],
        clients,
        images=d["imp"],
        holdout_features=d["Ft"],
        holdout_labels=d["yt"],
        public=d["public"],
        backbone=d["backbone"],
        **kw,
    )


# ----------------------------------------------------------------------------- registry and view
def test_registry_lists_every_attack_and_refuses_unknown_names():
    assert attacks.available() == [
        "differencing",
        "inversion",
        "labels",
        "singleton",
        "subspace",
        "tracing",
        "unmixing",
    ]
    with pytest.raises(ConfigError, match="unknown attack 'nope'; available: differencing, inversion"):
        attacks.get("nope")
    with pytest.raises(ConfigError, match="unknown parameter"):
        attacks.get("tracing", bogus=1)
    with pytest.raises(ConfigError, match="unknown tracing test"):
        attacks.get("tracing", test="magic")


def test_secure_view_is_exactly_the_sum_of_the_per_client_view(digits):
    rng = np.random.default_rng(0)
    cl = class_groups(digits["yp"], 3, rng)
    plain, _ = _scenario(digits, "fed3r", cl)
    secure, _ = _scenario(digits, "fed3r", cl, secure_agg=True)
    assert plain.per_client and not secure.per_client and secure.stats.num_clients == 1
    assert plain.fields == secure.fields == {"counts", "sums", "second"}
    for name in ("counts", "sums", "second"):
        np.testing.assert_allclose(
            getattr(secure.stats, name)[0], getattr(plain.stats, name).sum(0), rtol=1e-12, atol=1e-9
        )
    # independent oracle: loop over samples
    keep = cl >= 0
    G = sum(np.outer(f, f) for f in digits["Fp"][keep])
    np.testing.assert_allclose(secure.stats.second[0], G, rtol=1e-9)


def test_view_exposes_what_each_method_uploads(digits):
    cl = class_groups(digits["yp"], 2, np.random.default_rng(0), max_groups=20)
    v, _ = _scenario(digits, "fedncm", cl)
    assert v.fields == {"counts", "sums"} and "per_client" in v.available
    v, _ = _scenario(digits, "fedcof", cl, secure_agg=True)
    assert v.fields == {"counts", "sums"} and not v.per_client and any("round 2" in n for n in v.notes)
    v, _ = _scenario(digits, "fedcgs", cl)
    assert "second" in v.fields


def test_attacks_refuse_views_lacking_what_they_read(digits):
    cl = class_groups(digits["yp"], 2, np.random.default_rng(0), max_groups=20)
    ncm, truth = _scenario(digits, "fedncm", cl)
    with pytest.raises(InputError, match="needs the statistic 'second'"):
        attacks.evaluate("subspace", ncm, truth)
    sec, truth = _scenario(digits, "fed3r", cl, secure_agg=True)
    with pytest.raises(InputError, match="individual client uploads"):
        attacks.evaluate("unmixing", sec, truth)
    nobb = ncm.with_(backbone=None)
    with pytest.raises(InputError, match="the backbone"):
        attacks.evaluate("inversion", nobb, truth)
    with pytest.raises(InputError, match="public data"):
        attacks.evaluate("tracing", ncm.with_(public=None), truth)
    with pytest.raises(InputError, match="source='second'"):
        attacks.evaluate("inversion", ncm, truth, source="second")
    with pytest.raises(ConfigError, match="ServerView"):
        attacks.get("labels").run("not a view")


def test_noise_spec_gaussian_calibration_is_the_analytic_gaussian():
    # eps = 1, delta = 1e-5: sigma_1 = 3.7306 (privacy.md); joint sensitivity sqrt(c^2 + 1) for sums + counts.
    spec = NoiseSpec.gaussian(epsilon=1.0, delta=1e-5, clip=2.0)
    assert spec.sigma["sums"] == pytest.approx(math.sqrt(5) * 3.7306316348159374, rel=1e-9)
    spec = NoiseSpec.gaussian(epsilon=1.0, delta=1e-5, clip=2.0, blocks=("counts", "sums", "second"))
    assert spec.sigma["second"] == pytest.approx(math.sqrt(4 + 1 + 16) * 3.7306316348159374, rel=1e-9)
    assert NoiseSpec.gaussian(epsilon=math.inf, delta=1e-5, clip=1.0).is_clean
    with pytest.raises(ConfigError, match="sigma must be finite"):
        NoiseSpec(sigma={"sums": -1.0})
    with pytest.raises(ConfigError, match="needs rng"):
        ServerView.from_stats(compute_client_stats(np.ones((2, 3)), [0, 1]), noise=spec)


@pytest.mark.filterwarnings("ignore:noise backend:UserWarning")
def test_view_from_the_real_gaussian_mechanism_reads_its_sigma(digits):
    from mechanisms import GaussianMechanism

    cl = class_groups(digits["yp"], 1, np.random.default_rng(0), max_groups=30)
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=30.0)
    v, _ = _scenario(digits, "fedncm", cl, privacy=mech, rng=1)
    assert v.noise.sigma["sums"] == pytest.approx(mech.sigma["sums"], rel=1e-12)
    assert v.noise.clip == 30.0
    clean = compute_client_stats(clip_rows(digits["Fp"][cl >= 0], 30.0), digits["yp"][cl >= 0], cl[cl >= 0])
    resid = (v.stats.sums - clean.sums)[clean.counts > 0]
    # the residual is the noise: its standard deviation matches sigma within 5 % (30 x 64 draws: se ~ 1.6 %)
    assert np.std(resid) == pytest.approx(mech.sigma["sums"], rel=0.05)


# ----------------------------------------------------------------------------- singleton exposure
@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_singleton_exposure_recovers_raw_features_exactly(digits, alpha):
    from privfed.federation import partition

    p = partition(digits["yp"], 40, "dirichlet", alpha=alpha, rng=0)
    view, truth = _scenario(digits, "fedncm", p.clients)
    att = attacks.get("singleton")
    res = att.run(view, None)
    assert res.rows.size > 0
    # every recovered feature is a true sample of that client and class, to 1e-6
    for k, c, f in zip(res.rows, res.classes, res.features):
        idx = np.flatnonzero((p.clients == k) & (digits["yp"] == c))
        assert idx.size == 1
        np.testing.assert_allclose(f, digits["Fp"][idx[0]], rtol=0, atol=1e-6)
    m = att.score(res, truth)
    # independent oracle: count (client, class) cells of size one with a loop
    cells: dict = {}
    for k, c in zip(p.clients, digits["yp"]):
        if k >= 0:
            cells[(k, c)] = cells.get((k, c), 0) + 1
    uploaded = int(np.sum(p.clients >= 0))
    expect = sum(1 for v in cells.values() if v == 1) / uploaded
    assert m["exposed_fraction"] == pytest.approx(expect, abs=1e-12)
    assert m["singleton_fraction"] == pytest.approx(expect, abs=1e-12)
    assert singleton_fraction(digits["yp"], p.clients) == pytest.approx(expect, abs=1e-12)
    assert m["candidate_precision"] == 1.0


def test_count_noise_does_not_hide_singletons(digits):
    from mechanisms import LaplaceCountNoise
    from privfed.federation import partition

    p = partition(digits["yp"], 40, "dirichlet", alpha=0.1, rng=0)
    view, truth = _scenario(digits, "fedncm", p.clients, privacy=LaplaceCountNoise(epsilon=1.0), rng=3)
    m = attacks.evaluate("singleton", view, truth)
    # The means stay exact (FedCOF App. I.1): a true singleton whose noisy count rounds to 1 is read
    # exactly (P = 1 - e^{-eps/2} ~ 0.39 for Laplace(1/eps) at eps = 1).
    assert m["exposed_samples"] > 0
    assert m["exposed_fraction"] <= m["singleton_fraction"]


# ----------------------------------------------------------------------------- tracing
def test_auc_and_tpr_match_independent_computations():
    from sklearn.metrics import roc_auc_score, roc_curve

    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=600), 1)  # ties on purpose
    m = rng.random(600) < 0.4
    s[m] += 0.7
    assert auc(s, m) == pytest.approx(roc_auc_score(m, s), abs=1e-12)
    r = tpr_at_fpr(s, m, 0.05)
    fpr, tpr, thr = roc_curve(m, s)
    assert r["fpr"] <= 0.05 and r["tpr"] == pytest.approx(tpr[fpr <= 0.05].max(), abs=1e-12)
    # Hanley-McNeil (1982) Eq. 2 written out
    a, n1, n0 = 0.8, 50, 70
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    se = math.sqrt((a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0))
    assert auc_se(a, n1, n0) == pytest.approx(se, rel=1e-12)
    mm = membership_metrics(s, m)
    assert set(mm) >= {"auc", "auc_se", "tpr@0.01", "fpr_realised@0.01", "threshold@0.01", "tpr@0.001"}


def test_theory_formulas_exact():
    S = np.eye(16)
    assert effective_dimension(S) == pytest.approx(16.0)
    assert tracing_snr(S, 4) == pytest.approx(2.0)  # sqrt(d_eff / n)
    assert tracing_snr(S, 4, tau=0.5) == pytest.approx((16 / 4) / math.sqrt(16 / 4 + 0.25 * 16))
    assert tracing_auc(S, 4) == pytest.approx(norm.cdf(2 / math.sqrt(2)))
    dlt = np.full(16, 0.5)  # delta^T Sigma delta = ||delta||^2 = 4 for Sigma = I
    assert tracing_snr(S, 4, tau=0.5, offset=dlt) == pytest.approx(
        4 / math.sqrt(4 + 0.25 * 16 + 4 * (1 + 1 / 4) + 0.25 * 4)
    )
    assert tracing_tpr(S, 4, 0.01) == pytest.approx(norm.cdf(2 + norm.ppf(0.01)))
    assert gdp_auc_bound(1.0) == pytest.approx(norm.cdf(1 / math.sqrt(2)))
    assert gdp_tpr_bound(1.0, 0.05) == pytest.approx(norm.cdf(norm.ppf(0.05) + 1))
    assert pure_dp_auc_bound(1.0) == pytest.approx(math.e / (1 + math.e))


@pytest.mark.parametrize("n", [1, 4, 16])
def test_inner_product_tracing_matches_closed_form_on_gaussian_features(n):
    # Exact model: features ~ N(mu, Sigma), the reference mean and covariance are the true ones;
    # a pool of 3000 makes the without-replacement effect negligible (n / N <= 0.5 %).
    d = 64
    lam = 1.0 / np.arange(1, d + 1)  # d_eff = (sum 1/i)^2 / sum 1/i^2 ~ 11.5
    rng = np.random.default_rng(n)
    mu = rng.normal(size=d)
    pool = mu + rng.normal(size=(3000, d)) * np.sqrt(lam)
    model = attacks.tracing.attack.ReferenceModel(mean=mu, eigvals=lam, eigvecs=np.eye(d))
    trials = 2000
    g = tracing_game(pool, model, n=n, trials=trials, rng=rng, test="inner")
    a = auc(g["scores"], g["members"])
    pred = float(tracing_auc(np.diag(lam), n))
    # Tolerance: 3 Hanley-McNeil SE (sampling) + 0.01 for the normal approximation of
    # T = <y - mu, m - mu> (a sum of d products, d_eff ~ 11.5 terms effectively).
    assert abs(a - pred) <= 3 * auc_se(a, trials, trials) + 0.01


def test_tracing_on_digits_means_matches_closed_form(digits):
    c = int(np.bincount(digits["yp"]).argmax())
    pool = digits["Fp"][digits["yp"] == c]
    pub = digits["public"]
    model = reference_model(pub.features[pub.labels == c])
    cov = np.cov(pool, rowvar=False)
    rng = np.random.default_rng(0)
    trials = 2000
    aucs = {}
    for n in (1, 32):
        g = tracing_game(pool, model, n=n, trials=trials, rng=rng, test="inner")
        a = aucs[n] = auc(g["scores"], g["members"])
        # The public reference mean is off the pool mean by delta: its variance term is in the prediction.
        pred = float(tracing_auc(cov, n, offset=pool.mean(axis=0) - model.mean))
        # Tolerance: 3 SE (Hanley-McNeil) + 0.03 model error (attacks.md: "matched within ~0.03"):
        # non-Gaussian ReLU features (T is not normal) and a finite pool (n records drawn without
        # replacement from ~90).
        assert abs(a - pred) <= 3 * auc_se(a, trials, trials) + 0.03, (n, a, pred)
    assert aucs[1] > 0.9 and aucs[32] < 0.7
    g = tracing_game(pool, model, n=1, trials=trials, rng=rng, test="lrt")
    assert auc(g["scores"], g["members"]) > 0.99  # the likelihood ratio is stronger


@pytest.mark.parametrize("z", [1.0, 2.0])
def test_tracing_under_gaussian_dp_stays_under_the_gdp_bound(clipped_tracing, z):
    # Release: noisy (sum, count) of n = 1 clipped record vs of nothing (add/remove neighbours), noise
    # sigma = z * sqrt(c^2 + 1) on both (joint L2 sensitivity), so the release is mu-GDP with mu = 1 / z.
    pool, model, clip = clipped_tracing["pool"], clipped_tracing["model"], clipped_tracing["clip"]
    sigma = z * math.sqrt(clip**2 + 1)
    trials = 2000
    rng = np.random.default_rng(7)
    for test in ("sum", "lrt", "inner"):
        g = tracing_game(
            pool,
            model,
            n=1,
            trials=trials,
            rng=rng,
            test=test,
            sigma=sigma,
            count_sigma=sigma,
            clip=clip,
            design="add-remove",
        )
        a = auc(g["scores"], g["members"])
        # AUC <= Phi(mu / sqrt 2) + 3 SE (Hanley-McNeil at the bound, one-sided).
        bound = gdp_auc_bound(1 / z)
        assert a <= bound + 3 * auc_se(bound, trials, trials)
        # TPR at 5 % FPR: the realised FPR may exceed its population value; the bound is evaluated at
        # FPR + 3 sqrt(a(1-a)/n0), then 3 binomial SE of the TPR are added.
        r = tpr_at_fpr(g["scores"], g["members"], 0.05)
        f_hi = r["fpr"] + 3 * math.sqrt(0.05 * 0.95 / trials)
        t_bound = gdp_tpr_bound(1 / z, f_hi)
        assert r["tpr"] <= t_bound + 3 * math.sqrt(t_bound * (1 - t_bound) / trials)
        if test == "sum":
            # The sum test is Neyman-Pearson at n = 1 (||y|| = c for the clipped majority), so it gets
            # close to the bound: the check above has power.  With half the noise it would fail.
            assert a >= bound - 0.05
            g2 = tracing_game(
                pool,
                model,
                n=1,
                trials=trials,
                rng=rng,
                test="sum",
                sigma=sigma / 2,
                count_sigma=sigma / 2,
                clip=clip,
                design="add-remove",
            )
            assert auc(g2["scores"], g2["members"]) > bound + 3 * auc_se(bound, trials, trials)


def test_tracing_attack_on_views_clean_vs_secure(digits):
    cl = class_groups(digits["yp"], 1, np.random.default_rng(0))
    view, truth = _scenario(digits, "fedncm", cl)
    m = attacks.evaluate("tracing", view, truth, rng=0, max_targets=200)
    assert m["auc"] > 0.99 and m["tpr@0.01"] > 0.9 and m["fpr_realised@0.01"] <= 0.01
    sec, truth = _scenario(digits, "fedncm", cl, secure_agg=True)
    ms = attacks.evaluate("tracing", sec, truth, rng=0, max_targets=200)
    # secure sum: n becomes the class total (~90); closed form sqrt(d_eff / 90) -> AUC near 0.5-0.6
    assert ms["auc"] < 0.75


# ----------------------------------------------------------------------------- second moments
def test_augmented_second_moment_is_the_second_moment_of_augmented_records():
    rng = np.random.default_rng(0)
    F = np.abs(rng.normal(size=(7, 5)))
    y = np.array([0, 2, 2, 1, 0, 2, 2])
    st = compute_client_stats(F, y, None, num_classes=4, fields=("counts", "sums", "second"))
    A, a = augmented_second_moment(st.second[0], st.sums[0], st.counts[0])
    g = np.hstack([F, a * np.eye(4)[y]])
    np.testing.assert_allclose(A, g.T @ g, rtol=1e-12, atol=1e-12)
    assert a == pytest.approx(math.sqrt((F**2).sum() / 7))


def test_symmetric_nmf_recovers_sparse_nonnegative_factors():
    rng = np.random.default_rng(1)
    H = np.abs(rng.normal(size=(20, 3))) * (rng.random((20, 3)) < 0.5)
    H[[0, 1, 2], [0, 1, 2]] = 2.0  # each column has a private coordinate: the factorisation is unique
    W, res = symmetric_nmf(H @ H.T, 3, rng=rng)
    assert res < 1e-3
    mc, _ = matched_cosine(W.T, H.T)
    assert mc > 0.999


def test_subspace_membership_perfect_on_clean_g_and_fades_with_noise(digits):
    cl = class_groups(digits["yp"], 4, np.random.default_rng(1))
    clip = float(np.median(np.linalg.norm(digits["public"].features, axis=1)))
    aucs = []
    for s in (0.0, 100.0, 300.0, 3000.0):
        spec = NoiseSpec(sigma={"second": s}, clip=clip) if s else NoiseSpec(clip=clip)
        view, truth = _scenario(digits, "fed3r", cl, privacy=spec, rng=0)
        m = attacks.evaluate("subspace", view, truth, rng=0, max_targets=200)
        aucs.append((m["auc"], m["auc_se"]))
    assert aucs[0][0] == 1.0  # a member lies in range(G_k) exactly; a non-member does not
    for (a0, s0), (a1, s1) in zip(aucs, aucs[1:]):
        assert a1 <= a0 + 3 * math.hypot(s0, s1)  # non-increasing up to sampling error
    # sigma = 3000 >> ||f||^2 ~ 1000: the noise edge 2 sigma sqrt(d) swamps the signal; AUC 0.5 within 3 SE
    a, se = aucs[-1]
    assert abs(a - 0.5) <= 3 * auc_se(0.5, 200, 200 * 200)


@pytest.mark.parametrize("n,min_cos", [(2, 0.99), (8, 0.95)])
def test_second_moment_unmixing_recovers_features(digits, n, min_cos):
    # Measured matched cosine on digits: 0.998 (n = 2), 0.97 (n = 8) (attacks.md: 1.00 / .95 at n = 2 / 8).
    cl = class_groups(digits["yp"], n, np.random.default_rng(2), max_groups=8)
    view, truth = _scenario(digits, "fedcgs", cl)
    m = attacks.evaluate("unmixing", view, truth, rng=0)
    assert m["matched_cosine"] >= min_cos
    assert m["label_accuracy"] == 1.0
    assert m["clients"] == 8


def test_unmix_without_sums_returns_no_labels():
    rng = np.random.default_rng(3)
    F = np.abs(rng.normal(size=(2, 10))) * (rng.random((2, 10)) < 0.6) + 0.01
    f, lab, res = unmix(F.T @ F, 2, rng=rng)
    assert lab is None and f.shape == (2, 10)
    assert matched_cosine(f, F)[0] > 0.99


# ----------------------------------------------------------------------------- label distribution
def _zero_one_federation(cells: int, rng):
    """Each client: two samples of class 0, and 0 or 1 sample of class 1 (half each)."""
    has = rng.random(cells) < 0.5
    clients = np.concatenate([np.arange(cells), np.arange(cells), np.flatnonzero(has)])
    labels = np.concatenate([np.zeros(2 * cells, int), np.ones(has.sum(), int)])
    F = np.abs(rng.normal(size=(labels.size, 4)))
    return F, labels, clients


def _singleton_auc_under_count_noise(privacy, cells: int = 4000, seed: int = 11) -> dict:
    rng = np.random.default_rng(seed)
    F, y, k = _zero_one_federation(cells, rng)
    view, truth = attacks.scenario("fedncm", F, y, k, privacy=privacy, rng=rng)
    return attacks.evaluate("labels", view, truth)


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("kind", ["laplace", "geometric"])
def test_count_singleton_auc_under_pure_dp_bound(kind, eps):
    # Every count noised (present or not), clipped at 0: eps-DP on the counts.
    m = _singleton_auc_under_count_noise(NoiseSpec(count_kind=kind, count_epsilon=eps))
    # any test against an eps-DP count: AUC <= e^eps / (1 + e^eps); + 3 Hanley-McNeil SE (~2000 per side)
    b = pure_dp_auc_bound(eps)
    assert m["singleton_pairs"] == 4000
    assert m["singleton_auc"] <= b + 3 * auc_se(b, 2000, 2000)
    assert m["singleton_auc"] > 0.5 + 3 * auc_se(0.5, 2000, 2000)  # the counts still carry signal


@pytest.mark.parametrize("kind", ["laplace", "geometric"])
def test_count_noise_mechanism_meets_its_pure_dp_bound(kind):
    # The mechanisms' own count noise: the clip-at-zero rule must depend on the noisy counts only
    # (dropping the classes a client lacks would release their zero exactly: AUC ~0.84 at eps = 0.5).
    from mechanisms import GeometricCountNoise, LaplaceCountNoise

    mech = (LaplaceCountNoise if kind == "laplace" else GeometricCountNoise)(epsilon=0.5)
    m = _singleton_auc_under_count_noise(mech)
    b = pure_dp_auc_bound(0.5)
    assert m["singleton_auc"] <= b + 3 * auc_se(b, 2000, 2000)


@pytest.mark.parametrize("eps", [0.1, 0.5, 0.9])
def test_uniform_count_noise_leaks_at_every_eps(eps):
    from mechanisms import UniformCountNoiseNoDP

    rng = np.random.default_rng(12)
    F, y, k = _zero_one_federation(1000, rng)
    view, truth = attacks.scenario("fedncm", F, y, k, privacy=UniformCountNoiseNoDP(epsilon=eps), rng=rng)
    m = attacks.evaluate("labels", view, truth)
    assert m["singleton_auc"] == 1.0 and m["presence_auc"] == 1.0  # a zero count stays exactly zero
    assert m["singleton_auc"] > pure_dp_auc_bound(eps)  # above what any eps-DP count allows


def test_label_inference_exact_on_clean_counts(digits):
    from privfed.federation import partition

    p = partition(digits["yp"], 30, "dirichlet", alpha=0.3, rng=1)
    view, truth = _scenario(digits, "fedncm", p.clients)
    m = attacks.evaluate("labels", view, truth)
    assert m["total_variation"] == 0.0 and m["count_mae"] == 0.0 and m["exact_support"] == 1.0
    assert m["presence_auc"] == 1.0


def test_count_noise_spec_mirrors_the_mechanisms():
    rng = np.random.default_rng(0)
    n = np.zeros(200000)
    lap = count_noise(n + 100, "laplace", epsilon=0.5, rng=rng) - 100  # far from the clip at 0
    # Laplace(b = 2): E|X| = b = 2, sd(|X|) = b, so se = 2 / sqrt(2e5) = 0.0045; 2 % is > 8 se
    assert np.mean(np.abs(lap)) == pytest.approx(2.0, rel=0.02)
    assert np.all(count_noise(n, "uniform", epsilon=0.3, rng=rng) == 0)
    with pytest.raises(ConfigError, match="delta"):
        count_noise(n, "gaussian", epsilon=1.0, rng=rng)
    with pytest.raises(ConfigError, match="unknown count noise"):
        count_noise(n, "poisson", epsilon=1.0, rng=rng)


# ----------------------------------------------------------------------------- determinism, LPIPS
def test_same_seed_same_metrics(digits):
    cl = class_groups(digits["yp"], 2, np.random.default_rng(0), max_groups=12)
    view, truth = _scenario(
        digits, "fedcgs", cl, privacy=NoiseSpec(sigma={"sums": 1.0, "second": 5.0}), rng=4
    )
    view2, _ = _scenario(digits, "fedcgs", cl, privacy=NoiseSpec(sigma={"sums": 1.0, "second": 5.0}), rng=4)
    np.testing.assert_array_equal(view.stats.sums, view2.stats.sums)
    for name in ("tracing", "subspace", "unmixing", "labels", "singleton"):
        a = attacks.evaluate(name, view, truth, rng=5)
        b = attacks.evaluate(name, view2, truth, rng=5)
        assert a.keys() == b.keys(), name
        for key in a:
            assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), (name, key)  # NaN == NaN


def test_lpips_fails_loudly_without_weights():
    x = np.zeros((1, 8, 8))
    with pytest.raises(MissingDependencyError, match="never"):
        lpips_distance(x, x)
    with pytest.raises(MissingDependencyError):
        lpips_distance(x, x, weights_path="/nonexistent/alex.pth")


def test_ground_truth_validates_shapes():
    with pytest.raises(InputError, match="labels and clients"):
        GroundTruth(features=np.zeros((3, 2)), labels=[0, 1], clients=[0, 0, 0])


@pytest.mark.filterwarnings("ignore:noise backend:UserWarning")
def test_evaluate_federation_for_tables_leaves_the_mechanism_ledger_alone(digits):
    from mechanisms import GaussianMechanism

    cl = class_groups(digits["yp"], 1, np.random.default_rng(0), max_groups=60)
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=30.0)
    kw = dict(
        privacy=mech, public=digits["public"], holdout_features=digits["Ft"], holdout_labels=digits["yt"]
    )
    a = attacks.evaluate_federation("tracing", "fedncm", digits["Fp"], digits["yp"], cl, rng=4, **kw)
    b = attacks.evaluate_federation("tracing", "fedncm", digits["Fp"], digits["yp"], cl, rng=4, **kw)
    assert a == b and 0 <= a["auc"] <= 1
    assert len(mech.ledger.events) == 0
    with pytest.raises(InputError, match="second"):
        attacks.evaluate_federation("subspace", "fedncm", digits["Fp"], digits["yp"], cl, **kw)


def test_per_class_second_moments_serve_as_g_and_pseudo_clients_are_attacked(digits):
    cl = class_groups(digits["yp"], 3, np.random.default_rng(0), max_groups=20)
    oracle, truth = _scenario(digits, "fedcof-oracle", cl)
    assert "second" in oracle.available and oracle.stats.second is None
    fed3r, _ = _scenario(digits, "fed3r", cl)
    np.testing.assert_allclose(oracle.second_moments(), fed3r.stats.second, rtol=1e-12, atol=1e-9)
    assert attacks.evaluate("subspace", oracle, truth, rng=0, max_targets=100)["auc"] == 1.0
    # FedCOF multi-mean sampling: rows are pseudo-clients with owners; attacks score against the owner
    from privfed.federation import partition

    p = partition(digits["yp"], 20, "dirichlet", alpha=0.3, rng=0)
    mm, truth = _scenario(digits, "fedcof", p.clients, means_per_client=3, rng=0)
    assert mm.stats.owners is not None
    m = attacks.evaluate("inversion", mm, truth, rng=0, steps=20, max_cells=8)
    assert m["images_scored"] > 0
    assert attacks.evaluate("labels", mm, truth)["total_variation"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("secure", [False, True])
def test_differencing_two_rounds_exposes_the_added_record(digits, secure):
    from attacks.differencing import Differencing

    cl = class_groups(digits["yp"], 3, np.random.default_rng(0), max_groups=30)
    view, truth = _scenario(digits, "fedncm", cl, secure_agg=secure)
    m = attacks.evaluate("differencing", view, truth, rng=1)
    assert m["cells"] == (1 if secure else 30) and m["exact_fraction"] == 1.0
    # by hand: remove record j from client k, subtract, compare (1e-9)
    j = int(np.flatnonzero(cl == 0)[0])
    cl2 = cl.copy()
    cl2[j] = -1
    early, _ = _scenario(digits, "fedncm", cl2, secure_agg=secure)
    res = Differencing().run(view, earlier=early)
    np.testing.assert_allclose(res.features[0], digits["Fp"][j], rtol=0, atol=1e-9)
    # noise on both releases: the recovered record is off by N(0, 2 sigma^2) per coordinate
    sigma = 0.5
    noisy, truth = _scenario(digits, "fedncm", cl, privacy=NoiseSpec(sigma={"sums": sigma}), rng=2)
    mn = attacks.evaluate("differencing", noisy, truth, rng=1)
    # cos ~ 1 / sqrt(1 + 2 sigma^2 d / ||f||^2) = 1 / sqrt(1 + 32 / ||f||^2) >= 0.97 for ||f|| >= 24
    # (the 5th percentile of the feature norms): the mean is above 0.95
    assert mn["exact_fraction"] == 0.0 and mn["mean_cosine"] > 0.95


def test_default_symmetric_nmf_converges_where_the_old_default_stalled(digits):
    # A client's augmented second moment is exactly H H^T with H its records (features and class indicators),
    # so the optimum residual is 0.  The old default (4 starts x 3,000 multiplicative updates) stalls around
    # 2e-3; 16 batched starts with the best 2 polished by L-BFGS-B must get 10x closer and under 1e-4, and the
    # recovered features must sit closer to the true ones.
    cl = class_groups(digits["yp"], 4, np.random.default_rng(2), max_groups=2)
    view, truth = _scenario(digits, "fedcgs", cl)
    k = 0
    G = view.second_moments()[k]
    true = digits["Fp"][truth.clients == k]
    kw = {"sums": view.stats.sums[k], "counts": view.stats.counts[k], "max_seconds": None}
    f_old, _, r_old = unmix(G, 4, rng=np.random.default_rng(0), n_init=4, max_iter=3000, polish=0, **kw)
    f_new, _, r_new = unmix(G, 4, rng=np.random.default_rng(0), **kw)
    assert r_new < r_old / 10 and r_new < 1e-4, (r_old, r_new)

    def rel_err(f):
        _, match = matched_cosine(f, true)
        return np.mean(np.linalg.norm(f[match] - true, axis=1) / np.linalg.norm(true, axis=1))

    assert rel_err(f_new) < rel_err(f_old)
    with pytest.raises(ConfigError, match="polish"):
        symmetric_nmf(G, 4, rng=np.random.default_rng(0), polish=-1)


def test_noise_spec_gaussian_is_the_joint_split_of_the_mechanism():
    """NoiseSpec.gaussian and GaussianMechanism(split="joint") calibrate the same sigma (one calibration)."""
    from mechanisms import GaussianMechanism

    for blocks in (("counts", "sums"), ("counts", "sums", "second")):
        for eps in (0.5, 1.0, 8.0):
            spec = NoiseSpec.gaussian(epsilon=eps, delta=1e-5, clip=2.5, blocks=blocks)
            mech = GaussianMechanism(epsilon=eps, delta=1e-5, clip=2.5, blocks=blocks, split="joint")
            for b in blocks:
                assert spec.sigma[b] == pytest.approx(mech.sigma[b], rel=1e-9)
    # the default mechanism splits mu^2 equally: with sums and counts (clip 2.5) its sums get
    # sqrt(2) c / mu against the joint split's sqrt(c^2 + 1) / mu, i.e. 1.313x the noise
    spec = NoiseSpec.gaussian(epsilon=1.0, delta=1e-5, clip=2.5)
    default = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=2.5)
    assert default.sigma["sums"] / spec.sigma["sums"] == pytest.approx(
        2.5 * math.sqrt(2) / math.sqrt(7.25), rel=1e-9
    )


def test_a_view_or_public_data_an_attack_would_misread_is_refused():
    """NaN sums made the singleton and differencing attacks report nothing exposed (an audit read no risk);
    public features of another width were a numpy broadcast error, labels 0.7 and 1.9 were read as 0 and 1."""
    import attacks
    from attacks.knowledge import PublicData

    rng = np.random.default_rng(0)
    F, y, c = rng.normal(size=(40, 8)), rng.integers(0, 3, 40), np.arange(40) % 7
    view, truth = attacks.scenario("fedncm", F, y, c)
    with pytest.raises(
        InputError, match=r"statistic 'sums' from client 0 .* holds nan; .* instead of being attacked"
    ):
        view.with_(stats=view.stats.with_arrays(sums=np.full_like(view.stats.sums, np.nan)))
    with pytest.raises(InputError, match="PublicData.features has 5 columns but the statistics have d=8"):
        attacks.scenario("fedncm", F, y, c, public=PublicData(labels=[0, 1], features=np.ones((2, 5))))
    for labels in ([0.7, 1.9], [np.nan, 1.0]):
        with pytest.raises(InputError, match="PublicData.labels must hold whole numbers"):
            PublicData(labels=labels, features=np.ones((2, 8)))
    with pytest.raises(InputError, match="PublicData.features contains 16 NaN/inf"):
        PublicData(labels=[0, 1], features=np.full((2, 8), np.nan))
    assert attacks.evaluate("singleton", view, truth)  # the clean view is attacked as before
