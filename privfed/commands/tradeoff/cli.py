"""``python -m privfed.tradeoff``: resolve the flags, run the sweep, write the folder, print the table.

One-shot and multi-round (``--rounds``) runs take the same path: the same
rows, the same record (:mod:`privfed.results.record`), table and figure.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from privfed.commands.common import (
    OutputDir,
    cli_entry,
    keep_finished,
    periodic_checkpoint,
    reporting_finished_run,
)
from privfed.commands.options import tradeoff_parser as build_parser
from privfed.commands.tradeoff.config import TradeoffConfig, resolve_config
from privfed.commands.tradeoff.plot import plot_title, plot_tradeoff
from privfed.commands.tradeoff.sweep import run_tradeoff
from privfed.commands.tradeoff.table import (
    TABLE_LEGEND,
    below_chance_line,
    condense_guarantees,
    data_line,
    format_table,
    record_fields,
    summarise,
)
from privfed.results.record import make_record, write_record

__all__ = ["CHECKPOINT_S", "PARTIAL", "PROG", "build_parser", "main"]

PROG = "python -m privfed.tradeoff"


def _name_parts(cfg: TradeoffConfig) -> list[str]:
    """Words for the default result folder name: methods and budget range."""
    eps = sorted(cfg.epsilons)
    rng = f"eps{eps[0]:g}" + (f"-{eps[-1]:g}" if len(eps) > 1 else "")
    return [
        "+".join(cfg.methods) if len(cfg.methods) <= 3 else f"{len(cfg.methods)}methods",
        *([f"rounds{cfg.rounds}"] if cfg.rounds > 1 else []),
        rng,
        *(["count-" + cfg.count_noise] if cfg.count_noise else []),
    ]


PARTIAL = ("results.partial.csv", "results.partial.json")
#: Seconds between checkpoints of the finished runs to results.partial.* during a sweep.
CHECKPOINT_S = 30.0


def _rounds_mode(cfg: TradeoffConfig) -> bool:
    return cfg.methods == ("fedlog",) and cfg.rounds > 1


def _run(cfg: TradeoffConfig, args, done: list, checkpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """(result of the sweep, extra config keys the record stores); one-shot or multi-round."""
    if not _rounds_mode(cfg):
        return run_tradeoff(cfg, progress=not args.quiet, records=done, on_record=checkpoint), {}
    import time

    from privfed.commands.tradeoff.rounds import rounds_settings, tradeoff_rounds
    from privfed.data import load_dataset
    from privfed.results.record import data_rules

    families = None if args.families is None else [f.strip() for f in args.families.split(",") if f.strip()]
    epochs = None if args.local_epochs is None else int(args.local_epochs)
    t0 = time.perf_counter()
    ds = load_dataset("digits", progress=not args.quiet)
    rows = tradeoff_rounds(
        cfg,
        local_epochs=epochs,
        families=families,
        init=args.init,
        progress=not args.quiet,
        records=done,
        on_record=checkpoint,
    )
    dataset = {
        "name": ds.name,
        "num_classes": ds.num_classes,
        "data_rules": data_rules(
            ds, clients=cfg.clients, partition=cfg.partition, alpha=cfg.alpha, seeds=cfg.seeds
        ),
    }
    ran = cfg
    if any(
        math.isfinite(e) for e in cfg.epsilons
    ):  # the clip the rounds ran with (2 per coordinate unless told)
        from dataclasses import replace

        from privfed.commands.tradeoff.rounds import clip_of

        ran = replace(cfg, **clip_of(cfg))
    result = {
        "config": ran,
        "records": rows,
        "warnings": [],
        "dataset": dataset,
        "timing": {"total_s": time.perf_counter() - t0},
    }
    # every setting that changes a result, so that --config results.json re-runs this run
    return result, rounds_settings(epochs, families, args.init)


def _body(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)  # refuses --rounds T > 1 with any method but fedlog alone
    command = " ".join([PROG, *argv])
    done: list[dict[str, Any]] = []
    extra_config: dict[str, Any] = {}
    if _rounds_mode(cfg):
        from privfed.commands.tradeoff.rounds import rounds_settings

        families = (
            None if args.families is None else [f.strip() for f in args.families.split(",") if f.strip()]
        )
        extra_config = rounds_settings(
            None if args.local_epochs is None else int(args.local_epochs), families, args.init
        )

    # locked last, after every import: an interrupt before the try below leaves no lock behind
    out = OutputDir(
        args.out, "tradeoff", overwrite=bool(args.overwrite), name_parts=_name_parts(cfg), command=command
    )

    def write_partial(records: list[dict[str, Any]]) -> None:
        out.write_csv(PARTIAL[0], records, record_fields(records))
        out.write_json(
            PARTIAL[1],
            make_record(
                command="tradeoff",
                command_line=command,
                config={**asdict(cfg), **extra_config},
                data={},
                records=[],
                timing={},
                complete=False,
                extra={"records": records},
            ),
        )
        out.checkpoint()  # the staging folder describes itself: a killed sweep can be recovered

    checkpoint = periodic_checkpoint(write_partial, CHECKPOINT_S)

    try:
        result, extra_config = _run(cfg, args, done, checkpoint)
        records, summary = result["records"], summarise(result["records"])
        ids, guarantee_text = condense_guarantees(summary)
        for s, g in zip(summary, ids):
            s["guarantee_id"] = g
        num_classes = result["dataset"]["num_classes"]
        out.write_csv("results.csv", records, record_fields(records))
        record = make_record(
            command="tradeoff",
            command_line=command,
            config={**asdict(result["config"]), **extra_config},
            data=result["dataset"]["data_rules"],
            records=records,
            summary=summary,
            timing=result["timing"],
            measured_on=f"{result['dataset']['data_rules']['test_samples']} held-out test samples",
            chance=1.0 / num_classes,
            warnings=result["warnings"],
            extra={"dataset": result["dataset"]},
        )
        write_record(out, record)
        if result["config"].plot:
            title = plot_title(result["config"], result["dataset"], summary)
            plot_tradeoff((out, "tradeoff"), summary, title=title, num_classes=num_classes)
        out.finish(command, complete=True, drop=PARTIAL)  # the partial files go only now
    except BaseException:
        keep_finished(out, done, write_partial, command, PROG)
        raise
    with reporting_finished_run(PROG, out.published):  # the folder is complete: a signal now says so
        print(format_table(summary, ids))
        print(TABLE_LEGEND)
        print(data_line(result["dataset"]["data_rules"]))
        below = below_chance_line(summary, num_classes)
        if below:
            print(below)
        for g in guarantee_text:
            print(g)
        rcfg = result["config"]
        if any(math.isfinite(e) for e in cfg.epsilons) and rcfg.clip is not None and rcfg.count_noise is None:
            if cfg.clip is not None:
                origin = "--clip, or the --config replayed"
            elif cfg.rounds > 1:
                origin = "multi-round FedLog's default bound (privfed.rounds; no privacy cost)"
            else:
                origin = "median feature norm of the public split (no privacy cost)"
            print(f"clip: {rcfg.clip:.4g} ({rcfg.clip_norm}; {origin})")
        for w in result["warnings"]:
            print(f"note: {w}")
        print(f"wrote {out.published}/: {', '.join(out.files())}  ({result['timing']['total_s']:.1f} s)")
        return 0


main = cli_entry(PROG, _body)
