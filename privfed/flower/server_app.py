"""The ServerApp: wait for the nodes, fold their statistics as they arrive, build the head.

:func:`serve` is the whole server side of one run on a Flower ``Grid``:

1. wait (at most ``connect-timeout`` s) until ``clients`` nodes registered;
2. plain runs: :func:`privfed.flower.server_plain.serve_plain` (every node's
   statistics folded as they arrive, the method's own ``aggregate``);
3. secure runs: :func:`privfed.flower.server_secure.serve_secure` (the
   secure sums the method runs: one for a sum-only method, FedCOF's two-round
   protocol of :mod:`privfed.methods.fedcof_protocol`); under DP the report is
   settled with the noise shares that reached the sums (:mod:`privfed.flower.dp`);
   multi-round FedLog (``rounds > 1``): the loop of :mod:`privfed.flower.fedlog`;
4. measure the head's accuracy on the held-out test set (digits: the 359
   test images of the embedded data, which no node holds) and write the run's
   folder to ``out`` when set: ``results.json`` (the run record every privfed
   command writes, :mod:`privfed.results.record`: the configuration as run, the
   data rules, the guarantee, the accuracy, the bytes, the timings, the
   versions), ``head.npz`` and ``report.json`` (the Flower details: bytes
   sent on the wire per stage and node, the secure aggregation's rounds).

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
from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from privfed.errors import PrivfedError
from privfed.flower.config import FlowerConfig
from privfed.flower.dp import SecureNoiseReport
from privfed.flower.server_plain import serve_plain
from privfed.flower.server_secure import serve_secure
from privfed.flower.transport import Exchange, wait_for_nodes
from privfed.head import LinearHead

__all__ = [
    "FlowerResult",
    "app",
    "make_server_app",
    "run_config_of",
    "run_line",
    "run_record",
    "serve",
    "write_outputs",
]


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


def serve(grid: Grid, cfg: FlowerConfig, *, keep_view: bool = False) -> FlowerResult:
    """Run one privfed aggregation over ``grid`` (see the module docstring)."""
    t0 = time.monotonic()
    traced_at_start = None
    if tracemalloc.is_tracing():  # benchmarks: the peak of this run only, and where it started from
        tracemalloc.reset_peak()
        traced_at_start = tracemalloc.get_traced_memory()[0]
    method = cfg.make_method()
    privacy = cfg.make_privacy() if cfg.rounds == 1 else None  # multi-round FedLog: its RoundsDP, below
    noise_report = None
    if privacy is not None:
        privacy.declare_randomness(seeded=cfg.noise_seed is not None)
        if cfg.secure == "none":
            privacy.check(method, None)
        else:
            noise_report = SecureNoiseReport(privacy, method, cfg.secure, num_clients=cfg.clients)
    check_output(cfg.output)
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
        from privfed.flower.rounds import serve_fedlog_rounds

        heads, rounds_dp, extra, sums = serve_fedlog_rounds(
            grid, cfg, nodes, config_rec, stages, keep_view, received
        )
        head = heads[-1]
        K = min(extra["summed"])
        head.upload_bytes = {"K": K, "rounds": len(heads), "measured": "on the wire, every round (see wire)"}
        if rounds_dp is not None:
            head.privacy = rounds_dp.report()  # composed from every round's events, as privfed.rounds does
        report["replied"] = K
        report["noise_backends"] = extra.pop("noise_backends")
        report["rounds"] = extra
    else:
        if cfg.secure == "none":
            head, K, extra, sums = serve_plain(
                grid, cfg, method, privacy, nodes, config_rec, stages, keep_view, received
            )
        else:
            head, K, extra, sums = serve_secure(
                grid, cfg, method, nodes, config_rec, stages, keep_view, received, noise_report
            )
        report.update(extra)

    if privacy is not None:
        record = getattr(privacy, "record_placement", None)
        if record is not None and privacy.report().placement == "none":
            record("local")  # the nodes noised their own uploads before replying
        head.privacy = privacy.report()
        head.feature_transform = privacy.feature_transform
    if cfg.private:  # what every node spent, in this run and in total, and what the weakest has left
        from privfed.flower.charges import ask_budgets

        report["budgets"] = ask_budgets(grid, cfg, nodes, config_rec, stages)
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
            **_accuracy(head, cfg),
        }
    )
    if tracemalloc.is_tracing():
        report["server_peak_traced_bytes"] = tracemalloc.get_traced_memory()[1]
        report["server_traced_at_start_bytes"] = traced_at_start
    result = FlowerResult(head=head, report=_jsonable(report), received=received, sums=sums, heads=heads)
    if cfg.output:
        write_outputs(result, cfg.output, cfg)
    return result


def _accuracy(head: LinearHead, cfg: FlowerConfig) -> dict[str, Any]:
    """The head's accuracy on the held-out test set and the data rules (digits; other data: none to measure)."""
    own = {"accuracy": None, "accuracy_note": "no held-out test set: each node holds its own data"}
    if cfg.dataset != "digits" or cfg.num_classes is not None:  # a node's own file needs num-classes
        return own
    from privfed.data import load_dataset
    from privfed.results.record import data_rules

    ds = load_dataset("digits", progress=False)
    if head.weight.shape != (ds.num_classes, ds.dim):  # the nodes held other data than digits' partitions
        return own
    if cfg.rounds > 1:
        from privfed.flower.checks import rounds_config

        return {
            "accuracy": None,
            "accuracy_note": "multi-round FedLog: the bodies stay on the nodes, so accuracy is measured there "
            "(privfed.rounds)",
            "data": rounds_config(cfg).data_rules(),  # digits' private split, as multi-round FedLog splits it
        }
    rules = data_rules(
        ds, clients=cfg.clients, partition=cfg.partition, alpha=cfg.alpha, seeds=[cfg.partition_seed]
    )
    return {
        "accuracy": float(head.score(ds.test_features, ds.test_labels)),
        "chance": 1.0 / ds.num_classes,
        "test_samples": int(ds.test_labels.size),
        "data": rules,
    }


