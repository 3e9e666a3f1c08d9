"""A site's statistics read by differencing two federations' masked sums, without DP.

A deployed node keeps, in its secure-aggregation ledger file, the statistics it released without DP (each
once, ever, docs/secure-aggregation.md) and the uploader set of its first sum (a later sum over another set
is refused): together they stop a server from subtracting two sums.  Those records were bound to the
roster's fingerprint, and a roster fixes K, so whenever membership changed -- a hospital joins or leaves,
the operator writes a new roster -- every node started them again, and the same feature file was summed a
second time over another set of sites: the difference of the two honest totals (fedncm, no DP, the default
roster) was the statistics (class counts and class sums) of the site that joined or left, to the
fixed-point step.

Now the ledger's ``no-dp-releases`` section is bound to the node's data, not to the roster: the operator
binds each site's ledger file to the new roster (``--init-ledger FILE --roster NEW`` on the same file, as
the docs say), which keeps that section, and every site that was in the first federation refuses to sum
the same statistics of the same data without DP under the second roster, before any value leaves it.
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
from privfed.results.ledger import LedgerError  # noqa: E402

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
    """The operator's roster for these sites (defaults); each site keeps one ledger file beside its data,
    created once and bound to each new roster with ``--init-ledger`` on the same file (as documented)."""
    nodes, roster, _ = deployed_nodes(folder, len(files))
    for i, path in enumerate(files):
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
        ledger = path.with_suffix(".ledger.json")
        try:
            what = init_ledger_file(ledger, roster.fingerprint)
        except (
            LedgerError
        ):  # a privfed that cannot bind a ledger to a new roster: a new file, as its docs said
            ledger.replace(ledger.with_name(ledger.name + ".moved"))
            what = init_ledger_file(ledger, roster.fingerprint)
        assert what == "created" or what.startswith("rebound"), what
        conf["secagg-ledger"] = str(ledger)
    return nodes


def _masked_total(nodes: dict[int, dict]) -> tuple[np.ndarray | None, dict]:
    """An honest server's masked sum of fedncm's statistics over every node of the federation, and the
    nodes' refusals."""
    cfg = FlowerConfig(method="fedncm", clients=len(nodes), secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    setup = srv.setup(sorted(nodes))
    meta = next(iter(setup.values()))["meta"]
    _, total = srv.masked_sum(
        sorted(nodes), sum_vector_length(cfg.make_method(), int(meta["C"]), int(meta["d"]))
    )
    return total, srv.refusals


def _statistics(path: pathlib.Path) -> np.ndarray:
    """The site's class counts and class sums, computed from its file (what fedncm's vector holds)."""
    z = np.load(path)
    F, y = z["features"], z["labels"]
    sums = np.stack([F[y == c].sum(axis=0) for c in range(C)])
    return np.concatenate([np.bincount(y, minlength=C).astype(float), sums.ravel()])


@pytest.mark.parametrize("change", ["joins", "leaves"])
def test_a_site_that_joins_or_leaves_keeps_its_statistics(tmp_path, change):
    files = _sites(tmp_path, 5)
    before, after = (files[:4], files) if change == "joins" else (files, files[:4])
    first, refused = _masked_total(_federation(tmp_path / "roster-1", before))
    assert first is not None and not refused, refused  # the first federation's honest sum
    second, refused = _masked_total(_federation(tmp_path / "roster-2", after))
    # every site of both federations refuses to sum the same statistics of its data under the new roster
    # (before any value of it leaves), so the server holds no second total to subtract from the first
    assert second is None
    both = {FIRST + i for i in range(4)}
    nodes = {
        node: why for (stage, node), why in refused.items() if node != -1
    }  # -1: the server's own failure
    assert set(nodes) == both, refused
    for (stage, node), why in refused.items():
        if node != -1:
            assert (
                stage == "masked" and "summed without DP under another roster" in why and "\n" not in why
            ), why
