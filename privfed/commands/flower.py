"""``python -m privfed.flower``: one privfed aggregation as a Flower app, simulated through ``flwr run``.

Examples
--------
    python -m privfed.flower --method fedcof --eps 1 --clients 20
    python -m privfed.flower --method fed3r --eps inf --secure-agg mask --clients 10 --out results/flower-fed3r
    python -m privfed.flower --method fedlog --eps inf --rounds 5 --clients 10 --rounds-params '{"local_epochs": 1}'

The defaults are every command's federation (``--clients 100``, ``--partition
dirichlet``, ``--alpha 0.1``, ``--eps 0.1``, the clip from the public split):
every simulated node holds ``partition-id`` of ``--clients`` partitions of the
embedded digits data set (``privfed.federation.partition`` with the seed of
``--seeds``: the split ``fit`` users make).  The run goes through Flower's
supported entry point, ``flwr run``, on a SuperLink in simulation mode that
this command starts on 127.0.0.1 and stops (:func:`privfed.flower.simulation.flwr_run`);
the ServerApp writes the run's folder (``--out``, by default a fresh
``results/flower-<what ran>-<time>``): ``results.json`` (the run record every
command writes, with the accuracy on the held-out test images), ``head.npz``
and ``report.json``.  A failed run exits 2 with the reason.  For SuperLink and
SuperNodes on separate machines use ``flwr run`` on ``privfed/flower/app``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privfed.commands.common import cli_entry, data_line, default_out_name
from privfed.commands.options import flower_parser as build_parser
from privfed.commands.shared import Settings
from privfed.commands.values import as_float, as_int, as_str, choose, parse_seeds
from privfed.errors import ConfigError, PrivfedError
from privfed.release.settings import refuse_unused_dp

__all__ = ["PROG", "build_parser", "default_timeout", "main", "resolve_config"]

PROG = "python -m privfed.flower"

#: Seconds a stage may take by default: a base, a share per node, doubled for the secure protocols'
#: extra message rounds (a loaded 2-core machine needed ~3x the old flat 120 s for 10 masked nodes).
TIMEOUT_BASE_S, TIMEOUT_PER_NODE_S = 120.0, 10.0
#: --secure-agg values the Flower app takes ("flwr-secaggplus" only so that the run can say why it is refused).
SECURE_KINDS = ("none", "mask", "ckks", "flwr-secaggplus-insecure", "flwr-secaggplus")

#: Keys a --config file may hold: the flags (with underscores; a saved run's dashed run-config keys too).
_FILE_KEYS = {
    "method",
    "param",
    "method_params",
    "clients",
    "partition",
    "alpha",
    "dataset",
    "num_classes",
    "eps",
    "delta",
    "clip",
    "level",
    "trusted_aggregator",
    "max_records",
    "secure_agg",
    "threshold",
    "degree",
    "dropout_tolerance",
    "frac_bits",
    "wire",
    "rounds",
    "rounds_params",
    "seeds",
    "noise_seed",
    "timeout",
    "connect_timeout",
    "min_clients",
    "plot",
}


def default_timeout(clients: int, secure: str) -> float:
    """The default --timeout: 120 s + 10 s per node, doubled under secure aggregation."""
    t = TIMEOUT_BASE_S + TIMEOUT_PER_NODE_S * max(int(clients), 1)
    return 2 * t if secure != "none" else t


def _int(v: Any, flag: str, low: int) -> int | None:
    if v is None:
        return None
    n = as_int(v, flag)
    if n < low:
        raise ConfigError(f"{flag} must be an integer >= {low}, got {n}")
    return n


def _seconds(v: Any, flag: str) -> float | None:
    if v is None:
        return None
    x = as_float(v, flag)
    if not (math.isfinite(x) and x > 0):
        raise ConfigError(f"{flag} must be a finite number > 0, got {x!r}")
    return x


def _json_object(v: Any, flag: str) -> dict:
    if isinstance(v, dict):
        return dict(v)
    try:
        obj = json.loads(as_str(v, flag))
    except json.JSONDecodeError:
        raise ConfigError(f"{flag} must be a JSON object, got {v!r}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {v!r}")
    return obj


def resolve_config(args: argparse.Namespace):
    """Flags over a ``--config`` file over the shared defaults, into a validated
    :class:`privfed.flower.FlowerConfig` (with the per-stage timeout's origin); nothing starts here."""
    from privfed.flower.checks import DP_ROUNDS_PARAMS
    from privfed.flower.config import MASKING, FlowerConfig, public_clip

    s = Settings(args, _FILE_KEYS, "flower")  # the run config's dashed keys are read as the settings file's
    method = s.method()
    legacy = s.raw("method_params")  # --method-params, or the file's method_params
    if isinstance(legacy, str) or (
        isinstance(legacy, dict) and not all(isinstance(v, dict) for v in legacy.values())
    ):
        s.base.pop("method_params", None)  # the older spelling: a JSON object of this method's parameters
    else:
        legacy = None  # absent, or the table of tables {fedcof = {gamma = 0.1}} that params() reads
    params = s.params((method,))
    file_param = s.base.get("param")  # the run config's spelling: {"gamma": 0.5} for this method
    for value, what in (
        (legacy, "method_params"),
        (file_param if isinstance(file_param, (str, dict)) else None, "param"),
    ):
        for key, v in ({} if value is None else _json_object(value, what)).items():
            params.setdefault(method, {}).setdefault(key, v)  # a --param flag overrides its own key only
    eps = s.epsilon()
    # a user's --delta without noise would be recorded as the run's δ (a server may still vary it: nodes take
    # any δ of a run without DP, and name the aggregation by it)
    refuse_unused_dp(math.isfinite(eps), {s.named("delta"): s.given("delta")})
    secure = s.secure_agg(SECURE_KINDS)
    seeds_v = args.seed_one if getattr(args, "seed_one", None) is not None else None
    if seeds_v is not None:
        if seeds_v < 0:
            raise ConfigError(f"--seed must be an integer >= 0, got {seeds_v}")
        seeds = (seeds_v,)
    else:
        raw = s.raw("seeds")
        seeds = parse_seeds(1 if raw is None else (f"{raw}" if not isinstance(raw, list) else raw), "--seeds")
    if len(seeds) != 1:
        raise ConfigError(
            f"--seeds: a Flower run is one release on one partition, so one seed (--seeds 1 is seed 0, "
            f"--seeds 7, is seed 7), got {len(seeds)}; sweep seeds with python -m privfed.tradeoff (a simulation)"
        )
    dataset = s.dataset()
    # the simulated nodes each take a partition of digits or draw synthetic rows: what only a deployment's
    # node config can give (a node's own file, its own clients) is refused here, not by every node once started
    if dataset.startswith("file:"):
        raise ConfigError(
            f"--dataset {dataset}: the simulated nodes each hold a partition of digits (or synthetic:D:N random "
            "rows); a feature file is one node's own data in a deployment (flwr run, node config "
            "features=PATH: docs/flower.md); use python -m privfed.tradeoff --dataset file:PATH to run it here"
        )
    if s.partition() == "natural" and not dataset.startswith("synthetic:"):
        raise ConfigError(
            "--partition natural needs each node's own feature file (a deployment); the simulated nodes split "
            "digits: use dirichlet, dirichlet-class, shards or iid"
        )
    clip = s.clip()
    if clip is None and math.isfinite(eps):
        clip = public_clip(dataset)  # None for other data: FlowerConfig then asks for --clip
    partition = s.partition()
    s.refuse_unused_alpha(partition)  # as the other commands: never ignored
    clients = s.clients()
    timeout = _seconds(s.raw("timeout"), "--timeout")
    kwargs: dict[str, Any] = dict(
        method=method,
        method_params=params.get(method, {}),
        clients=clients,
        epsilon=eps,
        delta=s.delta(),
        clip=clip,
        level=s.level(),
        trusted_aggregator=s.switch("trusted_aggregator"),
        max_records=_int(s.raw("max_records"), "--max-records", 1),
        dropout_tolerance=_int(s.raw("dropout_tolerance"), "--dropout-tolerance", 0) or 0,
        secure=secure,
        threshold=_int(s.raw("threshold"), "--threshold", 1),
        degree=_int(s.raw("degree"), "--degree", 1),
        frac_bits=_int(s.raw("frac_bits"), "--frac-bits", 0) if s.raw("frac_bits") is not None else 32,
        rounds=_int(s.raw("rounds"), "--rounds", 1) or 1,
        rounds_params=_json_object(s.raw("rounds_params") or "{}", "--rounds-params"),
        wire=choose(s.raw("wire") or "float64", ("float64", "compact"), "--wire"),
        dataset=dataset,
        partition=partition,
        alpha=s.alpha(),
        partition_seed=seeds[0],
        noise_seed=_int(s.raw("noise_seed"), "--noise-seed", 0),
        timeout=timeout if timeout is not None else default_timeout(clients, secure),
        min_clients=_int(s.raw("min_clients"), "--min-clients", 1),
    )
    if not math.isfinite(eps):
        # a DP record replayed under --eps inf: its settings of the release are no settings of this run (flags and a
        # user's settings file are refused by FlowerConfig); Flower's SecAgg+ keeps clip and max-records
        for key, default in (
            ("trusted_aggregator", False),
            ("level", "record"),
            ("noise_seed", None),
            ("dropout_tolerance", 0),
            *((("clip", None), ("max_records", None)) if secure != "flwr-secaggplus-insecure" else ()),
        ):
            if s.replayed(key):
                kwargs[key] = default
        if s.replayed("rounds_params"):  # multi-round FedLog's settings of its release
            kwargs["rounds_params"] = {
                k: v for k, v in kwargs["rounds_params"].items() if k not in DP_ROUNDS_PARAMS
            }
    if secure != "none" and kwargs["rounds"] == 1 and s.replayed("min_clients"):
        # a record of a one-shot secure sum, which never read its min-clients (now refused as a setting)
        kwargs["min_clients"] = None
    nc = _int(s.raw("num_classes"), "--num-classes", 2)
    if nc is not None and dataset == "digits" and nc != 10:
        raise ConfigError(f"--num-classes {nc}: the digits data set has 10 classes; leave --num-classes out")
    if nc is not None:
        kwargs["num_classes"] = nc
    ct = _seconds(s.raw("connect_timeout"), "--connect-timeout")
    if ct is not None:
        kwargs["connect_timeout"] = ct
    from mechanisms.secagg.fixed_point import check_frac_bits

    try:
        check_frac_bits(kwargs["frac_bits"])
    except ConfigError as exc:
        raise ConfigError(f"--{exc}".replace("frac_bits", "frac-bits", 1)) from None
    # given as a flag (a replayed record carries the default 32 whatever ran): never ignored
    if getattr(args, "frac_bits", None) is not None and secure not in MASKING:
        raise ConfigError(
            "--frac-bits is the fixed-point encoding of pairwise masking: use it with --secure-agg mask, or drop it"
        )
    from privfed.flower.config import check_num_cpus

    check_num_cpus(getattr(args, "num_cpus", 1), "--num-cpus")
    from privfed.release.settings import check_combination

    check_combination(  # named as flags here (the run config names the same keys without --)
        level=kwargs["level"],
        secure_agg=secure,
        trusted_aggregator=kwargs["trusted_aggregator"],
        max_records=None if secure == "flwr-secaggplus-insecure" else kwargs["max_records"],
        rounds=kwargs["rounds"],
    )
    try:
        cfg = FlowerConfig(**kwargs)
    except ConfigError as exc:  # FlowerConfig names run-config keys; the command says flags
        text = str(exc)
        if "needs clip" in text:
            text += " (the default clip is the public split's median norm on digits only)"
        raise ConfigError(text) from None
    # the nodes' split, drawn here first: --clients 900 of 899 samples is one line
    if cfg.dataset == "digits":
        from privfed.data import load_dataset  # now, not after the SuperLink and every node have started
        from privfed.federation import partition as make_partition

        labels = load_dataset("digits", progress=False).train_labels
        make_partition(labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=cfg.partition_seed)
    return cfg, ("--timeout" if timeout is not None else "default")


def _body(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.quiet and args.verbose:
        raise ConfigError(
            "--verbose contradicts --quiet: one shows every line of Flower's logs, the other none; pass one"
        )
    cfg, timeout_origin = resolve_config(args)
    from dataclasses import replace

    from privfed.results.writer import check_location, check_out_path

    eps_word = f"eps{cfg.epsilon:g}"
    out = Path(args.out) if args.out is not None else default_out_name("flower", cfg.method, eps_word)
    # refused before any node starts: not a folder, not writable, too long, no space, another run's files
    check_out_path(out, overwrite=bool(args.overwrite), flag="--out")
    check_location(out, flag="--out")
    cfg = replace(cfg, output=str(out.resolve()))

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if not args.quiet:
        say(
            f"{PROG}: {cfg.clients} simulated SuperNodes through flwr run, on a SuperLink in simulation mode at "
            f"127.0.0.1 (Flower and Ray start in about half a minute); each stage may take up to {cfg.timeout:g} s"
        )
    before = _manifest(out)  # an earlier run's, kept under --overwrite until this one is complete
    try:
        return _run_and_summarise(args, cfg, out, timeout_origin, say)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: say whether this run had finished before it
        if _manifest(out) not in (None, before):
            with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                say(f"{PROG}: stopped after the run had finished: {out}/ holds its complete results")
        raise


def _manifest(out: Path) -> bytes | None:
    """The manifest of a finished run's folder ``out`` (complete, every hash matching), or None."""
    from privfed.results.writer import MANIFEST, verify_folder

    try:
        return (out / MANIFEST).read_bytes() if verify_folder(out).get("complete") is True else None
    except (PrivfedError, OSError):
        return None


def _run_and_summarise(args, cfg, out: Path, timeout_origin: str, say) -> int:
    """Run the app through ``flwr run`` into ``out``, then print the run's summary from its files."""
    from privfed.flower.server_app import run_config_of
    from privfed.flower.simulation import flwr_run, simulated_roster

    flwr_run(
        run_config_of(cfg),
        num_supernodes=cfg.clients,
        num_cpus=int(args.num_cpus),
        roster=simulated_roster([cfg]),
        say=None if args.quiet else say,
        verbose=bool(args.verbose),
        timeout=cfg.connect_timeout + 12 * cfg.timeout + 300.0,
        expect=out,
    )
    record = json.loads((out / "results.json").read_text())
    rep = json.loads((out / "report.json").read_text())
    row = record["records"][0]
    print(f"method        {row['method']} {rep['params']}")
    if record["data"].get("train_samples") is not None:
        print(data_line(record["data"]).replace("data: ", "data          ", 1))
    else:
        print(f"data          {record['data']['partition']}")
    origin = (
        "--timeout"
        if timeout_origin == "--timeout"
        else (
            f"default: {TIMEOUT_BASE_S:g} s + {TIMEOUT_PER_NODE_S:g} s per node"
            + (", doubled under secure aggregation" if cfg.secure != "none" else "")
        )
    )
    print(f"timeout       {cfg.timeout:g} s per stage ({origin})")
    print(f"nodes         {rep['replied']} of {cfg.clients} (secure aggregation: {cfg.secure})")
    if cfg.rounds > 1:
        print(
            f"rounds        {cfg.rounds}; head norm per round "
            + ", ".join(f"{v:.4g}" for v in rep["rounds"]["head_norm"])
            + " (the bodies stay on the nodes: accuracy is measured there, see privfed.rounds)"
        )
    elif rep.get("accuracy") is not None:
        acc, chance = float(rep["accuracy"]), float(rep["chance"])
        why = ""
        if acc < chance:
            why = f"  BELOW CHANCE ({chance:.2f}): " + (
                "the DP noise swamps the statistics at this epsilon (fewer records per node than the noise "
                "needs; try a larger --eps, fewer --clients or --secure-agg so the noise is added once)"
                if math.isfinite(cfg.epsilon)
                else "the head did not learn from these uploads (check --param)"
            )
        print(f"accuracy      {acc:.4f} ({rep['test_samples']} held-out test images){why}")
    print(f"privacy       {row['guarantee']}")
    for note in (rep.get("privacy") or {}).get("notes", []):  # what qualifies it (floating-point noise)
        print(f"              {note}")
    if math.isfinite(cfg.epsilon):
        print(
            f"clip          {cfg.clip:.4g} ("
            + (
                "--clip"
                if args.clip is not None
                else "median feature norm of the public split, no privacy cost"
            )
            + ")"
        )
    wire = rep["wire"]
    if rep.get("budgets"):
        weakest = rep["budgets"]["weakest"]
        print(
            "budgets       "
            + (
                f"the weakest node ({weakest['node']}) has epsilon={weakest['remaining_epsilon']:.4g} left of its "
                f"{weakest['epsilon']:.4g} (delta {weakest['delta']:.3g})"
                if weakest
                else "no node keeps a lifetime privacy budget (node config dp-budget-*)"
            )
        )
    print(
        f"wire          {wire['bytes_up_per_node']:.0f} bytes up per node, "
        f"{wire['bytes_down_total']} bytes down in total ({wire['encoding']})"
    )
    print(f"seconds       {rep['seconds']['total']:.2f} on the server (the nodes' start-up included)")
    sa = rep.get("secure_aggregation")
    if sa:
        print(f"secure        {sa['summed_nodes']} nodes summed, dropped: {sa['dropped'] or 'none'}")
        print(f"threat model  {sa['threat_model']}")
        if sa.get("protocol_threat_model"):  # FedCOF's two rounds: the tilt of round 2, from the roster
            print(f"protocol      {sa['protocol_threat_model']}")
    for note in rep.get("notes", []):
        print(f"note          {note}")
    files = sorted(p.name for p in out.iterdir())
    print(f"wrote {out}/: {', '.join(files)}")
    return 0


main = cli_entry(PROG, _body)


if __name__ == "__main__":  # python -m privfed.commands.flower: the same command as privfed-flower
    raise SystemExit(main())
