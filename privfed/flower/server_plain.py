"""The server of a plain run on Flower: ask every node for its statistics, fold them as they arrive.

:func:`serve_plain` sends every node the run config (``query``), folds each
reply into a running sum as it arrives (:class:`privfed.flower.fold.NodeFold`:
memory O(d^2) for sum-only methods whatever K; per-client methods keep one
row a node), checks that every node sent the same d and C and made the same
privacy release, adds the central noise when the aggregator is trusted, and
builds the head with the method's own ``aggregate``.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flwr.app import RecordDict

from mechanisms.dp.ledger import ReleaseEvent
from privfed.errors import ConfigError
from privfed.flower.config import FlowerConfig
from privfed.flower.dp import BACKEND_KEY, agreed_backend
from privfed.flower.fold import NodeFold, node_errors
from privfed.flower.transport import exchange
from privfed.flower.wire import payload_bytes, stats_from_record

__all__ = ["DuplicateCheck", "record_client_releases", "serve_plain", "server_rng"]


def record_client_releases(privacy, replies_events: dict[int, list[dict]]) -> None:
    """Check that every node made the same release, and record it once (as ``fit`` does)."""
    strip = [
        [{k: v for k, v in e.items() if k != "release_id"} for e in ev] for ev in replies_events.values()
    ]
    if not strip or not strip[0]:
        return
    if any(s != strip[0] for s in strip):
        raise ConfigError(
            "the nodes report different privacy releases; every node must run the same mechanism"
        )
    rid = privacy.ledger.new_release()
    for e in strip[0]:
        privacy.ledger.record(ReleaseEvent(**{**e, "release_id": rid}))


class DuplicateCheck:
    """The server's look for one partition sent by two nodes: the same ``partition-id`` in two replies, or
    byte-identical statistics from two nodes that hold records (without noise two sites' exact sums agree
    only when they hold the same data; under noise only when they drew the same noise).  Either would count
    one partition twice and, with a fixed number of nodes, leave another out."""

    def __init__(self) -> None:
        self.by_partition: dict[int, list[int]] = {}
        self.by_digest: dict[str, list[int]] = {}

    def add(self, node: int, partition_id, stats) -> None:
        import hashlib

        try:
            pid = int(partition_id)
        except (TypeError, ValueError):
            pid = -1
        if pid >= 0:
            self.by_partition.setdefault(pid, []).append(node)
        arrays = stats.arrays()
        if float(np.sum(np.abs(arrays.get("counts", np.zeros(0))))) > 0:  # a node without records: zeros
            h = hashlib.sha256()
            for name in sorted(arrays):
                h.update(name.encode())
                h.update(np.ascontiguousarray(arrays[name], dtype=np.float64).tobytes())
            self.by_digest.setdefault(h.hexdigest(), []).append(node)

    def check(self) -> None:
        for pid, nodes in sorted(self.by_partition.items()):
            if len(nodes) > 1:
                raise ConfigError(
                    f"nodes {', '.join(map(str, sorted(nodes)))} all hold partition-id={pid}: one partition would "
                    "be counted twice and another left out; give every node its own partition-id (node config "
                    "partition-id=i num-partitions=n, i = 0..n-1)"
                )
        for nodes in self.by_digest.values():
            if len(nodes) > 1:
                raise ConfigError(
                    f"nodes {', '.join(map(str, sorted(nodes)))} sent identical statistics: the same data would be "
                    "counted twice; give every node its own data (its own features=PATH or partition-id)"
                )


def server_rng(cfg: FlowerConfig) -> np.random.Generator:
    """The server's noise generator: OS entropy, or seeded from ``noise-seed`` (a reproducible simulation)."""
    if cfg.noise_seed is None:
        return np.random.default_rng(int.from_bytes(os.urandom(32), "little"))
    return np.random.default_rng([int(cfg.noise_seed), 0x5E])


def serve_plain(grid, cfg: FlowerConfig, method, privacy, nodes, config_rec, stages, keep_view, received):
    """One plain aggregation; returns (head, nodes that replied, report entries, the arrays summed).

    ``stages`` (name -> Exchange) and ``received`` (the replies when ``keep_view``) are filled in.
    """
    fold = NodeFold(method)
    seen = DuplicateCheck()
    errors: dict[int, str] = {}
    events: dict[int, list[dict]] = {}
    backends: dict[int, str] = {}
    payload: dict[str, int] = {}
    sent_pairs = [0]

    def on_stats(node, content):
        if "error" in content:
            errors[node] = str(content["error"]["message"])
            return
        meta = content["meta"]
        stats = stats_from_record(content["stats"], f"node {node}", num_classes=int(meta["C"]))
        for k, v in payload_bytes(content["stats"]).items():
            payload[k] = payload.get(k, 0) + v
        # fit's byte model counts the pairs sent: under DP every class of every row (zeros noised too).
        sent_pairs[0] += stats.num_clients * stats.num_classes if privacy is not None else stats.num_pairs()
        if keep_view:
            received.append(("query", node, {k: v.copy() for k, v in stats.arrays().items()}))
        seen.add(node, meta.get("partition-id", -1), stats)
        fold.add(f"node {node}", stats)
        events[node] = json.loads(str(meta["events"]))
        if BACKEND_KEY in meta:
            backends[node] = str(meta[BACKEND_KEY])

    contents = {n: RecordDict({"config": config_rec}) for n in nodes}
    ex = stages["query"] = exchange(grid, contents, "query", cfg.timeout, on_stats, group_id="stats")
    node_errors(errors, ex.failed, "query")
    seen.check()  # one partition counted twice (and another lost) is refused, naming the nodes
    got = len(ex.answered)
    if got < cfg.min_replies:
        raise ConfigError(
            f"only {got} of {len(nodes)} nodes sent statistics within {cfg.timeout:g} s (silent: "
            f"{ex.silent[:5]}); min-clients={cfg.min_replies}: raise timeout or lower min-clients"
        )
    stats = fold.result()
    C, d = fold.shape
    if privacy is not None:
        if (name := agreed_backend(backends)) is not None:  # the nodes drew the noise: the report says how
            privacy.set_backend(name, dim=d, num_classes=C)
        record_client_releases(privacy, events)
        if not method.per_client:
            stats = privacy.after_aggregate(stats, method, server_rng(cfg))
    head = method.aggregate(stats)
    sums = [np.array(a) for a in stats.arrays().values()]
    K = got
    M = sent_pairs[0]
    model = method.upload_bytes(M=M, K=K, d=d, C=C)
    head.upload_bytes = {"total": model, "per_client": model / K, "M": M, "K": K}
    report = {"replied": got, "noise_backends": {str(n): b for n, b in sorted(backends.items())}}
    report["payload_vs_model"] = {
        "model_bytes": int(model),
        "payload_bytes": int(sum(payload.values())),
        "payload_bytes_by_array": dict(sorted(payload.items())),
        "layout": "float64, every class"
        if cfg.wire != "compact"
        else "float32, every class (DP)"
        if cfg.private
        else "float32, held classes only",
        "note": "model: fit's 4 bytes a float over the statistics it counts; payload: the arrays' buffers "
        "sent (the reply adds Flower's framing and the metadata, see wire)",
    }
    return head, got, report, sums
