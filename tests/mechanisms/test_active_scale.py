"""The active masking protocol against its cryptographic floor over Flower messages: the benchmark's counting and
arithmetic on a small federation, and the recorded run's claims (1,000 nodes, two independent runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.crypto_floor import (  # noqa: E402
    OPS,
    WORK_OPS,
    counting,
    floor_seconds,
    unit_seconds,
    work_seconds,
    work_unit_seconds,
)
from mechanisms.secagg.masking import harary_split_bound  # noqa: E402


def _argument(k: int) -> dict[str, float]:
    """What the argument needs per node with every node uploading: 3 signatures, 2k verifies, 2k agreements,
    2 key loads, k + 1 masks and the server's one."""
    return {"sign": 3, "verify": 2 * k, "x25519": 2 * k, "x25519_load": 2, "prg": k + 2}


def _work(k: int, D: int) -> dict[str, float]:
    """The rest of the work per node with every node uploading: k share messages sealed and k opened, a key
    derived from each of 2k agreements, the self-mask key at the node and again at the server, one Shamir
    sharing, one recovery at the server (its self-mask seed), k + 2 masks of D values added, D values
    encoded."""
    return {
        "aead": 2 * k,
        "kdf": 2 * k + 2,
        "shamir_split": 1,
        "shamir_recover": 1,
        "ring_values": (k + 2) * D,
        "encode_values": D,
    }


def test_counting_sees_the_protocols_call_sites_and_restores_them():
    from mechanisms.secagg import fixed_point, shamir
    from mechanisms.secagg.identity import Identity, Roster, make_roster
    from mechanisms.secagg.masking import node as node_mod
    from mechanisms.secagg.masking import server as server_mod
    from mechanisms.secagg.masking.node import MaskingNode
    from mechanisms.secagg.masking.server import MaskingServer, run_in_process

    def sites():
        return (
            Identity.sign,
            Roster.verify,
            *(getattr(m, n) for m in (node_mod, server_mod) for n in ("private_key", "add_masks", "hkdf")),
            node_mod.AESGCM,
            node_mod.shamir,
            server_mod.shamir,
            shamir.split_many,
            shamir.combine,
            fixed_point.encode,
        )

    before = sites()
    K, k = 12, 4
    roster, ids = make_roster(K, degree=k)
    X = np.random.default_rng(0).normal(size=(K, 5))
    with counting() as counts:
        nodes = {
            u: MaskingNode(u, num_nodes=K, threshold=roster.threshold, identity=ids[u], roster=roster)
            for u in range(K)
        }
        server = MaskingServer(
            num_nodes=K, threshold=roster.threshold, length=5, session=b"s" * 16, active=True, degree=k
        )
        total = run_in_process(server, nodes, inputs=lambda u: fixed_point.encode(X[u], 20))
    assert np.abs(fixed_point.decode(total, 20) - X.sum(0)).max() <= K * 2.0**-21
    assert sites() == before
    with pytest.raises(RuntimeError, match="inside"), counting():
        assert sites() != before
        raise RuntimeError("inside")
    assert sites() == before
    want = {**_argument(k), **_work(k, 5)}
    for op in ("sign", "verify", "x25519", "x25519_load", "prg", *WORK_OPS):
        assert counts[op] == want[op] * K, (op, counts[op])


def test_the_floor_is_the_plain_run_plus_count_times_unit():
    units = unit_seconds(repeats=50, values=64)
    assert set(units) == set(OPS) and all(v > 0 for v in units.values())
    counts = {"sign": 3, "verify": 8, "x25519": 8, "x25519_load": 2, "prg_values": 6 * 64}
    floor, terms = floor_seconds(0.5, counts, units)
    assert floor == pytest.approx(0.5 + sum(counts[o] * units[o] for o in OPS), rel=1e-12)
    assert terms["verify"] == pytest.approx(8 * units["verify"], rel=1e-12)
    more = work_unit_seconds(repeats=50, values=64, threshold=3, group=5)
    assert set(more) == set(WORK_OPS) and all(v > 0 for v in more.values())
    counts.update(_work(4, 64))
    work, extra = work_seconds(floor, counts, more)
    assert work == pytest.approx(floor + sum(counts[o] * more[o] for o in WORK_OPS), rel=1e-12)
    assert extra["aead"] == pytest.approx(8 * more["aead"], rel=1e-12) and work > floor


def test_the_benchmark_runs_a_small_federation_with_the_arguments_counts():
    from experiments.bench_active_scale import one_run

    K, k, D = 16, 4, 64
    run = one_run(K, D, k, repeats=2, seed=3)
    assert run["per_node"] == pytest.approx({**_argument(k), "prg_values": (k + 2) * D, **_work(k, D)})
    for r in run["repeats"]:
        assert r["max_abs_error"]["masked"] <= K * 2.0**-33 and r["max_abs_error"]["plain"] < 1e-9
        assert r["ratio"] == pytest.approx(r["masked_cpu_s"] / r["floor_cpu_s"], rel=1e-12)
        assert r["floor_cpu_s"] == pytest.approx(
            r["plain_cpu_s"] + sum(r["floor_terms_s"].values()), rel=1e-12
        )
        assert r["protocol_work_cpu_s"] == pytest.approx(
            r["floor_cpu_s"] + sum(r["protocol_work_terms_s"].values()), rel=1e-12
        )
        assert r["ratio_to_protocol_work"] == pytest.approx(
            r["masked_cpu_s"] / r["protocol_work_cpu_s"], rel=1e-12
        )
        assert r["round_trips"] == 5 and r["uploaded"] == K
    assert [r["order"][0] for r in run["repeats"]] == ["plain", "masked"]  # the order alternates


