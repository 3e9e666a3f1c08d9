"""A node's lifetime budget (privfed.flower.budget): its ledger file fails closed, survives restarts, and the
filter refuses the release that would exceed the budget; the epsilon it states is the shared accountant's."""

from __future__ import annotations

import json
import math

import pytest

from mechanisms.dp.accounting import ledger_epsilon
from mechanisms.dp.calibration import gdp_mu
from mechanisms.dp.filter import GaussianFilter
from mechanisms.dp.ledger import format_up
from privfed.errors import ConfigError
from privfed.flower.budget import (
    BudgetRefusal,
    FileBudgetStore,
    MemoryBudgetStore,
    NodeBudget,
    init_ledger,
    main,
)

EPS, DELTA = 2.0, 1e-5


def _event(mu, rid=1, relation="record"):
    return {
        "mechanism": "gaussian",
        "block": "augmented",
        "sensitivity": mu,
        "scale": 1.0,
        "relation": relation,
        "rounds": 1,
        "sampling_rate": 1.0,
        "release_id": rid,
    }


def _budget(path, node=7):
    return NodeBudget(GaussianFilter(EPS, DELTA), FileBudgetStore(path), node)


def _charge(budget, mu, rid, run="run-a"):
    return budget.charge(
        release=f"r{rid}", run=run, what=f"release {rid}", events=[_event(mu, rid)], stage="query"
    )


def test_a_restarted_node_continues_its_count_and_refuses_the_release_past_its_budget(tmp_path):
    path = init_ledger(tmp_path / "budget.json")
    one = gdp_mu(EPS, DELTA) / 2.1  # four of these fit, a fifth does not
    first = _budget(path)
    for i in range(2):
        _charge(first, one, i)
    restarted = _budget(path)  # a new process: everything it knows comes from the file
    assert restarted.status()["releases"] == 2
    for i in range(2, 4):
        _charge(restarted, one, i, run="run-b")
    with pytest.raises(BudgetRefusal) as exc:
        _charge(_budget(path), one, 4, run="run-b")
    text = str(exc.value)
    assert "\n" not in text and text.startswith("node 7 refuses release 4: its lifetime privacy budget")
    assert exc.value.deviation == "over-budget" and exc.value.node == 7
    # the refusal names only public numbers: the budget, what was spent, this release, what is left
    st = restarted.status("run-b")
    assert f"epsilon={EPS:g}" in text and "over 4 release(s)" in text
    assert st["releases"] == 4 and st["releases_run"] == 2
    # the stated epsilons are the shared accountant's on the same events
    events = [_event(one, i) for i in range(4)]
    from mechanisms.dp.ledger import ReleaseEvent

    assert st["spent_epsilon"] == pytest.approx(
        ledger_epsilon([ReleaseEvent(**e) for e in events], DELTA, "gdp")[0], rel=1e-12
    )
    assert st["spent_epsilon_run"] == pytest.approx(
        ledger_epsilon([ReleaseEvent(**e) for e in events[2:]], DELTA, "gdp")[0], rel=1e-12
    )
    # and an independent accountant agrees: dp-accounting's closed-form privacy loss of the one Gaussian the
    # four releases compose to (mu = 2 * one) reaches the budget's delta at the stated epsilon
    from dp_accounting.pld import privacy_loss_mechanism as plm

    loss = plm.GaussianPrivacyLoss(standard_deviation=1.0 / (2 * one), sensitivity=1.0)
    assert loss.get_delta_for_epsilon(st["spent_epsilon"]) == pytest.approx(DELTA, rel=1e-9)
    # the refused release left no trace; a smaller one still fits
    assert len(FileBudgetStore(path).load()) == 4
    _charge(restarted, restarted.filter.remaining_mu([one] * 4) * 0.999, 5)


@pytest.mark.parametrize(
    "spoil, text",
    [
        (lambda p: p.unlink(), "no such file .*privfed.flower.budget init"),
        (lambda p: p.write_text("{not json"), "it is not JSON"),
        (lambda p: p.write_text(p.read_text()[:-40]), "it is not JSON"),
        (lambda p: p.write_text(p.read_text().replace('"mu": 0.5', '"mu": 0.1')), "SHA-256 does not match"),
        (lambda p: p.write_text(json.dumps({"format": "x"})), "it is not a privfed node ledger"),
        (lambda p: (p.unlink(), p.mkdir()), "it cannot be read"),
    ],
)
def test_a_missing_unreadable_or_corrupt_ledger_stops_the_node(tmp_path, spoil, text):
    path = init_ledger(tmp_path / "budget.json")
    _charge(_budget(path), 0.5, 1)
    spoil(path)
    with pytest.raises(ConfigError, match=text):
        _charge(_budget(path), 0.1, 2)
    with pytest.raises(ConfigError, match=text):
        _budget(path).status()


