"""The Flower-runtime masking benchmark: its measurement on a small simulation, and its record's claims.

The record (``experiments/bench_flower_masked.py --record``) runs plain, masked and Flower SecAgg+ aggregations
of the same statistics on Flower's simulation runtime at 1,000 nodes, each round beside the floor's
cryptography timed in the same process; these tests check the numbers it states against each other, against
the counts the message layer finds at the state machines' call sites, and against the protocol's bounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.crypto_floor import OPS  # noqa: E402


def _record():
    from experiments import recorded

    try:
        return recorded.load("bench_flower_masked")
    except recorded.MissingRecord:
        pytest.skip("no record yet: python experiments/bench_flower_masked.py --record")


def test_the_floor_counts_are_the_message_layers():
    """The counts the Flower-runtime floor takes from the argument are those the message-layer benchmark finds
    at the state machines' call sites (the same code, with every node uploading)."""
    from experiments.bench_active_scale import one_run
    from experiments.bench_flower_masked import floor_counts

    K, k, D = 12, 4, 40
    run = one_run(K, D, k, repeats=1, seed=1)
    want = floor_counts(K, k, D)
    got = run["repeats"][0]["counts"]
    assert {op: got[op] for op in OPS} == want


def test_recorded_rounds_state_their_ratios_and_reproduce():
    rec = _record()["data"]
    cfg, timed = rec["config"], rec["timed"]
    assert cfg["timing_nodes"] >= 1000 and cfg["degree"] == 20 and len(timed) >= 2
    from experiments.bench_flower_masked import floor_counts

    medians = []
    for t in timed:
        assert t["nodes"] == cfg["timing_nodes"] and len(t["rounds"]) == cfg["repeats"]
        values = cfg["classes"] * (cfg["dim"] + 1)
        assert t["counts"] == floor_counts(t["nodes"], cfg["degree"], values)
        for r in t["rounds"]:
            m, p, f = r["masked"], r["plain"], r["flwr"]
            floor = p["cpu_s"] + sum(t["counts"][o] * t["unit_s"][o] for o in OPS)
            assert r["floor_cpu_s"] == pytest.approx(floor, rel=1e-9)
            assert r["ratio"] == pytest.approx(m["cpu_s"] / floor, rel=1e-9)
            trips = floor + r["extra_round_trips"] * r["round_trip_cpu_s"]
            assert r["ratio_with_round_trips"] == pytest.approx(m["cpu_s"] / trips, rel=1e-9)
            assert r["masked_to_flwr"] == pytest.approx(m["cpu_s"] / f["cpu_s"], rel=1e-9)
            assert r["round_trip_cpu_s"] == pytest.approx(m["stage_cpu_s"]["consistency"], rel=1e-9)
            assert r["extra_round_trips"] == len(m["stage_cpu_s"]) - len(p["stage_cpu_s"]) == 4
            assert "sums:consistency" in m["stages"] and m["degree"] == cfg["degree"]
            assert 2 * m["threshold"] > cfg["degree"] + 1 and f["threshold"] == m["threshold"]
            assert r["max_abs_head_diff"] <= 1e-6  # fixed point, 2^-32 a node
            assert len(r["load_average"]) == 3 and sorted(r["order"]) == ["flwr", "masked", "plain"]
        medians.append(t["ratio"]["median"])
    assert rec["agreement"] == pytest.approx(max(medians) / min(medians) - 1, rel=1e-9)
    assert rec["agreement"] <= 0.10


def test_recorded_bytes_per_node_do_not_grow_with_the_nodes():
    """O(k) per node on the SecAgg+ graph: a node sends and receives the same bytes at every N (within 2 %: ids
    grow by digits)."""
    rec = _record()["data"]
    points = rec["memory"] + [r for t in rec["timed"] for r in t["rounds"]]
    assert len({p["plain"]["nodes"] for p in points}) >= 3
    for run in ("plain", "masked"):
        for key in ("bytes_up_per_node", "bytes_down_per_node"):
            values = [p[run][key] for p in points]
            assert max(values) / min(values) < 1.02, (run, key, values)


def test_recorded_process_peak_slopes_are_the_points_slopes():
    from experiments.bench_flower_masked import slope

    rec = _record()["data"]
    points = rec["memory"]
    assert all(p["traced"] for p in points) and max(p["nodes"] for p in points) >= 1000
    for run in ("plain", "masked"):
        assert rec["process_peak_slope_bytes_per_node"][run] == pytest.approx(
            slope(points, run, "process_peak_bytes"), rel=1e-9
        )
    # what each virtual node keeps in the simulating process: at least its cached statistics
    assert all(p["node_context_bytes"] >= p["upload_bytes"] for p in points)


def test_the_benchmark_measures_a_small_simulation_beside_flowers_secaggplus():
    """One timed point at 12 nodes on a degree-4 roster graph: the masked head equals the plain one, Flower's
    SecAgg+ ran with 5 shares a node, and every stage's CPU is there."""
    from experiments.bench_flower_masked import timed_point

    p = timed_point(12, 16, 4, 2, repeats=1)
    (r,) = p["rounds"]
    assert r["max_abs_head_diff"] <= 1e-6 and np.isfinite(r["ratio"]) and r["ratio"] > 0
    # the key advertisements travel with the setup: five round trips, no keys exchange of their own
    assert set(r["masked"]["stage_cpu_s"]) == {"setup", "shares", "masked", "consistency", "unmask"}
    assert r["flwr"]["threshold"] == r["masked"]["threshold"] == 4
    assert r["masked"]["bytes_up_per_node"] > r["plain"]["bytes_up_per_node"]


def test_docs_quote_the_record():
    _record()
    from experiments.docs_numbers.render_active import flower_masked_scale

    text = (Path(__file__).resolve().parents[2] / "docs" / "scale.md").read_text()
    assert flower_masked_scale().strip() in text