# ----------------------------------------------------------------------------------- the record
def _record():
    from experiments import recorded

    try:
        return recorded.load("bench_active_scale")
    except recorded.MissingRecord:
        pytest.skip("no record yet: python experiments/bench_active_scale.py --record")


def test_recorded_runs_are_their_parts_and_reproduce():
    from experiments.bench_active_scale import HEAP_MMAP_BYTES, HEAP_TRIM_BYTES, REPRODUCE, TARGET_RATIO

    data = _record()["data"]
    cfg, runs = data["config"], data["runs"]
    assert cfg["nodes"] >= 1000 and cfg["values"] >= 51_200 and cfg["degree"] == 20
    # the record says how the processes' heaps were set (the docs state it where it was set)
    assert cfg["heap"] == {"steady": True, "trim_bytes": HEAP_TRIM_BYTES, "mmap_bytes": HEAP_MMAP_BYTES}
    assert cfg["target_ratio"] == TARGET_RATIO and cfg["reproduce"] == REPRODUCE
    assert len(runs) >= 2 and all(len(r["repeats"]) >= 3 for r in runs)
    medians = []
    for run in runs:
        ratios = sorted(r["ratio"] for r in run["repeats"])
        assert run["ratio"]["median"] == pytest.approx(float(np.median(ratios)), rel=1e-12)
        assert run["ratio"]["min"] == ratios[0] and run["ratio"]["max"] == ratios[-1]
        medians.append(run["ratio"]["median"])
        for r in run["repeats"]:
            assert "load_average" in r and r["max_abs_error"]["masked"] <= cfg["nodes"] * 2.0**-33
            floor = r["plain_cpu_s"] + sum(r["counts"][o] * r["unit_s"][o] for o in OPS)
            assert r["floor_cpu_s"] == pytest.approx(floor, rel=1e-9)
            assert r["ratio"] == pytest.approx(r["masked_cpu_s"] / floor, rel=1e-9)
            work = floor + sum(r["counts"][o] * r["unit_s"][o] for o in WORK_OPS)
            assert r["protocol_work_cpu_s"] == pytest.approx(work, rel=1e-9)
            assert r["ratio_to_protocol_work"] == pytest.approx(r["masked_cpu_s"] / work, rel=1e-9)
        k, D = cfg["degree"], cfg["values"]
        assert run["per_node"] == pytest.approx({**_argument(k), "prg_values": (k + 2) * D, **_work(k, D)})
        assert 2 * run["threshold"] > k + 1
    assert data["agreement"] == pytest.approx(max(medians) / min(medians) - 1, rel=1e-9)
    assert data["agreement"] <= REPRODUCE


def test_recorded_server_memory_per_node_is_small_and_the_same_at_either_vector_length():
    data = _record()["data"]
    cfg, slope = data["config"], data["peak_slope_bytes_per_node"]["masked"]
    lengths = sorted(int(v) for v in slope)
    assert len(lengths) >= 2 and max(lengths) >= 10 * min(lengths)
    for D in lengths:
        pts = sorted(
            (p["nodes"], p["peak_bytes"])
            for p in data["memory"]
            if p["protocol"] == "masked" and p["values"] == D
        )
        assert len(pts) >= 3 and pts[-1][0] >= 1000
        assert slope[str(D)] == pytest.approx(np.polyfit(*zip(*pts), 1)[0], rel=1e-9)
        assert 0 < slope[str(D)] < 0.05 * 8 * cfg["values"]  # O(k) bytes a node, far below one upload
    # flat in the vector length: ten times the values, within 25 % of the same bytes per node
    a, b = slope[str(lengths[0])], slope[str(lengths[-1])]
    assert abs(a - b) <= 0.25 * max(a, b), (a, b)
    assert data["graph"]["split_bound"] == pytest.approx(
        harary_split_bound(cfg["nodes"], cfg["degree"], data["graph"]["removed_fraction"]), rel=1e-12
    )


def test_docs_quote_the_record():
    _record()
    from experiments.docs_numbers.render_active import active_scale

    text = (Path(__file__).resolve().parents[2] / "docs" / "scale.md").read_text()
    block = active_scale().strip()
    assert block in text
    # the page says the target is missed exactly when a run's median ratio is over it
    data = _record()["data"]
    missed = any(run["ratio"]["median"] > data["config"]["target_ratio"] for run in data["runs"])
    assert ("**not met**" in block) == missed


def test_a_node_process_that_dies_is_an_error_here_not_a_wait_for_ever(monkeypatch):
    """Before: the parent held its own copy of the node's end of the reply pipe, so a node process that died
    (a negative --seed failed there) left the benchmark waiting for ever."""
    import experiments.bench_active_scale as bench

    monkeypatch.setattr(bench, "_nodes", _dies)
    with pytest.raises(EOFError):
        bench._start(4, 2, 2, 0)


def _dies(*args):
    """The node process's target: fails before answering (module level: spawn pickles it by name)."""
    raise SystemExit(1)
