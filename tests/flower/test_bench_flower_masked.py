"""The Flower-runtime masking benchmark: its measurement on a small simulation, and its record's claims.

The record (``experiments/bench_flower_masked.py --record``) runs plain and masked FedNCM
aggregations of the same statistics on Flower's simulation runtime at up to 1,000 nodes; these
tests check the numbers it states against each other and against the protocol's own bounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _record():
    from experiments import recorded

    try:
        return recorded.load("bench_flower_masked")
    except recorded.MissingRecord:
        pytest.skip("no record yet: python experiments/bench_flower_masked.py --record")


def _fixed_point_bound(nodes: int) -> float:
    """FedNCM's head from sums rounded to 2^-32 by each node: a row's direction moves by at most
    ~2 sqrt(D) N 2^-33 / ||s_c||; with ||s_c|| >= 1 on these data a loose 1e-6 covers every point."""
    return 1e-6


def test_recorded_masked_run_equals_the_plain_one_and_its_bytes_do_not_grow_with_the_nodes():
    rec = _record()["data"]
    cfg, points = rec["config"], rec["points"]
    assert max(p["nodes"] for p in points) >= 1000 and len(points) >= 3
    assert cfg["degree"] is not None and cfg["degree"] % 2 == 0  # the SecAgg+ graph, not the complete one
    for p in points:
        m, q = p["masked"], p["plain"]
        assert m["nodes"] == q["nodes"] == p["nodes"] and m["degree"] == cfg["degree"]
        assert 2 * m["threshold"] > cfg["degree"] + 1
        assert p["max_abs_head_diff"] <= _fixed_point_bound(p["nodes"])
        assert p["ratios"]["server_time"] == pytest.approx(m["server_s"] / q["server_s"], rel=1e-12)
        assert p["ratios"]["bytes_up"] == pytest.approx(
            m["bytes_up_per_node"] / q["bytes_up_per_node"], rel=1e-12
        )
        assert q["bytes_up_per_node"] >= p["upload_bytes"]  # the statistics themselves went up
    # O(k) per node: the masked bytes a node sends and receives are the same at every N (within 2 %:
    # ids and list lengths grow by digits)
    up = [p["masked"]["bytes_up_per_node"] for p in points]
    down = [p["masked"]["bytes_down_per_node"] for p in points]
    assert max(up) / min(up) < 1.02 and max(down) / min(down) < 1.02


def test_recorded_server_memory_is_flat_in_the_vectors():
    from experiments.bench_flower_masked import TARGET_SLOPE_SHARE, slope

    rec = _record()["data"]
    points = rec["points"]
    assert rec["target_slope_share"] == TARGET_SLOPE_SHARE
    for run in ("plain", "masked"):
        s = slope(points, run)
        assert rec["peak_slope_bytes_per_node"][run] == pytest.approx(s, rel=1e-9)
        # holding the uploads would grow the peak by one upload a node; the server grows by a small share
        assert s <= TARGET_SLOPE_SHARE * points[0]["upload_bytes"], (run, s)


def test_the_benchmark_measures_a_small_masked_simulation(tmp_path):
    """One point at 12 nodes on the complete graph: the masked head equals the plain one, rows complete."""
    from experiments.bench_flower_masked import point

    p = point(12, 16, None, 2)
    assert p["max_abs_head_diff"] <= 1e-6
    assert p["plain"]["server_peak_bytes"] > 0 and p["masked"]["server_peak_bytes"] > 0
    assert "sums:consistency" in p["masked"]["stages"] and p["masked"]["threshold"] >= 7
    assert np.isfinite(p["ratios"]["server_time"]) and p["ratios"]["bytes_up"] > 1.0
