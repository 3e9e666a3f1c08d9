"""A split of the SecAgg+ graph in the reported epsilon: the issue's run, through the Flower app.

K = 12, degree 4, t = 3, DP at epsilon 1 (delta 1e-5), every node adding sigma^2/12.  Four nodes drop before
uploading, at ring positions 3, 4 and 8, 9: the uploaders' graph falls into parts of 3 and 5 nodes, and the
server decodes each part's sum alone.  The run used to print epsilon 1.25 (8 of 12 shares reached "the sum");
the 3-node part carries 3/12 of sigma^2, epsilon 2.155 for its members.  Now the release is settled with the
least-noised part's shares and the report says the graph split.  Under the default roster (t = 4, which
tolerates a colluder) the same dropouts leave the nodes at the parts' ends short of t members of their group:
the run aborts.

The epsilons are computed here independently: the analytic Gaussian (Balle and Wang 2018) solved with
scipy for the noise multiplier of (1, 1e-5) and for the epsilon at sqrt(12/3) times it.
"""

from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from scipy.optimize import brentq  # noqa: E402
from scipy.stats import norm  # noqa: E402

from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from mechanisms.secagg.identity import make_roster  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402

K, DEGREE = 12, 4
CFG = FlowerConfig(
    threshold=3,
    method="fedncm",
    clients=K,
    epsilon=1.0,
    delta=1e-5,
    clip=10.0,
    secure="mask",
    degree=DEGREE,
    timeout=60,
)


def _delta(eps: float, mu: float) -> float:
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def _epsilon(mu: float, delta: float = 1e-5) -> float:
    return brentq(lambda e: _delta(e, mu) - delta, 0.0, 100.0, xtol=1e-13)


def _nodes(roster, ids):
    """Node i holds roster identity i and digits partition i; the nodes at ring positions 3, 4, 8, 9 fail at
    the masked stage (they drop before uploading)."""
    drop = {roster.ring[p] for p in (3, 4, 8, 9)}
    return {
        100 + i: {
            "partition-id": i,
            "num-partitions": K,
            "secagg-identity": ids[i].to_json(),
            "secagg-roster": roster.to_json(),
            "allow-ephemeral-ledger": "true",
            "allow-unbudgeted-dp": "true",  # a test deployment: DP without a lifetime budget, said explicitly
            **({"fail-at": "masked"} if i in drop else {}),
        }
        for i in range(K)
    }


def test_a_split_graph_reports_the_epsilon_of_its_least_noised_part(digits_dataset):
    roster, ids = make_roster(K, 3, 0, degree=DEGREE)  # t = 3: the operator declared no colluder
    res = serve(LocalGrid(_nodes(roster, ids)), CFG)
    sa = res.head.secure_aggregation
    mu0 = brentq(lambda mu: _delta(1.0, mu) - 1e-5, 0.01, 20.0, xtol=1e-13)  # (1, 1e-5) with all 12 shares
    want, old = _epsilon(mu0 * math.sqrt(12 / 3)), _epsilon(mu0 * math.sqrt(12 / 8))
    assert want == pytest.approx(2.155, abs=5e-4) and old == pytest.approx(1.25, abs=5e-4)
    assert sa["summed_nodes"] == 8
    assert res.head.privacy.epsilon == pytest.approx(want, rel=1e-6)  # not the 8 shares' 1.25
    assert sa["rounds"][0]["parts"] == [3, 5]
    assert sa["threat"]["parts"] == [3, 5] and sa["threat"]["epsilon"]["this_run"] == pytest.approx(
        want, rel=1e-6
    )
    assert any("split into parts of 3, 5" in n for n in res.head.privacy.notes)
    assert any("split into parts of 3, 5 nodes" in n for n in res.head.notes)


def test_under_the_default_roster_the_same_dropouts_abort(digits_dataset):
    roster, ids = make_roster(K, degree=DEGREE)  # the default: t = 4, tolerates two colluders
    assert roster.threshold == 4
    with pytest.raises(ProtocolAbort, match="below the threshold t=4"):
        serve(LocalGrid(_nodes(roster, ids)), FlowerConfig(**{**CFG.__dict__, "threshold": None}))
