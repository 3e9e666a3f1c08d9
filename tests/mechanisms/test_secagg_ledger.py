"""A node's ledger file (privfed.results.ledger.NodeLedger and its secagg section): created once by an explicit
step, bound to the roster, checked by its digest, every update atomic and under a lock, other sections kept."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading

import pytest

from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.identity import Roster, main, make_roster
from mechanisms.secagg.ledger import SECTION, FileRecords, init_ledger_file
from privfed.results.ledger import LedgerError, NodeLedger

FP = bytes(range(32))


def test_create_then_open_read_and_update(tmp_path):
    path = tmp_path / "ledger.json"
    NodeLedger.create(path, FP, sections={"secagg": (1, {"aggregations": []})})
    led = NodeLedger.open(path, FP)
    assert led.kinds() == ["secagg"] and led.read("secagg") == {"aggregations": []}
    led.update("secagg", lambda r: {**r, "aggregations": ["ab"]})
    led.update("dp-budget", lambda r: {"spent": 0.5}, version=2)  # another module's section
    assert NodeLedger.open(path, FP).read("secagg") == {"aggregations": ["ab"]}
    assert led.read("dp-budget", version=2) == {"spent": 0.5}
    led.update("secagg", lambda r: {**r, "uploaders": [0, 1]})
    assert led.read("dp-budget", version=2) == {"spent": 0.5}  # left as it was
    raw = json.loads(path.read_text())
    assert raw["format"] == "privfed node ledger" and raw["version"] == 1 and raw["roster"] == FP.hex()
    assert raw["sections"]["dp-budget"]["version"] == 2
    # a refusal inside the change leaves the file as it was
    before = path.read_bytes()

    def refuse(_):
        raise ProtocolAbort("no")

    with pytest.raises(ProtocolAbort):
        led.update("secagg", refuse)
    assert path.read_bytes() == before
    with pytest.raises(LedgerError, match="written by a newer privfed"):
        led.read("dp-budget", version=1)


def test_missing_damaged_and_foreign_files_are_refused_in_one_line(tmp_path):
    path = tmp_path / "ledger.json"
    with pytest.raises(LedgerError, match="no such file") as exc:
        NodeLedger.open(path, FP)
    assert "\n" not in str(exc.value) and "--init-ledger" in str(exc.value)
    NodeLedger.create(path, FP)
    with pytest.raises(LedgerError, match="the file exists"):
        NodeLedger.create(path, FP)
    with pytest.raises(LedgerError, match="another roster"):
        NodeLedger.open(path, bytes(32))
    good = path.read_text()
    for bad, why in (
        (good[: len(good) // 2], "not JSON"),
        (good.replace('"sections": {}', '"sections": {"x": {"version": 1, "records": {}}}'), "SHA-256"),
        (json.dumps({"format": "something else"}), "not a privfed node ledger"),
        ("", "not JSON"),
        (good.replace('"version": 1', '"version": 9'), "format version 9"),
    ):
        path.write_text(bad)
        with pytest.raises(LedgerError, match=why):
            NodeLedger.open(path, FP)
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LedgerError, match="cannot be read"):
        NodeLedger.open(path, FP)


def test_a_failed_write_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ledger.json"
    led = NodeLedger.create(path, FP)
    before = path.read_bytes()

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(Exception, match="No space left"):
        led.update("secagg", lambda r: {"aggregations": ["cd"]})
    assert path.read_bytes() == before and not [p for p in tmp_path.iterdir() if "tmp" in p.name]


def _claim_many(path: str, start: int) -> None:
    rec = FileRecords(NodeLedger.open(path, FP))
    for i in range(start, start + 25):
        rec.claim(i.to_bytes(4, "big"), node=0)


def test_updates_from_several_processes_are_never_lost(tmp_path):
    """Stages of a deployed node run in separate processes: four append 25 ids each, concurrently."""
    path = tmp_path / "ledger.json"
    init_ledger_file(path, FP)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_claim_many, args=(str(path), 100 * i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    ids = NodeLedger.open(path, FP).read(SECTION)["aggregations"]
    assert len(ids) == 100 and len(set(ids)) == 100


def test_the_secagg_records_refuse_a_repeated_id_and_keep_the_first_pin(tmp_path):
    path = tmp_path / "ledger.json"
    init_ledger_file(path, FP)
    rec = FileRecords(NodeLedger.open(path, FP))
    rec.claim(b"\x01" * 32, node=3)
    with pytest.raises(ProtocolAbort, match="node 3 aborts at stage 'masked'.*already uploaded") as exc:
        rec.claim(b"\x01" * 32, node=3)
    assert exc.value.deviation == "second-session"
    rec.keep("uploaders=0,1,2")
    rec.keep("uploaders=0,1")  # a later pin does not replace the first
    rec.keep("holder=2")
    rec.keep("keys:abcd")
    rec.keep("keys:abcd")
    got = rec.records()
    assert got["uploaders"] == [0, 1, 2] and got["holder"] == 2 and got["key_sessions"] == ["abcd"]


def test_the_operator_command_creates_a_ledger_bound_to_the_roster_and_converts_an_old_one(tmp_path, capsys):
    assert main([str(tmp_path / "r"), "--nodes", "4"]) == 0
    roster_file = tmp_path / "r" / "roster.json"
    fp = Roster.load(roster_file).fingerprint
    assert main(["--init-ledger", str(tmp_path / "node.json"), "--roster", str(roster_file)]) == 0
    assert "created" in capsys.readouterr().out
    assert NodeLedger.open(tmp_path / "node.json", fp).read(SECTION) == {
        "aggregations": [],
        "key_sessions": [],
    }
    assert main(["--init-ledger", str(tmp_path / "node.json"), "--roster", str(roster_file)]) == 2
    assert "the file exists" in capsys.readouterr().err
    old = tmp_path / "old.txt"  # the one-record-a-line format of earlier versions
    old.write_text("aa" * 32 + "\nuploaders=0,1,2,3\nholder=1\nkeys:0f0f\n")
    assert main(["--init-ledger", str(old), "--roster", str(roster_file)]) == 0
    got = NodeLedger.open(old, fp).read(SECTION)
    assert got == {
        "aggregations": ["aa" * 32],
        "uploaders": [0, 1, 2, 3],
        "holder": 1,
        "key_sessions": ["0f0f"],
    }
    assert (tmp_path / "old.txt.old").exists()
    assert main(["--init-ledger", str(tmp_path / "x.json")]) == 2  # the roster is required
    assert "needs --roster" in capsys.readouterr().err


def test_a_conversion_that_fails_leaves_the_file_whole_and_a_lost_ledger_is_never_made_afresh(tmp_path):
    """The conversion runs under the file's lock and renames the new ledger over the old file after keeping it:
    a conversion that cannot start (its lock cannot be taken here) leaves the file as it was, and once a
    converted ledger is lost, a rerun is refused (it used to print "created" and forget the node's records):
    the copy misses what the node wrote after it, so it is no restore point either."""
    (one, _) = make_roster(4)
    path = tmp_path / "node.json"
    lines = "aa" * 32 + "\nuploaders=0,1,2\n"
    path.write_text(lines)
    (tmp_path / "node.json.lock").mkdir()  # the lock cannot be opened: nothing is done
    with pytest.raises(LedgerError, match="lock"):
        init_ledger_file(path, one.fingerprint)
    assert path.read_text() == lines and sorted(p.name for p in tmp_path.iterdir()) == [
        "node.json",
        "node.json.lock",
    ]
    (tmp_path / "node.json.lock").rmdir()
    assert (
        init_ledger_file(path, one.fingerprint)
        == "converted the older ledger (the old file is node.json.old)"
    )
    records = FileRecords(NodeLedger.open(path, one.fingerprint))
    assert records.records()["uploaders"] == [0, 1, 2]
    assert (tmp_path / "node.json.old").read_text() == lines
    records.claim(b"\x0c" * 32, 0)  # what the node writes after the copy
    path.unlink()  # the ledger is lost
    with pytest.raises(
        LedgerError, match=r"the file is missing, but copies of an earlier ledger .*node.json.old"
    ):
        init_ledger_file(path, one.fingerprint)
    assert not path.exists()  # nothing fresh was made
    (tmp_path / "node.json.old").rename(tmp_path / "node.json.old.3")  # gaps in the copies' numbers hide none
    with pytest.raises(LedgerError, match=r"node.json.old.3"):
        init_ledger_file(path, one.fingerprint)


def test_a_second_operator_converting_the_same_file_changes_nothing(tmp_path):
    """Two --init-ledger runs on one older-format file: the one that read it before the other converted it finds
    the file changed, under the lock, and stops; the converted ledger and its one copy stay as they were."""
    (one, _) = make_roster(4)
    path = tmp_path / "node.json"
    lines = "aa" * 32 + "\n"
    path.write_text(lines)
    assert init_ledger_file(path, one.fingerprint).startswith("converted")
    FileRecords(NodeLedger.open(path, one.fingerprint)).claim(b"\x0c" * 32, 0)
    converted = path.read_bytes()
    with pytest.raises(LedgerError, match="the file changed while it was converted"):
        NodeLedger.convert(path, one.fingerprint, lines.encode(), sections={SECTION: (1, {})})
    assert path.read_bytes() == converted and (tmp_path / "node.json.old").read_text() == lines
    assert sorted(p.name for p in tmp_path.iterdir() if ".old" in p.name) == ["node.json.old"]


def test_a_conversion_through_a_symlink_converts_the_file_it_names(tmp_path):
    (one, _) = make_roster(4)
    (tmp_path / "persist").mkdir()
    target = tmp_path / "persist" / "ledger"
    target.write_text("aa" * 32 + "\n")
    link = tmp_path / "ledger"
    link.symlink_to(target)
    assert (
        init_ledger_file(link, one.fingerprint) == "converted the older ledger (the old file is ledger.old)"
    )
    assert link.is_symlink() and (tmp_path / "persist" / "ledger.old").read_text() == "aa" * 32 + "\n"
    assert FileRecords(NodeLedger.open(link, one.fingerprint)).records()["aggregations"] == ["aa" * 32]


def test_a_copy_of_a_ledger_is_never_overwritten(tmp_path):
    """Rebinding A -> B -> C keeps the file as it was under A and under B (node.json.old, node.json.old.1): the
    copy the refusals tell an operator to restore from is never replaced."""
    rosters = [make_roster(n)[0] for n in (4, 5, 6)]
    path = tmp_path / "node.json"
    init_ledger_file(path, rosters[0].fingerprint)
    FileRecords(NodeLedger.open(path, rosters[0].fingerprint)).keep("uploaders=0,1,2")
    assert init_ledger_file(path, rosters[1].fingerprint).endswith("the old file is node.json.old)")
    FileRecords(NodeLedger.open(path, rosters[1].fingerprint)).keep("uploaders=1,2,3")
    assert init_ledger_file(path, rosters[2].fingerprint).endswith("the old file is node.json.old.1)")
    first = NodeLedger.open(tmp_path / "node.json.old", rosters[0].fingerprint)
    second = NodeLedger.open(tmp_path / "node.json.old.1", rosters[1].fingerprint)
    assert FileRecords(first).records()["uploaders"] == [0, 1, 2]
    assert FileRecords(second).records()["uploaders"] == [1, 2, 3]


def test_a_text_file_of_hex_words_is_not_taken_for_an_older_ledger(tmp_path):
    (one, _) = make_roster(4)
    notes = tmp_path / "notes.txt"
    notes.write_text("cafe\nbabe\n")  # hex, but no 64-digit aggregation id of the older format
    with pytest.raises(LedgerError, match="is not a ledger"):
        init_ledger_file(notes, one.fingerprint)
    assert notes.read_text() == "cafe\nbabe\n" and not (tmp_path / "notes.txt.old").exists()


def test_a_roster_written_before_rosters_recorded_their_colluders_is_refused_when_it_tolerates_none():
    roster, _ = make_roster(5, 3, 0)
    old = json.loads(roster.to_json())
    old["version"] = 1
    old.pop("bounds")
    with pytest.raises(Exception, match="tolerates no colluding node"):
        Roster.from_json(json.dumps(old))
    even, _ = make_roster(4, 3, 0)  # t = 3 of 4 tolerates one: an old file still loads
    raw = json.loads(even.to_json())
    raw["version"] = 1
    raw.pop("bounds")
    assert Roster.from_json(json.dumps(raw)).fingerprint == even.fingerprint
    # written now, the operator's explicit colluders=0 is kept
    assert Roster.from_json(roster.to_json()) == roster


def test_a_new_roster_keeps_what_the_nodes_data_released_without_dp(tmp_path, capsys):
    """--init-ledger on a node's existing ledger for a new roster (a site joined or left): the data-bound
    no-dp-releases section is kept, the roster's own records (aggregations, uploader pin) start again, the
    old file stays beside it; a ledger of this roster already, or a damaged one, is refused."""
    from privfed.flower.ledger import RELEASES, claim_statistics
    from privfed.results.ledger import DATA_KINDS

    assert RELEASES in DATA_KINDS
    (one, _), (two, _) = make_roster(4), make_roster(5)
    (tmp_path / "two.json").write_text(two.to_json())
    path = tmp_path / "node.json"
    init_ledger_file(path, one.fingerprint)
    led = NodeLedger.open(path, one.fingerprint)
    FileRecords(led).claim(b"\x01" * 32, 0)
    FileRecords(led).keep("uploaders=0,1,2")
    claim_statistics(led, {"ab" * 32: "counts"}, one.fingerprint, 0)
    claim_statistics(led, {"ab" * 32: "counts"}, one.fingerprint, 0)  # one roster: its uploader pin decides
    assert main(["--init-ledger", str(path), "--roster", str(tmp_path / "two.json")]) == 0
    assert "rebound" in capsys.readouterr().out
    fresh = NodeLedger.open(path, two.fingerprint)
    assert fresh.read(SECTION) == {"aggregations": [], "key_sessions": []}
    assert fresh.read(RELEASES) == {"statistics": {"ab" * 32: one.fingerprint.hex()}}
    assert NodeLedger.open(tmp_path / "node.json.old", one.fingerprint).read(SECTION)["uploaders"] == [
        0,
        1,
        2,
    ]
    with pytest.raises(ProtocolAbort, match="counts were summed without DP under another roster"):
        claim_statistics(fresh, {"ab" * 32: "counts", "cd" * 32: "sums"}, two.fingerprint, 3)
    assert fresh.read(RELEASES) == {
        "statistics": {"ab" * 32: one.fingerprint.hex()}
    }  # a refusal writes nothing
    claim_statistics(fresh, {"cd" * 32: "sums"}, two.fingerprint, 3)  # another statistic (or new data): new
    with pytest.raises(LedgerError, match="bound to this roster already"):
        init_ledger_file(path, two.fingerprint)
    path.write_text(path.read_text().replace('"statistics"', '"statistic"'))
    with pytest.raises(LedgerError, match="SHA-256"):  # a damaged ledger is never rebound
        init_ledger_file(path, one.fingerprint)


def test_init_ledger_refuses_a_fifo_and_an_empty_file_instead_of_blocking_or_starting_afresh(tmp_path):
    """--init-ledger read a FIFO with read_text (blocking for ever) and took an empty file for an empty ledger of
    the older format: a ledger truncated to nothing came back as a fresh one that forgot the node's uploads."""
    roster, _ = make_roster(3)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list = []

    def init() -> None:
        try:
            init_ledger_file(fifo, roster.fingerprint)
        except LedgerError as exc:
            got.append(exc)

    worker = threading.Thread(target=init, daemon=True)  # a regression blocks: the test fails, CI goes on
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "--init-ledger blocked reading a FIFO"
    assert got and "is a FIFO" in str(got[0])
    for text in ("", "  \n"):
        empty = tmp_path / "empty"
        empty.write_text(text)
        with pytest.raises(LedgerError, match="the file exists and is empty; .*restore it"):
            init_ledger_file(empty, roster.fingerprint)
        assert empty.read_text() == text and not (tmp_path / "empty.old").exists()
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(
        LedgerError, match="symbolic link to .*, which does not exist"
    ):  # no ledger made through it
        init_ledger_file(dangling, roster.fingerprint)
    assert init_ledger_file(tmp_path / "new.json", roster.fingerprint) == "created"


def test_roster_and_identity_files_a_node_would_misread_are_refused(tmp_path):
    """A roster that is a JSON list was an AttributeError, a string version a TypeError; an identity of index
    1.7 or true loaded as node 1, a 31-byte key loaded and failed only when the node first signed."""
    from mechanisms.secagg.identity import Identity
    from privfed.errors import ConfigError

    roster, ids = make_roster(3)
    good = json.loads(roster.to_json())
    for text in ("[]", "null", "5", '"x"', json.dumps({**good, "version": "3"})):
        with pytest.raises(ConfigError, match="not a privfed roster"):
            Roster.from_json(text)
    key = ids[1].private_key.hex()
    for index, hexkey, match in ((1.7, key, "index must be an integer"), (True, key, "index must be an integer"),
                                 (-1, key, "index must be an integer"), (1, key[:-2], "must be 32 bytes")):  # fmt: skip
        path = tmp_path / "id.json"
        path.write_text(json.dumps({"index": index, "private_key": hexkey}))
        with pytest.raises(ConfigError, match=match):
            Identity.load(path)
    path.write_text(ids[1].to_json())
    assert Identity.load(path).check(roster).index == 1
    import numpy as np

    # numpy indices and bytes-like keys, as before; a JSON true is no roster version
    assert Identity(np.int64(1), bytearray(ids[1].private_key)).check(roster).index == 1
    with pytest.raises(ConfigError, match="not a privfed roster"):
        Roster.from_json(json.dumps({**good, "version": True}))


def test_identities_and_roster_paths_that_are_not_one_are_refused_in_a_line():
    """Roster.load(None) and Identity.load(5) were Python's TypeError from pathlib, Roster.load("") read the
    working folder as "a directory", and Identity(0, b"short") a bare ValueError: each is a privfed error
    naming what is wrong (and a key is never shown in it)."""
    from mechanisms.secagg.identity import Identity
    from privfed.errors import PrivfedError

    for load, what in ((Roster.load, "secagg-roster"), (Identity.load, "secagg-identity")):
        for value in (None, 5, "", "  ", b""):
            with pytest.raises(PrivfedError, match=rf"^{what} is not a file path \(got "):
                load(value)
        with pytest.raises(PrivfedError, match="no such file"):  # a bytes path is a path, as os takes it
            load(b"/no/such/privfed/file.json")
        with pytest.raises(PrivfedError, match="names a home folder that does not exist"):
            load("~no_such_user_privfed/roster.json")
    secret = bytes(range(31))
    for index, key, match in (
        (0, secret, "must be 32 bytes"),
        (-1, bytes(32), "index must be an integer >= 0"),
    ):
        with pytest.raises(PrivfedError, match=match) as info:
            Identity(index, key)
        assert secret.hex() not in str(info.value) and repr(secret)[:20] not in str(info.value)


def test_a_refused_create_leaves_no_lock_file_beside_what_it_refused(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "there.json").write_text("{}")
    with pytest.raises(LedgerError, match="it is a folder; name the ledger file to create inside it"):
        NodeLedger.create(tmp_path / "folder", FP)
    with pytest.raises(LedgerError, match="the file exists"):
        NodeLedger.create(tmp_path / "there.json", FP)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "there.json"]
