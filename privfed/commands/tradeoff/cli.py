"""``python -m privfed.tradeoff``: resolve the flags, run the sweep, write the folder, print the table."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from privfed.commands.common import OutputDir, cli_entry, keep_finished, periodic_checkpoint, versions
from privfed.commands.options import tradeoff_parser as build_parser
from privfed.commands.tradeoff.config import TradeoffConfig, resolve_config
from privfed.commands.tradeoff.plot import plot_title, plot_tradeoff
from privfed.commands.tradeoff.sweep import run_tradeoff
from privfed.commands.tradeoff.table import (
    TABLE_LEGEND,
    below_chance_line,
    data_line,
    format_table,
    guarantee_lines,
    record_fields,
    summarise,
)

__all__ = ["CHECKPOINT_S", "PARTIAL", "PROG", "build_parser", "main"]

PROG = "python -m privfed.tradeoff"


def _name_parts(cfg: TradeoffConfig) -> list[str]:
    """Words for the default result folder name: methods and budget range."""
    eps = sorted(cfg.epsilons)
    rng = f"eps{eps[0]:g}" + (f"-{eps[-1]:g}" if len(eps) > 1 else "")
    return [
        "+".join(cfg.methods) if len(cfg.methods) <= 3 else f"{len(cfg.methods)}methods",
        rng,
        *(["count-" + cfg.count_noise] if cfg.count_noise else []),
    ]


PARTIAL = ("results.partial.csv", "results.partial.json")
#: Seconds between checkpoints of the finished runs to results.partial.* during a sweep.
CHECKPOINT_S = 30.0


def _body(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)
    if cfg.methods == ("fedlog",) and cfg.rounds > 1:  # the paper's multi-round protocol
        from privfed.commands.tradeoff.rounds import tradeoff_main

        return tradeoff_main(cfg, args, argv)
    command = " ".join([PROG, *argv])
    out = OutputDir(
        args.out, "tradeoff", overwrite=args.overwrite, name_parts=_name_parts(cfg), command=command
    )
    done: list[dict[str, Any]] = []

    def write_partial(records: list[dict[str, Any]]) -> None:
        out.write_csv(PARTIAL[0], records, record_fields(records))
        out.write_json(
            PARTIAL[1],
            {
                "config": asdict(cfg),
                "versions": versions(),
                "records": records,
                "complete": False,
                "command": command,
            },
        )
        out.checkpoint()  # the staging folder describes itself: a killed sweep can be recovered

    checkpoint = periodic_checkpoint(write_partial, CHECKPOINT_S)

    try:
        result = run_tradeoff(cfg, progress=not args.quiet, records=done, on_record=checkpoint)
        records, summary = result["records"], summarise(result["records"])
        out.write_csv("results.csv", records, record_fields(records))
        out.write_json(
            "results.json",
            {
                "config": asdict(result["config"]),
                "versions": versions(),
                "warnings": result["warnings"],
                "dataset": result["dataset"],
                "timing": result["timing"],
                "records": records,
                "summary": summary,
                "command": command,
            },
        )
        if cfg.plot:
            title = plot_title(result["config"], result["dataset"], summary)
            plot_tradeoff(
                (out, "tradeoff.png"), summary, title=title, num_classes=result["dataset"]["num_classes"]
            )
        out.finish(command, complete=True, drop=PARTIAL)  # the partial files go only now
    except BaseException:
        keep_finished(out, done, write_partial, command, PROG)
        raise
    print(format_table(summary))
    print(TABLE_LEGEND)
    print(data_line(result["dataset"]["data_rules"]))
    below = below_chance_line(summary, result["dataset"]["num_classes"])
    if below:
        print(below)
    for g in guarantee_lines(summary, cfg.methods):
        print(g)
    if any(math.isfinite(e) for e in cfg.epsilons) and result["config"].clip is not None:
        origin = (
            "--clip" if cfg.clip is not None else "median feature norm of the public split (no privacy cost)"
        )
        print(f"clip: {result['config'].clip:.4g} ({result['config'].clip_norm}; {origin})")
    for w in result["warnings"]:
        print(f"note: {w}")
    print(f"wrote {out.published}/: {', '.join(out.files())}  ({result['timing']['total_s']:.1f} s)")
    return 0


main = cli_entry(PROG, _body)
