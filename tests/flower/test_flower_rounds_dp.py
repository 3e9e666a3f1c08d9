"""Multi-round FedLog under DP on Flower is privfed.rounds.run_rounds: the same heads and the same guarantee.

Each placement (local noise, a trusted server's central noise, distributed noise shares under pairwise
masking) at record and client level, over the in-process grid (the real ClientApp and ServerApp): a
seeded simulation draws each node's noise from the in-process run's one seeded stream, so every round's
head equals run_rounds' and the composed report (epsilon, sigma, mu, releases, guarantee, notes) is the
one run_rounds prints.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pytest.importorskip("flwr")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from privfed.errors import ConfigError  # noqa: E402
from privfed.flower import FlowerConfig, serve  # noqa: E402
from privfed.flower.local import LocalGrid  # noqa: E402
from privfed.flower.server_app import run_record  # noqa: E402
from privfed.rounds import run_rounds  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:noise backend 'numpy'")

K, R, EPS, DELTA, CLIP, SEED = 3, 2, 4.0, 1e-5, 2.0, 5
PARAMS = {"local_epochs": 1, "families": ["mlp", "cnn-narrow"], "init": "scratch"}

CASES = {
    # name: (placement, level kwargs)
    "local-record": ("local", {}),
    "central-record": ("central", {}),
    "distributed-record": ("distributed", {}),
    "central-client": ("central", {"level": "client", "max_records": 150}),
    "distributed-client": ("distributed", {"level": "client", "max_records": 150}),
}


def _nodes():
    return {10 + i: {"partition-id": i, "num-partitions": K} for i in range(K)}


def _eta(head):
    return np.concatenate([head.bias[:, None], head.weight], axis=1)


def flower_config(placement, lvl, **kw):
    base = {
        "method": "fedlog",
        "clients": K,
        "rounds": R,
        "rounds_params": PARAMS,
        "epsilon": EPS,
        "delta": DELTA,
        "clip": CLIP,
        "noise_seed": SEED,
        "trusted_aggregator": placement == "central",
        "secure": "mask" if placement == "distributed" else "none",
        "timeout": 120,
    }
    return FlowerConfig(**{**base, **lvl, **kw})


def in_process(placement, lvl):
    return run_rounds(
        clients=K,
        rounds=R,
        baselines=(),
        epsilon=EPS,
        delta=DELTA,
        clip=CLIP,
        noise_seed=SEED,
        placement=placement,
        partition="dirichlet",  # the Flower run config's default partition
        alpha=0.5,
        **{**PARAMS, "families": tuple(PARAMS["families"])},
        **lvl,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_flower_rounds_under_dp_give_run_rounds_heads_and_guarantee(case):
    placement, lvl = CASES[case]
    cfg = flower_config(placement, lvl)
    res = serve(LocalGrid(_nodes()), cfg)
    ref = in_process(placement, lvl)
    assert len(res.heads) == R
    diffs = [float(np.abs(_eta(res.heads[r]) - ref.history[r]["eta"]).max()) for r in range(R)]
    # the same noise draws, sums and solver: equal to the last bit but for the order of floating-point sums
    assert max(diffs) <= 1e-12, diffs
    # the noise was there: the heads are not the non-private ones
    assert np.abs(_eta(res.heads[-1])).max() > 0
    got, want = res.head.privacy, ref.privacy
    assert got.epsilon == pytest.approx(want.epsilon, rel=1e-12)
    assert got.mu_total == pytest.approx(want.mu_total, rel=1e-12)
    assert (got.sigma, got.sensitivity, got.releases) == (want.sigma, want.sensitivity, want.releases)
    assert got.guarantee == want.guarantee and got.notes == want.notes
    assert got.simulation and got.guarantee.startswith("SIMULATION")
    assert res.report["privacy"]["guarantee"] == want.guarantee
    assert res.report["rounds"]["epsilon"] == pytest.approx([h["epsilon"] for h in ref.history], rel=1e-12)
    # the results file (written after every round's budget is spent) gives what the rounds delivered
    (row,) = run_record(res, cfg)["records"]
    assert (row["epsilon_reported"], row["delta"], row["sigma"]) == (got.epsilon, got.delta, got.sigma)
    assert row["level"] == got.level and row["mechanism"] == "gaussian" and row["private"] is True
    if placement == "distributed":
        assert res.head.secure_aggregation["summed_nodes"] == K
        assert sorted(k for k in res.report["wire"]["stages"] if k.startswith("round-0:")) == [
            f"round-0:{s}" for s in sorted(("keys", "shares", "masked", "consistency", "unmask"))
        ]
    # nodes without a lifetime budget say so in the report
    assert res.report["budgets"]["weakest"] is None
    assert all(v == {"budgeted": False} for v in res.report["budgets"]["nodes"].values())


def test_an_os_entropy_run_is_a_release_and_its_noise_is_fresh():
    """Without noise-seed every node draws from OS entropy: two runs differ, and the guarantee is a release."""
    cfg = flower_config("local", {}, noise_seed=None)
    a = serve(LocalGrid(_nodes()), cfg)
    b = serve(LocalGrid(_nodes()), cfg)
    assert np.abs(_eta(a.heads[0]) - _eta(b.heads[0])).max() > 1e-6
    assert not a.head.privacy.simulation and not a.head.privacy.guarantee.startswith("SIMULATION")
    assert a.head.privacy.epsilon == pytest.approx(EPS, rel=1e-9)


def test_a_split_head_in_a_masked_round_is_refused_before_the_node_uploads():
    """The server trains one node against another head than it then asks that node to sum under: the node
    compares the head in the masked stage with the one it trained against and aborts."""
    from mechanisms.secagg.crypto import ProtocolAbort
    from privfed.flower.wire import arrays_record

    class Tampering(LocalGrid):
        def push_messages(self, messages):
            for m in messages:
                if m.metadata.message_type == "query.masked" and m.metadata.dst_node_id == 10:
                    b = m.content["broadcast"]
                    m.content["broadcast"] = arrays_record({"eta": b["eta"].numpy() + 1.0})
            return super().push_messages(messages)

    with pytest.raises(ProtocolAbort, match="not the head it trained against"):
        serve(Tampering(_nodes()), flower_config("distributed", {}))


def test_rounds_dp_settings_are_refused_before_any_message():
    with pytest.raises(ConfigError, match="record_bound must be one of"):
        flower_config("local", {}, rounds_params={**PARAMS, "record_bound": "exact"})
    with pytest.raises(
        ConfigError, match=r"level client adds noise to the aggregate: pass --secure-agg mask \(the nodes"
    ):
        flower_config("local", {"level": "client", "max_records": 10})


class _Counting(LocalGrid):
    """The in-process grid, keeping the type of every message the server sends (and the records it holds)."""

    def __init__(self, nodes, tamper=None, **kw):
        super().__init__(nodes, **kw)
        self.sent: list[tuple[str, tuple[str, ...]]] = []
        self.tamper = tamper

    def push_messages(self, messages):
        for m in messages:
            if self.tamper is not None:
                self.tamper(m)
            self.sent.append((m.metadata.message_type, tuple(sorted(m.content.keys()))))
        return super().push_messages(messages)


def test_a_masked_round_carries_its_keys_request_in_the_round_message():
    """Each masked round is five round trips, not six: the round's message carries its sum's keys request
    (no query.keys is sent) and the sum starts at the shares stage with the keys the round's replies held."""
    grid = _Counting(_nodes())
    res = serve(grid, flower_config("distributed", {}))
    types = [t for t, _ in grid.sent]
    assert "query.keys" not in types
    per_stage = {t: types.count(t) for t in set(types)}
    for stage in ("query.round", "query.shares", "query.masked", "query.consistency", "query.unmask"):
        assert per_stage[stage] == R * K, (stage, per_stage)
    assert all("secagg" in keys for t, keys in grid.sent if t == "query.round")
    assert res.report["wire"]["stages"]["round-0:keys"]["answered"] == K  # the round's replies held them
    assert res.head.secure_aggregation["summed_nodes"] == K


