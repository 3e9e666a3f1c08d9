"""A lying coordinator hands a site a roster its ledger was bound to before, after one or more changes.

``NodeLedger.rebind`` keeps the data-bound ``no-dp-releases`` section and drops the roster's own records
(the uploader-set pin among them); binding back to a roster it left would let the server sum the same
statistics again under that roster over another set of sites.  The file records every roster it left
(``former_rosters``), so a return is refused after any number of changes.  A file rebound by a privfed
that did not yet write ``former_rosters`` (the format version did not change) records only its current
roster, and is bound back to the one before it.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from privfed.results.ledger import LedgerError, NodeLedger


def _fp(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def _claimed(path, roster: bytes) -> None:
    """The node summed its counts without DP under ``roster`` (a data-bound record)."""
    NodeLedger.open(path, roster).update("no-dp-releases", lambda rec: dict(rec, counts=roster.hex()))


@pytest.mark.parametrize(
    "chain", [["A", "B", "A"], ["A", "B", "C", "A"], ["A", "B", "C", "B"], ["A", "B", "C", "D", "A"]]
)
def test_a_ledger_is_never_bound_back_to_a_roster_it_left(tmp_path, chain):
    path = tmp_path / "node.ledger.json"
    NodeLedger.create(path, _fp(chain[0]))
    _claimed(path, _fp(chain[0]))
    for name in chain[1:-1]:
        NodeLedger.rebind(path, _fp(name))
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="bound to this roster before"):
        NodeLedger.rebind(path, _fp(chain[-1]))
    assert path.read_bytes() == before  # refused: the file is left as it was
    # the data-bound claim survived every change
    assert NodeLedger.open(path, _fp(chain[-2])).read("no-dp-releases") == {"counts": _fp("A").hex()}


def test_an_honest_change_to_a_new_roster_still_binds(tmp_path):
    path = tmp_path / "node.ledger.json"
    NodeLedger.create(path, _fp("A"))
    for name in "BCD":
        NodeLedger.rebind(path, _fp(name))
    assert NodeLedger.open(path, _fp("D")).kinds() == []


def _as_written_before_former_rosters(path) -> None:
    """The same file as a privfed before ``former_rosters`` wrote it on rebinding (same format version)."""
    raw = json.loads(path.read_text())
    body = {k: v for k, v in raw.items() if k not in ("sha256", "former_rosters")}
    body["sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    path.write_text(json.dumps(body))


def test_a_ledger_rebound_before_former_rosters_existed_is_not_bound_back(tmp_path):
    path = tmp_path / "node.ledger.json"
    NodeLedger.create(path, _fp("A"))
    _claimed(path, _fp("A"))
    NodeLedger.rebind(path, _fp("B"))
    _as_written_before_former_rosters(path)
    NodeLedger.open(path, _fp("B"))  # sound: the current privfed reads it
    with pytest.raises(LedgerError):
        NodeLedger.rebind(path, _fp("A"))
