"""The SecAgg+ graph of a roster: a k-regular Harary graph on a random ring order, drawn by the operator.

Bell et al. (CCS 2020) let each node mask with and share its seeds among
only k neighbours.  Against a server that deviates, the server must not
choose the graph: the operator draws it with the roster
(:func:`mechanisms.secagg.identity.make_roster`, OS entropy) as a uniform
order of the K nodes on a ring, each node joined to the k/2 nearest on
either side (k even).  The roster carries the order and k, its fingerprint
covers both, and every node derives the same neighbour sets from it
(:func:`ring_neighbours`), so a server that lists other neighbours is
refused by the nodes' own checks.

A node's *group* is itself and its k neighbours (k + 1 share holders);
:func:`mechanisms.secagg.identity.min_threshold` of the group size gives
the smallest threshold of the condition below.

Threat model of the active version on the graph
(:mod:`mechanisms.secagg.masking.node`).  Node u's group G_u is u and its k
neighbours, and every list the server sends u must lie within G_u (a node
outside it is refused; a member left out counts as a dropout, which the
server may always claim).  In the consistency round u signs its own view
of its group, (U2 & G_u, U3 & G_u, digest); before unmasking, u needs t
signatures from uploaders of its group, each on a view that agrees with
u's on every node both groups hold (the server sends each signer's lists;
a signature that does not verify, or a view that disagrees, aborts), and
every uploader v of its view must have signed, with its upload, an echo
of the survivors of G_v it masked with that agrees with u's U2 on
G_u & G_v (so v masked with u).  With c colluders (n_C) the condition is

    t >= 2,   2t > k + 1 + c   and   t <= k + 1.

Why.  (a) Both seeds of an honest v: only G_v holds shares of b_v and s_v.
An honest holder reveals one kind for v, chosen from its own view; the c_v
colluders of G_v reveal both.  t of each needs b + c_v >= t and
s + c_v >= t with b + s <= k + 1 - c_v honest holders, so
k + 1 + c_v >= 2t: excluded.  (b) A node that answers the unmask stage is
not also "dropped": each signer u that w counts lies in G_w, so G_u holds
w too, and u's view, agreeing with w's on w, lists w as an uploader.  If
honest w reveals, at least t - c_w honest members of G_w signed such views,
and none of them reveals a share of s_w (an honest node signs one view per
session and reveals by it); at most (k + 1 - c_w) - (t - c_w) honest
holders and the c_w colluders can, k + 1 - t + c_w < t in all.  So
the server never removes the pair masks of w while w's shares help unmask
a neighbour.  To open v's upload it needs t shares of b_v, at least t - c_v
from honest members w of G_v that answered with v in their U3; each such w
checked v's echo, so v masked with w (and w with v), and that pair mask
goes only with w's upload in the sum (neither s_w nor s_v is rebuilt):
every sum it decodes covers, with each honest v in it, at least t - c_v
honest members of G_v (v among them) -- at least t - c honest inputs in
all.  Without the echo's survivor list a server could tell v that only a
few neighbours survive (v masks with those alone), tell the others that v
is alive, have them reveal b_v and the key shares of the few, and open v's
upload alone (tests/adversarial/test_secaggplus_review.py).  Not prevented, as on the complete
graph: declaring honest nodes dropped so that the graph left falls apart
and the sum of each part is released (each part holding at least t - c
honest inputs; the graph is in the roster, so the server may aim), a wrong
sum.  (c) A split broadcast is caught within each group, as on the complete
graph (every uploader's signed echo).  The uploader set a node pins in its
ledger is its view of its group: a later sum that changes any node of the
group is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from mechanisms.secagg.crypto import KeySource
from privfed.errors import ConfigError

__all__ = ["check_degree", "draw_ring", "group_size", "ring_neighbours"]


def group_size(num_nodes: int, degree: int | None) -> int:
    """Share holders of each node: itself and its neighbours (K on the complete graph, ``degree=None``;
    else k + 1, at most K)."""
    return int(num_nodes) if degree is None else min(int(num_nodes), int(degree) + 1)


def check_degree(degree: object, num_nodes: int, what: str = "degree") -> int:
    """``degree`` as an int, if it is an even integer in [2, K - 1] (ConfigError naming the fix otherwise)."""
    K = int(num_nodes)
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 2 or degree % 2:
        raise ConfigError(
            f"{what}={degree!r}: the SecAgg+ degree k must be an even integer >= 2 (each node takes k/2 "
            "neighbours on either side of a ring); leave it out for the complete graph"
        )
    if degree >= K:
        raise ConfigError(
            f"{what}={degree} must be below the number of nodes K={K} (a node has at most K - 1 "
            "neighbours); leave it out for the complete graph"
        )
    return int(degree)


def draw_ring(num_nodes: int, keys: KeySource) -> list[int]:
    """A uniform order of 0..K-1 on the ring (Fisher-Yates, unbiased draws from the key source)."""
    order = list(range(int(num_nodes)))
    for i in range(len(order) - 1, 0, -1):
        n = i + 1
        limit = (1 << 64) - (1 << 64) % n  # rejection keeps every j equally likely
        while (r := int.from_bytes(keys(8), "little")) >= limit:
            pass
        j = r % n
        order[i], order[j] = order[j], order[i]
    return order


def ring_neighbours(order: Sequence[int], degree: int) -> list[frozenset[int]]:
    """Neighbour sets of the k-regular Harary graph on ``order``: the k/2 nearest on each side of the ring.

    ``order[p]`` is the node at ring position p; a degree of K - 1 or more gives the complete graph.
    """
    K, k = len(order), int(degree)
    if k >= K - 1:
        return [frozenset(range(K)) - {u} for u in range(K)]
    pos = [0] * K
    for p, u in enumerate(order):
        pos[int(u)] = p
    return [
        frozenset(int(order[(pos[u] + j) % K]) for j in range(-(k // 2), k // 2 + 1) if j != 0)
        for u in range(K)
    ]
