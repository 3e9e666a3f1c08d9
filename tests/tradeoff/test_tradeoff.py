"""The trade-off command end to end: schema, exactness at eps = inf, trend, and clear errors."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from privfed.tradeoff import RECORD_KEYS, main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, digits_cache):
    out = tmp_path_factory.mktemp("tradeoff") / "run"
    argv = [
        "--method",
        "fedncm,fedcof",
        "--eps",
        "0.05,1,inf",
        "--seeds",
        "3",
        "--clients",
        "20",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 0
    return out


def test_outputs_parse_with_documented_schema(sweep):
    with (sweep / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 3 * 3  # methods x eps x seeds
    assert list(rows[0])[: len(RECORD_KEYS)] == list(RECORD_KEYS)
    data = json.loads((sweep / "results.json").read_text())
    for key in (
        "method",
        "epsilon",
        "delta",
        "seed",
        "accuracy",
        "nonprivate_accuracy",
        "sigma",
        "upload_bytes",
    ):
        assert all(key in r for r in data["records"]), key
    cfg = data["config"]
    assert cfg["methods"] == ["fedncm", "fedcof"] and cfg["seeds"] == [0, 1, 2] and cfg["clients"] == 20
    assert cfg["clip"] > 0  # the resolved (public-split) clip bound is stored, not None
    assert "numpy" in data["versions"] and "torch" in data["versions"]
    assert (sweep / "tradeoff.png").stat().st_size > 10_000


def test_eps_inf_rows_equal_nonprivate_exactly(sweep):
    data = json.loads((sweep / "results.json").read_text())
    inf_rows = [r for r in data["records"] if r["epsilon"] == "inf"]
    assert len(inf_rows) == 6
    for r in inf_rows:
        assert r["accuracy"] == r["nonprivate_accuracy"]
        assert r["sigma"] == 0.0


def test_accuracy_falls_with_budget(sweep):
    data = json.loads((sweep / "results.json").read_text())
    for m in ("fedncm", "fedcof"):
        acc = {
            e: np.mean(
                [r["accuracy"] for r in data["records"] if r["method"] == m and str(r["epsilon"]) == e]
            )
            for e in ("0.05", "inf")
        }
        # With 3 seeds on 359 test samples one accuracy's standard error is at most
        # sqrt(0.25/359) ~ 0.026; the mean of 3 has <= 0.015.  Allow 3 SE of the difference.
        assert acc["0.05"] <= acc["inf"] + 3 * math.sqrt(2) * 0.015, (m, acc)


def test_rerun_from_saved_json_is_bit_identical(sweep, tmp_path):
    out = tmp_path / "again"
    assert main(["--config", str(sweep / "results.json"), "--out", str(out), "--quiet", "--no-plot"]) == 0
    a = json.loads((sweep / "results.json").read_text())["records"]
    b = json.loads((out / "results.json").read_text())["records"]
    assert a == b


def test_toml_config_with_flag_override(tmp_path, digits_cache):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('method = "fedncm"\neps = [1.0, 4.0]\nseeds = 1\nclients = 10\n')
    out = tmp_path / "o"
    assert main(["--config", str(cfg), "--eps", "2", "--out", str(out), "--quiet", "--no-plot"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["epsilons"] == [2.0] and data["config"]["methods"] == ["fedncm"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--method", "nosuch"], "unknown method 'nosuch' (choose from fed3r"),
        (["--eps", "0"], "--eps must be > 0"),
        (["--eps", "-1"], "--eps must be > 0"),
        # a value argparse took for a flag ("expected one argument") reaches the command's own check
        (["--eps", "-1,2"], "--eps must be > 0, got -1"),
        (["--eps", "-inf"], "--eps must be a number > 0"),
        (["--delta", "-1e-5"], "--delta must be in (0, 1), got -1e-5"),
        (["--seeds", "-5,3"], "--seeds must be >= 0, got -5"),
        (
            ["--placement", "secure-sum", "--secure-agg", "none"],
            "--placement secure-sum contradicts --secure-agg none",
        ),
        (["--eps", "0.1,,1"], "malformed list"),
        (["--eps", "0.1,abc"], "'abc' is not a number"),
        (["--dataset", "file:/nonexistent/feats.npz"], "/nonexistent/feats.npz"),
        (["--dataset", "file:"], "dataset 'file:' names no file: write file:PATH"),  # it named "."
        (["--delta", "1.5"], "--delta must be in (0, 1)"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--param", "fedcof.gamma=-1"], "gamma"),
        (["--level", "client", "--eps", "1"], "--max-records"),
        (["--method", "fedcof-oracle", "--eps", "1"], "per-class second moments"),
    ],
)
def test_bad_invocations_exit_nonzero_with_one_line(argv, expected, tmp_path, capsys, digits_cache):
    code = main([*argv, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert expected in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_existing_output_dir_is_refused(sweep, capsys):
    code = main(["--method", "fedncm", "--out", str(sweep), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and "already exists" in err


def test_offline_download_is_refused_clearly(tmp_path):
    """cifar100 is not on disk and downloads are not allowed: one line, no traceback, no network."""
    env = {**os.environ, "PRIVFED_CACHE": str(tmp_path / "cache"), "PRIVFED_DATA": str(tmp_path / "data")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "privfed.tradeoff",
            "--dataset",
            "cifar100",
            "--out",
            str(tmp_path / "o"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "download" in proc.stderr.lower(), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_attack_columns_and_panel(tmp_path, digits_dataset):
    from privfed.federation import partition

    out = tmp_path / "att"
    argv = [
        "--method",
        "fedncm,fed3r",
        "--eps",
        "1,inf",
        "--seeds",
        "1",
        "--clients",
        "100",
        "--attack",
        "singleton,tracing,subspace",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    recs = {(r["method"], str(r["epsilon"])): r for r in data["records"]}
    # Singleton exposure without protection = the share of uploaded samples alone in their (client, class),
    # computed here independently from the partition.
    part = partition(digits_dataset.train_labels, 100, "dirichlet", alpha=0.1, rng=0)
    kept = part.clients >= 0
    pair = part.clients[kept] * 10 + digits_dataset.train_labels[kept]
    alone = np.bincount(pair)[pair] == 1
    assert recs[("fedncm", "inf")]["attack_singleton_exposed_fraction"] == pytest.approx(
        alone.mean(), abs=1e-12
    )
    assert (
        recs[("fedncm", "1.0")]["attack_singleton_exposed_fraction"] == 0.0
    )  # noisy counts are never exactly 1
    for r in data["records"]:
        assert 0.0 <= r["attack_tracing_auc"] <= 1.0
    # subspace needs the second moment: fed3r has it, fedncm does not (NaN and a note, not a crash).
    # With 8 samples per client (< the ~35 live feature dimensions) range(G_k) pins each member exactly.
    assert recs[("fed3r", "inf")]["attack_subspace_auc"] == 1.0
    assert recs[("fedncm", "inf")]["attack_subspace_auc"] == "nan"  # JSON has no NaN: written as a string
    assert any("'subspace' skipped for method 'fedncm'" in w for w in data["warnings"])


def test_unknown_attack_is_refused(tmp_path, capsys, digits_cache):
    code = main(["--method", "fedncm", "--attack", "nosuch", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and "unknown attack 'nosuch' (choose from" in err


def test_feature_file_with_natural_split(tmp_path, capsys):
    rng = np.random.default_rng(0)
    means = 3 * rng.normal(size=(4, 8))
    y = rng.integers(0, 4, 400)
    feats = means[y] + rng.normal(size=(400, 8))
    clients = rng.integers(0, 6, 400)
    path = tmp_path / "feats.npz"
    np.savez(path, features=feats, labels=y, clients=clients)
    out = tmp_path / "o"
    argv = [
        "--dataset",
        f"file:{path}",
        "--partition",
        "natural",
        "--method",
        "fedncm",
        "--eps",
        "2,inf",
        "--clip",
        "10",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--quiet",
        "--no-plot",
    ]
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["dataset"]["name"].startswith("file:") and data["dataset"]["dim"] == 8
    # every (client, class) pair has data: M = 6 * 4 = 24; FedNCM sends M d floats of 4 bytes over K = 6 clients
    assert {r["upload_bytes"] for r in data["records"]} == {4 * (24 * 8) / 6}
    # no public split: a finite eps without --clip is refused, naming the fix
    code = main(
        [
            "--dataset",
            f"file:{path}",
            "--method",
            "fedncm",
            "--eps",
            "1",
            "--out",
            str(tmp_path / "p"),
            "--quiet",
        ]
    )
    assert code != 0 and "pass --clip C" in capsys.readouterr().err


def test_interrupted_sweep_keeps_finished_runs(tmp_path, monkeypatch, capsys, digits_cache):
    """A sweep stopped mid-way (Ctrl-C) writes the runs that finished, then exits 130."""
    import privfed.commands.tradeoff.sweep as tr  # the module whose run calls server_head

    real = tr.server_head
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(tr, "server_head", flaky)
    out = tmp_path / "o"
    code = main(
        ["--method", "fedncm", "--eps", "1,2,4,8", "--seeds", "1", "--out", str(out), "--quiet", "--no-plot"]
    )
    assert code == 130
    with (out / "results.partial.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    # call 1 is the non-private head, calls 2-3 the first two budgets; the 4th raises
    assert [r["epsilon"] for r in rows] == ["1.0", "2.0"]
    assert "results.partial.csv" in capsys.readouterr().err


def test_the_sweep_estimate_counts_one_statistics_pass_per_seed_method_and_placement():
    """The note charged every budget its own pass over the data and 40 ms of fixed cost a run: 6,000 runs at
    d = 64 over 16,000 samples were announced as 8 minutes and took about one."""
    from privfed.commands.tradeoff.plan import SWEEP_FLOPS_PER_S, sweep_cost_note

    shape = {"n": 16_000, "d": 64, "k": 100, "c": 4, "above_s": 0.0}
    per_pass = 16_000 * 64 * 64 / SWEEP_FLOPS_PER_S
    big = {**shape, "n": 160_000}  # minutes are printed whole: a difference of many minutes to compare

    def minutes(note):
        return float(note.split("roughly ")[1].split(" minute")[0])

    one = sweep_cost_note(1000, passes=250, **big)  # 4 budgets per pass
    four = sweep_cost_note(1000, passes=1000, **big)
    assert minutes(four) - minutes(one) == pytest.approx(750 * 10 * per_pass / 60, abs=1.0)
    assert minutes(sweep_cost_note(6000, passes=1500, **shape)) <= 2  # measured: about one minute


def test_run_tradeoff_refuses_rounds_it_would_run_as_one_release():
    """Before: rounds=3 ran one-shot FedLog with noise calibrated for three releases and labelled the row
    rounds=3 (its guarantee said 'over 1 release(s)')."""
    from privfed.errors import ConfigError
    from privfed.tradeoff import TradeoffConfig, run_tradeoff

    cfg = TradeoffConfig(methods=("fedlog",), rounds=3, epsilons=(1.0,), seeds=(0,), clients=4, plot=False)
    with pytest.raises(ConfigError, match=r"rounds=3 is multi-round FedLog, which .*tradeoff_rounds runs"):
        run_tradeoff(cfg, progress=False)
