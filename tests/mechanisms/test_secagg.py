"""Pairwise masking (Bonawitz et al. 2017): exact sums, dropouts, uniform uploads, server view.

Tolerances.  Each client's real value is rounded to the 2^-f grid (error
<= 2^-(f+1)); the decoded sum of K clients is therefore within K 2^-(f+1)
of the real sum per coordinate, plus float64 rounding of the reference sum
(<= K * 2^-52 * max|x| relative, covered by a 1e-12 K max|x| term).
Integer statistics are encoded with f = 0 and must match exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from mechanisms.secagg import crypto as secagg_crypto
from mechanisms.secagg import fixed_point, shamir
from mechanisms.secagg.masking import KeySource, ProtocolAbort, harary_graph, masked_sum, prg_uint64
from mechanisms.secagg.noise import DistributedGaussian
from privfed.errors import ConfigError, InputError


def _tol(K: int, f: int, X: np.ndarray) -> float:
    return K * 2.0 ** -(f + 1) + 1e-12 * K * float(np.abs(X).max())


# --------------------------------------------------------------------------- Shamir
def test_shamir_any_t_shares_recover_and_fewer_are_refused():
    keys = KeySource(seed=1)
    secret = keys.field_element()
    xs = list(range(1, 11))
    shares = shamir.split(secret, xs, 4, keys)
    rng = np.random.default_rng(0)
    for _ in range(5):
        pick = rng.choice(xs, size=4, replace=False)
        assert shamir.combine({int(x): shares[int(x)] for x in pick}, 4) == secret
    # Three shares interpolate a degree-2 polynomial: a different constant (with prob. 1 - 1/p).
    three = {x: shares[x] for x in xs[:3]}
    with pytest.raises(InputError, match="need 4 shares"):
        shamir.combine(three, 4)
    assert shamir.combine(three, 3) != secret


def test_shamir_rejects_bad_parameters():
    keys = KeySource(seed=2)
    with pytest.raises(InputError, match="threshold"):
        shamir.split(5, [1, 2, 3], 4, keys)
    with pytest.raises(InputError, match="distinct"):
        shamir.split(5, [1, 1, 3], 2, keys)
    with pytest.raises(InputError, match="PRIME"):
        shamir.split(shamir.PRIME, [1, 2], 2, keys)


class _Scripted(KeySource):
    """A key source that serves a fixed byte string in order, counting its calls."""

    def __init__(self, stream: bytes) -> None:
        super().__init__(None)
        self.stream, self.calls = stream, 0

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        out, self.stream = self.stream[:n], self.stream[n:]
        assert len(out) == n, "the script ran out"
        return out


def test_key_source_batched_draws_read_the_stream_as_single_draws_do():
    """field_elements(n) and ahead(n) give the values and bytes that draws one at a time give from the same
    stream, a rejected value (>= PRIME) included, and ahead() reads on past its pool."""
    over = (shamir.PRIME + 5).to_bytes(32, "little")
    good = [(7 * i + 3).to_bytes(32, "little") for i in range(4)]
    stream = good[0] + over + good[1] + good[2] + good[3]
    one = _Scripted(stream)
    singles = [one.field_element() for _ in range(3)]
    batch = _Scripted(stream)
    assert batch.field_elements(3) == singles == [7 * i + 3 for i in range(3)]
    assert batch.calls == 2  # one draw of 96 bytes, one more for the rejected value
    raw = bytes(range(200))
    src = _Scripted(raw)
    read = src.ahead(50)
    parts = [read(30), read(12), read(20), read(5)]
    assert b"".join(parts) == raw[:67] and src.calls == 3
    seeded_a, seeded_b = KeySource(seed=9), KeySource(seed=9)
    assert seeded_a.field_elements(5) == [seeded_b.field_element() for _ in range(5)]
    read = seeded_a.ahead(40)
    assert read(24) + read(24) == seeded_b(48)


class _Counted(KeySource):
    """A seeded key source counting its calls per stage (the stage is set by the test)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.stage, self.calls = "", {}

    def __call__(self, n: int) -> bytes:
        self.calls[self.stage] = self.calls.get(self.stage, 0) + 1
        return super().__call__(n)


