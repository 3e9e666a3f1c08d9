"""``python -m privfed.flower``: one privfed aggregation as a Flower app (simulation by default).

Examples
--------
    python -m privfed.flower --method fedcof --eps 1 --clip 10 --clients 20
    python -m privfed.flower --method fed3r --secure mask --clients 10 --output results/flower-fed3r
    python -m privfed.flower --method fedncm --eps 1 --clip 10 --secure mask --clients 10
    python -m privfed.flower --method fedlog --rounds 5 --clients 10 --rounds-params '{"local_epochs": 1}'

Every node holds ``partition-id`` of ``--clients`` partitions of the embedded
digits data set (``privfed.federation.partition`` with ``--partition``,
``--alpha``, ``--seed``: the split ``fit`` users make); the head, the privacy
report and the bytes sent on the wire are printed and, with ``--output``,
written to ``head.npz`` and ``report.json``.  For SuperLink and SuperNodes
on separate machines use ``flwr run`` (see ``privfed/flower/app``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Sequence

from privfed._cli import cli_entry
from privfed.errors import ConfigError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m privfed.flower", description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="fedncm", help="a method name (privfed.methods.available())")
    p.add_argument("--method-params", default="{}", help='JSON object, e.g. \'{"gamma": 0.1}\'')
    p.add_argument("--clients", type=int, default=10, help="number of nodes (simulated SuperNodes)")
    p.add_argument("--eps", "--epsilon", dest="epsilon", type=float, default=math.inf,
                   help="DP epsilon (default inf: no noise)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--clip", type=float, default=None, help="L2 bound of every record (required for DP)")
    p.add_argument("--level", choices=("record", "client"), default="record")
    p.add_argument("--trusted-aggregator", action="store_true", help="the server adds the noise to the sum")
    p.add_argument("--max-records", type=int, default=None,
                   help="client level: records per client bound (also flwr-secaggplus's public scaling bound)")
    p.add_argument("--secure", choices=("none", "mask", "ckks", "flwr-secaggplus"), default="none",
                   help="secure aggregation: pairwise masking, CKKS (a node holds the keys) or Flower's SecAgg+ "
                        "(sum-only methods; needs --clip and --max-records as public scaling bounds)")
    p.add_argument("--threshold", type=int, default=None, help="Shamir threshold (default: a majority)")
    p.add_argument("--dropout-tolerance", type=int, default=0,
                   help="DP with --secure: nodes that may drop while the others' noise shares carry sigma^2")
    p.add_argument("--frac-bits", type=int, default=32)
    p.add_argument("--wire", choices=("float64", "compact"), default="float64",
                   help="plain uploads: float64 dense (exact) or compact (float32, held classes only without DP)")
    p.add_argument("--rounds", type=int, default=1,
                   help="multi-round FedLog: rounds of local body training and head solving (fedlog only)")
    p.add_argument("--rounds-params", default="{}",
                   help='JSON object of privfed.fedlog_rounds.RoundsConfig settings, e.g. \'{"local_epochs": 1}\'')
    p.add_argument("--partition", default="dirichlet")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0, help="seed of the partition")
    p.add_argument("--noise-seed", type=int, default=None,
                   help="reproducible noise (a simulation, not a private release); default OS entropy")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any one stage may take")
    p.add_argument("--num-cpus", type=int, default=1, help="CPUs the simulation may use")
    p.add_argument("--output", default=None, help="directory for head.npz and report.json")
    p.add_argument("--verbose", action="store_true", help="Flower's and Ray's logs")
    return p


def _check_numbers(args: argparse.Namespace) -> None:
    """Values argparse's ``type=float`` lets through but that would silently change the run."""
    eps = args.epsilon
    if math.isnan(eps) or eps <= 0:
        raise ConfigError(f"--eps must be a number > 0 (inf for no noise), got {eps!r}; a NaN or negative budget "
                          "would run without noise")
    for flag, v in (("--delta", args.delta), ("--alpha", args.alpha), ("--timeout", args.timeout)):
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{flag} must be a finite number > 0, got {v!r}")
    if args.clip is not None and not (math.isfinite(args.clip) and args.clip > 0):
        raise ConfigError(f"--clip must be a finite number > 0, got {args.clip!r}")
    for flag, v, low in (("--num-cpus", args.num_cpus, 1), ("--max-records", args.max_records, 1),
                         ("--seed", args.seed, 0), ("--noise-seed", args.noise_seed, 0),
                         ("--dropout-tolerance", args.dropout_tolerance, 0)):
        if v is not None and v < low:
            raise ConfigError(f"{flag} must be an integer >= {low}, got {v}")
    from mechanisms.fixed_point import check_frac_bits

    try:
        check_frac_bits(args.frac_bits)
    except ConfigError as exc:
        raise ConfigError(f"--{exc}".replace("frac_bits", "frac-bits", 1)) from None


