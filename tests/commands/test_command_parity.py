"""The three commands read their settings one way: an empty --config names no file, a settings file's keys may
be spelt as the flags are (dashes) or with underscores, a setting of the DP release without noise is refused by
the trade-off command as by the others, a Flower setting a secure run never reads is refused, and the
trade-off summary says what its records say about a run without noise."""

from __future__ import annotations

import json
import math

import pytest

from privfed.attack import build_parser as attack_parser
from privfed.attack import resolve_config as attack_resolve
from privfed.commands.flower import resolve_config as flower_resolve
from privfed.commands.options import flower_parser
from privfed.commands.tradeoff.table import summarise
from privfed.errors import ConfigError
from privfed.tradeoff import build_parser as tradeoff_parser
from privfed.tradeoff import resolve_config as tradeoff_resolve

COMMANDS = {
    "tradeoff": (tradeoff_parser, tradeoff_resolve, []),
    "attack": (attack_parser, attack_resolve, ["--attack", "tracing"]),
    "flower": (flower_parser, flower_resolve, []),
}


def _resolve(name, *argv):
    parser, resolve, extra = COMMANDS[name]
    got = resolve(parser().parse_args([*argv, *extra]))
    return got[0] if isinstance(got, tuple) else got


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_empty_config_names_no_file(name):
    with pytest.raises(ConfigError, match="--config '' does not name a file"):
        _resolve(name, "--config", "")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_settings_file_keys_as_the_flags_are_spelt_or_with_underscores(name, tmp_path):
    def secure(cfg):
        return getattr(cfg, "secure_agg", None) or cfg.secure

    default = secure(_resolve(name))
    dashed, under = tmp_path / "dashed.toml", tmp_path / "under.toml"
    dashed.write_text('secure-agg = "mask"\n')
    under.write_text('secure_agg = "mask"\n')
    assert default != "mask"  # the file's value is read, not the default
    assert secure(_resolve(name, "--config", str(dashed))) == "mask"
    assert secure(_resolve(name, "--config", str(under))) == "mask"
    both = tmp_path / "both.toml"
    both.write_text('secure-agg = "mask"\nsecure_agg = "none"\n')
    with pytest.raises(ConfigError, match="two spellings of one setting"):
        _resolve(name, "--config", str(both))


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--delta", "0.01"], "--delta"),
        (["--count-noise", "laplace"], "--count-noise laplace"),
        (["--placement", "trusted"], "--placement"),
    ],
)
def test_tradeoff_refuses_a_dp_setting_without_noise_as_the_others_do(flags, named):
    with pytest.raises(ConfigError, match=f"{named} is a setting of the DP release, but no eps is finite"):
        _resolve("tradeoff", "--eps", "inf", *flags)
    # with a finite budget the same settings are taken
    _resolve("tradeoff", "--eps", "1", *flags)


def test_a_replayed_dp_record_runs_without_noise_under_eps_inf(tmp_path):
    """A record of a DP run carries its delta, count noise and placements: replayed under --eps inf they are no
    settings the user gave, so the run goes on without them (the flags themselves are refused above)."""
    from dataclasses import asdict

    from privfed.results.record import SCHEMA

    default = _resolve("tradeoff", "--eps", "inf")
    for flags in (
        ["--count-noise", "laplace", "--placement", "local"],
        ["--delta", "1e-6", "--placement", "all"],
    ):
        cfg = _resolve("tradeoff", "--eps", "1", *flags)
        path = tmp_path / "results.json"
        path.write_text(
            json.dumps({"schema": SCHEMA, "command": "tradeoff", "config": asdict(cfg)}, default=str)
        )
        replay = _resolve("tradeoff", "--config", str(path), "--eps", "inf")
        assert all(not math.isfinite(e) for e in replay.epsilons)
        # the record it writes holds no setting of a release it did not make
        assert (replay.count_noise, replay.delta, replay.placements) == (
            None,
            default.delta,
            default.placements,
        )


@pytest.mark.parametrize(
    "line, named",
    [
        ("delta = 1e-6", "delta"),
        ('count-noise = "laplace"', "count-noise"),
        ('placements = ["local"]', "placements"),
    ],
)
def test_tradeoff_names_a_dp_setting_as_the_user_wrote_it(tmp_path, line, named):
    mine = tmp_path / "mine.toml"
    mine.write_text(f'eps = ["inf"]\n{line}\n')
    with pytest.raises(
        ConfigError, match=rf"^{named} \(in the --config file\)( laplace)? is a setting of the DP"
    ):
        _resolve("tradeoff", "--config", str(mine))


def test_flower_min_clients_is_refused_where_a_secure_sum_never_reads_it():
    with pytest.raises(ConfigError, match="min-clients counts the replies a plain run accepts"):
        _resolve("flower", "--clients", "4", "--secure-agg", "mask", "--min-clients", "2")
    assert _resolve("flower", "--clients", "4", "--min-clients", "2").min_clients == 2


