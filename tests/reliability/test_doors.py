"""The commands' doors: contradictory options, output links, special files, a disk that fills mid-run,
seeds, complex data and Ctrl-C during start-up.

Each case states what a user must see: one line naming what is wrong (both options of a contradiction),
or the work that finished kept where the message says, and never a traceback, a hang, a stray file or
a result that says something other than what ran.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from privfed.errors import ConfigError, InputError, PrivfedError

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--clients", "10", "--seeds", "1", "--quiet", "--no-plot"]


# ---------------------------------------------------------------- contradictory options, refused as one configuration
TRADEOFF_CONFLICTS = [
    (["--count-noise", "laplace", "--level", "client", "--max-records", "50"], "--count-noise", "--level"),
    (["--count-noise", "laplace", "--secure-agg", "mask"], "--count-noise", "--secure-agg"),
    (["--count-noise", "laplace", "--trusted-aggregator"], "--count-noise", "--trusted-aggregator"),
    (["--count-noise", "laplace", "--clip", "3"], "--count-noise", "--clip"),
    (["--count-noise", "geometric", "--clip", "3", "--clip-norm", "coordinate"], "--count-noise", "--clip"),
    (["--count-noise", "laplace", "--calibration", "classic"], "--count-noise", "--calibration"),
    (["--trusted-aggregator", "--secure-agg", "mask"], "--trusted-aggregator", "--secure-agg"),
    (["--trusted-aggregator", "--secure-agg", "ckks"], "--trusted-aggregator", "--secure-agg"),
    (["--placement", "local", "--secure-agg", "mask"], "--placement", "--secure-agg"),
    (["--placement", "trusted", "--secure-agg", "ckks"], "--placement", "--secure-agg"),
    (["--placement", "all", "--secure-agg", "mask"], "--placement", "--secure-agg"),
    (["--max-records", "4"], "--max-records", "--level"),
]


@pytest.mark.parametrize("extra,first,second", TRADEOFF_CONFLICTS)
def test_tradeoff_refuses_a_contradiction_before_any_work_naming_both_options(extra, first, second):
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError) as exc:
        resolve_config(build_parser().parse_args(["--method", "fedcof", "--eps", "0.5", *extra]))
    text = str(exc.value)
    assert first in text and second in text and "\n" not in text, text


@pytest.mark.parametrize(
    "extra,first,second",
    [
        (["--count-noise", "laplace", "--secure-agg", "mask"], "--count-noise", "--secure-agg"),
        (["--count-noise", "laplace", "--clip", "2"], "--count-noise", "--clip"),
    ],
)
def test_attack_refuses_the_same_contradictions(extra, first, second):
    from privfed.attack import build_parser, resolve_config

    with pytest.raises(ConfigError) as exc:
        resolve_config(build_parser().parse_args(["--attack", "tracing", "--method", "fedncm", *extra]))
    assert first in str(exc.value) and second in str(exc.value)


@pytest.mark.parametrize(
    "extra,first,second",
    [
        (["--trusted-aggregator", "--secure-agg", "mask"], "--trusted-aggregator", "--secure-agg"),
        (
            ["--trusted-aggregator", "--secure-agg", "ckks", "--eps", "inf"],
            "--trusted-aggregator",
            "--secure-agg",
        ),
        (["--max-records", "5"], "--max-records", "--level"),
    ],
)
def test_flower_command_refuses_the_same_contradictions(extra, first, second):
    from privfed.commands.flower import build_parser, resolve_config

    with pytest.raises(ConfigError) as exc:
        resolve_config(build_parser().parse_args(["--method", "fedncm", "--clients", "4", *extra]))
    assert first in str(exc.value) and second in str(exc.value)


def test_flower_run_config_refuses_them_by_key_whatever_the_budget():
    from privfed.flower.config import FlowerConfig

    for eps in (
        1.0,
        float("inf"),
    ):  # without DP a trusted aggregator beside secure aggregation is no less wrong
        with pytest.raises(ConfigError, match="^trusted-aggregator contradicts secure-agg mask"):
            FlowerConfig(
                method="fedncm", clients=4, secure="mask", trusted_aggregator=True, epsilon=eps, clip=1.0
            )
    with pytest.raises(ConfigError, match="^max-records 5 contradicts level record"):
        FlowerConfig(method="fedncm", clients=4, max_records=5, epsilon=1.0, clip=1.0)
    # Flower's SecAgg+ takes max-records as its public scaling bound at record level: no contradiction
    FlowerConfig(method="fedncm", clients=4, secure="flwr-secaggplus-insecure", clip=1.0, max_records=5)


def test_the_python_api_refuses_a_trusted_aggregator_under_secure_aggregation():
    import mechanisms
    import privfed
    from mechanisms.secagg import PairwiseMasking

    rng = np.random.default_rng(0)
    F, y, k = rng.normal(size=(40, 3)), np.arange(40) % 2, np.arange(40) % 4
    mech = mechanisms.GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, trusted_aggregator=True)
    with pytest.raises(ConfigError, match="trusted_aggregator=True contradicts secure_agg"):
        privfed.fit(
            "fedncm", F, y, k, num_classes=2, num_clients=4, privacy=mech, secure_agg=PairwiseMasking()
        )


# ---------------------------------------------------------------- results state what ran
def test_count_noise_rows_are_not_private_and_record_level_as_the_report_says(tmp_path, digits_cache):
    from privfed.tradeoff import main

    out = tmp_path / "cn"
    assert (
        main(["--method", "fedcof", "--eps", "0.5", "--count-noise", "laplace", *SMALL, "--out", str(out)])
        == 0
    )
    (row,) = json.loads((out / "results.json").read_text())["records"]
    assert row["private"] is False and row["level"] == "record" and row["protocol"] == "none"
    assert row["guarantee"].startswith("NO DP GUARANTEE") and "at record level" in row["guarantee"]


def test_multi_round_record_states_the_clip_it_ran_with(tmp_path, monkeypatch, digits_cache):
    """privfed.rounds clips 2 per coordinate when --clip is not given: the record says so, not l2 / null."""
    from types import SimpleNamespace

    import privfed.rounds as fr
    from privfed.tradeoff import main

    seen = []

    def run_rounds(cfg, *, seed, epsilon, progress, noise_seed=None):
        seen.append((cfg.clip, cfg.clip_norm, cfg.placement))
        rep = None
        if np.isfinite(epsilon):
            rep = SimpleNamespace(
                epsilon=epsilon, sigma=1.0, placement="local", level="record", is_private=True,
                guarantee=f"({epsilon:g}, 1e-05)-DP at record level",
            )  # fmt: skip
        one = {"personalised": 0.5, "common": 0.4, "privacy": rep, "upload_bytes_total": 10}
        return SimpleNamespace(
            personalised_accuracy=0.6, common_accuracy=0.5, privacy=rep, bytes={"upload_total": 40},
            baselines={"oneshot": one}, attacks=None,
        )  # fmt: skip

    monkeypatch.setattr(fr, "run_rounds", run_rounds)
    out = tmp_path / "r"
    argv = ["--method", "fedlog", "--rounds", "3", "--eps", "1", "--clients", "4", "--seeds", "1", "--quiet"]
    assert main([*argv, "--no-plot", "--out", str(out)]) == 0
    rec = json.loads((out / "results.json").read_text())
    assert {s for s in seen} == {(2.0, "coordinate", "local")}
    assert (rec["config"]["clip"], rec["config"]["clip_norm"], rec["config"]["placements"]) == (
        2.0,
        "coordinate",
        [],
    )
    assert {r["clip"] for r in rec["records"]} == {2.0}


# ---------------------------------------------------------------- paths: a linked --out, special files
def test_a_symlinked_out_fills_its_target_and_stays_a_link(tmp_path, digits_cache):
    from privfed.results.writer import verify_folder
    from privfed.tradeoff import main

    target, link = tmp_path / "target", tmp_path / "link"
    target.mkdir()
    link.symlink_to(target, target_is_directory=True)
    for extra in ([], ["--overwrite"]):  # a new run, then one replacing it
        assert main(["--method", "fedncm", "--eps", "1", *SMALL, "--out", str(link), *extra]) == 0
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert sorted(p.name for p in target.iterdir()) == ["manifest.json", "results.csv", "results.json"]
        verify_folder(target)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]  # no staging link or folder
    # a dangling link: the run makes its target
    dangling = tmp_path / "later"
    (tmp_path / "to").symlink_to(dangling)
    assert main(["--method", "fedncm", "--eps", "1", *SMALL, "--out", str(tmp_path / "to")]) == 0
    assert (tmp_path / "to").is_symlink() and (dangling / "results.json").is_file()


@pytest.fixture()
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def _within(seconds: float, fn):
    """Run fn in a thread; a hang fails the test instead of blocking the suite."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        with open(os.environ["PRIVFED_TEST_FIFO"], "wb"):  # unblock the reader so the thread ends
            pass
        pytest.fail(f"the read hung on a FIFO for {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_fifo_config_is_refused_at_once(fifo, monkeypatch):
    from privfed.commands.shared import load_config_file

    monkeypatch.setenv("PRIVFED_TEST_FIFO", str(fifo))
    with pytest.raises(InputError, match="--config .*FIFO"):
        _within(5, lambda: load_config_file(str(fifo)))


def test_fifo_roster_identity_and_ledger_are_refused_at_once(fifo, tmp_path, monkeypatch):
    from mechanisms.secagg.identity import Identity, Roster
    from privfed.results.ledger import NodeLedger

    monkeypatch.setenv("PRIVFED_TEST_FIFO", str(fifo))
    with pytest.raises(InputError, match="secagg-roster=.*FIFO"):
        _within(5, lambda: Roster.load(fifo))
    with pytest.raises(InputError, match="secagg-identity=.*FIFO"):
        _within(5, lambda: Identity.load(fifo))
    with pytest.raises(PrivfedError, match="FIFO"):
        _within(5, lambda: NodeLedger.open(fifo, b"roster"))


def test_fifo_in_a_result_folder_is_never_waited_on(fifo, tmp_path, monkeypatch):
    from privfed.results.files import manifest_names, verify_folder

    monkeypatch.setenv("PRIVFED_TEST_FIFO", str(fifo))
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / "manifest.json")
    monkeypatch.setenv("PRIVFED_TEST_FIFO", str(folder / "manifest.json"))
    assert _within(5, lambda: manifest_names(folder)) is None
    with pytest.raises(InputError, match="FIFO"):
        _within(5, lambda: verify_folder(folder))


