"""The ServerApp: wait for the nodes, fold their statistics as they arrive, build the head.

:func:`serve` is the whole server side of one run on a Flower ``Grid``:

1. wait (at most ``connect-timeout`` s) until ``clients`` nodes registered;
2. plain runs: send every node the run config (``query``), fold each reply
   into a running sum as it arrives (:class:`privfed.flower.fold.NodeFold`: memory O(d^2) for
   sum-only methods whatever K; per-client methods keep one row a node),
   check every node sent the same d and C and the same privacy release,
   add the central noise when the aggregator is trusted, and build the head
   with the method's own ``aggregate``;
3. secure runs: ``query.setup`` (shapes, and under DP each node's record
   of its noise share), then the masking stages of
   :mod:`privfed.flower.secagg` (or CKKS, :mod:`privfed.flower.ckks`, or
   Flower's own SecAgg+, :mod:`privfed.flower.flwr_secagg`) once for a
   sum-only method, twice for FedCOF's two-round protocol; the server only
   ever holds masked uploads, encrypted shares, seed shares and sums; under
   DP the report is settled with the noise shares that reached the sums
   (:mod:`privfed.flower.dp`);
   multi-round FedLog (``rounds > 1``): the loop of :mod:`privfed.flower.fedlog`;
4. write ``head.npz`` and ``report.json`` (head, privacy report, bytes sent
   on the wire per stage and node) to ``output`` when set.

Every wait has a deadline; a node's error (unknown parameters, no data,
mismatched d) is raised as one :class:`privfed.errors.ConfigError` naming
the node.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
import tracemalloc
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from mechanisms.ckks import CKKSParams
from mechanisms.ledger import ReleaseEvent
from mechanisms.secagg import THREAT_MODEL_CKKS_ACTIVE, THREAT_MODEL_MASK_ACTIVE
from privfed.errors import ConfigError, PrivfedError
from privfed.flower.ckks import ckks_sum_over_messages
from privfed.flower.config import FlowerConfig
from privfed.flower.dp import SecureNoiseReport
from privfed.flower.fold import NodeFold, node_errors
from privfed.flower.protocol import (
    fedcof_broadcast,
    fedcof_head,
    fedcof_round1_length,
    split_sum_vector,
    sum_vector_length,
)
from privfed.flower.secagg import masked_sum_over_messages
from privfed.flower.transport import Exchange, exchange, wait_for_nodes
from privfed.flower.wire import arrays_record, payload_bytes, stats_from_record
from privfed.head import LinearHead

__all__ = ["FlowerResult", "app", "make_server_app", "serve"]


@dataclass
class FlowerResult:
    """The server's output: the head, the report written to disk, and (if asked) what it received."""

    head: LinearHead
    report: dict[str, Any]
    received: list = field(default_factory=list, repr=False)
    #: What the head was built from: under secure aggregation the decoded sums (one vector per
    #: secure sum); otherwise the folded statistics' arrays (after the central noise, if any).
    sums: list = field(default_factory=list, repr=False)
    #: Multi-round runs: the head of every round (the last is ``head``).
    heads: list = field(default_factory=list, repr=False)


def _jsonable(obj):
    if is_dataclass(obj):
        return _jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else str(v)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    return str(obj)


def _stage_bytes(ex: Exchange) -> dict[str, Any]:
    up = list(ex.bytes_up.values())
    return {
        "answered": len(ex.answered),
        "failed": dict(ex.failed),
        "silent": list(ex.silent),
        "seconds": round(ex.seconds, 3),
        "bytes_up_total": int(sum(up)),
        "bytes_up_per_node": float(np.mean(up)) if up else 0.0,
        "bytes_down_total": int(sum(ex.bytes_down.values())),
    }


def _record_client_releases(privacy, replies_events: dict[int, list[dict]]) -> None:
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


def _server_rng(cfg: FlowerConfig) -> np.random.Generator:
    import os

    if cfg.noise_seed is None:
        return np.random.default_rng(int.from_bytes(os.urandom(32), "little"))
    return np.random.default_rng([int(cfg.noise_seed), 0x5E])


