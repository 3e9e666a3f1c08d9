"""FedNCM's and FedLog's servers against straightforward computations of the same heads.

The servers read the class sums once for their row norms and once to write the head (no means, no
(C, d + 1) statistic, no gradient array); these tests pin that the heads are those of the formulas
as written: FedNCM's mu_c / ||mu_c|| (row norms by ``math.hypot``, exact to an ulp and free of
overflow), FedLog's MAP eta = t a of Eq. 15 from the (C, d + 1) statistic.  Tolerances: a unit row
computed two ways differs by a few ulps (1e-15 absolute); FedLog's MAP by the root's rtol (4 eps)
amplified by the conditioning of t (1e-12 relative).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import privfed
from privfed._linalg import normalise_rows, one_blas_thread, row_squares
from privfed.methods.fedlog import (
    fedlog_gradient,
    map_gradient_norm,
    map_multipliers,
    solve_map,
)
from privfed.scaling import median_mean_norm
from privfed.stats import ClientStats


def _unit_rows(W: np.ndarray) -> np.ndarray:
    """Each row over its norm by math.hypot, after an exact power-of-two scaling of the row to a peak
    in [0.5, 1) (so a subnormal row's norm keeps its 53 bits); zero rows stay zero."""
    out = np.zeros_like(W)
    for i, row in enumerate(W):
        peak = float(np.max(np.abs(row)))
        if peak > 0:
            x = np.ldexp(row, -math.frexp(peak)[1])
            out[i] = x / math.hypot(*x)
    return out


def _extreme_rows(rng, d=7):
    base = rng.standard_normal((9, d))
    scales = np.array([1.0, 1e160, 1e-170, 1e300, 1e-300, 3.0, 2.0**-1060, 1e-3, 1e150])
    W = base * scales[:, None]
    W[5] = 0.0  # a zero row
    return W


def test_normalise_rows_equals_hypot_for_every_magnitude():
    rng = np.random.default_rng(0)
    W = _extreme_rows(rng)
    b = rng.standard_normal(W.shape[0])
    out, ob = normalise_rows(W, b)
    ref = _unit_rows(W)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-15)
    assert np.all(out[5] == 0.0) and ob[5] == 0.0
    norms = np.array([math.hypot(*r) for r in W])
    keep = norms > 1e-300  # b / norm is a float (a subnormal row's 1 / norm overflows)
    np.testing.assert_allclose(ob[keep], b[keep] / norms[keep], rtol=1e-15)
    # each row's result is that row's alone: the same bits whatever rows stand beside it
    for i in range(W.shape[0]):
        assert np.array_equal(normalise_rows(W[i : i + 1])[0], out[i])


def test_one_blas_thread_limits_its_block_restores_after_and_rescans_after_an_import(monkeypatch):
    """The kept library scan limits every BLAS inside the block to one thread and puts the limits back; a module
    imported since the scan makes it scan again (a BLAS arrives with the module that loads it)."""
    import sys
    import types

    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() and set(blas_threads()) == {2}
        with one_blas_thread():
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {2}
        import privfed._linalg as linalg

        kept = linalg._BLAS_CONTROL["controller"]
        with one_blas_thread():
            pass
        assert linalg._BLAS_CONTROL["controller"] is kept  # nothing imported: the scan is kept
        monkeypatch.setitem(
            sys.modules, "privfed_test_new_module", types.ModuleType("privfed_test_new_module")
        )
        with one_blas_thread():
            assert set(blas_threads()) == {1}
        assert linalg._BLAS_CONTROL["controller"] is not kept
        assert set(blas_threads()) == {2}


def test_row_squares_is_the_sum_of_squares():
    W = np.random.default_rng(1).standard_normal((50, 33))
    np.testing.assert_allclose(row_squares(W), [math.fsum(x * x for x in r) for r in W], rtol=1e-14)
    assert row_squares(np.zeros((3, 0))).tolist() == [0.0, 0.0, 0.0]


def _stats(rng, C=12, d=9, K=1, scale=1.0, absent=(3,), negative=(7,)):
    counts = rng.integers(1, 20, size=(K, C)).astype(float)
    sums = rng.standard_normal((K, C, d)) * scale + 2.0 * scale
    for c in absent:
        counts[:, c] = 0.0
        sums[:, c] = 0.0
    for c in negative:  # a noisy count: the class is treated as absent
        counts[:, c] = -0.5
    return ClientStats(counts=counts, sums=sums)


@pytest.mark.parametrize("scale", [1.0, 1e160, 1e-170])
@pytest.mark.parametrize("K", [1, 3])
def test_fedncm_head_is_the_normalised_class_means(scale, K):
    st = _stats(np.random.default_rng(2), K=K, scale=scale)
    head = privfed.methods.get("fedncm").aggregate(st)
    N = st.counts.sum(axis=0)
    S = st.sums.sum(axis=0)
    present = N > 0
    means = np.zeros_like(S)
    means[present] = S[present] / N[present, None]
    np.testing.assert_allclose(head.weight, _unit_rows(means), rtol=0, atol=1e-15)
    assert np.all(head.weight[~present] == 0.0) and np.all(head.bias == 0.0)
    assert any("[3, 7]" in n for n in head.notes) and any("1 class count" in n for n in head.notes)


