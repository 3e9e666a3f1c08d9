"""CKKS secure summation (TenSEAL): accuracy, the aggregator cannot decrypt, the bound is enforced."""

from __future__ import annotations

import numpy as np
import pytest

ts = pytest.importorskip("tenseal")

import os  # noqa: E402

from mechanisms.secagg.ckks import ckks_sum  # noqa: E402
from mechanisms.secagg.ckks.holder import CKKSKeyHolder  # noqa: E402
from mechanisms.secagg.ckks.node import CKKSNode  # noqa: E402
from mechanisms.secagg.ckks.scheme import (  # noqa: E402
    CKKSParams,
    add_ciphertexts,
    ckks_encrypt,
    decrypt_rounded,
    new_context,
    public_bytes,
)
from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.identity import make_roster  # noqa: E402
from privfed.errors import ConfigError, InputError  # noqa: E402


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
    roster, ids = make_roster(3, colluders=0)  # CKKS: the roster declares no colluder
    holder = CKKSKeyHolder(CKKSParams(), identity=ids[0], roster=roster)
    session = os.urandom(16)
    keys = holder.keys({"session": session, "K": 3})
    server_ctx = ts.context_from(keys["public"])  # all the server holds
    assert not server_ctx.is_private()
    request = {"public": keys["public"], "K": 3, "holder": 0, "sig": keys["sig"], "session": session}
    replies = [
        CKKSNode(CKKSParams(), identity=ids[k], roster=roster).encrypt(request, np.arange(10.0) + k)
        for k in range(3)
    ]
    summed = add_ciphertexts(server_ctx, [r["ct"] for r in replies])
    with pytest.raises(ValueError, match="secret"):
        summed[0].decrypt()
    with pytest.raises(ValueError, match="secret"):
        ts.ckks_vector(server_ctx, [1.0, 2.0]).decrypt()
    decrypt = {
        "from": [r["u"] for r in replies],
        "ct": [c for r in replies for c in r["ct"]],
        "sigs": [r["sig"] for r in replies],
        "pins": [r["pin"] for r in replies],
        "size": 10,
        "session": session,
    }
    out = holder.decrypt(decrypt)["total"]
    assert np.abs(out - (3 * np.arange(10.0) + 3)).max() <= 2.0**-20
    with pytest.raises(ProtocolAbort, match="fresh keys"):
        holder.decrypt(decrypt)


def test_aggregate_beyond_the_parameter_bound_is_refused():
    # [60, 40, 40, 60] at scale 2^40: |sum| < 2^(140 - 40 - 2) = 2^98.
    p = CKKSParams()
    assert p.bound_bits == 98
    big = np.full((10, 4), 2.0**95)  # 10 * 2^95 > 2^98
    with pytest.raises(InputError, match="CKKS bound"):
        ckks_sum(big)
    # 4 * 2^95 = 2^97 < 2^98 decrypts to 1e-9 relative, but the float64 encoding's error (about 2^-54 of the
    # largest value: 2^43) is far above the release grid 2^-20: small sums beside it would come back wrong, and
    # the released low bits would carry key-dependent error, so it is refused too
    with pytest.raises(InputError, match=r"float64 encoding an error of about 2\^4[0-9]"):
        ckks_sum(np.full((4, 4), 2.0**95))
    ok = np.random.default_rng(0).normal(size=(4, 64))
    ok[:, 0] = 2.0**25  # |sum| = 2^27 < 2^28: every other slot keeps its 2^-20 grid
    res = ckks_sum(ok, integers=False)
    assert np.abs(res.total - ok.sum(axis=0)).max() <= 2.0**-20
    # The refusal is needed: a 2^100 aggregate wraps silently in TenSEAL.
    secret = new_context(p)
    public = ts.context_from(public_bytes(secret))
    x = np.full(4, 2.0**97)
    summed = add_ciphertexts(secret, [ckks_encrypt(public, x, p.slots) for _ in range(8)])
    wrapped = decrypt_rounded(summed, 4, p, integral=False)
    assert np.abs(wrapped / (8 * x) - 1).max() > 0.5
    # and a node refuses such an input before encrypting it
    roster, ids = make_roster(8, colluders=0)
    with pytest.raises(InputError, match="CKKS bound"):
        CKKSNode(p, identity=ids[1], roster=roster).encrypt(_request(roster, ids[0]), x)


