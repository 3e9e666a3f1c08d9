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


def test_recorded_masked_run_at_1000_nodes_equals_the_plain_one():
    rec = _record()["data"]
    cfg, p = rec["config"], rec["timed"]
    assert p["nodes"] == cfg["timing_nodes"] >= 1000 and not p["traced"]
    assert cfg["degree"] is not None and cfg["degree"] % 2 == 0  # the SecAgg+ graph, not the complete one
    m, q = p["masked"], p["plain"]
    assert (
        m["degree"] == cfg["degree"]
        and 2 * m["threshold"] > cfg["degree"] + 1
        and m["threshold"] <= cfg["degree"] + 1
    )
    assert "sums:consistency" in m["stages"]  # the active version
    # FedNCM's head from sums each node rounded to 2^-32: rows move by far less than 1e-6
    assert p["max_abs_head_diff"] <= 1e-6
    assert p["ratios"]["server_time"] == pytest.approx(m["server_s"] / q["server_s"], rel=1e-12)
    assert p["ratios"]["bytes_up"] == pytest.approx(
        m["bytes_up_per_node"] / q["bytes_up_per_node"], rel=1e-12
    )
    assert q["bytes_up_per_node"] >= p["upload_bytes"]  # the statistics themselves went up


def test_recorded_bytes_per_node_do_not_grow_with_the_nodes():
    """O(k) per node on the SecAgg+ graph: a node sends and receives the same bytes at every N (within 2 %: ids
    grow by digits), where the complete graph's grow with N."""
    rec = _record()["data"]
    points = rec["memory"] + [rec["timed"]]
    assert len({p["nodes"] for p in points}) >= 3
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


def test_the_benchmark_measures_a_small_masked_simulation_on_the_graph():
    """One traced point at 12 nodes on a degree-4 roster graph: the masked head equals the plain one."""
    from experiments.bench_flower_masked import point

    p = point(12, 16, 4, 2, traced=True)
    assert p["max_abs_head_diff"] <= 1e-6
    assert p["plain"]["process_peak_bytes"] > 0 and p["masked"]["process_peak_bytes"] > 0
    assert "sums:consistency" in p["masked"]["stages"] and p["masked"]["degree"] == 4
    assert 2 * p["masked"]["threshold"] > 5 and p["node_context_bytes"] >= p["upload_bytes"]
    assert np.isfinite(p["ratios"]["server_time"]) and p["ratios"]["bytes_up"] > 1.0