def test_a_lowered_threshold_riding_a_round_gets_the_keys_refusal():
    """A server that lowers t in the keys request a masked round carries: the node refuses it as it refuses
    one sent alone (at stage 'keys'), the run stops before any share is sent, and nothing is summed."""
    from flwr.app import ConfigRecord

    from mechanisms.secagg.masking.messages import decode_message, encode_message
    from privfed.flower.masking_wire import MESSAGE_KEY

    def lower_t(m):
        if m.metadata.message_type == "query.round" and "secagg" in m.content:
            req = decode_message(m.content["secagg"][MESSAGE_KEY])
            req["t"] = int(req["t"]) - 1
            m.content["secagg"] = ConfigRecord({MESSAGE_KEY: encode_message(req)})

    grid = _Counting(_nodes(), tamper=lower_t)
    from mechanisms.secagg.crypto import ProtocolAbort

    with pytest.raises(
        ProtocolAbort, match=r"refused secure aggregation at stage 'keys'.*aborts at stage 'keys'.*t"
    ):
        serve(grid, flower_config("distributed", {}))
    assert not any(t in ("query.shares", "query.masked") for t, _ in grid.sent)


def test_rounds_without_a_formal_guarantee_record_no_delivered_epsilon():
    """Bodies trained on the private records (record_bound "theorem"): the report's accountant still computes an
    epsilon for the releases, but the run carries no formal guarantee, so its record delivers none (inf), as
    privfed.rounds' own records say."""
    cfg = flower_config("local", {}, rounds_params={**PARAMS, "record_bound": "theorem"})
    res = serve(LocalGrid(_nodes()), cfg)
    rep = res.head.privacy
    assert not rep.formal and math.isfinite(rep.epsilon)  # the case this is about
    (row,) = run_record(res, cfg)["records"]
    assert row["epsilon_reported"] == "inf" and row["private"] is False and row["epsilon"] == EPS
