"""Blocks read from recorded results: trade-off readings, secure aggregation, Flower, scale, the audit sweep."""

from __future__ import annotations

import numpy as np

from experiments.docs_numbers.sources import at, committed, fmt, record, sci, template

READINGS = template("readings")


def readings() -> str:
    """The trade-off readings under the FedLog plot, from the recipes' record."""
    from privfed.tradeoff import digits_public_clip

    rec = record("recipes")
    d = rec["data"]
    fl, rd, cn = d["fedlog-dp"], d["record-dp"], d["count-noise"]
    central = fl["central noise, analytic (trusted aggregator)"]
    classic = fl["central noise, classic bound (FedLog paper)"]
    mask = fl["noise split under secure aggregation (mask)"]
    local = fl["local noise (each client, no trust)"]
    acc = lambda rows, e: float(at(rows, e)["accuracy_mean"])  # noqa: E731
    v = dict(
        seeds=int(central[0]["seeds"]),
        command=rec["command"],
        c2=acc(central, 2.0),
        m2=acc(mask, 2.0),
        c4=acc(central, 4.0),
        np_=acc(central, float("inf")),
        c1=acc(central, 1.0),
        c05=acc(central, 0.5),
        k1=acc(classic, 1.0),
        k1eps=float(at(classic, 1.0)["epsilon_reported"]),
        l16=acc(local, 16.0),
        cof16=acc(rd["fedcof"], 16.0),
        cof_np=acc(rd["fedcof"], float("inf")),
        w16=acc(rd["fed3r-within"], 16.0),
        r16=acc(rd["fed3r"], 16.0),
        lap01=acc(cn["laplace"], 0.1),
        cn_np=acc(cn["laplace"], float("inf")),
        clip=digits_public_clip(),
    )
    v["clip2"] = v["clip"] ** 2
    claims = {
        "classic below analytic at nominal eps 1": v["k1"] < v["c1"] and v["k1eps"] < 1.0,
        "local at 16 not above central at 1 by much": v["l16"] <= v["c1"] + 0.05,
        "fed3r-within below fed3r at 16": v["w16"] < v["r16"],
        "count noise costs little": v["cn_np"] - v["lap01"] < 0.05,
    }
    broken = [c for c, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's trade-off readings no longer hold: {broken}; rewrite the text")
    return READINGS.format(**v)


NOISE_AWARE = template("noise-aware")


def noise_aware() -> str:
    """The noise-aware estimation bullet, from experiments/noise_aware.py's record."""
    rec = record("noise_aware")
    cfg, rows = rec["data"]["config"], rec["data"]["rows"]
    eps = sorted({float(r["epsilon"]) for r in rows})
    mean = lambda key, e: float(np.mean([r[key] for r in rows if float(r["epsilon"]) == e]))  # noqa: E731
    cut = [100 * (1 - mean("cov_err_aware", e) / mean("cov_err_plain", e)) for e in eps]
    drop = [mean("cov_err_plain", e) / mean("cov_err_drop", e) for e in eps]
    v = dict(
        command=rec["command"],
        clients=cfg["clients"],
        seeds=cfg["seeds"],
        thr=cfg["threshold"],
        cut_lo=min(cut),
        cut_hi=max(cut),
        drop_lo=min(drop),
        drop_hi=max(drop),
        p8=mean("acc_plain", 8.0),
        a8=mean("acc_aware", 8.0),
        d16=mean("acc_drop", 16.0),
        p16=mean("acc_plain", 16.0),
    )
    if not (v["a8"] < v["p8"] and v["d16"] > v["p16"] and max(cut) < 10):
        raise RuntimeError("the README's noise-aware reading no longer holds; rewrite the text")
    return NOISE_AWARE.format(**v)


def secagg_active_table() -> str:
    """The consistency round's cost against honest-but-curious masking, from bench_secagg.py --active's record."""
    rec = record("bench_secagg_active")
    cfg, rows = rec["data"]["config"], rec["data"]["rows"]
    lines = [
        f"`{rec['command']}` ({cfg['clients']} clients; CPU seconds of every client and the server in one process, "
        f"best of {cfg['repeats']}; machine-dependent: {rec['machine']['cpus']} cores, load "
        f"{rec['machine']['load_average'][0]:.1f} when recorded):",
        "",
        "| variant | CPU s, honest-but-curious | CPU s, active | CPU ratio | bytes up / client | bytes down / client |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['honest_cpu_s']:.2f} | {r['active_cpu_s']:.2f} | {r['cpu_ratio']:.2f}× | "
            f"{r['honest_upload_bytes_per_client']:,.0f} → {r['active_upload_bytes_per_client']:,.0f} "
            f"({r['upload_ratio']:.4f}×) | {r['honest_download_bytes_per_client']:,.0f} → "
            f"{r['active_download_bytes_per_client']:,.0f} ({r['download_ratio']:.2f}×) |"
        )
        if r["active_max_abs_error"] > r["error_bound"]:
            raise RuntimeError(f"the active protocol's recorded error exceeds its bound: {r}")
    return "\n".join(lines) + "\n"


def secagg_table() -> str:
    """The secure-aggregation cost table, from experiments/bench_secagg.py's record (machine-dependent)."""
    rec = record("bench_secagg")
    cfg, rows = rec["data"]["config"], rec["data"]["rows"]
    by = {(r["protocol"], r["variant"]): r for r in rows}
    plain = by[("plain", "float64 sum")]
    full = by[("mask", "complete graph")]
    drop = by[("mask", "complete graph, 10% drop before upload")]
    plus = next(r for (p_, v), r in by.items() if p_ == "mask" and v.startswith("SecAgg+"))
    ckks = next((r for (p_, _), r in by.items() if p_ == "ckks"), None)
    K, D = cfg["clients"], cfg["values"]
    lines = [
        f"`{rec['command']}`: {K} clients × {D:,} floats, the least CPU seconds of {cfg['repeats']} runs "
        f"(machine-dependent: {rec['machine']['cpus']} cores, load {rec['machine']['load_average'][0]:.1f} when recorded):",
        "",
        f"| protocol | CPU s (all {K} clients + server) | vs its floor (plain sum + PRG + X25519) | upload bytes / client | max abs error |",
        "| --- | --- | --- | --- | --- |",
        f"| plain float64 sum | {plain['cpu_s']:.4f} | – | {plain['upload_bytes_per_client']:,.0f} | 0 |",
        f"| masking, complete graph | {full['cpu_s']:.2f} (PRG alone {full['prg_only_cpu_s']:.2f}, X25519 alone "
        f"{full['x25519_only_cpu_s']:.2f}) | **{full['ratio_to_floor']:.2f}×** | "
        f"{full['upload_bytes_per_client']:,.0f} | {sci(full['max_abs_error'])} (bound K·2⁻³³ = {sci(full['error_bound'])}) |",
        f"| masking, 10% drop before upload | {drop['cpu_s']:.2f} | {drop['ratio_to_floor']:.2f}× | "
        f"{drop['upload_bytes_per_client']:,.0f} | {sci(drop['max_abs_error'])} |",
        f"| masking, SecAgg+ ({cfg['neighbours']} neighbours) | {plus['cpu_s']:.2f} | "
        f"{plus['ratio_to_floor']:.2f}× | {plus['upload_bytes_per_client']:,.0f} | {sci(plus['max_abs_error'])} |",
    ]
    if ckks is not None:
        lines.append(
            f"| CKKS, N = 8192, [60, 40, 40, 60], 2⁴⁰ | encrypt {ckks['per_client_ms']:.0f} ms / client, sum "
            f"{ckks['sum_s']:.1f} s, decrypt with its signature checks {ckks['decrypt_s']:.2f} s | – | {ckks['upload_bytes_per_client']:,.0f} "
            f"({ckks['ciphertexts_per_client']} ciphertexts, {ckks['upload_bytes_per_client'] / D:.0f} B a value) | "
            f"{sci(ckks['max_abs_error'])} |"
        )
    lines += [
        "",
        f"The complete graph is bounded below by its {full['x25519_agreements']:,} X25519 agreements",
        f"({full['x25519_only_cpu_s']:.2f} s): every client needs a mask key and a channel key with every other",
        "client. The work that grows with vector size alone (masking and unmasking)",
        f"is {full['ratio_without_fixed']:.1f}× the PRG cost."
        + (
            ""
            if ckks is None
            else f" CKKS costs {ckks['upload_bytes_per_client'] / plain['upload_bytes_per_client']:.0f}× the bytes of a "
            "plain float32 upload."
        ),
        "",
    ]
    return "\n".join(lines)


def bench_tradeoff_table() -> str:
    """The sweep's speed table, from experiments/bench_tradeoff.py's record (machine-dependent)."""
    rec = record("bench_tradeoff")
    r = rec["data"]
    m = rec["machine"]
    return (
        f"Median of {r['repeats']} runs, back to back (`{rec['command']}`; machine-dependent: "
        f"{m['cpus']} cores, load {m['load_average'][0]:.1f} when recorded):\n"
        "\n"
        f"| sweep ({r['runs']} runs: 5 methods × 10 ε × 5 seeds, digits, 100 clients) | seconds | ratio to `privfed.tradeoff` |\n"
        "| --- | --- | --- |\n"
        f"| `privfed.tradeoff` (statistics once per seed and method) | {r['sweep_s_median']:.2f} | 1.00 |\n"
        f"| baseline: `privfed.fit` per run, one BLAS thread | {r['naive_1thread_s_median']:.2f} | "
        f"{r['speedup_vs_1thread']:.2f} |\n"
        f"| baseline: `privfed.fit` per run, default BLAS threads | {r['naive_s_median']:.2f} | {r['speedup']:.2f} |\n"
        "\n"
        f"Reusing the clipped statistics is worth {r['speedup_vs_1thread']:.2f}× on the same BLAS threads; the rest of\n"
        f"the {r['speedup']:.2f}× against `privfed.fit` with default BLAS threads comes from threading on\n"
        "64 × 64 matrices, not from the sweep, which runs its small d × d algebra on one BLAS thread.\n"
    )


def flower_bytes() -> str:
    """Bytes on the wire per protocol on Flower, from experiments/bench_flower.py's record."""
    part = record("bench_flower")["data"]["protocols"]
    rows, cfg = part["rows"], part["config"]
    out = [
        f"Bytes up per node, {cfg['clients']} digits nodes (d = 64, C = 10), ratio to plain float64 in the same run "
        f"(`python {part['command'].removeprefix('python ')}`):",
        "",
        "| method | protocol | bytes up / node | vs plain float64 | fit model / node | array payload / node |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['method']} | {r['protocol']} | {r['bytes_up_per_node']:,.0f} | {r['vs_plain_float64']:.2f} | "
            f"{fmt(r['fit_model_bytes_per_node'], ',.0f')} | {fmt(r['payload_bytes_per_node'], ',.0f')} |"
        )
    return "\n".join(out) + "\n"


def flower_audit() -> str:
    """End-to-end audits of the Flower DP paths, from experiments/bench_flower.py's record."""
    part = record("bench_flower")["data"]["audit"]
    rows = part["rows"]
    r0 = rows[0]
    out = [
        f"fedncm, ε = {r0['claimed_eps']:g} (claimed μ = {r0['claimed_mu']:.3f}), {r0['draws']} fresh draws a side "
        f"(`python {part['command'].removeprefix('python ')}`, the audit part):",
        "",
        "| path | neighbour pair | μ lower bound | flagged |",
        "|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['path']} | {r['pair']} | {r['mu_lb']:.3f} | {'yes' if r['flagged'] else 'no'} |")
    broken = [r for r in rows if r["path"].startswith("BROKEN")]
    real = [r for r in rows if not r["path"].startswith("BROKEN")]
    if not (all(r["flagged"] for r in broken) and not any(r["flagged"] for r in real)):
        raise RuntimeError(
            "the Flower audit record no longer says what the README says: every real path passes, "
            "every broken one is flagged"
        )
    return "\n".join(out) + "\n"


def flower_cost() -> str:
    """Start-up, scale and server memory on Flower, from experiments/bench_flower.py's record (machine-dependent)."""
    data = record("bench_flower")["data"]
    m, sc, mem = data["methods"], data["scale"], data["memory"]
    mr = m["rows"]
    runs = mr["runs"]
    later = [r["server_seconds"] for r in runs[1:]]
    load = sc["machine"]["load_average"]
    by_d = {(r["d"], r["clients"]): r for r in mem["rows"]}
    dmax = max(r["d"] for r in mem["rows"])
    ks = sorted(r["clients"] for r in mem["rows"] if r["d"] == dmax)
    a, b = by_d[(dmax, ks[0])], by_d[(dmax, ks[-1])]
    out = [
        f"`python {sc['command'].removeprefix('python ')}` (machine-dependent: {sc['machine']['cpus']} cores, "
        f"{sc['config']['num_cpus']} Ray CPUs, load {load[0]:.1f} when recorded):",
        "",
        "| | " + " | ".join(f"{r['clients']:,} nodes" for r in sc["rows"]) + " |",
        "|---|" + "---|" * len(sc["rows"]),
        "| fedncm wall time, whole simulation (synthetic d = 64, 20 samples a node) | "
        + " | ".join(f"{r['simulation_wall_s']:.1f} s" for r in sc["rows"])
        + " |",
        "| largest difference from a direct sum | "
        + " | ".join(f"{r['max_abs_diff_vs_direct_sum']:.1e}" for r in sc["rows"])
        + " |",
        "",
        f"Start-up dominates: on {mr['clients']} digits nodes (every method plain, then masked, CKKS, compact, DP and",
        f"Flower SecAgg+ runs, {len(runs)} in one simulation) the first head came {mr['first_head_s']:.1f} s after launch;",
        f"the {len(later)} further runs on the same nodes took {min(later):.1f}–{max(later):.1f} s each of server time.",
        f"Server peak memory (fed3r, traced) grows with d², not with the number of nodes: d = {dmax} peaked at",
        f"{a['server_peak_traced_bytes'] / 1e6:.1f} MB with {ks[0]} nodes and {b['server_peak_traced_bytes'] / 1e6:.1f} MB "
        f"with {ks[-1]} (holding every reply would take {a['K_d2_bytes'] / 1e6:.0f} MB and {b['K_d2_bytes'] / 1e6:.0f} MB).",
        "",
    ]
    return "\n".join(out)


def audit_sweep_table() -> str:
    """The audit sweep's table, rendered by experiments/audit_sweep.py from its committed results."""
    from experiments import audit_sweep

    res = committed("experiments", "audit_sweep_results.json")
    return audit_sweep.readme_table(res).strip("\n") + "\n"


def _bench_scale() -> tuple[dict, object]:
    from experiments import bench_scale

    return committed("experiments", "bench_scale.json"), bench_scale


def bench_scale_tables() -> str:
    """The scale benchmark's tables, rendered by experiments/bench_scale.py from its recorded run."""
    res, bs = _bench_scale()
    return bs.render(res).rstrip("\n") + "\n"


SCALE_READINGS = template("scale-readings")


#: Server targets: at most this many times the bound at the main shape's d and at d = 256.
SERVER_TARGETS = {"main": 1.15, "d256": 2.0}
#: Methods whose server factors a d x d matrix (the targets are about them; fedncm and fedlog are read apart).
_FACTORING = ("fedcof", "fedcof-mm4", "fed3r", "fed3r-within", "fedcgs", "fedcof-oracle")


def _server_text(qs: list[dict]) -> str:
    """Each factoring server's ratio in every run (run 1 / run 2)."""
    return ", ".join(
        f"{m} " + " / ".join(f"{q[m]['server_bound']:.2f}" for q in qs) + "×"
        for m in _FACTORING
        if m in qs[0]
    )


def _point_ratios(run: dict, which: str, bs) -> dict:
    point = run if which == "main" else run.get("d256") or {"rows": [], "bound": run["bound"]}
    return {r["method"]: bs.method_ratios(r, point["bound"]) for r in point["rows"] if "error" not in r}


def scale_readings() -> str:
    """The readings under the scale tables, from the recorded runs; refuses a claim the runs contradict."""
    from experiments.scale_report import REPRODUCE, runs_of

    res, bs = _bench_scale()
    runs = runs_of(res)
    rows = {r["method"]: r for r in res["rows"] if "error" not in r}
    q = _point_ratios(res, "main", bs)
    qs = [_point_ratios(run, "main", bs) for run in runs]
    qs256 = [_point_ratios(run, "d256", bs) for run in runs]
    sumonly = [m for m in rows if q[m]["loop_fit"] < 20]
    curves = res["curves"]
    mexp = [c["exponent"] for c in curves if c["curve"].startswith("M")]
    kexp = [c["exponent"] for c in curves if c["curve"].startswith("K")]
    dcur = [c for c in curves if c["curve"] == "d"]
    dps = [r for r in res["local_dp"] if "error" not in r]
    ncm = [r for r in dps if r["method"] == "fedncm"]
    cof = [r for r in dps if r["method"] == "fedcof"]
    missed = [
        f"{m} {qq[m]['server_bound']:.2f}× at d = {res['d']:,} (run {i + 1})"
        for i, qq in enumerate(qs)
        for m in _FACTORING
        if m in qq and qq[m]["server_bound"] > SERVER_TARGETS["main"]
    ]
    missed += [
        f"{m} {qq[m]['server_bound']:.2f}× at d = 256 (run {i + 1})"
        for i, qq in enumerate(qs256)
        for m in _FACTORING
        if m in qq and qq[m]["server_bound"] > SERVER_TARGETS["d256"]
    ]
    rep = res.get("reproduction", {})
    srv_rep = [
        v["spread"] for k, v in rep.items() if k.endswith("server_bound") and k.split()[0] in _FACTORING
    ]
    other = sorted(((k, v["spread"]) for k, v in rep.items() if not v["reproduced"]), key=lambda kv: -kv[1])
    traced = [x["traced_memory"] for qq in qs + qs256 for x in qq.values() if "traced_memory" in x]
    v = dict(
        runs=len(runs),
        traced_hi=max(traced) if traced else float("nan"),
        mem_lo=min(x["added_memory"] for x in q.values()),
        mem_hi=max(x["added_memory"] for x in q.values()),
        input_mib=res["input_mib"],
        target=res["memory_target"],
        rss_lo=min(r["peak_rss"] for r in rows.values()) / 2**30,
        rss_hi=max(r["peak_rss"] for r in rows.values()) / 2**30,
        fit_lo=min(x["fit_bound"] for qq in qs for x in qq.values()),
        fit_hi=max(x["fit_bound"] for qq in qs for x in qq.values()),
        d=res["d"],
        srv_main=_server_text(qs),
        srv_256=_server_text(qs256),
        target_main=SERVER_TARGETS["main"],
        target_256=SERVER_TARGETS["d256"],
        targets="every factoring server meets them in every run"
        if not missed
        else "missed by " + ", ".join(missed),
        srv_rep=max(srv_rep) if srv_rep else float("nan"),
        reproduce=REPRODUCE,
        others="every other ratio too"
        if not other
        else "the others too except "
        + ", ".join(f"{k} ({s:.0%})" for k, s in other[:8])
        + (f" and {len(other) - 8} more" if len(other) > 8 else ""),
        ncm_pass=q["fedncm"]["server_bound"],
        log_pass=q["fedlog"]["server_bound"],
        ncm_ms=1e3 * rows["fedncm"]["server_s"],
        log_ms=1e3 * rows["fedlog"]["server_s"],
        ncm_share=rows["fedncm"]["server_s"] / rows["fedncm"]["fit_s"],
        log_share=rows["fedlog"]["server_s"] / rows["fedlog"]["fit_s"],
        cof_loop=q["fedcof"]["loop_fit"],
        mm_loop=q["fedcof-mm4"]["loop_fit"],
        cof_gemm=q["fedcof"]["class_gemm_loop_fit"],
        orc_loop=q["fedcof-oracle"]["loop_fit"],
        sumonly=", ".join(sumonly) or "no method",
        lb_lo=min((q[m]["loop_bound"] for m in sumonly), default=0.0),
        lb_hi=max((q[m]["loop_bound"] for m in sumonly), default=0.0),
        dp_lo=min(r["run_s"] / r["noise_s"] for r in ncm),
        dp_hi=max(r["run_s"] / r["noise_s"] for r in ncm),
        cdp_lo=min(r["run_s"] / (r["noise_s"] + r["xtx_s"]) for r in cof),
        cdp_hi=max(r["run_s"] / (r["noise_s"] + r["xtx_s"]) for r in cof),
        m_lo=min(mexp),
        m_hi=max(mexp),
        k_lo=min(kexp),
        k_hi=max(kexp),
        d_lo=min(c["exponent"] for c in dcur),
        d_hi=max(c["exponent"] for c in dcur),
        d_first=dcur[0]["x"][0],
        d_last=dcur[0]["x"][-1],
    )
    claims = {
        "every method within the memory target": v["traced_hi"] <= res["memory_target"],
        "FedCOF and the oracle >= 20x the loop": min(v["cof_loop"], v["mm_loop"], v["orc_loop"]) >= 20,
        "grows with M, not faster than linearly": 0.5 <= v["m_lo"] and v["m_hi"] <= 1.3,
        "flat in K": v["k_hi"] <= 0.3,
        "local DP memory flat in K": all(
            (max(g, key=lambda r: r["clients"])["peak_rss"] - max(g, key=lambda r: r["clients"])["rss_input"])
            < 1.5
            * (
                min(g, key=lambda r: r["clients"])["peak_rss"]
                - min(g, key=lambda r: r["clients"])["rss_input"]
            )
            for g in (ncm, cof)
        ),
    }
    broken = [c for c, ok in claims.items() if not ok]
    if broken:
        raise RuntimeError(f"the README's scale readings no longer hold: {broken}; rewrite the text")
    return SCALE_READINGS.format(**v)


def vision_device() -> str:
    """Feature extraction on a GPU against the CPU, from experiments/bench_vision_device.py's record (a GPU run)."""
    rec = record("bench_vision_device")
    d = rec["data"]
    cfg, dev, runs, rep = d["config"], d["device"], d["runs"], d["reproduction"]
    agree = {r["backbone"]: r for r in d["agreement"]}
    lines = [
        f"`{rec['command']}` on one {dev['gpu']} (torch {dev['torch']}, CUDA {dev['cuda']}, "
        f"{rec['machine']['cpus']} CPU cores; recorded {rec['recorded_utc'][:10]}); backbones randomly "
        f"initialised (seeded), {cfg['agree_images']} synthetic 32-pixel images for the agreement, "
        f"{cfg['images']:,} for the speed, batches of {cfg['batch_size']}, {len(runs)} run{'' if len(runs) == 1 else 's'}:",
        "",
        "| backbone | d | GPU vs CPU, torch defaults | with TF32 off | extraction, PIL resize | resize on the GPU "
        "| speed-up, each run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, a in agree.items():
        speeds = [next(s for s in r["speed"] if s["backbone"] == name) for r in runs]
        pil = ", ".join(f"{s['median_s']['pil']:.2f}" for s in speeds)
        gpu = ", ".join(f"{s['median_s']['device']:.2f}" for s in speeds)
        ups = ", ".join(f"{v:.1f}×" for v in rep[name]["values"])
        lines.append(
            f"| {name} | {a['dim']:,} | {sci(a['defaults']['relative_fro'])} (worst image "
            f"{sci(a['defaults']['max_row_relative'])}) | {sci(a['tf32_off']['relative_fro'])} | {pil} s | "
            f"{gpu} s | {ups} |"
        )
    conv = [v for n, r in rep.items() if n != "vit_b_16" for v in r["values"]]  # the convolutional ones
    on = next(iter(agree.values()))["torch_defaults"]
    missed = [f"{n} ({r['spread']:.0%})" for n, r in rep.items() if r["reproduced"] is False]
    speed = (
        f"Resizing in batches on the GPU makes the whole extraction {min(conv):.1f}–{max(conv):.1f}× faster for the "
        "convolutional backbones"
        if conv
        else "Resizing in batches on the GPU changes the whole extraction's time as the table shows"
    )
    off = sci(max(a["tf32_off"]["relative_fro"] for a in agree.values()))
    flags = f"`allow_tf32` was {on['cudnn_allow_tf32']} for cuDNN and {on['matmul_allow_tf32']} for matrix products"
    if on["cudnn_allow_tf32"] and max(a["defaults"]["relative_fro"] for a in agree.values()) > 1e-5:
        tf32 = (
            f"Torch's defaults let cuDNN run float32 convolutions in TF32 (here {flags}), which is what the first column "
            f"shows; with TF32 off the GPU's features agree with the CPU's to within {off}, float32's rounding "
            "carried through the network."
        )
    else:  # a GPU without TF32, or torch told not to use it: both columns are float32's own rounding
        tf32 = (
            f"With torch's defaults ({flags}) this GPU computed in full float32: both columns are float32's "
            f"rounding carried through the network (within {off} with TF32 off)."
        )
    if len(runs) < 2:
        repro = "With one run, whether the speed-ups reproduce is not checked."
    elif missed:
        repro = (
            f"Between the runs the speed-up of {', '.join(missed)} moved by more than the {cfg['reproduce']:.0%} "
            "a recorded ratio must reproduce within: read the speed-ups as a range."
        )
    else:
        repro = f"Every speed-up reproduces within {cfg['reproduce']:.0%} between the runs."
    lines += [
        "",
        f"The differences are relative Frobenius norms over the batch. {tf32} {speed}. The times are wall seconds, medians of {cfg['repeats']} "
        f"alternating rounds in each run. {repro}",
    ]
    return "\n".join(lines) + "\n"
