"""A ledger bound back to a roster it was bound to before: the roster's pins are gone, its claims are not.

``--init-ledger FILE --roster NEW`` on an existing ledger keeps the data-bound ``no-dp-releases`` section
(which statistic of the node's data was summed without DP, under which roster) and drops the roster's own
records -- among them the uploader-set pin that, under one roster, keeps every sum over one set of
sites.  A node refuses a statistic claimed under *another* roster; one claimed under its own is let
through, the pin being trusted to stop a second set.  When membership changes back (a site leaves, then
returns, and the operator binds every ledger back to the federation's first roster, whose files he still
has), the pin of that roster is gone while its claims remain "its own": a server sums the same statistics
again under the first roster over a set without one site, and the two totals subtract to that site's
class counts and class sums, without DP.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from lying_server import FIRST, LyingServer, deployed_nodes  # noqa: E402

from mechanisms.secagg.identity import Roster  # noqa: E402
from mechanisms.secagg.ledger import init_ledger_file  # noqa: E402
from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import sum_vector_length  # noqa: E402

K, C, D = 5, 3, 4


def _federation(folder: pathlib.Path, sites: pathlib.Path) -> dict[int, dict]:
    """The five sites under the roster in ``folder`` (written once), each site's one ledger file bound to it."""
    rng = np.random.default_rng(19)
    nodes, roster, _ = deployed_nodes(folder, K) if not folder.exists() else (None, None, None)
    if nodes is None:  # the operator's earlier roster, kept: the same files again
        roster = Roster.from_json((folder / "roster.json").read_text())
        nodes = {
            FIRST + i: {
                "secagg-identity": str(folder / f"node-{i}.json"),
                "secagg-roster": str(folder / "roster.json"),
            }
            for i in range(K)
        }
    for i in range(K):
        path = sites / f"site-{i}.npz"
        if not path.exists():
            n = 12 + i
            np.savez(path, features=rng.normal(size=(n, D)), labels=np.arange(n) % C)
        conf = nodes[FIRST + i]
        conf.pop("partition-id", None), conf.pop("num-partitions", None)
        conf["features"] = str(path)
        ledger = path.with_suffix(".ledger.json")
        assert init_ledger_file(ledger, roster.fingerprint).split()[0] in ("created", "rebound")
        conf["secagg-ledger"] = str(ledger)
    return nodes


def _total(nodes, hold_back: int | None = None):
    """fedncm's masked sum without DP; ``hold_back``: a node the server declares dropped before upload."""
    cfg = FlowerConfig(method="fedncm", clients=K, secure="mask", num_classes=C, timeout=30)
    srv = LyingServer(LocalGrid(nodes), cfg)
    srv.setup(sorted(nodes))

    def tamper(stage, u, msg):
        return None if (u == hold_back and stage == "masked") else msg

    _, total = srv.masked_sum(sorted(nodes), sum_vector_length(cfg.make_method(), C, D), tamper=tamper)
    return total, srv.refusals


def _statistics(path):
    z = np.load(path)
    F, y = z["features"], z["labels"]
    return np.concatenate(
        [np.bincount(y, minlength=C), np.stack([F[y == c].sum(0) for c in range(C)]).ravel()]
    )


def test_a_second_set_under_the_same_roster_is_refused(tmp_path):
    """Without a change of roster, the pin holds: the sum over the four other sites is refused."""
    sites = tmp_path / "sites"
    sites.mkdir()
    nodes = _federation(tmp_path / "roster-a", sites)
    first, refused = _total(nodes)
    assert first is not None and not refused, refused
    second, refused = _total(nodes, hold_back=4)
    assert second is None and refused


def test_a_ledger_is_not_bound_back_to_a_roster_it_left(tmp_path):
    """Binding a ledger back to an earlier roster would drop that roster's uploader-set pin (its records left
    with it) and count its no-DP claims as the roster's own, so the server could sum the same data under it
    again over another set of sites (site 4's statistics to 1e-10).  The step is refused; the site rejoins
    under a new roster, where its no-DP claims refuse the sum."""
    from privfed.results.ledger import LedgerError

    sites = tmp_path / "sites"
    sites.mkdir()
    first, refused = _total(_federation(tmp_path / "roster-a", sites))
    assert first is not None and not refused, refused
    _federation(tmp_path / "roster-b", sites)  # membership changed: every ledger bound to roster B
    with pytest.raises(LedgerError, match="bound to this roster before"):
        _federation(tmp_path / "roster-a", sites)  # and back to roster A: refused
    nodes = _federation(tmp_path / "roster-c", sites)  # a new roster instead
    second, refused = _total(nodes, hold_back=4)
    assert second is None and refused
