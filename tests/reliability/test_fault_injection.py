"""Fault injection on the result writer of every command: SIGKILL at chosen points, a full disk, two runs on
one --out, read-only and over-long folders, a tampered folder read back.

What must hold whatever happens: no finished result is lost (a run that
finished is in the published folder or in the staging folder of a killed
run), and a manifest never lies (every file it lists is there with its hash,
nothing else is, and ``complete`` is true only for a whole run).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from privfed.attack import main as attack_main
from privfed.commands import common as _cli
from privfed.errors import ConfigError, InputError
from privfed.results import guard as results_guard
from privfed.results import writer as results_io
from privfed.results.writer import ResultFolder, verify_folder
from privfed.tradeoff import main as tradeoff_main

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--method", "fedncm", "--placement", "local", "--clients", "20", "--no-plot", "--quiet"]


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1


def _staging(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.endswith(".privfed-staging"))


def _all_runs(parent: Path) -> list[Path]:
    """Every folder holding a run's files under ``parent`` (published, set aside or staged)."""
    return sorted(p for p in parent.iterdir() if p.is_dir())


# ---------------------------------------------------------------- SIGKILL at chosen points
_SWEEP = (
    "import sys, privfed.commands.tradeoff.cli as t; t.CHECKPOINT_S = 0.0; sys.exit(t.main(sys.argv[1:]))"
)


def _spawn(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _SWEEP, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_checkpoint(tmp_path: Path, proc: subprocess.Popen, rows: int) -> Path:
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() - t0 < 120
        for s in _staging(tmp_path):
            with_manifest = s / "manifest.json"
            if with_manifest.exists():
                try:
                    if _rows(s / "results.partial.csv") >= rows:
                        return s
                except (FileNotFoundError, ValueError):
                    pass
        time.sleep(0.02)


@pytest.mark.parametrize(
    "after_rows, seed",
    [(1, 0), pytest.param(3, 1, marks=pytest.mark.slow), pytest.param(5, 2, marks=pytest.mark.slow)],
)
def test_sigkill_mid_sweep_loses_no_checkpointed_run_and_the_next_run_recovers_it(
    tmp_path, capsys, digits_cache, after_rows, seed
):
    """SIGKILL (no handler runs) at a point drawn from a fixed seed after a checkpoint holds ``after_rows`` runs."""
    out = tmp_path / "o"
    argv = [*SMALL, "--eps", "0.5,1,2,4", "--seeds", "400", "--out", str(out)]
    proc = _spawn(argv)
    staging = _wait_for_checkpoint(tmp_path, proc, after_rows)
    seen = _rows(staging / "results.partial.csv")
    time.sleep(
        float(np.random.default_rng(seed).uniform(0.0, 0.05))
    )  # mid-write of a later checkpoint, or not
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not out.exists()  # nothing was published: a killed run never looks finished
    (staging,) = _staging(tmp_path)
    manifest = verify_folder(staging)  # the manifest matches what is there, and says incomplete
    assert manifest["complete"] is False
    kept = _rows(staging / "results.partial.csv")
    assert kept >= seen >= after_rows
    assert len(json.loads((staging / "results.partial.json").read_text())["records"]) == kept
    # the next run on the same folder sets the killed run's part aside, visibly, and runs
    before = {p.name: p.read_bytes() for p in staging.iterdir()}
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    pid = staging.name.split(".")[-2]
    aside = tmp_path / f"o.interrupted-{pid}"
    assert f"they are now in {aside}" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == before
    assert verify_folder(out)["complete"] is True and not _staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "o",
        aside.name,
    ]  # no work folder, lock or record left


