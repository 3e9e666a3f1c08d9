"""What the ledger's ``no-dp-releases`` section takes to be "the same data", across rosters.

A node names its data by the SHA-256 of its feature file's bytes.  A server cannot change the file, but
the operator of a site that joins a second federation may start the node with another file of the same
records: the same file at another path (refused, as it should be), or the same arrays saved again in
another container (``np.savez_compressed``) or as float32.  Those bytes differ, so the node takes them
for new data, sums their counts and class sums without DP under the new roster, and the two federations'
totals subtract to the statistics of the site that joined (to float32's precision for the float32 copy).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, LyingServer, deployed_nodes  # noqa: E402

from mechanisms.secagg.ledger import init_ledger_file  # noqa: E402
from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import sum_vector_length  # noqa: E402

C, D = 3, 4


def _sites(folder: pathlib.Path, count: int) -> list[pathlib.Path]:
    rng = np.random.default_rng(13)
    files = []
    for h in range(count):
        n = 12 + h
        path = folder / f"site-{h}.npz"
        np.savez(path, features=rng.normal(size=(n, D)), labels=np.arange(n) % C)
        files.append(path)
    return files


def _copy(path: pathlib.Path, how: str) -> pathlib.Path:
    """The operator's other file of the same records."""
    z = np.load(path)
    F, y = z["features"], z["labels"]
    out = path.with_name(f"{path.stem}-{how.replace(' ', '-')}.npz")
    if how == "same bytes":
        out.write_bytes(path.read_bytes())
    elif how == "compressed":
        np.savez_compressed(out, features=F, labels=y)
    else:  # "float32"
        np.savez(out, features=F.astype(np.float32), labels=y)
    return out


def _federation(folder, files, ledgers):
    nodes, roster, _ = deployed_nodes(folder, len(files))
    for i, path in enumerate(files):
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
        assert init_ledger_file(ledgers[i], roster.fingerprint).split()[0] in ("created", "rebound")
        conf["secagg-ledger"] = str(ledgers[i])
    return nodes


def _total(nodes):
    cfg = FlowerConfig(method="fedncm", clients=len(nodes), secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    srv.setup(sorted(nodes))
    _, total = srv.masked_sum(sorted(nodes), sum_vector_length(cfg.make_method(), C, D))
    return total, srv.refusals


def _statistics(path):
    z = np.load(path)
    F, y = z["features"], z["labels"]
    return np.concatenate(
        [np.bincount(y, minlength=C), np.stack([F[y == c].sum(0) for c in range(C)]).ravel()]
    )


def _attack(tmp_path, how):
    """Sites 0-3 summed under roster 1; site 4 joins and sites 0-3 restart on copies of their files."""
    files = _sites(tmp_path, 5)
    ledgers = [p.with_suffix(".ledger.json") for p in files]
    first, refused = _total(_federation(tmp_path / "roster-1", files[:4], ledgers))
    assert first is not None and not refused, refused
    copies = [_copy(p, how) for p in files[:4]] + [files[4]]
    second, refused = _total(_federation(tmp_path / "roster-2", copies, ledgers))
    return files, first, second, refused


def test_the_same_file_at_another_path_is_the_same_data(tmp_path):
    files, first, second, refused = _attack(tmp_path, "same bytes")
    assert second is None
    assert {node for (stage, node) in refused if node != -1} == {FIRST + i for i in range(4)}, refused
    assert all("under another roster" in why for (stage, node), why in refused.items() if node != -1)


@pytest.mark.parametrize("how", ["compressed", "float32"])
def test_the_same_records_in_another_file_are_the_same_data(tmp_path, how):
    files, first, second, refused = _attack(tmp_path, how)
    read = None if second is None else second - first
    truth = _statistics(files[4])
    assert read is None or not np.allclose(read, truth, atol=1e-4), (
        f"site 4's statistics read to {np.abs(read - truth).max():.2g}"
    )
