"""The attack command says before it starts how long its sweep will take and why, from measured rates."""

from __future__ import annotations

import pytest

import privfed.commands.attack.prepare as prepare
from privfed.attack import main as attack_main
from privfed.commands.options import ATTACK_EXAMPLE


def test_rates_are_the_recorded_measurement():
    from experiments import recorded

    rec = recorded.load("attack_cost")
    assert prepare.RATES == rec["data"]["rates"]
    assert rec["data"]["example"] == ATTACK_EXAMPLE  # measured on the example --help shows
    assert prepare.RATES["feature_step_s"] > 0 and all(v > 0 for v in prepare.RATES["set_step_s"].values())


def test_the_estimate_adds_training_and_the_suite():
    plan = prepare.SweepPlan(
        needed=[("feature", None), ("set", 2), ("set", 5)],
        missing=[("feature", None), ("set", 5)],
        releases=3,
        cells=[1, 2, 5] * 10,
        train_s=600.0,
        attack_s=900.0,
    )
    from privfed.commands.attack.config import AttackConfig

    note = prepare.cost_note(AttackConfig(attack="inversion"), plan)
    assert note.startswith("this sweep takes about 25 minutes")  # (600 + 900) / 60
    assert "trains 2 decoder(s)" in note and "the feature decoder, set decoders for n=5" in note
    assert (
        "about 10 minutes, once: they are cached" in note
        and "30 cell(s) of 3 release(s) (about 15 minutes)" in note
    )
    assert "--no-strongest" in note
    quick = prepare.SweepPlan(releases=3, cells=[1] * 30, attack_s=30.0)
    assert prepare.cost_note(AttackConfig(attack="inversion", strongest=False), quick) is None


def test_the_help_example_says_how_long_before_it_trains_anything(tmp_path, monkeypatch, capsys):
    """Cold cache: the run names the decoders it will train and the minutes, then starts training."""
    monkeypatch.setenv("PRIVFED_CACHE", str(tmp_path / "cache"))

    def stop(*a, **k):
        raise KeyboardInterrupt  # the line is out: stop where training would begin

    monkeypatch.setattr(prepare, "train_decoders", stop)
    assert attack_main([*ATTACK_EXAMPLE.split(), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if line.startswith("note: this sweep takes about"))
    assert "it first trains" in note and "the feature decoder" in note and "minute" in note
    assert not list((tmp_path / "cache").glob("attack-*-decoder-*.npz"))  # nothing trained before it said so


def test_a_sweep_without_the_suite_needs_no_decoder(tmp_path, monkeypatch):
    from privfed.attack import build_parser, resolve_config

    cfg = resolve_config(build_parser().parse_args([*ATTACK_EXAMPLE.split(), "--no-strongest"]))
    plan = prepare.plan_sweep(cfg, [("fedcof", 1.0, 0, 0)], lambda run: pytest.fail("no release is drawn"))
    assert plan.needed == [] and plan.missing == [] and prepare.cost_note(cfg, plan) is None
