"""One toolkit: the three commands share their flags (one name, one meaning, one default, read from each
command's --help), the Flower app's run-config keys carry the same names, method names are taken in any
case with a "did you mean" for a typo, and --help answers in well under a second."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from privfed.commands import options as cli_args
from privfed.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("tradeoff", "attack", "flower")
PARSERS = {
    "tradeoff": cli_args.tradeoff_parser,
    "attack": cli_args.attack_parser,
    "flower": cli_args.flower_parser,
}


def _help(command: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    res = subprocess.run(
        [sys.executable, "-m", f"privfed.{command}", "--help"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _options(help_text: str) -> dict[str, str]:
    """flag -> its help text (one line, whitespace collapsed), read from --help output."""
    body = help_text.split("options:", 1)[1]
    out: dict[str, str] = {}
    current = None
    for line in body.splitlines():
        m = re.match(r"^  (--[\w-]+)(.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2)
        elif current and line.startswith("      "):
            out[current] += " " + line.strip()
        elif not line.strip():
            current = None
    return {k: " ".join(v.split()) for k, v in out.items()}


def _default(text: str) -> str:
    m = re.search(r"\(default: (.*)\)$", text)
    assert m, text
    return m.group(1)


@pytest.fixture(scope="module")
def helps() -> dict[str, dict[str, str]]:
    return {c: _options(_help(c)) for c in COMMANDS}


def test_listed_names_are_the_registries():
    import attacks
    from privfed import methods
    from privfed.federation import available_schemes

    assert list(cli_args.METHOD_NAMES) == methods.available()
    assert list(cli_args.ATTACK_NAMES) == attacks.available()
    assert list(cli_args.PARTITION_NAMES) == available_schemes()


def test_shared_flags_have_one_name_and_one_default_in_every_help(helps):
    """Read from each command's --help: every shared flag is there, with the same default."""
    for flag in cli_args.SHARED:
        defaults = {c: _default(helps[c][flag]) for c in COMMANDS if flag in helps[c]}
        assert set(defaults) == set(COMMANDS), (flag, sorted(defaults))
        assert len(set(defaults.values())) == 1, (flag, defaults)
    for flag in cli_args.PAIRED:  # flags two commands share: where present, one default
        defaults = {c: _default(helps[c][flag]) for c in COMMANDS if flag in helps[c]}
        assert len(defaults) >= 2 and len(set(defaults.values())) == 1, (flag, defaults)
    # the federation they describe, as --help states it
    tradeoff = helps["tradeoff"]
    assert [_default(tradeoff[f]) for f in ("--clients", "--partition", "--alpha", "--eps", "--seeds")] == [
        "100",
        "dirichlet",
        "0.1",
        "0.1",
        "1 (seed 0)",
    ]
    for old in ("--secure", "--output", "--epsilon", "--seed", "--method-params"):  # hidden older spellings
        assert not any(old in h for h in helps.values()), old


def test_the_three_commands_resolve_the_same_federation_by_default():
    from privfed.attack import resolve_config as attack_config
    from privfed.commands.flower import resolve_config as flower_config
    from privfed.tradeoff import resolve_config as tradeoff_config

    t = tradeoff_config(cli_args.tradeoff_parser().parse_args([]))
    a = attack_config(cli_args.attack_parser().parse_args(["--attack", "tracing"]))
    f, _ = flower_config(cli_args.flower_parser().parse_args([]))
    assert (t.dataset, t.clients, t.partition, t.alpha, t.epsilons, t.delta, t.level, t.seeds) == (
        a.dataset,
        a.clients,
        a.partition,
        a.alpha,
        a.epsilons,
        a.delta,
        a.level,
        a.seeds,
    )
    assert (
        f.dataset,
        f.clients,
        f.partition,
        f.alpha,
        (f.epsilon,),
        f.delta,
        f.level,
        (f.partition_seed,),
    ) == (
        t.dataset,
        t.clients,
        t.partition,
        t.alpha,
        t.epsilons,
        t.delta,
        t.level,
        t.seeds,
    )
    assert t.methods == a.methods == (f.method,) and t.secure_agg == a.secure_agg == f.secure
    from privfed.flower.config import public_clip
    from privfed.tradeoff import digits_public_clip

    assert f.clip == public_clip("digits") == digits_public_clip()  # the same default clip, no privacy cost


