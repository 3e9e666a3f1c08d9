"""The readers of a result folder and of a run record, played against malformed input.

``verify_folder`` and ``check_record`` / ``make_record`` must answer a manifest or a record that is not what
privfed writes with one :class:`InputError` line naming it, never a raw ``AttributeError`` / ``TypeError``,
and never a pass (a manifest that verifies a file outside the folder; a record ``write_record`` refuses only
after the run).  Each test fails on the code before its fix.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from privfed.errors import InputError
from privfed.results.files import manifest_names, verify_folder
from privfed.results.record import check_record, make_record

DATA = dict(
    dataset="d",
    train_samples=1,
    used_samples=1,
    unused_samples=0,
    test_samples=1,
    test_split="s",
    partition="p",
    clients=1,
    seeds=[0],
)
ROW = dict(method="m", epsilon=1.0, seed=0, guarantee="g", upload_bytes=8.0, accuracy=0.5)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def _entry(path: Path, name: str) -> dict:
    body = path.read_bytes()
    return {"name": name, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def _folder(tmp_path: Path, files: list, name: str = "run") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"tool": "privfed", "complete": True, "files": files}))
    return folder


def _good() -> dict:
    return make_record(
        command="tradeoff",
        command_line="x",
        config={},
        data=DATA,
        records=[ROW],
        timing={"total_s": 1.0},
        measured_on="t",
        chance=0.5,
    )


# ---------------------------------------------------------------- verify_folder
@pytest.mark.parametrize("manifest", [[], ["results.json"], "privfed", 3, None])
def test_a_manifest_that_is_no_json_object_is_one_input_error(tmp_path, manifest):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError) as exc:
        verify_folder(folder)
    msg = _one_line(exc)
    assert "manifest.json" in msg and "not a privfed manifest" in msg and "rerun" in msg


def test_a_manifest_entry_outside_the_folder_is_refused(tmp_path):
    """'../out1/results.json' verified a file of another folder; the manifest is foreign, not the folder good."""
    other = tmp_path / "out1"
    other.mkdir()
    (other / "results.json").write_text('{"a": 1}\n')
    for i, name in enumerate(
        ["../out1/results.json", str(other / "results.json"), "sub/../../out1/results.json"]
    ):
        folder = _folder(tmp_path, [_entry(other / "results.json", name)], name=f"run{i}")
        with pytest.raises(InputError) as exc:
            verify_folder(folder)
        msg = _one_line(exc)
        assert "manifest.json is malformed" in msg and "not a file of the folder itself" in msg, msg


def test_a_symbolic_link_out_of_the_folder_is_refused(tmp_path):
    other = tmp_path / "out1"
    other.mkdir()
    (other / "results.json").write_text('{"a": 1}\n')
    folder = _folder(tmp_path, [_entry(other / "results.json", "results.json")])
    os.symlink(other / "results.json", folder / "results.json")
    with pytest.raises(InputError) as exc:
        verify_folder(folder)
    assert "symbolic link that leads out of the folder" in _one_line(exc)
    # a link to a file inside the folder is still a file of the folder
    (folder / "results.json").unlink()
    (folder / "data.bin").write_text('{"a": 1}\n')
    os.symlink("data.bin", folder / "results.json")
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "tool": "privfed",
                "files": [
                    _entry(folder / "data.bin", "data.bin"),
                    _entry(folder / "data.bin", "results.json"),
                ],
            }
        )
    )
    assert verify_folder(folder)["tool"] == "privfed"


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("bytes", "12", "not an integer number of bytes"),
        ("bytes", True, "not an integer number of bytes"),  # True == 1: a one-byte file used to pass
        ("bytes", -1, "not an integer number of bytes"),
        ("sha256", 5, "not 64 hexadecimal digits"),
        ("name", 7, "is not a file name"),
        ("name", "manifest.json", "not a file of the folder itself"),
    ],
)
def test_a_malformed_manifest_entry_is_named_malformed_not_damaged(tmp_path, field, value, needle):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text("1")  # one byte
    entry = {**_entry(folder / "results.json", "results.json"), field: value}
    (folder / "manifest.json").write_text(json.dumps({"tool": "privfed", "files": [entry]}))
    with pytest.raises(InputError) as exc:
        verify_folder(folder)
    msg = _one_line(exc)
    assert "manifest.json is malformed" in msg and needle in msg, msg
    assert "changed or damaged" not in msg


def test_manifest_names_skips_an_entry_without_a_name(tmp_path):
    folder = _folder(tmp_path, [{"bytes": 1}, {"name": "results.csv"}, "config.json", 5])
    assert manifest_names(folder) == {"results.csv", "config.json", "manifest.json"}


# ---------------------------------------------------------------- check_record
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: r["records"].__setitem__(0, 5), "record 0 is a int"),
        (lambda r: r["records"][0].__setitem__("seed", True), "seed True); epsilon must be a number"),
        (lambda r: r["records"][0].__setitem__("epsilon", True), "(epsilon True, seed 0)"),
        (lambda r: r["records"][0].__setitem__("epsilon", ["inf"]), "(epsilon ['inf'], seed 0)"),
        (lambda r: r["records"][0].__setitem__("accuracy", 7.0), "accuracy 7.0 is not a number in [0, 1]"),
        (lambda r: r["records"][0].__setitem__("accuracy", True), "is not a number in [0, 1]"),
        (lambda r: r["records"][0].__setitem__("guarantee", ["g"]), "guarantee ['g'] is not a sentence"),
        (lambda r: r["records"][0].__setitem__("method", {"m": 1}), "method or placement is not a name"),
        (lambda r: r["timing"].__setitem__("total_s", "x"), "timing total_s 'x'"),
        (lambda r: r["timing"].__setitem__("total_s", True), "timing total_s True"),
        (lambda r: r["accuracy"]["values"].append(3), "accuracy value 1 is not a JSON object"),
        (lambda r: r["accuracy"]["values"][0].__setitem__("mean", 7.0), "accuracy value 0's mean"),
        (lambda r: r["accuracy"].__setitem__("chance", 2), "chance 2 is not a number in [0, 1]"),
    ],
)
def test_check_record_refuses_a_malformed_record_in_one_line(change, needle):
    rec = json.loads(json.dumps(_good()))
    change(rec)
    with pytest.raises(InputError) as exc:
        check_record(rec)
    msg = _one_line(exc)
    assert msg.startswith("results.json: ") and needle in msg, msg


# ---------------------------------------------------------------- make_record
def test_make_record_refuses_up_front_what_check_record_would_refuse():
    common = dict(command_line="x", config={}, data=DATA, timing={"total_s": 1})
    row = dict(method="m", epsilon=None, seed=0, guarantee="g", upload_bytes=1)
    with pytest.raises(InputError) as exc:
        make_record(command="attack", records=[row], **common)
    assert "the attack run record: record 0 has a malformed epsilon or seed" in _one_line(exc)
    with pytest.raises(InputError) as exc:
        make_record(command="tradeoff", records=[{**ROW, "accuracy": None}], measured_on="t", **common)
    assert "record 0 has no accuracy" in _one_line(exc)
    with pytest.raises(InputError) as exc:
        make_record(command="tradeoff", records=[5], measured_on="t", **common)
    assert "record 0 is a int" in _one_line(exc)
    with pytest.raises(InputError) as exc:
        make_record(command="attack", records=[{**row, "epsilon": 1.0}], **{**common, "timing": {}})
    assert "timing needs total_s" in _one_line(exc)
    # numpy numbers are what the commands hand over: converted, then checked, then written as read back
    ok = {**ROW, "epsilon": np.float32(0.5), "seed": np.int64(3), "accuracy": np.float64(0.25)}
    rec = make_record(command="tradeoff", records=[ok], measured_on="t", chance=0.1, **common)
    assert check_record(rec)["records"][0]["seed"] == 3 and rec["accuracy"]["values"][0]["mean"] == 0.25
    # a checkpoint of an unfinished run has no data rules yet and is still written
    part = make_record(command="tradeoff", records=[], complete=False, **{**common, "data": {}, "timing": {}})
    assert part["complete"] is False


def test_the_schema_check_refuses_what_it_should():
    good = _good()
    check_record(good)
    for broken, needle in (
        ({**good, "schema": "x"}, "schema"),
        ({k: v for k, v in good.items() if k != "data"}, "no 'data'"),
        ({**good, "data": {"dataset": "d"}}, "data rules lack"),
        ({**good, "records": [{**good["records"][0], "guarantee": "other"}]}, "not listed"),
        (
            {**good, "records": [{k: v for k, v in good["records"][0].items() if k != "accuracy"}]},
            "no accuracy",
        ),
        ({**good, "command": "train"}, "not one of"),
    ):
        with pytest.raises(InputError, match=needle):
            check_record(broken)