def test_a_killed_run_under_a_default_name_is_rescued_by_the_next_default_run(tmp_path, monkeypatch, capsys):
    """Without --out a run's folder name is never asked for again, so a SIGKILLed run's checkpoint stayed
    hidden in results/ for good; the next run under a default name sets it aside as a --out run would."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SWEEP, *SMALL, "--eps", "0.5,1,2,4", "--seeds", "400"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    (tmp_path / "results").mkdir(exist_ok=True)
    staging = _wait_for_checkpoint(tmp_path / "results", proc, 1)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    (staging,) = _staging(tmp_path / "results")
    before = {p.name: p.read_bytes() for p in staging.iterdir()}
    name, pid = staging.name[1:].removesuffix(".privfed-staging").rsplit(".", 1)
    monkeypatch.chdir(tmp_path)
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1"]) == 0
    aside = Path("results") / f"{name}.interrupted-{pid}"
    assert f"they are now in {aside}" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == before and verify_folder(aside)[
        "complete"
    ] is False
    assert not _staging(tmp_path / "results") and not list((tmp_path / "results").glob(".*privfed-lock*"))
    # a folder the user named is theirs to rescue (by running on it again): a default run leaves it alone
    mine = tmp_path / "results" / ".mine.999999.privfed-staging"
    aside.rename(mine)
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1"]) == 0
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before


def test_runs_started_together_under_default_names_each_get_a_folder(tmp_path):
    """Runs started in the same second (a job array) took the same default name: all but one were refused as
    using another run's folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "privfed.tradeoff", *SMALL, "--eps", "1"]
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(3)
    ]
    errs = [p.communicate(timeout=300)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    runs = sorted(p for p in (tmp_path / "results").iterdir() if not p.name.startswith("."))
    assert len(runs) == 3 and all(verify_folder(r)["complete"] for r in runs), runs
    assert not list((tmp_path / "results").glob(".*"))  # no lock, record or staging folder left


# ---------------------------------------------------------------- a full disk
class _Disk:
    """A patched writer: every result write raises ENOSPC once ``full`` is set (after ``rows`` CSV rows)."""

    def __init__(self, monkeypatch, rows: int = 3):
        self.full = False
        self.hits = 0
        real_writer = _cli.csv.DictWriter
        disk = self

        class Writer(real_writer):
            def writerow(self, row):
                self.n = getattr(self, "n", 0) + 1
                if disk.full and self.n > rows:
                    disk.hits += 1
                    raise OSError(errno.ENOSPC, "No space left on device")
                return super().writerow(row)

        real_text = Path.write_text

        def write_text(path, *a, **k):
            if disk.full and path.name.endswith(".privfed-tmp"):
                disk.hits += 1
                path.open("w").write('{"trunc')  # a half-written temporary, as a real full disk leaves
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_text(path, *a, **k)

        monkeypatch.setattr(_cli.csv, "DictWriter", Writer)
        monkeypatch.setattr(Path, "write_text", write_text)


def _fill_at_final_write(monkeypatch, disk: _Disk) -> None:
    import privfed.commands.tradeoff.cli as tr

    real = tr.summarise

    def summarise(records):
        disk.full = True  # the sweep is done; the disk fills as the final files are written
        return real(records)

    monkeypatch.setattr(tr, "summarise", summarise)


def test_full_disk_at_the_final_write_moves_the_last_checkpoint_into_place(
    tmp_path, monkeypatch, capsys, digits_cache
):
    """The final files cannot be written: the last checkpoint (every run, checkpointed as it finished)
    is moved into place by a rename, which needs no space, and no staging folder, work folder or lock
    is left beside it."""
    import privfed.commands.tradeoff.cli as tr

    monkeypatch.setattr(tr, "CHECKPOINT_S", 0.0)
    disk = _Disk(monkeypatch)
    _fill_at_final_write(monkeypatch, disk)
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1,2", "--seeds", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert disk.hits >= 2 and "Traceback" not in err
    assert "No space left on device" in err and f"the last checkpoint is in {out}" in err
    # the file is named as a file of the output folder, not by the scratch path it had (gone by now)
    assert (
        f"could not write results.csv of {str(out)!r}: No space left on device" in err
        and "privfed-work" not in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]  # no staging, work folder or lock
    manifest = verify_folder(out)  # the checkpoint's manifest matches the files: no half-written file listed
    assert manifest["complete"] is False and _rows(out / "results.partial.csv") == 6
    assert not [p for p in out.iterdir() if p.name.endswith(".privfed-tmp")]


def test_full_disk_during_overwrite_leaves_the_previous_run_whole(
    tmp_path, monkeypatch, capsys, digits_cache
):
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "2", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    disk = _Disk(monkeypatch, rows=1)
    _fill_at_final_write(monkeypatch, disk)
    assert tradeoff_main([*SMALL, "--eps", "2,4", "--seeds", "2", "--out", str(out), "--overwrite"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert verify_folder(out)["complete"] is True


def test_disk_full_at_a_checkpoint_does_not_stop_the_sweep(tmp_path, monkeypatch, capsys, digits_cache):
    import privfed.commands.tradeoff.cli as cli
    import privfed.commands.tradeoff.sweep as tr

    monkeypatch.setattr(cli, "CHECKPOINT_S", 0.0)
    disk = _Disk(monkeypatch, rows=0)
    real = tr.server_head
    calls = {"n": 0}

    def head(*a, **k):  # the disk is full for the checkpoints in the middle of the sweep, then freed
        calls["n"] += 1
        disk.full = 3 <= calls["n"] <= 4
        return real(*a, **k)

    monkeypatch.setattr(tr, "server_head", head)
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1,2", "--seeds", "2", "--out", str(out)]) == 0
    assert disk.hits >= 1 and "checkpoint not written" in capsys.readouterr().err
    assert verify_folder(out)["complete"] is True and _rows(out / "results.csv") == 4


# ---------------------------------------------------------------- two runs on one --out
def test_a_second_run_on_a_locked_folder_is_refused_at_once_naming_the_holder(tmp_path, capsys, digits_cache):
    out = tmp_path / "o"
    holder = ResultFolder(out, command="python -m privfed.tradeoff --eps 1 (the first run)")
    for main, extra in (
        (tradeoff_main, [*SMALL, "--eps", "1"]),
        (attack_main, ["--attack", "tracing", "--quiet"]),
    ):
        t0 = time.monotonic()
        assert main([*extra, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert time.monotonic() - t0 < 30 and len(err.splitlines()) == 1, err
        assert f"--out {str(out)!r} is in use by another privfed run (pid {os.getpid()}" in err
        assert "(the first run)" in err
    holder.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the lock and its record are gone with the run
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0


def test_two_sweeps_started_together_on_one_out_one_runs_one_is_refused(tmp_path, digits_cache):
    out = tmp_path / "o"
    argv = [*SMALL, "--eps", "1,2", "--seeds", "30", "--out", str(out)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "privfed.tradeoff", *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    codes, errs = [], []
    for p in procs:
        _, e = p.communicate(timeout=300)
        codes.append(p.returncode)
        errs.append(e)
    assert sorted(codes) == [0, 2], errs
    refused = errs[codes.index(2)]
    assert "is in use by another privfed run" in refused or "already exists and is not empty" in refused, (
        refused
    )
    manifest = verify_folder(out)
    assert manifest["complete"] is True and _rows(out / "results.csv") == 60
    assert [p.name for p in tmp_path.iterdir()] == ["o"]


# ---------------------------------------------------------------- where the folder goes: checked before any work
def _no_work(monkeypatch):
    import privfed.commands.tradeoff.cli as tr

    def boom(*a, **k):
        raise AssertionError("the sweep started although --out was unusable")

    monkeypatch.setattr(tr, "run_tradeoff", boom)


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into read-only folders; the patched probe covers it"
)
def test_read_only_parent_is_refused_before_the_sweep(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert tradeoff_main([*SMALL, "--eps", "1", "--out", str(ro / "o")]) == 2
    finally:
        ro.chmod(0o755)
    assert "cannot write in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "errno_, word", [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")]
)
def test_unwritable_location_is_refused_before_the_sweep(tmp_path, monkeypatch, capsys, errno_, word):
    _no_work(monkeypatch)

    def mkstemp(*a, **k):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(results_guard.tempfile, "mkstemp", mkstemp)
    for main, extra in (
        (tradeoff_main, [*SMALL, "--eps", "1"]),
        (attack_main, ["--attack", "tracing", "--quiet"]),
    ):
        assert main([*extra, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert f"cannot write in {str(tmp_path)!r} ({word})" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_too_little_space_and_too_long_names_are_refused_before_the_sweep(tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch)
    long = tmp_path / ("x" * 250)
    assert tradeoff_main([*SMALL, "--eps", "1", "--out", str(long)]) == 2
    assert "byte name limit" in capsys.readouterr().err
    deep = tmp_path.joinpath(*["d" * 200] * 21)
    assert tradeoff_main([*SMALL, "--eps", "1", "--out", str(deep)]) == 2
    assert "byte path limit" in capsys.readouterr().err
    monkeypatch.setattr(
        results_guard.shutil, "disk_usage", lambda p: SimpleNamespace(free=2**20, total=2**30)
    )
    assert tradeoff_main([*SMALL, "--eps", "1", "--out", str(tmp_path / "o")]) == 2
    assert "only 1.0 MiB free" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- reading results back
def test_a_tampered_result_folder_is_refused_when_read_back(tmp_path, capsys, digits_cache):
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    verify_folder(out)
    (out / "results.csv").write_text((out / "results.csv").read_text().replace("fedncm", "fedcof"))
    with pytest.raises(InputError, match="'results.csv' does not match its SHA-256"):
        verify_folder(out)
    assert (
        tradeoff_main(["--config", str(out / "results.json"), "--out", str(tmp_path / "again"), "--quiet"])
        == 2
    )
    assert "does not match its SHA-256" in capsys.readouterr().err
    (out / "results.csv").unlink()
    with pytest.raises(InputError, match="'results.csv' is listed in manifest.json but missing"):
        verify_folder(out)


# ---------------------------------------------------------------- the multi-round command
def _fake_rounds(monkeypatch, stop_at: int | None = None, sig=signal.SIGTERM):
    """run_rounds replaced by a stand-in result (the writer is under test, not the training)."""
    import privfed.rounds as fr

    seen = []

    def run_rounds(cfg, *, seed, epsilon, progress, noise_seed=None):
        seen.append(cfg)
        if stop_at is not None and len(seen) == stop_at:
            os.kill(os.getpid(), sig)
            time.sleep(0.5)
        oneshot = {"personalised": 0.5, "common": 0.4, "privacy": None, "upload_bytes_total": 10}
        return SimpleNamespace(
            personalised_accuracy=0.6 + seed / 100,
            common_accuracy=0.5,
            privacy=None,
            bytes={"upload_total": 20},
            baselines={"oneshot": oneshot},
            attacks=None,
        )

    monkeypatch.setattr(fr, "run_rounds", run_rounds)
    return seen


ROUNDS = ["--method", "fedlog", "--rounds", "2", "--clients", "4", "--no-plot", "--quiet", "--eps", "inf"]


def test_rounds_sweep_stopped_by_sigterm_keeps_the_finished_pairs(tmp_path, monkeypatch, capsys):
    _fake_rounds(monkeypatch, stop_at=3)
    out = tmp_path / "r"
    assert tradeoff_main([*ROUNDS, "--seeds", "4", "--out", str(out)]) == 143
    assert "the sweep stopped after 4 run(s)" in capsys.readouterr().err  # 2 (seed) pairs x 2 rows each
    manifest = verify_folder(out)
    assert manifest["complete"] is False and _rows(out / "results.partial.csv") == 4
    assert not (out / "results.csv").exists()


def test_rounds_results_record_every_setting_and_their_config_reruns_the_run(tmp_path, monkeypatch):
    seen = _fake_rounds(monkeypatch)
    out = tmp_path / "r"
    assert (
        tradeoff_main(
            [*ROUNDS, "--seeds", "1", "--local-epochs", "3", "--init", "scratch", "--out", str(out)]
        )
        == 0
    )
    config = json.loads((out / "results.json").read_text())["config"]
    assert (config["local_epochs"], config["init"]) == (3, "scratch") and config["families"]
    assert verify_folder(out)["complete"] is True
    first = seen[-1]
    assert (
        tradeoff_main(["--config", str(out / "results.json"), "--out", str(tmp_path / "again"), "--quiet"])
        == 0
    )
    again = seen[-1]
    assert (
        (again.local_epochs, again.init, again.families)
        == (first.local_epochs, first.init, first.families)
        == (3, "scratch", first.families)
    )
    assert json.loads((tmp_path / "again" / "results.json").read_text())["config"] == config


# ---------------------------------------------------------------- the Flower app's --output
def test_flower_output_is_published_as_one_unit(tmp_path, monkeypatch):
    from privfed.flower import server_app

    head = SimpleNamespace(weight=np.ones((3, 2)), bias=np.zeros(3))
    result = SimpleNamespace(head=head, report={"privacy": None, "replied": 2})
    out = tmp_path / "f"
    server_app.write_outputs(result, str(out))
    manifest = verify_folder(out)
    assert manifest["complete"] is True and {f["name"] for f in manifest["files"]} == {
        "head.npz",
        "report.json",
    }
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # a second run that fails half-way (the disk fills at report.json) leaves the first one whole
    real = Path.write_text

    def full(path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    result.head = SimpleNamespace(weight=np.full((3, 2), 7.0), bias=np.zeros(3))
    with pytest.raises(results_io.ResultsWriteError, match="report.json.*No space left"):
        server_app.write_outputs(result, str(out))
    monkeypatch.setattr(Path, "write_text", real)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_flower_cli_refuses_bad_numbers_and_output_before_starting(tmp_path, capsys):
    from privfed.commands.flower import main

    f = tmp_path / "file"
    f.write_text("x")
    for argv, msg in (
        (["--eps", "nan"], "--eps must be a number > 0"),
        (["--eps=-inf"], "--eps must be"),
        (["--eps=-1"], "--eps must be"),
        (["--delta", "nan"], "--delta must be a finite"),
        (["--clip", "inf"], "--clip must be a finite"),
        (["--output", str(f)], "is a file"),
        (["--num-cpus", "0"], "--num-cpus must be an integer from 1 to the"),
        (["--frac-bits", "1000"], "--frac-bits must lie in [0, 53]"),
        (["--noise-seed=-1"], "--noise-seed must be an integer >= 0"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err


def test_result_folder_refuses_files_that_appeared_during_the_run(tmp_path):
    out = tmp_path / "o"
    run = ResultFolder(out)
    run.write("results.csv", lambda p: p.write_text("a\n1\n"))
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # someone else's file, made while the run was going
    with pytest.raises(results_io.ResultsWriteError, match="notes.txt") as exc:
        run.publish(complete=True)
    assert (out / "notes.txt").read_text() == "mine"
    kept = exc.value.kept
    assert f"its files are kept in '{kept}'" in str(exc.value) and kept.name.startswith("o.unplaced-")
    assert verify_folder(kept)["complete"] is True  # the run is kept where the message says
    with pytest.raises(ConfigError):
        results_io.check_out_path(out, overwrite=True)


def test_real_rounds_sweep_stopped_by_sigterm_in_a_subprocess_leaves_its_finished_pairs(
    tmp_path, digits_cache
):
    """Before: SIGTERM left no folder at all."""
    out = tmp_path / "r"
    code = (
        "import sys, privfed.commands.tradeoff.rounds as f, privfed.commands.tradeoff.cli as t; f.CHECKPOINT_S = 0.0; "
        "sys.exit(t.main(sys.argv[1:]))"
    )
    argv = [
        "--method",
        "fedlog",
        "--eps",
        "inf",
        "--rounds",
        "2",
        "--seeds",
        "50",
        "--clients",
        "4",
        "--partition",
        "iid",
        "--local-epochs",
        "1",
        "--families",
        "cnn",
        "--init",
        "scratch",
        "--no-plot",
        "--quiet",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_checkpoint(tmp_path, proc, 2)  # one (epsilon, seed) pair: two rows
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    manifest = verify_folder(out)
    assert manifest["complete"] is False and 2 <= _rows(out / "results.partial.csv") < 100
    data = json.loads((out / "results.partial.json").read_text())
    assert data["config"]["local_epochs"] == 1 and data["config"]["families"] == ["cnn"]


def _mount_point(monkeypatch, out: Path, *, siblings: bool = False) -> None:
    """``out`` behaves as a mount point: renaming a folder onto it fails with EBUSY (privfed's writer only);
    ``siblings``: renaming onto ``<out>.unplaced-*`` fails too (the name taken)."""
    import privfed.results.writer as writer

    real = os.rename

    def busy(src, dst, *a, **kw):
        if Path(dst) == out:
            raise OSError(errno.EBUSY, "Device or resource busy")
        if siblings and Path(dst).name.startswith(f"{out.name}.unplaced-"):
            raise OSError(errno.ENOTEMPTY, "Directory not empty")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(writer.os, "rename", busy)


def test_a_finished_run_whose_move_fails_is_kept_beside_out_where_the_message_says(tmp_path, monkeypatch):
    """Before: an --out that is a mount point (rename: EBUSY) lost the finished release: the Flower app discarded
    the staging folder, and the message named a folder that no longer existed."""
    out = tmp_path / "mnt"
    run = ResultFolder(out)
    run.write("head.npz", lambda p: p.write_bytes(b"weights"))
    _mount_point(monkeypatch, out)
    with pytest.raises(results_io.ResultsWriteError, match="Device or resource busy") as exc:
        run.publish(complete=True)
    kept = Path(str(exc.value).split("its files are kept in ")[1].strip("'"))
    assert kept.parent == tmp_path and kept.name.startswith("mnt.unplaced-")
    assert verify_folder(kept)["complete"] is True and (kept / "head.npz").read_bytes() == b"weights"
    run.discard()  # a caller dropping its scratch after the failure leaves the kept run alone
    assert (kept / "head.npz").read_bytes() == b"weights"


def test_a_sweep_whose_final_move_fails_keeps_its_complete_results_not_partial_ones(
    tmp_path, monkeypatch, capsys, digits_cache
):
    """Before: the complete results.csv/json were deleted for results.partial.* under a message naming a folder
    that no longer existed."""
    out = tmp_path / "mnt"
    _mount_point(monkeypatch, out)
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Device or resource busy" in err, err
    kept = Path(err.split("its files are kept in ")[1].strip("'"))
    assert kept.name.startswith("mnt.unplaced-") and verify_folder(kept)["complete"] is True
    assert {"results.csv", "results.json"} <= {p.name for p in kept.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]  # no partial folder, no scratch, no lock


def test_a_replay_refused_for_its_folder_says_how_to_replay_an_edited_copy(tmp_path, capsys, digits_cache):
    out = tmp_path / "r1"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert tradeoff_main(["--config", str(out / "results.json"), "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not list (notes.txt)" in err and "pass a copy of the file outside its run folder" in err, err
    assert len(err.splitlines()) == 1
    copy = tmp_path / "edited.json"
    copy.write_bytes((out / "results.json").read_bytes())
    assert tradeoff_main(["--config", str(copy), "--out", str(tmp_path / "r3")]) == 0


@pytest.mark.parametrize("name", ["REC.JSON", "results.json.bak"])
def test_a_results_json_saved_under_another_suffix_is_read_as_json(tmp_path, capsys, digits_cache, name):
    out = tmp_path / "r1"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    copy = tmp_path / name
    copy.write_bytes((out / "results.json").read_bytes())
    assert tradeoff_main(["--config", str(copy), "--out", str(tmp_path / "r2")]) == 0
    assert json.loads((tmp_path / "r2" / "results.json").read_text())["config"]["clients"] == 20


def test_an_interrupted_sweep_whose_partial_move_fails_names_one_place(tmp_path, monkeypatch, capsys):
    from privfed.commands.common import OutputDir
    from privfed.commands.signals import keep_finished

    out_path = tmp_path / "mnt"
    out = OutputDir(str(out_path), "tradeoff", command="x")
    _mount_point(monkeypatch, out_path)

    def write_partial(records):
        out.write_json("results.partial.json", {"records": records})
        out.checkpoint()

    try:
        raise KeyboardInterrupt
    except BaseException:
        keep_finished(out, [{"a": 1}, {"a": 2}], write_partial, "x", "privfed.tradeoff")
    err = capsys.readouterr().err.strip()
    (kept,) = tmp_path.iterdir()  # the partial run alone: no spill, no scratch, no lock
    assert kept.name.startswith("mnt.unplaced-") and f"kept in '{kept}'" in err
    assert "no checkpoint" not in err and len(err.splitlines()) == 1, err
    assert len(json.loads((kept / "results.partial.json").read_text())["records"]) == 2


def test_the_flower_app_keeps_a_release_it_cannot_move_into_out(tmp_path, monkeypatch):
    """The Flower server's writer: the nodes have already spent budget on this release, so its files must
    survive a failed move (before: the staging folder was discarded)."""
    from privfed.flower.server_app import write_outputs

    out = tmp_path / "mnt"
    _mount_point(monkeypatch, out)
    head = SimpleNamespace(weight=np.ones((2, 3)), bias=np.zeros(2))
    with pytest.raises(results_io.ResultsWriteError, match="Device or resource busy") as exc:
        write_outputs(SimpleNamespace(head=head, report={"rounds": 1}), str(out))
    kept = exc.value.kept
    assert kept.name.startswith("mnt.unplaced-") and verify_folder(kept)["complete"] is True
    assert np.load(kept / "head.npz")["weight"].tolist() == head.weight.tolist()
    assert json.loads((kept / "report.json").read_text()) == {"rounds": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]


@pytest.mark.parametrize("then", ["salvage", "discard"])
def test_a_run_that_cannot_leave_its_staging_folder_stays_there_as_named(tmp_path, monkeypatch, then):
    out = tmp_path / "mnt"
    run = ResultFolder(out)
    run.write("head.npz", lambda p: p.write_bytes(b"weights"))
    _mount_point(monkeypatch, out, siblings=True)
    with pytest.raises(results_io.ResultsWriteError) as exc:
        run.publish(complete=True)
    kept = exc.value.kept
    assert kept == run.staging and f"its files are kept in '{kept}'" in str(exc.value)
    getattr(run, then)()  # what the commands and the Flower app do next: neither moves nor removes it
    assert verify_folder(kept)["complete"] is True and (kept / "head.npz").read_bytes() == b"weights"


@pytest.mark.parametrize("damage", ["[]", "", "{}"], ids=["list", "empty", "object"])
def test_a_broken_manifest_is_no_way_past_the_replay_check(tmp_path, capsys, digits_cache, damage):
    """Before: a manifest damaged to [] (or emptied) no longer listed results.json, so an edited results.json in
    its run folder was replayed unchecked."""
    out = tmp_path / "r1"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    rec = json.loads((out / "results.json").read_text())
    rec["config"]["epsilons"] = [5.0]  # the edit the check exists to catch
    (out / "results.json").write_text(json.dumps(rec))
    (out / "manifest.json").write_text(damage)
    capsys.readouterr()
    assert tradeoff_main(["--config", str(out / "results.json"), "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "manifest.json" in err and "pass a copy of the file outside its run folder" in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "r2").exists()


def test_an_entry_dropped_from_the_manifest_is_no_way_past_the_replay_check_but_another_tools_is_no_run(
    tmp_path, capsys, digits_cache
):
    """The review of the check above: a privfed manifest that no longer listed results.json let the edited file
    be replayed; a results.json copied beside another tool's manifest was refused as a damaged privfed run."""
    out = tmp_path / "r1"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    rec = json.loads((out / "results.json").read_text())
    rec["config"]["epsilons"] = [5.0]
    (out / "results.json").write_text(json.dumps(rec))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if f["name"] != "results.json"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert tradeoff_main(["--config", str(out / "results.json"), "--out", str(tmp_path / "r2")]) == 2
    assert "pass a copy of the file outside its run folder" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"tool": "dvc", "files": []}))
    (other / "results.json").write_text(json.dumps(rec))
    assert tradeoff_main(["--config", str(other / "results.json"), "--out", str(tmp_path / "r3")]) == 0
