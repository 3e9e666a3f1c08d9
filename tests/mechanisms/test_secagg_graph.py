"""The SecAgg+ graph in the operator's roster: drawn with it, fingerprinted with it, refused when it cannot hold."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from mechanisms.secagg.crypto import KeySource, signed_bytes
from mechanisms.secagg.graph import draw_ring, ring_neighbours
from mechanisms.secagg.identity import Roster, main, make_roster
from privfed.errors import ConfigError


def _neighbours_on_ring(ring, k, u):
    """Node u's neighbours by walking the ring by hand: the k/2 positions on either side."""
    K, p = len(ring), ring.index(u)
    return {ring[(p + j) % K] for j in range(1, k // 2 + 1)} | {
        ring[(p - j) % K] for j in range(1, k // 2 + 1)
    }


def test_a_sparse_roster_carries_a_k_regular_graph_that_every_node_derives_alike():
    roster, _ = make_roster(12, degree=4, seed=1)
    assert roster.degree == 4 and sorted(roster.ring) == list(range(12))
    # the default declares one colluder: 2t > k + 1 + 1, t = 4, which tolerates 2t - (k + 1) - 1 = 2
    assert roster.threshold == 4 and roster.group_size == 5 and roster.tolerated == 2
    for u in range(12):
        assert roster.graph[u] == _neighbours_on_ring(list(roster.ring), 4, u)
        assert all(u in roster.graph[v] for v in roster.graph[u]) and u not in roster.graph[u]
    again = Roster.from_json(roster.to_json())
    assert again == roster and again.graph == roster.graph and again.fingerprint == roster.fingerprint


def test_the_fingerprint_covers_the_graph_and_old_rosters_keep_theirs():
    sparse, _ = make_roster(10, degree=4, seed=2)
    complete = Roster(sparse.public_keys, 6)
    # A roster without a graph keeps the fingerprint it had before graphs existed: the complete graph.
    old = hashlib.sha256(signed_bytes("roster", 6, 0, *sparse.public_keys)).digest()
    assert complete.fingerprint == old and complete.degree is None
    assert complete.graph[3] == frozenset(range(10)) - {3}
    raw = json.loads(complete.to_json())
    assert "degree" not in raw and "ring" not in raw and Roster.from_json(json.dumps(raw)) == complete
    other_ring = Roster(
        sparse.public_keys, 3, 0, 4, sparse.ring[1:] + sparse.ring[:1]
    )  # a rotation: same graph
    shuffled = Roster(sparse.public_keys, 3, 0, 4, tuple(reversed(sparse.ring[:2])) + sparse.ring[2:])
    prints = {sparse.fingerprint, complete.fingerprint, shuffled.fingerprint, other_ring.fingerprint}
    assert len(prints) == 4
    assert Roster(sparse.public_keys, 4, 0, 6, sparse.ring).fingerprint != sparse.fingerprint


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"degree": 3}, "even integer"),
        ({"degree": 0}, "even integer"),
        ({"degree": 10}, "below the number of nodes"),
        ({"degree": 4, "threshold": 2}, r"2t > k \+ 1 \+ n_C"),  # 2 * 2 = 4, not > 5
        ({"degree": 4, "threshold": 6}, r"t <= k \+ 1"),
        ({"degree": 4, "colluders": 2, "threshold": 3}, r"\[4, 5\]"),  # 2t > 4 + 1 + 2: t >= 4
        ({"degree": 2, "colluders": 3}, "raise the degree"),  # 2t > 2 + 1 + 3 = 6: t = 4 > k + 1 = 3
    ],
)
def test_bad_graphs_and_thresholds_are_refused_with_the_fix(kw, match):
    with pytest.raises(ConfigError, match=match):
        make_roster(10, **kw)


def test_a_ring_that_is_not_an_order_of_the_nodes_or_a_lone_degree_is_refused():
    roster, _ = make_roster(8, degree=2, seed=3)
    keys = roster.public_keys
    with pytest.raises(ConfigError, match="both its degree and its ring"):
        Roster(keys, 2, 0, 2, None)
    with pytest.raises(ConfigError, match="both its degree and its ring"):
        Roster(keys, 2, 0, None, roster.ring)
    for ring in ((0, 0, 1, 2, 3, 4, 5, 6), (0, 1, 2), tuple(range(1, 9))):
        with pytest.raises(ConfigError, match="order the nodes 0..7"):
            Roster(keys, 2, 0, 2, ring)
    raw = json.loads(roster.to_json())
    raw["degree"] = "4"
    with pytest.raises(ConfigError, match="not a privfed roster"):
        Roster.from_json(json.dumps(raw))


@pytest.mark.parametrize(
    "field, value",
    [("threshold", 2.9), ("threshold", True), ("colluders", 0.5), ("ring", "bools"), ("ring", "floats")],
)
def test_a_roster_file_with_non_integer_numbers_is_refused_not_truncated(field, value):
    """int() would read threshold 2.9 as 2, and ring entries true/false as 1/0; the file is refused instead."""
    roster, _ = make_roster(8, degree=2, seed=3)
    raw = json.loads(roster.to_json())
    if value == "bools":
        raw["ring"] = [bool(v) if v in (0, 1) else v for v in raw["ring"]]
    elif value == "floats":
        raw["ring"] = [float(v) for v in raw["ring"]]
    else:
        raw[field] = value
    with pytest.raises(ConfigError, match="not a privfed roster.*integer"):
        Roster.from_json(json.dumps(raw))
    assert Roster.from_json(roster.to_json()) == roster


def test_the_ring_is_a_uniform_order():
    """All 3! = 6 orders of 3 nodes, 6000 draws from a seeded key source: each count is Binomial(6000, 1/6),
    mean 1000 and standard deviation sqrt(6000 * 5/36) = 28.9; 5 standard deviations is 144."""
    keys = KeySource(7)
    counts = Counter(tuple(draw_ring(3, keys)) for _ in range(6000))
    assert len(counts) == 6 and all(abs(c - 1000) < 144 for c in counts.values())


def test_ring_neighbours_of_a_degree_of_K_minus_1_is_the_complete_graph():
    assert ring_neighbours([2, 0, 1, 4, 3], 4) == [frozenset(range(5)) - {u} for u in range(5)]


def test_operator_command_draws_the_graph_into_the_roster(tmp_path, capsys):
    assert main([str(tmp_path), "--nodes", "9", "--degree", "4"]) == 0
    roster = Roster.load(tmp_path / "roster.json")
    assert roster.degree == 4 and roster.threshold == 4 and len(roster.graph[0]) == 4
    assert "graph=4-regular" in capsys.readouterr().out
    assert main([str(tmp_path / "x"), "--nodes", "9", "--degree", "5"]) == 2
    assert "even integer" in capsys.readouterr().err
