"""FedCOF's two-round secure protocol (privfed.methods.fedcof_protocol): each node's vectors against an
independent computation, the server's head against plain FedCOF, the bytes of one round-1 sum, and every
check a node makes on the round-2 broadcast (a lying server's broadcast is refused, an honest one never).

Tolerances.  The node's vectors are sums of the same float64 terms in another order (1e-12 relative).
Masking at f = 32 rounds each real value by at most 2^-33 and leaves whole numbers exact, so the decoded
counts and presence equal the plain ones exactly; heads agree to 1e-9 (as tests/methods/test_methods.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms.secagg.comm import secagg_upload_bytes
from mechanisms.secagg.protection import CKKSAggregation, PairwiseMasking
from privfed import methods
from privfed.errors import InputError
from privfed.methods.fedcof_protocol import (
    BroadcastRefused,
    FedCOFNode,
    FedCOFServer,
    node_rows,
    round_lengths,
    run_in_process,
)
from privfed.stats import ClientStats, compute_client_stats

C, D = 4, 5


def _data(seed=0, K=6, n=240):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    X = rng.normal(size=(n, D)) + 3 * rng.normal(size=(C, D))[y]
    k = rng.integers(0, K, n)
    k[:K] = np.arange(K)
    return X, y, k


def _plain_sum(a):
    return np.asarray(a, dtype=np.float64).sum(axis=0)


def _loop_round1(counts, sums, noise_aware):
    """Round 1 by hand: a loop over the node's rows and classes, pairs with n <= 0 left out."""
    n, s, p, inv = np.zeros(C), np.zeros((C, D)), np.zeros(C), np.zeros(C)
    for r in range(counts.shape[0]):
        for c in range(C):
            if counts[r, c] > 0:
                n[c] += counts[r, c]
                s[c] += sums[r, c]
                p[c] += 1
                inv[c] += 1 / counts[r, c]
    return np.concatenate([n, s.ravel(), p] + ([inv] if noise_aware else []))


def _loop_round2(counts, sums, N, mu, Kc):
    out = np.zeros((D, D))
    for r in range(counts.shape[0]):
        for c in range(C):
            if counts[r, c] > 0 and Kc[c] >= 2:
                w = max(N[c] - 1, 0) / (Kc[c] - 1)
                dev = sums[r, c] / counts[r, c] - mu[c]
                out += w * counts[r, c] * np.outer(dev, dev)
    return out


@pytest.mark.parametrize("params", [{}, {"means_per_client": 3}, {"noise_var": 0.5}])
def test_node_vectors_equal_a_loop_over_rows_and_classes(params):
    m = methods.get("fedcof", **params)
    X, y, k = _data(1)
    st = m.client_stats(X, y, k, num_classes=C, num_clients=6, rng=np.random.default_rng(2))
    st = st.with_arrays(counts=st.counts - (st.counts == 1))  # a few pairs with n = 0: dropped
    noise_aware = params.get("noise_var", 0) > 0
    server = FedCOFServer(m, C, D)
    rows = node_rows(st)
    total = np.zeros(round_lengths(C, D, noise_aware)["fedcof-1"])
    for counts, sums in rows:
        v = FedCOFNode(counts, sums, noise_aware=noise_aware).round1()
        np.testing.assert_allclose(v, _loop_round1(counts, sums, noise_aware), rtol=1e-12, atol=1e-12)
        total += v
    b = server.fold_round1(total)
    N, S = total[:C], total[C : C + C * D].reshape(C, D)
    np.testing.assert_array_equal(b["Kc"], total[C + C * D : 2 * C + C * D])
    np.testing.assert_allclose(b["mu"], S / N[:, None], rtol=1e-12)
    for counts, sums in rows:
        got = FedCOFNode(counts, sums, noise_aware=noise_aware).round2(b)
        want = _loop_round2(counts, sums, b["N"], b["mu"], b["Kc"])
        assert got.shape == (D * D + 1,) and got[-1] == 0.0  # the spread, then "not clipped"
        np.testing.assert_allclose(
            got[:-1].reshape(D, D), want, rtol=0, atol=1e-12 * max(np.abs(want).max(), 1.0)
        )
    # the in-process run is these two sums, and its head is plain FedCOF's
    head = run_in_process(m, st, _plain_sum)
    ref = m.aggregate(st)
    np.testing.assert_allclose(head.weight, ref.weight, rtol=1e-9, atol=1e-10)
    assert head.extras["rounds"] == 2


