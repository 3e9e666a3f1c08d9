"""Fault injection on both commands: signals, interrupted writes, overwrites, failed runs, bad --out.

Whatever stops a run, a result folder holds complete files only: either the
final results, or the runs that finished in ``results.partial.*`` (kept
until every final file is complete), never a truncated file, never a
temporary file, never an empty folder, and its manifest's hashes match.
(tests/reliability/test_fault_injection.py: SIGKILL, a full disk, two runs at once, read-only folders.)
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from privfed.attack import main as attack_main
from privfed.commands import common as _cli
from privfed.results.writer import verify_folder
from privfed.tradeoff import main as tradeoff_main

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--method", "fedncm", "--placement", "local", "--clients", "20", "--no-plot", "--quiet"]


def _rows(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".privfed-tmp")]


def _check_partial(folder: Path) -> int:
    """The partial files parse, agree with each other, and the manifest says the run is incomplete."""
    rows = _rows(folder / "results.partial.csv")
    data = json.loads((folder / "results.partial.json").read_text())
    assert data["complete"] is False and len(data["records"]) == len(rows) >= 1
    assert [r["seed"] for r in rows] == [str(r["seed"]) for r in data["records"]]
    manifest = verify_folder(folder)  # every file listed, every hash right, nothing else
    assert manifest["complete"] is False
    assert {"results.partial.csv", "results.partial.json"} <= {f["name"] for f in manifest["files"]}
    _no_temporaries(folder)
    return len(rows)


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C handled as in an interactive shell, whatever the test run inherited.

    A job started in the background of a non-interactive shell (``pytest ... &``, nohup, CI runners)
    inherits SIGINT *ignored*, and Python then installs no KeyboardInterrupt handler: the commands
    rightly leave it ignored.  The tests that deliver SIGINT restore the default for their duration.
    """
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _default_sigint() -> None:  # in the child, before exec: Python then turns SIGINT into KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---------------------------------------------------------------- real signals, in a subprocess
def _start(argv: list[str], tmp_path: Path) -> tuple[subprocess.Popen, list[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "privfed.tradeoff", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_default_sigint,
    )
    err: list[bytes] = []

    def pump():
        while chunk := proc.stderr.read1(4096):
            err.append(chunk)

    threading.Thread(target=pump, daemon=True).start()
    return proc, err


@pytest.mark.parametrize(
    "sig, code, delay",
    [
        (signal.SIGTERM, 143, 0.0),
        # the in-process tests below deliver both signals at chosen points of the same code, in a second each
        pytest.param(signal.SIGTERM, 143, 2.0, marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, 130, 1.0, marks=pytest.mark.slow),
    ],
)
def test_signal_mid_sweep_keeps_finished_runs(tmp_path, digits_cache, sig, code, delay):
    """SIGTERM (kill, timeout, schedulers) is handled like Ctrl-C: what finished is written, exit 128 + signal."""
    out = tmp_path / "o"
    argv = [
        "--method",
        "fedncm",
        "--placement",
        "local",
        "--eps",
        "0.5,1,2,4,8",
        "--seeds",
        "4000",
        "--clients",
        "20",
        "--no-plot",
        "--out",
        str(out),
    ]
    proc, err = _start(argv, tmp_path)
    t0 = time.monotonic()
    while b"tradeoff:" not in b"".join(err):  # the progress bar shows once the sweep has run 2 s
        assert proc.poll() is None and time.monotonic() - t0 < 90, b"".join(err)
        time.sleep(0.05)
    time.sleep(delay)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code, b"".join(err)
    stderr = b"".join(err).decode()
    assert "Traceback" not in stderr and "the sweep stopped after" in stderr
    n = _check_partial(out)
    assert n < 20000  # stopped mid-sweep (5 budgets x 4000 seeds: long enough that the bar shows first)
    assert not (out / "results.csv").exists() and not (out / "results.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_once_the_results_are_written_leaves_a_finished_run_finished(tmp_path, digits_cache, sig):
    """A signal right after the command says "wrote" either lands before the command returns, which then says
    its folder holds the complete results and exits 128 + the signal (as the Flower command does), or after,
    and the command exits with its own status 0.  The interpreter's teardown took most of a second after
    that line, and the signal then killed the finished run (status -15 or -2, nothing said)."""
    out = tmp_path / "o"
    proc, err = _start([*SMALL, "--eps", "1", "--out", str(out)], tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(b"wrote "):
            proc.send_signal(sig)
            break
    code = proc.wait(timeout=60)
    stderr = b"".join(err).decode()
    said = f"stopped after the run had finished: {out}/ holds its complete results" in stderr
    assert code == 0 or (code == 128 + sig and said), (code, stderr)
    assert verify_folder(out)["complete"] is True and "Traceback" not in stderr


# ---------------------------------------------------------------- signals delivered at chosen points, in process
def _kill_on_call(monkeypatch, target, name, sig, at):
    real = getattr(target, name)
    calls = {"n": 0}

    def wrapper(*a, **k):
        calls["n"] += 1
        if calls["n"] == at:
            os.kill(os.getpid(), sig)
            time.sleep(0.5)  # the handler raises at the next bytecode
        return real(*a, **k)

    monkeypatch.setattr(target, name, wrapper)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_signal_before_any_run_leaves_no_folder(
    tmp_path, monkeypatch, digits_cache, ctrl_c_raises, sig, code
):
    import privfed.commands.tradeoff.sweep as tr

    _kill_on_call(monkeypatch, tr, "server_head", sig, 1)
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1,2", "--seeds", "2", "--out", str(out)]) == code
    assert not out.exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_inside_the_final_csv_write(
    tmp_path, monkeypatch, capsys, digits_cache, ctrl_c_raises, sig, code
):
    """Interrupted while results.csv is written: no truncated CSV, every finished run in results.partial.*."""
    real = _cli.csv.DictWriter

    class Flaky(real):
        fired = False

        def writerow(self, row):
            if not Flaky.fired and self._rows == 5:
                Flaky.fired = True
                os.kill(os.getpid(), sig)
                time.sleep(0.5)
            self._rows += 1
            return super().writerow(row)

        def writeheader(self):
            self._rows = 0
            return super().writeheader()

    monkeypatch.setattr(_cli.csv, "DictWriter", Flaky)
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1,2,4", "--seeds", "4", "--out", str(out)]) == code
    assert Flaky.fired
    assert not (out / "results.csv").exists() and not (out / "results.json").exists()
    assert _check_partial(out) == 12  # all 3 budgets x 4 seeds had finished
    assert "results.partial.csv" in capsys.readouterr().err


def test_interrupt_after_some_final_files_keeps_partial_ones(tmp_path, monkeypatch, digits_cache):
    """Stopped while the plot is saved: every finished run is in the partial files, and the final files
    already written go (a results.json saying complete beside a folder that is not was a contradiction)."""
    import matplotlib.figure

    def boom(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", boom)
    out = tmp_path / "o"
    argv = [
        "--method",
        "fedncm",
        "--placement",
        "local",
        "--clients",
        "20",
        "--quiet",
        "--eps",
        "1,2",
        "--seeds",
        "2",
        "--out",
        str(out),
    ]
    assert tradeoff_main(argv) == 130
    assert not (out / "results.csv").exists() and not (out / "results.json").exists()
    assert _check_partial(out) == 4
    assert not (out / "tradeoff.png").exists()
    assert json.loads((out / "manifest.json").read_text())["complete"] is False


def test_attack_sweep_interrupted_keeps_finished_rows(tmp_path, monkeypatch, digits_cache):
    import attacks

    _kill_on_call(monkeypatch, attacks, "scenario", signal.SIGTERM, 3)
    out = tmp_path / "a"
    argv = [
        "--attack",
        "tracing",
        "--method",
        "fedncm",
        "--partition",
        "groups",
        "--n",
        "2",
        "--eps",
        "inf,1,2",
        "--quiet",
        "--out",
        str(out),
    ]
    assert attack_main(argv) == 143
    assert _check_partial(out) == 2


# ---------------------------------------------------------------- overwrite and failed runs
def test_overwrite_never_mixes_runs_and_keeps_the_old_one_until_the_new_is_complete(
    tmp_path, monkeypatch, capsys, digits_cache
):
    out = tmp_path / "o"
    # run 1: complete, with a plot
    assert (
        tradeoff_main(
            [
                "--method",
                "fedncm",
                "--placement",
                "local",
                "--clients",
                "20",
                "--quiet",
                "--eps",
                "1,2",
                "--seeds",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "tradeoff.png").exists()
    run1 = {p.name: p.read_bytes() for p in out.iterdir()}
    # run 2: another sweep over the same folder, interrupted: run 1 stays whole, run 2's finished part goes beside it
    import privfed.commands.tradeoff.sweep as tr

    real = tr.server_head
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(tr, "server_head", flaky)
    capsys.readouterr()
    assert tradeoff_main([*SMALL, "--eps", "4,8,16", "--seeds", "3", "--out", str(out), "--overwrite"]) == 130
    monkeypatch.setattr(tr, "server_head", real)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == run1
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("o.partial-")]
    assert len(aside) == 1 and f"{out} keeps the previous run" in capsys.readouterr().err
    assert {p.name for p in aside[0].iterdir()} == {
        "results.partial.csv",
        "results.partial.json",
        "manifest.json",
    }
    _check_partial(aside[0])
    # run 3: complete, no plot: the folder holds exactly its files (run 1's plot is gone with run 1)
    assert tradeoff_main([*SMALL, "--eps", "0.5", "--seeds", "1", "--out", str(out), "--overwrite"]) == 0
    assert {p.name for p in out.iterdir()} == {"results.csv", "results.json", "manifest.json"}
    assert [r["epsilon"] for r in _rows(out / "results.csv")] == ["0.5"]
    manifest = verify_folder(out)
    assert manifest["complete"] is True and [f["name"] for f in manifest["files"]] == [
        "results.csv",
        "results.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "o",
        aside[0].name,
    ]  # no staging, lock or old folder left


def test_overwrite_refuses_a_folder_with_other_files(tmp_path, capsys, digits_cache):
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    (out / "my_notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for main in (tradeoff_main, attack_main):
        extra = (
            ["--attack", "tracing", "--partition", "groups", "--n", "2", "--quiet"]
            if main is attack_main
            else [*SMALL, "--eps", "2"]
        )
        assert main([*extra, "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert (
            "holds files privfed did not write (my_notes.txt)" in err and len(err.strip().splitlines()) == 1
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_failed_run_leaves_no_folder_and_keeps_an_old_run(tmp_path, monkeypatch, capsys, digits_cache):
    monkeypatch.chdir(tmp_path)
    # default --out (a fresh results/ folder): a run that fails writes nothing, creates nothing
    assert (
        tradeoff_main(["--dataset", "file:/nonexistent/f.npz", "--eps", "1", "--clip", "1", "--quiet"]) == 2
    )
    assert not (tmp_path / "results").exists()
    # an old run overwritten by a run that fails before producing anything is left as it was
    out = tmp_path / "o"
    assert tradeoff_main([*SMALL, "--eps", "1", "--seeds", "1", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert (
        tradeoff_main(
            [
                "--dataset",
                "file:/nonexistent/f.npz",
                "--eps",
                "1",
                "--clip",
                "1",
                "--quiet",
                "--out",
                str(out),
                "--overwrite",
            ]
        )
        == 2
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("command", ["tradeoff", "attack"])
@pytest.mark.parametrize("case", ["file", "file-overwrite", "under-file"])
def test_out_that_cannot_be_a_folder_is_one_clear_line(tmp_path, capsys, command, case):
    f = tmp_path / "afile"
    f.write_text("x")
    out = {"file": f, "file-overwrite": f, "under-file": f / "sub"}[case]
    argv = ["--out", str(out), *(["--overwrite"] if case == "file-overwrite" else [])]
    if command == "tradeoff":
        code = tradeoff_main([*argv, "--method", "fedncm", "--quiet"])
    else:
        code = attack_main([*argv, "--attack", "tracing", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert (
        "is a file, not a folder" if case != "under-file" else "is a file, so no folder can be made"
    ) in err
    assert f.read_text() == "x"


def test_long_sweeps_checkpoint_finished_runs(tmp_path, monkeypatch, digits_cache):
    """Finished runs reach the staging folder, with a manifest, during the sweep, so even SIGKILL loses little."""
    import privfed.commands.tradeoff.cli as cli
    import privfed.commands.tradeoff.sweep as tr

    monkeypatch.setattr(cli, "CHECKPOINT_S", 0.0)  # checkpoint after every run
    out = tmp_path / "o"
    seen = []
    real = tr.server_head

    def spy(*a, **k):
        staging = [p for p in tmp_path.iterdir() if p.name.endswith(".privfed-staging")]
        assert not out.exists() and len(staging) <= 1  # nothing is published before the sweep ends
        if staging and (staging[0] / "manifest.json").exists():
            assert verify_folder(staging[0])["complete"] is False
            seen.append(len(_rows(staging[0] / "results.partial.csv")))
        return real(*a, **k)

    monkeypatch.setattr(tr, "server_head", spy)
    assert tradeoff_main([*SMALL, "--eps", "1,2,4", "--seeds", "2", "--out", str(out)]) == 0
    # server_head is called per seed for the non-private head, then per budget; before each call,
    # every run finished so far was on disk (seed 0: 0, 1, 2 done; seed 1: 3, 3, 4, 5 done)
    assert seen == [1, 2, 3, 3, 4, 5]
    assert {p.name for p in out.iterdir()} == {
        "results.csv",
        "results.json",
        "manifest.json",
    }  # removed at the end
    assert verify_folder(out)["complete"] is True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_the_parent_ignores_stays_ignored_through_checkpoints(sig):
    """A run whose parent ignores SIGINT (nohup, a background job) ignored it except while a checkpoint was
    written, where the deferring handler took it and stopped the sweep afterwards; SIGTERM likewise under
    interruptible()."""
    from privfed.commands.signals import interruptible, signals_deferred

    old = signal.signal(sig, signal.SIG_IGN)
    try:
        with interruptible():
            with signals_deferred():
                os.kill(os.getpid(), sig)
                time.sleep(0.05)
            assert signal.getsignal(sig) is signal.SIG_IGN
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
        assert signal.getsignal(sig) is signal.SIG_IGN
    except KeyboardInterrupt as exc:  # Terminated too: the ignored signal was taken (a failure, not a stop)
        pytest.fail(f"an ignored {signal.Signals(sig).name} stopped the run ({type(exc).__name__})")
    finally:
        signal.signal(sig, old)


def test_an_out_folder_whose_name_is_not_utf8_is_written(tmp_path, capsys, digits_cache):
    """A folder name of bytes that are not UTF-8 (a Latin-1 name, as the OS hands it over: surrogate escapes)
    was a UnicodeEncodeError traceback in the name-length check; its length is counted in the bytes the file
    system stores."""
    name = os.fsdecode(b"bad\xffbyte")
    assert tradeoff_main([*SMALL, "--eps", "1", "--out", str(tmp_path / name)]) == 0, capsys.readouterr().err
    verify_folder(tmp_path / name)
    assert os.listdir(os.fsencode(tmp_path)) == [b"bad\xffbyte"]


def test_a_quoted_tilde_in_out_is_the_home_folder(tmp_path, monkeypatch, capsys, digits_cache):
    """--out '~/runs' (quoted, so the shell left the tilde) made a folder named ~ in the working folder, where
    every other path privfed reads expands it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert tradeoff_main([*SMALL, "--eps", "1", "--out", "~/runs"]) == 0, capsys.readouterr().err
    assert verify_folder(tmp_path / "home" / "runs")["complete"] and not (tmp_path / "~").exists()


def test_a_deleted_working_folder_is_named_as_such(tmp_path):
    """A run started in a folder deleted under it said "file not found: [Errno 2] No such file or directory"."""
    script = f"mkdir d && cd d && rmdir ../d && exec {sys.executable} -m privfed.tradeoff --eps 1 --no-plot --quiet"
    r = subprocess.run(
        ["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-500:]
    assert r.stderr.strip().splitlines() == [
        "python -m privfed.tradeoff: error: the working folder no longer exists; cd to a folder that does"
    ]


def test_a_dangling_link_where_the_output_folder_goes_is_named(tmp_path, monkeypatch, capsys):
    """A results link to a folder that does not exist said "cannot create 'results' (File exists)"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").symlink_to(tmp_path / "nowhere")
    assert tradeoff_main([*SMALL, "--eps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"it is a link to '{tmp_path / 'nowhere'}', which does not exist" in err[0], err


def test_a_command_ends_after_its_threading_exit_hooks_ran(tmp_path):
    """exit_with ends the process without the interpreter's teardown; it must still run what that teardown runs
    first (threading's exit hooks: an executor never shut down waits there for its workers), or it hangs."""
    script = tmp_path / "tpe.py"
    script.write_text(
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from privfed.commands.start import exit_with\n"
        "def main():\n"
        "    ThreadPoolExecutor(2).submit(print, 'work done').result()\n"
        "    return 3\n"
        "exit_with(main)\n"
    )
    r = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (3, "work done\n"), r.stderr
