"""Flower's own SecAgg+ (``SecAggPlusWorkflow`` + ``secaggplus_mod``), for comparison only: NOT secure.

``secure = "flwr-secaggplus-insecure"`` runs a sum-only method's statistics
through Flower's SecAgg+ implementation instead of privfed's pairwise
masking, to compare the two.  It is not a secure choice against a server
that deviates: listed both alive and dropped in the unmask request, a
node's self-mask seed shares and pair-mask key shares both come back from
every other node (Flower's node code checks only the number of active
nodes), so the server recovers that node's input exactly; a node reported
lost is left masked only by numpy's MT19937 seeded with a 32-bit fold of
its seed (a 2^32 search).  The report's threat model says so.  That
protocol was built for model updates, and its limits are enforced here:

* **a weighted mean of values in [-c, c]**: every node sends weight 1
  (``max_weight = 1``, so the weight factor is exactly 1) and the server
  multiplies the mean by the number of summed nodes; every statistic is
  pre-scaled by a *public* bound so that it lies in [-c, c]
  (``c = clipping_range = 8``): counts by ``max-records`` (n_max), sums by
  n_max * clip, second moments by n_max * clip^2.  The node clips its
  records to ``clip`` (L2) and refuses when it holds more than n_max
  records, so Flower's own clipping to [-c, c] never bites.
* **2^22 quantisation levels** (stochastic rounding, one quantum 2c/2^22 in
  scaled units): each node's value moves by less than one quantum, i.e. by
  less than 2 B / 2^22 for a statistic of bound B; the sum of K nodes by
  less than ``quantisation_bound`` = 2 K B / 2^22 per entry.  The report
  gives this bound for every statistic.
* **a 2^32 modulus**: K nodes' quantised values (each up to 2^22) and
  their weight factors must not wrap around, so runs with K * 2^22 >= 2^32
  (K >= 1024 at the full range) are refused before any message.

Other properties of Flower's implementation (flwr 1.41), reported as they
are: the neighbour graph is drawn with Python's ``random`` module and the
stochastic rounding with numpy's global generator (neither is a CSPRNG; the
masks and keys are); a stage that loses nodes below the threshold halts
the workflow without a result, which this module turns into
:class:`mechanisms.secagg.masking.ProtocolAbort`.  DP noise is not offered on this
protocol (privfed's masking carries distributed noise).
"""

from __future__ import annotations

import numpy as np

from privfed.errors import InputError
from privfed.flower.checks import CLIPPING_RANGE, MODULUS_RANGE, QUANTIZATION_RANGE, check_limits

__all__ = [
    "CLIPPING_RANGE",
    "MODULUS_RANGE",
    "QUANTIZATION_RANGE",
    "FlwrSum",
    "check_limits",
    "field_bounds",
    "flwr_secaggplus_sum",
    "node_train_reply",
    "quantisation_bound",
]

#: Flower's defaults, kept: values in [-8, 8], 2^22 levels, a 2^32 modulus.


def field_bounds(method, cfg) -> dict[str, float]:
    """The public bound B of every entry of each statistic: |count| <= n, |sum| <= n b, |second| <= n b^2."""
    from privfed.flower.protocol import stat_fields

    n, b = float(cfg.max_records), float(cfg.clip)
    table = {"counts": n, "sums": n * b, "second": n * b * b, "class_second": n * b * b}
    return {f: table[f] for f in stat_fields(method)}


def quantisation_bound(method, cfg, num_summed: int) -> dict[str, float]:
    """Largest error per entry of each summed statistic: K nodes, each less than one quantum 2 B / 2^22."""
    return {f: 2.0 * num_summed * B / QUANTIZATION_RANGE for f, B in field_bounds(method, cfg).items()}


def _scale_vector(method, cfg, C: int, d: int) -> np.ndarray:
    from privfed.flower.protocol import stat_fields, stat_shape

    bounds = field_bounds(method, cfg)
    return np.concatenate(
        [np.full(int(np.prod(stat_shape(f, C, d))), CLIPPING_RANGE / bounds[f]) for f in stat_fields(method)]
    )


