"""What the two commands print and write: the trust model of every row, the table, help, files, plots."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from privfed.attack import build_parser as attack_parser
from privfed.attack import main as attack_main
from privfed.commands import common as _cli
from privfed.tradeoff import build_parser as tradeoff_parser
from privfed.tradeoff import main as tradeoff_main
from privfed.tradeoff import plot_tradeoff

REPO = Path(__file__).resolve().parents[2]


def _records(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["records"]


def _csv(out: Path) -> list[dict]:
    with (out / "results.csv").open() as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------- the headline command
def test_single_budget_compares_the_three_placements(tmp_path, capsys, digits_cache):
    out = tmp_path / "o"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedlog",
                "--eps",
                "0.1",
                "--seeds",
                "2",
                "--clients",
                "20",
                "--no-plot",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    recs = _records(out)
    assert [(r["placement"], r["protocol"]) for r in recs if r["seed"] == 0] == [
        ("local", "none"),
        ("secure sum", "mask"),
        ("trusted aggregator", "none"),
    ]
    # the non-private accuracy sits beside every placement, equal for one seed
    for seed in (0, 1):
        assert len({r["nonprivate_accuracy"] for r in recs if r["seed"] == seed}) == 1
    rows = [line for line in stdout.splitlines() if line.startswith("fedlog")]
    assert [r.split("  ")[1].strip() for r in rows] == ["local", "secure sum", "trusted aggregator"]
    assert {r["placement"] for r in _csv(out)} == {"local", "secure sum", "trusted aggregator"}
    # one guarantee line per distinct guarantee, each row naming its own (G1..G3: the three placements)
    assert [r.split()[-1] for r in rows] == ["G1", "G2", "G3"]
    lines = [line.strip() for line in stdout.splitlines() if re.match(r"\s+G\d: ", line)]
    assert [line[:3] for line in lines] == ["G1:", "G2:", "G3:"]
    assert ["(local)" in lines[0], "(distributed)" in lines[1], "(central)" in lines[2]] == [True] * 3
    assert all("(ε, δ)-DP" in line for line in lines)


def test_chosen_placement_runs_only_that_one(tmp_path, digits_cache):
    out = tmp_path / "o"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedncm",
                "--eps",
                "1",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--no-plot",
                "--placement",
                "trusted",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert [r["placement"] for r in _records(out)] == ["trusted aggregator"]
    out2 = tmp_path / "p"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedncm",
                "--eps",
                "1",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--no-plot",
                "--secure-agg",
                "ckks",
                "--out",
                str(out2),
                "--quiet",
            ]
        )
        == 0
    )
    assert [(r["placement"], r["protocol"]) for r in _records(out2)] == [("secure sum", "ckks")]


def test_per_client_method_leaves_out_placements_it_cannot_use(tmp_path, digits_cache):
    """FedCOF needs every client's statistics: no trusted sum, no secure sum with noise; said in a note."""
    out = tmp_path / "o"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedcof",
                "--eps",
                "1",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--no-plot",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    data = json.loads((out / "results.json").read_text())
    assert [r["placement"] for r in data["records"]] == ["local"]
    assert any("placement 'trusted aggregator' left out for method 'fedcof'" in w for w in data["warnings"])


# ---------------------------------------------------------------- count noise, no-DP heuristics, classic calibration
def test_count_noise_rows_state_pure_dp_and_no_dp(tmp_path, capsys, digits_cache):
    out = tmp_path / "lap"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedcof",
                "--count-noise",
                "laplace",
                "--eps",
                "0.5",
                "--seeds",
                "2",
                "--clients",
                "20",
                "--out",
                str(out),
                "--quiet",
                "--no-plot",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    for r in _records(out):
        assert (
            r["delta"] == 0.0 and r["calibration"] == "pure" and r["sigma"] == 0.0
        )  # the sums go without noise
        assert r["noise"] == "counts: Laplace b=2"  # b = 1 / eps
        # the means go in clear: the release as a whole is not private, and the counts' level is record
        assert r["private"] is False and r["level"] == "record" and r["epsilon_reported"] == 0.5
        assert r["pairs_dropped"] == int(r["notes"].split()[0]) if r["notes"] else True
    row = next(line for line in table.splitlines() if line.startswith("fedcof"))
    cells = [c.strip() for c in row.split("  ") if c.strip()]
    assert cells[6] == "0" and "nan" not in row and "analytic" not in row and "0.5 (counts only)" in row
    out = tmp_path / "uni"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedcof",
                "--count-noise",
                "uniform",
                "--eps",
                "0.5",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--out",
                str(out),
                "--quiet",
                "--no-plot",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    (r,) = _records(out)
    assert r["private"] is False and r["epsilon_reported"] == "inf" and r["delta"] == "nan"
    row = next(line for line in table.splitlines() if line.startswith("fedcof"))
    assert "NO DP (0.5)" in row and "0.5  " not in row.split("NO DP (0.5)")[1][:10]
    assert "NO DP GUARANTEE" in table