def test_fedncm_reads_folded_totals_without_summing_and_gets_the_same_bits():
    rng = np.random.default_rng(3)
    st = _stats(rng, K=1)
    two = ClientStats(
        counts=np.concatenate([st.counts, np.zeros_like(st.counts)]),
        sums=np.concatenate([st.sums, np.zeros_like(st.sums)]),
    )  # the same totals summed over two clients (x + 0 = x)
    m = privfed.methods.get("fedncm")
    assert np.array_equal(m.aggregate(st).weight, m.aggregate(two).weight)


def _fedlog_reference(st, nu=1.0, scale=1.0, chi=0.0):
    """The head as the module docstring writes it: Phi = [N, S / scale], a = chi + Phi, eta = solve_map(a)."""
    N = st.counts.sum(axis=0)
    S = st.sums.sum(axis=0)
    a = np.concatenate([N[:, None], S / scale], axis=1) + chi
    nu_n = nu + N.sum()
    eta = solve_map(a, nu_n)
    return eta[:, 1:] / scale, eta[:, 0], a, nu_n


@pytest.mark.parametrize("feature_scale", [1.0, 7.5])
def test_fedlog_head_is_the_map_of_eq15(feature_scale):
    st = _stats(np.random.default_rng(4), C=15, d=11, K=2, absent=(), negative=())
    head = privfed.methods.get("fedlog", feature_scale=feature_scale).aggregate(st)
    W, b, a, nu_n = _fedlog_reference(st, scale=feature_scale)
    np.testing.assert_allclose(head.weight, W, rtol=1e-12)
    np.testing.assert_allclose(head.bias, b, rtol=1e-12)
    eta = np.concatenate([head.bias[:, None], head.weight * feature_scale], axis=1)
    # stationary: the gradient of Eq. 15 at the head vanishes to rounding of |a|
    assert np.linalg.norm(fedlog_gradient(eta, a, nu_n)) <= 1e-12 * np.linalg.norm(a)
    assert head.extras["gradient_norm"] <= 1e-12 * np.linalg.norm(a)


def test_fedlog_with_a_prior_or_lbfgs_takes_the_statistic_and_agrees():
    st = _stats(np.random.default_rng(5), C=6, d=4, K=2, absent=(), negative=())
    chi = np.random.default_rng(6).random((6, 5))
    head = privfed.methods.get("fedlog", chi=chi).aggregate(st)
    W, b, _, _ = _fedlog_reference(st, chi=chi)
    np.testing.assert_allclose(head.weight, W, rtol=1e-12)
    np.testing.assert_allclose(head.bias, b, rtol=1e-12)
    exact = privfed.methods.get("fedlog").aggregate(st)
    lbfgs = privfed.methods.get("fedlog", solver="lbfgs").aggregate(st)
    np.testing.assert_allclose(lbfgs.weight, exact.weight, rtol=1e-5, atol=1e-8)


def test_fedlog_auto_scale_is_scale_invariant_at_extreme_magnitudes():
    """feature_scale='auto': sums of 2^500 or 2^-560 times give the same MAP (weight over the factor)."""
    st = _stats(np.random.default_rng(7), C=10, d=6, K=1, absent=(2,), negative=())
    m = privfed.methods.get("fedlog", feature_scale="auto")
    ref = m.aggregate(st)
    for e in (500, -560):
        big = ClientStats(counts=st.counts, sums=np.ldexp(st.sums, e))
        h = m.aggregate(big)
        np.testing.assert_allclose(np.ldexp(h.weight, e), ref.weight, rtol=1e-12)
        np.testing.assert_allclose(h.bias, ref.bias, rtol=1e-12)


def test_median_mean_norm_equals_hypot_and_survives_overflow():
    rng = np.random.default_rng(8)
    S = _extreme_rows(rng)
    N = np.array([3.0, 1.0, 2.0, 0.0, 5.0, 4.0, 1.0, 2.0, 7.0])
    ref = np.median([math.hypot(*(S[i] / N[i])) for i in range(len(N)) if N[i] > 0])
    assert median_mean_norm(N, S) == pytest.approx(ref, rel=1e-15)
    assert median_mean_norm(N, S, row_squares(S)) == pytest.approx(ref, rel=1e-15)
    assert median_mean_norm(np.zeros(3), np.ones((3, 2))) == 0.0


