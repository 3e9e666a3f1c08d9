"""A careless or unlucky user at every door: what each gets is one line naming the input and the fix, or the
right result; never a traceback, an allocation the machine cannot hold, or a number that says something other
than what ran.

Each case was found by playing that user against the commands and the public API; each test fails on the
code before its fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from privfed.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--clients", "10", "--seeds", "1", "--no-plot"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _command(command: str, args: list[str], tmp_path: Path, **popen) -> subprocess.CompletedProcess:
    streams = {"stderr": subprocess.PIPE, "stdout": popen.pop("stdout", subprocess.PIPE)}
    return subprocess.run(
        [sys.executable, "-m", f"privfed.{command}", *args],
        env=popen.pop("env", _env()),
        cwd=tmp_path,
        text=True,
        timeout=300,
        **streams,
        **popen,
    )


# ---------------------------------------------------------------- the terminal: its encoding, a reader that leaves
def test_a_terminal_without_greek_letters_gets_a_plain_spelling_not_a_traceback(digits_cache, tmp_path):
    """stdout in ASCII (a C or Latin-1 locale without UTF-8 mode) used to raise UnicodeEncodeError on the
    guarantee line's (ε, δ) after the files were written."""
    out = tmp_path / "run"
    res = _command(
        "tradeoff",
        ["--eps", "0.5", "--placement", "local", "--out", str(out), "--quiet", *SMALL],
        tmp_path,
        env=_env(PYTHONIOENCODING="ascii"),
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-600:]
    assert "(eps, delta)-DP" in res.stdout, res.stdout
    assert (out / "results.json").is_file()


def test_a_reader_that_closes_the_pipe_stops_the_command_quietly(digits_cache, tmp_path):
    """`... | head` that has read enough: the command used to print a BrokenPipeError traceback; it now
    stops like any Unix tool (128 + SIGPIPE), its results already complete."""
    out = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", "privfed.tradeoff", "--eps", "0.5", "--placement", "local", "--out", str(out),
         "--quiet", *SMALL],
        env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    p.stdout.close()  # the reader is gone before the command prints its table
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141, err[-600:]
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-600:]
    assert json.loads((out / "results.json").read_text())["complete"] is True


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_standard_output_on_a_full_disk_is_one_line_and_the_results_stay(digits_cache, tmp_path):
    """`> log` on a full disk (here /dev/full): the command used to end in an OSError traceback."""
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        res = _command(
            "tradeoff",
            ["--eps", "0.5", "--placement", "local", "--out", str(out), "--quiet", *SMALL],
            tmp_path,
            stdout=full,
        )  # fmt: skip
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-600:]
    assert res.stderr.strip().splitlines() == [
        "python -m privfed.tradeoff: error: could not write to standard output (No space left on device)"
    ]
    assert json.loads((out / "results.json").read_text())["complete"] is True


# ---------------------------------------------------------------- the attack command's --attack
def test_two_attacks_in_one_attack_command_are_one_line_not_a_traceback():
    """--attack tracing,singleton used to crash unpacking the list (ValueError traceback)."""
    from privfed.commands.attack.config import resolve_config
    from privfed.commands.options import attack_parser

    with pytest.raises(ConfigError, match=r"--attack takes one attack here, got tracing,singleton") as exc:
        resolve_config(attack_parser().parse_args(["--attack", "tracing,singleton"]))
    assert "\n" not in str(exc.value) and "--attack LIST" in str(exc.value)


def test_a_previous_attack_run_replays_from_its_record_without_naming_the_attack_again(tmp_path):
    """--config results.json of an attack run: argparse used to demand --attack although the record names it."""
    from privfed.commands.attack.config import resolve_config
    from privfed.commands.options import attack_parser

    record = tmp_path / "results.json"
    record.write_text(
        json.dumps({"config": {"attack": "singleton", "methods": ["fedncm"], "epsilons": ["inf"]}})
    )
    cfg = resolve_config(attack_parser().parse_args(["--config", str(record)]))
    assert (cfg.attack, cfg.methods, cfg.epsilons) == ("singleton", ("fedncm",), (float("inf"),))
    with pytest.raises(ConfigError, match="--attack is required"):
        resolve_config(attack_parser().parse_args([]))


# ---------------------------------------------------------------- the Python API: objects where a name was typed
def _data(N=60, d=4, C=3, K=4):
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, d)), np.arange(N) % C, np.arange(N) % K


@pytest.mark.parametrize(
    "kw,word",
    [
        ({"secure_agg": "mask"}, "secure_agg must be a protection object"),
        ({"secure_agg": True}, "secure_agg must be a protection object"),
        ({"privacy": "gaussian"}, "privacy must be a mechanism object"),
        ({"privacy": 1.0, "num_classes": 3, "num_clients": 4}, "privacy must be a mechanism object"),
    ],
)
def test_fit_refuses_a_name_where_a_mechanism_or_protection_object_belongs(kw, word):
    """secure_agg="mask" (the commands' word) used to fail mid-release with AttributeError; privacy="..." with a
    misleading demand for num_classes."""
    import privfed

    F, y, k = _data()
    with pytest.raises(ConfigError, match=word) as exc:
        privfed.fit("fedncm", F, y, k, random_state=0, **kw)
    assert "\n" not in str(exc.value)


def test_the_estimator_refuses_names_huge_class_counts_and_bad_predict_inputs_in_one_line():
    """Each used to raise AttributeError, MemoryError (np.arange of 10**12 classes), TypeError or
    scikit-learn's bare ValueError; each is now a privfed error (InputError is still a ValueError, and the
    TypeErrors scikit-learn's estimator checks expect for objects in X stay TypeErrors)."""
    from mechanisms import GaussianMechanism
    from privfed.estimators import FederatedHeadClassifier as FHC

    F, y, _ = _data()
    with pytest.raises(ConfigError, match="secure_agg must be a protection object"):
        FHC("fedlog", clients=4, secure_agg="mask", random_state=0).fit(F, y)
    mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=3.0)
    with pytest.raises(ConfigError, match=r"classes=1000000000000 would need .* GiB of class statistics"):
        FHC("fedlog", classes=10**12, clients=4, privacy=mech, random_state=0).fit(F, y)
    with pytest.raises(ConfigError, match="method_params must be a dict"):
        FHC("fedlog", method_params=[("nu", 1.0)]).fit(F, y)
    est = FHC("fedlog").fit(F, y)
    for bad, word in ((F[:, :2], "X has 2 features"), (np.full((2, 4), np.nan), "NaN"), (F[:0], "0 sample")):
        for call in (est.predict, est.predict_proba, est.decision_function):
            with pytest.raises(InputError, match=word):
                call(bad)
    assert isinstance(InputError("x"), ValueError)  # scikit-learn's contract for bad input still holds