def test_masking_node_draws_each_stage_randomness_in_one_call():
    """A node draws its three secrets in one call, and its coefficients and nonces in one more (one OS call a
    stage, not one per share message); the masked sum is still exact."""
    from mechanisms.secagg.masking.node import MaskingNode
    from mechanisms.secagg.masking.server import MaskingServer

    K, t, D = 7, 4, 5
    X = np.random.default_rng(3).integers(-50, 50, size=(K, D)).astype(float)
    keys = {u: _Counted(200 + u) for u in range(K)}
    nodes = {u: MaskingNode(u, num_nodes=K, threshold=t, keys=keys[u]) for u in range(K)}
    server = MaskingServer(num_nodes=K, threshold=t, length=D, session=b"s" * 16, active=False)
    while not server.done:
        for u, msg in server.requests().items():
            keys[u].stage = msg["stage"]
            server.receive(u, nodes[u].handle(msg, ring_input=lambda u=u: fixed_point.encode(X[u], 0)))
        server.close()
    assert np.array_equal(fixed_point.decode(server.total, 0), X.sum(axis=0))
    for u in range(K):
        assert keys[u].calls == {"keys": 1, "shares": 1}, (u, keys[u].calls)


def _horner_shares(secret: int, coeffs: list[int], xs: list[int]) -> dict[int, int]:
    """Independent reference: P(x) = secret + c_1 x + ... by Horner's rule over Python integers."""
    out = {}
    for x in xs:
        acc = 0
        for c in reversed([secret] + coeffs):
            acc = (acc * x + c) % shamir.PRIME
        out[x] = acc
    return out


def _draw_coefficients(stream, count: int) -> list[int]:
    """Uniform field elements read 32 bytes at a time from ``stream``, rejecting values >= PRIME."""
    out = []
    while len(out) < count:
        c = int.from_bytes(stream(32), "little")
        if c < shamir.PRIME:
            out.append(c)
    return out


class _Stream:
    """A byte source that serves ``prefix`` first, then a seeded ChaCha20 keystream."""

    def __init__(self, prefix: bytes, seed: int) -> None:
        self.prefix, self.keys = prefix, KeySource(seed=seed)

    def __call__(self, n: int) -> bytes:
        head, self.prefix = self.prefix[:n], self.prefix[n:]
        return head + self.keys(n - len(head))


@pytest.mark.parametrize("n, t", [(1, 1), (3, 1), (7, 7), (15, 8), (100, 51)])
@pytest.mark.parametrize("min_work", [0, None])
def test_shamir_split_many_equals_scalar_split_and_horner(n, t, min_work, monkeypatch):
    if min_work is not None:  # 0: the matrix product for every size
        monkeypatch.setattr(shamir, "_VECTOR_MIN_WORK", min_work)
    keys = KeySource(seed=n * 100 + t)
    secrets = [keys.field_element(), keys.field_element(), 0, shamir.PRIME - 1]
    xs = list(range(1, n + 1))[::-1] if n > 3 else [5, 2, 9][:n]
    # A rejected block (>= PRIME) first: every path must skip it and read the stream in the same order.
    reject = (shamir.PRIME + 5).to_bytes(32, "little")
    a, b, c = _Stream(reject, 1), _Stream(reject, 1), _Stream(reject, 1)
    many = shamir.split_many(secrets, xs, t, a)
    one_by_one = [shamir.split(s, xs, t, b) for s in secrets]
    reference = [_horner_shares(s, _draw_coefficients(c, t - 1), xs) for s in secrets]
    assert many == one_by_one == reference
    assert a(16) == b(16) == c(16)  # the same number of bytes was consumed
    # Any t shares rebuild each secret exactly.
    rng = np.random.default_rng(n + t)
    for s, shares in zip(secrets, many):
        for _ in range(3):
            pick = [int(x) for x in rng.choice(xs, size=t, replace=False)]
            assert shamir.combine({x: shares[x] for x in pick}, t) == s


