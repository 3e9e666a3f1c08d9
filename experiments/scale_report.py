"""The scale benchmark's record: each method's ratios and the markdown tables of one run.

:func:`render` turns a run's JSON record (raw seconds and bytes) into the
tables the docs quote; :func:`method_ratios` gives one method's ratios
against its bound, the loop and its input.  Nothing here measures.
"""

from __future__ import annotations

__all__ = ["MEMORY_TARGET", "method_ratios", "render"]

#: Memory target: privfed.fit adds at most this fraction of its input.
MEMORY_TARGET = 0.25


# -- the record's ratios and tables ----------------------------------------------------------------
def method_ratios(r: dict, bound: dict) -> dict:
    """One method's ratios (all from the raw seconds and bytes of one run)."""
    loop_s = r["loop_client_s"] + r.get("loop_server_s", r["server_s"])
    out = {
        "fit_bound": r["fit_s"] / r["bound_s"],
        "server_bound": r["server_s"] / r["server_bound_s"],
        "loop_fit": loop_s / r["fit_s"],
        "loop_bound": loop_s / r["bound_s"],
        "added_memory": (r["peak_rss"] - r["rss_input"]) / r["input_bytes"],
    }
    if "loop_server_class_gemm_s" in r:
        out["class_gemm_loop_fit"] = (r["loop_client_s"] + r["loop_server_class_gemm_s"]) / r["fit_s"]
    return out


def _params_text(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items()) or "-"


def _table(point: dict, res: dict, title: str) -> list[str]:
    real, d, b = point["shape"], point["d"], point["bound"]
    lines = [
        f"{title}: N={real['N']:,}, K={real['K']:,}, C={real['C']:,}, d={d:,}, M={real['M']:,} (float32 input "
        f"{point['input_mib']:.0f} MiB); {res['cores']} cores, {res['threads']} BLAS thread(s), CPU seconds, best "
        f"of {res['repeats']}.",
        f"Bound parts (CPU s): float32 -> float64 of the input {b['to_float64_s']:.3f}, group sum into the C class rows "
        f"{b['group_sum_C_s']:.3f} / the M pair rows {b['group_sum_M_s']:.3f}, X^T X over the N samples "
        f"{b['xtx_N_s']:.3f}, over the {b['spread_rows']['M']:,} pair rows FedCOF's spread takes {b['xtx_M_s']:.3f} "
        f"({b['spread_rows']['M4']:,} with 4 means: {b['xtx_M4_s']:.3f}), over the C class rows {b['xtx_C_s']:.3f}, "
        f"d x d Cholesky {b['cholesky_s']:.3f}, solves of the d x C right-hand side {b['solve_C_s']:.3f}, one pass "
        f"over the C x d class sums {b['pass_C_s']:.4f}"
        + (
            f", their C row norms {b['norms_C_s']:.4f}, FedLog's one-dimensional root {b['root_C_s']:.4f}."
            if "norms_C_s" in b
            else "."
        ),
        "",
        "| method | parameters | fit s | fit wall s | fit / bound | server s | server / its bound | loop / fit "
        "| loop / bound | peak RSS GiB | fit's memory / input |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in point["rows"]:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} |")
            continue
        q = method_ratios(r, b)
        lines.append(
            f"| {r['method']} | {_params_text(r['params'])} | {r['fit_s']:.2f} | {r['fit_wall_s']:.2f} | "
            f"{q['fit_bound']:.2f} | "
            f"{r['server_s']:.3f} | {q['server_bound']:.2f} | {q['loop_fit']:.1f} | {q['loop_bound']:.1f} | "
            f"{r['peak_rss'] / 2**30:.2f} | {q['added_memory']:.3f} |"
        )
    return lines