# ---------------------------------------------------------------- masked_sum and PairwiseMasking
def test_masked_sum_refuses_complex_and_object_stacks_instead_of_casting_them():
    """A complex stack used to be summed with its imaginary part dropped (a ComplexWarning only): [3, 3]
    for a sum of 3 + 6j; an object stack of text was parsed."""
    from mechanisms.secagg import masked_sum

    for stack, word in (
        (np.ones((3, 2)) * (1 + 2j), "complex"),
        (np.array([[1, "2"], [3, 4], [5, 6]], dtype=object), "object"),
        (np.ones((3, 2), dtype=bool), "bool"),
    ):
        with pytest.raises(InputError, match=word):
            masked_sum(stack, key_seed=0)
    ok = masked_sum(np.arange(6, dtype=np.int32).reshape(3, 2), key_seed=0)  # integers convert exactly
    np.testing.assert_array_equal(ok.total, [6.0, 9.0])


@pytest.mark.parametrize("seed", [-1, 2**64, 2.5, "7"])
def test_a_key_seed_outside_the_seed_range_is_refused_at_every_masking_door(seed):
    """masked_sum(key_seed=-1) used to raise OverflowError from int.to_bytes; PairwiseMasking(key_seed=-1)
    was hashed into keys without a word."""
    from mechanisms.secagg import PairwiseMasking, masked_sum

    with pytest.raises(ConfigError, match=r"key_seed must be an integer seed in 0\.\.2\*\*64 - 1"):
        masked_sum(np.ones((3, 2)), key_seed=seed)
    with pytest.raises(ConfigError, match=r"key_seed must be an integer seed in 0\.\.2\*\*64 - 1"):
        PairwiseMasking(key_seed=seed)


def test_a_ring_overflow_that_no_frac_bits_fixes_says_so():
    """The message used to read "|sum| up to 2^inf ... lower frac_bits (at most 0 fit)" although even whole
    numbers overflow."""
    from mechanisms.secagg import masked_sum

    with pytest.raises(InputError) as exc:
        masked_sum(np.full((3, 2), 1e300), key_seed=0)
    text = str(exc.value)
    assert "2^inf" not in text and "at most 0 fit" not in text
    assert "even whole numbers (frac_bits=0) do not fit" in text, text
    with pytest.raises(InputError, match=r"lower frac_bits \(at most 3 fit\)"):  # 62 - log2(3e17) = 3.9
        masked_sum(np.full((3, 2), 1e17), key_seed=0)


# ---------------------------------------------------------------- hand-made statistics at a method's door
def _all_stats():
    from privfed.stats import compute_client_stats

    F, y, k = _data(N=80, d=4, C=3, K=4)
    return compute_client_stats(F, y, k, fields=("counts", "sums", "second", "class_second"))


@pytest.mark.parametrize(
    "method", ["fed3r", "fed3r-within", "fedcgs", "fedcof", "fedcof-oracle", "fedlog", "fedncm"]
)
@pytest.mark.parametrize("field", ["counts", "sums", "second", "class_second"])
def test_a_method_refuses_nan_in_a_statistic_it_reads_or_gives_a_finite_head(method, field):
    """NaN in the sums reached fed3r's and fedcof's eigen-solvers (LinAlgError), NaN in the second moment
    fedcgs', and a NaN count was dropped by FedCOF's drop rule as if it were a count <= 0."""
    import privfed
    from privfed.stats import ClientStats

    base = _all_stats()
    m = privfed.methods.get(method)
    arrays = {f: np.array(getattr(base, f)) for f in ("counts", "sums", "second", "class_second")}
    arrays[field].flat[5] = np.nan
    if field not in m.requires:
        head = m.aggregate(ClientStats(**arrays))  # a statistic the method never reads changes nothing
        assert np.isfinite(head.weight).all() and np.isfinite(head.bias).all()
        return
    with pytest.raises(InputError, match="NaN or inf") as exc:
        m.aggregate(ClientStats(**arrays))
    assert f"method {method!r}" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("method", ["fed3r", "fedcgs", "fedcof", "fedlog", "fedncm"])
def test_statistics_declaring_a_trillion_classes_are_refused_before_the_class_totals(method, monkeypatch):
    """compute_client_stats keeps num_classes=10**12 as pairs at no cost; aggregate then allocated the class
    totals (MemoryError for 7 TiB). The limit is pinned so that the test reads the same on every machine."""
    import privfed
    from privfed import _validation
    from privfed.stats import compute_client_stats

    monkeypatch.setattr(_validation, "available_memory", lambda: 8 * 2**30)
    F, y, k = _data(N=80, d=4, C=3, K=4)
    m = privfed.methods.get(method)
    stats = compute_client_stats(F, y, k, num_classes=10**12, fields=tuple(m.requires))
    with pytest.raises(InputError, match=r"num_classes=1,000,000,000,000 x d=4 .* needs about .* TiB"):
        m.aggregate(stats)
    assert np.isfinite(m.aggregate(compute_client_stats(F, y, k, fields=tuple(m.requires))).weight).all()


# ---------------------------------------------------------------- the attacks' entry points
def test_the_attack_entry_points_refuse_bad_seeds_empty_federations_and_mismatched_holdouts():
    """rng=-1 used to raise numpy's ValueError, clients all -1 "zero-size array to reduction operation",
    holdout features of another width numpy's concatenate error, and client ids of 2.5 were read as 2."""
    import attacks

    F, y, k = _data(N=60, d=4, C=3, K=4)
    H, hy = F[:20] + 0.5, y[:20]
    with pytest.raises(ConfigError, match=r"rng must be None, an integer seed in 0\.\.2\*\*64 - 1"):
        attacks.evaluate_federation("labels", "fedncm", F, y, k, rng=-1)
    view, truth = attacks.scenario("fedncm", F, y, k)
    with pytest.raises(ConfigError, match=r"rng must be None, an integer seed"):
        attacks.evaluate("labels", view, truth, rng=2**64)
    with pytest.raises(InputError, match="every id is -1"):
        attacks.evaluate_federation("labels", "fedncm", F, y, -np.ones_like(k))
    with pytest.raises(InputError, match="clients must hold whole numbers"):
        attacks.evaluate_federation("labels", "fedncm", F, y, k + 0.5)
    with pytest.raises(InputError, match=r"holdout_features has shape \(20, 2\) but features \(60, 4\)"):
        attacks.evaluate_federation(
            "subspace", "fed3r", F, y, k, holdout_features=H[:, :2], holdout_labels=hy
        )
    row = attacks.evaluate_federation("labels", "fedncm", F, y, k, rng=3)
    assert 0.0 <= row["total_variation"] <= 1.0


# ---------------------------------------------------------------- the trade-off command's data and output doors
def test_a_natural_split_reports_the_files_clients_not_the_clients_flag(tmp_path):
    """--partition natural on a file of 7 clients used to print and record "over 100 clients" (the --clients
    default), which the split ignores."""
    from privfed.data import load_dataset
    from privfed.results.record import data_rules

    F, y, _ = _data(N=140, d=4, C=2)
    np.savez(tmp_path / "f.npz", features=F, labels=y, clients=np.arange(140) % 7)
    ds = load_dataset(f"file:{tmp_path / 'f.npz'}")
    rules = data_rules(ds, clients=100, partition="natural", alpha=0.1, seeds=[0])
    assert rules["clients"] == 7 == int(ds.train_clients.max()) + 1, rules
    assert "--clients does not apply" in rules["partition"]
    same = data_rules(ds, clients=7, partition="natural", alpha=0.1, seeds=[0])
    assert same["clients"] == 7 and "does not apply" not in same["partition"]


