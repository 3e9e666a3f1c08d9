"""A lying server around the one-value masking messages (``encode_message`` / ``decode_message``,
``to_records`` / ``from_records``).

The decoder held against structured fuzzing (every malformed byte string is one TypeError); these tests keep
the two gaps found around it closed (both older than the codec):

1. A request with a ``secagg-arrays`` record that is no ArrayRecord (a ConfigRecord, a MetricRecord) or holds
   an Array ``np.load`` refuses used to raise AttributeError / ValueError on the node, which the handler did
   not catch: the ClientApp crashed and the server counted a dropout.  No masking request carries arrays,
   so the node refuses any with its one-line malformed-request refusal.
2. ``settle_share`` follows the Flower message type while the node dispatched on the message's own
   ``stage``: a consistency request sent as ``query.unmask`` was signed as a consistency request and then
   settled as an unmask request, on an uploader list no t signatures confirmed (the under-charge of
   ``test_review_budget_settle.py``).  A request whose stage differs from its message type now aborts the
   node's session.
"""

from __future__ import annotations

import io
import math
import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord  # noqa: E402
from lying_server import FIRST, LyingServer, charges, deployed_nodes, serve_tampered  # noqa: E402

from mechanisms.dp.calibration import gdp_epsilon, gdp_mu  # noqa: E402
from mechanisms.secagg.crypto import ProtocolAbort  # noqa: E402
from privfed.flower import FlowerConfig  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.protocol import sum_vector_length  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")


# ------------------------------------------------------------------ 1. secagg-arrays that are no arrays
def _config_record():
    return ConfigRecord({"x": 1})


def _metric_record():
    return MetricRecord({"x": 1})


def _bytes_np_load_refuses():
    return ArrayRecord({"x": Array(dtype="float64", shape=(3,), stype="numpy.ndarray", data=b"junk")})


def _object_array():
    buf = io.BytesIO()
    np.save(buf, np.array([1, "a"], dtype=object), allow_pickle=True)
    return ArrayRecord({"x": Array(dtype="object", shape=(2,), stype="numpy.ndarray", data=buf.getvalue())})


@pytest.mark.parametrize("stage", ["shares", "unmask"])
@pytest.mark.parametrize("arrays", [_config_record, _metric_record, _bytes_np_load_refuses, _object_array])
def test_a_secagg_arrays_record_that_holds_no_array_gets_the_one_line_refusal(digits_dataset, stage, arrays):
    """The request's message is intact; beside it the server puts a ``secagg-arrays`` record the node
    cannot read as arrays: the node's malformed-request refusal naming the stage (as for bytes that are no
    message, test_flower_server.py's last test), never a crash the server would count as a dropout."""

    def tamper(msg):
        if msg.metadata.message_type == f"query.{stage}" and msg.metadata.dst_node_id == 101:
            msg.content["secagg-arrays"] = arrays()

    with pytest.raises(
        ProtocolAbort, match=f"node 101 refused secure aggregation at stage '{stage}'.*malformed"
    ) as exc:
        serve_tampered(tamper)
    assert "Traceback" not in str(exc.value)


# ------------------------------------------------------------------ 2. a consistency request sent as unmask
DELTA = 1e-5
MU1 = gdp_mu(1.0, DELTA)


def test_a_consistency_request_sent_as_query_unmask_settles_nothing(tmp_path):
    """test_review_budget_settle.py's lie, with the victim's consistency request (uploaded: all ten, seven
    really uploaded) sent under the message type ``query.unmask``.  The victim must not settle on a list no
    t signatures confirmed: it refuses the mismatched request and keeps the fewest-shares charge, never
    one below what its release cost."""
    K10, victim, dropped = 10, 0, {7, 8, 9}
    nodes, roster, _ = deployed_nodes(tmp_path, K10, budget=(gdp_epsilon(MU1 * 10, DELTA), DELTA))
    assert (roster.threshold, roster.colluders) == (6, 1)
    cfg = FlowerConfig(
        method="fedncm", clients=K10, epsilon=1.0, delta=DELTA, clip=10.0, secure="mask", timeout=30
    )

    class StageConfusingServer(LyingServer):
        def send(self, node, message_type, content):
            if node == FIRST + victim and message_type == "query.consistency":
                message_type = "query.unmask"  # the message inside still says stage "consistency"
            return super().send(node, message_type, content)

    srv = StageConfusingServer(LocalGrid(nodes), cfg)
    meta = next(iter(srv.setup(sorted(nodes)).values()))["meta"]
    length = sum_vector_length(cfg.make_method(), int(meta["C"]), int(meta["d"]))

    def tamper(stage, u, msg):
        if stage == "masked" and u in dropped:
            return None
        if stage == "consistency" and u == victim:
            return {**msg, "uploaded": sorted(range(K10))}
        if stage == "unmask":
            if u == victim:
                return None
            held = srv.server.signers
            signers = [v for v in sorted(held) if v != victim][: roster.threshold]
            return {**msg, "signers": signers, "sigs": [held[v] for v in signers]}
        return msg

    server, total = srv.masked_sum(sorted(nodes), length, tamper=tamper)
    assert total is not None, srv.refusals  # the server decoded the sum of the seven real uploaders
    assert sorted(server.U3) == [u for u in range(K10) if u not in dropped]
    assert "came as a 'unmask' message" in srv.refusals[("consistency", FIRST + victim)]
    (charged,) = charges(nodes, FIRST + victim)
    true_mu = charged["declared_mu"] * math.sqrt(K10 / len(server.U3))
    assert not charged["settled"], charged
    assert charged["mu"] >= true_mu * (1 - 1e-12), (charged["mu"], true_mu)