def test_the_operator_creates_a_ledger_once_and_reads_it(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert main(["init", str(path)]) == 0
    assert main(["init", str(path)]) == 2  # never twice: it would forget what was spent
    assert "the file exists; a node's ledger is created once" in capsys.readouterr().err
    _charge(_budget(path), 0.5, 1)
    assert main(["show", str(path), "--epsilon", str(EPS), "--delta", str(DELTA)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 release(s) charged: epsilon=") and "release 1" in out
    assert main(["show", str(tmp_path / "none.json"), "--epsilon", "1", "--delta", "1e-5"]) == 2
    capsys.readouterr()
    # the ledger holds charges, not the budget: without the node config's budget, the charges and their mu
    _charge(_budget(path), 0.03, 2)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"2 release(s) charged: composed mu={format_up(math.hypot(0.5, 0.03))} (Gaussian DP"
    )
    assert "release 1" in out and "release 2" in out
    assert main(["show", str(path), "--epsilon", "4"]) == 2
    assert "--epsilon needs --delta too" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="does not exist"):
        init_ledger(tmp_path / "no" / "such" / "dir.json")


def test_a_settled_release_is_charged_the_noise_it_carried_and_a_release_is_charged_once():
    budget = NodeBudget(GaussianFilter(EPS, DELTA), MemoryBudgetStore(), 3)
    mu = budget.charge(release="x", run="r", what="a sum", events=[_event(0.2)], stage="masked", factor=1.5)
    assert mu == pytest.approx(0.3, rel=1e-15)
    assert budget.settle("x", 1.0) == pytest.approx(0.2, rel=1e-15)
    assert budget.store.load()[0]["settled"] is True
    with pytest.raises(BudgetRefusal, match="charged this release once already"):
        budget.charge(release="x", run="r", what="a sum", events=[_event(0.2)], stage="masked")
    with pytest.raises(ConfigError, match="no charged release 'y'"):
        budget.settle("y", 1.0)
    # client-level releases count twice at record level (mechanisms.dp.filter)
    budget.charge(
        release="c", run="r", what="a client-level sum", events=[_event(0.1, 2, "client")], stage="q"
    )
    assert budget.store.load()[-1]["mu"] == pytest.approx(0.2, rel=1e-15)
    # what the filter cannot charge is refused, not skipped
    bad = dict(_event(0.3, 3), sampling_rate=0.5)
    with pytest.raises(BudgetRefusal, match="cannot charge it"):
        budget.charge(release="s", run="r", what="a sampled release", events=[bad], stage="q")


@pytest.mark.parametrize("factor", [math.inf, 0.0, -1.0, math.nan, "2"])
def test_a_factor_no_ledger_can_hold_is_refused_and_the_ledger_stays_readable(tmp_path, factor):
    """An infinite factor was written as Infinity, after which every read called the ledger corrupt (and
    advised a backup, losing later charges); 0 charged nothing.  Both are refused before the file is
    touched, by charge and by settle alike."""
    path = tmp_path / "b.json"
    init_ledger(path)
    budget = NodeBudget(GaussianFilter(EPS, DELTA), FileBudgetStore(str(path)), 7)
    budget.charge(release="a", run="r", what="a sum", events=[_event(0.2)], stage="masked", factor=2.0)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="finite number > 0.*left as it was"):
        budget.settle("a", factor)
    with pytest.raises(ConfigError, match="finite number > 0.*left as it was"):
        budget.charge(release="b", run="r", what="a sum", events=[_event(0.2)], stage="masked", factor=factor)
    assert path.read_bytes() == before
    assert budget.status()["releases"] == 1 and budget.store.load()[0]["mu"] == pytest.approx(0.4, rel=1e-15)
    assert budget.settle("a", 1.0) == pytest.approx(0.2, rel=1e-15)


