"""``python -m privfed.flower``: one privfed aggregation as a Flower app (simulation by default).

Examples
--------
    python -m privfed.flower --method fedcof --eps 1 --clip 10 --clients 20
    python -m privfed.flower --method fed3r --secure-agg mask --clients 10 --out results/flower-fed3r
    python -m privfed.flower --method fedncm --eps 1 --clip 10 --secure-agg mask --clients 10
    python -m privfed.flower --method fedlog --rounds 5 --clients 10 --rounds-params '{"local_epochs": 1}'

Every node holds ``partition-id`` of ``--clients`` partitions of the embedded
digits data set (``privfed.federation.partition`` with ``--partition``,
``--alpha``, ``--seed``: the split ``fit`` users make); the head, the privacy
report and the bytes sent on the wire are printed and, with ``--out``,
written to ``head.npz`` and ``report.json``.  For SuperLink and SuperNodes
on separate machines use ``flwr run`` (see ``privfed/flower/app``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

from privfed.commands.common import cli_entry
from privfed.commands.options import flower_parser
from privfed.errors import ConfigError

__all__ = ["default_timeout", "main"]

#: Seconds a stage may take by default: a base, a share per node, doubled for the secure protocols'
#: extra message rounds (a loaded 2-core machine needed ~3x the old flat 120 s for 10 masked nodes).
TIMEOUT_BASE_S, TIMEOUT_PER_NODE_S = 120.0, 10.0


def default_timeout(clients: int, secure: str) -> float:
    """The default --timeout: 120 s + 10 s per node, doubled under secure aggregation."""
    t = TIMEOUT_BASE_S + TIMEOUT_PER_NODE_S * max(int(clients), 1)
    return 2 * t if secure != "none" else t


def _epsilon(text: str) -> float:
    if "," in text:
        raise ConfigError(
            f"--eps takes one budget here (a Flower run is one release), got {text!r}; "
            "sweep budgets with python -m privfed.tradeoff --eps LIST"
        )
    try:
        eps = float(text)
    except ValueError:
        raise ConfigError(f"--eps must be a number > 0 or inf, got {text!r}") from None
    if not eps > 0:
        raise ConfigError(
            f"--eps must be a number > 0 (inf: no noise), got {text!r}; a NaN or negative budget "
            "would run without noise"
        )
    return eps


def _check_numbers(args: argparse.Namespace) -> None:
    """Values argparse's ``type=float`` lets through but that would silently change the run (--eps: :func:`_epsilon`)."""
    for flag, v in (("--delta", args.delta), ("--alpha", args.alpha), ("--timeout", args.timeout)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{flag} must be a finite number > 0, got {v!r}")
    if args.clip is not None and not (math.isfinite(args.clip) and args.clip > 0):
        raise ConfigError(f"--clip must be a finite number > 0, got {args.clip!r}")
    for flag, v, low in (
        ("--num-cpus", args.num_cpus, 1),
        ("--max-records", args.max_records, 1),
        ("--seed", args.seed, 0),
        ("--noise-seed", args.noise_seed, 0),
        ("--dropout-tolerance", args.dropout_tolerance, 0),
    ):
        if v is not None and v < low:
            raise ConfigError(f"{flag} must be an integer >= {low}, got {v}")
    from mechanisms.secagg.fixed_point import check_frac_bits

    try:
        check_frac_bits(args.frac_bits)
    except ConfigError as exc:
        raise ConfigError(f"--{exc}".replace("frac_bits", "frac-bits", 1)) from None


def _body(argv: Sequence[str] | None) -> int:
    args = flower_parser().parse_args(argv)
    epsilon = _epsilon(args.epsilon)
    _check_numbers(args)
    timeout = default_timeout(args.clients, args.secure) if args.timeout is None else args.timeout
    if (
        args.output is not None
    ):  # refused before any node starts: not a folder, not writable, too long, no space
        from privfed.results.writer import check_location, check_out_path

        check_location(check_out_path(args.output, overwrite=True, flag="--out")[0], flag="--out")
    try:
        params = json.loads(args.method_params)
    except json.JSONDecodeError:
        raise ConfigError(f"--method-params must be a JSON object, got {args.method_params!r}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"--method-params must be a JSON object, got {args.method_params!r}")
    for item in args.param:
        key, sep, value = item.partition("=")
        method, dot, name = key.rpartition(".")
        if not sep or not name or (dot and method != args.method):
            raise ConfigError(f"--param {item!r}: write {args.method}.KEY=VALUE (e.g. fedcof.gamma=0.1)")
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    try:
        rounds_params = json.loads(args.rounds_params)
    except json.JSONDecodeError:
        raise ConfigError(f"--rounds-params must be a JSON object, got {args.rounds_params!r}") from None
    from privfed.flower import FlowerConfig, run_simulation

    cfg = FlowerConfig(
        method=args.method,
        method_params=params,
        clients=args.clients,
        epsilon=epsilon,
        delta=args.delta,
        clip=args.clip,
        level=args.level,
        trusted_aggregator=args.trusted_aggregator,
        max_records=args.max_records,
        dropout_tolerance=args.dropout_tolerance,
        secure=args.secure,
        threshold=args.threshold,
        degree=args.degree,
        frac_bits=args.frac_bits,
        rounds=args.rounds,
        rounds_params=rounds_params,
        wire=args.wire,
        partition=args.partition,
        alpha=args.alpha,
        partition_seed=args.seed,
        noise_seed=args.noise_seed,
        timeout=timeout,
        output=args.output,
        min_clients=args.min_clients,
        **({} if args.connect_timeout is None else {"connect_timeout": args.connect_timeout}),
    )
    print(
        f"python -m privfed.flower: starting {cfg.clients} simulated nodes (Ray start-up takes a while); each "
        f"stage may take up to {timeout:g} s",
        file=sys.stderr,
        flush=True,
    )
    res = run_simulation(cfg, num_cpus=args.num_cpus, verbose=args.verbose)
    from privfed.data import load_dataset

    ds = load_dataset("digits")
    rep = res.report
    print(f"method        {res.head.method} {res.head.params}")
    print(
        f"data          digits: {ds.train_labels.size} private training images over {cfg.clients} nodes "
        f"({cfg.partition}, alpha {cfg.alpha:g}, seed {cfg.partition_seed}); {ds.test_labels.size} test images "
        "held out (20 % of digits, stratified, seed 0)"
    )
    origin = (
        "--timeout"
        if args.timeout is not None
        else (
            f"default: {TIMEOUT_BASE_S:g} s + {TIMEOUT_PER_NODE_S:g} s per node"
            + (", doubled under secure aggregation" if cfg.secure != "none" else "")
        )
    )
    print(f"timeout       {timeout:g} s per stage ({origin})")
    print(f"nodes         {rep['replied']} of {cfg.clients} (secure aggregation: {cfg.secure})")
    if cfg.rounds > 1:
        print(
            f"rounds        {len(res.heads)}; head norm per round "
            + ", ".join(f"{v:.4g}" for v in rep["rounds"]["head_norm"])
            + " (the bodies stay on the nodes: accuracy is measured there, see privfed.rounds)"
        )
    else:
        acc = res.head.score(ds.test_features, ds.test_labels)
        chance = 1.0 / ds.num_classes
        why = ""
        if acc < chance:
            why = f"  BELOW CHANCE ({chance:.2f}): " + (
                "the DP noise swamps the statistics at this epsilon (fewer records per node than the noise "
                "needs; try a larger --eps, fewer --clients or --secure-agg so the noise is added once)"
                if math.isfinite(epsilon)
                else "the head did not learn from these uploads (check --method-params)"
            )
        print(f"accuracy      {acc:.4f} (digits test set){why}")
    print(f"privacy       {rep['privacy']['guarantee'] if rep['privacy'] else 'no DP noise (epsilon = inf)'}")
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
        f"wire          {rep['wire']['bytes_up_per_node']:.0f} bytes up per node, "
        f"{rep['wire']['bytes_down_total']} bytes down in total ({rep['wire']['encoding']})"
    )
    print(f"seconds       {rep['seconds']['total']:.2f} on the server (the nodes' start-up included)")
    if res.head.secure_aggregation:
        print(
            f"secure        {res.head.secure_aggregation['summed_nodes']} nodes summed, dropped: "
            f"{res.head.secure_aggregation['dropped'] or 'none'}"
        )
        print(f"threat model  {res.head.secure_aggregation['threat_model']}")
    for note in res.head.notes:
        print(f"note          {note}")
    return 0


main = cli_entry("python -m privfed.flower", _body)
