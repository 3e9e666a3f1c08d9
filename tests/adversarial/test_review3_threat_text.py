"""What the printed threat models say about a class few nodes hold and about FedCOF's round-2 tilt.

Each run's report carries the threat model computed for it (``head.secure_aggregation["threat_model"]``,
printed as the ``threat model`` line), and FedCOF's masked runs the protocol's
(``protocol_threat_model``).  Checked here on honest runs of deployed nodes: the masked and CKKS texts
say that a class's coordinates sum only its holders (a class one node holds is that node's statistic),
FedCOF's says the tilt the roster allows (1,024 by default).  Flower's own SecAgg+, which the app still
offers for comparison, prints a fixed text that says nothing of classes.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, deployed_nodes  # noqa: E402

from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.server_secure import THREAT_FLWR  # noqa: E402

K, C, D = 3, 3, 4
PER_CLASS = "sum only the nodes that hold the class"


def _nodes(folder: pathlib.Path) -> dict[int, dict]:
    rng = np.random.default_rng(23)
    nodes, _, _ = deployed_nodes(folder, K, colluders=0)
    for i in range(K):
        y = np.arange(9 + i) % C
        path = folder / f"site-{i}.npz"
        np.savez(path, features=rng.normal(size=(y.size, D)), labels=y)
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
    return nodes


@pytest.mark.parametrize("method, secure", [("fedcof", "mask"), ("fedncm", "ckks")])
def test_each_printed_threat_model_names_a_class_few_nodes_hold(tmp_path, method, secure):
    cfg = FlowerConfig(method=method, clients=K, secure=secure, num_classes=C, timeout=60)
    sa = serve(LocalGrid(_nodes(tmp_path)), cfg).head.secure_aggregation
    assert PER_CLASS in sa["threat_model"] and "one node alone" in sa["threat_model"], sa["threat_model"]
    if method == "fedcof":
        text = sa["protocol_threat_model"]
        assert "tilt the round-2 sum toward one class by at most 1024" in text, text


def test_flowers_secaggplus_threat_model_names_a_class_few_nodes_hold():
    assert "a class one node alone holds is that node's statistic" in THREAT_FLWR
