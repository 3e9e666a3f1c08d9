"""FedCOF's round-2 broadcast against a server that isolates one class (privfed.methods.fedcof_protocol).

A broadcast with K_c = 1 gives class c weight 0 in round 2; sent for every class but c*, the round-2 sum
is class c*'s scatter alone, rank one when two nodes hold c*, and with round 1's N_c, S_c it gives both
nodes' means.  A node told it is a class's only contributor (K_c equal to its own means) checks N_c and
N_c mu_c against its own count and sum; a node holding a class told more means than the run's rows
refuses too.  Refusal texts go back to the server, so they carry no value of the node's own.

Tolerances.  In an honest run the check is exact up to the secure sum's encoding: pairs the drop rule
holds back send nothing, so a sole contributor's N_c and S_c are its own values even with noisy counts;
masking rounds each value by at most 2^-33, CKKS releases on the 2^-20 grid, both below COUNT_SLACK.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.protection import CKKSAggregation, PairwiseMasking
from privfed import methods
from privfed.errors import InputError
from privfed.flower.protocol import node_vector
from privfed.methods.fedcof_protocol import (
    COUNT_SLACK,
    BroadcastRefused,
    FedCOFNode,
    FedCOFServer,
    run_in_process,
)
from privfed.stats import ClientStats

C, D = 3, 4


def _review_nodes(seed=0, K=5):
    """K one-row nodes; class 2 held by nodes 0 and 1 only."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(5, 30, size=(K, C)).astype(float)
    counts[2:, 2] = 0.0
    means = rng.normal(size=(K, C, D))
    return (
        counts,
        means,
        [FedCOFNode(counts[k : k + 1], (counts[k, :, None] * means[k])[None]) for k in range(K)],
    )


def _honest(nodes):
    server = FedCOFServer(methods.get("fedcof"), C, D)
    return server.fold_round1(np.sum([n.round1() for n in nodes], axis=0))


def test_the_class_isolation_broadcast_is_refused_by_every_node_told_it_is_alone():
    counts, _, nodes = _review_nodes()
    b = _honest(nodes)
    assert b["Kc"].tolist() == [5.0, 5.0, 2.0]
    lie = dict(b, Kc=np.array([1.0, 1.0, 2.0]))  # weight 0 for classes 0 and 1: class 2's scatter alone
    refused = []
    for k, n in enumerate(nodes):
        try:
            n.round2(lie)
        except BroadcastRefused as exc:
            assert exc.deviation == "implausible-broadcast"
            refused.append(k)
    # independently: a node refuses when it holds a class told K_c = 1 whose N_c is not its own count
    want = [
        k for k in range(len(nodes)) if any(counts[k, c] > 0 and counts[k, c] != b["N"][c] for c in (0, 1))
    ]
    assert refused == want == list(range(len(nodes)))
    for n in nodes:  # the honest broadcast still passes
        n.round2(b)