# ---------------------------------------------------------------- a disk that fills mid-run
def test_a_disk_that_fills_mid_sweep_keeps_every_finished_run(tmp_path, monkeypatch, capsys, digits_cache):
    """The writer fails with ENOSPC after the first checkpoint: the checkpoint is moved into place, every
    finished run is written to the temporary folder, and no work folder, staging folder or lock is left."""
    import tempfile

    import privfed.results.writer as writer
    from privfed.tradeoff import main

    real, writes = writer.atomic_write, [0]

    def full_after_three(final, write):
        writes[0] += 1
        if writes[0] > 3:  # results.partial.csv, .json and the manifest of the first checkpoint fit

            def write(p):
                raise OSError(errno.ENOSPC, "No space left on device")

        return real(final, write)

    monkeypatch.setattr(writer, "atomic_write", full_after_three)
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    runs = tmp_path / "runs"
    runs.mkdir()
    out = runs / "out"
    rc = main(["--method", "fedncm", "--eps", "0.5,1,2,4", "--seeds", "2", "--clients", "10", "--quiet",
               "--no-plot", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    assert sorted(p.name for p in runs.iterdir()) == ["out"]  # no .privfed-work / staging / lock
    kept = json.loads((out / "results.partial.json").read_text())
    assert len(kept["records"]) == 1 and kept["complete"] is False
    (spilled,) = list(spill.iterdir())
    rows = json.loads(spilled.read_text())["records"]
    assert len(rows) == 8 and len({(r["epsilon"], r["seed"]) for r in rows}) == 8
    assert f"the last checkpoint is in {out}" in err and f"all 8 finished run(s) are in {spilled}" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- sizes, seeds, types
@pytest.mark.parametrize(
    "seeds,words",
    [("99999999999999999999999", "count of more than"), ("3,18446744073709551616", r"0\.\.2\*\*64 - 1")],
)
def test_seeds_beyond_range_are_one_line_before_work(seeds, words):
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match=words):
        resolve_config(build_parser().parse_args(["--seeds", seeds]))


def test_sweep_refuses_a_release_that_cannot_fit_before_computing(monkeypatch, digits_cache):
    from privfed.tradeoff import build_parser, resolve_config, run_tradeoff

    monkeypatch.setenv("PRIVFED_MEMORY_LIMIT", "64M")
    cfg = resolve_config(build_parser().parse_args(["--method", "fedncm", "--eps", "1", "--clients", "899",
                                                    "--secure-agg", "mask"]))  # fmt: skip
    with pytest.raises(InputError, match=r"masking 899 clients.*PRIVFED_MEMORY_LIMIT"):
        run_tradeoff(cfg, progress=False)


def test_gaussian_release_refuses_complex_and_object_features():
    import warnings

    import mechanisms

    F = np.random.default_rng(0).normal(size=(10, 3))
    mech = mechanisms.GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        for bad, word in ((F + 1j, "complex"), (F.astype(object), "object")):
            with pytest.raises(InputError, match=word):
                mech.release(bad, np.arange(10) % 2, rng=np.random.default_rng(0), num_classes=2)
    assert len(mech.ledger) == 0  # nothing was released


# ---------------------------------------------------------------- Ctrl-C during start-up
@pytest.mark.parametrize("script", [False, True], ids=["python -m", "installed script"])
@pytest.mark.parametrize("command", ["tradeoff", "attack"])
def test_ctrl_c_during_start_up_exits_130_in_one_line(command, script, tmp_path):
    """SIGINT while the command's imports run: no traceback, exit 130, nothing written; the installed scripts
    (privfed-tradeoff, privfed-attack) too, which printed a KeyboardInterrupt traceback and died of the
    signal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--eps", "1", "--out", str(tmp_path / "o")] + (
        ["--attack", "tracing"] if command == "attack" else []
    )
    start = [sys.executable, "-m", f"privfed.{command}"]
    if script:
        start = [sys.executable, str(_installed_script(command, tmp_path))]
    for delay in (0.5, 1.5):  # in the imports, and (attack) in its body
        p = subprocess.Popen(
            [*start, *args], env=env, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        text = err.decode()
        assert p.returncode == 130 and "Traceback" not in text, (delay, p.returncode, text[-400:])
        name = f"privfed-{command}" if script else f"python -m privfed.{command}"
        assert text.strip().splitlines()[-1] == f"{name}: interrupted"
        assert not (tmp_path / "o").exists() and not any(n.name.startswith(".o.") for n in tmp_path.iterdir())


_DROPPED_STOP = """
import os, signal, sys
from privfed.commands.start import exit_with, quiet_start
quiet_start("tradeoff")
import privfed.commands.tradeoff.cli as cli

real, SIG = cli._run, getattr(signal, sys.argv.pop(1))


class Dropped:
    def __del__(self):
        os.kill(os.getpid(), SIG)
        for _ in range(10_000):  # the handler runs here, inside __del__, where Python drops its exception
            pass


def run(*args):
    Dropped()
    return real(*args)


cli._run = run
exit_with(cli.main)
"""


@pytest.mark.parametrize(
    ("sig", "code", "word"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_a_stop_whose_exception_python_dropped_still_stops_the_sweep(tmp_path, sig, code, word):
    """A Ctrl-C (or SIGTERM) handled inside a __del__ or a weakref callback raised its exception where Python
    prints "Exception ignored" and drops it: the sweep ran to its end, published its results as complete and
    exited 0.  Now the stop is kept and taken at the next run's end: exit 128 + the signal, one line, the
    finished run kept as partial results."""
    driver = tmp_path / "driver.py"
    driver.write_text(_DROPPED_STOP)
    out = tmp_path / "o"
    p = subprocess.run(
        [sys.executable, str(driver), sig, "--eps", "1", *SMALL, "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == code, (p.returncode, p.stderr[-800:])
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr[-800:]
    assert word in p.stderr.strip().splitlines()[-1]
    assert not (out / "results.json").exists() and (out / "results.partial.json").is_file()


def _installed_script(command: str, folder) -> Path:
    """``privfed-<command>`` as pip writes it into a virtual environment's bin folder, for the entry point
    pyproject.toml declares (not an older install's)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, attr = scripts[f"privfed-{command}"].split(":")
    path = folder / f"privfed-{command}"
    path.write_text(
        f"import sys\nfrom {module} import {attr}\nif __name__ == '__main__':\n    sys.exit({attr}())\n"
    )
    return path


@pytest.mark.parametrize("command", ["tradeoff", "attack", "flower"])
def test_an_installed_script_names_itself_in_its_usage_and_errors(command, tmp_path):
    """privfed-tradeoff's --help and its errors said "usage: python -m privfed.tradeoff", a command the user
    had not typed; each now names the way it was started."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = [sys.executable, str(_installed_script(command, tmp_path))]
    for args, stream, want in (
        (["--help"], "stdout", f"usage: privfed-{command} "),
        (["--no-such-flag"], "stderr", f"privfed-{command}: error: unrecognized arguments: --no-such-flag"),
    ):
        p = subprocess.run(
            [*script, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        text = getattr(p, stream)
        assert want in text and "python -m privfed" not in text.split("\n\n")[0], (args, text[:400])
    p = subprocess.run(
        [sys.executable, "-m", f"privfed.{command}", "--help"], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert p.stdout.startswith(f"usage: python -m privfed.{command} ")


@pytest.mark.parametrize(
    "module, args, message",
    [
        (
            "experiments.fedlog_rounds",
            ["--rounds", "0"],
            "fedlog_rounds.py: error: rounds must be an integer",
        ),
        ("experiments.noise_aware", ["--eps", "-1"], "noise_aware.py: error: --eps must be > 0"),
    ],
)
def test_an_experiment_script_names_a_bad_value_in_one_line(module, args, message, tmp_path):
    """A bad value of an experiment script's flag was a 20-line traceback ending in the ConfigError."""
    r = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-500:]
    assert r.stderr.strip().splitlines()[-1].startswith(message)


@pytest.mark.parametrize(
    "command,extra,flags",
    [
        ("tradeoff", ["--clip", "1"], "--clip is a setting of"),
        ("tradeoff", ["--trusted-aggregator"], "--trusted-aggregator is a setting of"),
        ("tradeoff", ["--level", "client"], "--level client is a setting of"),
        (
            "tradeoff",
            ["--clip", "1", "--calibration", "classic"],
            "--clip, --calibration classic are settings of",
        ),
        ("attack", ["--clip", "1"], "--clip is a setting of"),
    ],
)
def test_dp_settings_without_a_finite_eps_are_refused_not_recorded(command, extra, flags):
    """--eps inf --clip 1 ran without noise and recorded clip = 1.0 (and --level client, --trusted-aggregator) in
    results.json as if the runs had used them."""
    if command == "tradeoff":
        from privfed.tradeoff import build_parser, resolve_config

        head = ["--method", "fedncm"]
    else:
        from privfed.attack import build_parser, resolve_config

        head = ["--attack", "singleton", "--method", "fedncm"]
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(flags)} the DP release, but no eps is finite \(no noise\)"
    ):
        resolve_config(build_parser().parse_args([*head, "--eps", "inf", *extra]))
    resolve_config(
        build_parser().parse_args([*head, "--eps", "1,inf" if command == "tradeoff" else "1", *extra])
    )