# ------------------------------------------------------------------------------------------ node
def node_train_reply(msg, context):
    """The node's answer to the workflow's collect stage (after ``secaggplus_mod``): its scaled vector."""
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat

    from privfed.flower.config import FlowerConfig
    from privfed.flower.node import load_node_data
    from privfed.flower.protocol import sum_vector
    from privfed.release.pipeline import client_statistics

    fitins = recorddict_compat.recorddict_to_fitins(msg.content, keep_input=True)
    cfg = FlowerConfig.from_wire(dict(fitins.config))
    check_limits(cfg)
    method = cfg.make_method()
    data = load_node_data(context.node_config, cfg)
    n = data.features.shape[0]
    if n == 0:
        raise InputError(f"this node ({data.source}) holds no sample")
    if n > cfg.max_records:
        raise InputError(
            f"this node holds {n} records, more than max-records={cfg.max_records}, the public bound "
            "its statistics are scaled by; raise max-records"
        )
    from mechanisms.dp.clipping import Clipping

    F = Clipping(float(cfg.clip), "l2")(np.asarray(data.features, dtype=np.float64))
    stats = client_statistics(
        method,
        F,
        data.labels,
        np.zeros(n, dtype=np.int64),
        num_classes=data.num_classes,
        num_clients=1,
        rng=np.random.default_rng(0),
    )
    x = sum_vector(stats, method) * _scale_vector(method, cfg, stats.num_classes, stats.dim)
    res = FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=ndarrays_to_parameters([x]),
        num_examples=1,
        metrics={"C": int(stats.num_classes), "d": int(stats.dim)},
    )
    return Message(recorddict_compat.fitres_to_recorddict(res, keep_input=False), reply_to=msg)


# ------------------------------------------------------------------------------------------ server
class _CountingGrid:
    """Wraps the grid the workflow talks to and records each stage as an Exchange (bytes up and down)."""

    _NAMES = ("setup", "share_keys", "collect_masked_vectors", "unmask")

    def __init__(self, grid) -> None:
        self.grid = grid
        self.stages: dict = {}

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        import time

        from flwr.common.serde import recorddict_to_proto

        from privfed.flower.transport import Exchange

        def record_bytes(content):  # the serialised record dict (lists of bytes included)
            return int(recorddict_to_proto(content).ByteSize())

        messages = list(messages)
        name = (
            self._NAMES[len(self.stages)]
            if len(self.stages) < len(self._NAMES)
            else f"stage{len(self.stages)}"
        )
        ex = Exchange(stage=name)
        for m in messages:
            ex.bytes_down[m.metadata.dst_node_id] = record_bytes(m.content)
        t0 = time.monotonic()
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        ex.seconds = time.monotonic() - t0
        for r in replies:
            node = r.metadata.src_node_id
            if r.has_error():
                ex.failed[node] = str(r.error.reason)
            else:
                ex.answered.append(node)
                ex.bytes_up[node] = record_bytes(r.content)
        ex.silent = sorted(set(ex.bytes_down) - set(ex.answered) - set(ex.failed))
        self.stages[name] = ex
        return replies


class FlwrSum:
    """One run of Flower's SecAgg+: the sum and what the server saw (the shape MaskedSum has)."""

    def __init__(self, total, participants, uploaded_count, stages, record) -> None:
        self.total = total
        self.participants = list(participants)
        self.stages = stages
        self.view: list = []
        self._record = record
        masked = stages.get("collect_masked_vectors")
        self.uploaded = sorted(masked.answered) if masked is not None else []
        if len(self.uploaded) != uploaded_count:  # the workflow's own count is the one in the sum
            self.uploaded = self.uploaded[:uploaded_count]
        self.dropped_before_upload = sorted(set(self.participants) - set(self.uploaded))
        unmask = stages.get("unmask")
        self.dropped_after_upload = sorted(set(self.uploaded) - set(unmask.answered if unmask else []))

    def record(self) -> dict:
        return {
            **self._record,
            "dropped_before_upload": self.dropped_before_upload,
            "dropped_after_upload": self.dropped_after_upload,
            "stages": {k: v.summary() for k, v in self.stages.items()},
        }


