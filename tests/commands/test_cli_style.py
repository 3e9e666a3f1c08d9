"""One command style: the three commands share flag names, show defaults, keep old spellings, and
answer --help in well under a second."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privfed.commands import options as cli_args

REPO = Path(__file__).resolve().parents[2]
PARSERS = {
    "tradeoff": cli_args.tradeoff_parser,
    "attack": cli_args.attack_parser,
    "flower": cli_args.flower_parser,
}


def _flags(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if a.help != "==SUPPRESS=="}


def test_listed_names_are_the_registries():
    import attacks
    from privfed import methods

    assert list(cli_args.METHOD_NAMES) == methods.available()
    assert list(cli_args.ATTACK_NAMES) == attacks.available()


def test_shared_concepts_have_one_flag_name():
    flags = {name: _flags(make()) for name, make in PARSERS.items()}
    for flag in (
        "--method",
        "--eps",
        "--delta",
        "--clip",
        "--clients",
        "--partition",
        "--alpha",
        "--secure-agg",
        "--out",
    ):
        assert all(flag in f for f in flags.values()), flag
    for old in ("--secure", "--output", "--epsilon"):  # older spellings: hidden, not shown in --help
        assert not any(old in f for f in flags.values()), old


def test_old_spellings_still_work_in_the_flower_command():
    p = cli_args.flower_parser()
    new = p.parse_args(["--secure-agg", "mask", "--out", "d", "--eps", "2"])
    old = p.parse_args(["--secure", "mask", "--output", "d", "--epsilon", "2"])
    assert vars(new) == vars(old)
    from privfed.commands.flower import main

    assert main(["--param", "fedcof.nope=1", "--method", "fedncm"]) == 2  # a method other than --method
    assert p.parse_args(["--secure-agg"]).secure == "mask"  # bare flag = mask, as in tradeoff / attack


def test_help_shows_every_default_and_one_neighbouring_relation():
    for name, make in PARSERS.items():
        text = make().format_help()
        assert "zero-out" in text or name == "attack", name  # the ledger's word for the client level
        assert "add/remove one client" not in text
        fmt = cli_args.HelpFormatter("x")
        for action in make()._actions:
            if (
                not action.option_strings
                or action.help == "==SUPPRESS=="
                or action.nargs == 0
                or action.required
            ):
                continue  # positional, hidden, required, or a switch (off unless given)
            assert "default" in fmt._get_help_string(action).lower(), (name, action.dest)
    tradeoff = " ".join(cli_args.tradeoff_parser().format_help().split())
    assert "20% of its samples held out" in tradeoff and "floor(N/K)" in tradeoff and "natural" in tradeoff


def test_flower_eps_list_is_one_clear_line(capsys):
    from privfed.commands.flower import default_timeout, main

    assert main(["--eps", "1,10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "privfed.tradeoff --eps LIST" in err[0]
    assert default_timeout(10, "none") == 220 and default_timeout(10, "mask") == 440


@pytest.mark.parametrize("command", ["privfed.tradeoff", "privfed.attack", "privfed.flower"])
def test_help_is_fast_and_imports_nothing_heavy(command):
    """--help in under a second: the best of three runs against a bare interpreter's start measured in the
    same test (the help may cost at most 1 s more), and no numerical or Flower module is imported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = (
        "import runpy, sys; sys.argv = [sys.argv[0], '--help']\n"
        "try:\n    runpy.run_module(%r, run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('scipy', 'sklearn', 'torch', 'flwr', 'privfed.methods', 'attacks') "
        "if m in sys.modules)\nprint('HEAVY', heavy, file=sys.stderr)\n"
    ) % command

    def best_of_3(argv):  # the fastest of three runs: load spikes on a busy machine only ever add time
        times, res = [], None
        for _ in range(3):
            t = time.perf_counter()
            res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
            times.append(time.perf_counter() - t)
        return min(times), res

    bare, _ = best_of_3([sys.executable, "-c", "pass"])
    took, res = best_of_3([sys.executable, "-c", probe])
    assert "usage:" in res.stdout and "HEAVY []" in res.stderr, res.stderr
    assert took - bare < 1.0, (took, bare)


def test_below_chance_rows_are_named_with_their_reason():
    from privfed.tradeoff import below_chance_line

    row = dict(
        method="fedlog", placement="local", epsilon=0.1, private=True, accuracy_mean=0.09, accuracy_std=0.05
    )
    assert below_chance_line([{**row, "accuracy_mean": 0.5}], 10) is None
    line = below_chance_line([row], 10)
    assert "fedlog local eps=0.1" in line and "within the spread" in line
    far = below_chance_line([{**row, "accuracy_std": 0.001}], 10)  # 0.091 < 0.1: beyond the spread
    assert "worse than guessing" in far


def test_help_names_every_inversion_backend_without_importing_the_attacks():
    """--help lists the inversion backends and suite from constants; they are the attacks' own."""
    from attacks.inversion.attack import BACKENDS
    from attacks.strongest import PER_CELL, SUITES
    from privfed.commands.options import INVERSION_BACKENDS, INVERSION_SUITE

    assert INVERSION_BACKENDS == tuple(BACKENDS)
    assert INVERSION_SUITE == (*SUITES["inversion"], PER_CELL)