def test_a_dropped_stop_is_kept_in_a_python_session_too_and_never_outlives_its_command(
    tmp_path, monkeypatch, capsys, digits_cache
):
    """The review of the fix above: with Python's own Ctrl-C handler (main() called in a session, no installed
    script) a KeyboardInterrupt dropped inside a __del__ was still lost and the sweep published itself
    complete; and a stop noted outside any command (a roster draw's SIGTERM) stopped a later, unrelated call."""
    import privfed.commands.tradeoff.cli as cli
    from privfed._files import TAKEN, stop_if_taken
    from privfed.tradeoff import main

    class Dropped:
        def __del__(self):
            raise KeyboardInterrupt  # where Python drops it: printed as "Exception ignored", then lost

    real = cli._run

    def run(*args):
        Dropped()
        return real(*args)

    monkeypatch.setattr(cli, "_run", run)
    out = tmp_path / "o"
    assert main(["--eps", "1", *SMALL, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and err.strip().splitlines()[-1].endswith(": interrupted")
    assert (out / "results.partial.json").is_file() and not (out / "results.json").exists()
    monkeypatch.setattr(cli, "_run", real)
    TAKEN.append(signal.SIGTERM)  # as interruptible() notes a SIGTERM outside any command
    stop_if_taken()  # outside a command: nothing to stop
    assert main(["--eps", "1", *SMALL, "--out", str(tmp_path / "o2")]) == 0 and TAKEN == []


@pytest.mark.parametrize(
    "args",
    [
        ["--eps", "nan"],
        ["--levels", "nope"],
        ["--placements", "nope"],
        ["--pairs", "99"],
        ["--sampling", "2"],
        ["--broken", "--seeds", "0"],
        ["--table", "/nonexistent/audit.json"],
    ],
)
def test_the_audit_sweep_refuses_flags_that_would_audit_nothing_or_something_else(args, capsys):
    """Before: each ran and printed '... 0 failed' (or '0 audits, 0 wrong') with exit 0, or audited an unknown
    placement as local noise, or raised a raw FileNotFoundError."""
    from experiments.audit_sweep import main

    with pytest.raises(SystemExit) as exc:
        main(["--no-tradeoff", *args])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "Traceback" not in err and "error: --" in err.splitlines()[-1], err


def test_attacks_tracing_leaves_the_files_of_parts_it_did_not_run(tmp_path, monkeypatch):
    """Before: a --parts dp run rewrote clean.csv / clean.json (and views, local_dp) with no rows, losing an
    earlier run's results in the same --out."""
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    from experiments.attacks_tracing import main

    out = tmp_path / "o"
    assert main(["--trials", "20", "--parts", "clean", "--out", str(out)]) == 0
    clean = (out / "clean.json").read_bytes()
    assert json.loads(clean)["rows"]
    assert main(["--trials", "20", "--parts", "dp", "--out", str(out)]) == 0
    assert (out / "clean.json").read_bytes() == clean and (out / "dp.json").is_file()
    assert not (out / "views.json").exists()


@pytest.mark.parametrize(
    ("script", "flag"),
    [
        ("attacks_labels", "--seeds"),
        ("attacks_singleton", "--seeds"),
        ("methods_table", "--seeds"),
        ("noise_aware", "--seeds"),
        ("fedlog_rounds", "--seeds"),
        ("bench_tradeoff", "--repeats"),
    ],
)
def test_experiment_scripts_refuse_zero_runs(script, flag, monkeypatch, capsys):
    """Before: 0 (or fewer) ran nothing and printed a table of NaN, an empty CSV or a raw error, with exit 0."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    main = importlib.import_module(f"experiments.{script}").main
    with pytest.raises(SystemExit) as exc:
        main([flag, "0"])
    assert exc.value.code == 2 and f"{flag} must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("eps", "word"), [("abc", "not a number"), ("1,", "malformed list"), ("inf", "not allowed")]
)
def test_noise_aware_names_a_budget_it_cannot_run(eps, word, monkeypatch, capsys):
    """Before: a ValueError or OverflowError traceback (inf), after the error message suggested inf."""
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    from experiments.noise_aware import main

    with pytest.raises(SystemExit) as exc:
        main(["--eps", eps])
    assert exc.value.code == 2 and word in capsys.readouterr().err
