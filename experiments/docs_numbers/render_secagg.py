"""Blocks read from the masking-at-scale record (experiments/bench_secagg_scale.py), and the threat model's
numbers, computed by mechanisms.secagg.threat (the active protocol at 1,000 nodes: render_active)."""

from __future__ import annotations

import math

from experiments.docs_numbers.sources import record


def secagg_threat() -> str:
    """The default threshold per roster, the colluders it tolerates and the fewest honest inputs a decodable
    sum covers (mechanisms.secagg.threat), and the epsilon of the issue's split run (K = 12, degree 4)."""
    from mechanisms.dp.calibration import gdp_epsilon, gdp_mu
    from mechanisms.secagg.graph import ring_neighbours
    from mechanisms.secagg.threat import defaults_table, masking_threat

    rows = defaults_table([2, 3, 4, 5, 10, 12, 100, 1000], [None, 2, 4, 14, 20])
    lines = [
        "Computed by `mechanisms.secagg.threat` (`python -m experiments.readme_numbers --show secagg-threat`): "
        "the default threshold t of a roster of K nodes (complete graph) or of degree k (groups of n = k + 1), "
        "the colluders it tolerates (2t − n − 1), the dropouts a group survives (n − t), and the fewest honest "
        "inputs a sum the server decodes covers, alone (t; on a SecAgg+ graph at least t) and with the tolerated "
        "colluders (n + 1 − t):",
        "",
        "| K | graph | t | colluders tolerated | dropouts per group | fewest honest inputs, server alone | "
        "with the colluders |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        graph = "complete" if r["degree"] is None else f"k = {r['degree']}"
        lines.append(
            f"| {r['K']:,} | {graph} | {r['threshold']} | {r['tolerated']} | {r['dropouts_per_group']} | "
            f"{r['alone']} | {r['colluding']} |"
        )
    ring = ring_neighbours(list(range(12)), 4)
    up = [u for u in range(12) if u not in (3, 4, 8, 9)]
    mu = gdp_mu(1.0, 1e-5)
    split = masking_threat(
        12, 3, 4, graph=ring, uploaded=up, epsilon_of=lambda m: gdp_epsilon(mu * math.sqrt(12 / m), 1e-5)
    )
    parts = ", ".join(str(p) for p in split.parts)
    lines += [
        "",
        f"A split: K = 12, degree 4, t = {split.threshold} (an operator who declared no colluder), four nodes "
        f"dropped at ring positions 3, 4, 8, 9, noise calibrated for epsilon = 1 (delta = 1e-5) with all 12 "
        f"shares: the {split.uploaded} uploaders' graph falls into parts of {parts}; the run reports epsilon = "
        f"{split.epsilon['this_run']:.3f} (the {split.smallest_part}-node part's shares), not "
        f"{gdp_epsilon(mu * math.sqrt(12 / split.uploaded), 1e-5):.3f} ({split.uploaded} of 12 shares in one sum). "
        "Under the default t = 4 the same dropouts abort the run.",
    ]
    return "\n".join(lines)


def secagg_scale() -> str:
    """The masked sum against its floor, from the scale record."""
    rec = record("bench_secagg_scale")
    d, m = rec["data"], rec["machine"]
    cfg, rows = d["config"], d["floor"]
    for r in rows:
        if r["ratio_to_floor"] > cfg["target_ratio"] or r["vector_ratio"] > cfg["target_ratio"]:
            raise RuntimeError(f"the recorded masked sum misses its target: {r}")
    lines = [
        f"`{rec['command']}` (machine-dependent: {m['cpus']} cores, load {m['load_average'][0]:.1f} when "
        f"recorded). The masked sum of {cfg['clients']} clients against the work it cannot skip, least CPU "
        f"seconds of {cfg['repeats']}:",
        "",
        "| graph | floats / client | plain sum | PRG | X25519 | masked | vs floor (plain + PRG + X25519) "
        "| growing part vs plain + PRG |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['values']:,} | {r['plain_cpu_s']:.3f} | {r['prg_cpu_s']:.2f} | "
            f"{r['x25519_cpu_s']:.2f} | {r['masked_cpu_s']:.2f} | **{r['ratio_to_floor']:.2f}×** | "
            f"{r['vector_ratio']:.2f}× |"
        )
    lines += [
        "",
        "The active protocol at 1,000 nodes over Flower messages is measured against its own floor below.",
        "",
    ]
    return "\n".join(lines)
