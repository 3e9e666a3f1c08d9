"""CKKS secure summation (TenSEAL): accuracy, the aggregator cannot decrypt, the bound is enforced."""

from __future__ import annotations

import numpy as np
import pytest

ts = pytest.importorskip("tenseal")

from mechanisms.ckks import CKKSAggregator, CKKSKeyHolder, CKKSParams, ckks_encrypt, ckks_sum
from privfed.errors import ConfigError, InputError


def test_ckks_sum_matches_plain_sum_across_ciphertexts():
    rng = np.random.default_rng(0)
    K, D = 8, 5000  # two ciphertexts of 4096 slots
    X = rng.normal(size=(K, D)) * 20
    res = ckks_sum(X, rng=rng)
    assert res.num_ciphertexts == 2
    ref = X.sum(axis=0)
    assert np.abs(res.total - ref).max() <= 1e-6 * np.abs(ref).max()
    # Released on the declared grid 2^-20 (Li-Micciancio: the key holder rounds).
    scaled = res.total * 2.0**20
    assert np.array_equal(scaled, np.round(scaled))
    assert not res.integral


def test_ckks_counts_come_out_exact():
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 10_000, size=(6, 10)).astype(np.float64)
    res = ckks_sum(counts)
    assert res.integral
    assert np.array_equal(res.total, counts.sum(axis=0))


def test_aggregator_holds_a_public_context_that_cannot_decrypt():
    holder = CKKSKeyHolder(CKKSParams())
    pub = holder.public_context()
    agg = CKKSAggregator(pub)
    assert not agg.context.is_private()
    cts = [ckks_encrypt(agg.context, np.arange(10.0) + k, holder.params.slots) for k in range(3)]
    summed = agg.add(cts)
    with pytest.raises(ValueError, match="secret"):
        ts.ckks_vector_from(agg.context, summed[0]).decrypt()
    with pytest.raises(ValueError, match="secret"):
        ts.ckks_vector(agg.context, [1.0, 2.0]).decrypt()
    out = holder.decrypt_sum(summed, 10, integral=False)
    assert np.abs(out - (3 * np.arange(10.0) + 3)).max() <= 2.0**-20
    with pytest.raises(ConfigError, match="fresh keys"):
        holder.decrypt_sum(summed, 10, integral=False)


def test_aggregate_beyond_the_parameter_bound_is_refused():
    # [60, 40, 40, 60] at scale 2^40: |sum| < 2^(140 - 40 - 2) = 2^98.
    p = CKKSParams()
    assert p.bound_bits == 98
    big = np.full((10, 4), 2.0**95)  # 10 * 2^95 > 2^98
    with pytest.raises(InputError, match="CKKS bound"):
        ckks_sum(big)
    ok = np.full((4, 4), 2.0**95)  # 4 * 2^95 = 2^97 < 2^98: decrypts correctly
    res = ckks_sum(ok)
    assert np.abs(res.total / ok.sum(axis=0) - 1).max() < 1e-9
    # The refusal is needed: a 2^100 aggregate wraps silently in TenSEAL.
    holder = CKKSKeyHolder(p)
    agg = CKKSAggregator(holder.public_context())
    x = np.full(4, 2.0**97)
    summed = agg.add([ckks_encrypt(agg.context, x, p.slots) for _ in range(8)])
    wrapped = holder.decrypt_sum(summed, 4, integral=False)
    assert np.abs(wrapped / (8 * x) - 1).max() > 0.5


def test_bad_parameters_are_refused():
    with pytest.raises(ConfigError, match="poly_modulus_degree"):
        CKKSParams(poly_modulus_degree=5000)
    with pytest.raises(ConfigError, match="precision_bits"):
        CKKSParams(precision_bits=39)
    with pytest.raises(InputError, match="K >= 2"):
        ckks_sum(np.ones((1, 3)))
