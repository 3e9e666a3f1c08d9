"""The experiment scripts read every flag before any work: a wrong value is argparse's one-line usage error
naming the flag (exit 2), and a stop is one line (exit 130) with no traceback from any of their processes."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def flag_types(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("experiments.flag_types")


def test_count_and_seed(flag_types):
    assert flag_types.count(1)("3") == 3 and flag_types.count(0)(" 0 ") == 0 and flag_types.seed("7") == 7
    for bad, minimum in (("x", 1), ("1.5", 1), ("0", 1), ("-1", 0), ("", 1)):
        with pytest.raises(argparse.ArgumentTypeError, match=f">= {minimum}"):
            flag_types.count(minimum)(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="-1"):
        flag_types.seed("-1")


def test_lists_and_names(flag_types):
    assert flag_types.int_list(1)("1, 2,16") == [1, 2, 16]
    assert flag_types.int_list(1, empty=True)("") == [] and flag_types.float_list(empty=True)(" ") == []
    assert flag_types.float_list(positive=True)("10,1,0.1,inf") == [10.0, 1.0, 0.1, float("inf")]
    for read, bad, word in (
        (flag_types.int_list(1), "1,x", "not an integer"),
        (flag_types.int_list(2), "1", ">= 2"),
        (flag_types.int_list(1), "", "malformed"),
        (flag_types.float_list(positive=True), "0", "> 0"),
        (flag_types.float_list(), "nan", "NaN"),
        (flag_types.float_list(), "1,,2", "malformed"),
        (flag_types.name_list(["a", "b"]), "a,c", "unknown name"),
        (flag_types.name_list(["a", "b"]), "a,a", "twice"),
        (flag_types.name_list(["a"]), "", "malformed"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=word):
            read(bad)
    assert flag_types.name_list(["a", "b"], empty=True)("") == []


def test_degree_and_out_path(flag_types, tmp_path):
    assert flag_types.degree("complete") is None and flag_types.degree("20") == 20
    assert flag_types.even_degree("14") == 14
    for bad in ("3", "0", "x", "-2"):
        with pytest.raises(argparse.ArgumentTypeError, match="even integer >= 2"):
            flag_types.degree(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="even integer >= 2; got 'complete'"):
        flag_types.even_degree("complete")
    (tmp_path / "f").write_text("x")
    assert flag_types.out_path(str(tmp_path)) == str(tmp_path)
    assert flag_types.out_path(str(tmp_path / "new")) == str(tmp_path / "new")
    for bad, word in ((str(tmp_path / "f"), "is a file"), ("  ", "empty path")):
        with pytest.raises(argparse.ArgumentTypeError, match=word):
            flag_types.out_path(bad)


@pytest.mark.parametrize(
    ("script", "args", "flag"),
    [
        # before: a traceback after the clean settings had run (a text budget), or at once (a text size)
        ("attacks_inversion", ["--eps", "abc"], "--eps"),
        ("attacks_inversion", ["--ns", "1,x"], "--ns"),
        ("attacks_inversion", ["--out", "FILE"], "--out"),
        ("attacks_rounds_inversion", ["--clients", "20,x"], "--clients"),
        # before: numpy's traceback from inside its bit generator
        ("bench_secagg", ["--seed", "-1"], "--seed"),
        ("bench_secagg_scale", ["--seed", "-1"], "--seed"),
        ("attacks_tracing", ["--seed", "-1"], "--seed"),
        # before: an unknown part was skipped silently (nothing skipped)
        ("bench_secagg_scale", ["--skip", "flor"], "--skip"),
        ("bench_flower", ["--skip", "scales"], "--skip"),
        # before: checked only when their part ran, minutes in
        ("bench_flower", ["--dims", "64,x"], "--dims"),
        ("bench_flower_masked", ["--degree", "3"], "--degree"),
        # before: accepted, then NaN rows ('min() arg is an empty sequence') or a BLAS error
        ("bench_scale", ["--repeats", "0"], "--repeats"),
        ("bench_scale", ["--runs", "0"], "--runs"),
        ("bench_scale", ["--threads", "-1"], "--threads"),
        ("bench_scale", ["--loop-rows", "-5"], "--loop-rows"),
        ("bench_scale", ["--methods", "fedncm,nope"], "--methods"),
        ("bench_vision_device", ["--backbones", "resnet50"], "--backbones"),
        ("bench_vision_device", ["--images", "0"], "--images"),
    ],
)
def test_a_wrong_flag_is_one_usage_line_before_any_work(script, args, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("not a folder")
    main = importlib.import_module(f"experiments.{script}").main
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert (
        err.splitlines()[-1].startswith(f"{script}.py: error: argument {flag}")
        or flag in err.splitlines()[-1]
    )
    assert time.monotonic() - t0 < 10 and sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_the_degree_must_be_below_every_node_count(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    from experiments.bench_flower_masked import main

    with pytest.raises(SystemExit) as exc:
        main(["--timing-nodes", "50", "--memory-nodes", "30,60", "--degree", "30"])
    assert exc.value.code == 2 and "below every node count" in capsys.readouterr().err


def test_the_audit_sweep_runs_as_a_file_from_any_folder(tmp_path):
    """Before: ``python experiments/audit_sweep.py`` (the form every other script documents) failed with
    ModuleNotFoundError: No module named 'experiments' unless run as a module from the repository root."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "audit_sweep.py"), "--methods", "nope"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert "--methods: unknown" in proc.stderr


def test_ctrl_c_stops_the_active_benchmark_in_one_line(tmp_path):
    """Ctrl-C reaches the benchmark's whole process group (its node process too). Before: the node process
    printed a KeyboardInterrupt traceback and the pushing thread a BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "experiments" / "bench_active_scale.py"), "--nodes", "40", "--values", "2000",
         "--degree", "6", "--repeats", "1000", "--runs", "1", "--memory-nodes", "10"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        # as a terminal's Ctrl-C finds it, whatever the test runner's own SIGINT disposition
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        line = b""
        while b"repeat 0]" not in line:  # a repeat has finished: the run is under way
            line = proc.stdout.readline()
            assert line, proc.stderr.read().decode()[-600:]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode()
    assert proc.returncode == 130 and "Traceback" not in text, text[-600:]
    assert text.strip().splitlines() == ["bench_active_scale.py: interrupted"]
