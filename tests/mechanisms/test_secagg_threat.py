"""The threat-model computation (mechanisms.secagg.threat): its formulas against hand values and independent
computations, the parts of a split graph, and the sentences quoting exactly those numbers.  That the numbers
are what a lying server achieves is tests/adversarial/test_threat_model.py's job."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mechanisms.secagg.graph import ring_neighbours
from mechanisms.secagg.threat import (
    DEFAULT_COLLUDERS,
    ckks_threat,
    colluders_tolerated,
    default_threshold,
    defaults_table,
    masking_threat,
    min_threshold,
    smallest_honest_sum,
    survivor_parts,
    threshold_rule,
)


def test_thresholds_and_tolerance_by_hand():
    # 2t > n + c, t >= 2
    assert [min_threshold(n) for n in (2, 3, 4, 5, 12, 21)] == [2, 2, 3, 3, 7, 11]
    assert [default_threshold(n) for n in (2, 3, 4, 5, 12, 21)] == [2, 3, 3, 4, 7, 12]
    assert DEFAULT_COLLUDERS == 1
    # the issue's rosters: K = 5, t = 3 and groups of 5 (k = 4), t = 3 tolerate no colluder; t = 4 two
    assert (
        colluders_tolerated(5, 3) == 0 and colluders_tolerated(5, 4) == 2 and colluders_tolerated(12, 7) == 1
    )
    # honest-but-curious: t - 1
    assert colluders_tolerated(5, 3, active=False) == 2
    # the tolerance is the largest c with 2t > n + c, for every n and t a roster allows
    for n in range(2, 40):
        for t in range(min_threshold(n), n + 1):
            c = colluders_tolerated(n, t)
            assert 2 * t > n + c and not (c + 1 < t and 2 * t > n + c + 1) and 0 <= c < t


def test_smallest_honest_sum():
    assert smallest_honest_sum(5, 4, 0) == 4 and smallest_honest_sum(5, 4, 2) == 2
    assert smallest_honest_sum(5, 4, 3) == 1  # beyond the tolerance: one input
    assert smallest_honest_sum(5, 3, 1) == 1 and smallest_honest_sum(5, 3, 0) == 3


def _parts_by_union_find(graph, uploaded):
    parent = {u: u for u in uploaded}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for u, v in itertools.combinations(sorted(uploaded), 2):
        if v in graph[u]:
            parent[find(u)] = find(v)
    groups = {}
    for u in uploaded:
        groups.setdefault(find(u), []).append(u)
    return sorted(len(g) for g in groups.values())


def test_survivor_parts_of_the_issues_split_and_random_ones():
    """K = 12, k = 4 on the identity ring, four nodes dropped (positions 3, 4 and 8, 9): parts of 3 and 5."""
    graph = ring_neighbours(list(range(12)), 4)
    up = [u for u in range(12) if u not in (3, 4, 8, 9)]
    assert survivor_parts(graph, up) == [(5, 6, 7), (0, 1, 2, 10, 11)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        K = int(rng.integers(3, 30))
        k = int(rng.choice([2, 4, 6]))
        g = ring_neighbours(list(rng.permutation(K)), k)
        up = [u for u in range(K) if rng.random() < 0.6]
        assert [len(p) for p in survivor_parts(g, up)] == _parts_by_union_find(g, up)
    assert survivor_parts(graph, []) == []


def test_the_masking_model_states_its_numbers():
    graph = ring_neighbours(list(range(12)), 4)
    up = [u for u in range(12) if u not in (3, 4, 8, 9)]
    eps = {3: 2.155, 4: 1.9, 1: 9.0, 8: 1.25}
    m = masking_threat(12, 3, 4, graph=graph, uploaded=up, epsilon_of=eps.__getitem__, refusal_bits=18)
    assert (m.group_size, m.colluders_tolerated, m.smallest_sum_alone, m.smallest_sum_colluding) == (
        5,
        0,
        3,
        3,
    )
    assert m.parts == (3, 5) and m.smallest_part == 3 and m.uploaded == 8
    assert m.epsilon == {"this_run": 2.155, "server_alone": 2.155, "with_colluders": 2.155}
    text = m.text()
    for piece in (
        "K=12, t=3, SecAgg+ degree k=4: groups of 5",
        "Colluders tolerated: 0",
        "parts of 3, 5 nodes",
        "epsilon 2.155, 3 noise share(s)",
        "at most 18 bit(s)",
        "with 1, a node's input may be unmasked",
    ):
        assert piece in text, piece
    d = m.as_dict()
    assert d["text"] == text and d["parts"] == [3, 5] and d["smallest_part"] == 3
    default = masking_threat(12, 4, 4)  # the default threshold of groups of 5
    assert (default.colluders_tolerated, default.smallest_sum_alone, default.smallest_sum_colluding) == (
        2,
        4,
        2,
    )
    assert default.parts is None and "This run" not in default.text()


def test_the_complete_graph_and_ckks_models():
    m = masking_threat(5, 4, uploaded=range(5), epsilon_of=lambda s: 1.0 / math.sqrt(s))
    assert m.parts == (5,) and m.degree is None and m.group_size == 5
    assert m.epsilon["server_alone"] == pytest.approx(0.5) and m.shares["with_colluders"] == 2
    assert "complete graph" in m.text() and "in one part" in m.text()
    hbc = masking_threat(5, 4, active=False)
    assert hbc.colluders_tolerated == 3 and "honest-but-curious" in hbc.text()
    ck = ckks_threat(6, 4, uploaded=range(6))
    assert ck.colluders_tolerated == 0 and ck.smallest_sum_alone == 4 and ck.parts == (6,)
    assert "Colluders tolerated: 0" in ck.text()


def test_the_text_states_per_class_coverage_the_dealer_and_ledger_rollback():
    """Computed from t: a class held by fewer than t nodes is covered by fewer than t inputs; under DP the
    noise covers every class's coordinates; the active version names what it trusts (the roster's dealer,
    the node's ledger file), the honest-but-curious one (no roster, no ledger file) does not."""
    plain, noisy = masking_threat(7, 5), masking_threat(7, 5, uploaded=range(7), epsilon_of=lambda m: 1.0)
    for m in (plain, noisy, ckks_threat(6, 4)):
        t = m.smallest_sum_alone
        assert f"a class held by fewer than {t} nodes is covered by fewer than {t} inputs" in m.text()
        assert "only DP protects a class few nodes hold" in m.text()
        assert "trusted dealer" in m.text() and "rolls back the sums it answered for" in m.text()
    assert "noise share to every class's coordinates" in noisy.text()
    assert "noise share to every class's coordinates" not in plain.text()
    hbc = masking_threat(5, 4, active=False).text()
    assert "trusted dealer" not in hbc and "fewer than 4 nodes" in hbc


