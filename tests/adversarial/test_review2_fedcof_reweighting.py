"""FedCOF's round-2 weights under the default roster bounds: how far a server can tilt them.

Round 2 sums, over the nodes, ``sum_c w_c n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T`` with the broadcast N_c, mu_c,
K_c and ``w_c = (N_c - 1) / max(K_c - 1, 1)`` floored at 1.  The node used to check N_c only against K times
the roster's ``max-records`` (2^20 by default), so a server could send, for a class two nodes hold, N_c =
K * 2^20, K_c = 1 (weight 4,194,303) and weight 1 elsewhere: divided by the weight, the round-2 sum was that
class's ``sum_k n_kc mu_kc mu_kc^T`` to 3e-7, and with round 1 both nodes' class means to 1e-7 (up to the
split of the class count).

Now the node also refuses N_c above K_c times max-records (one mean's records) and class weights whose
largest is more than the roster's ``weight_ratio`` (2^10 by default) times the smallest.  What remains is
stated, computed from the roster, in the threat model every FedCOF masked run prints: the server can tilt
round 2 by that ratio, and without DP a class's second moment is read to within it.  This test plays the
old broadcast (refused), then the strongest the nodes accept, and checks that what the server reads is
exactly what the threat model says: the class's scatter plus 1/ratio of the others'.
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
from privfed.methods.fedcof_protocol import ROUNDS, FedCOFServer, threat_model  # noqa: E402

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


def _scatter(files: list[pathlib.Path], c: int, mu: np.ndarray) -> np.ndarray:
    """sum over the holders of class c of n_kc (mu_kc - mu)(mu_kc - mu)^T, from the files (independently)."""
    out = np.zeros((D, D))
    for path in files:
        z = np.load(path)
        rows = z["labels"] == c
        if rows.any():
            dev = z["features"][rows].mean(axis=0) - mu
            out += rows.sum() * np.outer(dev, dev)
    return out


def _round_one(folder: pathlib.Path, files: list[pathlib.Path]):
    """A federation of the sites under the operator's default roster, and its honest round 1 (a refused
    round 2 spends the nodes' one round-2 release, so each broadcast below gets its own federation)."""
    nodes, roster, _ = deployed_nodes(folder, K)
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
    assert honest["Kc"][0] == 2  # two nodes hold class 0
    return srv, fedcof, honest, roster


def test_fedcof_round_two_tilt_is_bounded_by_the_roster_and_stated(tmp_path):
    files = _sites(tmp_path)
    # the old broadcast: N_0 = K * max-records with K_c = 1 (weight 4,194,303); then one within that count
    # rule (K_c = 2, N_0 = 2 * max-records: weight 2^21 - 1): every node refuses both, naming the rule
    for name, k0, rule in (
        ("old", 1, "above K_c times 1.04858e+06"),
        ("count", 2, "-fold, above 1024, the roster"),
    ):
        srv, fedcof, honest, roster = _round_one(tmp_path / name, files)
        R = roster.bounds.max_records
        lie = {k: honest[k].copy() for k in ("N", "mu", "Kc")}
        lie["N"][0], lie["Kc"][0], lie["mu"][0] = float(K * R if k0 == 1 else 2 * R), float(k0), 0.0
        _, second = srv.masked_sum(
            sorted(srv.grid.contexts), fedcof.lengths[ROUNDS[1]], round_name=ROUNDS[1], broadcast=lie
        )
        assert second is None
        refused = {node: why for (stage, node), why in srv.refusals.items() if node != -1}
        assert len(refused) == K, srv.refusals
        assert all(rule in why and "\n" not in why for why in refused.values()), refused

    # the strongest tilt the nodes accept: class 0 weighted `ratio` (N_0 = ratio + 1 over its K_c = 2 means),
    # every other class 1 (N_c = K_c), the honest means: every node uploads
    srv, fedcof, honest, roster = _round_one(tmp_path / "within", files)
    ratio = roster.bounds.fedcof_tilt()
    assert ratio == roster.bounds.weight_ratio == 1024 < 2 * roster.bounds.max_records - 1
    N, S, Kc = fedcof.N, fedcof.S, honest["Kc"]
    lie = {"N": Kc.copy(), "mu": honest["mu"].copy(), "Kc": Kc.copy()}
    lie["N"][0] = ratio + 1.0
    _, second = srv.masked_sum(
        sorted(srv.grid.contexts), fedcof.lengths[ROUNDS[1]], round_name=ROUNDS[1], broadcast=lie
    )
    assert second is not None and not srv.refusals, srv.refusals
    read = second[:-1].reshape(D, D) / ratio
    mine = _scatter(files, 0, S[0] / N[0])  # class 0's scatter: its two holders' means about theirs
    others = sum(_scatter(files, c, S[c] / N[c]) for c in range(1, C))
    # exactly what the threat model states: the class's scatter plus 1/ratio of the others' (fixed point 2^-32)
    assert np.abs(read - (mine + others / ratio)).max() < 1e-7
    assert np.abs(read - mine).max() > 0.5 * np.abs(others).max() / ratio  # the others are not gone
    stated = threat_model(roster.bounds.max_means(K), roster.bounds.max_count(K), exact=True, max_ratio=ratio)
    assert (
        "at most 1024 times the smallest" in stated and "at least 0.000977 times the other classes'" in stated
    )
    assert "only DP protects a class against it" in stated