def test_classic_calibration_is_placed_at_the_ledger_epsilon(tmp_path, monkeypatch, capsys, digits_cache):
    figs = []
    monkeypatch.setattr(_cli.OutputDir, "save_figures", lambda self, stem, fig, **k: figs.append(fig))
    out = tmp_path / "o"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedncm",
                "--eps",
                "0.5,2",
                "--calibration",
                "classic",
                "--placement",
                "trusted",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    recs = _records(out)
    ledger = sorted(r["epsilon_reported"] for r in recs)
    assert all(not math.isclose(r["epsilon_reported"], r["epsilon"]) for r in recs)  # classic is not tight
    ax = figs[0].axes[0]
    curve = next(line for line in ax.lines if len(line.get_xdata()) == 2)  # the one series drawn
    assert np.allclose(curve.get_xdata(), ledger, rtol=0, atol=1e-12)
    stdout = capsys.readouterr().out
    assert f"{ledger[0]:.4g} (asked 0.5)" in stdout
    # the classic sigma's real epsilon differs from the asked one: the sentence keeps its own numbers or
    # says (ε, δ) only where the eps column shows the same number
    for r in recs:
        assert f"{r['epsilon_reported']:.4g}"[:3] in r["guarantee"] or "(ε, δ)" not in r["guarantee"]


