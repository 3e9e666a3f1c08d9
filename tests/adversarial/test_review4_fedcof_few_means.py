"""A lying server's FedCOF round-2 broadcast built from classes of at most one mean (K_c <= 1).

A class with K_c <= 1 now takes the least weight of the other classes.  The server picks N_c, K_c and mu_c
within the node's public rules (whole N_c >= K_c, K_c <= max_means, N_c <= max(K_c, 1) * max_records,
weight ratio <= max_ratio).  Whatever mix of K_c = 0 / 1 / 2+ and N_c it picks, the weight each class's
scatter enters the node's round-2 spread with -- measured here from the node's answer for data of that
class alone, not read from the code's weights -- stays within the roster's ratio of every other class's:
claiming K_c <= 1 for every class but one, or K_c = 1 with a large N_c for a class many nodes hold, tilts
nothing.  An honest federation with a rare (K_c = 1) and an absent (K_c = 0) class still runs under a
small ratio.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from privfed.methods.fedcof_protocol import BroadcastRefused, FedCOFNode

C, D = 4, 3
MAX_MEANS, MAX_RECORDS, RATIO = 6, 40, 3.0


def _node(counts, sums):
    return FedCOFNode(
        np.asarray(counts, float)[None],
        np.asarray(sums, float)[None],
        max_means=MAX_MEANS,
        max_count=MAX_MEANS * MAX_RECORDS,
        max_records=MAX_RECORDS,
        max_ratio=RATIO,
    )


def _class_weight(broadcast, c, rng) -> float | None:
    """The weight class c's scatter takes in the node's spread: the answer of a node holding class c only,
    over n (mu_k - mu_c)(mu_k - mu_c)^T computed here.  None: the node refused the broadcast."""
    n = 5.0
    mean = rng.normal(size=D) + 3.0
    counts = np.zeros(C)
    sums = np.zeros((C, D))
    counts[c], sums[c] = n, n * mean
    try:
        out = _node(counts, sums).round2(broadcast)
    except BroadcastRefused:
        return None
    dev = mean - np.asarray(broadcast["mu"], float)[c]
    scatter = n * np.outer(dev, dev)
    return float(np.trace(out[:-1].reshape(D, D)) / np.trace(scatter))


def _weights(broadcast, seed=0):
    rng = np.random.default_rng(seed)
    w = [_class_weight(broadcast, c, rng) for c in range(C)]
    return None if any(x is None for x in w) else np.array(w)


def _broadcast(N, Kc, seed=1):
    rng = np.random.default_rng(seed)
    Kc = np.asarray(Kc, float)
    mu = rng.normal(size=(C, D))
    mu[Kc == 0] = 0.0
    N = np.where(Kc == 0, 0.0, np.asarray(N, float))
    return {"N": N, "mu": mu, "Kc": Kc}


def test_every_class_but_one_claimed_one_mean_tilts_nothing():
    # class 0: K_c = 2 and N_c at its largest (weight MAX_RECORDS*2 - 1); the rest one mean each, N_c = 1
    b = _broadcast([2 * MAX_RECORDS, 1, 1, 1], [2, 1, 1, 1])
    w = _weights(b)
    assert w is not None, "a broadcast within the public rules is accepted"
    np.testing.assert_allclose(w, w[0], rtol=1e-9)  # every class weighs the same: no class stands out


def test_one_mean_claimed_for_a_class_many_nodes_hold_takes_the_least_weight():
    # class 3 held by many: N_c large, K_c = 1; the others K_c = 3 with weight (N - 1)/2 in 1..RATIO
    b = _broadcast([3, 5, 7, MAX_RECORDS], [3, 3, 3, 1])
    w = _weights(b)
    assert w is not None
    np.testing.assert_allclose(w, [1.0, 2.0, 3.0, 1.0], rtol=1e-9)


def test_no_mix_of_zero_one_and_more_means_tilts_beyond_the_ratio():
    seen = 0
    Ns = [1, 2, 3, 5, 9, 20, 2 * MAX_RECORDS]
    for Kc in itertools.product([0, 1, 2, 3], repeat=C):
        for N in itertools.product(Ns, repeat=2):
            full = [N[0], N[1], N[0], N[1]]
            b = _broadcast([max(n, k) for n, k in zip(full, Kc, strict=True)], Kc)
            w = _weights(b)
            if w is None:
                continue
            seen += 1
            assert w.min() >= 1.0 - 1e-9
            assert w.max() <= RATIO * w.min() * (1 + 1e-6), (Kc, full, w)
    assert seen > 100  # the rules let many broadcasts through; every one of them was measured


def test_an_honest_federation_with_a_rare_and_an_absent_class_runs_under_a_small_ratio():
    rng = np.random.default_rng(5)
    nodes = []
    for k in range(4):
        counts = np.array([10.0 + k, 12.0, 1.0 if k == 0 else 0.0, 0.0])  # class 2: one node; class 3: none
        sums = rng.normal(size=(C, D)) * counts[:, None]
        nodes.append((counts, sums))
    N = sum(c for c, _ in nodes)
    S = sum(s for _, s in nodes)
    Kc = sum((c > 0).astype(float) for c, _ in nodes)
    mu = np.where(N[:, None] > 0, S / np.maximum(N, 1)[:, None], 0.0)
    b = {"N": np.where(Kc == 1, 1.0, N), "mu": mu, "Kc": Kc}  # as FedCOFServer.broadcast forms it
    total = sum(_node(c, s).round2(b)[:-1] for c, s in nodes)
    # the honest value: sum over the classes of two or more means of (N_c - 1)/(K_c - 1) times their scatter
    want = np.zeros((D, D))
    for c in range(C):
        if Kc[c] >= 2:
            for counts, sums in nodes:
                if counts[c] > 0:
                    dev = sums[c] / counts[c] - mu[c]
                    want += (N[c] - 1) / (Kc[c] - 1) * counts[c] * np.outer(dev, dev)
    np.testing.assert_allclose(total, want.ravel(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("Kc", [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1]])
def test_no_class_of_two_means_gives_every_class_weight_one(Kc):
    b = _broadcast([1, 1, 1, 1], Kc)
    w = _weights(b)
    assert w is not None
    np.testing.assert_allclose(w, 1.0, rtol=1e-9)