def run_config_of(cfg: FlowerConfig) -> dict[str, Any]:
    """``cfg`` as run-config keys (the commands' flag names): the configuration as run."""
    from dataclasses import fields

    from privfed.flower.config import RUN_CONFIG_KEYS

    renamed = {v: k for k, v in RUN_CONFIG_KEYS.items()}
    out: dict[str, Any] = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        key = renamed.get(f.name, f.name.replace("_", "-"))
        out[key] = f"{v}," if f.name == "partition_seed" else v
    return out


def _delivered(privacy) -> dict[str, Any]:
    """What a run's release delivered, as the other commands' records give it: its epsilon and delta as the
    ledger computed them (dropouts change them from the epsilon asked), its level, mechanism and noise."""
    if privacy is None:
        from privfed.results.record import UNPROTECTED_ROW

        return dict(UNPROTECTED_ROW)
    # multi-round FedLog whose bodies trained on the private records carries no formal guarantee: no epsilon is
    # delivered, whatever its accountant computed for the releases (as privfed.rounds records it)
    eps = float(privacy.epsilon) if getattr(privacy, "formal", True) else math.inf
    bounded = math.isfinite(eps)
    raw = getattr(privacy, "sigma", None)
    # a one-shot release's sigma per block; multi-round FedLog's one sigma on its augmented sum [N_y, s_y]
    sigma = raw if isinstance(raw, dict) else {"sums": raw, "counts": raw}

    def scale(block: str) -> float:
        v = sigma.get(block)
        return float(v) if isinstance(v, (int, float)) else math.nan

    return {
        "epsilon_reported": eps,
        "delta": float(privacy.delta) if bounded else math.nan,
        "level": str(privacy.level),
        # multi-round FedLog's report names no mechanism: its rounds add Gaussian noise
        "mechanism": str(getattr(privacy, "mechanism", "gaussian")),
        "calibration": str(getattr(privacy, "calibration", "")),
        "sigma": scale("sums"),
        "sigma_counts": scale("counts"),
        "private": bool(getattr(privacy, "is_private", bounded)),
        "protects": str(getattr(privacy, "protects", "all released statistics")),
    }


