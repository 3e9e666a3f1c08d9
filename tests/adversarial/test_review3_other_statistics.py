"""A second release without DP of a site's data under a new roster, through another method, num-classes or
transport: refused.

The first federation (sites 0-3, default roster, ``--colluders 0`` so CKKS may run too) sums fedncm's
counts and class sums without DP.  A site joins; the operator writes a new roster and binds every site's
ledger file to it (``--init-ledger`` on the same file).  Whatever the server then asks without DP --
fed3r, fedcgs or fed3r-within (their Gram matrix comes with the counts and sums), fedcof-oracle (class
second moments), FedCOF's round 1 (counts, sums, presence), fedncm over another num-classes, fedncm under
CKKS instead of masking -- every site of the first federation refuses before any value of its data
leaves, naming the other roster.  (FedCOF's round 2 alone is not refused: test_review3_spread_reads_sums.)
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, deployed_nodes  # noqa: E402

from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.ledger import init_ledger_file  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

C, D = 3, 4


def _federation(folder: pathlib.Path, count: int) -> dict[int, dict]:
    rng = np.random.default_rng(17)
    nodes, roster, _ = deployed_nodes(folder / f"roster-{count}", count, colluders=0)
    for i in range(count):
        path = folder / f"site-{i}.npz"
        if not path.exists():
            n = 12 + i
            np.savez(path, features=rng.normal(size=(n, D)), labels=np.arange(n) % C)
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
        ledger = path.with_suffix(".ledger.json")
        assert init_ledger_file(ledger, roster.fingerprint).split()[0] in ("created", "rebound")
        conf["secagg-ledger"] = str(ledger)
    return nodes


@pytest.mark.parametrize(
    "method, secure, classes",
    [
        ("fed3r", "mask", C),
        ("fedcgs", "mask", C),
        ("fed3r-within", "mask", C),
        ("fedcof-oracle", "mask", C),
        ("fedcof", "mask", C),
        ("fedncm", "mask", C + 2),
        ("fedncm", "ckks", C),
    ],
)
def test_a_second_federation_cannot_sum_the_same_data_without_dp(tmp_path, method, secure, classes):
    res = serve(
        LocalGrid(_federation(tmp_path, 4)),
        FlowerConfig(method="fedncm", clients=4, secure="mask", num_classes=C, timeout=30),
    )
    assert res.head is not None  # the first federation's honest run
    nodes = _federation(tmp_path, 5)  # site 4 joins
    cfg = FlowerConfig(method=method, clients=5, secure=secure, num_classes=classes, timeout=30)
    with pytest.raises(ProtocolAbort) as err:
        serve(LocalGrid(nodes), cfg)
    text = str(err.value)
    assert "summed without DP under another roster" in text and "\n" not in text, text
    # no site of the first federation recorded a statistic of its data under the new roster: each refused
    # before its claim (a claim comes before any value of its data is computed)
    for i in range(4):
        body = json.loads(pathlib.Path(nodes[FIRST + i]["secagg-ledger"]).read_text())
        held = body["sections"]["no-dp-releases"]["records"]["statistics"]
        assert body["roster"] not in set(held.values()), (i, held)
