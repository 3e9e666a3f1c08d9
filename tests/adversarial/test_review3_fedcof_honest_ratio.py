"""Honest FedCOF runs under the default roster's weight ratio, on data shaped like a real federation.

A node refuses round-2 class weights more than the roster's ``weight_ratio`` (1,024) apart.  The honest
server sends a class of one mean (K_c = 1) N_c = 1, weight 1, and a class no node holds has weight 1
too (the floor), so the honest weights of a federation that has one rare class (one holder) or a class
no site holds are 1 beside (N_c - 1)/(K_c - 1) for every common class: more than 1,024 apart as soon as
a common class has about 1,024 / (1 + 1/(K_c - 1)) records per holder -- 513 at two holders, 683 at
three -- although no class's records per node differ from another's by anything like 1,024-fold (the
rule the docs give the operator).  The honest run is refused, by every node, at round 2: after round 1
summed the sites' counts and class sums without DP.  The refusal tells the operator to raise the ratio
with --max-weight-ratio when writing the roster; a new roster is a new federation, and every site then
refuses the rerun's round 1 as a second release of its data's counts and sums under another roster, so
the honest federation can never run FedCOF without DP on that data.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, deployed_nodes  # noqa: E402

from mechanisms.secagg.bounds import PublicBounds  # noqa: E402
from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.identity import make_roster  # noqa: E402
from mechanisms.secagg.ledger import init_ledger_file  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

K, C, D = 3, 3, 4


def _nodes(folder: pathlib.Path, per_class: int, rare: str) -> dict[int, dict]:
    """Three sites, ``per_class`` records of classes 0 and 1 each; class 2 held by site 0 alone with
    ``per_class`` records (``rare="one holder"``), by no site (``rare="absent"``), or by every site with one
    record (``rare="one record everywhere"``)."""
    rng = np.random.default_rng(5)
    nodes, _, _ = deployed_nodes(folder, K)
    for i in range(K):
        classes = [0, 1, 2] if (i == 0 and rare == "one holder") else [0, 1]
        y = np.repeat(classes, per_class)
        if rare == "one record everywhere":  # class 2 at every site, one record each: weight (3 - 1)/2 = 1
            y = np.append(y, 2)
        F = rng.normal(size=(y.size, D)) + y[:, None]
        path = folder / f"site-{i}.npz"
        np.savez(path, features=F, labels=y)
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
    return nodes


def _honest(nodes):
    cfg = FlowerConfig(method="fedcof", clients=K, secure="mask", num_classes=C, timeout=60)
    return serve(LocalGrid(nodes), cfg)


@pytest.mark.parametrize("rare", ["one holder", "absent"])
def test_an_honest_federation_with_few_records_per_class_runs(tmp_path, rare):
    # 300 records a class at every site: weights (900 - 1)/2 = 449.5 beside 1, within 1,024
    res = _honest(_nodes(tmp_path, 300, rare))
    assert res.head is not None


@pytest.mark.parametrize("rare", ["one holder", "absent"])
def test_an_honest_federation_with_700_records_per_class_runs(tmp_path, rare):
    # 700 records a class at each of three sites: (2100 - 1)/2 = 1049.5 beside the rare class's 1
    res = _honest(_nodes(tmp_path, 700, rare))
    assert res.head is not None


def _rostered(folder: pathlib.Path, sites: dict[int, dict], ratio: int) -> dict[int, dict]:
    """The same sites under a new roster the operator writes with ``--max-weight-ratio ratio``, each site's
    ledger file bound to it with ``--init-ledger`` (the documented change of roster)."""
    folder.mkdir()
    roster, ids = make_roster(K, bounds=PublicBounds(weight_ratio=ratio))
    (folder / "roster.json").write_text(roster.to_json())
    nodes = {}
    for i, ident in enumerate(ids):
        (folder / f"node-{i}.json").write_text(ident.to_json())
        ledger = pathlib.Path(sites[FIRST + i]["secagg-ledger"])
        assert init_ledger_file(ledger, roster.fingerprint).startswith("rebound")
        nodes[FIRST + i] = {
            **sites[FIRST + i],
            "secagg-identity": str(folder / f"node-{i}.json"),
            "secagg-roster": str(folder / "roster.json"),
        }
    return nodes


@pytest.mark.xfail(
    strict=True,
    raises=ProtocolAbort,
    reason="a refused honest round 2 has spent the sites' one release of counts and sums without DP: the "
    "rerun under the roster with the larger ratio the refusal asks for is refused at round 1",
)
def test_an_honestly_refused_federation_reruns_with_the_ratio_the_refusal_asks_for(tmp_path):
    # honestly beyond the ratio: (2100 - 1)/2 = 1049.5 for classes 0 and 1 beside class 2's (3 - 1)/2 = 1
    nodes = _nodes(tmp_path / "first", 700, "one record everywhere")
    with pytest.raises(ProtocolAbort, match="weight"):
        _honest(nodes)
    res = _honest(_rostered(tmp_path / "second", nodes, 4096))
    assert res.head is not None