@pytest.mark.parametrize(
    "extra,word",
    [
        ([], "the secure-sum placement needs 2 or more clients"),
        (["--secure-agg", "mask"], "--secure-agg mask needs --clients 2 or more"),
        (["--eps", "inf", "--secure-agg", "ckks"], "--secure-agg ckks needs --clients 2 or more"),
    ],
)
def test_one_client_with_a_secure_sum_is_refused_before_any_run(extra, word):
    """--clients 1 with the default placements used to run the local placement, then stop mid-sweep on
    "secure sum 1 (shape (10,)): ... K >= 2"."""
    from privfed.tradeoff import build_parser, resolve_config

    args = ["--clients", "1", *(extra if "--eps" in extra else ["--eps", "0.5", *extra])]
    with pytest.raises(ConfigError, match=word):
        resolve_config(build_parser().parse_args(args))
    cfg = resolve_config(
        build_parser().parse_args(["--clients", "1", "--eps", "0.5", "--placement", "local"])
    )
    assert cfg.placements == ("local",)


def test_an_out_link_that_loops_is_refused_before_any_work(tmp_path):
    """A symbolic-link loop as --out used to pass the check, run everything, then fail to move the run in,
    leaving a staging folder and the runs in the temporary folder."""
    from privfed.results.writer import check_out_path

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match="is a symbolic link that cannot be followed"):
        check_out_path(tmp_path / "a", overwrite=False)
    (tmp_path / "c").symlink_to(tmp_path / "target")  # a dangling link still names the folder to make
    assert check_out_path(tmp_path / "c", overwrite=False)[0] == tmp_path / "target"


@pytest.mark.parametrize(
    "args,word",
    [
        (["--rounds", "2", "--local-epochs", "1e9"], "--local-epochs must be an integer, got '1e9'"),
        (["--rounds", "2", "--families", ""], "--families: malformed list ''"),
        (["--local-epochs", "3"], "--local-epochs applies to multi-round FedLog only"),
        (["--families", "cnn"], "--families applies to multi-round FedLog only"),
        (["--init", "scratch"], "--init applies to multi-round FedLog only"),
    ],
)
def test_multi_round_settings_are_checked_and_never_silently_ignored(args, word):
    """--local-epochs 1e9 used to raise int()'s ValueError mid-run; --local-epochs, --families and --init
    without --rounds were ignored without a word."""
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match=word):
        resolve_config(build_parser().parse_args(["--method", "fedlog", *args]))
    cfg = resolve_config(
        build_parser().parse_args(["--rounds", "2", "--local-epochs", "0", "--families", "cnn"])
    )
    assert cfg.rounds == 2


# ---------------------------------------------------------------- the attack command's printed metrics
def test_an_undefined_attack_metric_prints_n_a_with_its_reason_never_a_bare_nan():
    """--attack differencing --clients 2 at eps 0.1 (no cell changes by exactly one record under the noise)
    used to print "exact_fraction=nan" with nothing saying why."""
    from privfed.commands.attack.report import summary_line, undefined_notes

    row = {"method": "fedlog", "epsilon": 0.1, "placement": "local", "protocol": "none", "seed": 0}
    bad = {**row, "exact_fraction": float("nan")}
    good = {**row, "exact_fraction": 0.25}
    assert summary_line(bad).endswith("exact_fraction=n/a") and "nan" not in summary_line(bad)
    assert summary_line(good).endswith("exact_fraction=0.250")
    (note,) = undefined_notes([good, bad])
    assert note.startswith("note: exact_fraction=n/a") and "no cell's count changed by exactly one" in note
    assert undefined_notes([good]) == []


# ---------------------------------------------------------------- the Flower app's run config
@pytest.mark.parametrize(
    "key,value,word",
    [
        ("partition", "foo", "partition must be one of"),
        ("alpha", 0.0, "alpha must be a finite number > 0"),
        ("alpha", "nan", "alpha must be a finite number > 0"),
        ("num-classes", 0, "num-classes must be an integer >= 1"),
    ],
)
def test_the_flower_run_config_refuses_a_bad_partition_on_the_server(key, value, word):
    """`flwr run --run-config partition="foo"` (or alpha=0, num-classes=0) used to be accepted by the server
    and met only by the nodes, after the federation had started."""
    from privfed.flower.config import FlowerConfig

    with pytest.raises(ConfigError, match=word):
        FlowerConfig.from_run_config({"method": "fedlog", "clients": 2, "eps": "inf", key: value})
    ok = FlowerConfig.from_run_config({"method": "fedlog", "clients": 2, "eps": "inf", "alpha": 0.5})
    assert (ok.partition, ok.alpha) == ("dirichlet", 0.5)


def test_repeated_attacks_and_group_sizes_are_refused_like_repeated_methods_and_seeds():
    """--attack tracing,tracing (trade-off) and --n 1,1 (attack) used to run the same thing twice."""
    from privfed.commands.attack.config import resolve_config as attack_config
    from privfed.commands.options import attack_parser
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match="--attack lists an attack twice"):
        resolve_config(build_parser().parse_args(["--attack", "tracing,TRACING"]))
    with pytest.raises(ConfigError, match="--n lists a size twice"):
        attack_config(
            attack_parser().parse_args(["--attack", "singleton", "--partition", "groups", "--n", "1,1"])
        )


def test_a_dirichlet_class_split_that_cannot_be_drawn_names_the_flags_that_fix_it():
    """The command's user was told to "lower min_size", which no flag sets."""
    from privfed.federation import partition

    y = np.arange(60) % 3
    with pytest.raises(ConfigError, match=r"--alpha, --clients, or another --partition"):
        partition(y, 6, "dirichlet-class", alpha=0.01, rng=0, min_size=9)


@pytest.mark.parametrize(
    "args,word",
    [
        (
            ["--dataset", "file:feats.npz", "--clip", "5"],
            "a feature file is one node's own data in a deployment",
        ),
        (["--partition", "natural"], "--partition natural needs each node's own feature file"),
        (["--num-classes", "5"], "--num-classes 5: the digits data set has 10 classes"),
        (["--clients", "900"], "num_clients=900 exceeds the 899 samples"),
        (["--clients", "100000"], "num_clients=100000 exceeds the 899 samples"),
    ],
)
def test_the_flower_command_refuses_what_its_simulated_nodes_cannot_hold_before_starting_them(
    args, word, digits_cache
):
    """Each used to start Flower and the SuperLink (about 15 s), then fail with every node refusing the run;
    --clients 100000 started a simulation of 100,000 nodes over 899 samples."""
    from privfed.commands.flower import resolve_config
    from privfed.commands.options import flower_parser

    with pytest.raises(ConfigError, match=word):
        base = ["--eps", "inf", *([] if "--clients" in args else ["--clients", "3"])]
        resolve_config(flower_parser().parse_args([*base, *args]))
    cfg, _ = resolve_config(
        flower_parser().parse_args(["--clients", "3", "--eps", "inf", "--num-classes", "10"])
    )
    assert cfg.num_classes == 10


