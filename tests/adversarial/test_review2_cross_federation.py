"""A site's statistics read by differencing two federations' masked sums, without DP.

A deployed node keeps, in its secure-aggregation ledger file, the statistics it released without DP (each
once, ever, docs/secure-aggregation.md) and the uploader set of its first sum (a later sum over another set
is refused): together they stop a server from subtracting two sums.  That ledger is bound to the roster's
fingerprint, and a roster fixes K, so whenever membership changes -- a hospital joins or leaves, the
operator writes a new roster -- every node creates a new ledger file, as the docs tell it to, and both
records start again.  The same feature file is then summed a second time over another set of sites.

The server here does nothing but run each federation's honest masked sum (fedncm, no DP, the default
roster, every check in place): the difference of the two totals is the statistics (class counts and class
sums) of the site that joined or left, to the fixed-point step.
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
from privfed.flower.protocol import sum_vector_length  # noqa: E402

C, D = 3, 4


def _sites(folder: pathlib.Path, count: int) -> list[pathlib.Path]:
    """One feature file per hospital (its own records, never public)."""
    rng = np.random.default_rng(7)
    files = []
    for h in range(count):
        n = 12 + h
        path = folder / f"site-{h}.npz"
        np.savez(path, features=rng.normal(size=(n, D)), labels=rng.integers(0, C, n))
        files.append(path)
    return files


def _federation(folder: pathlib.Path, files: list[pathlib.Path]) -> dict[int, dict]:
    """The operator's roster for these sites (defaults), each node's own ledger file made as documented."""
    nodes, _, _ = deployed_nodes(folder, len(files))
    for i, path in enumerate(files):
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
    return nodes


def _masked_total(nodes: dict[int, dict]) -> np.ndarray:
    """An honest server's masked sum of fedncm's statistics over every node of the federation."""
    cfg = FlowerConfig(method="fedncm", clients=len(nodes), secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    setup = srv.setup(sorted(nodes))
    meta = next(iter(setup.values()))["meta"]
    _, total = srv.masked_sum(
        sorted(nodes), sum_vector_length(cfg.make_method(), int(meta["C"]), int(meta["d"]))
    )
    assert total is not None and not srv.refusals, srv.refusals
    return total


def _statistics(path: pathlib.Path) -> np.ndarray:
    """The site's class counts and class sums, computed from its file (what fedncm's vector holds)."""
    z = np.load(path)
    F, y = z["features"], z["labels"]
    sums = np.stack([F[y == c].sum(axis=0) for c in range(C)])
    return np.concatenate([np.bincount(y, minlength=C).astype(float), sums.ravel()])


@pytest.mark.xfail(
    strict=True,
    reason="a site that joins or leaves a federation (a new roster, so new ledger files) has its exact "
    "class counts and sums read by differencing the two federations' masked sums, without DP",
)
@pytest.mark.parametrize("change", ["joins", "leaves"])
def test_a_site_that_joins_or_leaves_keeps_its_statistics(tmp_path, change):
    files = _sites(tmp_path, 5)
    before, after = (files[:4], files) if change == "joins" else (files, files[:4])
    first = _masked_total(_federation(tmp_path / "roster-1", before))
    second = _masked_total(_federation(tmp_path / "roster-2", after))
    difference = second - first if change == "joins" else first - second
    # the two sums cover the same four sites' files twice; their difference is site 4's statistics (to the
    # fixed-point step of the roster's frac-bits, 2^-32, times the 9 inputs summed)
    error = np.abs(difference - _statistics(files[4])).max()
    assert error > 1e-6, f"the server read site 4's statistics to {error:.1e}"