def test_map_gradient_norm_is_the_norm_of_the_gradient_array():
    """The closed form sqrt(sum_y c_y^2 |a_y|^2) equals ||fedlog_gradient(t a)||, off the optimum too."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((8, 5)) + 1.0
    nu_n = 30.0
    A = np.sum(a * a, axis=1) / 4.0
    t = map_multipliers(A, nu_n)
    for tt in (t * (1 + 1e-3 * rng.standard_normal(8)), t * 1.5):
        g = np.linalg.norm(fedlog_gradient(tt[:, None] * a, a, nu_n))
        assert map_gradient_norm(tt, A, nu_n) == pytest.approx(g, rel=1e-10)


@pytest.mark.parametrize("seed", range(4))
def test_map_multipliers_solve_the_stationarity_equations(seed):
    """log t_y + A_y t_y^2 is one lambda for every class with a_y != 0 and sum_y 1 / t_y = (nu + n) / 2
    (A_y = 0: 1 / t_y = e^-lambda in the sum, t_y returned as 0), across A spanning 1e-6 to 1e10."""
    rng = np.random.default_rng(seed)
    A = 10.0 ** rng.uniform(-6, 10, size=40)
    A[[3, 17]] = 0.0
    nu_n = float(10.0 ** rng.uniform(0, 6))
    t = map_multipliers(A, nu_n)
    live = A > 0
    lam = np.log(t[live]) + A[live] * t[live] ** 2
    np.testing.assert_allclose(lam, lam[0], rtol=1e-13, atol=1e-13)
    total = math.fsum(1.0 / t[live]) + (~live).sum() * math.exp(-lam[0])
    assert total == pytest.approx(nu_n / 2.0, rel=1e-13)
    assert np.all(t[~live] == 0.0)


def test_newton_root_equals_brents(monkeypatch):
    """The Newton iteration and the Brent fallback find the same t to 1e-13 (and Newton is the one used)."""
    import privfed.methods.fedlog as fedlog_mod

    rng = np.random.default_rng(11)
    A = 10.0 ** rng.uniform(-3, 9, size=300)
    A[5] = 0.0
    calls = []
    real = fedlog_mod._newton_lambda
    monkeypatch.setattr(fedlog_mod, "_newton_lambda", lambda *a: calls.append(1) or real(*a))
    newton = map_multipliers(A, 5e4)
    monkeypatch.setattr(fedlog_mod, "_newton_lambda", lambda *a: None)
    brent = map_multipliers(A, 5e4)
    assert calls and np.all(np.isfinite(newton))
    np.testing.assert_allclose(newton, brent, rtol=1e-13)


def _fedcof_pairs(rng, K=9, C=5, d=4, count_only=False, dropped_sum=None):
    """Noisy pair statistics: some counts <= 0 (the drop rule removes them; ``dropped_sum`` their sums'
    entries), a class on one client."""
    pc = np.repeat(np.arange(K), 3)
    pk = np.concatenate([rng.choice(C - 1, 3, replace=False) for _ in range(K)])
    pk[:3] = [C - 1, 0, 1]  # class C - 1 on client 0 alone
    n = rng.integers(1, 9, pc.size).astype(float)
    dropped = [4, 11, 17, 22]
    n[dropped] = [-0.5, 0.0, -2.0, -1.0]  # noisy counts the drop rule removes (their sums are stored)
    sums = rng.normal(size=(pc.size, d)) * n[:, None] + 3.0
    if dropped_sum is not None:
        sums[dropped] = dropped_sum
    rows = None
    if count_only:  # every fifth pair a count-only cell (no stored sum)
        has = np.arange(pc.size) % 5 != 0
        rows = np.where(has, np.cumsum(has) - 1, -1)
        sums = sums[has]
    return pc, pk, n, sums, rows


@pytest.mark.parametrize("count_only", [False, True])
@pytest.mark.parametrize("noise_var", [0.0, 0.3])
@pytest.mark.parametrize("dropped_sum", [None, 1e16, 1e308])
def test_fedcof_on_folded_class_sums_equals_fedcof_on_the_pairs_alone(count_only, noise_var, dropped_sum):
    """FedCOF's server reads the class sums a pairs fold kept over the pairs with a count > 0 instead of
    summing the M rows again: the head is the one it computes from the pairs alone, whatever the sums of
    the pairs the drop rule removes hold (a sum of 1e16 or 1e308 there never enters a class sum)."""
    rng = np.random.default_rng(5)
    pc, pk, n, sums, rows = _fedcof_pairs(rng, count_only=count_only, dropped_sum=dropped_sum)
    K, C, d = 9, 5, 4
    alone = ClientStats.from_pairs(
        num_clients=K,
        num_classes=C,
        pair_client=pc,
        pair_class=pk,
        pair_counts=n,
        pair_sums=sums,
        sum_rows=rows,
    )
    fold = privfed.stats.StatsFold(num_classes=C, dim=d, keep="pairs")
    for part in (np.arange(4), np.arange(4, K)):  # two uploads
        fold.add(alone.clients(part))
    folded = fold.result()
    assert folded._stored_class_sums() is not None and alone._stored_class_sums() is None
    m = privfed.methods.get("fedcof", noise_var=noise_var)
    a, b = m.aggregate(folded), m.aggregate(alone)
    np.testing.assert_allclose(a.weight, b.weight, rtol=1e-12, atol=1e-14)  # the same sums, in another order
    assert a.notes == b.notes and any("dropped" in str(x) for x in a.notes)