def test_guarantees_are_condensed_one_line_per_distinct_guarantee(tmp_path, capsys, digits_cache):
    """2 methods x 3 budgets: the six rows share one guarantee sentence but for (eps, delta), which their
    columns show; it is printed once, and every row names it."""
    out = tmp_path / "o"
    assert (
        tradeoff_main(
            [
                "--method",
                "fedncm,fed3r",
                "--eps",
                "10,2,0.5",
                "--placement",
                "local",
                "--seeds",
                "1",
                "--clients",
                "20",
                "--out",
                str(out),
                "--quiet",
                "--no-plot",
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    table = [line for line in stdout.splitlines() if line.startswith(("fedncm", "fed3r"))]
    gids = [line.split()[-1] for line in table if "inf" not in line.split()[3:4]]
    lines = [line for line in stdout.splitlines() if re.match(r"\s+G\d: ", line)]
    recs = _records(out)
    distinct = {r["guarantee"] for r in recs}
    assert len(distinct) == 6  # six sentences, one per (method, eps) ...
    assert len(lines) < len(distinct) and set(gids) == {
        g.split(":")[0].strip() for g in lines
    }  # ... fewer lines
    for line in lines:
        assert "(ε, δ)-DP" in line and "0.5" not in line.split("DP at")[0]
    for r in recs:  # each row's sentence is its line with the row's own (eps, delta) put back
        template = re.sub(r"\((\S+), (\S+)\)-DP", "(ε, δ)-DP", r["guarantee"], count=1)
        assert any(template == line.split(": ", 1)[1] for line in lines), r["guarantee"]
    assert [line.split()[3] for line in table] == ["0.5", "2", "10"] * 2
    # repairs made on noisy statistics are shown in the table, not only in the CSV
    assert all("PSD projection" in line for line in table if line.startswith("fed3r"))
    assert "placement: where the noise is added" in stdout  # the legend under the table


# ---------------------------------------------------------------- mistakes: one clear line
def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_param_for_a_method_not_run_is_refused(tmp_path, capsys):
    assert (
        tradeoff_main(["--method", "fedlog", "--param", "fedcof.gamma=0.1", "--out", str(tmp_path / "o")])
        == 2
    )
    err = _one_line(capsys)
    assert "method 'fedcof' is not in --method (fedlog)" in err and "ignored" in err


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("c.toml", 'clients = "x"', "--clients must be an integer, got 'x'"),
        ("c.toml", 'delta = "x"', "--delta must be a number, got 'x'"),
        ("c.toml", 'clip = "abc"', "--clip must be a number, got 'abc'"),
        ("c.toml", 'max_records = "abc"', "--max-records must be an integer, got 'abc'"),
        ("c.toml", "method_params = 5", "method_params must be a table of tables"),
        ("c.toml", "rounds = 2.5", "--rounds must be an integer, got 2.5"),
        ("c.toml", "seeds = true", "--seeds must be a count or a list of integers"),
        ("c.toml", 'secure_agg = "paillier"', "--secure-agg must be none, mask or ckks"),
        ("c.toml", "plot = 3", "plot must be true or false"),
        ("c.toml", "eps = [0.1, true]", "--eps: True is not allowed"),
        ("c.json", "{not json", "is not valid JSON"),
        ("c.json", "[1, 2]", "has no 'config' table"),
        ("c.toml", "rounds = = 2", "is not valid TOML"),
    ],
)
def test_config_files_are_checked_like_flags(tmp_path, capsys, name, text, needle):
    cfg = tmp_path / name
    cfg.write_text(text + "\n")
    assert tradeoff_main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert needle in _one_line(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "flag, value, needle",
    [
        ("--rounds", "2.5", "--rounds must be an integer, got '2.5'"),
        ("--clients", "x", "--clients must be an integer, got 'x'"),
        ("--clip", "abc", "--clip must be a number, got 'abc'"),
        ("--placement", "server", "--placement must be all or a list of local, secure-sum, trusted"),
    ],
)
def test_flags_give_the_same_messages(tmp_path, capsys, flag, value, needle):
    assert tradeoff_main([flag, value, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert needle in _one_line(capsys)


def test_single_class_dataset_is_refused(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "one.npz"
    np.savez(path, features=rng.normal(size=(200, 6)), labels=np.zeros(200, dtype=int))
    assert (
        tradeoff_main(
            [
                "--dataset",
                f"file:{path}",
                "--method",
                "fedncm",
                "--eps",
                "inf",
                "--seeds",
                "1",
                "--out",
                str(tmp_path / "o"),
                "--quiet",
            ]
        )
        == 2
    )
    err = _one_line(capsys)
    assert "single class" in err
    assert not (tmp_path / "o").exists()


def test_missing_scikit_image_is_one_line(tmp_path):
    code = (
        "import sys; sys.modules['skimage'] = None; from privfed.attack import main; "
        f"sys.exit(main(['--attack', 'inversion', '--out', {str(tmp_path / 'o')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "pip install scikit-image" in err


# ---------------------------------------------------------------- help, folder names, the final message
@pytest.mark.parametrize(
    "parser, defaults",
    [
        (
            tradeoff_parser,
            [
                "(default: fedlog)",
                "(default: 0.1)",
                "(default: 1 (seed 0))",
                "(default: none)",
                "(default: a fresh results/<command>-<what ran>-<time>)",
            ],
        ),
        (
            attack_parser,
            [
                "(default: fedlog)",
                "(default: 0.1)",
                "(default: 1 (seed 0))",
                "(default: none)",
                "(default: a fresh results/<command>-<what ran>-<time>)",
                "(default: 1,4,16)",
            ],
        ),
    ],
)
def test_help_shows_defaults_and_a_glossary(parser, defaults):
    text = " ".join(parser().format_help().split())
    for d in defaults:
        assert d in text, d
    for word in ("placement", "protocol", "delta"):
        assert f"{word} " in text.split("output columns")[1]
    for flag in ("--secure-agg", "--seeds", "--quiet", "--out", "--overwrite"):
        assert flag in text


def test_default_folder_names_what_ran_and_the_final_message_lists_every_file(
    tmp_path, monkeypatch, capsys, digits_cache
):
    monkeypatch.chdir(tmp_path)
    assert (
        tradeoff_main(["--method", "fedncm", "--eps", "1,4", "--seeds", "1", "--clients", "20", "--quiet"])
        == 0
    )
    (folder,) = (tmp_path / "results").iterdir()
    assert folder.name.startswith("tradeoff-fedncm-eps1-4-")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    listed = last.split(": ", 1)[1].split("  (")[0].split(", ")
    assert (
        sorted(listed)
        == sorted(p.name for p in folder.iterdir())
        == sorted(
            ["results.csv", "results.json", "tradeoff.png", "tradeoff.pdf", "tradeoff.svg", "manifest.json"]
        )
    )
    assert (
        attack_main(
            ["--attack", "tracing", "--method", "fedncm", "--clients", "20", "--eps", "inf", "--quiet"]
        )
        == 0
    )
    (folder,) = [p for p in (tmp_path / "results").iterdir() if p.name.startswith("attack-")]
    assert folder.name.startswith("attack-tracing-fedncm-epsinf-")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    listed = last.split(": ", 1)[1].split("  (")[0].split(", ")
    assert sorted(listed) == sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- the attack command
def test_tracing_reports_both_tests_by_name(tmp_path, capsys, digits_cache):
    out = tmp_path / "o"
    assert (
        attack_main(
            [
                "--attack",
                "tracing",
                "--method",
                "fedncm",
                "--partition",
                "groups",
                "--n",
                "1",
                "--eps",
                "inf,1",
                "--secure-agg",
                "mask",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    rows = _csv(out)
    assert [(r["placement"], r["protocol"]) for r in rows] == [("none", "mask"), ("secure sum", "mask")]
    for r in rows:
        assert r["test"] == "lrt" and 0 <= float(r["auc"]) <= 1 and 0 <= float(r["auc_inner"]) <= 1
    stdout = capsys.readouterr().out
    assert "auc[likelihood ratio]=" in stdout and "auc[inner product]=" in stdout
    assert float(rows[1]["delta"]) == 1e-5 and float(rows[0]["delta"]) == 0.0


def test_attack_count_noise_rows_state_pure_dp(tmp_path, digits_cache):
    out = tmp_path / "o"
    assert (
        attack_main(
            [
                "--attack",
                "labels",
                "--method",
                "fedncm",
                "--partition",
                "dirichlet",
                "--clients",
                "20",
                "--count-noise",
                "laplace",
                "--eps",
                "1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    (r,) = _csv(out)
    assert (r["placement"], r["delta"], r["calibration"]) == ("local", "0.0", "pure")


# ---------------------------------------------------------------- the plot
def _summary_row(method, eps, acc, *, placement="local", private=True, reported=None, **extra):
    return dict(
        method=method,
        placement=placement,
        protocol="none",
        epsilon=eps,
        epsilon_reported=eps if reported is None else reported,
        private=private,
        seeds=3,
        accuracy_mean=acc,
        accuracy_std=0.02,
        nonprivate_mean=0.95,
        nonprivate_std=0.0,
        delta=1e-5,
        calibration="analytic",
        level="record",
        rounds=1,
        mechanism="m",
        upload_bytes=1.0,
        guarantee="g",
        **extra,
    )


def test_plot_has_chance_band_legend_outside_and_one_axis_per_attack_metric(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(_cli.OutputDir, "save_figures", lambda self, stem, fig, **k: figs.append(fig))
    att = {"attack_tracing_auc": 0.7, "attack_singleton_exposed_fraction": 0.2}
    summary = [
        _summary_row("fedncm", 1.0, 0.8, **att),
        _summary_row("fedncm", 4.0, 0.9, **att),
        _summary_row(
            "fedncm",
            math.inf,
            0.95,
            placement="none",
            private=False,
            **{"attack_tracing_auc": 0.9, "attack_singleton_exposed_fraction": 0.5},
        ),
        _summary_row("fedcof", 0.5, 0.97, private=False, reported=math.inf, **att),
        _summary_row("fedcof", 0.9, 0.96, private=False, reported=math.inf, **att),
    ]
    out = _cli.OutputDir(tmp_path / "p", "tradeoff")
    plot_tradeoff(
        (out, "tradeoff.png"),
        summary,
        title="digits\nrecord level, delta=1e-05; placement: local; protocol: none",
        num_classes=10,
    )
    fig = figs[0]
    axes = fig.axes
    assert len(axes) == 3  # accuracy, tracing auc, singleton exposed fraction: one metric per axis
    assert [a.get_ylabel() for a in axes] == ["test accuracy", "auc", "exposed_fraction"]
    assert axes[0].get_ylim() == (0, 1.02)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "shaded band: ± 1 std over 3 seeds" in labels and "chance (1/10 classes)" in labels
    assert not any("error bar" in t for t in labels)  # every series is a curve: bands, no error bars
    assert "fedcof — NO DP GUARANTEE (x = nominal parameter)" in labels
    assert any(np.allclose(line.get_ydata(), 0.5) for line in axes[1].lines)  # AUC chance line
    # the legend sits right of every axis, outside the data
    fig.canvas.draw()
    leg = fig.legends[0].get_window_extent()
    assert all(leg.x0 >= a.get_window_extent().x1 for a in axes)
    # ticks: round budgets first, none closer than a factor 1.8 (0.9 would crowd 1), in plain numbers
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["0.5", "1", "4"]


def test_one_budget_is_drawn_side_by_side_with_a_legend_of_what_is_drawn(tmp_path):
    """The main job: one budget, three placements of one method -- three points at three x positions (not
    piled on one), error bars named as error bars, the non-private and chance lines, PNG, PDF and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import LineCollection

    summary = [
        _summary_row("fedlog", 0.1, acc, placement=place)
        for acc, place in ((0.09, "local"), (0.16, "secure sum"), (0.15, "trusted aggregator"))
    ]
    out = _cli.OutputDir(tmp_path / "p", "tradeoff")
    figs = []
    real = _cli.OutputDir.save_figures

    def keep(self, stem, fig, **k):
        figs.append(fig)
        return real(self, stem, fig, **k)

    _cli.OutputDir.save_figures = keep
    try:
        plot_tradeoff((out, "tradeoff"), summary, title="t", num_classes=10)
    finally:
        _cli.OutputDir.save_figures = real
    out.finish("x", complete=True)
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "manifest.json",
        "tradeoff.pdf",
        "tradeoff.png",
        "tradeoff.svg",
    ]
    (ax,) = figs[0].axes
    points = [line for line in ax.lines if line.get_marker() in ("o", "s", "^", "x")]  # not the bars' caps
    xs = [float(line.get_xdata()[0]) for line in points]
    assert len(points) == 3 and len(set(xs)) == 3  # one x each
    colours = {tuple(matplotlib.colors.to_rgba(line.get_color())) for line in points}
    assert len(colours) == 1 and {line.get_marker() for line in points} == {"o", "s", "^"}
    assert any(isinstance(c, LineCollection) for c in ax.collections)  # the error bars are drawn ...
    labels = [t.get_text() for t in figs[0].legends[0].get_texts()]
    assert "error bar: ± 1 std over 3 seeds" in labels  # ... and named so, with no band in the legend
    assert not any("band" in t for t in labels)
    assert "fedlog non-private (0.950)" in labels and "chance (1/10 classes)" in labels
    assert ax.get_ylim() == (0, 1.02)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "local\nfedlog",
        "secure sum\nfedlog",
        "trusted aggregator\nfedlog",
    ]


def test_heartbeat_redraws_a_bar_during_one_long_run():
    """A run of minutes (an inversion) keeps showing its elapsed time: the bar is redrawn while it runs."""
    import time

    class Bar:
        disable = False
        refreshed = 0

        def refresh(self):
            Bar.refreshed += 1

    with _cli.heartbeat(Bar(), after=0.0, every=0.02):
        time.sleep(0.3)
    n = Bar.refreshed
    assert n >= 3
    time.sleep(0.1)
    assert Bar.refreshed == n  # stopped with the block


@pytest.mark.parametrize(
    "stated, expected",
    [
        (None, "local"),
        ("", "local"),
        ("trusted_aggregator", "trusted aggregator"),
        ("secure-sum", "secure sum"),
        ("Secure sum (noise shares)", "secure sum"),
        ("distributed", "secure sum"),
        ("local", "local"),
        ("client-side", "local"),
        ("something else", "something else"),
    ],
)
def test_report_placements_are_printed_in_one_vocabulary(stated, expected):
    assert _cli.placement_word(stated, "local") == expected


def test_the_eps_inf_row_states_no_count_noise(tmp_path, digits_cache):
    """The eps = inf row releases without any noise: its count-noise column is empty, not the sweep's law."""
    out = tmp_path / "o"
    argv = ["--method", "fedncm", "--count-noise", "laplace", "--eps", "inf,1", "--seeds", "1"]
    assert tradeoff_main([*argv, "--clients", "20", "--out", str(out), "--quiet", "--no-plot"]) == 0
    rows = {str(r["epsilon"]): r for r in _records(out)}
    assert rows["inf"]["count_noise"] is None and rows["inf"]["noise"] == "none"
    assert rows["1.0"]["count_noise"] == "laplace"
    assert {r["epsilon"]: r["count_noise"] for r in _csv(out)} == {"inf": "", "1.0": "laplace"}
