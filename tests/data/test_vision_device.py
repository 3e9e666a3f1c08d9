"""experiments/bench_vision_device.py: the GPU measurements privfed.data.vision quotes (docs/data.md's
``vision-device`` block) — the record's own arithmetic, the script's measuring code on the CPU, and its
refusal without a CUDA device."""

from __future__ import annotations

import importlib
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "experiments" / "results" / "bench_vision_device.json"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("experiments.bench_vision_device")


def test_the_record_is_what_its_samples_say(bench):
    rec = json.loads(RECORD.read_text())
    d = rec["data"]
    cfg = d["config"]
    for flag in ("images", "repeats", "runs"):
        assert f"--{flag} {cfg[flag]}" in rec["command"]
    assert d["device"]["gpu"] and d["device"]["cuda"] and len(d["runs"]) == cfg["runs"]
    for run in d["runs"]:
        assert [r["backbone"] for r in run["speed"]] == cfg["backbones"]
        for s in run["speed"]:
            med = {w: statistics.median(v) for w, v in s["samples_s"].items()}
            assert all(len(v) == cfg["repeats"] for v in s["samples_s"].values())
            assert s["median_s"] == pytest.approx(med, rel=1e-12)
            assert s["speedup"] == pytest.approx(med["pil"] / med["device"], rel=1e-12)
            for w, v in s["samples_s"].items():
                assert s["spread"][w] == pytest.approx((max(v) - min(v)) / med[w], rel=1e-12)
    assert d["reproduction"] == bench.reproduction(d["runs"])
    for a in d["agreement"]:
        # TF32 rounds the mantissa to 10 bits (2^-11 ~ 4.9e-4 relative); without it only float32's own rounding
        # (2^-24 ~ 6e-8 a step) is left, carried through the network
        assert a["tf32_off"]["relative_fro"] < 1e-5 and a["defaults"]["relative_fro"] < 5e-3
        assert a["defaults"]["relative_fro"] <= a["defaults"]["max_row_relative"]
        assert a["torch_defaults"]["matmul_allow_tf32"] is False  # torch's default: only cuDNN's convolutions
        tf32_acted = a["torch_defaults"]["cudnn_allow_tf32"] and a["defaults"]["relative_fro"] > 1e-5
        if tf32_acted:  # a GPU with TF32: its rounding, far above float32's
            assert a["defaults"]["relative_fro"] > 10 * a["tf32_off"]["relative_fro"]


def test_the_difference_is_the_relative_norms(bench):
    rng = np.random.default_rng(0)
    cpu = rng.normal(size=(6, 5))
    gpu = cpu + rng.normal(scale=1e-3, size=cpu.shape)
    got = bench._difference(cpu, gpu)
    rows = [np.sqrt(((gpu[i] - cpu[i]) ** 2).sum() / (cpu[i] ** 2).sum()) for i in range(6)]
    assert got["relative_fro"] == pytest.approx(np.sqrt(((gpu - cpu) ** 2).sum() / (cpu**2).sum()), rel=1e-9)
    assert got["max_row_relative"] == pytest.approx(max(rows), rel=1e-9)
    assert got["median_row_relative"] == pytest.approx(float(np.median(rows)), rel=1e-9)


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """The script's measuring code run where there is no GPU: 'cuda' resolved to the CPU."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    import privfed.data.vision as vision

    monkeypatch.setattr(vision, "resolve_device", lambda device=None: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return torch


def test_agreement_and_speed_measure_what_they_say(bench, cpu_as_gpu):
    """On one device the two extractions are the same computation: no difference, with TF32 or without, and
    the TF32 switches are put back as they were."""
    torch = cpu_as_gpu
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    a = bench.agreement("squeezenet1_1", 3, 2, 0)
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    assert (
        a["dim"] == 512 and a["defaults"]["relative_fro"] == 0.0 and a["tf32_off"]["max_row_relative"] == 0.0
    )
    assert a["feature_norm_median"] > 0
    s = bench.speed("squeezenet1_1", 3, 2, 2, 0)
    assert [len(v) for v in s["samples_s"].values()] == [2, 2]
    assert s["speedup"] == pytest.approx(s["median_s"]["pil"] / s["median_s"]["device"], rel=1e-12)


def test_reproduction_compares_every_run(bench):
    runs = [
        {"speed": [{"backbone": "a", "speedup": v}, {"backbone": "b", "speedup": 2.0}]}
        for v in (5.0, 5.6, 5.4)
    ]
    got = bench.reproduction(runs)
    assert got["a"]["values"] == [5.0, 5.6, 5.4] and got["a"]["spread"] == pytest.approx(0.12)
    assert got["a"]["reproduced"] is False and got["b"] == {
        "values": [2.0] * 3,
        "spread": 0.0,
        "reproduced": True,
    }


def test_the_images_are_seeded_and_not_flat(bench):
    a, b = bench.SyntheticImages(4, 3, None), bench.SyntheticImages(4, 3, None)
    assert (
        np.array_equal(a.images, b.images) and a.images.shape == (4, 32, 32, 3) and a.images.dtype == np.uint8
    )
    assert not np.array_equal(a.images, bench.SyntheticImages(4, 4, None).images)
    assert a.images.std() > 20


def test_without_a_gpu_it_says_so_and_measures_nothing(bench, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--images", "4"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err and "nothing was measured" in err


def test_one_run_is_not_called_reproduced(bench, monkeypatch):
    """A record saved after the first of two runs (a stop keeps it) said every speed-up reproduced."""
    import copy

    from experiments.docs_numbers import render_records

    rec = json.loads(RECORD.read_text())
    one = copy.deepcopy(rec)
    one["data"]["runs"] = one["data"]["runs"][:1]
    one["data"]["reproduction"] = bench.reproduction(one["data"]["runs"])
    assert all(r["reproduced"] is None for r in one["data"]["reproduction"].values())
    monkeypatch.setattr(render_records, "record", lambda name: one)
    text = render_records.vision_device()
    assert "whether the speed-ups reproduce is not checked" in text and "1 run:" in text
    assert "reproduces within" not in text and "a recorded ratio must reproduce" not in text


def test_the_docs_block_says_full_float32_where_tf32_did_not_act(monkeypatch):
    """The prose said TF32 ran wherever the record came from; on a GPU without it both columns are float32's."""
    import copy

    from experiments.docs_numbers import render_records

    rec = json.loads(RECORD.read_text())
    plain = copy.deepcopy(rec)
    for a in plain["data"]["agreement"]:
        a["defaults"] = dict(a["tf32_off"])
    monkeypatch.setattr(render_records, "record", lambda name: plain)
    text = render_records.vision_device()
    assert (
        "this GPU computed in full float32" in text
        and "let cuDNN run float32 convolutions in TF32" not in text
    )
    monkeypatch.setattr(render_records, "record", lambda name: rec)
    assert "let cuDNN run float32 convolutions in TF32" in render_records.vision_device()
