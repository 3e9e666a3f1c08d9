"""FedCOF's round-2 broadcast against a server that isolates one class (privfed.methods.fedcof_protocol).

A broadcast with K_c = 1 (or N_c = 1) would give class c weight 0 in round 2; sent for every class but c*,
the round-2 sum would be class c*'s scatter alone, rank one when two nodes hold c*, and with round 1's N_c,
S_c it would give both nodes' means.  Nodes used to refuse such a broadcast by comparing it with their own
counts, a refusal that read their data (a server asking again and again learned it).  Now every check reads
the broadcast and public values only, and with exact counts (no DP) each node floors every class weight at
1, which changes no honest sum (N_c >= K_c gives w_c >= 1; a class of one mean adds nothing): no broadcast
zeroes a class, so the isolation fails by arithmetic, not by a refusal.  With the roster's bound on N_c the
weights lie in [1, max_count - 1].

Tolerances: the sums below are float64 sums of the same terms (1e-9 relative).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mechanisms.secagg.crypto import ProtocolAbort
from privfed import methods
from privfed.errors import InputError
from privfed.flower.protocol import node_vector
from privfed.methods.fedcof_protocol import BroadcastRefused, FedCOFNode, FedCOFServer
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


def _scatter(counts, means, mu, c):
    """sum_k n_kc (m_kc - mu_c)(m_kc - mu_c)^T over the nodes holding class c, by a loop."""
    out = np.zeros((D, D))
    for k in range(counts.shape[0]):
        if counts[k, c] > 0:
            dev = means[k, c] - mu[c]
            out += counts[k, c] * np.outer(dev, dev)
    return out


def test_the_class_isolation_broadcast_leaves_every_class_in_the_sum():
    counts, means, nodes = _review_nodes()
    b = _honest(nodes)
    assert b["Kc"].tolist() == [5.0, 5.0, 2.0]
    # weight 0 for classes 0 and 1 (K_c = 1, then N_c = K_c = 1): class 2's scatter alone, rank one
    for lie in (
        dict(b, Kc=np.array([1.0, 1.0, 2.0])),
        dict(b, N=np.array([1.0, 1.0, b["N"][2]]), Kc=np.ones(3)),
    ):
        got = np.sum([n.round2(lie)[:-1] for n in nodes], axis=0).reshape(D, D)  # every node accepts it
        w = np.maximum(np.maximum(lie["N"] - 1, 0) / np.maximum(lie["Kc"] - 1, 1), 1.0)
        few = lie["Kc"] <= 1  # a class of at most one mean takes the least weight of the others (1 if none)
        w[few] = w[~few].min() if (~few).any() else 1.0
        want = sum(w[c] * _scatter(counts, means, lie["mu"], c) for c in range(C))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
        alone = w[2] * _scatter(counts, means, lie["mu"], 2)  # what the attack needed
        assert np.linalg.matrix_rank(alone, tol=1e-9 * np.abs(alone).max()) == 1
        rest = (
            got - alone
        )  # classes 0 and 1 at class 2's weight (or 1): a full-rank term the server cannot take out
        assert np.linalg.eigvalsh(rest).min() > 1e-3 * np.abs(alone).max()
    for n in nodes:  # the honest broadcast still passes
        n.round2(b)


def test_with_noisy_counts_the_weights_are_fedcofs_and_can_be_zero():
    """In one process, with DP-noised counts (``exact=False``), the weights are FedCOF's own: K_c = 1 gives
    weight 0 (the noise protects the class; the Flower app refuses DP on this protocol)."""
    counts, means, nodes = _review_nodes()
    b = _honest(nodes)
    noisy = FedCOFNode(counts[:1] + 0.25, (counts[0, :, None] * means[0])[None], exact=False)
    assert not noisy.exact and noisy.weights(b["N"], np.array([1.0, 1.0, 2.0])).tolist()[:2] == [0.0, 0.0]
    exact = FedCOFNode(counts[:1], (counts[0, :, None] * means[0])[None])
    assert exact.exact and exact.weights(b["N"], np.array([1.0, 1.0, 2.0])).min() >= 1.0


def _random_broadcasts(rng, n=300):
    """Broadcasts around an honest one: counts and means moved, K_c anywhere in 0..6."""
    out = []
    for _ in range(n):
        N = rng.integers(0, 80, C).astype(float)
        if rng.random() < 0.2:
            N = N + rng.choice([0.5, -3.0])
        Kc = rng.integers(0, 7, C).astype(float)
        mu = rng.normal(size=(C, D)) * (Kc > 0)[:, None]
        out.append({"N": N, "mu": mu, "Kc": Kc})
    return out


def test_every_check_reads_the_broadcast_alone_two_nodes_with_different_data_answer_alike():
    """Two nodes with other counts, sums and numbers of rows (one and two) accept and refuse exactly the same
    broadcasts, with the same texts: a refusal tells the server nothing of either node's data."""
    rng = np.random.default_rng(11)
    a = FedCOFNode(np.array([[17.0, 4.0, 0.0]]), rng.normal(size=(1, C, D)), max_means=5, max_count=60)
    b = FedCOFNode(
        np.array([[2.0, 30.0, 9.0], [1.0, 0.0, 40.0]]), rng.normal(size=(2, C, D)), max_means=5, max_count=60
    )
    refused = 0
    for bc in _random_broadcasts(rng):
        answers = []
        for node in (a, b):
            try:
                node.check_broadcast(bc)
                answers.append(None)
            except BroadcastRefused as exc:
                answers.append((exc.deviation, str(exc)))
        assert answers[0] == answers[1], (bc, answers)
        refused += answers[0] is not None
    assert 50 < refused < 300  # both outcomes occur: the property is not vacuous


