"""A symbolic deviating server for small rosters: it tries every split of survivor views the node checks allow.

The computed threat model (:mod:`mechanisms.secagg.threat`) says how many colluders a threshold tolerates and
how few honest inputs a sum the server decodes can cover.  This module checks those numbers by brute force,
independently of the code it checks: the node's rules are written out again here, on sets, and every
strategy a lying server has on a small roster is enumerated.

The model (the active version, :mod:`mechanisms.secagg.masking.node`; groups G_v = v and its neighbours):

* the server picks the nodes that take part (P: colluders always do) and, for each honest v in P, the
  survivor list A_v it shows at the masked stage and the uploader list B_v at the consistency stage, any
  sets with v in B_v, B_v within A_v within G_v and P, and at least t members each (the node's own
  checks).  Every honest node in P uploads y_v = x_v + PRG(b_v) + the pair masks with A_v, and signs
  (A_v, B_v) and its echo (A_v).
* an honest v reveals its shares -- of b_w for w in B_v, of the mask key s_w for w in A_v outside B_v --
  only if every honest uploader w of B_v echoed a survivor list that agrees with A_v on G_v and G_w, and at
  least t members of B_v signed views that agree with v's there (honest ones sign their own view;
  colluders sign whatever is asked of them);
* colluders hand over both shares of every node of their group;
* the server rebuilds a secret from t shares, and decodes an integer combination of the honest uploads
  in which every pair mask and self mask it does not know cancels: a self mask it does not know forces
  that upload's coefficient to 0, a pair mask in both uploads ties their coefficients, a pair mask in one
  upload only forces that one to 0.  The decodable sums are the sums over the free parts this leaves.

:func:`smallest_decodable` returns the fewest honest inputs a decodable sum covers, over every strategy
(1: one node's input is unmasked).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

INF = 10**9


def _bits(x: int) -> Iterator[int]:
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


def _submasks(x: int) -> Iterator[int]:
    sub = x
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & x


def groups_of(graph: Sequence[Iterable[int]]) -> list[int]:
    """Each node's group (itself and its neighbours) as a bit mask."""
    return [sum(1 << int(w) for w in nbrs) | (1 << v) for v, nbrs in enumerate(graph)]


def _views(v: int, P: int, group: int, t: int) -> list[tuple[int, int]]:
    me = 1 << v
    others = group & P & ~me
    out = []
    for a in _submasks(others):
        A = a | me
        if A.bit_count() < t:
            continue
        for b in _submasks(a):
            B = b | me
            if B.bit_count() >= t:
                out.append((A, B))
    # wide survivor lists first: the splits that unmask need them, so a search for a break ends sooner
    out.sort(key=lambda ab: (-ab[0].bit_count(), ab[1].bit_count()))
    return out


def _decodable(K: int, t: int, groups: list[int], colluders: int, P: int, A: dict, B: dict) -> int:
    honest = [v for v in range(K) if (P >> v) & 1 and not (colluders >> v) & 1]
    bcnt = {w: (groups[w] & P & colluders).bit_count() for w in honest}
    scnt = dict(bcnt)
    for v in honest:
        Av, Bv = A[v], B[v]
        signers = (Bv & colluders).bit_count()
        ok = True
        for w in _bits(Bv & ~colluders):
            both = groups[v] & groups[w]
            if (A[w] & both) != (Av & both):  # its echo: another survivor list where the groups meet
                ok = False
                break
            if (B[w] & both) == (Bv & both):
                signers += 1
        if not ok or signers < t:
            continue
        for w in _bits(Av & ~colluders):
            if (Bv >> w) & 1:
                bcnt[w] += 1
            else:
                scnt[w] += 1
    s_known = {w: scnt[w] >= t for w in honest}
    parent = {w: w for w in honest}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    forced = {w for w in honest if bcnt[w] < t}
    hset = set(honest)
    for w in honest:
        for u in _bits(groups[w] & ~(1 << w)):
            if u <= w or u not in hset or s_known[w] or s_known[u]:
                continue
            in_w, in_u = (A[w] >> u) & 1, (A[u] >> w) & 1
            if in_w and in_u:
                parent[find(w)] = find(u)
            elif in_w:
                forced.add(w)
            elif in_u:
                forced.add(u)
    parts: dict[int, list[int]] = {}
    for w in honest:
        parts.setdefault(find(w), []).append(w)
    free = [len(p) for p in parts.values() if not forced & set(p)]
    return min(free, default=INF)


def smallest_decodable(graph, t: int, colluders: Sequence[int], *, stop_at: int = 1) -> int:
    """The fewest honest inputs any sum the server can decode covers, over every strategy (INF: none).

    ``graph[v]`` are v's neighbours; ``colluders`` the colluding nodes.  The search stops early once a
    sum of ``stop_at`` inputs is found.
    """
    K = len(graph)
    groups = groups_of(graph)
    cmask = sum(1 << c for c in colluders)
    honest = [v for v in range(K) if not (cmask >> v) & 1]
    best = INF
    for r in range(len(honest), 0, -1):
        for part in itertools.combinations(honest, r):
            P = cmask | sum(1 << v for v in part)
            lists = [_views(v, P, groups[v], t) for v in part]
            if any(not views for views in lists):
                continue
            for choice in itertools.product(*lists):
                A = {v: ab[0] for v, ab in zip(part, choice)}
                B = {v: ab[1] for v, ab in zip(part, choice)}
                best = min(best, _decodable(K, t, groups, cmask, P, A, B))
                if best <= stop_at:
                    return best
    return best


def strategies(graph, t: int, colluders: Sequence[int]) -> int:
    """How many strategies :func:`smallest_decodable` tries at most (the size of the search)."""
    K = len(graph)
    groups = groups_of(graph)
    cmask = sum(1 << c for c in colluders)
    honest = [v for v in range(K) if not (cmask >> v) & 1]
    total = 0
    for r in range(len(honest), 0, -1):
        for part in itertools.combinations(honest, r):
            P = cmask | sum(1 << v for v in part)
            n = 1
            for v in part:
                n *= len(_views(v, P, groups[v], t))
            total += n
    return total