def test_shamir_split_many_carries_with_all_limbs_saturated(monkeypatch):
    monkeypatch.setattr(shamir, "_VECTOR_MIN_WORK", 0)
    # Coefficients and secret PRIME - 1 (limbs 0xFFFF except the lowest) maximise every partial sum.
    top = (shamir.PRIME - 1).to_bytes(32, "little")
    xs = [shamir.PRIME - 1 - i for i in range(40)] + list(range(1, 41))
    many = shamir.split_many([shamir.PRIME - 1], xs, 60, lambda n: top * (n // 32))
    assert many[0] == _horner_shares(shamir.PRIME - 1, [shamir.PRIME - 1] * 59, xs)


def test_lagrange_coefficients_reproduce_polynomials_of_degree_below_n():
    # sum_j lambda_j x_j^k = 0^k: 1 for k = 0 and 0 for 1 <= k < n (interpolation at 0 is exact).
    for xs in ([7], [3, 1], [5, 9, 2, 77, 1000], list(range(1, 52)), [shamir.PRIME - 1, 4, 2**200]):
        lam = shamir.lagrange_at_zero(xs)
        for k in range(len(xs)):
            assert sum(l * pow(x, k, shamir.PRIME) for l, x in zip(lam, xs)) % shamir.PRIME == (k == 0)
    with pytest.raises(InputError, match="distinct"):
        shamir.lagrange_at_zero([3, 3 + shamir.PRIME])


def test_shamir_split_many_below_threshold_and_bad_input(monkeypatch):
    monkeypatch.setattr(shamir, "_VECTOR_MIN_WORK", 0)
    keys = KeySource(seed=3)
    secret = keys.field_element()
    xs = list(range(1, 12))
    (shares,) = shamir.split_many([secret], xs, 6, keys)
    # Five shares interpolate a degree-4 polynomial: a different constant (with prob. 1 - 1/p).
    five = {x: shares[x] for x in xs[:5]}
    with pytest.raises(InputError, match="need 6 shares"):
        shamir.combine(five, 6)
    assert shamir.combine(five, 5) != secret
    assert shamir.split_many([], xs, 6, keys) == []
    with pytest.raises(InputError, match="threshold"):
        shamir.split_many([1], [1, 2, 3], 4, keys)
    with pytest.raises(InputError, match="distinct"):
        shamir.split_many([1], [1, 1, 3], 2, keys)
    with pytest.raises(InputError, match="PRIME"):
        shamir.split_many([1, shamir.PRIME], [1, 2], 2, keys)


def test_shamir_split_many_above_the_float_exact_bound_falls_back(monkeypatch):
    monkeypatch.setattr(shamir, "_MAX_VECTOR_THRESHOLD", 2)
    monkeypatch.setattr(shamir, "_VECTOR_MIN_WORK", 0)
    # Count the matrix products: none may run above the bound.
    calls = []
    monkeypatch.setattr(shamir, "_power_limbs", lambda *a: calls.append(a))
    secrets = [11, 12]
    a, b = KeySource(seed=8), KeySource(seed=8)
    xs = [1, 2, 3, 4]
    assert shamir.split_many(secrets, xs, 3, a) == [shamir.split(s, xs, 3, b) for s in secrets]
    assert calls == []


# --------------------------------------------------------------------------- fixed point
def test_fixed_point_round_trip_and_overflow_refusal():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000) * 1e3
    for f in (0, 16, 32, 40):
        assert np.abs(fixed_point.decode(fixed_point.encode(x, f), f) - x).max() <= 2.0 ** -(f + 1)
    with pytest.raises(InputError, match="lower frac_bits"):
        fixed_point.check_ring_bound(1e10, 10, 32)
    assert fixed_point.check_ring_bound(1e3, 10, 32) < 2.0**63
    with pytest.raises(ConfigError, match="frac_bits"):
        fixed_point.check_frac_bits(70)


def test_is_integral_checks_every_chunk(monkeypatch):
    monkeypatch.setattr(fixed_point, "_CHUNK", 3)
    whole = np.arange(-5.0, 5.0).reshape(2, 5)
    assert fixed_point.is_integral(whole)
    for bad in (0.5, np.nan, np.inf, 2.0**53):
        x = whole.copy()
        x[1, 4] = bad  # in the last chunk
        assert not fixed_point.is_integral(x)
    assert fixed_point.is_integral(np.zeros((3, 0)))
    # NaN and inf are refused by the masked sum before anything is encoded, wherever they sit.
    for bad in (np.nan, -np.inf):
        x = whole.copy()
        x[1, 3] = bad
        with pytest.raises(InputError, match="NaN/inf"):
            masked_sum(x, key_seed=1)


def test_prg_is_deterministic_per_key_and_differs_across_keys():
    a, b = prg_uint64(b"\x01" * 32, 1000), prg_uint64(b"\x02" * 32, 1000)
    assert np.array_equal(a, prg_uint64(b"\x01" * 32, 1000))
    assert np.count_nonzero(a == b) == 0  # equal uint64 draws have probability 2^-64 each


def test_masks_added_block_by_block_equal_whole_prg_expansions(monkeypatch):
    # Blocks of 7 values and 2 cipher contexts at a time: every mask is still its key's whole keystream.
    monkeypatch.setattr(secagg_crypto, "MASK_BLOCK", 7)
    monkeypatch.setattr(secagg_crypto, "KEY_GROUP", 2)
    keys = [bytes([i]) * 32 for i in range(1, 6)]
    signs = [True, False, True, True, False]
    y = np.arange(30, dtype=np.uint64)
    ref = y.copy()
    for k, plus in zip(keys, signs):
        ref = ref + prg_uint64(k, 30) if plus else ref - prg_uint64(k, 30)  # wraps mod 2^64
    secagg_crypto.add_masks(y, keys, signs)
    assert np.array_equal(y, ref)
    # The protocol stays exact, dropouts included (the server removes masks block by block too).
    counts = np.random.default_rng(9).integers(0, 50, size=(12, 30)).astype(np.float64)
    res = masked_sum(counts, dropped_before_upload=[1, 4], dropped_after_upload=[7], key_seed=9)
    kept = np.setdiff1d(np.arange(12), [1, 4])
    assert np.array_equal(res.total, counts[kept].sum(axis=0))


# --------------------------------------------------------------------------- exact sums
@pytest.mark.parametrize("K, shape", [(3, (7, 13)), (10, (7, 13)), (100, (6,))])
def test_masked_sum_matches_plain_sum(K, shape):
    rng = np.random.default_rng(K)
    X = rng.normal(size=(K,) + shape) * 5
    counts = rng.integers(0, 1000, size=(K, 7)).astype(np.float64)
    f = 32
    res = masked_sum(X, frac_bits=f, key_seed=K, rng=rng)
    assert res.frac_bits == f
    assert np.abs(res.total - X.sum(axis=0)).max() <= _tol(K, f, X)
    exact = masked_sum(counts, key_seed=K + 1, rng=rng)
    assert exact.frac_bits == 0
    assert np.array_equal(exact.total, counts.sum(axis=0))


@pytest.mark.parametrize("neighbours", [None, 6])
def test_a_server_that_keeps_no_view_sums_the_same(neighbours):
    """keep_view=False folds each upload and keeps nothing else; the sum, the uploaders and the bytes sent are
    those of the same run keeping its view (same key material, dropouts on both sides of the upload)."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(12, 9))
    kw = dict(neighbours=neighbours, key_seed=3, dropped_before_upload=[1], dropped_after_upload=[2])
    kept = masked_sum(X, rng=np.random.default_rng(0), **kw)
    bare = masked_sum(X, rng=np.random.default_rng(0), keep_view=False, **kw)
    assert np.array_equal(kept.total, bare.total) and kept.uploaded == bare.uploaded
    assert kept.upload_bytes == bare.upload_bytes
    assert len(kept.view.masked_uploads) == len(kept.uploaded) and kept.view.public_keys
    assert not bare.view.masked_uploads and not bare.view.public_keys and not bare.view.encrypted_shares


@pytest.mark.parametrize(
    "K, before, after", [(4, [], [3]), (10, [1, 2], [3, 4]), (100, list(range(20)), list(range(20, 49)))]
)
def test_masked_sum_with_dropouts_up_to_threshold(K, before, after):
    # Default threshold t = floor((K + 1)/2) + 1 (it tolerates a colluder); K - |before| - |after| = t
    # survivors is the limit.
    rng = np.random.default_rng(7)
    X = rng.normal(size=(K, 6))
    res = masked_sum(X, dropped_before_upload=before, dropped_after_upload=after, key_seed=3, rng=rng)
    assert K - len(before) - len(after) >= res.threshold
    kept = np.setdiff1d(np.arange(K), before)
    assert res.uploaded == tuple(kept)
    assert np.abs(res.total - X[kept].sum(axis=0)).max() <= _tol(kept.size, 32, X)
    counts = rng.integers(0, 50, size=(K, 4)).astype(np.float64)
    res = masked_sum(counts, dropped_before_upload=before, dropped_after_upload=after, key_seed=4, rng=rng)
    assert np.array_equal(res.total, counts[kept].sum(axis=0))


@pytest.mark.parametrize("before, after", [([1, 2], [3, 4, 5]), ([0, 1, 2, 3, 4], []), ([], [0, 1, 2, 3, 4])])
def test_too_many_dropouts_abort_without_a_sum(before, after):
    X = np.random.default_rng(0).normal(size=(10, 5))  # t = 6; 5 survivors
    with pytest.raises(ProtocolAbort, match="threshold"):
        masked_sum(X, dropped_before_upload=before, dropped_after_upload=after, key_seed=5)


def test_secagg_plus_sparse_graph_with_dropouts():
    rng = np.random.default_rng(3)
    graph = harary_graph(20, 6, np.random.default_rng(1))
    assert all(len(g) == 6 for g in graph)
    assert all(u in graph[v] for u in range(20) for v in graph[u])  # symmetric
    assert graph == harary_graph(20, 6, np.random.default_rng(1))  # seeded
    X = rng.normal(size=(20, 9))
    res = masked_sum(
        X, neighbours=6, dropped_before_upload=[2], dropped_after_upload=[5], key_seed=6, rng=rng
    )
    assert res.threshold == 5  # 2t > 7 + 1 in a group of 7 (itself and 6 neighbours): tolerates a colluder
    kept = np.setdiff1d(np.arange(20), [2])
    assert np.abs(res.total - X[kept].sum(axis=0)).max() <= _tol(19, 32, X)
    # Every client's upload carries 6 masks (not 19): the per-client share traffic is O(k).
    assert {len([1 for (u, _) in res.view.encrypted_shares if u == c]) for c in range(20)} == {6}
    with pytest.raises(ConfigError, match="even"):
        harary_graph(20, 5, rng)


def test_overflowing_statistic_is_refused_before_encoding():
    X = np.full((10, 3), 1e10 + 0.25)  # not integral: frac_bits applies
    with pytest.raises(InputError, match="lower frac_bits"):
        masked_sum(X, frac_bits=32, key_seed=1)  # 10 * 1e10 * 2^32 > 2^63
    res = masked_sum(X, frac_bits=20, key_seed=1)  # 10 * 1e10 * 2^20 < 2^63
    assert np.abs(res.total - X.sum(axis=0)).max() <= _tol(10, 20, X)
    # Whole numbers go in with f = 0, where 10 * 1e10 fits.
    assert np.array_equal(masked_sum(np.round(X), key_seed=1).total, np.round(X).sum(axis=0))
    with pytest.raises(InputError, match="NaN"):
        masked_sum(np.array([[1.0, np.nan], [0.0, 1.0]]), key_seed=1)
    with pytest.raises(InputError, match="K >= 2"):
        masked_sum(np.ones((1, 3)))


# --------------------------------------------------------------------------- what the server sees
def test_masked_upload_is_uniform_over_the_ring():
    """Chi-square on the top byte and KS on u / 2^64, false-alarm level 1e-3 each (fixed keys).

    The same tests reject the unmasked encoding (their power on structured data).
    """
    K, D = 3, 40_000
    rng = np.random.default_rng(11)
    X = np.zeros((K, D))
    X[0] = rng.normal(size=D)  # a client's real statistic
    res = masked_sum(X, key_seed=12, rng=rng)
    y = res.view.masked_uploads[0]
    top = (y >> np.uint64(56)).astype(np.int64)
    assert sps.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-3
    assert sps.kstest(y.astype(np.float64) / 2.0**64, "uniform").pvalue > 1e-3
    plain = fixed_point.encode(X[0], 32)
    assert sps.chisquare(np.bincount((plain >> np.uint64(56)).astype(np.int64), minlength=256)).pvalue < 1e-3
    assert sps.kstest(plain.astype(np.float64) / 2.0**64, "uniform").pvalue < 1e-3


def test_server_view_holds_no_individual_statistic():
    K, D = 8, 500
    rng = np.random.default_rng(5)
    X = rng.normal(size=(K, D))
    res = masked_sum(X, dropped_before_upload=[1], dropped_after_upload=[6], key_seed=13, rng=rng)
    view = res.view
    assert set(view.masked_uploads) == set(range(K)) - {1}
    enc = [fixed_point.encode(x, 32) for x in X]
    for arr in view.arrays():
        for k in range(K):
            # A masked upload agrees with an encoded input on a coordinate with probability 2^-64.
            if arr.dtype == np.uint64:
                assert np.count_nonzero(arr == enc[k]) == 0
            else:
                assert np.abs(arr - X[k]).min() > 1e-6 or arr is view.result
    for y in view.masked_uploads.values():
        decoded = fixed_point.decode(y, 32)
        assert all(np.abs(decoded - X[k]).max() > 1.0 for k in range(K))
    # The unmasking answers: self-mask seeds of uploaders, mask keys of the dropped -- never both for one client.
    assert set(view.self_seed_shares) == set(range(K)) - {1}
    assert set(view.key_shares) == {1}
    assert not set(view.self_seed_shares) & set(view.key_shares)
    assert np.abs(view.result - X[np.arange(K) != 1].sum(axis=0)).max() <= _tol(K, 32, X)
    # The shares travel encrypted: no plaintext share value appears in a relayed ciphertext.
    some_share = next(iter(view.self_seed_shares[0].values())).to_bytes(32, "little")
    assert all(some_share not in ct for ct in view.encrypted_shares.values())


# --------------------------------------------------------------------------- distributed noise
def test_distributed_noise_variance_in_the_sum():
    # K shares of variance s^2 sum to K s^2 per coordinate; over D coordinates the sample
    # variance / (K s^2) is within 5 sqrt(2/D) of 1 (5-sigma chi-square band).
    K, D, s = 10, 20_000, 0.5
    rng = np.random.default_rng(21)
    X = rng.normal(size=(K, D))
    res = masked_sum(X, noise_std=s, key_seed=22, rng=rng)
    assert res.frac_bits == 32
    ratio = np.var(res.total - X.sum(axis=0)) / (K * s**2)
    assert abs(ratio - 1) < 5 * math.sqrt(2 / D)


def test_distributed_noise_calibration_survives_t_missing_shares():
    import dp_accounting

    K, t, eps, delta = 20, 5, 2.0, 1e-5
    dg = DistributedGaussian.calibrate(
        epsilon=eps, delta=delta, sensitivity=[1.0, 3.0], num_clients=K, tolerate=t
    )
    g = dg.guarantee(K)
    assert g[f"with_{t}_missing"]["epsilon"] == pytest.approx(eps, rel=1e-6)
    assert g["full"]["epsilon"] < eps
    z = dp_accounting.get_sigma_gaussian(eps, delta)
    # sigma_i = Delta_i z sqrt(2) sqrt(K/(K-t)); the remaining noise sigma_i sqrt((K-t)/K).
    assert dg.sigma_for(1) == pytest.approx(3.0 * z * math.sqrt(2) * math.sqrt(K / (K - t)), rel=1e-12)
    assert g[f"with_{t}_missing"]["sigma"][1] == pytest.approx(3.0 * z * math.sqrt(2), rel=1e-12)
    assert dg.share_std(0, K) == pytest.approx(dg.sigma_for(0) / math.sqrt(K), rel=1e-12)
    # Independent check of mu -> eps with the exact Gaussian delta formula.
    mu = g["full"]["mu"]
    e = g["full"]["epsilon"]
    d = sps.norm.cdf(-e / mu + mu / 2) - math.exp(e) * sps.norm.cdf(-e / mu - mu / 2)
    assert d == pytest.approx(delta, rel=1e-4)
    with pytest.raises(ConfigError, match="tolerate"):
        DistributedGaussian.calibrate(epsilon=1, delta=1e-5, sensitivity=1, num_clients=5, tolerate=5)
    with pytest.raises(ConfigError, match="sigma"):
        DistributedGaussian(sigma=-1.0)


def test_distributed_noise_with_exact_discrete_gaussian_shares():
    pytest.importorskip("opendp")
    from mechanisms.dp.backends import OpenDPNoise

    # Each client rounds to the 2^-10 grid and adds discrete-Gaussian integers: the sum lies on
    # the grid, its noise variance is K s^2 (5-sigma band as above), and the report adds the
    # rounding slack grid * sqrt(D) to the sensitivity.
    K, D, grid = 4, 2000, 2.0**-10
    dg = DistributedGaussian(sigma=2.0, sensitivity=1.0, backend=OpenDPNoise(grid=grid))
    rng = np.random.default_rng(31)
    X = rng.normal(size=(K, D))
    s = dg.share_std(0, K)
    res = masked_sum(X, noise_std=s, add_noise=dg.add_share, key_seed=32, rng=rng)
    on_grid = res.total / grid
    assert np.array_equal(on_grid, np.round(on_grid))
    noise = res.total - (np.round(X / grid) * grid).sum(axis=0)
    assert abs(np.var(noise) / 2.0**2 - 1) < 5 * math.sqrt(2 / D)
    g = dg.guarantee(K, 1, sizes=[D])
    assert g["rounding_slack"] == [pytest.approx(grid * math.sqrt(D))]
    assert g["full"]["mu"] == pytest.approx((1.0 + grid * math.sqrt(D)) / 2.0)
    assert "exact" in g["note"]


def test_shamir_refuses_a_short_random_source_and_points_or_secrets_it_would_misread():
    """A random source that returned too few bytes made every coefficient 0, so every share was the secret
    itself; a float secret gave garbage shares, points equal modulo the prime were taken as two, and combine
    divided by zero at the point 0."""
    import os

    from mechanisms.secagg.shamir import PRIME, combine, split, split_many

    with pytest.raises(InputError, match=r"random_bytes\(32\) returned 0 bytes"):
        split(5, [1, 2, 3], 2, lambda n: b"")
    with pytest.raises(InputError, match=r"returned 927 bytes"):
        split_many([5, 6], list(range(1, 60)), 30, lambda n: os.urandom(n - 1))
    with pytest.raises(InputError, match="secret must be an int"):
        split(5.5, [1, 2, 3], 2, os.urandom)
    with pytest.raises(InputError, match="distinct and non-zero modulo PRIME"):
        split(5, [1, PRIME + 1, 2], 2, os.urandom)
    with pytest.raises(InputError, match="non-zero integers"):
        combine({0: 5, 1: 7}, 2)
    with pytest.raises(InputError, match="threshold must be an int >= 1"):
        combine({1: 5, 2: 7}, 0)
    shares = split(12345, [1, 2, 3, 4], 3, os.urandom)
    assert combine(shares, 3) == 12345 and len(set(shares.values())) == 4
    # numpy integers are integers (compared with the 256-bit prime they overflowed)
    assert combine({np.int64(1): 3, np.int64(2): 5}, 2) == 1
    assert combine(split(np.int64(7), [np.int64(1), np.int64(2), 3], 2, os.urandom), 2) == 7
    assert [combine(s, 2) for s in split_many([np.int64(7), 9], [np.int64(1), 2, 3], 2, os.urandom)] == [7, 9]


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (
            {"dropped_before_upload": "12"},
            InputError,
            "must be a list of client indices, got '12'",
        ),  # was 1 and 2
        ({"dropped_before_upload": 1}, InputError, "must be a list of client indices"),
        (
            {"dropped_before_upload": [1.7]},
            InputError,
            r"must hold client indices \(integers\)",
        ),  # was client 1
        ({"dropped_after_upload": ["1"]}, InputError, r"must hold client indices \(integers\)"),
        ({"threshold": 3.7}, ConfigError, "threshold must be an integer or None, got 3.7"),  # was t = 3
        ({"value_bound": "2"}, ConfigError, "value_bound must be a number"),
        ({"noise_std": "1"}, ConfigError, "noise_std must be a number"),
        ({"rng": 0, "noise_std": 1.0}, ConfigError, "rng must be a numpy.random.Generator"),
    ],
)
def test_masked_sum_takes_indices_and_numbers_only(kw, error, match):
    X = np.random.default_rng(0).normal(size=(6, 3))
    with pytest.raises(error, match=match):
        masked_sum(X, **kw)
    assert masked_sum(X, dropped_before_upload=np.array([1])).dropped_before_upload == (1,)


def test_fixed_point_refuses_what_it_would_silently_lose():
    """frac_bits=-1 halved every value (1.0 encoded as 0), frac_bits=60 was taken by encode and decode past the
    53 bits float64 holds, text was parsed and complex values lost their imaginary part; a negative bound on
    |x| passed the ring check."""
    from mechanisms.secagg import fixed_point as fp

    for f in (-1, 60, 2.5):
        with pytest.raises(ConfigError, match="frac_bits"):
            fp.encode(np.array([1.0]), f)
        with pytest.raises(ConfigError, match="frac_bits"):
            fp.decode(np.array([1], dtype=np.uint64), f)
    for bad in (np.array(["1"]), np.array([1 + 1j])):
        with pytest.raises(InputError, match="takes real numbers"):
            fp.encode(bad, 4)
    assert fp.encode(np.array([True, False]), 4).tolist() == [16, 0]  # booleans are 0 and 1, as before
    with pytest.raises(InputError, match="bounds on"):
        fp.check_ring_bound(-1.0, 4, 16)
    assert fp.decode(fp.encode(np.array([1.5, -2.25]), 4), 4).tolist() == [1.5, -2.25]
