"""The computed threat model against a server that tries every split of survivor views the nodes allow.

:mod:`mechanisms.secagg.threat` states, for a roster (K, t, the graph), how many colluders the threshold
tolerates (2t - n - 1, n the group size) and how few honest inputs a sum the server decodes can cover
(t - c with c colluders, exact on the complete graph and at c = 2t - n - 1; a bound otherwise).  The
symbolic server of :mod:`symbolic` enumerates every strategy on small rosters -- who takes part, which
survivor and uploader lists each honest node is shown, which colluders hand over their shares -- and
decodes whatever the revealed shares allow.  Both must agree: within the tolerance no sum covers fewer
honest inputs than the computation says (and on the complete graph, and with the tolerated number of
colluders, that few are reached); one colluder more and the server unmasks a single node's input.

The heavier rosters (a few seconds to a minute each) are marked slow; the fast cases cover the complete
graph at K = 3, 4, 5 and SecAgg+ rings of degree 2 and 4.
"""

from __future__ import annotations

import itertools

import pytest
from symbolic import INF, smallest_decodable

from mechanisms.secagg.graph import ring_neighbours
from mechanisms.secagg.threat import (
    colluders_tolerated,
    default_threshold,
    masking_threat,
    smallest_honest_sum,
)


def complete(K: int):
    return [frozenset(range(K)) - {u} for u in range(K)]


def ring(K: int, k: int):
    return ring_neighbours(list(range(K)), k)


def worst(graph, t: int, c: int) -> int:
    """The adversary's best (smallest decodable honest set) over every placement of c colluders (on a ring
    every placement up to rotation: colluder 0 first)."""
    K = len(graph)
    complete_graph = all(len(g) == K - 1 for g in graph)
    if c == 0:
        return smallest_decodable(graph, t, ())
    if complete_graph:  # every node alike: one placement
        return smallest_decodable(graph, t, tuple(range(K - c, K)))
    return min(
        smallest_decodable(graph, t, (0, *rest)) for rest in itertools.combinations(range(1, K), c - 1)
    )


CASES = [  # (name, graph, t, colluder counts to try)
    ("complete K=3, t=2", complete(3), 2, (0, 1)),
    ("complete K=3, t=3 (default)", complete(3), 3, (0, 1, 2)),
    ("complete K=4, t=3 (default)", complete(4), 3, (0, 1, 2)),
    ("complete K=5, t=3", complete(5), 3, (1,)),
    ("complete K=5, t=4 (default)", complete(5), 4, (0, 1, 2, 3)),
    ("ring K=5, k=2, t=2", ring(5, 2), 2, (0, 1)),
    ("ring K=6, k=2, t=2", ring(6, 2), 2, (0, 1)),
    ("ring K=6, k=4, t=3", ring(6, 4), 3, (1,)),
    ("ring K=6, k=4, t=4 (default)", ring(6, 4), 4, (1, 2, 3)),
]


@pytest.mark.parametrize("name, graph, t, counts", CASES, ids=[c[0] for c in CASES])
def test_the_computed_tolerance_and_smallest_sum_match_an_exhaustive_adversary(name, graph, t, counts):
    K = len(graph)
    n = len(graph[0]) + 1
    tol = colluders_tolerated(n, t)
    degree = None if n == K else n - 1
    model = masking_threat(K, t, degree)
    assert model.colluders_tolerated == tol and model.group_size == n
    for c in counts:
        got = worst(graph, t, c)
        want = smallest_honest_sum(n, t, c)
        if c > tol:  # one colluder beyond the tolerance: a single input is unmasked
            assert want == 1 and got == 1, (name, c, got)
        elif n == K or c == tol:  # exact: the complete graph, or the most colluders tolerated
            assert got == want == t - c, (name, c, got, want)
        else:  # a lower bound on a sparse graph
            assert INF > got >= want == t - c, (name, c, got, want)
    if tol in counts:
        assert worst(graph, t, tol) == model.smallest_sum_colluding


def test_the_default_threshold_tolerates_a_colluder_for_every_roster_the_tools_offer():
    """Every K from 2 and every even degree below K - 1: the default t tolerates at least one colluder and
    fits its group (t <= n); one more colluder than stated breaks it on the rosters searched above."""
    for K in range(2, 200):
        for k in [None, *range(2, K - 1, 2)]:
            n = K if k is None else k + 1
            t = default_threshold(n)
            assert 2 <= t <= n and colluders_tolerated(n, t) >= 1, (K, k, t)
            assert colluders_tolerated(n, t) == (1 if n % 2 == 0 else 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "graph, t, counts",
    [(ring(7, 4), 4, (2, 3)), (ring(7, 2), 2, (0, 1)), (ring(8, 2), 3, (1, 2, 3)), (ring(6, 4), 4, (0,))],
    ids=["ring K=7 k=4 t=4", "ring K=7 k=2 t=2", "ring K=8 k=2 t=3", "ring K=6 k=4 t=4, no colluder"],
)
def test_larger_rosters_match_too(graph, t, counts):
    n = len(graph[0]) + 1
    tol = colluders_tolerated(n, t)
    for c in counts:
        got = worst(graph, t, c)
        if c > tol:
            assert got == 1
        elif c == tol:
            assert got == t - c
        else:
            assert INF > got >= t - c
