"""Every threshold check of the masking node, at its boundary, on the complete graph.

A node refuses to go on when a list the server sends leaves fewer than t members of its group: the
share holders at ``shares``, the survivors at ``masked``, the uploaders at ``consistency`` (active
version) or ``unmask`` (honest-but-curious version), and the consistency signatures at ``unmask``
(active version).  For several K and t each check is driven with exactly t - 1 members (the node
aborts, naming the threshold) and exactly t (it answers): an off-by-one in any direction fails here.
The server's own check (fewer than t replies at a stage abort the run) is driven the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms.secagg import fixed_point
from mechanisms.secagg.crypto import KeySource, ProtocolAbort
from mechanisms.secagg.identity import make_roster, min_threshold
from mechanisms.secagg.masking.node import MaskingNode
from mechanisms.secagg.masking.server import MaskingServer
from mechanisms.secagg.threat import default_threshold

LENGTH = 3
CASES = [(K, t) for K in (3, 5, 8) for t in sorted({min_threshold(K), K})]


class Run:
    """K real nodes and an honest server, driven stage by stage so that a test can change one request."""

    def __init__(self, K: int, t: int, active: bool) -> None:
        self.K, self.t, self.active = K, t, active
        # the lowest threshold the checks allow is the one that tolerates no colluder, declared so explicitly
        roster, ids = make_roster(K, t, colluders=0, seed=b"thresholds") if active else (None, [None] * K)
        self.server = MaskingServer(
            num_nodes=K, threshold=t, length=LENGTH, session=b"s" * 16, active=active, frac_bits=0
        )
        self.nodes = {
            u: MaskingNode(
                u, num_nodes=K, threshold=t, identity=ids[u], roster=roster, keys=KeySource(b"node %d" % u)
            )
            for u in range(K)
        }

    def answer(self, u: int, msg: dict) -> dict:
        return self.nodes[u].handle(msg, ring_input=lambda: fixed_point.encode(np.full(LENGTH, u + 1.0), 0))

    def until(self, stage: str) -> dict[int, dict]:
        """Run every stage before ``stage`` honestly; return the honest requests of ``stage``."""
        while self.server.stage != stage:
            for u, msg in self.server.requests().items():
                self.server.receive(u, self.answer(u, msg))
            self.server.close()
        return self.server.requests()


def _members(u: int, K: int, n: int) -> list[int]:
    """n nodes of the group, u among them."""
    return sorted([u] + [v for v in range(K) if v != u][: n - 1])


def _shares_request(msg: dict, keep: list[int]) -> dict:
    idx = [msg["peers"].index(v) for v in keep]
    out = {**msg, "peers": keep}
    for key in ("c_pk", "s_pk", "sig"):
        if key in msg:
            out[key] = [msg[key][i] for i in idx]
    return out


def _masked_request(msg: dict, keep: list[int]) -> dict:
    box = dict(zip(msg["from"], msg["ct"]))
    senders = [v for v in msg["from"] if v in keep]
    return {**msg, "alive": keep, "from": senders, "ct": [box[v] for v in senders]}


def _at_boundary(K: int, t: int, active: bool, stage: str, change) -> None:
    """Node 0 gets the honest request of ``stage`` changed by ``change(msg, members)``: t - 1 aborts, t answers."""
    for n, accepted in ((t - 1, False), (t, True)):
        run = Run(K, t, active)
        msg = change(run.until(stage)[0], _members(0, K, n))
        if accepted:
            assert isinstance(run.answer(0, msg), dict)
        else:
            with pytest.raises(ProtocolAbort, match=rf"below the threshold t={t}") as info:
                run.answer(0, msg)
            assert info.value.deviation == "short-list" and info.value.stage == stage
            assert run.nodes[0].state()["stage"] == "aborted"


@pytest.mark.parametrize("active", [False, True], ids=["honest-but-curious", "active"])
@pytest.mark.parametrize("K, t", CASES)
def test_share_holders_at_the_threshold(K, t, active):
    _at_boundary(K, t, active, "shares", _shares_request)


@pytest.mark.parametrize("active", [False, True], ids=["honest-but-curious", "active"])
@pytest.mark.parametrize("K, t", CASES)
def test_survivors_at_the_threshold(K, t, active):
    _at_boundary(K, t, active, "masked", _masked_request)


@pytest.mark.parametrize("K, t", CASES)
def test_uploaders_at_the_threshold(K, t):
    # the honest-but-curious node checks the uploader list when asked to unmask, the active one when
    # asked to sign it
    _at_boundary(K, t, False, "unmask", lambda msg, keep: {**msg, "uploaded": keep})
    _at_boundary(K, t, True, "consistency", lambda msg, keep: {**msg, "uploaded": keep})


@pytest.mark.parametrize("K, t", CASES)
def test_consistency_signatures_at_the_threshold(K, t):
    def fewer_signers(msg, keep):
        idx = [msg["signers"].index(v) for v in keep]
        return {**msg, "signers": keep, "sigs": [msg["sigs"][i] for i in idx]}

    for n, accepted in ((t - 1, False), (t, True)):
        run = Run(K, t, True)
        msg = fewer_signers(run.until("unmask")[0], _members(0, K, n))
        if accepted:
            reply = run.answer(0, msg)
            assert sorted(reply["about"]) == list(range(K)) and set(reply["kind"]) == {"b"}
        else:
            with pytest.raises(
                ProtocolAbort, match=rf"only {t - 1} consistency signatures, below the threshold t={t}"
            ):
                run.answer(0, msg)


@pytest.mark.parametrize("active", [False, True], ids=["honest-but-curious", "active"])
@pytest.mark.parametrize("K, t", CASES)
def test_the_server_aborts_a_stage_with_fewer_than_t_replies(K, t, active):
    stages = ["keys", "shares", "masked"] + (["consistency"] if active else []) + ["unmask"]
    for stage in stages:
        for n, accepted in ((t - 1, False), (t, True)):
            run = Run(K, t, active)
            reqs = run.until(stage)
            for u in _members(0, K, n):
                run.server.receive(u, run.answer(u, reqs[u]))
            if accepted:
                run.server.close()
                assert run.server.alive == _members(0, K, n)
            else:
                with pytest.raises(
                    ProtocolAbort, match=rf"{t - 1} node\(s\) answered, below the threshold t={t}"
                ):
                    run.server.close()


def test_a_full_run_at_exactly_t_survivors_sums_their_inputs():
    """Boundary of the whole protocol: K - t nodes drop after sharing keys, the t left are summed."""
    K = 7
    t = default_threshold(K)
    run = Run(K, t, False)
    keep = list(range(t))
    while run.server.stage != "done":
        for u, msg in run.server.requests().items():
            if run.server.stage in ("masked", "unmask") and u not in keep:
                continue  # dropped before uploading
            run.server.receive(u, run.answer(u, msg))
        run.server.close()
    assert fixed_point.decode(run.server.total, 0).tolist() == [float(sum(u + 1 for u in keep))] * LENGTH