@pytest.mark.parametrize("noise_var", [0.0, 0.5])
def test_round_one_is_one_masked_sum_with_exact_counts_and_the_bytes_of_the_model(noise_var):
    """One secure sum for round 1 instead of three: the same payload, two protocol overheads fewer
    (each: two 32-byte public keys, K - 1 share messages of 104 bytes, K unmasking answers of 37 bytes)."""
    m = methods.get("fedcof", noise_var=noise_var)
    X, y, k = _data(3)
    st = compute_client_stats(X, y, k, num_classes=C)
    K = st.num_clients
    sa = PairwiseMasking(key_seed=2)
    head = run_in_process(m, st, sa.secure_sum(np.random.default_rng(0)))
    calls = sa.last_run.calls
    n1 = round_lengths(C, D, noise_var > 0)["fedcof-1"]
    assert [c["shape"] for c in calls] == [(n1,), (D * D + 1,)]
    assert n1 == 2 * C + C * D + (C if noise_var else 0)
    measured = sum(c["upload_bytes_mean"] for c in calls)
    overhead = 2 * 32 + (K - 1) * 104 + K * 37
    assert measured == 8 * (n1 + D * D + 1) + 2 * overhead
    model = secagg_upload_bytes(m, K * C, K, D, C, "mask")
    assert model["upload"] == measured and model["calls"] == 2
    # the three-sum round 1 it replaces paid the overhead twice more for the same values
    assert 8 * (n1 + D * D + 1) + 4 * overhead - measured == 2 * overhead
    np.testing.assert_array_equal(head.extras["N"], st.counts.sum(axis=0))  # whole counts: exact
    np.testing.assert_array_equal(head.extras["Kc"], (st.counts > 0).sum(axis=0))
    np.testing.assert_allclose(head.weight, m.aggregate(st).weight, rtol=0, atol=1e-9)


def test_ckks_runs_the_same_two_sums():
    m = methods.get("fedcof")
    X, y, k = _data(4)
    st = compute_client_stats(X, y, k, num_classes=C)
    sa = CKKSAggregation()
    head = run_in_process(m, st, sa.secure_sum(np.random.default_rng(0)))
    assert [c["shape"] for c in sa.last_run.calls] == [(2 * C + C * D,), (D * D + 1,)]
    np.testing.assert_array_equal(head.extras["N"], st.counts.sum(axis=0))
    scale = max(np.abs(head.weight).max(), 1.0)
    assert np.abs(head.weight - m.aggregate(st).weight).max() <= 1e-6 * scale


# -- the round-2 broadcast a node receives ----------------------------------------------------
def _node_and_broadcast():
    X, y, k = _data(5)
    st = compute_client_stats(X, y, k, num_classes=C)
    m = methods.get("fedcof")
    server = FedCOFServer(m, C, D)
    b = server.fold_round1(sum(FedCOFNode(c, s).round1() for c, s in node_rows(st)))
    node = FedCOFNode(st.counts[:1], st.sums[:1])
    return node, b, st


def _lie(b, **changes):
    out = {k: np.array(v, dtype=np.float64) for k, v in b.items()}
    for k, v in changes.items():
        if v is None:
            out.pop(k)
        else:
            out[k] = v
    return out