def _noisy_stats(seed):
    """Six one-row nodes with noisy (fractional, some negative) counts and sums; class 3 held by node 0 alone."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(3, 20, size=(6, C + 1)).astype(float) + rng.normal(0, 2.0, (6, C + 1))
    counts[1:, C] = -np.abs(rng.normal(0, 2.0, 5))  # other nodes' noisy counts of class 3: dropped
    counts[2, 0] = -0.5
    sums = counts[..., None] * rng.normal(size=(6, C + 1, D)) + rng.normal(0, 1.0, (6, C + 1, D))
    return ClientStats(counts=counts, sums=sums)


@pytest.mark.parametrize("aggregation", ["mask", "ckks"])
def test_a_sole_holder_accepts_the_honest_noisy_sum_and_refuses_a_count_or_mean_not_its_own(aggregation):
    st = _noisy_stats(3)
    m = methods.get("fedcof")
    sa = PairwiseMasking(key_seed=1) if aggregation == "mask" else CKKSAggregation()
    secure_sum, released = sa.secure_sum(np.random.default_rng(0)), []

    def watched(stack):
        released.append(secure_sum(stack))
        return released[-1]

    head = run_in_process(m, st, watched)  # every node accepts the honest broadcast
    b = FedCOFServer(m, C + 1, D).fold_round1(released[0])  # the broadcast the nodes got
    N, mu, Kc = b["N"], b["mu"], b["Kc"]
    np.testing.assert_array_equal(Kc, head.extras["Kc"])
    assert Kc[C] == 1 and Kc[0] == 5  # one pair dropped, class 3 held by node 0 alone
    sole = FedCOFNode(st.counts[:1], st.sums[:1])
    sole.check_broadcast(b)
    own_n, own_s = st.counts[0, C], st.sums[0, C]
    assert abs(N[C] - own_n) <= COUNT_SLACK and np.abs(N[C] * mu[C] - own_s).max() <= COUNT_SLACK
    # a class held by two nodes told it has one mean (the isolation lie), N_c inflated, mu_c moved
    lies = [
        dict(b, Kc=np.where(np.arange(C + 1) == 1, 1.0, Kc)),
        dict(b, N=np.where(np.arange(C + 1) == C, N + 1.0, N)),
        dict(b, mu=np.where(np.arange(C + 1)[:, None] == C, mu + 1e-3, mu)),
    ]
    for lie in lies:
        with pytest.raises(BroadcastRefused, match="not its own count and sum") as exc:
            sole.round2(lie)
        assert exc.value.deviation == "implausible-broadcast"


def test_a_node_refuses_more_means_than_the_public_bound():
    counts, means, _ = _review_nodes()
    node = FedCOFNode(counts[:1], (counts[0, :, None] * means[0])[None], max_means=5)
    b = _honest([FedCOFNode(counts[k : k + 1], (counts[k, :, None] * means[k])[None]) for k in range(5)])
    node.check_broadcast(b)  # K_c = 5 = the bound
    with pytest.raises(BroadcastRefused, match="public bound on a class's means"):
        node.check_broadcast(dict(b, Kc=np.array([5.0, 6.0, 2.0])))
    capped = FedCOFNode(counts[:1], (counts[0, :, None] * means[0])[None], max_count=b["N"].max())
    capped.check_broadcast(b)
    with pytest.raises(BroadcastRefused, match="public bound on a class's count"):
        capped.check_broadcast(dict(b, N=b["N"] * 10))
    for bad in (0, np.inf, float("nan")):
        with pytest.raises(InputError, match="max_means"):
            FedCOFNode(counts[:1], counts[:1, :, None] * means[:1], max_means=bad)


def _private_values(counts, sums):
    own = [f"{v:g}" for v in np.concatenate([counts.sum(axis=0), sums.sum(axis=0).ravel()])]
    return [
        v for v in own if len(v.lstrip("-")) > 1
    ]  # "17", "4.5", ...: a one-digit number also spells "round 1"


@pytest.mark.parametrize(
    "lie",
    [
        lambda b, own_k: dict(b, Kc=np.zeros(C)),  # K_c below the node's own means
        lambda b, own_k: dict(b, N=np.ones(C)),  # N_c below its own count
        lambda b, own_k: dict(b, Kc=own_k.astype(float)),  # told it is every class's only contributor
    ],
)
def test_a_refusal_names_the_rule_and_no_value_of_the_node(lie):
    """Two nodes with other counts, sums and numbers of rows (one and two) get the same text."""
    rng = np.random.default_rng(2)
    rows = [np.array([[17.0, 4.0, 9.0]]), np.array([[13.0, 6.0, 3.0], [10.0, 5.0, 2.0]])]
    honest = {"N": np.array([40.0, 15.0, 14.0]), "mu": np.zeros((C, D)), "Kc": np.array([3.0, 3.0, 3.0])}
    texts = []
    for counts in rows:
        st = ClientStats(counts=counts, sums=counts[..., None] * rng.normal(size=counts.shape + (D,)))
        with pytest.raises(ProtocolAbort) as exc:
            b = lie(honest, (counts > 0).sum(axis=0))
            node_vector(st, methods.get("fedcof"), "fedcof-2", b, node=3, stage="masked")
        text = str(exc.value)
        for v in _private_values(st.counts, st.sums):
            assert not re.search(rf"(?<![\d.]){re.escape(v)}(?![\d])", text), (v, text)
        texts.append(text)
    assert texts[0] == texts[1]  # the rule's text, whatever the node holds
    assert "aborts" in texts[0] and "breaks a rule" in texts[0]