def test_a_commands_warning_is_one_line_naming_the_command(capsys):
    """--calibration classic --eps 5 used to print Python's two-line warning (the file path and line of
    mechanisms/dp/params.py, then the source line that raised it)."""
    import warnings

    from privfed.commands.common import cli_entry

    def body(argv):
        warnings.warn(
            "calibration='classic' is only proven for epsilon < 1\n  (got epsilon=5.0)",
            UserWarning,
            stacklevel=2,
        )
        return 0

    assert cli_entry("python -m privfed.tradeoff", body)([]) == 0
    err = capsys.readouterr().err
    assert err == (
        "python -m privfed.tradeoff: warning: calibration='classic' is only proven for epsilon < 1 (got epsilon=5.0)\n"
    )
    assert warnings.showwarning.__module__ == "warnings"  # Python's own again once the command returned


def test_a_test_split_of_one_class_is_not_called_a_data_set_of_one_class(tmp_path, capsys):
    """29 samples of class 0 and one of class 1: the held-out split holds class 0 only; the command used to
    say that every head predicts one class with accuracy 1 and to ask for data with >= 2 classes, which the
    file has."""
    from privfed.tradeoff import main

    F, _, _ = _data(N=30, d=4)
    np.savez(tmp_path / "f.npz", features=F, labels=np.r_[np.zeros(29, int), 1])
    args = [
        "--dataset",
        f"file:{tmp_path / 'f.npz'}",
        "--eps",
        "inf",
        "--clients",
        "3",
        "--quiet",
        "--no-plot",
    ]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "single class in its test labels, so accuracy would measure that class alone" in err, err
    assert "accuracy is 1" not in err and not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a fault battery's findings (late November)
def test_one_client_under_the_attacks_secure_sum_is_refused_like_the_tradeoffs():
    """privfed.attack --clients 1 --secure-agg used to print a "secure sum" row for one client (whose sum is
    its input) under the distributed-noise guarantee."""
    from privfed.commands.attack.config import resolve_config
    from privfed.commands.options import attack_parser

    with pytest.raises(
        ConfigError, match=r"--secure-agg mask needs --clients 2 or more \(a sum of one input"
    ):
        resolve_config(attack_parser().parse_args(["--attack", "tracing", "--clients", "1", "--secure-agg"]))
    cfg = resolve_config(
        attack_parser().parse_args(["--attack", "tracing", "--clients", "2", "--secure-agg"])
    )
    assert cfg.secure_agg == "mask" and cfg.clients == 2


def test_a_natural_split_of_one_client_is_refused_before_any_run(tmp_path):
    """A file whose clients column names one client, with the default placements, used to run the local
    placement, then stop mid-sweep on "secure aggregation needs ... K >= 2", leaving partial files."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 5, 600)
    F = rng.normal(size=(600, 16)) + y[:, None] * 0.5
    np.savez(tmp_path / "one.npz", features=F, labels=y, clients=np.zeros(600, int))
    data = ["--partition", "natural", "--clip", "3", "--dataset", f"file:{tmp_path / 'one.npz'}", "--quiet"]
    r = _command("tradeoff", [*data, "--no-plot", "--out", str(tmp_path / "o")], tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "the secure-sum placement needs 2 or more clients" in r.stderr and "gives rows to 1" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()  # refused before any run
    r = _command(
        "tradeoff", [*data, "--secure-agg", "mask", "--no-plot", "--out", str(tmp_path / "o")], tmp_path
    )
    assert r.returncode == 2 and "--secure-agg mask needs 2 or more clients" in r.stderr
    r = _command(
        "tradeoff",
        [*data, "--placement", "local", "--seeds", "1", "--no-plot", "--out", str(tmp_path / "o")],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr  # one client's own noise is still a release


@pytest.mark.parametrize(
    "kw,word",
    [
        (
            dict(noise_multiplier=1e-300),
            r"noise_multiplier=1e-300 gives epsilon=inf .* use a larger noise_multiplier",
        ),
        (dict(noise_multiplier=1e-160), r"noise_multiplier=1e-160 gives epsilon=inf"),
        (
            dict(noise_multiplier=1e6),
            r"noise_multiplier=1000000.0 gives epsilon=0 .* use a smaller noise_multiplier",
        ),
        (dict(epsilon=1e308), r"epsilon=1e\+308 is beyond 1e\+150"),
    ],
)
def test_budgets_float64_cannot_account_for_are_refused_naming_what_was_given(kw, word):
    """noise_multiplier=1e-300 used to build a mechanism reporting epsilon=inf that then crashed fitting
    (OverflowError); 1e6 was refused as "epsilon must be > 0, got epsilon=0.0" (a parameter not given);
    epsilon=1e308 ran and reported "NO DP" with delta NaN although noise was added."""
    import warnings

    from mechanisms import GaussianMechanism

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" on the way
        with pytest.raises(ConfigError, match=word):
            GaussianMechanism(delta=1e-5, clip=5.0, **kw)


def test_the_largest_budgets_float64_can_account_for_still_release_with_their_guarantee():
    import warnings

    from mechanisms import GaussianMechanism
    from mechanisms.dp.calibration import MAX_EPSILON, gdp_epsilon

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (
            gdp_epsilon(1e300, 1e-5) == np.inf
        )  # beyond float64: inf, without an "invalid value" on the way
        assert 0 < gdp_epsilon(1e150, 1e-5) < np.inf  # finite, though past the cap a release takes
        m = GaussianMechanism(epsilon=MAX_EPSILON, delta=1e-5, clip=5.0)
        z = GaussianMechanism(noise_multiplier=1e-70, delta=1e-5, clip=5.0)
    assert m.epsilon == MAX_EPSILON and 0 < z.epsilon <= MAX_EPSILON


@pytest.mark.parametrize("text", ["1e999", "0.1,1e400", "-1e999"])
def test_an_epsilon_that_overflows_float64_is_refused_not_read_as_no_protection(text):
    """--eps 1e999 used to read as inf: a run with no clipping and no noise, labelled as asked."""
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match=r"overflows a float64"):
        resolve_config(build_parser().parse_args([f"--eps={text}"]))
    assert resolve_config(build_parser().parse_args(["--eps", "0.1,inf"])).epsilons == (0.1, np.inf)


def test_a_config_number_that_overflows_float64_is_refused_and_inf_is_infinity(tmp_path):
    from privfed.tradeoff import build_parser, resolve_config

    (tmp_path / "big.toml").write_text("eps = 1e999\n")
    with pytest.raises(ConfigError, match=r"the number 1e999 overflows a float64 .* write inf"):
        resolve_config(build_parser().parse_args(["--config", str(tmp_path / "big.toml")]))
    (tmp_path / "inf.toml").write_text("eps = inf\n")
    assert resolve_config(build_parser().parse_args(["--config", str(tmp_path / "inf.toml")])).epsilons == (
        np.inf,
    )


@pytest.mark.parametrize(
    "args,word",
    [
        (
            ["--method", "fedlog", "--method", "fedncm"],
            r"argument --method: given twice \('fedlog', then 'fedncm'\)",
        ),
        (["--eps", "0.1", "--eps", "1"], r"argument --eps: given twice"),
        (["--placement", "local", "--placement", "trusted"], r"argument --placement: given twice"),
        (
            ["--method", "fedcof", "--param", "fedcof.gamma=1", "--param", "fedcof.gamma=2"],
            r"--param sets fedcof.gamma twice \('fedcof.gamma=1', then 'fedcof.gamma=2'\)",
        ),
    ],
)
def test_a_flag_given_twice_is_refused_not_kept_last(args, word):
    """--method fedlog --method fedncm used to run fedncm alone; --param fedcof.gamma=1 --param fedcof.gamma=2
    recorded gamma 2."""
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match=word):
        resolve_config(build_parser().parse_args(args))
    cfg = resolve_config(
        build_parser().parse_args(
            ["--method", "fedcof", "--param", "fedcof.gamma=0.5", "--param", "fedcof.normalise=false"]
        )
    )
    assert cfg.method_params == {
        "fedcof": {"gamma": 0.5, "normalise": False}
    }  # several keys: still repeatable


def test_the_flower_command_module_runs_its_command(tmp_path):
    """python -m privfed.commands.flower used to do nothing and exit 0 (no __main__ guard)."""
    r = subprocess.run(
        [sys.executable, "-m", "privfed.commands.flower", "--help"],
        env=_env(),
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0 and "usage:" in r.stdout and "--secure-agg" in r.stdout


def test_an_underflowing_delta_is_named_as_typed():
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match=r"got 1e-400 \(below the smallest float64\)"):
        resolve_config(build_parser().parse_args(["--delta", "1e-400"]))
    with pytest.raises(ConfigError, match=r"got 0$"):
        resolve_config(build_parser().parse_args(["--delta", "0"]))


def test_the_classic_calibration_at_the_largest_budget_releases_with_a_finite_guarantee():
    """--calibration classic --eps 1e300 crashed in the accountant (mu ~ eps / 4.8, squared): the cap sits
    where both calibrations' accounting stays in float64."""
    import warnings

    from mechanisms import GaussianMechanism
    from mechanisms.dp.calibration import MAX_EPSILON

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    F = rng.normal(size=(300, 8)) + y[:, None]
    import privfed

    for calibration in ("classic", "analytic"):
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", UserWarning
            )  # classic past epsilon 1, and the numpy backend's notes
            m = GaussianMechanism(epsilon=MAX_EPSILON, delta=1e-5, clip=5.0, calibration=calibration)
            privfed.fit("fedncm", F, y, rng.integers(0, 5, 300), privacy=m, num_classes=3, num_clients=5)
        assert np.isfinite(m.report().epsilon), calibration