def test_bad_parameters_are_refused():
    with pytest.raises(ConfigError, match="poly_modulus_degree"):
        CKKSParams(poly_modulus_degree=5000)
    with pytest.raises(ConfigError, match="precision_bits"):
        CKKSParams(precision_bits=39)
    with pytest.raises(InputError, match="K >= 2"):
        ckks_sum(np.ones((1, 3)))


def _request(roster, holder_id):
    session = os.urandom(16)
    keys = CKKSKeyHolder(CKKSParams(), identity=holder_id, roster=roster).keys(
        {"session": session, "K": roster.size}
    )
    return {
        "public": keys["public"],
        "K": roster.size,
        "holder": holder_id.index,
        "sig": keys["sig"],
        "session": session,
    }


GRID = 2.0**-20


@pytest.mark.parametrize("noise_std", [0.0, 0.5])
def test_ckks_sum_is_the_plain_sum_on_the_release_grid(noise_std):
    """Against the sum numpy computes of the same rows and the same noise draws: within half a grid step plus
    the decryption error N sqrt(K) 2^-scale_bits (module docstring), and on the grid."""
    p = CKKSParams()
    X = np.random.default_rng(3).normal(size=(5, 4100))  # two ciphertexts per client
    res = ckks_sum(X, noise_std=noise_std, rng=np.random.default_rng(9))
    draw = np.random.default_rng(9)
    ref = sum(X[k] + draw.normal(0.0, noise_std, X.shape[1]) if noise_std else X[k] for k in range(5))
    assert np.array_equal(np.rint(res.total / GRID) * GRID, res.total)
    err = p.poly_modulus_degree * np.sqrt(5) * 2.0**-p.scale_bits
    assert np.abs(res.total - ref).max() <= GRID / 2 + err
    assert not res.integral and res.num_ciphertexts == 2
    # sizes: every client uploads two full ciphertexts, downloads the public context (measured per key pair)
    assert sorted(res.upload_bytes) == list(range(5))
    assert res.download_bytes == len(res.view.public_context) > 0
    for k, cts in res.view.ciphertexts.items():
        assert res.upload_bytes[k] == sum(map(len, cts))
    assert set(res.seconds) == {"keygen", "encrypt", "sum", "decrypt", "total"}


def test_the_in_process_sum_runs_the_signed_protocol():
    """In process too the key holder checks signed contributions: the server's view holds one signature per
    client, and a sum over them verifies under the run's roster."""
    res = ckks_sum(np.ones((4, 3)) * np.arange(4)[:, None])
    assert res.integral and np.array_equal(res.total, [6.0, 6.0, 6.0])
    assert sorted(res.view.signatures) == [0, 1, 2, 3]
    assert all(len(s) == 64 for s in res.view.signatures.values())


@pytest.mark.parametrize(
    "stack, kw, match",
    [
        (
            np.arange(12.0).reshape(4, 3) / 7,
            {"integers": True},
            "declared integer but holds fractional values",
        ),
        (np.array([["1", "2"], ["3", "4"]]), {}, "must hold real numbers"),
        (np.ones((4, 3)) + 1j, {}, "is complex"),
        (np.array([[True, False], [True, True]]), {}, "must hold real numbers"),
        (np.full((2, 2), 2**60), {}, "integers beyond 2\\*\\*53"),
        (np.zeros((4, 0)), {}, "statistics are empty"),
    ],
)
def test_ckks_sum_refuses_what_it_would_round_or_cast(stack, kw, match):
    """integers=True rounded real statistics to whole numbers ([3, 3, 4] for a sum of [2.57, 3.14, 3.71]); text,
    booleans and complex values were cast, large integers rounded, an empty statistic a numpy error; masked
    sums refused each."""
    with pytest.raises(InputError, match=match):
        ckks_sum(stack, **kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"noise_std": "1"}, "noise_std must be a number, got '1'"),  # was numpy's TypeError from isfinite
        ({"noise_std": True}, "noise_std must be a number, got True"),
        ({"value_bound": "3"}, "value_bound must be a number, got '3'"),  # was cast by float()
        ({"value_bound": float("nan")}, "value_bound must be finite and >= 0"),  # was "could exceed"
        ({"value_bound": -1.0}, "value_bound must be finite and >= 0"),
    ],
)
def test_ckks_sum_takes_numbers_only(kw, match):
    """The noise and bound of a CKKS sum get masking's checks (one function, the same messages)."""
    with pytest.raises(ConfigError, match=match):
        ckks_sum(np.ones((3, 2)), **kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"precision_bits": 2.5}, "precision_bits must be an integer number of bits"),
        ({"scale_bits": 10.5}, "scale_bits must be an integer number of bits"),  # was about precision_bits
        (
            {"coeff_mod_bit_sizes": (60.7, 40.2, 60)},
            "coeff_mod_bit_sizes must be a list of >= 2 primes",
        ),  # truncated
        ({"poly_modulus_degree": True}, "poly_modulus_degree must be a power of two"),
    ],
)
def test_ckks_parameters_are_whole_bits(kw, match):
    with pytest.raises(ConfigError, match=match):
        CKKSParams(**kw)
    assert CKKSParams(poly_modulus_degree=np.int64(8192)) == CKKSParams()  # was refused