def test_a_node_config_sets_all_of_a_budget_or_none(tmp_path):
    assert NodeBudget.from_node_config({"partition-id": 0}, 1) is None
    with pytest.raises(ConfigError, match="but not \\['dp-budget-ledger'\\]"):
        NodeBudget.from_node_config({"dp-budget-epsilon": 1.0, "dp-budget-delta": 1e-5}, 1)
    with pytest.raises(ConfigError, match="must be numbers"):
        NodeBudget.from_node_config(
            {"dp-budget-epsilon": "lots", "dp-budget-delta": 1e-5, "dp-budget-ledger": "x"}, 1
        )
    with pytest.raises(ConfigError, match="epsilon must be finite"):
        NodeBudget.from_node_config(
            {"dp-budget-epsilon": math.inf, "dp-budget-delta": 1e-5, "dp-budget-ledger": "x"}, 1
        )
    with pytest.raises(ConfigError, match="must be numbers"):  # float(True) was a lifetime epsilon of 1
        NodeBudget.from_node_config(
            {"dp-budget-epsilon": True, "dp-budget-delta": 1e-5, "dp-budget-ledger": "x"}, 1
        )
    b = NodeBudget.from_node_config(
        {"dp-budget-epsilon": 3, "dp-budget-delta": 1e-6, "dp-budget-ledger": str(tmp_path / "f.json")}, 1
    )
    assert (b.filter.epsilon, b.filter.delta) == (3.0, 1e-6)


def test_a_ledger_reached_through_a_link_is_charged_in_its_target(tmp_path):
    """The first charge renamed a new file over the link: the target kept 0 releases, so a restored link (a
    container image, configuration management) found the budget unspent, and a node reaching the file by
    its real path locked another lock file."""
    (tmp_path / "persistent").mkdir()
    real = init_ledger(tmp_path / "persistent" / "budget.json")
    link = tmp_path / "budget.json"
    link.symlink_to(real)
    _charge(_budget(link), 0.2, 1)
    assert link.is_symlink() and len(FileBudgetStore(real).load()) == 1
    assert FileBudgetStore(link).ledger.path == FileBudgetStore(real).ledger.path  # one file, one lock
    _charge(_budget(real), 0.2, 2)
    assert [r["id"] for r in FileBudgetStore(link).load()] == ["r1", "r2"]


def test_a_budget_ledger_is_never_taken_for_or_rebound_as_a_secure_aggregation_ledger(tmp_path):
    """Named as a node's secagg-ledger too, the budget file said to rebind it with --init-ledger, which dropped
    its dp-budget section (the node's spend) and then pointed at a reset; it is now named for what it is."""
    from mechanisms.secagg.identity import make_roster
    from mechanisms.secagg.ledger import init_ledger_file
    from privfed.results.ledger import LedgerError, NodeLedger

    path = init_ledger(tmp_path / "budget.json")
    _charge(_budget(path), 0.2, 1)
    roster, _ = make_roster(3, None, 1)
    with pytest.raises(
        LedgerError, match="it is a node's privacy-budget ledger .*sections: dp-budget.*not a "
    ):
        NodeLedger.open(path, roster.fingerprint)
    with pytest.raises(LedgerError, match="rebinding it would drop what the node spent"):
        init_ledger_file(path, roster.fingerprint)
    assert len(FileBudgetStore(path).load()) == 1 and not path.with_name("budget.json.old").exists()
    secagg = tmp_path / "secagg.json"
    init_ledger_file(secagg, roster.fingerprint)
    with pytest.raises(
        ConfigError, match="it is a node's secure-aggregation ledger .*not a privacy-budget ledger"
    ):
        FileBudgetStore(secagg).load()


def test_a_hard_linked_ledger_is_refused(tmp_path):
    """A charge renamed a new file over one name of a hard-linked ledger: the other name kept the old
    releases (a restored name found them unspent) and the two names locked different lock files."""
    path = init_ledger(tmp_path / "budget.json")
    (tmp_path / "hard.json").hardlink_to(path)
    for name in (path, tmp_path / "hard.json"):
        with pytest.raises(ConfigError, match="it has 2 hard links"):
            _charge(_budget(name), 0.2, 1)
    assert (tmp_path / "hard.json").stat().st_nlink == 2  # nothing was written
