"""Migration: the one FedCOF two-round protocol (privfed.methods.fedcof_protocol) against the two copies it
replaces, FedCOF.secure_aggregate's in-process rounds and privfed.flower.protocol's message rounds."""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms.secagg import CKKSAggregation, PairwiseMasking
from mechanisms.secagg_comm import secagg_upload_bytes
from privfed import methods
from privfed.flower import protocol as old_flower
from privfed.methods.fedcof_protocol import FedCOFNode, FedCOFServer, node_rows, run_in_process
from privfed.stats import ClientStats, compute_client_stats

PARAMS = [{}, {"gamma": 0.0, "solver": "solve"}, {"means_per_client": 3}, {"noise_var": 0.5}]


def _stats(m, seed=0, K=6, C=4, d=5, n=240):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    X = rng.normal(size=(n, d)) + 3 * rng.normal(size=(C, d))[y]
    k = rng.integers(0, K, n)
    k[:K] = np.arange(K)
    return m.client_stats(X, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(seed + 1))


def _plain_sum(a):
    return np.asarray(a, dtype=np.float64).sum(axis=0)


@pytest.mark.parametrize("params", PARAMS)
def test_in_process_old_and_new_give_the_same_head(params):
    m = methods.get("fedcof", **params)
    st = _stats(m)
    old = m.secure_aggregate(st, _plain_sum)
    new = run_in_process(m, st, _plain_sum)
    np.testing.assert_allclose(new.weight, old.weight, rtol=0, atol=1e-9)
    np.testing.assert_allclose(new.bias, old.bias, rtol=0, atol=1e-9)
    assert new.notes == old.notes
    assert new.extras["rounds"] == old.extras["rounds"] == 2


def test_noisy_counts_and_owner_gaps_old_and_new_agree():
    m = methods.get("fedcof")
    r = np.random.default_rng(5)
    st = compute_client_stats(
        r.normal(size=(200, 4)), r.integers(0, 3, 200), np.arange(200) % 6, num_classes=3
    )
    rng = np.random.default_rng(3)
    noisy = st.with_arrays(counts=st.counts + rng.normal(0, 2.0, st.counts.shape))
    grouped = ClientStats(counts=noisy.counts, sums=noisy.sums, owners=np.array([3, 0, 3, 0, 5, 5]))
    for s in (noisy, grouped):
        old, new = m.secure_aggregate(s, _plain_sum), run_in_process(m, s, _plain_sum)
        np.testing.assert_allclose(new.weight, old.weight, rtol=0, atol=1e-9)
        assert new.notes == old.notes


@pytest.mark.parametrize("params", PARAMS)
def test_flower_old_and_new_send_the_same_vectors_and_build_the_same_head(params):
    m = methods.get("fedcof", **params)
    st = _stats(m, seed=2)
    C, d = st.num_classes, st.dim
    owners = np.arange(st.num_clients) if st.owners is None else st.owners
    per_node = [ClientStats(counts=c, sums=s) for c, s in node_rows(st)]
    assert sum(p.num_clients for p in per_node) == len(owners)
    old1 = sum(old_flower.fedcof_round_vector(p, m, "fedcof-1", None) for p in per_node)
    new_nodes = [FedCOFNode.from_stats(p, m) for p in per_node]
    new1 = sum(n.round1() for n in new_nodes)
    np.testing.assert_array_equal(new1, old1)
    assert new1.size == old_flower.fedcof_round1_length(m, C, d)
    b_old = old_flower.fedcof_broadcast(old1, m, C, d)
    server = FedCOFServer(m, C, d)
    b_new = server.fold_round1(new1)
    for k in ("N", "mu", "Kc"):
        np.testing.assert_array_equal(b_new[k], b_old[k])
    bc = {k: b_old[k] for k in ("N", "mu", "Kc")}
    old2 = sum(old_flower.fedcof_round_vector(p, m, "fedcof-2", bc) for p in per_node)
    new2 = sum(n.round2(b_new) for n in new_nodes)
    np.testing.assert_allclose(new2.ravel(), old2, rtol=0, atol=1e-12 * np.abs(old2).max())
    h_old = old_flower.fedcof_head(m, b_old, old2.reshape(d, d))
    h_new = server.head(new2)
    np.testing.assert_allclose(h_new.weight, h_old.weight, rtol=0, atol=1e-9)
    assert h_new.notes == h_old.notes


@pytest.mark.parametrize("protocol", ["mask", "ckks"])
def test_under_secure_sums_same_head_same_guarantee_and_the_documented_new_bytes(protocol):
    """The in-process round 1 moves from three secure sums (counts, sums, presence) to the one vector the
    Flower copy sends: the same decoded sums (whole counts are exact at f = 32 too), two protocol runs."""
    m = methods.get("fedcof")
    st = _stats(m, seed=4)
    K, C, d = st.num_clients, st.num_classes, st.dim

    def make():
        return PairwiseMasking(key_seed=1) if protocol == "mask" else CKKSAggregation()

    old_p, new_p = make(), make()
    old = m.secure_aggregate(st, old_p.secure_sum(np.random.default_rng(0)))
    new = run_in_process(m, st, new_p.secure_sum(np.random.default_rng(0)))
    np.testing.assert_allclose(new.weight, old.weight, rtol=0, atol=1e-9)
    old_calls, new_calls = old_p.last_run.calls, new_p.last_run.calls
    assert [c["shape"] for c in old_calls] == [(C,), (C, d), (C,), (d, d)]
    assert [c["shape"] for c in new_calls] == [(2 * C + C * d,), (d, d)]
    if protocol == "mask":
        up_old = sum(c["upload_bytes_mean"] for c in old_calls)
        up_new = sum(c["upload_bytes_mean"] for c in new_calls)
        # Same payload (8 bytes a value), two protocol overheads fewer: keys 64, K - 1 share messages of
        # 104 bytes, K unmasking answers of 37 bytes (mechanisms.secagg_comm).
        assert up_old - up_new == 2 * (64 + (K - 1) * 104 + K * 37)
        assert secagg_upload_bytes("fedcof", K * C, K, d, C, "mask")["upload"] == up_old
    r_old, r_new = old_p.report(m, st), new_p.report(m, st)
    assert r_new.threat_model == r_old.threat_model and r_new.secure_variant == r_old.secure_variant