def test_budgets_beyond_the_cap_are_refused_with_the_flags_before_any_run():
    """--eps 1,1e301 used to run epsilon 1, then stop on the second budget."""
    from privfed.tradeoff import build_parser, resolve_config

    with pytest.raises(ConfigError, match=r"--eps 1e151 is beyond 1e\+150"):
        resolve_config(build_parser().parse_args(["--eps", "1,1e151"]))


def test_numbers_that_overflow_float64_in_json_configs_run_configs_and_integers_are_refused(tmp_path):
    """A JSON --config's 1e999, the Flower run config's "1e999" and a TOML integer of 400 digits used to read
    as infinity (no noise) or crash (OverflowError)."""
    from privfed.flower.config import FlowerConfig
    from privfed.tradeoff import build_parser, resolve_config

    (tmp_path / "c.json").write_text('{"config": {"eps": 1e999}}')
    with pytest.raises(ConfigError, match=r"the number 1e999 overflows a float64"):
        resolve_config(build_parser().parse_args(["--config", str(tmp_path / "c.json")]))
    (tmp_path / "c.toml").write_text("clip = 1" + "0" * 400 + "\n")
    with pytest.raises(ConfigError, match=r"--clip: 10{400} overflows a float64"):
        resolve_config(build_parser().parse_args(["--config", str(tmp_path / "c.toml"), "--eps", "1"]))
    with pytest.raises(ConfigError, match=r"run-config eps='1e999' overflows a float64"):
        FlowerConfig.from_run_config({"eps": "1e999", "clip": 5.0})
    assert FlowerConfig.from_run_config({"eps": "inf"}).private is False


def test_a_secure_sum_over_one_client_holding_data_is_refused_in_every_split(tmp_path):
    """A natural split whose clients column gives every row to client 1 (client 0 empty) and the attack's
    one group (--max-groups 1) used to write secure-sum rows over one input."""
    from privfed.commands.attack.config import resolve_config
    from privfed.commands.options import attack_parser

    with pytest.raises(ConfigError, match=r"--max-groups 1 makes one group, one client"):
        resolve_config(
            attack_parser().parse_args(
                [
                    "--attack",
                    "singleton",
                    "--partition",
                    "groups",
                    "--max-groups",
                    "1",
                    "--secure-agg",
                    "--eps",
                    "1",
                ]
            )
        )
    rng = np.random.default_rng(1)
    y = rng.integers(0, 5, 600)
    F = rng.normal(size=(600, 16)) + y[:, None] * 0.5
    np.savez(tmp_path / "one.npz", features=F, labels=y, clients=np.ones(600, int))
    args = [
        "--partition",
        "natural",
        "--clip",
        "5",
        "--eps",
        "1",
        "--secure-agg",
        "mask",
        "--quiet",
        "--no-plot",
    ]
    r = _command("tradeoff", [*args, "--dataset", f"file:{tmp_path / 'one.npz'}", "--out", "o"], tmp_path)
    assert r.returncode == 2 and "--secure-agg mask needs 2 or more clients" in r.stderr, r.stderr
    assert "gives rows to 1" in r.stderr and not (tmp_path / "o").exists()


def test_a_flag_given_twice_is_refused_even_when_its_first_value_is_its_default():
    """--frac-bits 32 --frac-bits 16 kept 16: the first value equalled the default object (a cached small int)."""
    from privfed.commands.options import flower_parser

    with pytest.raises(ConfigError, match=r"argument --frac-bits: given twice \(32, then 16\)"):
        flower_parser().parse_args(["--frac-bits", "32", "--frac-bits", "16"])
    assert flower_parser().parse_args(["--frac-bits", "16"]).frac_bits == 16  # a fresh parse: given once


def test_noise_multiplier_rounds_as_a_numpy_integer_count_as_those_rounds():
    from mechanisms import GaussianMechanism

    a = GaussianMechanism(noise_multiplier=1.0, delta=1e-5, clip=5.0, rounds=4)
    b = GaussianMechanism(noise_multiplier=1.0, delta=1e-5, clip=5.0, rounds=np.int64(4))
    assert a.epsilon == b.epsilon > GaussianMechanism(noise_multiplier=1.0, delta=1e-5, clip=5.0).epsilon


