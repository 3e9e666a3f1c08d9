"""A settings file a user wrote passes the checks its flags pass: the same refusals, none silent.

Each case ran before: a file naming one setting twice (method and methods) ran whichever spelling came
first in the lookup; count_noise with delta, alpha with an iid split and local_epochs with one round were
accepted (the delta recorded though the run used 0, the others dropped); --clients with the file's own
clients (--partition natural) was ignored while --alpha was refused.  A replayed record, which carries
every setting, is not refused for them (tests/tradeoff replay tests).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from privfed.tradeoff import main


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"config": {"methods": ["fedlog"], "method": "fedcof"}}', "sets method and methods"),
        ('{"config": {"epsilons": [1], "eps": [2]}}', "sets eps and epsilons"),
        ('attacks = ["tracing"]\nattack = ["singleton"]\n', "sets attack and attacks"),
        (
            'count_noise = "laplace"\ndelta = 0.1\n',
            "delta (in the --config file) does nothing with --count-noise laplace",
        ),
        (
            'count_noise = "laplace"\ncalibration = "analytic"\n',
            "calibration (in the --config file) does nothing",
        ),
        (
            'clients = 10\npartition = "iid"\nalpha = 0.5\n',
            "alpha (in the --config file) applies to --partition dirichlet",
        ),
        ("local_epochs = 3\n", "local_epochs (in the --config file) applies to multi-round FedLog only"),
    ],
)
def test_a_settings_file_is_refused_where_its_flags_are(tmp_path, capsys, text, message):
    cfg = tmp_path / ("settings.json" if text.startswith("{") else "settings.toml")
    cfg.write_text(text)
    assert main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["flag", "file"])
def test_clients_with_the_files_own_clients_is_refused(tmp_path, capsys, where):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "f.npz",
        features=rng.normal(size=(120, 4)),
        labels=np.arange(120) % 3,
        clients=np.arange(120) % 6,
    )
    argv = ["--dataset", f"file:{tmp_path / 'f.npz'}", "--partition", "natural", "--clip", "3"]
    if where == "flag":
        argv += ["--clients", "50"]
    else:
        (tmp_path / "s.toml").write_text("clients = 50\n")
        argv += ["--config", str(tmp_path / "s.toml")]
    assert main([*argv, "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    assert "applies to the splits privfed draws" in capsys.readouterr().err


def test_a_relative_feature_file_is_recorded_absolute_and_replays_from_any_folder(
    tmp_path, monkeypatch, capsys
):
    """The record kept 'file:feat.npz' as typed, so its replay from another folder named no file; a settings
    file's relative path is read from that file's folder."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "feat.npz", features=rng.normal(size=(120, 4)), labels=np.arange(120) % 3)
    monkeypatch.chdir(data)
    run = ["--clip", "3", "--eps", "1", "--clients", "4", "--seeds", "1", "--no-plot", "--quiet"]
    assert main(["--dataset", "file:feat.npz", *run, "--out", str(tmp_path / "r1")]) == 0
    rec = json.loads((tmp_path / "r1" / "results.json").read_text())
    assert rec["config"]["dataset"] == f"file:{data / 'feat.npz'}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["--config", str(tmp_path / "r1" / "results.json"), "--out", str(tmp_path / "r2")]) == 0
    assert (tmp_path / "r2" / "results.csv").read_bytes() == (tmp_path / "r1" / "results.csv").read_bytes()
    (data / "s.toml").write_text('dataset = "file:feat.npz"\nclip = 3.0\nclients = 4\n')
    assert (
        main(["--config", str(data / "s.toml"), "--eps", "1", "--seeds", "1", "--out", str(tmp_path / "r3")])
        == 0
    )
    assert (
        json.loads((tmp_path / "r3" / "results.json").read_text())["config"]["dataset"]
        == f"file:{data / 'feat.npz'}"
    )
    # the replay's check that the data did not change holds when the file is named as it was typed
    np.savez(data / "feat.npz", features=rng.normal(size=(120, 4)), labels=np.arange(120) % 3)
    capsys.readouterr()
    monkeypatch.chdir(data)
    replay = ["--config", str(tmp_path / "r1" / "results.json"), "--dataset", "file:feat.npz"]
    assert main([*replay, "--out", str(tmp_path / "r4")]) == 2  # from data/, where it was typed
    assert "the file's data changed since the recorded run" in capsys.readouterr().err


