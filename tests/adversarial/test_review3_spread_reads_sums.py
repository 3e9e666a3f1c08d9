"""FedCOF's round-2 spread read as class counts and class sums, so a site that joins is read by differencing.

The ledger's ``no-dp-releases`` section keys each statistic of a node's data by a *name*: ``counts`` and
``sums`` for a plain secure sum (fedncm, fed3r, ...) and FedCOF's round 1, and ``FedCOF round-2 spread``
for round 2.  But the round-2 spread is a function of the same counts and class sums, and the broadcast
means mu_c are bounded by nothing but finiteness: with K_c = N_c = 1 (weight 1) and mu_c = lam e_c, a
node's spread sum_c n_c (m_c - mu_c)(m_c - mu_c)^T holds -lam s_c[j] at (c, j) for every coordinate j
of no mean (j >= C) and lam^2 n_c - 2 lam s_c[c] + ... on the diagonal, so one round 2 -- which a node
answers without having run round 1 -- gives the server the counts and (to ~1/lam) the class sums of
every uploader.  Under a new roster a node that summed its counts and sums without DP under the old one
used to answer a round-2 spread (another name), and the two federations' totals subtracted to the
statistics of the site that joined.  Round 2 now claims the counts, class sums and presence it holds as
well as its own name, so the second federation's sum is refused whichever comes first.
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
from privfed.methods.fedcof_protocol import ROUNDS  # noqa: E402

C, D = 3, 6
LAM = 1e3  # the broadcast means' scale: lam^2 n fits the ring unclipped; the quadratic term is off by ~|x|^2/lam


def _sites(folder: pathlib.Path, count: int) -> list[pathlib.Path]:
    rng = np.random.default_rng(11)
    files = []
    for h in range(count):
        n = 12 + h
        path = folder / f"site-{h}.npz"
        np.savez(path, features=rng.normal(size=(n, D)), labels=np.arange(n) % C)
        files.append(path)
    return files


def _federation(folder: pathlib.Path, files: list[pathlib.Path]) -> dict[int, dict]:
    """The operator's roster for these sites; each site's one ledger file bound to it with --init-ledger."""
    nodes, roster, _ = deployed_nodes(folder, len(files))
    for i, path in enumerate(files):
        conf = nodes[FIRST + i]
        del conf["partition-id"], conf["num-partitions"]
        conf["features"] = str(path)
        ledger = path.with_suffix(".ledger.json")
        what = init_ledger_file(ledger, roster.fingerprint)
        assert what == "created" or what.startswith("rebound"), what
        conf["secagg-ledger"] = str(ledger)
    return nodes


def _truth(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(path)
    F, y = z["features"], z["labels"]
    return np.bincount(y, minlength=C).astype(float), np.stack([F[y == c].sum(axis=0) for c in range(C)])


def _fedncm_total(nodes):
    """An honest fedncm masked sum without DP: (class counts, class sums), or None when refused."""
    cfg = FlowerConfig(method="fedncm", clients=len(nodes), secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    srv.setup(sorted(nodes))
    _, total = srv.masked_sum(sorted(nodes), sum_vector_length(cfg.make_method(), C, D))
    return None if total is None else (total[:C], total[C:].reshape(C, D))


def _spread_total(nodes):
    """A lying FedCOF server's round 2 alone, with K_c = N_c = 1 and mu_c = lam e_c (no bound on mu)."""
    cfg = FlowerConfig(method="fedcof", clients=len(nodes), secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    srv.setup(sorted(nodes))
    mu = np.zeros((C, D))
    mu[np.arange(C), np.arange(C)] = LAM
    broadcast = {"N": np.ones(C), "mu": mu, "Kc": np.ones(C)}
    _, total = srv.masked_sum(sorted(nodes), D * D + 1, round_name=ROUNDS[1], broadcast=broadcast)
    return total, srv.refusals


def _read(spread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts (exact, rounded) and class sums on the coordinates j >= C from the spread."""
    Q = spread[: D * D].reshape(D, D)
    counts = np.round(np.diag(Q)[:C] / LAM**2)
    sums = -Q[:C, C:] / LAM
    return counts, sums


@pytest.mark.parametrize("order", ["fedncm then spread", "spread then fedncm"])
@pytest.mark.parametrize("change", ["joins", "leaves"])
def test_a_site_that_joins_or_leaves_is_not_read_through_the_spread(tmp_path, order, change):
    files = _sites(tmp_path, 5)
    small, large = files[:4], files
    first, second = (small, large) if change == "joins" else (large, small)
    ask = [_fedncm_total, _spread_total] if order == "fedncm then spread" else [_spread_total, _fedncm_total]
    totals = {}
    for k, (sites, how) in enumerate(zip((first, second), ask)):
        got = how(_federation(tmp_path / f"roster-{k}", sites))  # a new roster each, ledgers rebound
        if how is _fedncm_total:
            if got is not None:
                totals[len(sites)] = got[0], got[1][:, C:]
        elif got[0] is not None:
            if got[0][-1] != 0.0:  # not the attack this test is about: fail outright, not as expected
                pytest.fail("a node clipped its spread")
            totals[len(sites)] = _read(got[0])
    read = None
    if len(totals) == 2:  # both federations summed: the larger minus the smaller is site 4
        read = totals[5][0] - totals[4][0], totals[5][1] - totals[4][1]
    n4, s4 = _truth(files[4])
    # what must hold: the sites of the first federation refuse, or what the server reads is not site 4's
    assert read is None or not np.array_equal(read[0], n4) or not np.allclose(read[1], s4[:, C:], atol=0.1), (
        f"site 4's counts {read[0]} and class sums read to {np.abs(read[1] - s4[:, C:]).max():.2g}"
    )
