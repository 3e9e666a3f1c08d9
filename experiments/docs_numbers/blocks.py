"""The registry of generated blocks (name -> renderer), and checking or writing a page against it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from experiments.docs_numbers.machinery import compare, find_blocks, keep_volatile
from experiments.docs_numbers.render_active import active_scale, flower_masked_scale
from experiments.docs_numbers.render_attacks import (
    inversion,
    rounds_inversion,
    second_moments,
    singleton_exposure,
    tracing_tables,
)
from experiments.docs_numbers.render_core import (
    audit_figures,
    calibration,
    command_1,
    dropouts,
    methods_table,
    orderings,
    protections,
    sampling,
    snippet,
)
from experiments.docs_numbers.render_fedlog import (
    fedlog_attacks,
    fedlog_composition,
    fedlog_dp,
    fedlog_training,
)
from experiments.docs_numbers.render_records import (
    audit_sweep_table,
    bench_scale_tables,
    bench_tradeoff_table,
    flower_audit,
    flower_bytes,
    flower_cost,
    noise_aware,
    readings,
    scale_readings,
    secagg_active_table,
    secagg_table,
    vision_device,
)
from experiments.docs_numbers.render_secagg import fedcof_tilt, secagg_scale, secagg_threat


@dataclasses.dataclass(frozen=True)
class Block:
    make: Callable[[], str]
    fast: bool
    what: str
    #: Regexes of machine-dependent spans, masked in the check and kept from the README when writing.
    volatile: tuple[str, ...] = ()


BLOCKS: dict[str, Block] = {
    "methods-table": Block(methods_table, True, "methods table (experiments/methods_table.py's numbers)"),
    "orderings": Block(orderings, True, "the orderings under the methods table (and their claims, checked)"),
    "command-1": Block(
        command_1,
        True,
        "the first command's printed output",
        volatile=(r"results/tradeoff-[^/\s]*/", r"\(\d+(?:\.\d+)? s\)"),
    ),
    "snippet": Block(snippet, True, "the code snippet, run, with the score its comment quotes"),
    "protections": Block(protections, True, "the methods x protections table (from the method registry)"),
    "calibration": Block(
        calibration, True, "the calibration bullet (analytic and classic sigma, the classic sigma's real eps)"
    ),
    "dropouts": Block(
        dropouts, True, "the report bullet's dropout example (eps from the noise shares present)"
    ),
    "tradeoff-readings": Block(
        readings, True, "the trade-off readings (from experiments/results/recipes.json)"
    ),
    "noise-aware": Block(
        noise_aware, True, "the noise-aware bullet (from experiments/results/noise_aware.json)"
    ),
    "secagg-cost": Block(
        secagg_table, True, "the secure-aggregation cost table (experiments/results/bench_secagg.json)"
    ),
    "secagg-active": Block(
        secagg_active_table,
        True,
        "the consistency round's cost (experiments/results/bench_secagg_active.json)",
    ),
    "secagg-threat": Block(
        secagg_threat, True, "the threat model's numbers per roster and a split run's epsilon (computed)"
    ),
    "fedcof-tilt": Block(
        fedcof_tilt, True, "how far a FedCOF server can tilt the round-2 weights under the default roster"
    ),
    "secagg-scale": Block(
        secagg_scale, True, "masking at scale (experiments/results/bench_secagg_scale.json)"
    ),
    "active-scale": Block(
        active_scale,
        True,
        "the active protocol at 1,000 nodes against its floor (experiments/results/bench_active_scale.json)",
    ),
    "flower-masked-scale": Block(
        flower_masked_scale,
        True,
        "masking on Flower's runtime at 1,000 nodes beside Flower's SecAgg+ "
        "(experiments/results/bench_flower_masked.json)",
    ),
    "bench-tradeoff": Block(
        bench_tradeoff_table, True, "the sweep's speed table (experiments/results/bench_tradeoff.json)"
    ),
    "flower-bytes": Block(
        flower_bytes, True, "bytes per protocol on Flower (experiments/results/bench_flower.json)"
    ),
    "flower-audit": Block(
        flower_audit, True, "audits of the Flower DP paths (experiments/results/bench_flower.json)"
    ),
    "flower-cost": Block(
        flower_cost, True, "start-up, scale and memory on Flower (experiments/results/bench_flower.json)"
    ),
    "audit-sweep": Block(
        audit_sweep_table, True, "the audit sweep's table (experiments/audit_sweep_results.json)"
    ),
    "vision-device": Block(
        vision_device,
        True,
        "feature extraction on a GPU against the CPU (experiments/results/bench_vision_device.json)",
    ),
    "sampling": Block(sampling, True, "the client-sampling bullet (one sampled release through privfed.fit)"),
    "bench-scale": Block(
        bench_scale_tables, True, "the scale benchmark's tables (experiments/bench_scale.json)"
    ),
    "scale-readings": Block(
        scale_readings, True, "the readings under the scale tables (experiments/bench_scale.json)"
    ),
    "fedlog-training": Block(
        fedlog_training, True, "FedLog over rounds: training (experiments/results/fedlog_rounds.json)"
    ),
    "fedlog-composition": Block(
        fedlog_composition, True, "the paper's per-round eps composed exactly (computed)"
    ),
    "fedlog-dp": Block(
        fedlog_dp, True, "FedLog over rounds under DP (experiments/results/fedlog_rounds.json)"
    ),
    "fedlog-attacks": Block(
        fedlog_attacks, True, "FedLog attacks across rounds (experiments/results/fedlog_rounds.json)"
    ),
    "inversion": Block(inversion, True, "the inversion table and readings (docs/attacks-inversion.json)"),
    "rounds-inversion": Block(
        rounds_inversion,
        True,
        "inversion against the multi-round FedLog release (docs/attacks-rounds-inversion.json)",
    ),
    "singleton": Block(
        singleton_exposure, True, "the singleton bullet (experiments/results/attacks_singleton.json)"
    ),
    "tracing": Block(
        tracing_tables, True, "the membership tables (experiments/results/attacks_tracing.json)"
    ),
    "second-moments": Block(
        second_moments, True, "the second-moment bullet (experiments/results/attacks_second_moment.json)"
    ),
    "audit": Block(
        audit_figures,
        True,
        "the DP audit figures (the suite's audits, rerun)",
        volatile=(r"about \d+(?:\.\d+)? s\.",),
    ),
}


def regenerate(names=None, fast_only: bool = False) -> dict[str, str]:
    chosen = [n for n in BLOCKS if (names is None or n in names) and (BLOCKS[n].fast or not fast_only)]
    return {n: BLOCKS[n].make() for n in chosen}


def check(readme: str, fresh: dict[str, str]) -> list[str]:
    found = find_blocks(readme)
    problems = []
    for name, text in fresh.items():
        if name not in found:
            problems.append(f"{name}: no '<!-- readme-numbers:{name} -->' block in the README")
            continue
        f = found[name]
        problems += compare(name, f.text, text, f.tol, BLOCKS[name].volatile)
    return problems


def write(readme: str, fresh: dict[str, str]) -> str:
    found = find_blocks(readme)
    for name in sorted(fresh, key=lambda n: -found[n].start if n in found else 0):
        if name not in found:
            raise SystemExit(f"README has no '<!-- readme-numbers:{name} -->' block; add the markers first")
        f = found[name]
        text = keep_volatile(f.text, fresh[name], BLOCKS[name].volatile)
        readme = readme[: f.start] + text + readme[f.end :]
    return readme