def test_a_node_refuses_more_means_or_records_than_the_public_bounds():
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


def test_a_spread_beyond_the_encodable_range_is_clipped_and_counted_never_refused():
    counts, means, nodes = _review_nodes()
    b = _honest(nodes)
    far = dict(b, mu=b["mu"] + 1e6)  # a broadcast that blows every spread up
    small = FedCOFNode(counts[:1], (counts[0, :, None] * means[0])[None], limit=1e5)
    v = small.round2(far)
    assert v[-1] == 1.0 and np.abs(v[:-1]).max() == 1e5  # clipped, and it says so
    assert small.round2(b)[-1] == 0.0  # the honest spread fits
    server = FedCOFServer(methods.get("fedcof"), C, D)
    server.fold_round1(np.sum([n.round1() for n in nodes], axis=0))
    with pytest.raises(InputError, match="1 node\\(s\\) clipped their FedCOF round-2 spread"):
        server.head(v)


def _private_values(counts, sums):
    own = [f"{v:g}" for v in np.concatenate([counts.sum(axis=0), sums.sum(axis=0).ravel()])]
    return [
        v for v in own if len(v.lstrip("-")) > 1
    ]  # "17", "4.5", ...: a one-digit number also spells "round 1"


@pytest.mark.parametrize(
    "lie",
    [
        lambda b: dict(b, Kc=np.zeros(C)),  # no means but counts
        lambda b: dict(b, N=np.ones(C)),  # fewer records than means
        lambda b: dict(b, N=b["N"] + 0.5),  # a fractional count
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
            node_vector(st, methods.get("fedcof"), "fedcof-2", lie(honest), node=3, stage="masked")
        text = str(exc.value)
        for v in _private_values(st.counts, st.sums):
            assert not re.search(rf"(?<![\d.]){re.escape(v)}(?![\d])", text), (v, text)
        texts.append(text)
    assert texts[0] == texts[1]  # the rule's text, whatever the node holds
    assert "aborts" in texts[0] and ("breaks a rule" in texts[0] or "K_c = 0" in texts[0])
