"""FedCOF's round-2 weights under the default roster bounds: two nodes' class means read from one sum.

Round 2 sums, over the nodes, ``sum_c w_c n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T`` with the broadcast N_c, mu_c,
K_c.  The node checks the broadcast against public bounds only: N_c at most K times the roster's
``max-records`` and K_c at most K times its means per node, N_c whole and at least K_c; every weight
``(N_c - 1) / max(K_c - 1, 1)`` is floored at 1, so that no class's term can be left alone in the sum.  The
docs say a class's term can then be "read approximately, to within the ratio of the weights".  A roster
made with the defaults (``--max-records`` not given) has max-records 2^20, so that ratio is K * 2^20 - 1
to 1: the approximation is to a few parts in 10^7.

The server: round 1 honestly (it learns N_c and the class sums S_c); round 2 with, for a class two nodes
hold, N_c = K * 2^20, K_c = 1 and mu_c = 0 (weight 4,194,303), and for every other class N_c = K_c (weight
1).  Divided by the weight, the round-2 sum is that class's ``sum_k n_kc mu_kc mu_kc^T`` to 3e-7; with N_c and
S_c it is rank one plus what the server knows, and gives the difference of the two nodes' class means.
Among the N_c - 1 splits of the class count between the two nodes, one gives each node's class mean, to
1e-7.  The counts per node are the only thing the server does not get (a handful of candidates).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, LyingServer, deployed_nodes  # noqa: E402

from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.methods.fedcof_protocol import ROUNDS, FedCOFServer  # noqa: E402

K, C, D = 4, 3, 3


def _sites(folder: pathlib.Path) -> list[pathlib.Path]:
    """Class 0 is held by nodes 0 and 1 only; classes 1 and 2 by every node."""
    rng = np.random.default_rng(3)
    files = []
    for h in range(K):
        n = 10 + h
        classes = [0, 1, 2] if h < 2 else [1, 2]
        y = rng.choice(classes, n)
        y[: len(classes)] = classes
        F = rng.normal(size=(n, D)) + 0.3 * y[:, None]
        path = folder / f"site-{h}.npz"
        np.savez(path, features=F, labels=y)
        files.append(path)
    return files


def _class_mean(path: pathlib.Path, c: int) -> tuple[int, np.ndarray]:
    z = np.load(path)
    rows = z["labels"] == c
    return int(rows.sum()), z["features"][rows].mean(axis=0)


@pytest.mark.xfail(
    strict=True,
    reason="under the default roster bounds (max-records 2^20) FedCOF's round-2 weights can differ 4e6-fold, "
    "so a class two nodes hold gives both nodes' class means to 1e-7 (up to the split of its count)",
)
def test_fedcof_round_two_under_the_default_bounds_reads_no_nodes_class_mean(tmp_path):
    files = _sites(tmp_path)
    nodes, roster, _ = deployed_nodes(tmp_path / "roster", K)  # the operator's defaults
    for i, path in enumerate(files):
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
    cfg = FlowerConfig(method="fedcof", clients=K, secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    meta = next(iter(srv.setup(sorted(nodes)).values()))["meta"]
    fedcof = FedCOFServer(cfg.make_method(), int(meta["C"]), int(meta["d"]))
    _, first = srv.masked_sum(sorted(nodes), fedcof.lengths[ROUNDS[0]], round_name=ROUNDS[0])
    honest = fedcof.fold_round1(first)
    N0, S0 = float(honest["N"][0]), fedcof.S[0]
    assert honest["Kc"][0] == 2  # two nodes hold class 0

    big = float(roster.bounds.max_count(K))  # the largest N_c the nodes accept
    lie = {"N": honest["Kc"].copy(), "mu": honest["mu"].copy(), "Kc": honest["Kc"].copy()}
    lie["N"][0], lie["Kc"][0], lie["mu"][0] = big, 1.0, 0.0
    _, second = srv.masked_sum(sorted(nodes), fedcof.lengths[ROUNDS[1]], round_name=ROUNDS[1], broadcast=lie)
    assert second is not None and not srv.refusals, srv.refusals  # every node accepted the broadcast

    moment = second[:-1].reshape(D, D) / (big - 1)  # sum_k n_k0 mu_k0 mu_k0^T, to a few parts in 1e7
    rank_one = moment - np.outer(S0, S0) / N0  # (n_0 n_1 / N_0) (mu_00 - mu_10)(mu_00 - mu_10)^T
    values, vectors = np.linalg.eigh(rank_one)
    n_true, mean_true = _class_mean(files[0], 0)
    best = np.inf
    for n0 in range(1, int(N0)):  # every split of the class count: the server's candidates
        n1 = N0 - n0
        delta = vectors[:, -1] * np.sqrt(max(values[-1], 0.0) * N0 / (n0 * n1))
        for sign in (1.0, -1.0):
            best = min(best, np.abs((S0 + sign * n1 * delta) / N0 - mean_true).max())
    assert best > 1e-3, f"one of {int(N0) - 1} candidates is node 0's class-0 mean to {best:.1e}"
