"""A node that lost its ledger, or holds a damaged one, against a server that would like it to start afresh.

The issue: a node whose node config named a ``secagg-ledger`` path whose file was gone (deleted, a new disk,
a fresh container) started a fresh ledger without a word; replaying the consistency signatures of two
earlier runs then let the server decode the sum of two inputs, below t.  Now the file is created once by an
explicit step (``python -m mechanisms.secagg.identity --init-ledger FILE --roster ROSTER``) and a node
refuses to run -- at its first message, before any key -- when the file is missing, unreadable, damaged,
or made for another roster.  Through the real ClientApp and ServerApp (the in-process grid).
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from mechanisms.secagg.identity import make_roster  # noqa: E402
from privfed.errors import ConfigError, PrivfedError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.secagg import masked_sum_over_messages  # noqa: E402

K = 4


def _deployed(roster, ids, folder):
    return {
        100 + i: {
            "partition-id": i,
            "num-partitions": K,
            "secagg-identity": ids[i].to_json(),
            "secagg-roster": roster.to_json(),
            "secagg-ledger": str(folder / f"ledger-{i}.json"),
        }
        for i in range(K)
    }


def _init(nodes, roster_file):
    from mechanisms.secagg.identity import main

    for c in nodes.values():  # the documented step, once per node
        assert main(["--init-ledger", c["secagg-ledger"], "--roster", str(roster_file)]) == 0


@pytest.mark.parametrize("secure", ["mask", "ckks"])
def test_a_missing_ledger_file_stops_the_node_before_any_key(digits_dataset, tmp_path, secure):
    roster, ids = make_roster(K, colluders=0)
    nodes = _deployed(roster, ids, tmp_path)
    (tmp_path / "roster.json").write_text(roster.to_json())
    cfg = FlowerConfig(method="fedncm", clients=K, secure=secure, timeout=30)
    with pytest.raises(
        ConfigError, match="stage 'setup'.*secagg-ledger=.*ledger-0.json: no such file"
    ) as exc:
        serve(LocalGrid(nodes), cfg)
    assert "\n" not in str(exc.value)
    # a server that skips the setup meets the same refusal at the first masking message
    if secure == "mask":
        with pytest.raises(PrivfedError, match="stage 'keys'.*no such file"):
            masked_sum_over_messages(
                LocalGrid(nodes),
                sorted(nodes),
                length=3,
                frac_bits=32,
                threshold=None,
                timeout=30,
                masked_payload=lambda n: {},
                round_name="sums",
                num_nodes=K,
            )
    assert not any((tmp_path / f"ledger-{i}.json").exists() for i in range(K))  # nothing was made up
    _init(nodes, tmp_path / "roster.json")
    assert serve(LocalGrid(nodes), cfg).head.secure_aggregation["summed_nodes"] == K


def test_a_damaged_or_foreign_ledger_file_stops_the_node(digits_dataset, tmp_path):
    roster, ids = make_roster(K)
    nodes = _deployed(roster, ids, tmp_path)
    (tmp_path / "roster.json").write_text(roster.to_json())
    _init(nodes, tmp_path / "roster.json")
    cfg = FlowerConfig(method="fedncm", clients=K, secure="mask", timeout=30)
    first = serve(LocalGrid(nodes), cfg)
    assert first.head.secure_aggregation["summed_nodes"] == K
    path = tmp_path / "ledger-2.json"
    good = path.read_text()
    raw = json.loads(good)
    raw["sections"]["secagg"]["records"]["aggregations"] = []  # the server's wish: a node that forgot
    for bad, why in (
        (json.dumps(raw), "SHA-256 does not match"),
        (good[:40], "not JSON"),
    ):
        path.write_text(bad)
        with pytest.raises(ConfigError, match=f"node 102.*ledger-2.json: .*{why}"):
            serve(LocalGrid(nodes), FlowerConfig(method="fed3r", clients=K, secure="mask", timeout=30))
    path.write_text(good)
    other, _ = make_roster(K)  # a ledger made for another roster
    from mechanisms.secagg.ledger import init_ledger_file

    path.unlink()
    init_ledger_file(path, other.fingerprint)
    with pytest.raises(ConfigError, match="ledger-2.json: it was created for another roster"):
        serve(LocalGrid(nodes), FlowerConfig(method="fed3r", clients=K, secure="mask", timeout=30))
