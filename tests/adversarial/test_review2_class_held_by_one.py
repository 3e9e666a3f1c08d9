"""A class only one node holds: the masked sum's coordinates of that class are that node's statistics.

The threat model every masked run prints counts the honest inputs a decodable sum covers (t = 3 of K = 4
under the default roster).  That holds of the vector, not of its coordinates: fedncm's sum carries each
class's count and feature sum, and a class that one node alone holds (a site with a rare condition) adds
only that node's records there.  An honest server running the default deployed protocol, no DP, reads that
node's exact class count and class sum.  This is a property of the sum, not a break of the protocol: the
printed threat model now says it (computed: a class held by fewer than t nodes is covered by fewer than t
inputs, one node's class is read exactly without DP, only DP protects it), and this test holds the run's
report to it and still shows the exact read.  Under DP the noise covers it (every class is sent, noised
zeros included).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, deployed_nodes  # noqa: E402

from mechanisms.secagg.threat import masking_threat  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

K, C, D = 4, 3, 5


def test_a_class_held_by_one_node_is_stated_by_the_printed_threat_model(tmp_path: pathlib.Path):
    rng = np.random.default_rng(5)
    nodes, roster, _ = deployed_nodes(tmp_path / "roster", K)
    for i in range(K):
        n = 15
        y = rng.integers(1, C, n)  # classes 1 and 2 everywhere
        if i == 0:
            y[:4] = 0  # the rare class: node 0 only
        path = tmp_path / f"site-{i}.npz"
        np.savez(path, features=rng.normal(size=(n, D)), labels=y)
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
    res = serve(
        LocalGrid(nodes), FlowerConfig(method="fedncm", clients=K, secure="mask", num_classes=C, timeout=30)
    )
    printed = res.head.secure_aggregation["threat_model"]
    # the run's report: every sum covers t = 3 honest inputs of the vector, but not of each class's coordinates
    assert "covers: 3" in printed
    assert (
        "a per-class statistic's coordinates (a class's count, feature sum, second moment) sum only the nodes "
        "that hold the class, so a class held by fewer than 3 nodes is covered by fewer than 3 inputs, and a "
        "class one node alone holds is that node's statistic, read exactly without DP; only DP protects a class "
        "few nodes hold" in printed
    )
    assert "noise share to every class's coordinates" not in printed  # no DP in this run: nothing covers it
    # the same sentence, computed from the roster, wherever the threat model is printed
    model = masking_threat(K, roster.threshold, None, declared_colluders=roster.colluders)
    assert (
        model.smallest_sum_alone == 3
        and "fewer than 3 nodes is covered by fewer than 3 inputs" in model.text()
    )
    # and what it says: the sum's class-0 count and feature sum are node 0's, exactly (to the fixed-point step)
    (total,) = res.sums
    z = np.load(tmp_path / "site-0.npz")
    mine = z["labels"] == 0
    count, class_sum = total[0], total[C : C + D]  # fedncm's vector: C counts, then C x D class sums
    error = max(abs(count - mine.sum()), np.abs(class_sum - z["features"][mine].sum(axis=0)).max())
    assert error < 1e-6, f"node 0's class-0 count and feature sum read to {error:.1e}"