def test_the_defaults_table_and_the_rule_text():
    rows = defaults_table([5, 12, 100], [None, 4, 20])
    assert {(r["K"], r["degree"]): (r["threshold"], r["tolerated"]) for r in rows} == {
        (5, None): (4, 2),
        (12, None): (7, 1),
        (12, 4): (4, 2),
        (100, None): (51, 1),
        (100, 4): (4, 2),
        (100, 20): (12, 2),
    }
    assert all(r["tolerated"] >= 1 and r["colluding"] == r["threshold"] - r["tolerated"] for r in rows)
    assert "tolerates 1 colluding node" in threshold_rule()
    # the commands' --help quotes the rule (written out there, so that --help imports nothing heavy)
    from privfed.commands.options import THRESHOLD_RULE

    assert THRESHOLD_RULE == threshold_rule()


def test_threat_models_of_thresholds_no_run_takes_are_refused_not_stated():
    """masking_threat(10, 2) stated "smallest sum 2 with no node colluding" where 2t <= n lets a deviating server
    alone unmask a node; thresholds above the group, CKKS sum thresholds outside [1, K] and uploaders outside
    the federation (an IndexError) were taken too."""
    from mechanisms.secagg.threat import ckks_threat, masking_threat, min_threshold, smallest_honest_sum
    from privfed.errors import ConfigError

    for n, t in ((10, 2), (10, 5), (4, 10)):
        with pytest.raises(ConfigError, match=rf"threshold={t} is outside \[{min_threshold(n)}, {n}\]"):
            masking_threat(n, t)
    assert smallest_honest_sum(10, 5, 0) == 1 and smallest_honest_sum(10, 6, 0) == 6  # 2t <= n: one node
    assert masking_threat(10, 6).smallest_sum_alone == 6
    for t in (0, 4):
        with pytest.raises(ConfigError, match=rf"sum_threshold={t} is outside \[1, 3\]"):
            ckks_threat(3, t)
    with pytest.raises(ConfigError, match=r"outside 0\.\.2: \[7\]"):
        masking_threat(3, 2, uploaded=[0, 1, 7])
