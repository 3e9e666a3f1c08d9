"""Blocks read from the masking-at-scale record (experiments/bench_secagg_scale.py)."""

from __future__ import annotations

from experiments.docs_numbers.sources import record


def secagg_scale() -> str:
    """The masked sum against its floor, and SecAgg+ at 1,000 nodes against plain, from the scale record."""
    rec = record("bench_secagg_scale")
    d, m = rec["data"], rec["machine"]
    cfg, rows, fl = d["config"], d["floor"], d["flower"]
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
    by = {r["protocol"]: r for r in fl["timed"]}
    p, s = by["plain"], by["masked"]
    peaks = {(r["protocol"], r["nodes"]): r["peak_bytes"] for r in fl["memory"]}
    ks = sorted({k for _, k in peaks})
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    lines += [
        "",
        f"SecAgg+ (degree {s['neighbours']}, t = {s['threshold']}) at {s['nodes']:,} nodes of "
        f"{s['values']:,} floats over Flower messages (every request and reply a serialised RecordDict; "
        "the nodes run `MaskingNode`, the state machine the Flower app runs, in a second process, one message at "
        "a time), against a plain run of "
        "the same statistics in the same benchmark:",
        "",
        "| run | wall s | bytes up / node | bytes down / node | server peak MiB at "
        + " / ".join(f"{k:,}" for k in ks)
        + " nodes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in (("plain", p), ("masked, SecAgg+", s)):
        key = r["protocol"]
        lines.append(
            f"| {name} | {r['wall_s']:.1f} | {r['bytes_up_per_node']:,.0f} | {r['bytes_down_per_node']:,.0f} | "
            + " / ".join(mib(peaks[key, k]) for k in ks)
            + " |"
        )
    slope, share = fl["peak_slope_bytes_per_node"], fl["slope_share_of_upload"]
    g = fl["graph"]
    lines += [
        "",
        f"Masked against plain: {fl['ratios']['wall']:.1f}× the wall time and {fl['ratios']['bytes_total']:.3f}× "
        f"the bytes. The server adds each upload to its total as it arrives: its peak grows by "
        f"{slope['masked']:,.0f} bytes a node (keys, relayed share messages, unmasking shares: O(k), whatever "
        f"the vector length), {share['masked']:.1%} of the {fl['upload_bytes']:,} bytes a node that holding "
        f"the uploads would cost (plain: flat, {slope['plain']:+,.0f} bytes a node). With {g['removed_fraction']:.0%} "
        "of the nodes colluding or dropped before upload, the chance that the others' graph splits (the "
        f"server would learn each part's sum) is at most {g['split_bound']:.1e}.",
        "",
    ]
    return "\n".join(lines)
