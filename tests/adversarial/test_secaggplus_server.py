"""A lying server against masking on a SecAgg+ graph (honest-but-curious version, Bell et al. 2020).

Threat model of the sparse version: the graph is drawn by the operator from OS entropy (a uniform secret
relabelling of a Harary graph), each node masks with and shares to its k neighbours only, with threshold
t > (k + 1) / 2 in every neighbourhood.  A server that lies about who uploaded still never holds t shares of
both kinds for one node (so it cannot strip both masks from one upload), a node it lists as dropped refuses
to answer, and the sum is right with dropouts.  Run with ``python -m pytest tests/adversarial``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mechanisms.secagg import fixed_point, shamir
from mechanisms.secagg.crypto import (
    INFO_PAIR,
    KeySource,
    ProtocolAbort,
    add_masks,
    hkdf,
    private_key,
    public_key,
)
from mechanisms.secagg.masking import harary_graph, majority_threshold, masked_sum
from mechanisms.secagg.masking.node import MaskingNode
from mechanisms.secagg.masking.server import MaskingServer

FRAC = 16
K, DEGREE, LENGTH = 12, 4, 5


class SparseFederation:
    """K nodes on a Harary graph of degree k, the server's requests delivered by the test."""

    def __init__(self, seed: int = 0) -> None:
        self.graph = harary_graph(K, DEGREE, np.random.default_rng(seed))
        self.t = majority_threshold(DEGREE + 1)
        self.x = np.random.default_rng(seed).normal(0, 10, size=(K, LENGTH))
        keys = KeySource(seed)
        self.nodes = {
            u: MaskingNode(u, num_nodes=K, threshold=self.t, neighbours=self.graph[u], keys=keys)
            for u in range(K)
        }
        self.server = MaskingServer(
            num_nodes=K,
            threshold=self.t,
            length=LENGTH,
            session=keys(16),
            active=False,
            graph=self.graph,
            frac_bits=FRAC,
        )

    def send(self, u: int, msg: dict) -> dict:
        return self.nodes[u].handle(msg, ring_input=lambda: fixed_point.encode(self.x[u], FRAC))

    def run_until(self, stage: str) -> None:
        while self.server.stage != stage:
            for u, msg in self.server.requests().items():
                self.server.receive(u, self.send(u, msg))
            self.server.close()


def test_threshold_is_a_majority_of_every_neighbourhood():
    fed = SparseFederation()
    assert 2 * fed.t > DEGREE + 1 and all(len(g) == DEGREE for g in fed.graph)


@pytest.mark.parametrize("victim", [0, 7])
def test_split_uploader_lists_in_a_neighbourhood_never_give_both_kinds_of_share(victim):
    """Every split of the victim's neighbours into "victim uploaded" / "victim dropped" views: the server
    never holds t shares of the victim's self-mask seed and t of its mask key together."""
    nbrs = sorted(SparseFederation().graph[victim])
    for k in range(len(nbrs) + 1):
        for shown in itertools.combinations(nbrs, k):
            fed = SparseFederation()
            assert sorted(fed.graph[victim]) == nbrs
            fed.run_until("unmask")
            everyone, without = list(range(K)), [u for u in range(K) if u != victim]
            kinds = {"b": 0, "s": 0}
            for u in [victim, *nbrs]:
                U3 = everyone if u == victim or u in shown else without
                U3 = [w for w in U3 if w == u or w in fed.graph[u]]  # as the server sends it: u's group
                try:
                    reply = fed.send(u, {"stage": "unmask", "session": fed.server.session, "uploaded": U3})
                except ProtocolAbort as exc:
                    assert exc.node == u and exc.deviation == "short-list", str(exc)
                    continue
                kinds[reply["kind"][reply["about"].index(victim)]] += 1
                assert reply["kind"].count("b") + reply["kind"].count("s") == len(reply["about"])
            assert min(kinds.values()) < fed.t, (shown, kinds)