# ---------------------------------------------------------------- a second battery round: the API and replays
def _digits_federation():
    from privfed.data import load_dataset
    from privfed.federation import partition

    ds = load_dataset("digits", progress=False)
    part = partition(ds.train_labels, 10, "iid", rng=0)
    F, y, k = part.apply(ds.train_features, ds.train_labels)
    return ds, F, y, k


@pytest.mark.parametrize("method", ["fedncm", "fedcof", "fedcof-oracle", "fed3r-within"])
def test_a_head_whose_classes_share_one_weight_row_says_it_predicts_one_class(method, digits_cache):
    """With one feature, normalise=True leaves every class mean only its sign: these heads predicted one class
    (accuracy at chance) with no note."""
    import privfed

    ds, F, y, k = _digits_federation()
    one = privfed.fit(method, F[:, 30:31], y, k)
    assert np.unique(one.predict(ds.test_features[:, 30:31])).size == 1
    assert any("every class has the same weight row" in n for n in one.notes), one.notes
    assert not any("same weight row" in n for n in privfed.fit(method, F, y, k).notes)


def test_fedlog_with_a_feature_scale_that_overflows_says_so(digits_cache):
    """feature_scale=1e-200 used to end in scipy's "The function value at x=-1.0 is NaN" (a traceback)."""
    import privfed

    _, F, y, k = _digits_federation()
    with pytest.raises(InputError, match=r"at feature_scale=1e-200 has squared norms beyond the float range"):
        privfed.fit("fedlog", F, y, k, feature_scale=1e-200)
    assert privfed.fit("fedlog", F, y, k, feature_scale=1e-100).weight.shape == (10, F.shape[1])


def test_the_estimators_score_names_a_y_of_another_length(digits_cache):
    from privfed.estimators import FederatedHeadClassifier

    ds, *_ = _digits_federation()
    est = FederatedHeadClassifier().fit(ds.train_features, ds.train_labels)
    with pytest.raises(
        InputError, match=r"score: Found input variables with inconsistent numbers of samples"
    ):
        est.score(ds.test_features, ds.test_labels[:-1])
    assert 0.5 < est.score(ds.test_features, ds.test_labels) <= 1.0


def test_a_record_of_another_command_or_schema_is_refused_as_a_config(tmp_path):
    """An attack results.json passed to the trade-off got a list of unknown settings; one whose command or
    schema had been changed was replayed without a word."""
    from privfed.results.record import SCHEMA
    from privfed.tradeoff import build_parser, resolve_config

    def record(command, schema=SCHEMA):
        path = tmp_path / f"{command}-{schema.replace('/', '_')}.json"
        path.write_text(json.dumps({"schema": schema, "command": command, "config": {"seeds": 1}}))
        return str(path)

    with pytest.raises(
        ConfigError, match=r"is a privfed.attack record, not a privfed.tradeoff one; replay it with "
    ):
        resolve_config(build_parser().parse_args(["--config", record("attack")]))
    with pytest.raises(ConfigError, match=r"is a record of schema 'privfed.run/999'"):
        resolve_config(build_parser().parse_args(["--config", record("tradeoff", "privfed.run/999")]))
    assert resolve_config(build_parser().parse_args(["--config", record("tradeoff")])).seeds == (0,)


@pytest.mark.parametrize("command", ["tradeoff", "attack"])
def test_alpha_outside_a_dirichlet_split_is_refused_not_ignored(command):
    """--partition groups --alpha 0.5 (attack) and --partition iid --alpha 0.3 ran, alpha ignored."""
    from privfed.commands.attack.config import resolve_config as attack_config
    from privfed.commands.options import attack_parser
    from privfed.tradeoff import build_parser, resolve_config

    if command == "tradeoff":
        parse, args = (lambda a: resolve_config(build_parser().parse_args(a))), ["--partition", "iid"]
    else:
        parse, args = (
            (lambda a: attack_config(attack_parser().parse_args(a))),
            ["--attack", "labels", "--partition", "groups"],
        )
    with pytest.raises(ConfigError, match=r"--alpha applies to --partition dirichlet or dirichlet-class"):
        parse([*args, "--alpha", "0.5"])
    base = ["--attack", "labels"] if command == "attack" else []
    assert parse([*base, "--partition", "dirichlet", "--alpha", "0.5"]).alpha == 0.5


@pytest.mark.parametrize(
    "make",
    [
        lambda: __import__("privfed").methods.get("fedlog", chi="1"),
        lambda: __import__("privfed").methods.get("fedlog", chi=True),
        lambda: _gaussian(epsilon="1"),
        lambda: _gaussian(epsilon=True),
        lambda: _gaussian(delta="1e-5"),
        lambda: _gaussian(clip="30"),
        lambda: _gaussian(clip=True),
        lambda: _gaussian(sampling_rate="0.5"),
        lambda: _gaussian(epsilon=None, noise_multiplier="2"),
        lambda: _gaussian(epsilon=None, noise_multiplier=np.bool_(True)),
        lambda: _count_noise(epsilon="1"),
        lambda: _count_noise(epsilon=True),
    ],
)
def test_a_string_or_bool_is_no_number_for_a_budget_clip_or_prior(make):
    """epsilon=True ran as epsilon 1 and clip="30" as 30 (float() takes both), noise_multiplier="2" as 2; nu="2"
    was already refused."""
    with pytest.raises(ConfigError, match="must be (a )?numbers?"):
        make()


def _gaussian(**kw):
    from mechanisms.dp.gaussian.mechanism import GaussianMechanism

    return GaussianMechanism(**{"epsilon": 1.0, "delta": 1e-5, "clip": 1.0, **kw})


def _count_noise(**kw):
    from mechanisms.dp.count_noise import LaplaceCountNoise

    return LaplaceCountNoise(**kw)


def test_numpy_numbers_stay_numbers_for_a_budget_and_a_clip():
    m = _gaussian(epsilon=np.float32(2.0), clip=np.int64(3))
    assert (m.epsilon, m.clip_bound) == (2.0, 3.0)


# ---------------------------------------------------------------- a third battery: what the flags said vs what ran
def test_a_config_file_turns_the_strongest_suite_off_and_a_replay_keeps_it_off(digits_cache, tmp_path):
    """strongest = false in a config (or the record of a --no-strongest run) ran the whole suite: the flag's
    default beat the file."""
    (tmp_path / "a.toml").write_text('attack = "tracing"\nclients = 5\nstrongest = false\neps = 1\n')
    res = _command("attack", ["--config", "a.toml", "--out", "o1", "--quiet", "--no-plot"], tmp_path)
    assert res.returncode == 0, res.stderr[-600:]
    rec = json.loads((tmp_path / "o1" / "results.json").read_text())
    assert rec["config"]["strongest"] is False and "strongest[" not in res.stdout
    res = _command("attack", ["--config", "o1/results.json", "--out", "o2", "--quiet", "--no-plot"], tmp_path)
    assert res.returncode == 0, res.stderr[-600:]
    assert json.loads((tmp_path / "o2" / "results.json").read_text())["config"]["strongest"] is False
    (tmp_path / "b.toml").write_text('attack = "tracing"\nclients = 5\ndevice = 3\n')
    res = _command("attack", ["--config", "b.toml", "--out", "o3", "--quiet", "--no-plot"], tmp_path)
    assert res.returncode == 2 and "--device must be cpu or cuda[:i], got 3" in res.stderr, res.stderr[-600:]
    (tmp_path / "c.toml").write_text('attack = "tracing"\nclients = 5\nstrongest = "false"\n')
    res = _command("attack", ["--config", "c.toml", "--out", "o4", "--quiet", "--no-plot"], tmp_path)
    assert res.returncode == 2 and "strongest in --config must be true or false, got 'false'" in res.stderr


