"""``python -m privfed.attack``: what a curious server recovers, next to the formal budget.

Runs one attack (see :func:`attacks.available`) on the server's view of a
federation of the digits data set (scikit-learn digits through the
public-trained CNN backbone; the public split is the attacker's knowledge),
over methods x epsilons (x group sizes) x seeds, on the federation every
command runs on by default (100 clients, Dirichlet alpha 0.1), and writes

* ``results.csv``: one row per method x eps (x n) x seed with every metric, the
  trust model (placement, protocol, level, delta as used, calibration) and
  the guarantee;
* ``results.json``: the run record every command writes
  (:mod:`privfed.results.record`): the resolved configuration, the data
  rules, the guarantees, the rows, the bytes, the timings, the versions;
* for ``--attack inversion``, ``grid_<method>_eps<eps>[_n<n>].png`` (and
  ``.pdf``, ``.svg``): true images, reconstructions and the public
  class-mean prior, one column each;
* ``manifest.json``: the list of files of the run.

Example::

    python -m privfed.attack --attack inversion --method fedcof --eps inf,1,0.1

``eps=inf`` is the clean release (no clipping, no noise).  A finite eps uses
:class:`mechanisms.GaussianMechanism` (record level, analytic calibration)
with the clip bound ``--clip`` (default: the median feature norm on the
public split, which costs no privacy): each client noises its upload
(placement local), or, with ``--secure-agg``, the clients add shares of the
noise and the server sees only the sum (placement secure sum).
``--partition groups`` puts exactly ``n`` samples of one class on each
client (the controlled curves, ``--n``); the other schemes use
:func:`privfed.federation.partition`.  The tracing attack reports two tests
side by side: the Gaussian likelihood ratio (``auc``) and the inner-product
tracer (``auc_inner``).

For ``--attack tracing`` and ``--attack inversion`` every row also reports
the strongest attack of the suite (:data:`attacks.strongest.SUITES`) on the
same challenge (the same targets, the same released cells):
``strongest_attack`` names it, ``strongest_auc`` / ``strongest_identification``
is its headline metric, and ``<attack>:<metric>`` gives every attack of the
suite (``--no-strongest`` turns this off).  The inversion suite reads
decoders trained on the public split: before the sweep starts the command
says how long it will take and why (:mod:`privfed.commands.attack.prepare`),
then trains the missing decoders first (once, cached; locked against a
second process; resumed after an interrupt), so that the sweep's progress
bar counts attacks only.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from privfed.commands.attack.report import grid_figure, summary_line, undefined_notes
from privfed.commands.attack.run import AttackConfig, resolve_config, run_attacks
from privfed.commands.common import (
    OutputDir,
    cli_entry,
    data_line,
    keep_finished,
    periodic_checkpoint,
    reporting_finished_run,
)
from privfed.commands.options import attack_parser as build_parser
from privfed.results.record import make_record, write_record

__all__ = ["AttackConfig", "build_parser", "grid_figure", "main", "resolve_config", "run_attacks"]

PROG = "python -m privfed.attack"


def _name_parts(cfg: AttackConfig) -> list[str]:
    eps = sorted(cfg.epsilons)
    return [
        cfg.attack,
        "+".join(cfg.methods) if len(cfg.methods) <= 3 else f"{len(cfg.methods)}methods",
        f"eps{eps[0]:g}" + (f"-{eps[-1]:g}" if len(eps) > 1 else ""),
    ]


PARTIAL = ("results.partial.csv", "results.partial.json")
#: Seconds between checkpoints of the finished runs to results.partial.* during a sweep.
CHECKPOINT_S = 30.0
#: How the sweep seeds each run (written into the record).
SEEDING = (
    "partition(..., rng=seed) as privfed.tradeoff draws it (class groups: default_rng([seed, n])); numpy "
    "SeedSequence([seed, n, crc32(method), crc32(float(eps).hex())]) spawned into view noise / attack / "
    "strongest-suite generators"
)


def _columns(records: list[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in records:
        cols += [k for k in r if k not in cols]
    return cols


def _record(cfg: AttackConfig, command: str, records, res, *, complete: bool = True) -> dict[str, Any]:
    return make_record(
        command="attack",
        command_line=command,
        config=asdict(cfg),
        data=res.get("data_rules", {}),
        records=records,
        timing=res.get("timing", {}),
        complete=complete,
        extra={"clip_used": res.get("clip"), "seeding": SEEDING},
    )


def _body(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)
    command = " ".join([PROG, *argv])
    from privfed.optional import import_held

    torch = import_held("torch")  # before the folder is locked: an interrupt here leaves nothing behind

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    out = OutputDir(
        args.out, "attack", overwrite=bool(args.overwrite), name_parts=_name_parts(cfg), command=command
    )
    done: list[dict[str, Any]] = []

    def write_partial(records):
        out.write_csv(PARTIAL[0], records, _columns(records))
        out.write_json(PARTIAL[1], _record(cfg, command, records, {}, complete=False))
        out.checkpoint()  # the staging folder describes itself: a killed sweep can be recovered

    checkpoint = periodic_checkpoint(write_partial, CHECKPOINT_S)

    try:
        res = run_attacks(cfg, progress=not args.quiet, records=done, on_record=checkpoint)
        records = res["records"]
        out.write_csv("results.csv", records, _columns(records))
        write_record(out, _record(cfg, command, records, res))
        for mname, eps, n, result, truth in res["grids"] if cfg.plot else ():
            where = (
                "secure sum"
                if cfg.secure_agg != "none" and math.isfinite(eps)
                else ("local noise" if math.isfinite(eps) else "no noise")
            )
            size = (
                f", n={n}" if cfg.partition == "groups" else f", {cfg.partition} over {cfg.clients} clients"
            )
            fig = grid_figure(result, truth, f"{mname}, eps={eps:g}{size}, {where}")
            stem = f"grid_{mname}_eps{eps:g}" + (f"_n{n}" if cfg.partition == "groups" else "")
            out.save_figures(stem, fig, dpi=120)
            import matplotlib.pyplot as plt

            plt.close(fig)
        out.finish(command, complete=True, drop=PARTIAL)
    except BaseException:
        keep_finished(out, done, write_partial, command, PROG)
        raise
    with reporting_finished_run(PROG, out.published):  # the folder is complete: a signal now says so
        print(data_line(res["data_rules"]))
        for r in records:
            print(summary_line(r))
        for note in undefined_notes(records):
            print(note)
        guarantees = list(dict.fromkeys(r["guarantee"] for r in records if math.isfinite(r["epsilon"])))
        for i, g in enumerate(guarantees, 1):
            print(f"guarantee G{i}: {g}" if len(guarantees) > 1 else f"guarantee: {g}")
        if cfg.attack == "tracing":
            print(
                "tracing: auc = the Gaussian likelihood-ratio test, auc_inner = the inner-product tracer "
                "(same targets); 0.5 = chance"
            )
        if cfg.strongest:
            print(
                f"strongest[name]: the strongest attack of the {cfg.attack} suite on the same challenge "
                "(results.csv: strongest_attack and <attack>:<metric> for every attack of the suite)"
            )
        print(f"wrote {out.published}/: {', '.join(out.files())}  ({res['timing']['total_s']:.1f} s)")
        return 0


main = cli_entry(PROG, _body)