def test_flower_run_config_keys_are_the_flag_names_with_the_same_defaults():
    import flwr.supercore.constant as flwr_constants

    from privfed.flower.config import FlowerConfig

    app = tomllib.loads((REPO / "privfed" / "flower" / "app" / "pyproject.toml").read_text())
    keys = app["tool"]["flwr"]["app"]["config"]
    flags = {f.lstrip("-") for f in _flower_flags()}
    from privfed.flower.deploy.server import NODE_KEYS

    # every run-config key is a flag of the flower command, under the same name, but the deployed ServerApp's
    # node-keys: a path on a SuperLink machine, which the command's simulation has no use for
    for key in keys:
        assert key in flags or key == NODE_KEYS, key
    fed = cli_args.FEDERATION
    assert (keys["method"], keys["eps"], keys["delta"], keys["level"], keys["partition"], keys["alpha"]) == (
        fed["method"],
        fed["eps"],
        fed["delta"],
        fed["level"],
        fed["partition"],
        fed["alpha"],
    )
    assert (keys["secure-agg"], keys["seeds"], keys["dataset"]) == (
        fed["secure_agg"],
        fed["seeds"],
        fed["dataset"],
    )
    # the app waits for as many nodes as Flower's default simulation starts, so `flwr run` needs no option
    assert keys["clients"] == flwr_constants.DEFAULT_SIMULATION_CONFIG.num_supernodes
    keys = {k: v for k, v in keys.items() if k != NODE_KEYS}  # the deployed ServerApp takes it out first
    cfg = FlowerConfig.from_run_config(keys)
    assert (cfg.method, cfg.epsilon, cfg.partition_seed, cfg.secure, cfg.output) == (
        "fedlog",
        0.1,
        0,
        "none",
        None,
    )
    assert cfg.clip > 0  # a DP run on digits takes the public split's median norm
    for old in ("epsilon", "secure", "partition-seed", "output", "method-params"):
        with pytest.raises(ConfigError, match="unknown run-config key"):
            FlowerConfig.from_run_config({**keys, old: keys.get("eps", 1)})
    with pytest.raises(ConfigError, match="one seed"):
        FlowerConfig.from_run_config({**keys, "seeds": "3,7"})
    assert FlowerConfig.from_run_config({**keys, "seeds": "7,"}).partition_seed == 7


def _flower_flags() -> set[str]:
    return {s for a in cli_args.flower_parser()._actions for s in a.option_strings}


def test_old_spellings_still_work_in_the_flower_command():
    p = cli_args.flower_parser()
    new = p.parse_args(["--secure-agg", "mask", "--out", "d", "--eps", "2"])
    old = p.parse_args(["--secure", "mask", "--output", "d", "--epsilon", "2"])
    assert vars(new) == vars(old)
    assert p.parse_args(["--secure-agg"]).secure_agg == "mask"  # bare flag = mask, as in tradeoff / attack
    from privfed.commands.flower import resolve_config

    cfg, _ = resolve_config(
        p.parse_args(["--seed", "3", "--method-params", '{"lam": 0.5}', "--method", "fed3r"])
    )
    assert cfg.partition_seed == 3 and cfg.method_params == {"lam": 0.5}


