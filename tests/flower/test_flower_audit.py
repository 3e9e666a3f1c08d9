"""The end-to-end auditor (privfed.audit.audit_release) driving the Flower client and server.

Each release runs the real ClientApp on one node per client (a feature file
each) and the server's fold over the in-process grid.  Power: at eps = 4 the
claimed mu is 0.925; halving the noise doubles the true mu to 1.85, where a
threshold test has FPR = FNR = Phi(-0.925) = 0.18, and with 150 fresh draws a
side the one-sided 97.5% Clopper-Pearson bounds (about 0.25) give
mu_lb ~ 2 Phi^-1(0.75) = 1.35 > 0.925.  Every draw is seeded, so each
audit's outcome is reproducible.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import ConfigRecord  # noqa: E402

from privfed.audit import audit_release, neighbour_battery  # noqa: E402
from privfed.flower.audit import flower_release, halved_noise_nodes  # noqa: E402
from privfed.flower.client_app import make_client_app  # noqa: E402

EPS = 4.0
DRAWS = dict(draws=150, heldout=75, meta_draws=2)
RECORD = neighbour_battery("record")
CLIENT = neighbour_battery("client")
CANARY = [RECORD[1]]  # class 1 along e2
LACKED = [RECORD[3]]  # a canary in a class its client lacked


@pytest.mark.parametrize(
    "placement, kw, pairs",
    [
        ("local", {}, CANARY),
        ("central", {"trusted_aggregator": True}, CANARY),
        ("distributed, masking", {"secure": "mask"}, CANARY),
        (
            "distributed, masking, client level",
            {"secure": "mask", "level": "client", "max_records": 20},
            [CLIENT[1]],
        ),
    ],
)
def test_flower_dp_paths_pass_the_auditor(placement, kw, pairs):
    res = audit_release(flower_release("fedncm", epsilon=EPS, clip=3.0, **kw), pairs, **DRAWS)
    assert res[0].verdict == "statistical" and not res[0].flagged, res[0]
    assert res[0].claimed_mu == pytest.approx(0.9249, abs=1e-3)


@pytest.mark.parametrize(
    "kw",
    # Masking: the same detection as local noise on the path the pass test above audits (slow: ~15 s).
    [{}, pytest.param({"secure": "mask"}, marks=pytest.mark.slow)],
    ids=["local", "masking"],
)
def test_auditor_flags_halved_noise_on_the_nodes(kw):
    # Both the nodes and the server build the broken mechanism: the ledger (and the report) records the
    # full sigma while half of it is added.
    with halved_noise_nodes():
        res = audit_release(flower_release("fedncm", epsilon=EPS, clip=3.0, **kw), CANARY, **DRAWS)
    # Local noise: each upload's spread is checked against the report's sigma; secure sums (whose blocks the
    # view does not name) by the statistical bound.
    assert res[0].flagged, res[0]
    assert res[0].verdict == "noise below the reported scale" if not kw else res[0].mu_lb > res[0].claimed_mu


def test_auditor_flags_halved_noise_on_the_nodes_at_eps_1():
    with halved_noise_nodes():
        res = audit_release(flower_release("fedncm", epsilon=1.0, clip=3.0), CANARY, draws=0)
    assert res[0].verdict == "noise below the reported scale", res[0]


def test_auditor_flags_a_reply_whose_bytes_depend_on_the_raw_data():
    # A tampered node reports the classes it holds (a string whose length varies) beside its noised
    # statistics: the bytes on the wire differ between neighbours in every draw.
    app = make_client_app()

    def leaky(msg, context):
        reply = app(msg, context)
        if msg.metadata.message_type == "query" and "meta" in reply.content:
            labels = np.load(context.node_config["features"])["labels"]
            reply.content["meta"] = ConfigRecord(
                {**dict(reply.content["meta"]), "held": ",".join(map(str, np.unique(labels)))}
            )
        return reply

    res = audit_release(
        flower_release("fedncm", epsilon=EPS, clip=3.0, app=leaky), LACKED, draws=0, meta_draws=4
    )
    assert res[0].verdict == "deterministic difference" and res[0].flagged, res[0]


@pytest.mark.parametrize("kw", [{}, {"secure": "mask"}], ids=["local", "masking"])
def test_nothing_deterministic_differs_on_any_record_neighbour(kw):
    # Every pair of the battery, a client's only record and a class's only record included: under DP a
    # node without records uploads noised zeros, so shapes, bytes, notes and errors never tell.
    res = audit_release(flower_release("fedncm", epsilon=EPS, clip=3.0, **kw), RECORD, draws=0, meta_draws=3)
    assert [r.verdict for r in res] == ["metadata only"] * len(RECORD), [r for r in res if r.flagged]