def serve(grid: Grid, cfg: FlowerConfig, *, keep_view: bool = False) -> FlowerResult:
    """Run one privfed aggregation over ``grid`` (see the module docstring)."""
    t0 = time.monotonic()
    if tracemalloc.is_tracing():  # benchmarks: the peak of this run only
        tracemalloc.reset_peak()
    method = cfg.make_method()
    privacy = cfg.make_privacy()
    noise_report = None
    if privacy is not None:
        privacy.declare_randomness(seeded=cfg.noise_seed is not None)
        if cfg.secure == "none":
            privacy.check(method, None)
        else:
            noise_report = SecureNoiseReport(privacy, method, cfg.secure, num_clients=cfg.clients)
    nodes = wait_for_nodes(grid, cfg.clients, cfg.connect_timeout)
    t_connected = time.monotonic()
    # The nonce tells this run from an identical earlier one (a node reuses its noise share within a run only).
    config_rec = ConfigRecord({**cfg.to_wire(), "run-nonce": os.urandom(8).hex()})
    report: dict[str, Any] = {
        "method": method.name,
        "params": dict(method.params),
        "config": cfg.to_wire(),
        "nodes": len(nodes),
    }
    received: list = []
    stages: dict[str, Exchange] = {}

    heads: list = []
    if cfg.rounds > 1:
        from privfed.flower.fedlog import serve_fedlog_rounds

        heads, round_stages, rc = serve_fedlog_rounds(grid, cfg, nodes)
        for r, ex in enumerate(round_stages):
            stages[f"round-{r}"] = ex
        head = heads[-1]
        K = min(len(ex.answered) for ex in round_stages)
        head.upload_bytes = {"K": K, "rounds": len(heads), "measured": "on the wire, every round (see wire)"}
        report["replied"] = K
        report["rounds"] = {
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(rc).items()},
            "head_norm": [
                float(np.linalg.norm(np.concatenate([h.bias[:, None], h.weight], axis=1))) for h in heads
            ],
        }
        sums = []
    elif cfg.secure == "none":
        fold = NodeFold(method)
        errors: dict[int, str] = {}
        events: dict[int, list[dict]] = {}
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
            sent_pairs[0] += (
                stats.num_clients * stats.num_classes if privacy is not None else stats.num_pairs()
            )
            if keep_view:
                received.append(("query", node, {k: v.copy() for k, v in stats.arrays().items()}))
            fold.add(f"node {node}", stats)
            events[node] = json.loads(str(meta["events"]))

        contents = {n: RecordDict({"config": config_rec}) for n in nodes}
        ex = stages["query"] = exchange(grid, contents, "query", cfg.timeout, on_stats, group_id="stats")
        node_errors(errors, ex.failed, "query")
        got = len(ex.answered)
        if got < cfg.min_replies:
            raise ConfigError(
                f"only {got} of {len(nodes)} nodes sent statistics within {cfg.timeout:g} s (silent: "
                f"{ex.silent[:5]}); min-clients={cfg.min_replies}: raise timeout or lower min-clients"
            )
        stats = fold.result()
        if privacy is not None:
            _record_client_releases(privacy, events)
            if not method.per_client:
                stats = privacy.after_aggregate(stats, method, _server_rng(cfg))
        head = method.aggregate(stats)
        sums = [np.array(a) for a in stats.arrays().values()]
        C, d = fold.shape
        K = got
        M = sent_pairs[0]
        model = method.upload_bytes(M=M, K=K, d=d, C=C)
        head.upload_bytes = {"total": model, "per_client": model / K, "M": M, "K": K}
        report["replied"] = got
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
    else:
        head, K, extra = _serve_secure(
            grid, cfg, method, nodes, config_rec, stages, keep_view, received, noise_report
        )
        sums = extra.pop("sums")
        report.update(extra)
        report["replied"] = K

    if privacy is not None:
        record = getattr(privacy, "record_placement", None)
        if record is not None and privacy.report().placement == "none":
            record("local")  # the nodes noised their own uploads before replying
        head.privacy = privacy.report()
        head.feature_transform = privacy.feature_transform
    up_total = sum(sum(ex.bytes_up.values()) for ex in stages.values())
    nodes_up = {n for ex in stages.values() for n in ex.bytes_up}
    wire = {
        "stages": {k: _stage_bytes(v) for k, v in stages.items()},
        "bytes_up_total": int(up_total),
        "bytes_up_per_node": up_total / max(len(nodes_up), 1),
        "bytes_down_total": int(sum(sum(ex.bytes_down.values()) for ex in stages.values())),
        "encoding": {
            "none": "float32 arrays (compact)" if cfg.wire == "compact" else "float64 arrays",
            "mask": f"uint64 ring, frac-bits={cfg.frac_bits}",
            "ckks": "CKKS ciphertexts (TenSEAL)",
            "flwr-secaggplus-insecure": "Flower SecAgg+: 2^22 levels in [-8, 8], 2^32 ring",
        }[cfg.secure],
    }
    head.extras["flower"] = wire
    if cfg.secure != "none":
        head.upload_bytes.update(total=int(up_total), per_client=wire["bytes_up_per_node"])
    report.update(
        {
            "notes": list(head.notes),
            "upload_bytes_model": head.upload_bytes,
            "wire": wire,
            "privacy": None if head.privacy is None else _jsonable(head.privacy),
            "secure_aggregation": head.secure_aggregation,
            "seconds": {"connect": round(t_connected - t0, 3), "total": round(time.monotonic() - t0, 3)},
            "noise_randomness": "OS entropy"
            if cfg.noise_seed is None
            else f"seeded (noise-seed={cfg.noise_seed}): a reproducible simulation, not a private release",
        }
    )
    if tracemalloc.is_tracing():
        report["server_peak_traced_bytes"] = tracemalloc.get_traced_memory()[1]
    result = FlowerResult(head=head, report=_jsonable(report), received=received, sums=sums, heads=heads)
    if cfg.output:
        write_outputs(result, cfg.output)
    return result


