"""One run record for every command: results.json of tradeoff, attack and flower read with one schema.

Each record holds the configuration as run (and replays it), the data rules (samples used and unused, the
test split, the partition), the guarantees its rows carry, the accuracy where the command measures one,
the bytes, the timings and the versions.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from privfed.attack import main as attack_main
from privfed.errors import InputError
from privfed.results.record import SCHEMA, check_record
from privfed.tradeoff import main as tradeoff_main

SMALL = ["--clients", "20", "--seeds", "2", "--quiet", "--no-plot"]


@pytest.fixture(scope="module")
def records(tmp_path_factory, digits_cache, flower_run):
    tmp = tmp_path_factory.mktemp("records")
    assert (
        tradeoff_main(["--method", "fedncm,fedlog", "--eps", "1,inf", *SMALL, "--out", str(tmp / "t")]) == 0
    )
    assert (
        attack_main(
            ["--attack", "tracing", "--method", "fedncm", "--eps", "1", *SMALL, "--out", str(tmp / "a")]
        )
        == 0
    )
    res, out = flower_run
    assert res.returncode == 0, res.stderr[-3000:]
    return {
        name: json.loads((folder / "results.json").read_text())
        for name, folder in (("tradeoff", tmp / "t"), ("attack", tmp / "a"), ("flower", out))
    }


def test_every_command_writes_one_schema(records):
    for command, rec in records.items():
        check_record(rec, command)
        assert rec["schema"] == SCHEMA and rec["command"] == command and rec["complete"] is True
        assert set(rec["versions"]) >= {"python", "numpy", "privfed"} and rec["timing"]["total_s"] > 0
        d = rec["data"]
        assert d["dataset"] == "digits" and d["train_samples"] == 899 and d["test_samples"] == 359
        assert d["used_samples"] + d["unused_samples"] == d["train_samples"]
        assert "dirichlet alpha 0.1" in d["partition"] and "test images held out" in d["test_split"]
        assert rec["bytes"]["upload_per_client"] > 0
    # 20 clients by the Dirichlet rule: floor(899 / 20) = 44 samples each, 19 unused; 10 flower nodes: 9
    assert records["tradeoff"]["data"]["unused_samples"] == records["attack"]["data"]["unused_samples"] == 19
    assert records["flower"]["data"]["unused_samples"] == 9


def test_accuracy_where_there_is_one(records):
    t, a, f = records["tradeoff"], records["attack"], records["flower"]
    assert a["accuracy"] is None  # an attack measures the attacker, not a head
    for rec in (t, f):
        acc = rec["accuracy"]
        assert acc["chance"] == pytest.approx(0.1) and "359 held-out" in acc["measured_on"]
        for v in acc["values"]:
            assert 0 <= v["mean"] <= 1
    # the tradeoff's accuracy section is the mean and spread over its seeds of its rows
    rows = [r for r in t["records"] if r["method"] == "fedncm" and r["epsilon"] == 1.0]
    (v,) = [v for v in t["accuracy"]["values"] if v["method"] == "fedncm" and v["epsilon"] == 1.0]
    mean = sum(r["accuracy"] for r in rows) / len(rows)
    sd = math.sqrt(sum((r["accuracy"] - mean) ** 2 for r in rows) / (len(rows) - 1))
    assert (v["mean"], v["std"], v["seeds"]) == (
        pytest.approx(mean, abs=1e-12),
        pytest.approx(sd, abs=1e-12),
        2,
    )


def test_guarantees_are_listed_once_and_rows_refer_to_them(records):
    for rec in records.values():
        assert len(rec["guarantees"]) == len(set(rec["guarantees"]))
        assert {r["guarantee"] for r in rec["records"]} == set(rec["guarantees"])
    assert any("(1, 1e-05)-DP" in g for g in records["flower"]["guarantees"])


def test_the_configuration_as_run_replays(records, tmp_path, digits_cache):
    """A saved tradeoff or attack record passed back as --config runs the same configuration."""
    import privfed.commands.attack.run as attack_run
    import privfed.commands.tradeoff.config as tradeoff_config
    from privfed.attack import build_parser as attack_parser
    from privfed.tradeoff import build_parser as tradeoff_parser

    for name, parser, resolve in (
        ("tradeoff", tradeoff_parser, tradeoff_config.resolve_config),
        ("attack", attack_parser, attack_run.resolve_config),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(records[name]))
        argv = ["--config", str(path)] + (["--attack", "tracing"] if name == "attack" else [])
        again = resolve(parser().parse_args(argv))
        from dataclasses import asdict

        saved = records[name]["config"]
        got = json.loads(json.dumps(asdict(again), default=str).replace("Infinity", '"inf"'))
        for key in ("methods", "epsilons", "clients", "partition", "alpha", "seeds", "delta", "dataset"):
            assert got[key] == saved[key], (name, key)
    from privfed.commands.flower import resolve_config
    from privfed.commands.options import flower_parser

    path = tmp_path / "flower.json"
    path.write_text(json.dumps(records["flower"]))
    cfg, _ = resolve_config(flower_parser().parse_args(["--config", str(path)]))
    saved = records["flower"]["config"]
    assert (cfg.method, cfg.epsilon, cfg.clients, cfg.partition_seed, cfg.alpha) == (
        saved["method"],
        saved["eps"],
        saved["clients"],
        0,
        saved["alpha"],
    )


def test_multi_round_rows_have_the_one_shot_columns(tmp_path, monkeypatch, capsys, digits_cache):
    """--rounds runs write the same columns, non-private beside accuracy, and per-client upload."""
    import privfed.rounds as fr

    def run_rounds(cfg, *, seed, epsilon, progress, noise_seed=None):
        rep = None
        if math.isfinite(epsilon):
            rep = SimpleNamespace(
                epsilon=epsilon,
                sigma=3.0,
                placement="local",
                level="record",
                is_private=True,
                guarantee=f"({epsilon:g}, 1e-05)-DP at record level",
            )
        one = {"personalised": 0.5, "common": 0.4 if rep else 0.45, "privacy": rep, "upload_bytes_total": 100}
        return SimpleNamespace(
            personalised_accuracy=0.6,
            common_accuracy=0.5 if rep else 0.55,
            privacy=rep,
            bytes={"upload_total": 400},
            baselines={"oneshot": one},
            attacks=None,
        )

    monkeypatch.setattr(fr, "run_rounds", run_rounds)
    out = tmp_path / "r"
    argv = ["--method", "fedlog", "--rounds", "4", "--eps", "1", "--clients", "4", "--seeds", "1", "--quiet"]
    assert tradeoff_main([*argv, "--no-plot", "--out", str(out)]) == 0
    rec = check_record(json.loads((out / "results.json").read_text()))
    rows = rec["records"]
    assert [(r["rounds"], r["accuracy"], r["nonprivate_accuracy"]) for r in rows] == [
        (4, 0.5, 0.55),
        (1, 0.4, 0.45),
    ]
    assert [r["upload_bytes"] for r in rows] == [
        100.0,
        25.0,
    ]  # per client: 400 / 4 over four rounds, 100 / 4 once
    table = capsys.readouterr().out
    head = table.splitlines()[0].split()
    assert head[:7] == ["method", "rounds", "placement", "protocol", "eps", "accuracy", "personalised"]
    assert "non-private" in head and "bytes/client" in head and "guarantee" in head


def test_a_replay_refuses_a_feature_file_that_changed_since_the_run(tmp_path):
    """results.json named the file only: after one column of it moved by 3, --config reran on the new bytes
    and reported another accuracy (0.6125 against 0.7750) under the same guarantee, without a word."""
    import numpy as np

    from privfed.data.npzfile import save_feature_file

    rng = np.random.default_rng(0)
    y = np.arange(120) % 3
    F = rng.normal(size=(120, 6)) + y[:, None]
    path = tmp_path / "f.npz"
    save_feature_file(path, F, y)
    argv = ["--method", "fedncm", "--eps", "inf", "--clients", "6", "--quiet", "--no-plot"]
    assert tradeoff_main([*argv, "--dataset", f"file:{path}", "--out", str(tmp_path / "a")]) == 0
    record = tmp_path / "a" / "results.json"
    first = json.loads(record.read_text())
    assert len(first["dataset"]["meta"]["sha256"]) == 64
    save_feature_file(path, F + np.eye(6)[2] * 3, y)
    from privfed.commands.tradeoff.config import resolve_config
    from privfed.commands.tradeoff.sweep import run_tradeoff
    from privfed.tradeoff import build_parser

    with pytest.raises(InputError, match="the file's data changed since the recorded run"):
        run_tradeoff(resolve_config(build_parser().parse_args(["--config", str(record)])), progress=False)
    assert tradeoff_main(["--config", str(record), "--out", str(tmp_path / "b"), "--quiet"]) == 2
    # the same file named again on the command line is still the recorded run's data: still checked
    again_named = [
        "--config",
        str(record),
        "--dataset",
        f"file:{path}",
        "--out",
        str(tmp_path / "b2"),
        "--quiet",
    ]
    assert tradeoff_main(again_named) == 2
    np.savez_compressed(
        path, features=F, labels=y
    )  # the same data again, saved otherwise: the run reproduces
    assert tradeoff_main(["--config", str(record), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    again = json.loads((tmp_path / "c" / "results.json").read_text())
    assert again["records"][0]["accuracy"] == first["records"][0]["accuracy"]
    other = tmp_path / "g.npz"  # --dataset on the command line names other data: nothing to compare
    save_feature_file(other, F + 1, y)
    assert (
        tradeoff_main(
            ["--config", str(record), "--dataset", f"file:{other}", "--out", str(tmp_path / "d"), "--quiet"]
        )
        == 0
    )


def test_the_data_line_names_empty_and_single_sample_clients_and_untrained_classes():
    """ "16 training samples over 16 clients by shards (16 used)" hid that 8 clients were empty, and a shards
    split over one client left 2 of 4 classes untrained without a word (its private accuracy then beat the
    non-private one); Partition.report said so, the commands did not."""
    import numpy as np

    from privfed.commands.common import data_line
    from privfed.results.record import data_rules

    def ds(labels):
        return SimpleNamespace(
            name="x", meta={"test_split": "t"}, train_labels=np.asarray(labels), test_labels=None
        )

    labels = np.arange(16) % 4
    rules = data_rules(ds(labels), clients=16, partition="shards", alpha=0.1, seeds=[0])
    from privfed.federation import partition

    sizes = np.bincount(partition(labels, 16, "shards", rng=0).clients, minlength=16)
    assert rules["empty_clients"] == int((sizes == 0).sum()) > 0
    assert rules["single_sample_clients"] == int((sizes == 1).sum())
    assert f"{rules['empty_clients']} client(s) empty" in data_line(rules)
    one = data_rules(ds(np.repeat(np.arange(4), 40)), clients=1, partition="shards", alpha=0.1, seeds=[0])
    assert one[
        "untrained_classes"
    ] and f"class(es) {one['untrained_classes']} with no training sample used" in data_line(one)
    fine = data_rules(ds(np.arange(400) % 4), clients=4, partition="iid", alpha=0.1, seeds=[0])
    assert (fine["empty_clients"], fine["single_sample_clients"], fine["untrained_classes"]) == (0, 0, [])
    assert data_line(fine) == "data: 400 training samples over 4 clients by iid (400 used); t"


def test_class_groups_count_the_groups_formed_as_the_clients():
    """--partition groups --n 50 formed 10 groups and the line said "30 client(s) empty" of --max-groups 40."""
    import numpy as np

    from privfed.results.record import data_rules

    labels = np.repeat(np.arange(10), 60)
    ds = SimpleNamespace(name="x", meta={"test_split": "t"}, train_labels=labels, test_labels=None)
    k = np.where(np.arange(600) % 60 < 50, labels, -1)  # one group of 50 per class
    rules = data_rules(
        ds, clients=40, partition="groups", alpha=0.1, seeds=[0], clients_of=lambda y, s: (k, "g")
    )
    assert (rules["empty_clients"], rules["single_sample_clients"], rules["untrained_classes"]) == (0, 0, [])


def test_the_bytes_summary_is_per_variant_never_a_mean_across_them(records):
    """upload_per_client was the mean over every record: 3,906 for a sweep of one-round (2,604) and two-round
    (5,208) releases, the upload of neither; a local and a masked placement mixed the same way."""
    rows = records["tradeoff"]["records"]
    by = records["tradeoff"]["bytes"]["by_variant"]
    want = {}
    for r in rows:
        want.setdefault((r["method"], r["placement"], int(r.get("rounds") or 1)), []).append(
            r["upload_bytes"]
        )
    assert {(b["method"], b["placement"], b["rounds"]): b["upload_per_client"] for b in by} == {
        k: sum(v) / len(v) for k, v in want.items()
    }
    assert len({b["upload_per_client"] for b in by}) > 1  # the sweep has variants of different uploads
    assert records["tradeoff"]["bytes"]["upload_per_client"] == max(b["upload_per_client"] for b in by)


def test_class_groups_state_the_groups_formed_as_the_clients():
    """--max-groups 100000 printed "over 100000 clients" where 6 groups formed (the record said 6)."""
    import numpy as np

    from privfed.results.record import data_rules

    labels = np.repeat(np.arange(3), 4)
    ds = SimpleNamespace(name="x", meta={"test_split": "t"}, train_labels=labels, test_labels=None)
    k = np.arange(12) // 2  # six groups of two
    rules = data_rules(
        ds, clients=100_000, partition="groups", alpha=0.1, seeds=[0], clients_of=lambda y, s: (k, "g")
    )
    assert rules["clients"] == 6 and rules["empty_clients"] == 0


@pytest.mark.parametrize("command", ["tradeoff", "attack", "flower"])
def test_a_settings_file_naming_out_is_refused_by_every_command(tmp_path, capsys, command):
    """out in a --config file was silently dropped by the attack and Flower commands (the run went to a default
    folder); every command now refuses it as the trade-off command did, naming the flag to use."""
    from privfed.commands.flower import main as flower_main

    main = {"tradeoff": tradeoff_main, "attack": attack_main, "flower": flower_main}[command]
    settings = tmp_path / "s.toml"
    settings.write_text(
        f'out = "{tmp_path / "mine"}"\n' + ('attack = "singleton"\n' if command == "attack" else "")
    )
    assert main(["--config", str(settings), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        "--config: 'out' is a run option, not a setting of the experiment: pass --out on the command line"
        in err
    )
    assert not (tmp_path / "mine").exists()


def test_a_dp_record_replayed_without_noise_drops_its_release_settings(records, tmp_path):
    """Each command's DP record replayed with --eps inf: the file's clip (and the other settings of the release)
    are no settings of a run without noise, so they are left out, not refused as flags are."""
    from privfed.attack import build_parser as attack_parser
    from privfed.attack import resolve_config as attack_resolve
    from privfed.commands.flower import resolve_config as flower_resolve
    from privfed.commands.options import flower_parser
    from privfed.errors import ConfigError
    from privfed.tradeoff import build_parser as tradeoff_parser
    from privfed.tradeoff import resolve_config as tradeoff_resolve

    for name, parser, resolve, extra in (
        ("tradeoff", tradeoff_parser, tradeoff_resolve, []),
        ("attack", attack_parser, attack_resolve, ["--attack", "tracing"]),
        ("flower", flower_parser, flower_resolve, []),
    ):
        if name != "attack":  # the attack record keeps the clip it resolved apart (clip_used)
            assert records[name]["config"].get("clip") is not None, name  # the record kept its DP run's clip
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(records[name]))
        got = resolve(parser().parse_args(["--config", str(path), "--eps", "inf", *extra]))
        cfg = got[0] if isinstance(got, tuple) else got
        assert cfg.clip is None, name
        with pytest.raises(ConfigError, match=r"(--)?clip is a setting of the DP release"):
            resolve(parser().parse_args(["--config", str(path), "--eps", "inf", "--clip", "3", *extra]))


def test_a_settings_file_a_user_wrote_keeps_every_setting(tmp_path):
    """Only a replayed record's release settings are left out under --eps inf: a user's own file with eps = inf
    and a clip is refused as the flag is, and a Flower file's dropout-tolerance, wire and rounds-params reach the
    run (the flags' defaults used to hide them)."""
    from privfed.commands.flower import resolve_config as flower_resolve
    from privfed.commands.options import flower_parser
    from privfed.errors import ConfigError
    from privfed.tradeoff import build_parser as tradeoff_parser
    from privfed.tradeoff import resolve_config as tradeoff_resolve

    mine = tmp_path / "mine.toml"
    mine.write_text('eps = ["inf"]\nclip = 1.0\n')
    with pytest.raises(ConfigError, match=r"--clip is a setting of the DP release, but no eps is finite"):
        tradeoff_resolve(tradeoff_parser().parse_args(["--config", str(mine)]))
    flower = tmp_path / "flower.toml"
    flower.write_text('eps = 1.0\nsecure_agg = "mask"\nclients = 5\ndropout_tolerance = 2\n')
    cfg, _ = flower_resolve(flower_parser().parse_args(["--config", str(flower)]))
    assert cfg.dropout_tolerance == 2
    plain = tmp_path / "plain.toml"
    plain.write_text('eps = "inf"\nwire = "compact"\nclients = 3\n')
    cfg, _ = flower_resolve(flower_parser().parse_args(["--config", str(plain)]))
    assert cfg.wire == "compact"