def flwr_secaggplus_sum(grid, cfg, nodes: list[int], *, length: int, C: int, d: int, threshold: int | None):
    """Run Flower's SecAgg+ workflow once over ``nodes``; returns a :class:`FlwrSum`."""
    import time

    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

    from mechanisms.secagg.masking import ProtocolAbort, majority_threshold

    K = len(nodes)
    method = cfg.make_method()
    wire = cfg.to_wire()
    summed: list[int] = []

    class _Sum(FedAvg):
        def aggregate_fit(self, server_round, results, failures):
            summed.append(len(results))
            return super().aggregate_fit(server_round, results, failures)

    strategy = _Sum(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=K,
        min_available_clients=K,
        on_fit_config_fn=lambda _r: dict(wire),
        fit_metrics_aggregation_fn=lambda _m: {},
    )
    manager = SimpleClientManager()
    for n in nodes:
        manager.register(GridClientProxy(n, grid, 0))
    ctx = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=1),
        strategy=strategy,
        client_manager=manager,
    )
    ctx.state.array_records[MAIN_PARAMS_RECORD] = recorddict_compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(length)]), keep_input=True
    )
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: 1})
    # Shares a node: every node (the complete graph), or itself and k neighbours with a degree k, with the
    # threshold pairwise masking takes for groups of k + 1 unless one is given.
    shares = K if cfg.degree is None else min(K, int(cfg.degree) + 1)
    if threshold is not None:
        t = int(threshold)
    else:
        t = majority_threshold(K) if cfg.degree is None else cfg.secagg_threshold
    workflow = SecAggPlusWorkflow(
        num_shares=shares,
        reconstruction_threshold=t,
        max_weight=1.0,
        clipping_range=CLIPPING_RANGE,
        quantization_range=QUANTIZATION_RANGE,
        modulus_range=MODULUS_RANGE,
        timeout=cfg.timeout,
    )
    t0 = time.monotonic()
    counting = _CountingGrid(grid)
    workflow(counting, ctx)
    if not summed:
        why = "; ".join(
            f"stage {name}: node {n}: {r.strip().splitlines()[-1] if r.strip() else r}"
            for name, ex in counting.stages.items()
            for n, r in list(ex.failed.items())[:2]
        )
        raise ProtocolAbort(
            f"Flower's SecAgg+ halted without a sum (fewer than t={t} of {K} nodes answered a "
            f"stage{': ' + why if why else ''}); no sum is released"
        )
    mean = parameters_to_ndarrays(
        recorddict_compat.arrayrecord_to_parameters(
            ctx.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
        )
    )[0]
    total = np.asarray(mean, dtype=np.float64) * summed[0] / _scale_vector(method, cfg, C, d)
    record = {
        "protocol": "Flower SecAgg+ (SecAggPlusWorkflow + secaggplus_mod, flwr legacy workflow)",
        "participants": K,
        "threshold": t,
        "num_shares": shares,
        "uploaded": summed[0],
        "clipping_range": CLIPPING_RANGE,
        "quantization_range": QUANTIZATION_RANGE,
        "modulus_range": MODULUS_RANGE,
        "prescale_bounds": field_bounds(method, cfg),
        "quantisation_bound_per_entry": quantisation_bound(method, cfg, summed[0]),
        "max_clients_without_overflow": MODULUS_RANGE // QUANTIZATION_RANGE - 1,
        "seconds": round(time.monotonic() - t0, 3),
        "randomness": "keys and masks from Flower's key agreement; the neighbour graph from Python's random and "
        "the stochastic rounding from numpy's global generator (not CSPRNGs)",
    }
    return FlwrSum(total, nodes, summed[0], counting.stages, record)
