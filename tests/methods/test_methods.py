"""Exactness, statistical and robustness tests of the aggregation methods.

Exact maths is checked against independent computations to ~1e-9; the Monte
Carlo tests use fixed seeds and tolerances derived from the estimator's
standard error (see the comments).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.neighbors import NearestCentroid

import privfed
from privfed import methods
from privfed.errors import ConfigError, InputError
from privfed.methods.fedcof import class_covariances, multi_mean_ids
from privfed.methods.fedlog import fedlog_statistic
from privfed.stats import STAT_FIELDS, ClientStats, compute_client_stats

ALL = ("counts", "sums", "second", "class_second")


def blobs(seed=0, N=300, d=6, C=4, K=6, sep=2.0):
    """Gaussian classes spread over K clients, every class on at least 2 clients."""
    rng = np.random.default_rng(seed)
    means = sep * rng.normal(size=(C, d))
    y = np.concatenate([np.repeat(np.arange(C), 2 * K), rng.integers(0, C, N - 2 * K * C)])
    X = means[y] + rng.normal(size=(N, d))
    k = np.concatenate([np.tile(np.arange(K), 2 * C), rng.integers(0, K, N - 2 * K * C)])
    return X, y, k


def unit_rows(W):
    return W / np.linalg.norm(W, axis=1, keepdims=True)


# -- exactness against independent computations -------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lam", [0.01, 3.0])
def test_fed3r_equals_pooled_ridge(bias, lam):
    X, y, k = blobs(1)
    C = 4
    Y = np.eye(C)[y]
    Z = np.hstack([X, np.ones((X.shape[0], 1))]) if bias else X
    coef = Ridge(alpha=lam, fit_intercept=False, solver="cholesky").fit(Z, Y).coef_  # (C, p)
    W, b = coef[:, : X.shape[1]], (coef[:, -1] if bias else np.zeros(C))
    norms = np.linalg.norm(W, axis=1)
    h = privfed.fit("fed3r", X, y, k, lam=lam, bias=bias)
    np.testing.assert_allclose(h.weight, W / norms[:, None], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(h.bias, b / norms, rtol=1e-9, atol=1e-10)
    hu = privfed.fit("fed3r", X, y, k, lam=lam, bias=bias, normalise=False)
    np.testing.assert_allclose(hu.weight, W, rtol=1e-9, atol=1e-10)


def test_fedncm_equals_nearest_centroid():
    X, y, k = blobs(2)
    nc = NearestCentroid().fit(X, y)
    h = privfed.fit("fedncm", X, y, k)
    np.testing.assert_allclose(h.weight, unit_rows(nc.centroids_), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(h.bias, 0.0)
    want = np.argmax(X @ unit_rows(np.stack([X[y == c].mean(0) for c in range(4)])).T, axis=1)
    np.testing.assert_array_equal(h.predict(X), want)


def within_oracle(X, y, C):
    """sum_c (X_c - mean_c)^T (X_c - mean_c) + N mu_g mu_g^T from pooled samples, and B."""
    d = X.shape[1]
    G = np.zeros((d, d))
    for c in range(C):
        D = X[y == c] - X[y == c].mean(0)
        G += D.T @ D
    mg = X.mean(0)
    G += X.shape[0] * np.outer(mg, mg)
    B = np.stack([X[y == c].sum(0) for c in range(C)], axis=1)
    return G, B


def test_fed3r_within_equals_oracle_gamma0_and_pooled_lda():
    X, y, k = blobs(3)
    h1 = privfed.fit("fed3r-within", X, y, k, gamma=0.0)
    h2 = privfed.fit("fedcof-oracle", X, y, k, gamma=0.0, solver="solve")
    np.testing.assert_allclose(h1.weight, h2.weight, rtol=1e-9, atol=1e-10)
    G, B = within_oracle(X, y, 4)
    np.testing.assert_allclose(h1.weight, unit_rows(np.linalg.solve(G, B).T), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("gamma", [0.3, 1.0])
def test_fed3r_within_equals_oracle_with_the_same_gamma(gamma):
    X, y, k = blobs(5)
    h1 = privfed.fit("fed3r-within", X, y, k, gamma=gamma)
    h2 = privfed.fit("fedcof-oracle", X, y, k, gamma=gamma, solver="solve")
    np.testing.assert_allclose(h1.weight, h2.weight, rtol=1e-9, atol=1e-10)
    assert privfed.methods.get("fed3r-within").params["gamma"] == 1.0  # FedCOF's default


def test_oracle_with_shrinkage_matches_pooled_covariances():
    X, y, k = blobs(4)
    gamma = 0.7
    G, B = within_oracle(X, y, 4)
    N_c = np.bincount(y)
    G = G + gamma * np.sum(N_c - 1) * np.eye(X.shape[1])
    h = privfed.fit("fedcof-oracle", X, y, k, gamma=gamma)
    np.testing.assert_allclose(h.weight, unit_rows(np.linalg.solve(G, B).T), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_fedcof_one_sample_per_client_per_class_equals_oracle(gamma):
    """With n_kc in {0, 1}, client means are the samples, K_c = N_c, and Eq. 6 is the exact
    sample covariance; both methods add the same gamma I to every class covariance."""
    rng = np.random.default_rng(6)
    C, d, per = 3, 4, 9
    y = np.repeat(np.arange(C), per)
    X = rng.normal(size=(y.size, d)) + 3 * rng.normal(size=(C, d))[y]
    k = np.concatenate([rng.permutation(per) for _ in range(C)])  # one sample of each class per client
    h1 = privfed.fit("fedcof", X, y, k, gamma=gamma, solver="solve")
    h2 = privfed.fit("fedcof-oracle", X, y, k, gamma=gamma, solver="solve")
    np.testing.assert_allclose(h1.weight, h2.weight, rtol=1e-9, atol=1e-10)
    assert not any("one client" in n for n in h1.notes)


def test_fedcof_components_match_eq6_and_eq8():
    """G_hat of aggregate = sum_c (N_c - 1) Sigma_c + N mu_g mu_g^T with Sigma_c from explicit loops."""
    X, y, k = blobs(7)
    st = compute_client_stats(X, y, k, num_classes=4)
    gamma = 0.3
    m = methods.get("fedcof", gamma=gamma)
    est = m.estimate(st)
    d = X.shape[1]
    G = np.zeros((d, d))
    for c in range(4):
        rows = [kk for kk in range(6) if st.counts[kk, c] > 0]
        n = st.counts[rows, c]
        mus = st.sums[rows, c] / n[:, None]
        mu = (n[:, None] * mus).sum(0) / n.sum()
        S = sum(n[j] * np.outer(mus[j] - mu, mus[j] - mu) for j in range(len(rows))) / (len(rows) - 1)
        S = S + gamma * np.eye(d)
        np.testing.assert_allclose(class_covariances(st, gamma)[c], S, rtol=1e-10, atol=1e-12)
        G += (n.sum() - 1) * S
    mg = X.mean(0)
    G += X.shape[0] * np.outer(mg, mg)
    np.testing.assert_allclose(est.G_hat, G, rtol=1e-10, atol=1e-9)
    h = m.aggregate(st)
    B = np.stack([X[y == c].sum(0) for c in range(4)], axis=1)
    np.testing.assert_allclose(h.weight, unit_rows((np.linalg.pinv(G) @ B).T), rtol=1e-9, atol=1e-10)


def _fedlog_objective(eta, a, nu_n):
    """Eq. 15 written out independently (explicit max-shifted log-sum-exp)."""
    r = np.array([eta[y] @ eta[y] / 4.0 for y in range(eta.shape[0])])
    lse = r.max() + np.log(np.sum(np.exp(r - r.max())))
    return float(sum(eta[y] @ a[y] for y in range(eta.shape[0])) - nu_n * lse)


def _fedlog_grad(eta, a, nu_n):
    r = np.array([eta[y] @ eta[y] / 4.0 for y in range(eta.shape[0])])
    p = np.exp(r - r.max())
    p /= p.sum()
    return a - nu_n * p[:, None] * eta / 2.0, p


@pytest.mark.parametrize("nu,chi", [(1.0, 0.0), (0.0, 0.0), (5.0, 0.3)])
def test_fedlog_stationary_and_fixed_point(nu, chi):
    X, y, k = blobs(8, d=5)
    h = privfed.fit("fedlog", X, y, k, nu=nu, chi=chi)
    eta = np.hstack([h.bias[:, None], h.weight])
    Phi = np.stack([np.concatenate([[np.sum(y == c)], X[y == c].sum(0)]) for c in range(4)])
    a = Phi + chi
    nu_n = nu + X.shape[0]
    # 1. the explicit gradient formula is right: central finite differences at a random point
    #    (error O(h^2 |f'''|) + O(eps |f| / h), both << 1e-4 relative at h = 1e-5 here)
    rng = np.random.default_rng(0)
    e0 = 0.01 * rng.normal(size=eta.shape)
    g0, _ = _fedlog_grad(e0, a, nu_n)
    fd = np.zeros_like(e0)
    hstep = 1e-5
    for idx in np.ndindex(*e0.shape):
        ep, em = e0.copy(), e0.copy()
        ep[idx] += hstep
        em[idx] -= hstep
        fd[idx] = (_fedlog_objective(ep, a, nu_n) - _fedlog_objective(em, a, nu_n)) / (2 * hstep)
    np.testing.assert_allclose(fd, g0, rtol=1e-5, atol=1e-5 * np.abs(g0).max())
    # 2. the head is a stationary point (gradient ~ 0 relative to the statistic's scale)
    g, p = _fedlog_grad(eta, a, nu_n)
    assert np.abs(g).max() <= 1e-9 * np.abs(a).max()
    # 3. fixed point eta_y = 2 (chi_y + Phi_y) / ((nu + n) p_y)
    np.testing.assert_allclose(eta, 2 * a / (nu_n * p[:, None]), rtol=1e-9, atol=1e-12)
    # 4. concave objective: random perturbations never increase it
    f_star = _fedlog_objective(eta, a, nu_n)
    for _ in range(20):
        assert _fedlog_objective(eta + 1e-3 * rng.normal(size=eta.shape), a, nu_n) <= f_star
    # 5. the L-BFGS solver agrees
    hl = privfed.fit("fedlog", X, y, k, nu=nu, chi=chi, solver="lbfgs")
    np.testing.assert_allclose(hl.weight, h.weight, rtol=1e-5, atol=1e-7 * np.abs(h.weight).max())


def test_fedlog_statistic_layout():
    X, y, k = blobs(9)
    st = compute_client_stats(X, y, k, num_classes=4)
    Phi, n = fedlog_statistic(st)
    assert n == X.shape[0]
    np.testing.assert_allclose(Phi[:, 0], np.bincount(y))
    np.testing.assert_allclose(Phi[:, 1:], np.stack([X[y == c].sum(0) for c in range(4)]), atol=1e-10)


def test_fedcgs_equals_shared_covariance_gaussian():
    X, y, k = blobs(10, N=500)
    N, C = X.shape[0], 4
    for cov in ("total", "within"):
        h = privfed.fit("fedcgs", X, y, k, covariance=cov, shrinkage=0.0)
        if cov == "total":
            S = np.cov(X.T)
        else:
            D = [X[y == c] - X[y == c].mean(0) for c in range(C)]
            S = sum(Dc.T @ Dc for Dc in D) / (N - C)
        mus = np.stack([X[y == c].mean(0) for c in range(C)])
        W = np.linalg.solve(S, mus.T).T
        b = np.log(np.bincount(y) / N) - 0.5 * np.sum(mus * W, axis=1)
        np.testing.assert_allclose(h.weight, W, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(h.bias, b, rtol=1e-9, atol=1e-10)
    # within + no shrinkage is LDA: scikit-learn's covariance_ is the within scatter / N
    # (ours / (N - C)), so its coef_ is ours times N / (N - C)
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    lda = LinearDiscriminantAnalysis(solver="lsqr").fit(X, y)
    h = privfed.fit("fedcgs", X, y, k, covariance="within", shrinkage=0.0)
    np.testing.assert_allclose(lda.coef_, h.weight * N / (N - C), rtol=1e-8, atol=1e-8)


# -- Proposition 1 and the noise-aware estimator: Monte Carlo --------------------------
def _mc_estimates(R, sizes, Sigma, noise_var, rng):
    """R independent FedCOF class covariances (gamma = 0) from clients with ``sizes`` samples."""
    d = Sigma.shape[0]
    L = np.linalg.cholesky(Sigma)
    mu = np.arange(1.0, d + 1)
    plain, aware = np.empty((R, d, d)), np.empty((R, d, d))
    for r in range(R):
        sums = np.stack([(mu + rng.normal(size=(n, d)) @ L.T).sum(0) for n in sizes])
        if noise_var:
            sums = sums + np.sqrt(noise_var) * rng.normal(size=sums.shape)
        st = ClientStats(counts=np.asarray(sizes, float)[:, None], sums=sums[:, None, :])
        plain[r] = class_covariances(st, 0.0)[0]
        aware[r] = class_covariances(st, 0.0, noise_var=noise_var)[0] if noise_var else plain[r]
    return plain, aware


def _within_4se(est, Sigma):
    """|mean - Sigma| < 4 standard errors in every entry.

    The R estimates are iid, so the mean of each entry is approximately normal
    with standard error sd/sqrt(R) (R = 3000 >> 1, CLT; the estimator has finite
    variance for Gaussian data).  A two-sided 4-SE miss has probability 6e-5 per
    entry, ~1e-3 over the 6 distinct entries of a 3 x 3 matrix.
    """
    R = est.shape[0]
    se = est.std(axis=0, ddof=1) / np.sqrt(R)
    return bool(np.all(np.abs(est.mean(axis=0) - Sigma) < 4 * se)), se


def test_proposition1_unbiased_with_unequal_clients():
    rng = np.random.default_rng(11)
    A = rng.normal(size=(3, 3))
    Sigma = A @ A.T + 0.5 * np.eye(3)
    sizes = [2, 3, 5, 9, 17]
    plain, _ = _mc_estimates(3000, sizes, Sigma, 0.0, rng)
    ok, se = _within_4se(plain, Sigma)
    assert ok
    # Power: the biased normalisation 1/K_c (instead of 1/(K_c - 1)) has mean (K-1)/K Sigma,
    # 0.2 Sigma away, ~20 SE on the diagonal here: the same test rejects it.
    K = len(sizes)
    assert not _within_4se(plain * (K - 1) / K, Sigma)[0]


def test_noise_aware_estimator_removes_noise_bias():
    """Noise of variance s2 on each class sum inflates Eq. 6 by s2/(K-1)(sum 1/n_k - K/N) I;
    the noise-aware estimator is unbiased again, the plain one is not."""
    rng = np.random.default_rng(12)
    Sigma = np.array([[1.0, 0.3, 0.0], [0.3, 1.5, -0.2], [0.0, -0.2, 0.8]])
    sizes = [2, 3, 4, 6, 10]
    s2 = 4.0
    plain, aware = _mc_estimates(3000, sizes, Sigma, s2, rng)
    assert _within_4se(aware, Sigma)[0]
    assert not _within_4se(plain, Sigma)[0]
    beta = s2 / (len(sizes) - 1) * (np.sum(1.0 / np.array(sizes)) - len(sizes) / sum(sizes))
    np.testing.assert_allclose(np.diag(plain[0] - aware[0]), beta, rtol=1e-12)


# -- multi-mean sampling (App. E) -------------------------------------------------------
def test_multi_mean_sampling_partitions_each_client_class():
    rng = np.random.default_rng(13)
    N, C, K, M = 200, 3, 4, 5
    y = rng.integers(0, C, N)
    k = rng.integers(0, K, N)
    y[:3], k[:3] = 0, 3  # client 3 has exactly... at least a few samples of class 0
    pseudo, owners = multi_mean_ids(y, k, C, K, M, np.random.default_rng(0))
    assert np.all(owners[pseudo] == k)  # a pseudo-client belongs to the sample's client
    for kk in range(K):
        for c in range(C):
            sel = (k == kk) & (y == c)
            n = int(sel.sum())
            if n == 0:
                continue
            chunks = np.bincount(pseudo[sel])
            chunks = chunks[chunks > 0]
            assert chunks.size == max(1, min(M, n // 2))
            if n >= 2:
                assert chunks.min() >= 2
            assert chunks.max() - chunks.min() <= 1
    X = rng.normal(size=(N, 2))
    m = methods.get("fedcof", means_per_client=M)
    st = m.client_stats(X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(1))
    real = compute_client_stats(X, y, k, num_classes=C, num_clients=K)
    agg = np.zeros_like(real.sums)
    np.add.at(agg, st.owners, st.sums)
    np.testing.assert_allclose(agg, real.sums, atol=1e-12)
    # M = 1 is plain FedCOF
    one = methods.get("fedcof").client_stats(
        X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(1)
    )
    np.testing.assert_array_equal(one.counts, real.counts)


# -- secure aggregation -------------------------------------------------------------------
def plain_sum(a):
    return np.asarray(a).sum(axis=0)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"gamma": 0.0, "solver": "solve"},
        {"means_per_client": 3},
        {"noise_var": 0.5},
        {"gamma": 0.1, "solver": "solve"},
    ],
)
def test_fedcof_two_round_secure_protocol_equals_aggregate(params):
    X, y, k = blobs(14)
    m = methods.get("fedcof", **params)
    st = m.client_stats(X, y, k, num_classes=4, num_clients=6, rng=np.random.default_rng(2))
    seen = []

    def recording_sum(a):
        seen.append(np.asarray(a).shape)
        return plain_sum(a)

    h1 = m.aggregate(st)
    h2 = m.secure_aggregate(st, recording_sum)
    np.testing.assert_allclose(h2.weight, h1.weight, rtol=1e-9, atol=1e-10)
    # one row per real client in every secure sum, last one the (K, d^2 + 1) round-2 spreads (and whether
    # each was clipped)
    assert all(s[0] == 6 for s in seen)
    assert seen[-1] == (6, X.shape[1] ** 2 + 1)


def test_fedcof_secure_with_noisy_counts_matches_aggregate():
    X, y, k = blobs(15)
    st = compute_client_stats(X, y, k, num_classes=4)
    rng = np.random.default_rng(3)
    noisy = st.with_arrays(
        counts=st.counts + rng.normal(0, 2.0, st.counts.shape),
        sums=st.sums + rng.normal(0, 1.0, st.sums.shape),
    )
    m = methods.get("fedcof")
    np.testing.assert_allclose(
        m.secure_aggregate(noisy, plain_sum).weight, m.aggregate(noisy).weight, rtol=1e-9, atol=1e-10
    )


# -- contract: every registered method -----------------------------------------------------
@pytest.mark.parametrize("name", methods.available())
def test_method_contract(name):
    X, y, k = blobs(16)
    cls = methods.get_class(name)
    assert cls.name == name and cls.paper
    assert set(cls.requires) <= set(STAT_FIELDS) and {"counts", "sums"} <= set(cls.requires)
    assert isinstance(cls.per_client, bool)
    h = privfed.fit(name, X, y, k)
    assert h.weight.shape == (4, X.shape[1]) and h.bias.shape == (4,)
    assert np.all(np.isfinite(h.weight)) and np.all(np.isfinite(h.bias))
    assert h.predict(X).shape == (X.shape[0],)
    assert h.score(X, y) > 0.8
    assert h.method == name
    assert cls.upload_bytes(M=24, K=6, d=X.shape[1], C=4) > 0
    assert h.upload_bytes["total"] > 0
    m = methods.get(name)
    st = compute_client_stats(X, y, k, num_classes=4, fields=m.requires)
    ref = m.aggregate(st if m.per_client else st.total())
    if m.per_client and type(m).secure_aggregate is methods.Method.secure_aggregate:
        with pytest.raises(ConfigError, match="secure aggregation"):
            m.secure_aggregate(st, plain_sum)
    else:
        sec = m.secure_aggregate(st, plain_sum)
        np.testing.assert_allclose(sec.weight, ref.weight, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(sec.bias, ref.bias, rtol=1e-9, atol=1e-10)
    if not m.per_client:  # per-client and summed statistics give the same head
        np.testing.assert_allclose(m.aggregate(st).weight, ref.weight, rtol=1e-9, atol=1e-10)


# -- bad input --------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    X, y, k = blobs(17)
    Xn = X.copy()
    Xn[3, 2] = np.nan
    with pytest.raises(InputError, match="NaN/inf"):
        privfed.fit("fedcof", Xn, y, k)
    Xi = X.copy()
    Xi[0, 0] = np.inf
    with pytest.raises(InputError, match="NaN/inf"):
        privfed.fit("fed3r", Xi, y, k)
    with pytest.raises(InputError, match="out of range for num_classes"):
        privfed.fit("fedncm", X, y, k, num_classes=3)
    with pytest.raises(InputError, match="must be >= 0"):
        privfed.fit("fedncm", X, y - 1, k)
    with pytest.raises(InputError, match="no sample on any client"):
        privfed.fit("fedcof", X, np.where(y == 2, 3, y), k)
    with pytest.raises(InputError, match=r"client\(s\) \[2\] have no data"):
        privfed.fit("fedcof", X, y, np.where(k == 2, 1, k))
    with pytest.raises(InputError, match="must match"):
        privfed.fit("fedcof", X, y[:-1], k)
    with pytest.raises(InputError, match="must match"):
        privfed.fit("fedcof", X, y, k[:-1])
    with pytest.raises(ConfigError, match="unknown parameter"):
        privfed.fit("fedcof", X, y, k, lam=0.1)
    with pytest.raises(ConfigError, match="unknown method"):
        privfed.fit("fedxyz", X, y, k)


@pytest.mark.parametrize(
    "name,params,msg",
    [
        ("fedcof", {"gamma": -1.0}, "gamma must be >= 0"),
        ("fedcof", {"gamma": float("nan")}, "gamma must be finite"),
        ("fedcof", {"means_per_client": 0}, "means_per_client must be an integer >= 1"),
        ("fedcof", {"means_per_client": 2.5}, "means_per_client must be an integer >= 1"),
        ("fedcof", {"solver": "qr"}, "solver must be one of"),
        ("fedcof", {"noise_var": -0.1}, "noise_var must be >= 0"),
        ("fedcof-oracle", {"gamma": -0.5}, "gamma must be >= 0"),
        ("fed3r", {"lam": -0.01}, "lam must be >= 0"),
        ("fed3r", {"bias": "yes"}, "bias must be True or False"),
        ("fed3r-within", {"lam": -1}, "lam must be >= 0"),
        ("fed3r-within", {"gamma": -1}, "gamma must be >= 0"),
        ("fedcgs", {"shrinkage": 1.5}, "shrinkage must be <= 1"),
        ("fedcgs", {"covariance": "diag"}, "covariance must be one of"),
        ("fedlog", {"nu": -1.0}, "nu must be >= 0"),
        ("fedlog", {"nu": float("inf")}, "nu must be finite"),
        ("fedlog", {"nu": "one"}, "nu must be a real number"),
        ("fedlog", {"chi": [np.nan]}, "chi must be finite"),
    ],
)
def test_invalid_parameter_values(name, params, msg):
    with pytest.raises(ConfigError, match=msg):
        methods.get(name, **params)


def test_fedlog_chi_shape_mismatch():
    X, y, k = blobs(18)
    with pytest.raises(ConfigError, match="does not broadcast"):
        privfed.fit("fedlog", X, y, k, chi=np.zeros(3))


def test_fedcof_class_seen_by_one_client_is_reported():
    X, y, k = blobs(19)
    k = k.copy()
    k[y == 1] = 0  # class 1 lives on client 0 only
    h = privfed.fit("fedcof", X, y, k, gamma=0.5)
    note = [n for n in h.notes if "seen by one client" in n]
    assert note and "[1]" in note[0] and "gamma I" in note[0]
    assert np.all(np.isfinite(h.weight))
    # that class's covariance is exactly gamma I
    st = compute_client_stats(X, y, k, num_classes=4)
    np.testing.assert_allclose(class_covariances(st, 0.5)[1], 0.5 * np.eye(X.shape[1]))


def test_fedcgs_singular_without_shrinkage_says_set_shrinkage():
    rng = np.random.default_rng(20)
    X = rng.normal(size=(12, 30))  # d = 30 > N - C
    y = np.arange(12) % 3
    with pytest.raises(InputError, match=r"set shrinkage > 0"):
        privfed.fit("fedcgs", X, y, np.arange(12) % 4, shrinkage=0.0)
    h = privfed.fit("fedcgs", X, y, np.arange(12) % 4, shrinkage=0.1)
    assert np.all(np.isfinite(h.weight))


def test_missing_statistics_named():
    X, y, k = blobs(21)
    st = compute_client_stats(X, y, k, num_classes=4)
    with pytest.raises(InputError, match=r"needs statistics \['second'\]"):
        methods.get("fed3r").aggregate(st.total())


# -- noisy statistics: finite heads, repairs reported -------------------------------------
def _noisy(st, rng, count_sd, sum_sd, second_sd=0.0):
    arrays = {
        "counts": st.counts + rng.normal(0, count_sd, st.counts.shape),
        "sums": st.sums + rng.normal(0, sum_sd, st.sums.shape),
    }
    if st.second is not None:
        E = rng.normal(0, second_sd, st.second.shape)
        arrays["second"] = st.second + 0.5 * (E + np.swapaxes(E, 1, 2))
    return st.with_arrays(**arrays)


def test_fedcof_noisy_stats_finite_and_noted():
    X, y, k = blobs(22, K=30)  # ~2.5 samples a (client, class) pair: noise sd 3 makes some counts <= 0
    st = compute_client_stats(X, y, k, num_classes=4)
    noisy = _noisy(st, np.random.default_rng(4), 3.0, 2.0)
    assert (noisy.counts <= 0).any()
    h = methods.get("fedcof").aggregate(noisy)
    assert np.all(np.isfinite(h.weight))
    assert any("dropped" in n for n in h.notes)
    # an over-estimated noise variance drives G_hat indefinite: projected, and said so
    h = methods.get("fedcof", gamma=0.0, noise_var=500.0).aggregate(noisy)
    assert np.all(np.isfinite(h.weight))
    assert any("noise-aware" in n for n in h.notes)
    assert any("PSD cone" in n for n in h.notes)


def test_fedcof_fractional_and_tiny_counts():
    X, y, k = blobs(23)
    st = compute_client_stats(X, y, k, num_classes=4)
    counts = st.counts * 0.01  # fractional, classes with N_c < 1
    h = methods.get("fedcof").aggregate(st.with_arrays(counts=counts))
    assert np.all(np.isfinite(h.weight))
    assert any("N_c < 1" in n for n in h.notes)


def test_fedlog_noisy_stats_finite_and_noted():
    X, y, k = blobs(24)
    st = compute_client_stats(X, y, k, num_classes=4).total()
    noisy = st.with_arrays(counts=st.counts - 400.0 + np.random.default_rng(5).normal(0, 5, st.counts.shape))
    h = methods.get("fedlog").aggregate(noisy)
    assert np.all(np.isfinite(h.weight)) and np.all(np.isfinite(h.bias))
    assert any("count <= 0" in n for n in h.notes)
    assert any("unbounded" in n for n in h.notes)
    # moderately noisy statistics: still a stationary point of Eq. 15
    mild = _noisy(st, np.random.default_rng(6), 2.0, 2.0)
    h = methods.get("fedlog").aggregate(mild)
    assert h.extras["gradient_norm"] <= 1e-8 * np.abs(mild.sums).max()


@pytest.mark.parametrize("name", ["fed3r", "fed3r-within", "fedcgs"])
def test_second_moment_methods_repair_indefinite_noise(name):
    X, y, k = blobs(25, d=8, N=60)
    st = compute_client_stats(X, y, k, num_classes=4, fields=ALL).total()
    noisy = _noisy(st, np.random.default_rng(7), 1.0, 1.0, second_sd=40.0)
    h = methods.get(name).aggregate(noisy)
    assert np.all(np.isfinite(h.weight)) and np.all(np.isfinite(h.bias))
    assert any("PSD cone" in n for n in h.notes)


def test_absent_class_after_noise_gets_zero_row():
    X, y, k = blobs(26)
    st = compute_client_stats(X, y, k, num_classes=4, fields=ALL)
    counts = st.counts.copy()
    counts[:, 2] = -1.0
    noisy = st.with_arrays(counts=counts)
    for name in ["fedncm", "fedcof", "fedcgs", "fed3r-within", "fedcof-oracle"]:
        m = methods.get(name)
        h = m.aggregate(noisy if m.per_client else noisy.total())
        assert np.all(h.weight[2] == 0), name
        assert any("[2]" in n for n in h.notes), name


def test_singular_matrix_falls_back_to_pinv_and_says_so():
    """A dead (always-zero) feature makes G_hat singular: the pseudo-inverse solution equals the
    solution of the reduced system with zero weight on the dead feature."""
    X, y, k = blobs(27)
    Xd = np.hstack([X, np.zeros((X.shape[0], 1))])
    h = privfed.fit("fed3r-within", Xd, y, k, gamma=0.0)
    assert any("singular" in n and "pseudo-inverse" in n for n in h.notes)
    ref = privfed.fit("fed3r-within", X, y, k, gamma=0.0)
    np.testing.assert_allclose(h.weight[:, :-1], ref.weight, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(h.weight[:, -1], 0.0, atol=1e-12)
    assert not ref.notes


def test_fedcof_secure_owner_grouping_with_gaps():
    """Pseudo-client rows are summed per owner before the secure sum, whatever the owner ids."""
    X, y, k = blobs(28)
    st = compute_client_stats(X, y, k, num_classes=4)
    for owners in (
        np.array([0, 0, 1, 1, 2, 2]),
        np.array([3, 0, 3, 0, 5, 5]),
    ):  # second: owners 1, 2, 4 empty
        seen = []
        grouped = ClientStats(counts=st.counts, sums=st.sums, owners=owners)
        m = methods.get("fedcof")
        h = m.secure_aggregate(grouped, lambda a: (seen.append(np.asarray(a)), np.asarray(a).sum(0))[1])  # noqa: B023
        np.testing.assert_allclose(h.weight, m.aggregate(st).weight, rtol=1e-9, atol=1e-10)
        # round 1's vector starts with the owner's counts
        np.testing.assert_allclose(seen[0][owners[0]][:4], st.counts[owners == owners[0]].sum(0))


# -- pair layout, streaming fold and servers at the bound -------------------------------
def _ragged(seed, N=240, d=5, C=5, K=10):
    """Empty clients, one-sample (client, class) cells, a single-client class."""
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(C, d))
    y = rng.integers(0, C - 1, N)
    k = rng.integers(0, K - 2, N)
    y[:3], k[:3] = C - 1, K - 2  # class C-1 on one client only
    y[3], k[3] = 0, K - 1  # one-sample client
    X = means[y] + rng.normal(size=(N, d))
    return X, y, k, C, K


PAIRED = [
    ("fedncm", {}),
    ("fed3r", {}),
    ("fed3r", {"bias": False}),
    ("fed3r-within", {}),
    ("fedcgs", {}),
    ("fedcgs", {"covariance": "within"}),
    ("fedlog", {}),
    ("fedcof", {}),
    ("fedcof", {"gamma": 0.0, "solver": "solve"}),
    ("fedcof", {"noise_var": 0.3}),
    ("fedcof", {"means_per_client": 3}),
    ("fedcof-oracle", {}),
    ("fedcof-oracle", {"gamma": 0.0}),
]


@pytest.mark.parametrize("name,params", PAIRED)
@pytest.mark.parametrize("seed", [0, 1])
def test_pair_and_dense_layouts_give_the_same_head(name, params, seed):
    X, y, k, C, K = _ragged(seed)
    m = methods.get(name, **params)
    st = m.client_stats(X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(seed))
    dense = ClientStats(
        counts=np.array(st.counts),
        sums=np.array(st.sums),
        second=None if st.second is None else np.array(st.second),
        class_second=None if st.class_second is None else np.array(st.class_second),
        owners=st.owners,
    )
    ref = m.aggregate(dense)
    for got in (
        m.aggregate(st),
        privfed.fit(name, X, y, k, num_classes=C, random_state=seed, **params) if K == k.max() + 1 else None,
        privfed.release.pipeline.server_head(m, st, num_clients=K, rng=np.random.default_rng(0)),
    ):
        if got is None:
            continue
        np.testing.assert_allclose(got.weight, ref.weight, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(got.bias, ref.bias, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("chunk_bytes", [1, 1500])
@pytest.mark.parametrize("name,params", PAIRED)
def test_streaming_fold_in_small_chunks_equals_one_pass(name, params, chunk_bytes):
    """fold_statistics in client chunks (one client, or a few) gives the head of the whole federation."""
    X, y, k, C, K = _ragged(2)
    k = np.unique(k, return_inverse=True)[1]
    K = int(k.max()) + 1
    m = methods.get(name, **params)
    st = m.client_stats(X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(4))
    folded = privfed.release.pipeline.fold_statistics(
        m, X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(4), chunk_bytes=chunk_bytes
    )
    assert folded.folded_pairs == st.num_pairs()
    if m.per_client:
        np.testing.assert_array_equal(folded.pair_client, st.pair_client)
        if st.owners is not None:
            np.testing.assert_array_equal(folded.owners, st.owners)
    np.testing.assert_allclose(m.aggregate(folded).weight, m.aggregate(st).weight, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("gamma", [0.0, 0.4])
def test_oracle_from_the_total_second_moment_equals_per_class_pooling(gamma):
    """The oracle's O(d^2) server (total second moment) equals Eq. 24 pooled class by class
    from the per-class second moments, and fed3r-within with the same gamma."""
    X, y, k, C, K = _ragged(5)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K, fields=ALL)
    assert not st.is_materialised("class_second")
    m = methods.get("fedcof-oracle", gamma=gamma, solver="solve")
    lazy = m.aggregate(st)
    assert not st.is_materialised("class_second")  # the server never built (K, C, d, d)
    per_class = m.aggregate(
        ClientStats(counts=st.counts, sums=st.sums, class_second=np.array(st.class_second))
    )
    np.testing.assert_allclose(lazy.weight, per_class.weight, rtol=1e-9, atol=1e-10)
    within = methods.get("fed3r-within", gamma=gamma).aggregate(st)
    np.testing.assert_allclose(lazy.weight, within.weight, rtol=1e-9, atol=1e-10)
    # independent: sum_c scatter of class c by explicit loops, + gamma sum_c (N_c - 1) I + N mu_g mu_g^T
    d = X.shape[1]
    G = sum(((X[y == c] - X[y == c].mean(0)).T @ (X[y == c] - X[y == c].mean(0))) for c in range(C))
    G = (
        G
        + gamma * sum(np.sum(y == c) - 1 for c in range(C)) * np.eye(d)
        + np.outer(X.sum(0), X.sum(0)) / len(y)
    )
    B = np.stack([X[y == c].sum(0) for c in range(C)], axis=1)
    np.testing.assert_allclose(lazy.weight, unit_rows(np.linalg.solve(G, B).T), rtol=1e-9, atol=1e-10)


def test_fedcof_pair_server_equals_dense_components():
    """The pair-row spread equals the dense Eq. 6 building blocks (valid_pairs, class_totals, spread_matrix)."""
    from privfed.methods.fedcof import class_totals, spread_matrix, spread_weights, valid_pairs, within_matrix

    X, y, k, C, K = _ragged(6)
    st = compute_client_stats(X, y, k, num_classes=C, num_clients=K)
    mask, _ = valid_pairs(st.counts)
    N, S, mu, Kc = class_totals(st.counts, st.sums, mask)
    G = within_matrix(N, S, Kc, spread_matrix(st.counts, st.sums, mu, spread_weights(N, Kc), mask), 0.7)
    est = methods.get("fedcof", gamma=0.7).estimate(st)
    np.testing.assert_allclose(est.G_hat, G, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(est.Kc, Kc)


def test_cholesky_first_and_fallback_named_in_notes():
    from privfed._linalg import solve_head

    rng = np.random.default_rng(0)
    A = rng.normal(size=(8, 5))
    G, B = A.T @ A + np.eye(5), rng.normal(size=(5, 3))
    for solver in ("solve", "pinv"):
        notes = []
        np.testing.assert_allclose(
            solve_head(G, B, solver=solver, notes=notes), np.linalg.solve(G, B), rtol=1e-12, atol=1e-12
        )
        assert notes == []
    singular = A[:3].T @ A[:3]  # rank 3 of 5
    notes = []
    X = solve_head(singular, B, solver="pinv", notes=notes)
    np.testing.assert_allclose(
        X, np.linalg.pinv(singular, rcond=5 * np.finfo(float).eps, hermitian=True) @ B, rtol=1e-8, atol=1e-8
    )
    assert any("Cholesky of G failed" in n for n in notes)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("chunk_bytes", [8, 8 * 5 * 7, 8 * 5 * 64, None])
@pytest.mark.parametrize("name,params", [("fedcof", {}), ("fedcof", {"means_per_client": 3}), ("fed3r", {})])
def test_fold_statistics_equal_an_independent_loop(name, params, chunk_bytes, dtype):
    """The fold's pairs, class totals and X^T X equal plain per-(client, class) sums of the same float64
    values, whether chunks cut pairs (7 rows a chunk, 64 rows) or not (1 row, the default), for float32
    input too; empty clients, one-sample cells and a one-client class included."""
    X, y, k, C, K = _ragged(3)
    X = X.astype(dtype)
    m = methods.get(name, **params)
    folded = privfed.release.pipeline.fold_statistics(
        m, X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(4), chunk_bytes=chunk_bytes
    )
    groups, owners = m.row_groups(y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(4))
    X64 = X.astype(np.float64)
    cells = sorted({(int(g), int(c)) for g, c in zip(groups, y)})
    ref_S = np.array([X64[(groups == g) & (y == c)].sum(axis=0) for g, c in cells])
    ref_n = np.array([np.sum((groups == g) & (y == c)) for g, c in cells], dtype=float)
    assert folded.folded_pairs == len(cells)
    if m.per_client:
        np.testing.assert_array_equal(folded.pair_client, [g for g, _ in cells])
        np.testing.assert_array_equal(folded.pair_class, [c for _, c in cells])
        np.testing.assert_array_equal(folded.pair_counts, ref_n)
        np.testing.assert_allclose(folded.pair_sums, ref_S, rtol=1e-12, atol=1e-12)
        assert folded.num_clients == (K if owners is None else owners.size)
        if owners is not None:
            np.testing.assert_array_equal(folded.owners, owners)
    else:
        N, S = folded.class_totals()
        np.testing.assert_array_equal(N, np.bincount(y, minlength=C))
        np.testing.assert_allclose(
            S, np.stack([X64[y == c].sum(axis=0) for c in range(C)]), rtol=1e-12, atol=1e-12
        )
        np.testing.assert_allclose(folded.gram(), X64.T @ X64, rtol=1e-12, atol=1e-10)
