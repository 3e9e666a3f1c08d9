"""The node budget's Python API against careless callers (a fault battery's findings; each failed before).

A settle could raise a charge past the lifetime budget (spent epsilon 1.755 of 1.0), a charge without any
noised block was booked at mu = 0, a release id that is not text was written and then made every later read
call the ledger corrupt, and a numpy factor or event field was a raw TypeError from the JSON writer.
"""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms.dp.calibration import gdp_mu
from mechanisms.dp.filter import GaussianFilter, release_mu
from privfed.errors import ConfigError
from privfed.flower.budget import BudgetRefusal, FileBudgetStore, NodeBudget, init_ledger

MU_B = gdp_mu(1.0, 1e-5)


def _budget(tmp_path):
    return NodeBudget(GaussianFilter(1.0, 1e-5), FileBudgetStore(init_ledger(tmp_path / "n.json")), "n0")


def _events(mu, release_id=1):
    return [dict(mechanism="gaussian", block="sums", sensitivity=mu, scale=1.0, release_id=release_id)]


def test_a_settle_never_raises_a_charge(tmp_path):
    b = _budget(tmp_path)
    b.charge(release="a", run="x", what="a", events=_events(0.7 * MU_B), stage="s", factor=0.5)
    b.charge(release="b", run="x", what="b", events=_events(0.9 * MU_B), stage="s")
    before = (tmp_path / "n.json").read_bytes()
    with pytest.raises(ConfigError, match="a settle only lowers a charge"):
        b.settle("a", 2.0)
    assert (tmp_path / "n.json").read_bytes() == before and b.status()["spent_epsilon"] <= 1.0
    assert b.settle("a", 0.25) == pytest.approx(0.25 * 0.7 * MU_B, rel=1e-12)  # lowering still works
    with pytest.raises(ConfigError, match="only lowers"):
        b.settle("a", 0.5)  # back up again: refused too


def test_a_release_without_noise_is_refused_not_booked_at_zero(tmp_path):
    b = _budget(tmp_path)
    with pytest.raises(BudgetRefusal, match="without any noised block"):
        b.charge(release="plain", run="x", what="a sum without noise", events=[], stage="s")
    assert b.status()["releases"] == 0
    with pytest.raises(ConfigError, match="without any noised block"):
        release_mu([])
    with pytest.raises(ConfigError, match="events must be a list"):
        release_mu(None)
    with pytest.raises(ConfigError, match="a release event must be a ReleaseEvent or its fields"):
        release_mu(
            [{"mechanism": "gaussian", "block": "sums", "sensitivity": 1.0, "scale": 1.0, "colour": 1}]
        )


@pytest.mark.parametrize("field", ["release", "run", "what", "stage", "noise"])
def test_a_charge_whose_names_are_not_text_is_refused_before_the_ledger_is_written(tmp_path, field):
    b = _budget(tmp_path)
    kw = dict(release="r", run="x", what="w", events=_events(0.05), stage="s", noise="")
    kw[field] = 7
    before = (tmp_path / "n.json").read_bytes()
    with pytest.raises(ConfigError, match=f"whose {field} is 7: it must be text"):
        b.charge(**kw)
    assert (tmp_path / "n.json").read_bytes() == before
    b.charge(release="r", run="x", what="w", events=_events(0.05), stage="s")  # the ledger still reads
    assert b.status()["releases"] == 1


def test_numpy_numbers_are_charged_as_the_numbers_they_hold(tmp_path):
    b = _budget(tmp_path)
    ev = [dict(_events(0.05)[0], release_id=np.int64(1), sensitivity=np.float64(0.05))]
    mu = b.charge(release="r", run="x", what="w", events=ev, stage="s", factor=np.float64(1.0))
    assert mu == pytest.approx(0.05, rel=1e-12) and b.status()["releases"] == 1


@pytest.mark.parametrize("version", ["x", "1", 1.5, True])
def test_a_section_version_privfed_never_writes_is_a_malformed_ledger_not_a_traceback(tmp_path, version):
    """Before: a hand edit to version "x" (its digest recomputed) raised int()'s ValueError from every read."""
    import json

    from privfed.results.ledger import LedgerError, _digest

    path = init_ledger(tmp_path / "n.json")
    body = {k: v for k, v in json.loads(path.read_text()).items() if k != "sha256"}
    body["sections"]["dp-budget"]["version"] = version
    path.write_text(json.dumps(dict(body, sha256=_digest(body))))
    b = NodeBudget(GaussianFilter(1.0, 1e-5), FileBudgetStore(path), "n0")
    with pytest.raises(LedgerError, match="its section 'dp-budget' is malformed"):
        b.status()
    with pytest.raises(LedgerError, match="malformed"):
        b.charge(release="r", run="x", what="w", events=_events(0.05), stage="s")


def test_the_filter_refuses_a_spent_list_that_is_no_list():
    f = GaussianFilter(1.0, 1e-5)
    for spent in (None, 0.5, "0.5"):
        with pytest.raises(ConfigError, match="spent must be the list of the mu of every release spent"):
            f.admits(spent, 0.1)
    assert f.admits([], 0.1) and not f.admits([MU_B], 0.1)
