"""The FedLog-rounds numbers the README quotes are the ones experiments/fedlog_rounds.py wrote to
experiments/results/fedlog_rounds.json, and that file is consistent with the maths it reports."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "fedlog_rounds.json"
FIX = "rerun `python experiments/fedlog_rounds.py --part all --seeds 1 --eps 0.1,1,10,100,inf --record` and update the README"

BODIES = {
    "cnn + cnn-narrow + mlp": "cnn+cnn-narrow+mlp",
    "(cnn on every client)": "cnn+cnn-narrow+mlp",
    "cnn only": "cnn",
}
METHODS = {"one-shot frozen fedlog": "oneshot", "local only": "local", "fedavg": "fedavg"}


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def section() -> str:
    return (ROOT / "docs" / "fedlog-rounds.md").read_text()  # the docs page of the section


def _close(printed: str, value: float) -> bool:
    """A printed number agrees with the value when it is the value rounded to the printed digits."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - value) <= 0.5 * 10**-decimals + 1e-12


def _rows(section: str, header_word: str) -> list[list[str]]:
    """Body rows of every markdown table in the section whose header contains ``header_word``."""
    out, lines = [], section.splitlines()
    for i, line in enumerate(lines):
        if (
            line.startswith("|")
            and header_word in line
            and i + 1 < len(lines)
            and lines[i + 1].startswith("|---")
        ):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                out.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
    return out


def _gdp_eps(mu: float, delta: float) -> float:
    # the second term in log space: e^eps overflows at the composed epsilons of large per-round budgets
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e + norm.logcdf(-e / mu - mu / 2)) - delta  # noqa: E731
    return brentq(f, 0.0, 1e5, xtol=1e-12, rtol=1e-13) if f(0.0) > 0 else 0.0


def test_readme_training_table_matches_the_results(results, section):
    rows = _rows(section, "personalised acc.")
    assert rows, "the README's FedLog training table is missing"
    by = {(r["families"], r["method"]): r for r in results["compare"] if r["seed"] == 0}
    for cells in rows:
        fam = BODIES[cells[0]]
        name = cells[1].lower()
        method = "fedlog" if name.startswith("fedlog,") else METHODS[name]
        r = by[(fam, method)]
        assert _close(cells[2], r["personalised"]) and _close(cells[3], r["common"]), (cells, FIX)


def test_readme_dp_table_matches_the_results(results, section):
    rows = _rows(section, "per-round eps -> composed eps")
    assert rows, "the README's FedLog DP table is missing"
    by = {(r["mode"], r["epsilon"]): r for r in results["dp"] if r["seed"] == 0}
    for cells in rows:
        eps = float(cells[0])
        per, comp = (c.strip() for c in cells[1].split("->"))
        paper = by[("paper", eps)]
        assert _close(per, paper["per_round_epsilon"]), (cells, FIX)
        assert float(comp) == pytest.approx(paper["composed_epsilon"], rel=5e-3), (cells, FIX)
        assert _close(cells[2], paper["personalised"]), (cells, FIX)
        assert _close(cells[3], by[("total-upload-bound", eps)]["personalised"]), (cells, FIX)


def test_readme_attack_table_matches_the_results(results, section):
    rows = _rows(section, "AUC, one round")
    if not rows:
        pytest.skip("the README quotes no FedLog attack table")
    by = {(r["calibration"], r["epsilon"]): r for r in results["attack"] if r["seed"] == 0}
    for cells in rows:
        r = by[(cells[0], float(cells[1]))]
        assert _close(cells[2], r["composed_epsilon"]), (cells, FIX)
        assert _close(cells[3], r["differencing_replay_first_round_auc"]), (cells, FIX)
        assert _close(cells[4], r["differencing_replay_sequence_auc"]), (cells, FIX)
        assert _close(cells[5], r["auc_bound_one_release"]) and _close(cells[6], r["auc_bound"]), (cells, FIX)


def test_paper_mode_composition_in_the_results_is_exact_gdp(results):
    delta = results["config"]["delta"]
    for r in results["dp"]:
        if r["mode"] != "paper" or not math.isfinite(r["epsilon"]):
            continue
        mu = r["epsilon"] / math.sqrt(2 * math.log(1.25 / delta))  # the classic sigma's mu per release
        assert r["composed_epsilon"] == pytest.approx(_gdp_eps(math.sqrt(r["rounds"]) * mu, delta), rel=1e-6)


def test_attacks_in_the_results_respect_the_composed_bound(results):
    for r in results["attack"]:
        assert r["auc_bound"] == pytest.approx(norm.cdf(r["mu_total"] / math.sqrt(2)), rel=1e-9)
        assert r["mu_total"] == pytest.approx(r["mu_per_release"] * math.sqrt(r["rounds"]), rel=1e-9)
        tol = 3 * math.sqrt(1 / (4 * r["pairs"]))
        assert r["differencing_replay_sequence_auc"] <= r["auc_bound"] + tol
        assert r["differencing_replay_first_round_auc"] <= r["auc_bound_one_release"] + tol


def test_a_small_run_writes_nothing_into_the_repository_without_record(tmp_path, monkeypatch):
    """Before: --json and --figure defaulted to the repository's record and docs figure (relative to the working
    folder), so a test-sized run from the repository root overwrote the numbers this file checks."""
    import sys

    sys.path.insert(0, str(ROOT))
    from experiments.fedlog_rounds import main

    monkeypatch.chdir(tmp_path)
    before = RESULTS.stat().st_mtime_ns
    args = ["--part", "compare", "--clients", "2", "--rounds", "1", "--local-epochs", "0", "--seeds", "1"]
    assert main([*args, "--eps", "inf", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert RESULTS.stat().st_mtime_ns == before and sorted(p.name for p in tmp_path.iterdir()) == ["o"]
