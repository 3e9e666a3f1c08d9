"""Blocks read from the records of the active masking protocol at 1,000 nodes: over Flower messages against its
cryptographic floor (experiments/bench_active_scale.py), and on Flower's simulation runtime beside Flower's own
SecAgg+ (experiments/bench_flower_masked.py)."""

from __future__ import annotations

from experiments.docs_numbers.sources import record


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def active_scale() -> str:
    """The active protocol over Flower messages at 1,000 nodes against its floor, two independent runs."""
    rec = record("bench_active_scale")
    d, m = rec["data"], rec["machine"]
    cfg, runs = d["config"], d["runs"]
    k, K, D = cfg["degree"], cfg["nodes"], cfg["values"]
    target = cfg["target_ratio"]
    met = all(run["ratio"]["median"] <= target for run in runs)
    last = runs[-1]["repeats"][-1]
    per = runs[-1]["per_node"]
    lines = [
        f"`{rec['command']}` ({m['cpus']} cores; the load average beside each repeat). The active protocol on "
        f"the roster's SecAgg+ graph (degree {k}, t = {runs[-1]['threshold']}) at {K:,} nodes of {D:,} floats "
        "over Flower messages: every request and reply a serialised RecordDict, the nodes answering through the "
        "ClientApp's handler (`node_step`: each its own Context, its state machine kept between its messages) "
        "in one process, the server (`MaskingServer`) in another, each stage's requests serialised, then "
        "pushed (as the app's transport pushes a stage's messages) and every reply folded as it arrives. "
        "CPU seconds of both processes; the floor is the plain "
        "run of the same statistics plus the protocol's signatures, verifies, X25519 agreements and key loads "
        "and mask keystream, each counted at the state machines' call sites in two untimed masked runs of the "
        "same configuration (before and after the timed repeats; they agree, and no timed run pays for the "
        "counting) and timed alone with `cryptography` in the same repeat"
        + (
            f"; both processes keep glibc's heap from shrinking below {cfg['heap']['trim_bytes'] >> 20} MiB free "
            "(`mallopt`): each upload's buffers are freed once it is folded, and with glibc's defaults whether "
            "that returns the heap's top to the system, so that the next upload faults its pages back in, "
            "depends on where the heap's other objects lie, which differs between the plain and the masked run"
            if cfg.get("heap", {}).get("steady")
            else ""
        )
        + ":",
        "",
        "| run | repeat | load | plain s | masked s | floor s | masked / floor | protocol work s | masked / protocol work |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, run in enumerate(runs):
        for r in run["repeats"]:
            lines.append(
                f"| {i + 1} | {r['repeat'] + 1} | {r['load_average']:.1f} | {r['plain_cpu_s']:.2f} | "
                f"{r['masked_cpu_s']:.2f} | {r['floor_cpu_s']:.2f} | {r['ratio']:.2f}× | "
                f"{r['protocol_work_cpu_s']:.2f} | {r['ratio_to_protocol_work']:.2f}× |"
            )
    medians = " and ".join(f"{run['ratio']['median']:.2f}×" for run in runs)
    spreads = " and ".join(f"{run['ratio']['min']:.2f}–{run['ratio']['max']:.2f}×" for run in runs)
    terms = {op: v / K * 1e3 for op, v in last["floor_terms_s"].items()}
    work = {op: v / K * 1e3 for op, v in last["protocol_work_terms_s"].items()}
    to_work = " and ".join(f"{run['ratio_to_protocol_work']['median']:.2f}×" for run in runs)
    slope = d["peak_slope_bytes_per_node"]["masked"]
    mem = {(p["protocol"], p["nodes"], p["values"]): p["peak_bytes"] for p in d["memory"]}
    ns = sorted({p["nodes"] for p in d["memory"]})
    ds = sorted(slope, key=int)
    lines += [
        "",
        f"Masked against its floor: median {medians} in the two runs (repeats {spreads}; the runs agree within "
        f"{d['agreement']:.1%}): the {target:g}× target is "
        + (
            "met in both runs"
            if met
            else "**not met**: the rest is Python and Flower's record handling beside "
            "the cryptography, five round trips where the plain run has one"
        )
        + f"; {runs[-1]['ratio_to_plain']['median']:.1f}× the plain run. Per node the "
        f"masked run made {per['sign']:.0f} signatures, {per['verify']:.0f} verifies (2k: its {k} neighbours' key "
        "advertisements, then one signature for every other uploader of its group; the checks the argument does "
        "not need are left out, see [secure aggregation](secure-aggregation.md)), "
        f"{per['x25519']:.0f} X25519 agreements, {per['x25519_load']:.0f} key "
        f"loads and {per['prg']:.0f} masks of {D:,} values (the server's one per uploader included), the floor's "
        f"terms per node {terms['verify']:.2f} ms of verifies, {terms['x25519']:.2f} ms of agreements, "
        f"{terms['prg_values']:.2f} ms of keystream, {terms['sign'] + terms['x25519_load']:.2f} ms of signatures "
        f"and key loads. Bytes per node: {last['bytes_up_per_node']['masked']:,.0f} up and "
        f"{last['bytes_down_per_node']['masked']:,.0f} down masked, {last['bytes_up_per_node']['plain']:,.0f} and "
        f"{last['bytes_down_per_node']['plain']:,.0f} plain (serialised).",
        "",
        "The protocol work is the floor plus the rest of the cryptography and ring arithmetic the protocol does, "
        "Shamir sharing and share encryption included (the masked-sum benchmark's last column leaves those two "
        "to the implementation), counted at the same call sites and timed alone the same way; the server's "
        "folding of each upload is the plain run's too. Per node "
        f"{per['aead']:.0f} share messages sealed and opened with AES-GCM ({work['aead']:.2f} ms), "
        f"{per['kdf']:.0f} HKDF derivations ({work['kdf']:.2f} ms), its Shamir sharing "
        f"({work['shamir_split']:.2f} ms) and the server's recovery of its self-mask seed "
        f"({work['shamir_recover']:.2f} ms), {per['ring_values']:,.0f} mask values added into vectors "
        f"({work['ring_values']:.2f} ms) and {per['encode_values']:,.0f} values encoded into the ring "
        f"({work['encode_values']:.2f} ms). Masked against it: median {to_work}; what is left above it is "
        "Python and the message handling, the protocol's state machines, checks and records.",
        "",
        "The server adds every upload to its total as it arrives: its traced peak of a masked run was "
        + "; ".join(
            f"{' / '.join(_mib(mem['masked', n, int(v)]) for n in ns)} MiB at {int(v):,} values" for v in ds
        )
        + f" ({' / '.join(f'{n:,}' for n in ns)} nodes), "
        + " and ".join(f"{slope[v]:,.0f} bytes per added node at {int(v):,} values" for v in ds)
        + ": what it keeps per node (keys, relayed share messages, signatures, unmasking shares, and a "
        "stage's serialised requests until its last reply) is O(k) and "
        "the same at either length, against the "
        f"{8 * D:,} bytes holding one upload would cost. With {d['graph']['removed_fraction']:.0%} of the nodes "
        "colluding or dropped before upload, the chance that the others' graph splits (the server would learn "
        f"each part's sum) is at most {d['graph']['split_bound']:.1e}.",
        "",
    ]
    return "\n".join(lines)


def flower_masked_scale() -> str:
    """Masking on Flower's simulation runtime at 1,000 nodes against plain, its floor and Flower's SecAgg+."""
    from privfed.flower.runtime_env import RAY_INLINE_BYTES

    rec = record("bench_flower_masked")
    d, m = rec["data"], rec["machine"]
    cfg, timed, mem = d["config"], d["timed"], d["memory"]
    first = timed[-1]["rounds"][-1]
    mask = first["masked"]
    lines = [
        f"`{rec['command']}` ({m['cpus']} cores; the load average beside each run). Flower's simulation runtime "
        f"(Ray, {cfg['num_cpus']} CPUs for the nodes) with the privfed ServerApp and ClientApp, FedNCM on "
        f"`synthetic:{cfg['dim']}:{cfg['samples']}` ({cfg['classes']} classes: {timed[-1]['upload_bytes']:,} bytes "
        f"of statistics a node). In one simulation of {timed[-1]['nodes']:,} nodes, after a first plain run that "
        f"starts the nodes, {cfg['repeats']} round{'' if cfg['repeats'] == 1 else 's'} of a plain aggregation, the active protocol on the roster's "
        f"SecAgg+ graph (degree {cfg['degree']}, t = {mask['threshold']}) and Flower's own SecAgg+ "
        f"(`flwr-secaggplus-insecure`, {cfg['degree'] + 1} shares a node, the same t) of the same statistics, "
        "their order rotating; CPU seconds of every process of the simulation (the ServerApp, Flower's engine, "
        "the Ray workers running the ClientApps"
        + (
            f"; Ray's inline limit at {cfg['ray_inline_bytes'] / 2**20:g} MiB"
            + (", privfed's simulation default" if cfg["ray_inline_bytes"] == RAY_INLINE_BYTES else "")
            + ", so that a message with its node's context, up to that size, travels inside Ray's task messages"
            if cfg.get("ray_inline_bytes")
            else ""
        )
        + "):",
        "",
        "| run | order | load | plain s | masked s | Flower SecAgg+ s | floor s | masked / floor | "
        "floor with the round trips | masked / it |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, t in enumerate(timed):
        for r in t["rounds"]:
            lines.append(
                f"| {i + 1} | {' / '.join(r['order'])} | {max(r['load_average']):.1f} | "
                f"{r['plain']['cpu_s']:.1f} | {r['masked']['cpu_s']:.1f} | {r['flwr']['cpu_s']:.1f} | "
                f"{r['floor_cpu_s']:.1f} | {r['ratio']:.2f}× | {r['floor_with_round_trips_cpu_s']:.1f} | "
                f"{r['ratio_with_round_trips']:.2f}× |"
            )
    sizes = " / ".join(f"{p['nodes']:,}" for p in mem)
    slope = d["process_peak_slope_bytes_per_node"]
    lines += [
        "",
        f"The floor is the plain run plus the floor's cryptography (the counts the message layer finds, timed "
        f"alone in this process). Flower's engine costs a round trip whatever it carries: the masked run needs "
        f"{first['extra_round_trips']} more than the plain one (setup with the key advertisements, shares, "
        f"masked input, consistency and unmasking against one query), each costing about what its consistency "
        f"stage costs ({first['round_trip_cpu_s']:.1f} s of CPU at {timed[-1]['nodes']:,} nodes, where each "
        "node's own work is one signature and a ledger entry). Masked against Flower's SecAgg+ on the same "
        "runtime: "
        + " and ".join(f"{t['masked_to_flwr']['median']:.2f}×" for t in timed)
        + " (median per run); the heads agree with the plain one to "
        f"{max(r['max_abs_head_diff'] for t in timed for r in t['rounds']):.0e} masked (fixed point) and "
        f"{max(r['flwr_max_abs_head_diff'] for t in timed for r in t['rounds']):.0e} with Flower's SecAgg+ "
        "(its 2^22-level quantisation of pre-scaled statistics). The runs' median ratios to the floor agree within "
        f"{d['agreement']:.1%}.",
        "",
        "Flower's simulation keeps every virtual node's context in the ServerApp's process: traced in separate "
        "simulations, that process's peak (above where each run began) was "
        f"{' / '.join(_mib(p['plain']['process_peak_bytes']) for p in mem)} MiB plain and "
        f"{' / '.join(_mib(p['masked']['process_peak_bytes']) for p in mem)} MiB masked at {sizes} nodes, "
        f"{slope['masked']:,.0f} bytes per added node masked, where each masked node keeps "
        f"{mem[-1]['node_context_bytes']:,.0f} bytes of context (its cached statistics). The server's own memory, "
        "in a process of its own, is the block above: O(k) a node.",
        "",
    ]
    return "\n".join(lines)