def render(res: dict) -> str:
    """The markdown tables of one run (the docs' scale section is this text)."""
    main = {
        "shape": res["shape"],
        "d": res["d"],
        "bound": res["bound"],
        "rows": res["rows"],
        "input_mib": res["input_mib"],
    }
    done = [r for r in res["rows"] if "error" not in r]
    lines = [
        f"Command: {res['command']}; times and RSS are machine-dependent, ratios are within this run. Times are "
        "CPU seconds of one process on one BLAS thread (the work done, unchanged when other programs share the "
        "cores; wall seconds of fit beside them), the least over the repeats. Every time is a public call in a "
        "fresh process: fit = privfed.fit on the float32 input; server = "
        "Method.aggregate on the statistics folded as the Flower server and the sweep fold them.",
        "Bound = the work the method must do (client: one pass converting and group-summing the input, plus "
        "X^T X over the N samples for fed3r, fed3r-within, fedcgs and the oracle; server: fedncm the C row norms "
        "of the class sums and one pass scaling them, fedlog the same plus its one-dimensional root (Newton's "
        "method on C numbers, each step O(C): the MAP of Eq. 15 needs it), fed3r Cholesky + solves, fed3r-within and the oracle X^T X over the C "
        "class rows + Cholesky + solves, fedcgs two Cholesky (its covariance's own, deciding the PSD repair, and "
        "the shrunk one) + solves, FedCOF X^T X over the pair rows its spread takes + Cholesky + solves). "
        f"fit's memory = peak RSS minus the RSS with the input loaded, over the input's bytes (target "
        f"{res.get('memory_target', MEMORY_TARGET):g})."
        + (
            f" Rows of {', '.join(res['rerecorded']['methods'])} (both points) re-measured in one later run "
            f"({res['rerecorded']['command']}), each against the bound parts measured beside it."
            if res.get("rerecorded")
            else ""
        ),
        f"loop = the seeds' per-client loop (per client, per class Python work), timed on the clients of the first "
        f"{done[0]['loop_rows'] if done else 0:,} samples and scaled by N / samples; FedCOF's server looped too "
        "(one rank-1 update per uploaded row, scaled by rows), the other methods' followed by privfed's server.",
        "",
    ]
    lines += _table(
        main,
        res,
        "Scaled-down federation (--small)" if res["small"] else "iNat-120K-shaped synthetic federation",
    )
    gemm = [
        (r["method"], method_ratios(r, res["bound"])["class_gemm_loop_fit"])
        for r in done
        if "loop_server_class_gemm_s" in r
    ]
    if gemm:
        lines += [
            "",
            "FedCOF against a per-class loop (each class's uploaded rows stacked into one GEMM instead of "
            "rank-1 updates): " + ", ".join(f"{m} loop / fit {v:.1f}" for m, v in gemm) + ".",
        ]
    if res.get("d256"):
        lines += [""] + _table(res["d256"], res, "The same at d = 256")
    lines += _dp_lines(res)
    curves = res.get("curves") or []
    if curves:
        lines += [
            "",
            "Scaling curves (privfed.fit, one fresh process per point, min over repeats; fitted log-log "
            "exponent):",
            "",
            "| curve | method | x | seconds | fitted exponent |",
            "| --- | --- | --- | --- | --- |",
        ]
        for c in curves:
            lines.append(
                f"| {c['curve']} | {c['method']} | {c['x']} | {[round(t, 3) for t in c['seconds']]} | "
                f"{c['exponent']:.2f} |"
            )
    return "\n".join(lines)


def _dp_lines(res: dict) -> list[str]:
    dp = [r for r in res.get("local_dp", []) if "error" not in r]
    if not dp:
        return []
    real, d = res["shape"], res["d"]
    K, C = real["K"], real["C"]
    lines = [
        "",
        f"Record-level DP with local noise (GaussianMechanism eps=1, delta=1e-5, clip sqrt(d); privfed.fit with "
        f"the methods' default parameters): every client noises all C = {C:,} classes, so it sends C (d + 1) = "
        f"{C * (d + 1):,} values whatever it holds ({K:,} clients: {K * C * (d + 1) * 4 / 2**30:.1f} GiB in "
        "float32). fedncm's server folds the noisy uploads chunk by chunk; FedCOF's takes every client's noisy "
        "counts first (K C values), then folds the noisy sums chunk by chunk into its spread: one release either "
        "way. Timed on the first clients (d and C of the full shape) and scaled to K by K / clients; bound = the "
        "noise alone, plus for FedCOF X^T X over the kept rows in blocks of one chunk's:",
        "",
        "| method | clients | fit s | noise alone s | X^T X over kept rows s | fit / bound | scaled to K s "
        "| peak RSS GiB | RSS - input GiB | releases booked |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in dp:
        xtx = r.get("xtx_s", 0.0)
        lines.append(
            f"| {r['method']} | {r['clients']:,} | {r['run_s']:.2f} | {r['noise_s']:.2f} | "
            f"{f'{xtx:.2f}' if 'xtx_s' in r else '-'} | {r['run_s'] / (r['noise_s'] + xtx):.2f} | "
            f"{r['run_s'] * K / r['clients']:.0f} | {r['peak_rss'] / 2**30:.2f} | "
            f"{(r['peak_rss'] - r['rss_input']) / 2**30:.2f} | {r['releases']} |"
        )
    for meth in dict.fromkeys(r["method"] for r in dp):
        mine = [r for r in dp if r["method"] == meth]
        if len(mine) > 1:
            big, small = max(mine, key=lambda r: r["clients"]), min(mine, key=lambda r: r["clients"])
            lines += [
                "",
                (
                    f"{meth}: peak RSS above the input at {big['clients']:,} clients / at {small['clients']:,}: "
                    f"{(big['peak_rss'] - big['rss_input']) / max(small['peak_rss'] - small['rss_input'], 1):.2f} "
                    f"(chunks of {res.get('upload_chunk_mib', 16):g} MiB of uploads"
                    + (
                        "; FedCOF also holds the K C noisy counts)."
                        if meth == "fedcof"
                        else ": memory independent of K)."
                    )
                ),
            ]
    return lines
