"""``python -m privfed.attack``: end to end on tiny configurations, and one-line errors."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest

from privfed.attack import main


def _read(out):
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    res = json.loads((out / "results.json").read_text())  # the run record: its config as run, among the rest
    return rows, res, res["config"]


def test_inversion_sweep_writes_csv_json_and_grids(tmp_path, digits_cache, capsys):
    out = tmp_path / "inv"
    rc = main(
        [
            "--attack",
            "inversion",
            "--method",
            "fedncm",
            "--eps",
            "inf,1",
            "--partition",
            "groups",
            "--n",
            "1",
            "--max-groups",
            "6",
            "--steps",
            "20",
            "--no-strongest",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows, res, cfg = _read(out)
    assert [(r["epsilon"], r["n"]) for r in rows] == [("inf", "1"), ("1.0", "1")]
    assert {"psnr", "ssim", "identification", "delta_psnr", "baseline_psnr"} <= set(rows[0])
    assert all(math.isfinite(float(r["psnr"])) for r in rows)
    assert cfg["attack"] == "inversion" and cfg["seeds"] == [0] and cfg["attack_params"] == {"steps": 20}
    assert res["clip_used"] > 0 and "numpy" in res["versions"]
    assert len(res["records"]) == 2
    assert (out / "grid_fedncm_epsinf_n1.png").stat().st_size > 0
    assert (out / "grid_fedncm_eps1_n1.png").exists()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    "attack,extra",
    [
        ("tracing", ["--method", "fedncm", "--partition", "groups", "--n", "1,8"]),
        ("subspace", ["--method", "fed3r", "--partition", "groups", "--n", "2"]),
        (
            "unmixing",
            ["--method", "fedcgs", "--partition", "groups", "--n", "2", "--max-groups", "4", "--eps", "inf"],
        ),
        ("singleton", ["--method", "fedcof", "--partition", "dirichlet", "--clients", "20"]),
        (
            "labels",
            [
                "--method",
                "fedncm",
                "--partition",
                "dirichlet",
                "--clients",
                "20",
                "--count-noise",
                "laplace",
                "--eps",
                "1,inf",
            ],
        ),
        ("differencing", ["--method", "fed3r", "--partition", "groups", "--n", "3", "--max-groups", "10"]),
    ],
)
def test_statistics_attacks_run_from_the_command_line(tmp_path, digits_cache, attack, extra):
    out = tmp_path / attack
    assert main(["--attack", attack, "--out", str(out), "--seed", "0,1", *extra]) == 0
    rows, res, _ = _read(out)
    assert rows and all(r["attack"] == attack for r in rows)
    assert {r["seed"] for r in rows} == {"0", "1"}


def test_same_seed_same_csv(tmp_path, digits_cache):
    args = [
        "--attack",
        "tracing",
        "--method",
        "fedncm",
        "--partition",
        "groups",
        "--n",
        "2",
        "--eps",
        "inf,4",
    ]
    main([*args, "--out", str(tmp_path / "a")])
    main([*args, "--out", str(tmp_path / "b")])
    drop = ("seconds", "cpu_s", "strongest_seconds", "strongest_cpu_s")
    a, b = (_read(tmp_path / x)[0] for x in "ab")
    assert [{k: v for k, v in r.items() if k not in drop} for r in a] == [
        {k: v for k, v in r.items() if k not in drop} for r in b
    ]


def test_a_run_is_the_same_in_any_sweep_that_holds_it_and_on_tradeoffs_federation(tmp_path, digits_cache):
    """The partition was seeded by the positions of n, eps and the method in the command line: fedncm at
    eps=inf exposed 0.077 alone, 0.095 after --eps 1 and 0.083 after another method, on a federation
    privfed.tradeoff never drew.  Each run now depends on its seed and its own values only."""
    from privfed.tradeoff import main as tradeoff_main

    drop = ("seconds", "cpu_s", "strongest_seconds", "strongest_cpu_s")
    rows = {}
    for name, methods, eps in (
        ("a", "fedncm", "1,inf"),
        ("b", "fedcof,fedncm", "inf,1"),
        ("c", "fedncm", "inf"),
    ):
        common = ["--attack", "singleton", "--clients", "20", "--seeds", "2", "--no-plot", "--quiet"]
        assert main([*common, "--method", methods, "--eps", eps, "--out", str(tmp_path / name)]) == 0
        rows[name] = {
            (r["method"], r["epsilon"], r["seed"]): {k: v for k, v in r.items() if k not in drop}
            for r in _read(tmp_path / name)[0]
        }
    assert len(rows["a"]) == 4 and len(rows["b"]) == 8 and len(rows["c"]) == 2
    for key, row in rows["a"].items():
        assert rows["b"][key] == row  # the noise of eps=1 too: drawn from the run's own values
    for key, row in rows["c"].items():
        assert rows["a"][key] == row
    for seed in "01":
        exposed = [float(rows["b"][(m, "inf", seed)]["exposed_fraction"]) for m in ("fedncm", "fedcof")]
        assert exposed[0] == exposed[1]  # without noise both expose what the one federation holds
        argv = [
            "--method",
            "fedncm",
            "--eps",
            "inf",
            "--attack",
            "singleton",
            "--clients",
            "20",
            "--seeds",
            f"{seed},",
        ]
        assert tradeoff_main([*argv, "--out", str(tmp_path / f"t{seed}"), "--no-plot", "--quiet"]) == 0
        (row,) = _read(tmp_path / f"t{seed}")[0]
        # and tradeoff's seed draws that federation
        assert float(row["attack_singleton_exposed_fraction"]) == exposed[0]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--attack", "nope", "--out", "X"], "unknown attack 'nope'"),
        (["--attack", "tracing", "--eps", "-1", "--out", "X"], "--eps must be > 0"),
        (["--attack", "tracing", "--eps", "abc", "--out", "X"], "is not a number"),
        (
            ["--attack", "tracing", "--secure-agg", "paillier", "--out", "X"],
            "--secure-agg must be none, mask or ckks",
        ),
        (
            ["--attack", "tracing", "--clients", "2.5", "--out", "X"],
            "--clients must be an integer, got '2.5'",
        ),
        (["--attack", "tracing", "--method", "fedx", "--out", "X"], "unknown method 'fedx'"),
        (
            ["--attack", "subspace", "--method", "fedncm", "--partition", "groups", "--n", "2", "--out", "X"],
            "reads each client's second moment, which fedncm does not upload; use --method fed3r,",
        ),
        (["--attack", "tracing", "--backend", "pixel", "--out", "X"], "applies to --attack inversion only"),
        # each of these ran, the setting ignored (recorded as if it had applied), or the last switch won
        (
            ["--attack", "inversion", "--backend", "decoder", "--steps", "5", "--out", "X"],
            "--steps applies to the pixel and dip backends, not --backend decoder",
        ),
        (
            ["--attack", "singleton", "--eps", "inf", "--count-noise", "laplace", "--out", "X"],
            "no eps is finite",
        ),
        (
            ["--attack", "singleton", "--eps", "inf", "--delta", "0.5", "--out", "X"],
            "--delta is a setting of the DP",
        ),
        (
            ["--attack", "tracing", "--strongest", "--no-strongest", "--out", "X"],
            "given twice (--strongest, then",
        ),
        (["--attack", "inversion", "--backend", "gan", "--out", "X"], "unknown inversion backend"),
        (
            ["--attack", "labels", "--count-noise", "poisson", "--out", "X"],
            "--count-noise: unknown count noise",
        ),
        (
            ["--attack", "labels", "--partition", "stripes", "--out", "X"],
            "unknown partition scheme 'stripes'",
        ),
        (["--attack", "tracing", "--partition", "groups", "--n", "0", "--out", "X"], "--n must be >= 1"),
        (["--attack", "tracing", "--n", "2", "--out", "X"], "--n applies to --partition groups"),
        # refused before the eps = inf runs (it was refused after them, with their rows left partial)
        (
            ["--attack", "singleton", "--method", "fedcof", "--param", "fedcof.means_per_client=3"]
            + ["--eps", "inf,1", "--out", "X"],
            "no per-record sensitivity bounds its release, since means_per_client=3",
        ),
    ],
)
def test_bad_invocations_print_one_line_and_exit_non_zero(tmp_path, digits_cache, capsys, argv, needle):
    argv = [a.replace("X", str(tmp_path / "o")) for a in argv]
    assert main(argv) == 2
    assert not (tmp_path / "o").exists()  # nothing run, nothing written
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and err.startswith("python -m privfed.attack: error:") and needle in err
    ), err


def test_module_entry_point_exits_non_zero_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "privfed.attack", "--attack", "nope", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_existing_output_folder_is_not_overwritten(tmp_path, digits_cache, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["--attack", "labels", "--partition", "iid", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the strongest attack in the CLIs
def _gdp_auc_tolerance(bound: float, n_pos, n_neg) -> float:
    """One-sided 3 Hanley-McNeil standard errors of an AUC at the bound, from the game's numbers of pairs."""
    from attacks.metrics import auc_se

    return 3 * auc_se(bound, int(n_pos), int(n_neg))