def test_small_sums_beside_a_large_one_are_refused_not_returned_wrong():
    """The fault battery's cases: N(0, 1) sums beside one of 1e18 came back 23.8 off, and counts of 3 beside 2^60
    as -135 or 103, all inside the 2^98 bound; the float64 encoding's error is now held below the release grid."""
    X = np.random.default_rng(1).normal(size=(4, 64))
    X[:, 0] = 1e18 / 4
    with pytest.raises(InputError, match=r"lower precision_bits|so \|sum\| < 2\^28"):
        ckks_sum(X, integers=False)
    C = np.ones((3, 8))
    C[:, 0] = 2.0**60
    with pytest.raises(InputError, match=r"float64 encoding"):
        ckks_sum(C)


def test_ckks_parameters_seal_refuses_and_a_dict_of_them_are_one_line():
    from privfed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"refused by SEAL .*use the defaults, CKKSParams\(\)"):
        ckks_sum(np.ones((3, 4)), params=CKKSParams(coeff_mod_bit_sizes=(60, 60, 60, 60, 60)))
    with pytest.raises(ConfigError, match=r"params must be a CKKSParams"):
        ckks_sum(np.ones((3, 4)), params={"scale_bits": 30})


def test_the_ckks_threat_model_says_nothing_of_a_graph():
    """CKKS has no SecAgg+ graph: its threat model said 'the graph is in the roster, so the server may aim'."""
    import privfed
    from mechanisms.secagg import CKKSAggregation

    rng = np.random.default_rng(0)
    head = privfed.fit(
        "fedncm", rng.normal(size=(60, 3)), np.arange(60) % 2, np.arange(60) % 4, secure_agg=CKKSAggregation()
    )
    text = head.secure_aggregation.threat_model
    assert text.startswith("CKKS") and "graph" not in text


def test_too_many_clients_for_the_ckks_grid_are_refused_before_any_sum(monkeypatch):
    """With 300 clients the refusal came at the second secure sum, after the counts' sum had run and released."""
    import mechanisms.secagg.protection as protection
    import privfed
    from mechanisms.secagg import CKKSAggregation
    from privfed.errors import ConfigError

    sums = []
    real = protection.ckks_sum
    monkeypatch.setattr(protection, "ckks_sum", lambda *a, **k: sums.append(1) or real(*a, **k))
    rng = np.random.default_rng(0)
    F, y, k = rng.normal(size=(600, 3)), rng.integers(0, 2, 600), np.arange(600) % 300
    with pytest.raises(
        ConfigError, match=r"CKKS with 300 nodes.*use at most 256 nodes with CKKS, or --secure-agg mask"
    ):
        privfed.fit("fedncm", F, y, k, secure_agg=CKKSAggregation())
    assert sums == []
    head = privfed.fit("fedncm", F, y, np.arange(600) % 200, secure_agg=CKKSAggregation())
    assert len(sums) >= 2 and head.weight.shape == (2, 3)
