"""What a lying server gets by naming the node's data differently, its feature file unchanged.

A node's no-DP releases are keyed by its data and the statistic (``released_statistics``); for a node with
its own feature file the data is its records (labels and float32 features, rows in canonical order).  The
server chooses num-classes, the method, the round and the protocol but not the file: none of them changes
the key, so the same counts or class sums are never summed again under another roster.  The same records
re-saved (rows permuted, compressed, as float32, scaled below float32's resolution) keep the key.

Two keys still move with no change to the statistics: a node on the embedded digits data set (node config
``partition-id``/``num-partitions``) takes its rows from the partition the *server's* run config names
(partition, alpha, partition-seed), so the server picks a new data key and overlapping rows at will; and
a feature file whose zeros are re-saved as -0.0 (the same records, the same statistics) is new data.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.charges import released_statistics  # noqa: E402
from privfed.flower.node import load_node_data  # noqa: E402
from privfed.methods.fedcof_protocol import ROUNDS  # noqa: E402

C, D, N = 3, 4, 30


def _file(path, F, y, **kw):
    (np.savez_compressed if kw.get("compressed") else np.savez)(path, features=F, labels=y)
    return path


def _records(seed=3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)), np.arange(N) % C


def _keys(path, round_name="sums", **cfg):
    conf = dict(method="fedncm", clients=3, num_classes=C)
    conf.update(cfg)
    ctx = SimpleNamespace(node_config={"features": str(path)}, node_id=1)
    return released_statistics(ctx, FlowerConfig(**conf), round_name)


def _names(keys):
    return {v: k for k, v in keys.items()}


@pytest.mark.parametrize(
    "server",
    [
        dict(num_classes=C + 2),
        dict(num_classes=C + 7, method="fedcof"),
        dict(method="fed3r"),
        dict(secure="mask"),
        dict(clip=0.5, epsilon=1.0),  # clip is a setting of a DP release
    ],
)
def test_no_run_setting_of_the_server_renames_the_node_data(tmp_path, server):
    F, y = _records()
    path = _file(tmp_path / "site.npz", F, y)
    base = _names(_keys(path))
    other = _keys(path, round_name="sums" if server.get("method") != "fedcof" else ROUNDS[0], **server)
    for name, key in _names(other).items():
        if name in base:
            assert key == base[name], name


def test_fedcof_round2_carries_the_same_counts_and_sums_keys_as_a_plain_sum(tmp_path):
    F, y = _records()
    path = _file(tmp_path / "site.npz", F, y)
    plain = _names(_keys(path))
    spread = _names(_keys(path, ROUNDS[1], method="fedcof"))
    assert spread["counts"] == plain["counts"] and spread["sums"] == plain["sums"]


@pytest.mark.parametrize("how", ["permuted", "compressed", "float32", "scaled below float32"])
def test_the_same_records_resaved_keep_their_key(tmp_path, how):
    F, y = _records()
    first = _keys(_file(tmp_path / "a.npz", F, y))
    if how == "permuted":
        order = np.random.default_rng(0).permutation(N)
        again = _file(tmp_path / "b.npz", F[order], y[order])
    elif how == "compressed":
        again = _file(tmp_path / "b.npz", F, y, compressed=True)
    elif how == "float32":
        again = _file(tmp_path / "b.npz", F.astype(np.float32), y)
    else:
        F32 = F.astype(np.float32).astype(np.float64)  # values exactly on float32's grid
        G = F32 * (1 + 1e-9)  # 1e-9 relative: below float32's half step (3e-8)
        assert np.array_equal(G.astype(np.float32), F32.astype(np.float32))
        again = _file(tmp_path / "b.npz", G, y)
    assert _keys(again) == first


@pytest.mark.xfail(
    strict=True,
    reason="a node on the embedded digits set takes its rows from the partition the server's run config "
    "names: another partition-seed is another data key over overlapping rows, summed without DP again",
)
def test_the_server_cannot_rename_a_partition_node_data(tmp_path):
    ctx = SimpleNamespace(node_config={"partition-id": 0, "num-partitions": 4}, node_id=1)
    cfgs = [FlowerConfig(method="fedncm", clients=4, partition_seed=s) for s in (0, 1)]
    rows = [load_node_data(ctx.node_config, cfg) for cfg in cfgs]
    a = {r.tobytes() for r in np.asarray(rows[0].features)}
    b = {r.tobytes() for r in np.asarray(rows[1].features)}
    assert a & b and a != b  # overlapping, different rows: their sums subtract to a few records
    keys = [released_statistics(ctx, cfg, "sums") for cfg in cfgs]
    assert set(keys[0]) & set(keys[1]), "the second sum of overlapping rows is a new statistic"


def test_negative_zeros_are_the_same_records(tmp_path):
    F, y = _records()
    F[:, 0] = 0.0
    first = _keys(_file(tmp_path / "a.npz", F, y))
    again = _keys(_file(tmp_path / "b.npz", np.where(F == 0, -0.0, F), y))
    assert again == first


def _stats(F, y):
    return np.concatenate(
        [np.bincount(y, minlength=C), np.stack([F[y == c].sum(0) for c in range(C)]).ravel()]
    )


@pytest.mark.xfail(
    strict=True,
    reason="outside the threat model (the operator re-saves altered records): a subset of rows, a dummy row, "
    "features scaled above float32's step or labels permuted are new data, so the old sites' second sum "
    "subtracts from the first to a joining site's statistics (to 1e-6 for the scaled copy)",
)
@pytest.mark.parametrize("how", ["subset of rows", "plus a dummy row", "scaled by 1+1e-6", "labels permuted"])
def test_altered_records_are_not_a_second_release(tmp_path, how):
    F, y = _records()
    first = _keys(_file(tmp_path / "a.npz", F, y))
    if how == "subset of rows":
        G, z = F[:-1], y[:-1]
    elif how == "plus a dummy row":
        G, z = np.vstack([F, np.zeros((1, D))]), np.append(y, 0)
    elif how == "scaled by 1+1e-6":
        G, z = F * (1 + 1e-6), y
        assert not np.array_equal(G.astype(np.float32), F.astype(np.float32))
    else:
        G, z = F, (y + 1) % C
    again = _keys(_file(tmp_path / "b.npz", G, z))
    gap = np.abs(_stats(G, z) - _stats(F, y)).max()  # what differs from the first release (reported)
    assert set(again) & set(first), f"a new data key for statistics that differ by at most {gap:.2g}"


@pytest.mark.parametrize("first, then", [("fed3r", "fedcof-oracle"), ("fedcof-oracle", "fedcgs")])
def test_class_second_moments_after_the_second_moment_share_a_claim(tmp_path, first, then):
    """fedcof-oracle sums per-class second moments, whose sum over classes is fed3r's second moment: under
    another roster the two would subtract to a joining site's second moment.  They share the counts' and
    sums' claims, so the node refuses the second one."""
    F, y = _records()
    path = _file(tmp_path / "site.npz", F, y)
    a, b = _names(_keys(path, method=first)), _names(_keys(path, method=then))
    assert {"counts", "sums"} <= set(a) & set(b)
    assert a["counts"] == b["counts"] and a["sums"] == b["sums"]