def _body(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    _check_numbers(args)
    if args.output is not None:  # refused before any node starts: not a folder, not writable, too long, no space
        from privfed.results_io import check_location, check_out_path

        check_location(check_out_path(args.output, overwrite=True, flag="--output")[0], flag="--output")
    try:
        params = json.loads(args.method_params)
    except json.JSONDecodeError:
        raise ConfigError(f"--method-params must be a JSON object, got {args.method_params!r}") from None
    try:
        rounds_params = json.loads(args.rounds_params)
    except json.JSONDecodeError:
        raise ConfigError(f"--rounds-params must be a JSON object, got {args.rounds_params!r}") from None
    from privfed.flower import FlowerConfig, run_simulation

    cfg = FlowerConfig(
        method=args.method, method_params=params, clients=args.clients, epsilon=args.epsilon,
        delta=args.delta, clip=args.clip, level=args.level, trusted_aggregator=args.trusted_aggregator,
        max_records=args.max_records, dropout_tolerance=args.dropout_tolerance, secure=args.secure,
        threshold=args.threshold, frac_bits=args.frac_bits, rounds=args.rounds, rounds_params=rounds_params,
        wire=args.wire,
        partition=args.partition, alpha=args.alpha, partition_seed=args.seed, noise_seed=args.noise_seed,
        timeout=args.timeout, output=args.output,
    )
    res = run_simulation(cfg, num_cpus=args.num_cpus, verbose=args.verbose)
    from privfed.data import load_dataset

    ds = load_dataset("digits")
    rep = res.report
    print(f"method        {res.head.method} {res.head.params}")
    print(f"nodes         {rep['replied']} of {cfg.clients} (secure aggregation: {cfg.secure})")
    if cfg.rounds > 1:
        print(f"rounds        {len(res.heads)}; head norm per round "
              + ", ".join(f"{v:.4g}" for v in rep["rounds"]["head_norm"])
              + " (the bodies stay on the nodes: accuracy is measured there, see privfed.fedlog_rounds)")
    else:
        print(f"accuracy      {res.head.score(ds.test_features, ds.test_labels):.4f} (digits test set)")
    print(f"privacy       {rep['privacy']['guarantee'] if rep['privacy'] else 'no DP noise (epsilon = inf)'}")
    print(f"wire          {rep['wire']['bytes_up_per_node']:.0f} bytes up per node, "
          f"{rep['wire']['bytes_down_total']} bytes down in total ({rep['wire']['encoding']})")
    print(f"seconds       {rep['seconds']['total']:.2f} on the server (the nodes' start-up included)")
    if res.head.secure_aggregation:
        print(f"secure        {res.head.secure_aggregation['summed_nodes']} nodes summed, dropped: "
              f"{res.head.secure_aggregation['dropped'] or 'none'}")
    for note in res.head.notes:
        print(f"note          {note}")
    return 0


main = cli_entry("python -m privfed.flower", _body)

if __name__ == "__main__":
    sys.exit(main())