def _serve_secure(grid, cfg, method, nodes, config_rec, stages, keep_view, received, noise_report=None):
    errors: dict[int, str] = {}
    shapes: dict[int, tuple[int, int]] = {}
    holders: dict[int, bool] = {}
    events: dict[int, list[dict]] = {}

    def on_setup(node, content):
        if "error" in content:
            errors[node] = str(content["error"]["message"])
            return
        shapes[node] = (int(content["meta"]["C"]), int(content["meta"]["d"]))
        holders[node] = bool(content["meta"].get("key-holder", False))
        events[node] = json.loads(str(content["meta"].get("events", "[]")))

    contents = {n: RecordDict({"config": config_rec}) for n in nodes}
    ex = stages["setup"] = exchange(grid, contents, "query.setup", cfg.timeout, on_setup, group_id="setup")
    node_errors(errors, ex.failed, "setup")
    if len(set(shapes.values())) > 1:
        raise ConfigError(
            "the nodes disagree on the shape of their statistics (C, d): "
            + ", ".join(f"node {n}: {s}" for n, s in sorted(shapes.items())[:5])
            + "; every node must use the same backbone (d) and num-classes (C)"
        )
    participants = sorted(shapes)
    if len(participants) < 2:
        raise ConfigError(f"secure aggregation needs at least 2 nodes with data, got {len(participants)}")
    C, d = next(iter(shapes.values()))
    if noise_report is not None:
        noise_report.record(events)

    def run(round_name, length, payload, among=None):
        among = participants if among is None else among
        if cfg.secure == "flwr-secaggplus-insecure":
            from privfed.flower.flwr_secagg import flwr_secaggplus_sum

            res = flwr_secaggplus_sum(grid, cfg, among, length=length, C=C, d=d, threshold=cfg.threshold)
        elif cfg.secure == "ckks":
            holder = next((n for n in among if holders.get(n)), among[0])
            res = ckks_sum_over_messages(
                grid,
                among,
                key_holder=holder,
                length=length,
                params=CKKSParams(),
                timeout=cfg.timeout,
                payload=payload,
                round_name=round_name,
                keep_view=keep_view,
                num_nodes=cfg.clients,
            )
        else:
            res = masked_sum_over_messages(
                grid,
                among,
                length=length,
                frac_bits=cfg.frac_bits,
                threshold=cfg.threshold,
                timeout=cfg.timeout,
                masked_payload=payload,
                round_name=round_name,
                keep_view=keep_view,
                num_nodes=cfg.clients,
            )
        for k, v in res.stages.items():
            stages[f"{round_name}:{k}"] = v
        received.extend(res.view)
        return res

    def payload(round_name, broadcast=None):
        def f(node):
            out = {"config": config_rec, "round": ConfigRecord({"round": round_name})}
            if broadcast is not None:
                out["broadcast"] = arrays_record(broadcast)
            return out

        return f

    if not method.per_client:
        res = run("sums", sum_vector_length(method, C, d), payload("sums"))
        total = split_sum_vector(res.total, method, C, d)
        head = method.aggregate(total)
        runs = [res]
        variant = "sums"
    elif method.secure_protocol == "fedcof-two-round":
        r1 = run("fedcof-1", fedcof_round1_length(method, C, d), payload("fedcof-1"))
        b = fedcof_broadcast(r1.total, method, C, d)
        # Round 2 runs among the nodes whose round-1 inputs were summed: N_c, mu_c, K_c describe them.
        r2 = run(
            "fedcof-2",
            d * d,
            payload("fedcof-2", {"N": b["N"], "mu": b["mu"], "Kc": b["Kc"]}),
            among=sorted(r1.uploaded),
        )
        if set(r2.uploaded) != set(r1.uploaded):
            raise ConfigError(
                "FedCOF's second secure round lost node(s) "
                f"{sorted(set(r1.uploaded) - set(r2.uploaded))} before they uploaded; the spread would "
                "cover fewer nodes than the means, so no head is released; rerun"
            )
        head = fedcof_head(method, b, r2.total.reshape(d, d))
        runs = [r1, r2]
        variant = "two-round protocol (App. I.2)"
    else:  # pragma: no cover - every per-client method has a secure protocol or is refused by it
        method.secure_aggregate(None, None)
    K = len(runs[-1].uploaded)
    if (
        cfg.secure == "flwr-secaggplus-insecure"
    ):  # the nodes clipped their records to the public bound: test rows too
        from mechanisms.clipping import Clipping

        head.feature_transform = Clipping(float(cfg.clip), "l2")
    if noise_report is not None:
        noise_report.settle([len(r.uploaded) for r in runs])
    head.upload_bytes = {"K": K, "measured": "on the wire, every stage (see wire)"}
    head.secure_aggregation = {
        "protocol": cfg.secure,
        "secure_variant": variant,
        "rounds": [r.record() for r in runs],
        "summed_nodes": K,
        "dropped": sorted({n for r in runs for n in r.dropped_before_upload}),
        "threat_model": {"mask": THREAT_MODEL_MASK_ACTIVE, "ckks": THREAT_MODEL_CKKS_ACTIVE}.get(
            cfg.secure, _THREAT_FLWR
        ),
    }
    if any(r.dropped_before_upload for r in runs):
        head.notes.append(
            f"secure aggregation: {len(head.secure_aggregation['dropped'])} node(s) dropped before uploading; "
            f"the head is built from the {K} nodes whose inputs were summed"
        )
    return head, K, {"C": C, "d": d, "participants": len(participants), "sums": [r.total for r in runs]}


