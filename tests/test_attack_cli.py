"""``python -m privfed.attack``: end to end on tiny configurations, and one-line errors."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest

from privfed.attack import main


def _read(out):
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    return rows, json.loads((out / "results.json").read_text()), json.loads((out / "config.json").read_text())


def test_inversion_sweep_writes_csv_json_and_grids(tmp_path, digits_cache, capsys):
    out = tmp_path / "inv"
    rc = main(["--attack", "inversion", "--method", "fedncm", "--eps", "inf,1", "--n", "1", "--max-groups", "6",
               "--steps", "20", "--out", str(out)])
    assert rc == 0
    rows, res, cfg = _read(out)
    assert [(r["eps"], r["n"]) for r in rows] == [("inf", "1"), ("1.0", "1")]
    assert {"psnr", "ssim", "identification", "delta_psnr", "baseline_psnr"} <= set(rows[0])
    assert all(math.isfinite(float(r["psnr"])) for r in rows)
    assert cfg["attack"] == "inversion" and cfg["seeds"] == [0] and cfg["attack_params"] == {"steps": 20}
    assert cfg["clip_used"] > 0 and "numpy" in cfg["versions"]
    assert len(res["records"]) == 2
    assert (out / "grid_fedncm_epsinf_n1.png").stat().st_size > 0
    assert (out / "grid_fedncm_eps1_n1.png").exists()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("attack,extra", [
    ("tracing", ["--method", "fedncm", "--n", "1,8"]),
    ("subspace", ["--method", "fed3r", "--n", "2"]),
    ("unmixing", ["--method", "fedcgs", "--n", "2", "--max-groups", "4"]),
    ("singleton", ["--method", "fedcof", "--partition", "dirichlet", "--clients", "20"]),
    ("labels", ["--method", "fedncm", "--partition", "dirichlet", "--clients", "20", "--count-noise", "laplace",
                "--eps", "1,inf"]),
    ("differencing", ["--method", "fed3r", "--n", "3", "--max-groups", "10"]),
])
def test_statistics_attacks_run_from_the_command_line(tmp_path, digits_cache, attack, extra):
    out = tmp_path / attack
    assert main(["--attack", attack, "--out", str(out), "--seed", "0,1", *extra]) == 0
    rows, res, _ = _read(out)
    assert rows and all(r["attack"] == attack for r in rows)
    assert {r["seed"] for r in rows} == {"0", "1"}


def test_same_seed_same_csv(tmp_path, digits_cache):
    args = ["--attack", "tracing", "--method", "fedncm", "--n", "2", "--eps", "inf,4"]
    main([*args, "--out", str(tmp_path / "a")])
    main([*args, "--out", str(tmp_path / "b")])
    drop = ("seconds",)
    a, b = (_read(tmp_path / x)[0] for x in "ab")
    assert [{k: v for k, v in r.items() if k not in drop} for r in a] == \
        [{k: v for k, v in r.items() if k not in drop} for r in b]


@pytest.mark.parametrize("argv,needle", [
    (["--attack", "nope", "--out", "X"], "unknown attack 'nope'"),
    (["--attack", "tracing", "--eps", "-1", "--out", "X"], "--eps must be > 0"),
    (["--attack", "tracing", "--eps", "abc", "--out", "X"], "is not a number"),
    (["--attack", "tracing", "--secure-agg", "paillier", "--out", "X"], "--secure-agg must be none, mask or ckks"),
    (["--attack", "tracing", "--clients", "2.5", "--out", "X"], "--clients must be an integer, got '2.5'"),
    (["--attack", "tracing", "--method", "fedx", "--out", "X"], "unknown method 'fedx'"),
    (["--attack", "subspace", "--method", "fedncm", "--n", "2", "--out", "X"], "needs the statistic 'second'"),
    (["--attack", "tracing", "--backend", "pixel", "--out", "X"], "applies to --attack inversion only"),
    (["--attack", "inversion", "--backend", "gan", "--out", "X"], "unknown inversion backend"),
    (["--attack", "labels", "--count-noise", "poisson", "--out", "X"], "--count-noise must be one of"),
    (["--attack", "labels", "--partition", "stripes", "--out", "X"], "--partition 'stripes' unknown"),
    (["--attack", "tracing", "--n", "0", "--out", "X"], "--n must be >= 1"),
])
def test_bad_invocations_print_one_line_and_exit_non_zero(tmp_path, digits_cache, capsys, argv, needle):
    argv = [a.replace("X", str(tmp_path / "o")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m privfed.attack: error:") and needle in err, err


def test_module_entry_point_exits_non_zero_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "privfed.attack", "--attack", "nope", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_existing_output_folder_is_not_overwritten(tmp_path, digits_cache, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["--attack", "labels", "--partition", "iid", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