def test_a_flower_record_of_a_secure_sum_with_min_clients_replays_without_it(tmp_path):
    """Records written before the refusal carry min-clients beside secure-agg (the run never read it): a replay
    runs the same secure sum without it, where a user's file or flag is refused."""
    from privfed.flower.server_app import run_config_of
    from privfed.results.record import SCHEMA

    cfg = _resolve("flower", "--clients", "4", "--secure-agg", "mask")
    config = dict(run_config_of(cfg), **{"min-clients": 3})
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": SCHEMA, "command": "flower", "config": config}, default=str))
    replay = _resolve("flower", "--config", str(path))
    assert replay.secure == "mask" and replay.min_clients is None
    mine = tmp_path / "mine.toml"
    mine.write_text('secure-agg = "mask"\nmin-clients = 3\nclients = 4\n')
    with pytest.raises(ConfigError, match="drop --min-clients"):
        _resolve("flower", "--config", str(mine))


def test_tradeoff_summary_of_a_run_without_noise_says_what_its_records_say():
    base = {
        "method": "fedncm",
        "placement": "none",
        "epsilon": math.inf,
        "epsilon_reported": math.inf,
        "accuracy": 0.9,
        "nonprivate_accuracy": 0.9,
        "delta": math.nan,
        "sigma": math.nan,
        "sigma_counts": math.nan,
        "calibration": "",
        "level": "record",
        "mechanism": "none",
        "upload_bytes": 100.0,
        "guarantee": "no protection (eps=inf)",
    }
    (row,) = summarise([dict(base, seed=0), dict(base, seed=1)])
    assert row["epsilon_reported"] == math.inf  # every seed's inf, not NaN
    assert row["protects"] == ""  # the records carry no protection, and the summary claims none
    private = dict(base, epsilon=1.0, epsilon_reported=0.9, placement="local", protects="class counts only")
    (row,) = summarise([dict(private, seed=0), dict(private, seed=1, epsilon_reported=1.1)])
    assert row["epsilon_reported"] == pytest.approx(1.0) and row["protects"] == "class counts only"


def test_flower_rounds_params_of_the_release_are_refused_without_noise_and_dropped_on_replay(tmp_path):
    from privfed.flower.server_app import run_config_of
    from privfed.results.record import SCHEMA

    rounds = ["--method", "fedlog", "--rounds", "2", "--clients", "3"]
    with pytest.raises(
        ConfigError, match=r"^rounds-params calibration is a setting of the DP release, but no eps is finite"
    ):
        _resolve("flower", *rounds, "--eps", "inf", "--rounds-params", '{"calibration": "paper"}')
    cfg = _resolve(
        "flower", *rounds, "--eps", "1", "--rounds-params", '{"calibration": "paper", "local_epochs": 1}'
    )
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps({"schema": SCHEMA, "command": "flower", "config": run_config_of(cfg)}, default=str)
    )
    replay = _resolve("flower", "--config", str(path), "--eps", "inf")
    assert replay.rounds_params == {"local_epochs": 1}  # the release's setting gone, the bodies' kept


@pytest.mark.parametrize("attack", ["singleton", "labels", "tracing"])
def test_a_multi_round_run_refuses_an_attack_it_would_not_run(attack):
    """A multi-round run attacks the sequence of its releases itself; a one-shot --attack was accepted there,
    recorded in the config, and never ran (its column was the sequence attack's)."""
    rounds = ["--method", "fedlog", "--rounds", "2", "--eps", "inf"]
    with pytest.raises(
        ConfigError, match=r"--attack applies to one-shot runs: a multi-round run \(--rounds 2\)"
    ):
        _resolve("tradeoff", *rounds, "--attack", attack)
    assert _resolve("tradeoff", *rounds).attacks == ()
    assert _resolve("tradeoff", "--method", "fedlog", "--eps", "inf", "--attack", attack).attacks == (attack,)


def test_client_level_over_rounds_names_the_placements_the_command_takes():
    rounds = ["--method", "fedlog", "--rounds", "2", "--eps", "1", "--level", "client", "--max-records", "50"]
    with pytest.raises(ConfigError, match="pass --placement trusted .* or --placement secure-sum"):
        _resolve("tradeoff", *rounds)
    for placement in ("trusted", "secure-sum"):  # what the refusal names is taken
        assert _resolve("tradeoff", *rounds, "--placement", placement).placements == (placement,)


def test_a_multi_round_record_that_named_an_attack_replays_without_it(tmp_path):
    from dataclasses import asdict

    from privfed.results.record import SCHEMA

    cfg = _resolve("tradeoff", "--method", "fedlog", "--rounds", "2", "--eps", "inf")
    config = dict(asdict(cfg), attacks=["singleton"])  # as written before the refusal
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": SCHEMA, "command": "tradeoff", "config": config}, default=str))
    replay = _resolve("tradeoff", "--config", str(path))
    assert replay.rounds == 2 and replay.attacks == ()