def test_uniform_count_noise_keeps_its_no_noise_reference_row(digits_cache, tmp_path):
    """eps = inf builds no count noise: the reference row beside uniform budgets runs (refusing it was a
    regression of the check that refuses budgets above 1)."""
    res = _command(
        "tradeoff",
        [
            "--count-noise",
            "uniform",
            "--eps",
            "0.5,inf",
            "--method",
            "fedcof",
            "--out",
            "u",
            "--quiet",
            *SMALL,
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-600:]
    rows = json.loads((tmp_path / "u" / "results.json").read_text())["records"]
    assert sorted(float(r["epsilon"]) for r in rows) == [0.5, float("inf")]  # JSON writes inf as "inf"


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("tradeoff", ["--eps", "1,1"], "--eps lists a budget twice: '1,1'"),
        ("attack", ["--attack", "singleton", "--eps", "inf,Infinity"], "--eps lists a budget twice"),
        (
            "tradeoff",
            ["--count-noise", "uniform", "--eps", "0.5,2"],
            "--count-noise uniform needs every --eps in (0, 1]",
        ),
        ("attack", ["--attack", "tracing", "--count-noise", "uniform", "--eps", "inf,3"], "got 3;"),
        (
            "tradeoff",
            ["--dataset", "file:ok.npz", "--backbone", "vit_b_16", "--clip", "3"],
            "does not apply to a feature file",
        ),
        (
            "tradeoff",
            ["--count-noise", "laplace", "--delta", "0.001", "--method", "fedcof"],
            "--delta does nothing with --count-noise laplace",
        ),
        (
            "tradeoff",
            ["--count-noise", "gaussian", "--calibration", "analytic", "--method", "fedcof"],
            "--calibration does nothing with --count-noise gaussian",
        ),
        (
            "attack",
            ["--attack", "singleton", "--strongest"],
            "--strongest applies to --attack inversion or tracing",
        ),
    ],
)
def test_a_flag_that_would_run_twice_fail_midway_or_do_nothing_is_refused_first(
    command, args, message, tmp_path
):
    """--eps 1,1 ran twice and showed a spread of 0; uniform count noise at eps 2 stopped the sweep after the
    runs before it; --backbone with a feature file was recorded but ran nowhere."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ok.npz", features=rng.normal(size=(300, 5)), labels=np.arange(300) % 3)
    res = _command(
        command, [*args, "--clients", "5", "--out", "o", "--no-plot"], tmp_path, stdin=subprocess.DEVNULL
    )
    assert res.returncode == 2 and message in res.stderr, res.stderr[-600:]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_the_clip_line_of_a_multi_round_run_names_its_own_default(digits_cache, tmp_path):
    res = _command(
        "tradeoff",
        [
            "--rounds",
            "2",
            "--local-epochs",
            "1",
            "--clients",
            "3",
            "--eps",
            "1",
            "--out",
            "r",
            "--no-plot",
            "--quiet",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-600:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("clip:"))
    assert (
        line == "clip: 2 (coordinate; multi-round FedLog's default bound (privfed.rounds; no privacy cost))"
    )


def test_noiseless_means_keep_the_support_test_a_number():
    """tau = 0 (count noise: the means in clear) with the test switched off (support_z = inf) gave inf * 0 = NaN
    scores and a numpy warning in the sweep's notes."""
    from attacks.tracing.scores import trace_scores

    class Model:
        mean = np.zeros(3)

    rng = np.random.default_rng(1)
    Y, M = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    with np.errstate(invalid="raise"):
        s = trace_scores(Y, M, np.full(4, 5.0), Model(), tau=0.0, test="support", support_z=float("inf"))
    assert np.array_equal(s, np.zeros(4))