@pytest.mark.parametrize("command", COMMANDS)
def test_method_names_in_any_case_and_a_suggestion_for_a_typo(command, capsys):
    from privfed.commands.flower import resolve_config as flower_config
    from privfed.commands.shared import method_names

    assert method_names("FedLog,FEDCOF") == ("fedlog", "fedcof")
    parse = {"tradeoff": [], "attack": ["--attack", "Tracing"], "flower": []}[command]
    args = PARSERS[command]().parse_args([*parse, "--method", "FedLog"])
    resolve = {
        "tradeoff": lambda a: __import__("privfed.tradeoff", fromlist=["x"]).resolve_config(a).methods,
        "attack": lambda a: __import__("privfed.attack", fromlist=["x"]).resolve_config(a).methods,
        "flower": lambda a: (flower_config(a)[0].method,),
    }[command]
    assert resolve(args) == ("fedlog",)
    bad = PARSERS[command]().parse_args([*parse, "--method", "fedcfo"])
    with pytest.raises(ConfigError, match=r"unknown method 'fedcfo'; did you mean fedcof\?"):
        resolve(bad)
    with pytest.raises(ConfigError, match="unknown partition scheme 'dirichelt'; did you mean dirichlet"):
        resolve(PARSERS[command]().parse_args([*parse, "--partition", "dirichelt"]))