def test_an_honest_broadcast_is_accepted_with_noisy_and_dropped_counts():
    node, b, st = _node_and_broadcast()
    node.check_broadcast(b)
    rng = np.random.default_rng(9)
    counts = st.counts + rng.normal(0, 2.0, st.counts.shape)
    counts[0, 0] = -0.5  # a pair the drop rule holds back
    noisy = st.with_arrays(counts=counts)
    nodes = [FedCOFNode(c, s) for c, s in node_rows(noisy)]
    server = FedCOFServer(methods.get("fedcof"), C, D)
    bb = server.fold_round1(sum(n.round1() for n in nodes))
    for n in nodes:
        n.check_broadcast(bb)
    assert sum(n.dropped for n in nodes) > 0


@pytest.mark.parametrize(
    "lie,deviation,text",
    [
        (lambda b, C: None, "malformed", "not N, mu and Kc"),
        (lambda b, C: _lie(b, Kc=None), "malformed", "expected exactly"),
        (lambda b, C: _lie(b, extra=np.zeros(C)), "malformed", "expected exactly"),
        (lambda b, C: _lie(b, mu=np.zeros((C, D + 1))), "malformed", "shape"),
        (lambda b, C: _lie(b, N=np.array(["a"] * C)), "malformed", "not numeric"),
        (lambda b, C: _lie(b, mu=np.full((C, D), np.nan)), "non-finite", "NaN or inf"),
        (lambda b, C: _lie(b, Kc=b["Kc"] + 0.5), "implausible-broadcast", "whole numbers"),
        (lambda b, C: _lie(b, Kc=-b["Kc"]), "implausible-broadcast", "whole numbers"),
        (lambda b, C: _lie(b, Kc=np.zeros(C)), "implausible-broadcast", "K_c = 0 \\(no mean\\)"),
        (lambda b, C: _lie(b, N=np.ones(C)), "implausible-broadcast", "at least K_c, one record per mean"),
        (lambda b, C: _lie(b, N=b["N"] + 0.5), "implausible-broadcast", "every N_c is a whole number"),
    ],
)
def test_a_lying_broadcast_is_refused_before_the_node_computes(lie, deviation, text):
    node, b, _ = _node_and_broadcast()
    with pytest.raises(BroadcastRefused, match=text) as exc:
        node.round2(lie(b, C))
    assert exc.value.deviation == deviation


def test_a_class_without_means_but_with_a_count_is_refused():
    node, b, _ = _node_and_broadcast()
    empty = FedCOFNode(np.zeros((1, C)), np.zeros((1, C, D)))  # a node holding nothing: its own checks pass
    bad = _lie(b, Kc=np.where(np.arange(C) == 0, 0.0, b["Kc"]))
    with pytest.raises(BroadcastRefused, match="K_c = 0") as exc:
        empty.round2(bad)
    assert exc.value.deviation == "implausible-broadcast"


def test_server_refuses_sums_of_the_wrong_length():
    server = FedCOFServer(methods.get("fedcof"), C, D)
    with pytest.raises(InputError, match="round 1's sum first"):
        server.head(np.zeros((D, D)))
    with pytest.raises(InputError, match="round-1 sum has 3 values"):
        server.fold_round1(np.zeros(3))
    server.fold_round1(np.ones(round_lengths(C, D, False)["fedcof-1"]))
    with pytest.raises(InputError, match="d\\^2"):
        server.head(np.zeros(D))
    with pytest.raises(InputError, match="counts \\(R, C\\)"):
        FedCOFNode(np.zeros(C), np.zeros((C, D)))


def test_a_node_without_data_sends_zeros():
    empty = FedCOFNode(np.zeros((0, C)), np.zeros((0, C, D)))
    assert not empty.round1().any()
    _, b, _ = _node_and_broadcast()
    assert not empty.round2(b).any()
    assert ClientStats(counts=np.zeros((0, C)), sums=np.zeros((0, C, D))).num_clients == 0