def test_a_support_test_with_no_noise_allowance_stays_a_number_under_infinite_noise():
    """support_z = 0 (no allowance for noise) with infinite noise (tau = inf) gave 0 * inf = NaN scores: it is
    the strict test (only float rounding allowed), so a target with a coordinate above the released sum scores
    by how far it is above, one below scores 0."""
    from attacks.tracing.scores import trace_scores

    class Model:
        mean = np.zeros(2)

    Y = np.array([[3.0, 0.0], [0.0, 0.0]])
    M = np.array([[1.0, 1.0], [1.0, 1.0]])  # sums n * M = (2, 2) at n = 2
    with np.errstate(invalid="raise"):
        s = trace_scores(Y, M, np.full(2, 2.0), Model(), tau=np.inf, test="support", support_z=0.0)
    assert s[1] == 0.0 and s[0] == pytest.approx(-(3.0 - 2.0), abs=1e-8)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threshold", "3"], "threshold=3 is the Shamir threshold of pairwise masking"),
        (["--threshold", "2", "--secure-agg", "ckks"], "threshold=2 is the Shamir threshold"),
        (["--frac-bits", "16"], "--frac-bits is the fixed-point encoding of pairwise masking"),
        (["--alpha", "0.5", "--partition", "iid"], "--alpha applies to --partition dirichlet"),
    ],
)
def test_flower_refuses_flags_that_would_do_nothing(args, message, tmp_path):
    """Each ran as if absent, where the other commands (and --degree here) refuse them.  --out names a file,
    so nothing could start even if a check came too late."""
    (tmp_path / "afile").write_text("")
    res = _command("flower", ["--clients", "4", *args, "--out", "afile"], tmp_path, stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and message in res.stderr, res.stderr[-600:]


@pytest.mark.parametrize(
    "name, params",
    [
        ("fed3r", {"lam": 1e308}),
        ("fedcof", {"gamma": 1e306}),
        ("fedcof", {"noise_var": 1e308}),
        ("fed3r-within", {"gamma": 1e308}),
        ("fedcof-oracle", {"gamma": 1e308}),
    ],
)
def test_a_regulariser_past_the_float_range_is_refused_naming_it(name, params):
    """lam = 1e308 leaked numpy overflow warnings and gave an all-zero head whose note blamed constant features;
    at the largest regulariser taken (1e100) every method still fits without a warning."""
    import warnings

    from privfed._linalg import MAX_REGULARISER

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)
    key = next(iter(params))
    with pytest.raises(ConfigError, match=rf"method '{name}': {key} must be <= 1e\+100, got {key}=1e\+30"):
        __import__("privfed").fit(name, X, y, np.arange(120) % 3, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = __import__("privfed").fit(name, X, y, np.arange(120) % 3, **{key: MAX_REGULARISER})
    assert np.isfinite(head.weight).all()


def test_a_fedlog_prior_past_the_float_range_names_chi():
    """chi = 1e200 was refused as features too large for the float range (pass feature_scale='auto'), advice
    that cannot help: the prior is what squares past it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    y = (X[:, 0] > 0).astype(int)
    limit = f"{np.sqrt(np.finfo(float).max / 6):.3g}"  # a row of d + 1 = 6 entries below it squares in range
    with pytest.raises(
        ConfigError,
        match=rf"chi \(FedLog's prior, largest \|entry\| 1e\+200\).*entries below {re.escape(limit)} ",
    ):
        __import__("privfed").fit("fedlog", X, y, np.arange(120) % 3, chi=1e200)
    assert np.isfinite(__import__("privfed").fit("fedlog", X, y, np.arange(120) % 3, chi=1e150).weight).all()


def test_running_out_of_memory_is_one_line_not_a_traceback(capsys):
    """An allocation past what the memory checks foresaw ended in numpy's _ArrayMemoryError traceback."""
    from privfed.commands.common import cli_entry

    def body(argv):
        np.empty((1 << 62,), dtype=np.uint8)  # numpy's MemoryError, as an allocation the machine cannot make
        return 0

    assert cli_entry("python -m privfed.tradeoff", body)([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "python -m privfed.tradeoff: error: out of memory (Unable to allocate"
    )


def test_the_memory_checks_see_an_address_space_limit(tmp_path):
    """Under ulimit -v the checks saw only the machine's free memory, let a run start that needed far more
    than the process could map, and it died of a MemoryError."""
    code = (
        "import resource, sys\n"
        "from privfed._validation import available_memory\n"
        "free = available_memory()\n"
        "with open('/proc/self/status') as fh:\n"
        "    size = next(int(l.split()[1]) * 1024 for l in fh if l.startswith('VmSize:'))\n"
        "limit = size + (256 << 20)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))\n"
        "room = available_memory()\n"
        "print(free > 300 << 20, 0 < room <= 256 << 20)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PRIVFED_MEMORY_LIMIT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr[-500:]


def test_fedlog_features_past_the_float_range_name_the_command_line_fix_too():
    """The refusal named feature_scale='auto', a Python spelling the command's users cannot type; it now gives
    --param fedlog.feature_scale=auto beside it."""
    rng = np.random.default_rng(0)
    X = np.abs(rng.normal(size=(120, 5))) * 1e200
    y = np.arange(120) % 3
    with pytest.raises(
        InputError, match=r"feature_scale='auto' \(on the command line: --param fedlog\.feature_scale=auto\)"
    ):
        __import__("privfed").fit("fedlog", X, y, np.arange(120) % 3)


@pytest.mark.parametrize(
    "out, inside", [(".", "./run1"), ("..", "../run1"), ("/", "/run1"), ("results/run1/..", "results/run1")]
)
def test_an_out_that_is_the_current_folder_gets_a_folder_to_name_instead(out, inside):
    """Before: '--out .' was told it "does not name a folder", though it names the one the user is in."""
    from privfed.results.writer import check_out_path

    with pytest.raises(
        ConfigError, match=f"names the folder {re.escape(repr(os.path.abspath(out)))} itself"
    ) as exc:
        check_out_path(out, overwrite=True)
    assert f"such as {inside!r}" in str(exc.value)
    with pytest.raises(ConfigError, match="--out is empty; pass a folder path"):
        check_out_path("  ", overwrite=False)


def test_a_roster_of_the_wrong_kind_is_named_not_a_bare_key(tmp_path):
    """Before: an identity file given as the roster ended "...: 'threshold'", the KeyError's bare key."""
    from mechanisms.secagg.identity import Roster, make_roster

    roster, ids = make_roster(3)
    ident = json.dumps({"index": 0, "private_key": ids[0].private_key.hex()})
    with pytest.raises(ConfigError, match=r"has no 'threshold' field: it is a node's identity file") as exc:
        Roster.from_json(ident, "secagg-roster=node-0.json")
    assert not str(exc.value).endswith("'threshold'")
    no_keys = json.loads(roster.to_json())
    del no_keys["public_keys"]
    with pytest.raises(ConfigError, match=r"has no 'public_keys' field$"):
        Roster.from_json(json.dumps(no_keys))


def test_api_mistakes_get_errors_that_name_them():
    """Before: numpy's 'zero-size array to reduction operation' from a partition of 0 clients, pathlib's
    TypeError from a numeric cache_dir, and inspect's bare 'too many positional arguments'."""
    from mechanisms import GaussianMechanism
    from privfed.data import load_dataset
    from privfed.federation import Partition

    for k in (0, -2, 1.5):
        with pytest.raises(InputError, match=f"Partition.num_clients must be an integer >= 1, got {k}"):
            Partition(np.array([-1]), k, "x")
    with pytest.raises(ConfigError, match="cache_dir must be a folder path .* got 3"):
        load_dataset("digits", cache_dir=3)
    with pytest.raises(TypeError, match=r"GaussianMechanism.__init__\(\) takes 1 positional argument but 4"):
        GaussianMechanism(1.0, 1e-5, 1.0)
    with pytest.raises(
        TypeError, match=r"GaussianMechanism.__init__\(\) got an unexpected keyword argument 'eps'"
    ):
        GaussianMechanism(eps=1.0, delta=1e-5, clip=1.0)


def test_messages_name_the_argument_the_caller_gave(tmp_path):
    """Before: max_file_bytes was refused as 'max_bytes', a head's score told the caller to 'raise
    num_classes' (score has none), and a data set's test columns were checked against 'the model'."""
    import privfed
    from privfed.data import FeatureDataset, load_dataset

    with pytest.raises(ConfigError, match="^max_file_bytes must be a positive int, got -1"):
        load_dataset("file:x.npz", max_file_bytes=-1)
    F, y = np.eye(4)[:, :3], np.array([0, 1, 0, 1])
    head = privfed.fit("fedncm", F, y)
    with pytest.raises(InputError, match=r"labels contains 2, but the head has 2 classes \(0..1\)"):
        head.score(F, y + 1)
    with pytest.raises(InputError, match="test_features has 2 columns but train_features has d=3"):
        FeatureDataset("x", F, y, F[:, :2], y, num_classes=2)


def test_a_zero_head_from_underflowing_private_features_names_that_cause():
    """Under privacy the features are not rescaled (the clip is in their units): features of 1e-200 give class
    means whose squared norms underflow, and the zero head's note blamed constant features alone."""
    import math

    import privfed
    from mechanisms import GaussianMechanism

    F = np.random.default_rng(0).normal(size=(40, 3)) * 1e-200
    y, k = np.arange(40) % 2, np.arange(40) % 4
    head = privfed.fit("fedncm", F, y, k, num_classes=2, num_clients=4,
                       privacy=GaussianMechanism(epsilon=math.inf, delta=1e-5, clip=1e-200))  # fmt: skip
    assert not head.weight.any() and any("squares underflow float64" in n for n in head.notes)