_THREAT_FLWR = (
    "NOT SECURE AGAINST A DEVIATING SERVER (for comparison with Flower's implementation only). A server that "
    "lists a node as both alive and dropped in the unmask request gets both its self-mask seed shares and its "
    "pair-mask key shares from every node (Flower's node checks only how many nodes are active) and recovers "
    "that node's input exactly, with no search, while the released sum still looks right; a server that "
    "reports a node's upload lost gets its pair-mask keys, and the self-mask left is numpy MT19937 seeded by a "
    "32-bit fold of the seed (a 2^32 search). Against an honest-but-curious server: it sees public keys, "
    "encrypted shares, masked quantised uploads over Z_2^32 and the shares that unmask the sum over uploaders; "
    "t or more colluding nodes can unmask a node; no key authentication. The neighbour graph (complete here) "
    "and the stochastic rounding come from non-cryptographic generators (Python's random, numpy's global "
    "generator). Use --secure mask."
)


def write_outputs(result: FlowerResult, directory: str) -> None:
    """``head.npz`` (weight, bias) and ``report.json`` in ``directory``, published as one unit.

    Through :class:`privfed.results_io.ResultFolder`: both files and a manifest with their hashes appear
    together or not at all; a previous privfed output there is swapped out, other files are refused.
    """
    from privfed.results_io import ResultFolder

    out = ResultFolder(
        pathlib.Path(directory).expanduser(), overwrite=True, flag="output", command="privfed flower server"
    )

    def head_npz(p: pathlib.Path) -> None:
        with open(p, "wb") as fh:
            np.savez(fh, weight=result.head.weight, bias=result.head.bias)

    try:
        out.write("head.npz", head_npz)
        out.write("report.json", lambda p: p.write_text(json.dumps(result.report, indent=2, sort_keys=True)))
        out.publish(complete=True)
    except BaseException:
        out.discard()
        raise


def make_server_app(
    cfg: FlowerConfig | list[FlowerConfig] | None = None,
    *,
    keep_view: bool = False,
    results: list | None = None,
) -> ServerApp:
    """A ServerApp running :func:`serve`; ``cfg=None`` reads Flower's run config.

    A list of configs runs one aggregation after the other on the same
    nodes (one start-up for several runs).  ``results`` (a list) receives
    each :class:`FlowerResult`, or the :class:`~privfed.errors.PrivfedError`
    a run raised (in-process runs; the next config still runs).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if cfg is None:
            _serve_one(grid, FlowerConfig.from_run_config(dict(context.run_config)), keep_view, results)
            return
        for one in cfg if isinstance(cfg, list) else [cfg]:
            if results is None or not isinstance(cfg, list):
                _serve_one(grid, one, keep_view, results)
                continue
            try:
                _serve_one(grid, one, keep_view, results)
            except PrivfedError as exc:
                results.append(exc)

    return app


def _serve_one(grid, run_cfg: FlowerConfig, keep_view: bool, results: list | None) -> None:
    res = serve(grid, run_cfg, keep_view=keep_view)
    if results is not None:
        results.append(res)
    print(
        f"privfed: {res.head.method} head {res.head.weight.shape} from {res.report['replied']} nodes; "
        f"{res.report['wire']['bytes_up_per_node']:.0f} bytes up per node"
        + (f"; written to {run_cfg.output}" if run_cfg.output else ""),
        flush=True,
    )


#: The ServerApp ``flwr run`` loads (``privfed.flower.server_app:app``); config from the run config.
app = make_server_app()