def run_record(result: FlowerResult, cfg: FlowerConfig, command_line: str = "") -> dict[str, Any]:
    """The run record (:func:`privfed.results.record.make_record`) of one Flower run."""
    from privfed.results.record import make_record

    rep = result.report
    privacy = result.head.privacy
    wire = rep["wire"]
    row: dict[str, Any] = {
        "method": result.head.method,
        "epsilon": float(cfg.epsilon),
        "seed": int(cfg.partition_seed),
        "placement": "none"
        if privacy is None
        else {"local": "local", "distributed": "secure sum", "central": "trusted aggregator"}.get(
            str(getattr(privacy, "placement", "")), str(getattr(privacy, "placement", ""))
        ),
        "protocol": cfg.secure,
        "nodes": rep["nodes"],
        "replied": rep["replied"],
        "guarantee": "no protection (eps=inf)" if privacy is None else privacy.guarantee,
        "upload_bytes": float(wire["bytes_up_per_node"]),
        "bytes_down_total": int(wire["bytes_down_total"]),
    }
    row.update(_delivered(privacy))
    measured = rep.get("accuracy") is not None
    if measured:
        row["accuracy"] = rep["accuracy"]
    data = rep.get("data") or {
        "dataset": cfg.dataset,
        "train_samples": None,
        "used_samples": None,
        "unused_samples": None,
        "test_samples": 0,
        "test_split": "none: each node holds its own data",
        "partition": "each node's own data",
        "clients": cfg.clients,
        "seeds": [cfg.partition_seed],
    }
    line = command_line or "privfed Flower ServerApp, run config: " + " ".join(
        f"{k}={v}" for k, v in run_config_of(cfg).items() if v is not None
    )
    return make_record(
        command="flower",
        command_line=line,
        config=run_config_of(cfg),
        data=data,
        records=[row],
        timing={"total_s": rep["seconds"]["total"], "connect_s": rep["seconds"]["connect"]},
        measured_on=f"{rep['test_samples']} held-out test images (no node holds them)" if measured else None,
        chance=rep.get("chance"),
        wire=wire,
        # what qualifies the guarantee (floating-point noise of the numpy backend) is as visible as the guarantee
        warnings=list(rep.get("notes", [])) + list(getattr(privacy, "notes", None) or []),
    )


def check_output(directory: str | None) -> None:
    """Refuse an ``out`` that cannot take the results (a file, a folder of other files) before any node is
    asked: found only when writing, it threw away a release the nodes had spent their budget on."""
    if directory:
        from privfed.results.writer import check_out_path

        check_out_path(pathlib.Path(directory).expanduser(), overwrite=True, flag="out")


def write_outputs(result: FlowerResult, directory: str, cfg: FlowerConfig | None = None) -> None:
    """The run's folder in ``directory``: ``results.json`` (the run record), ``head.npz`` (weight, bias) and
    ``report.json`` (the Flower details), published as one unit.

    Through :class:`privfed.results.writer.ResultFolder`: the files and a manifest with their hashes appear
    together or not at all; a previous privfed output there is swapped out, other files are refused.
    """
    from privfed.results.record import write_record
    from privfed.results.writer import ResultFolder, ResultsWriteError

    out = ResultFolder(
        pathlib.Path(directory).expanduser(), overwrite=True, flag="out", command="privfed flower server"
    )

    def head_npz(p: pathlib.Path) -> None:
        with open(p, "wb") as fh:
            np.savez(fh, weight=result.head.weight, bias=result.head.bias)

    try:
        if cfg is not None:
            write_record(out, run_record(result, cfg))
        out.write("head.npz", head_npz)
        out.write("report.json", lambda p: p.write_text(json.dumps(result.report, indent=2, sort_keys=True)))
        out.publish(complete=True)
    except ResultsWriteError as exc:
        # a failed move keeps the finished run (beside --out, or its staging folder) and names it
        if exc.kept is not None:
            out.salvage()
        else:
            out.discard()
        raise
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


def run_line(res: FlowerResult, output: str | None, extra: str = "") -> str:
    """The line a ServerApp prints when a run ends: the head, the nodes, bytes, accuracy, where it is written."""
    acc = res.report.get("accuracy")
    return (
        f"privfed: {res.head.method} head {res.head.weight.shape} from {res.report['replied']} nodes; "
        f"{res.report['wire']['bytes_up_per_node']:.0f} bytes up per node"
        + (f"; test accuracy {acc:.4f}" if acc is not None else "")
        + (f"; {extra}" if extra else "")
        + (f"; written to {pathlib.Path(output).expanduser().resolve()}" if output else "")
    )


def _serve_one(grid, run_cfg: FlowerConfig, keep_view: bool, results: list | None) -> None:
    res = serve(grid, run_cfg, keep_view=keep_view)
    if results is not None:
        results.append(res)
    print(run_line(res, run_cfg.output), flush=True)


#: A ServerApp reading Flower's run config.  ``privfed/flower/app`` (``flwr run``) names the deployed one,
#: :mod:`privfed.flower.deploy.server`, which runs :func:`serve` only with nodes bound to the roster.
app = make_server_app()