def test_a_node_listed_as_dropped_refuses_and_its_upload_stays_masked():
    """The server tells everyone the victim dropped after it uploaded: the victim refuses, the neighbours
    reveal its mask key (as for a real dropout), and with it the server strips the pair masks, but the
    self mask stays: what it holds is uniform in the ring, nowhere near the victim's input."""
    victim = 3
    fed = SparseFederation(seed=1)
    fed.run_until("unmask")
    y = fed.server.view.masked_uploads[victim].copy()
    without = [u for u in range(K) if u != victim]
    U3 = [w for w in without if w in fed.graph[victim]]
    with pytest.raises(ProtocolAbort) as exc:
        fed.send(victim, {"stage": "unmask", "session": fed.server.session, "uploaded": U3})
    assert exc.value.deviation == "drop-claim" and exc.value.node == victim
    s_shares, b_shares = {}, {}
    for v in sorted(fed.graph[victim]):
        U3 = [w for w in without if w == v or w in fed.graph[v]]
        reply = fed.send(v, {"stage": "unmask", "session": fed.server.session, "uploaded": U3})
        i = reply["about"].index(victim)
        (s_shares if reply["kind"][i] == "s" else b_shares)[v + 1] = int.from_bytes(
            reply["share"][i], "little"
        )
    assert len(s_shares) == DEGREE >= fed.t and not b_shares
    s_sk = private_key(shamir.combine(s_shares, fed.t))
    keys, signs = [], []
    for v in sorted(fed.graph[victim]):
        secret = s_sk.exchange(public_key(fed.server.view.public_keys[v][1]))
        keys.append(hkdf(secret, INFO_PAIR + fed.server.session))
        signs.append(victim < v)  # the victim added +m for v > victim: subtract it
    add_masks(y, keys, signs)
    left = fixed_point.decode(y, FRAC) - fed.x[victim]  # = PRG(b_victim), decoded
    assert np.all(np.abs(left) > 1e3)


@pytest.mark.parametrize(
    "before, after", [([], []), ([4], [9]), ([0, 17], [5, 30]), ([], [1, 2, 3]), ([6, 7], [])]
)
def test_sparse_masked_sum_is_exact_with_dropouts(before, after):
    n = 40
    rng = np.random.default_rng(11)
    X = rng.integers(-1000, 1000, size=(n, 7)).astype(float)
    res = masked_sum(
        X, neighbours=8, dropped_before_upload=before, dropped_after_upload=after, key_seed=3, rng=rng
    )
    kept = np.setdiff1d(np.arange(n), before)
    assert res.frac_bits == 0 and np.array_equal(res.total, X[kept].sum(axis=0))
    assert res.uploaded == tuple(kept)


def test_a_neighbourhood_that_loses_its_threshold_aborts_without_a_sum():
    """Losing the whole neighbourhood of one uploader (after it uploaded) leaves its self-mask seed with one
    share holder, below t, while 24 of 30 nodes answer: the run aborts rather than release a wrong sum."""
    n, k = 30, 6
    X = np.random.default_rng(2).normal(size=(n, 3))
    # The relabelling masked_sum draws: the first 32 bytes of its key source.
    graph = harary_graph(n, k, np.random.default_rng(int.from_bytes(KeySource(1)(32), "little")))
    with pytest.raises(ProtocolAbort, match="self-mask seed of node 0 cannot be rebuilt"):
        masked_sum(X, neighbours=k, dropped_after_upload=sorted(graph[0]), key_seed=1)
    # Without node 0's neighbourhood gone, the same dropouts elsewhere are recovered.
    others = sorted(set(range(1, n)) - graph[0] - set().union(*(graph[v] for v in graph[0])))[:3]
    res = masked_sum(X, neighbours=k, dropped_after_upload=others, key_seed=1)
    assert np.abs(res.total - X.sum(axis=0)).max() <= n * 2.0**-33