@pytest.mark.parametrize(
    "delta, level, noted",
    [(0.01, "record", "1/120 (the training records)"), (1 / 120, "record", "1/120"), (1e-5, "record", "")]
    + [(0.01, "client", ""), (0.3, "client", "1/4 (the clients)")],
)
def test_a_delta_not_below_one_over_n_is_noted_on_the_console_and_in_the_record(
    tmp_path, capsys, delta, level, noted
):
    """delta 0.5 ran under '(eps, delta)-DP' without a word: formally true, but a release that publishes each
    record (each client, at client level) with probability delta meets it.  120 training records on 4 clients
    here: 1/120 is the edge at record level, 1/4 at client level."""
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "f.npz",
        features=rng.normal(size=(120, 4)),
        labels=np.arange(120) % 3,
        test_features=rng.normal(size=(30, 4)),
        test_labels=np.arange(30) % 3,
    )
    argv = ["--dataset", f"file:{tmp_path / 'f.npz'}", "--clip", "3", "--eps", "1", "--delta", str(delta)]
    if level == "client":
        argv += ["--level", "client", "--max-records", "40", "--trusted-aggregator"]
    assert main([*argv, "--clients", "4", "--seeds", "1", "--no-plot", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    kept = [w for w in json.loads((tmp_path / "o" / "results.json").read_text())["warnings"] if "1/N" in w]
    if noted:
        assert noted in err and len(kept) == 1 and noted in kept[0]
    else:
        assert "1/N" not in err and not kept


@pytest.mark.parametrize(
    "command, text, message",
    [
        # the attack command checked --n / --max-groups on the flags only: a file's ran and was recorded unused
        (
            "attack",
            'attack = "tracing"\npartition = "dirichlet"\nmax_groups = 3\n',
            "max_groups (in the --config file) applies to",
        ),
        (
            "attack",
            'attack = "tracing"\npartition = "dirichlet"\nn = 4\n',
            "n (in the --config file) applies to --partition groups",
        ),
        # the Flower command merged dashed and underscored keys, one winning without a word
        ("flower", 'secure-agg = "mask"\nsecure_agg = "none"\n', "sets secure-agg and secure_agg"),
    ],
)
def test_the_other_commands_check_a_settings_file_as_their_flags(tmp_path, capsys, command, text, message):
    from privfed.commands.attack.cli import main as attack_main
    from privfed.commands.flower import main as flower_main

    (tmp_path / "s.toml").write_text(text)
    run = {"attack": attack_main, "flower": flower_main}[command]
    assert run(["--config", str(tmp_path / "s.toml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"epsilons": (float("nan"),), "placements": ("trusted",)},
            "a NaN or negative budget would run without noise",
        ),
        ({"placements": ("everywhere",)}, "--placement must be all or a list of"),
        ({"epsilons": (0.1, 0.1)}, "lists a budget twice"),
        ({"epsilons": ()}, "must not be empty"),
        (
            {"trusted_aggregator": True, "secure_agg": "mask"},
            "--trusted-aggregator contradicts --secure-agg mask",
        ),
        ({"max_records": 3}, "--max-records 3 contradicts --level record"),
        (
            {"alpha": 0.3, "partition": "iid"},
            "alpha (in the TradeoffConfig) applies to --partition dirichlet",
        ),
        ({"seeds": (-1,)}, "--seeds"),
    ],
)
def test_a_config_built_in_python_is_refused_where_its_flags_are(settings, message):
    """run_tradeoff(TradeoffConfig(...)) passes the checks the flags pass, before any work: a NaN budget ran
    without noise as 'no protection' (the trusted placement dropped), an unknown placement was a KeyError,
    duplicated or contradicting settings ran."""
    from privfed.errors import ConfigError
    from privfed.tradeoff import TradeoffConfig, run_tradeoff

    with pytest.raises(ConfigError, match="^TradeoffConfig: ") as exc:
        run_tradeoff(TradeoffConfig(**settings), progress=False)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_config_built_in_python_reads_as_the_flags_read_it():
    """A method or budget given alone, a seed count, None for the method parameters: what the flags mean by them."""
    from privfed.commands.tradeoff.config import check_config
    from privfed.tradeoff import TradeoffConfig

    got = check_config(TradeoffConfig(methods="fedlog", epsilons=0.5, seeds=3, method_params=None))
    assert (got.methods, got.epsilons, got.seeds, got.method_params) == (("fedlog",), (0.5,), (0, 1, 2), {})
    assert check_config(TradeoffConfig()) == TradeoffConfig()


def test_an_explicit_no_secure_aggregation_leaves_the_secure_sum_row_out():
    """--secure-agg none given: the default comparison runs local and trusted only (the secure-sum row ran
    masking, and the record said secure_agg none beside a masked row); a replayed default record, which carries
    secure_agg none with all three placements, still replays all three."""
    from privfed.tradeoff import build_parser, resolve_config

    cfg = resolve_config(build_parser().parse_args(["--secure-agg", "none"]))
    assert cfg.placements == ("local", "trusted") and cfg.secure_agg == "none"
    assert resolve_config(build_parser().parse_args([])).placements == ("local", "secure-sum", "trusted")


def test_run_tradeoff_keeps_the_commands_leniency_for_a_replayed_record(tmp_path, capsys):
    """A record replayed with another partition carries its alpha: the command takes it, and run_tradeoff's
    check of a config built in Python must not refuse it as alpha given with an iid split."""
    a, b = tmp_path / "a", tmp_path / "b"
    small = "--method fedncm --placement local --clients 20 --no-plot --quiet --eps 1".split()
    assert main([*small, "--alpha", "0.3", "--out", str(a)]) == 0
    assert (
        main(["--config", str(a / "results.json"), "--partition", "iid", "--quiet", "--out", str(b)]) == 0
    ), capsys.readouterr().err


def test_a_config_built_with_numpy_values_reads_them_as_numbers():
    """np.float32(30.0), np.int64 seeds and an epsilon array were refused ("--clip must be a number") or crashed
    on the comparison with the defaults."""
    import numpy as np

    from privfed.commands.tradeoff.config import check_config
    from privfed.tradeoff import TradeoffConfig

    got = check_config(
        TradeoffConfig(
            clients=np.int64(20), seeds=(np.int64(0),), clip=np.float32(30.0), epsilons=np.array([1.0, 2.0])
        )
    )
    assert (got.clients, got.seeds, got.clip, got.epsilons) == (20, (0,), 30.0, (1.0, 2.0))