def test_flower_eps_and_seeds_take_one_value_with_one_clear_line(capsys):
    from privfed.commands.flower import default_timeout, main

    assert main(["--eps", "1,10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "privfed.tradeoff --eps LIST" in err[0]
    assert main(["--seeds", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one seed" in err[0] and "privfed.tradeoff" in err[0]
    assert default_timeout(10, "none") == 220 and default_timeout(10, "mask") == 440


def test_flower_num_cpus_past_the_machine_is_one_line_before_ray_starts(capsys, monkeypatch):
    """Ray starts a worker for every CPU it is told of: --num-cpus 1000 on two cores ran about seventy workers and
    hung past the run's timeout.  The command and both simulation entry points refuse a count past the CPUs
    this process may use (its affinity, which a container's cpuset narrows) before anything starts."""
    from privfed.commands.flower import main
    from privfed.flower import FlowerConfig, run_simulation
    from privfed.flower import config as flower_config
    from privfed.flower.simulation import flwr_run

    monkeypatch.setattr(flower_config.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert flower_config.usable_cpus() == 2
    for bad in ("3", "0"):
        assert main(["--clients", "3", "--num-cpus", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1
            and "--num-cpus must be an integer from 1 to the 2 CPU(s) this process may use" in err[0]
        )
    for bad in (3, 0, 1.5, True):
        with pytest.raises(ConfigError, match=r"^num_cpus must be an integer from 1 to the 2 CPU"):
            run_simulation(FlowerConfig(method="fedncm", clients=3), num_cpus=bad)
        with pytest.raises(ConfigError, match=r"^num_cpus must be an integer from 1 to the 2 CPU"):
            flwr_run({}, num_supernodes=3, num_cpus=bad)


def test_flwr_secaggplus_advice_names_a_flag_that_exists(capsys):
    from privfed.commands.flower import main

    assert main(["--secure-agg", "flwr-secaggplus", "--eps", "inf"]) == 2
    err = capsys.readouterr().err
    advised = set(re.findall(r"(--[a-z-]+) mask", err))
    assert advised == {"--secure-agg"} and advised <= _flower_flags(), err


def _cpu_seconds(argv: list[str], env: dict) -> tuple[float, str, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, res.stdout, res.stderr


@pytest.mark.parametrize("command", ["privfed.tradeoff", "privfed.attack", "privfed.flower"])
def test_help_is_fast_and_imports_nothing_heavy(command):
    """--help in well under a second: its CPU time (load on a busy machine adds wall time, not CPU time) at
    most 0.5 s above a bare interpreter's start measured in the same test, the best of three runs each,
    and neither numpy nor anything numerical or Flower imported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = (
        "import runpy, sys; sys.argv = [sys.argv[0], '--help']\n"
        "try:\n    runpy.run_module(%r, run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('numpy', 'scipy', 'sklearn', 'torch', 'flwr', 'privfed.methods', 'attacks') "
        "if m in sys.modules)\nprint('HEAVY', heavy, file=sys.stderr)\n"
    ) % command
    bare = min(_cpu_seconds([sys.executable, "-c", "pass"], env)[0] for _ in range(3))
    runs = [_cpu_seconds([sys.executable, "-c", probe], env) for _ in range(3)]
    took = min(r[0] for r in runs)
    assert "usage:" in runs[0][1] and "HEAVY []" in runs[0][2], runs[0][2]
    assert took - bare < 0.5, (took, bare)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", command, "--help"], env=env, capture_output=True, cwd=REPO)
    assert time.perf_counter() - t < 1.0 + 20 * bare  # wall time: under a second plus the machine's load


def test_below_chance_rows_are_named_with_their_reason():
    from privfed.tradeoff import below_chance_line

    row = dict(
        method="fedlog",
        placement="local",
        epsilon=0.1,
        private=True,
        accuracy_mean=0.09,
        accuracy_std=0.05,
        seeds=5,
        rounds=1,
    )
    assert below_chance_line([{**row, "accuracy_mean": 0.5}], 10) is None
    line = below_chance_line([row], 10)
    assert "fedlog local eps=0.1" in line and "within the spread" in line
    far = below_chance_line([{**row, "accuracy_std": 0.001}], 10)  # 0.091 < 0.1: beyond the spread
    assert "worse than guessing" in far
    one = below_chance_line([{**row, "seeds": 1, "accuracy_std": 0.0, "rounds": 5}], 10)
    assert "fedlog x5 rounds local eps=0.1" in one and "one seed" in one
    # rows of different reasons each under their own (a mixed list had the last reason for all)
    mixed = below_chance_line(
        [row, {**row, "method": "fedcof", "accuracy_mean": 0.04, "accuracy_std": 0.03}], 10
    )
    within, beyond = mixed.split("; in ")
    assert "fedlog local eps=0.1: chance lies within the spread" in within
    assert beyond.startswith("fedcof local eps=0.1: below chance beyond the spread")


def test_help_names_every_inversion_backend_without_importing_the_attacks():
    """--help lists the inversion backends and suite from constants; they are the attacks' own."""
    from attacks.inversion.attack import BACKENDS
    from attacks.strongest import PER_CELL, SUITES
    from privfed.commands.options import INVERSION_BACKENDS, INVERSION_SUITE

    assert INVERSION_BACKENDS == tuple(BACKENDS)
    assert INVERSION_SUITE == (*SUITES["inversion"], PER_CELL)


@pytest.mark.parametrize(
    "line, message",
    [
        ('param = "fedcof.gamma=0.1"', "a settings file writes 'param' as the table method_params"),
        ("no_plot = true", "a settings file writes 'no_plot' as plot = false"),
        (
            'out = "x"',
            "'out' is a run option, not a setting of the experiment: pass --out on the command line",
        ),
        ("overwrite = true", "pass --overwrite on the command line"),
        ("quiet = true", "pass --quiet on the command line"),
    ],
)
def test_a_settings_file_key_spelled_like_a_flag_it_takes_otherwise_is_named(tmp_path, capsys, line, message):
    """--config's help said keys are named like the flags, but param, no_plot, out, overwrite and quiet were
    refused in a list of unknown settings."""
    from privfed.tradeoff import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(line + "\n")
    assert main(["--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_each_commands_help_speaks_of_its_own_flags_only():
    """The attack's --clip help named multi-round FedLog's --rounds, which the attack has no flag for, and the
    trade-off's --clients spoke of Flower's SuperNodes."""
    from privfed.commands.options import _PARSERS

    helps = {
        name: " ".join(_PARSERS[name]().format_help().split()) for name in ("tradeoff", "attack", "flower")
    }
    assert "--rounds" not in helps["attack"] and "SuperNodes" not in helps["attack"]
    assert "SuperNodes" not in helps["tradeoff"] and "multi-round FedLog (--rounds > 1)" in helps["tradeoff"]
    assert "number of clients (simulated SuperNodes)" in helps["flower"]