def test_attack_cli_reports_the_strongest_tracing_test_and_it_stays_under_the_gdp_bound(
    tmp_path, digits_cache, capsys
):
    from attacks.strongest import SUITES
    from attacks.theory import gdp_auc_bound
    from attacks.view import gaussian_sigma

    out = tmp_path / "tr"
    assert (
        main(
            [
                "--attack",
                "tracing",
                "--method",
                "fedncm",
                "--partition",
                "dirichlet",
                "--clients",
                "20",
                "--eps",
                "inf,1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    rows, _, _ = _read(out)
    suite = list(SUITES["tracing"])
    printed = capsys.readouterr().out
    for r in rows:
        aucs = {t: float(r[f"{t}:auc"]) for t in suite}
        assert r["strongest_attack"] in suite and float(r["strongest_auc"]) == max(aucs.values())
        assert f"strongest[{r['strongest_attack']}]" in printed
        # the individual test sits next to the suite on the same targets: its AUC is the suite's lrt AUC
        assert float(r["auc"]) == aucs["lrt"]
        if r["epsilon"] == "1.0":
            # GaussianMechanism: sigma = sqrt(clip^2 + 1) * sigma_1 on sums and counts (joint add/remove
            # sensitivity), so the release of one record is mu-GDP with mu = 1 / sigma_1.
            bound = gdp_auc_bound(1.0 / gaussian_sigma(1.0, float(r["delta"])))
            tol = _gdp_auc_tolerance(bound, r["n_pos"], r["n_neg"])
            assert all(a <= bound + tol for a in aucs.values()), (aucs, bound)
    assert {r["epsilon"] for r in rows} == {"inf", "1.0"}
    # --no-strongest keeps the individual attack only
    out2 = tmp_path / "tr2"
    assert (
        main(
            [
                "--attack",
                "tracing",
                "--method",
                "fedncm",
                "--partition",
                "groups",
                "--n",
                "2",
                "--eps",
                "inf",
                "--no-strongest",
                "--out",
                str(out2),
                "--quiet",
            ]
        )
        == 0
    )
    assert "strongest_attack" not in _read(out2)[0][0]


def test_tradeoff_tracing_column_is_the_strongest_test_named_and_under_the_gdp_bound(
    tmp_path, digits_cache, capsys
):
    from attacks.strongest import SUITES
    from attacks.theory import gdp_auc_bound
    from privfed.tradeoff import main as tradeoff_main

    out = tmp_path / "to"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedncm",
                "--eps",
                "1,inf",
                "--seeds",
                "2",
                "--clients",
                "20",
                "--attack",
                "tracing",
                "--out",
                str(out),
                "--quiet",
                "--no-plot",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    suite = list(SUITES["tracing"])
    for r in data["records"]:
        aucs = {t: r[f"attack_tracing_{t}:auc"] for t in suite}
        assert r["attack_tracing_strongest"] in suite
        assert r["attack_tracing_auc"] == max(aucs.values()) == aucs[r["attack_tracing_strongest"]]
        if math.isfinite(float(r["epsilon"])):
            # mu of the Gaussian release of one record, from what the run wrote: sums (sensitivity clip) and
            # counts (sensitivity 1), each with its own sigma
            mu = math.hypot(r["clip"] / r["sigma"], 1.0 / r["sigma_counts"])
            bound = gdp_auc_bound(mu)
            tol = _gdp_auc_tolerance(bound, r["attack_tracing_n_pos"], r["attack_tracing_n_neg"])
            assert all(a <= bound + tol for a in aucs.values()), (aucs, bound)
    assert "tracing auc (strongest)" in table
    for s in data["summary"]:
        names = s["attack_tracing_strongest"].split("/")
        assert set(names) <= set(suite)
        assert any(
            line.split()[:1] == [s["method"]] and line.rstrip().endswith(s["attack_tracing_strongest"])
            for line in table.splitlines()
        )


def test_help_lists_every_inversion_backend_and_the_strongest_suite(capsys):
    from attacks.inversion.attack import BACKENDS
    from attacks.strongest import SUITES

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in (*BACKENDS, *SUITES["inversion"]):
        assert name in text, name
    assert "learned" in text and "joint" in text
    # --level client is always refused here: the help says so before a run does
    assert "the attacks' releases are record level only" in text


def test_a_noisy_release_that_leaves_the_attack_nothing_is_a_row_not_the_end_of_the_sweep(
    tmp_path, digits_cache
):
    """Unmixing at eps=1 found no client whose noisy counts totalled 1..8 and stopped the whole sweep
    (exit 2, "no client holds 1..8 samples", though every client held 2)."""
    args = ["--attack", "inversion", "--method", "fedcgs", "--eps", "inf,1", "--no-strongest", "--partition"]
    args += [
        "groups",
        "--n",
        "2",
        "--max-groups",
        "4",
        "--max-cells",
        "2",
        "--source",
        "second",
        "--steps",
        "20",
    ]
    assert main([*args, "--out", str(tmp_path / "o"), "--quiet", "--no-plot"]) == 0
    rows = {r["epsilon"]: r for r in _read(tmp_path / "o")[0]}
    assert rows["1.0"]["not_applicable"].startswith(
        "on this noisy release: no client's released counts total"
    )
    assert not rows["inf"]["not_applicable"] and float(rows["inf"]["identification"]) >= 0


def test_a_config_files_attack_params_reach_the_attack_it_names(tmp_path, digits_cache, capsys):
    """[attack_params] of a singleton run were built into an inversion attack (to configure decoders no
    statistics attack trains) and refused as 'attack 'inversion' got unknown parameter(s)'."""
    cfg = tmp_path / "singleton.toml"
    cfg.write_text(
        'attack = "singleton"\nmethod = "fedncm"\neps = "inf"\n[attack_params]\ntolerance = 0.001\n'
    )
    assert main(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
    rows, res, _ = _read(tmp_path / "out")
    assert rows and all(r["attack"] == "singleton" for r in rows)
    assert res["config"]["attack_params"] == {"tolerance": 0.001}
    cfg.write_text('attack = "singleton"\nmethod = "fedncm"\neps = "inf"\n[attack_params]\nsteps = 3\n')
    assert main(["--config", str(cfg), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "singleton" in err and "steps" in err and "inversion" not in err


@pytest.mark.parametrize(
    "text, argv, needle",
    [
        ('attack = "labels"\nattack_params = [1]\n', [], "attack_params in --config must be a table"),
        ('attack = "labels"\nattack_params = "lr"\n', [], "attack_params in --config must be a table"),
        (
            'attack = "labels"\ndata_seed = 3\n',
            [],
            "data_seed in --config: the attacks run on the digits split",
        ),
        (
            'attack = "singleton"\n',
            ["--partition", "groups", "--clients", "5"],
            "--clients applies to the splits",
        ),
        # found only after fed3r's runs had finished
        (
            'attack = "subspace"\n',
            ["--method", "fed3r,fedlog"],
            "which fedlog does not upload; use --method fed3r,",
        ),
    ],
)
def test_settings_the_attack_would_ignore_or_crash_on_are_refused(tmp_path, capsys, text, argv, needle):
    """attack_params that were no table was a traceback; data_seed = 3 ran seed 0 and --clients under
    --partition groups ran 40 clients, each recording the value it ignored."""
    cfg = tmp_path / "s.toml"
    cfg.write_text(text)
    assert main(["--config", str(cfg), *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_the_default_spellings_help_shows_are_taken(tmp_path, digits_cache):
    """--count-noise none (help: "default: none") was an unknown count noise; --secure-agg MASK was refused where
    --method FEDLOG was taken."""
    for i, argv in enumerate((["--count-noise", "none"], ["--secure-agg", "MASK"])):
        out = tmp_path / f"o{i}"
        assert main(["--attack", "singleton", *argv, "--out", str(out), "--quiet"]) == 0
        config = json.loads((out / "results.json").read_text())["config"]
        assert config["count_noise"] is None if i == 0 else config["secure_agg"] == "mask"


def test_a_replayed_record_keeps_its_steps_with_any_backend(tmp_path, digits_cache):
    """A record written before --steps was refused for the learned backends carries steps with one: its replay
    is taken as recorded (a user's --steps with such a backend is refused, above)."""
    from privfed.attack import build_parser, resolve_config

    out = tmp_path / "o"
    argv = [
        "--attack",
        "inversion",
        "--no-strongest",
        "--max-cells",
        "1",
        "--steps",
        "2",
        "--method",
        "fedncm",
    ]
    assert main([*argv, "--quiet", "--no-plot", "--out", str(out)]) == 0
    rec = json.loads((out / "results.json").read_text())
    rec["config"]["attack_params"] = {"backend": "learned", "steps": 5}
    (tmp_path / "r.json").write_text(json.dumps(rec))
    cfg = resolve_config(build_parser().parse_args(["--config", str(tmp_path / "r.json")]))
    assert cfg.attack_params == {"backend": "learned", "steps": 5}
