"""The scale benchmark's record: each method's ratios and the markdown tables of one run.

:func:`render` turns a run's JSON record (raw seconds and bytes) into the
tables the docs quote; :func:`method_ratios` gives one method's ratios
against its bound, the loop and its input.  Nothing here measures.
"""

from __future__ import annotations

__all__ = [
    "MEMORY_TARGET",
    "REPRODUCE",
    "median_added",
    "method_ratios",
    "render",
    "reproduction",
    "runs_of",
]

#: Memory target: privfed.fit adds at most this fraction of its input.
MEMORY_TARGET = 0.25
#: A ratio is reproduced when every independent run's lies within this share of the others'.
REPRODUCE = 0.10


def median_added(samples: list[dict]) -> int:
    """The median of the RSS each sample's first fit added (``peak_rss - rss_input``; the lower middle one
    of an even number)."""
    added = sorted(q["peak_rss"] - q["rss_input"] for q in samples)
    return added[(len(added) - 1) // 2]


# -- the record's ratios and tables ----------------------------------------------------------------
def method_ratios(r: dict, bound: dict) -> dict:
    """One method's ratios (all from the raw seconds and bytes of one run)."""
    loop_s = r["loop_client_s"] + r.get("loop_server_s", r["server_s"])
    out = {
        "fit_bound": r["fit_s"] / r["bound_s"],
        "server_bound": r["server_s"] / r["server_bound_s"],
        "loop_fit": loop_s / r["fit_s"],
        "loop_bound": loop_s / r["bound_s"],
        "added_memory": (
            median_added(r["rss_samples"]) if r.get("rss_samples") else r["peak_rss"] - r["rss_input"]
        )
        / r["input_bytes"],
    }
    if "loop_server_class_gemm_s" in r:
        out["class_gemm_loop_fit"] = (r["loop_client_s"] + r["loop_server_class_gemm_s"]) / r["fit_s"]
    if "traced_peak" in r:
        out["traced_memory"] = r["traced_peak"] / r["input_bytes"]
    return out


def runs_of(res: dict) -> list[dict]:
    """The record's independent runs: the first (the record itself) and any repeats."""
    return [res, *res.get("repeat_runs", [])]


def _ratio_table(res: dict) -> dict[str, list[float]]:
    """Every ratio a run states, by name, one value per run."""
    out: dict[str, list[float]] = {}
    for run in runs_of(res):
        for point in (run, run.get("d256")):
            if not point:
                continue
            d = point["d"]
            for r in point["rows"]:
                if "error" in r:
                    continue
                for key, v in method_ratios(r, point["bound"]).items():
                    out.setdefault(f"{r['method']} d={d} {key}", []).append(v)
        for r in run.get("local_dp", []):
            if "error" not in r:
                key = f"local-dp {r['method']} {r['clients']} clients fit_bound"
                out.setdefault(key, []).append(r["run_s"] / (r["noise_s"] + r.get("xtx_s", 0.0)))
    return out


def _rerecord_runs(entry: dict) -> str:
    """How many later measurements a ``--rerecord`` made: one for each of the record's runs (older records: one)."""
    n = int(entry.get("runs", 1))
    return "in one run" if n == 1 else f"once for each of the record's {n} runs"


def _covers(later: dict, entry: dict) -> bool:
    """Whether a later ``--rerecord`` re-measured every row ``entry`` did (its methods at its points)."""
    both = ["main", "d256"]  # older records: both points
    return set(entry["methods"]) <= set(later["methods"]) and set(entry.get("points", both)) <= set(
        later.get("points", both)
    )


def _rerecord_text(res: dict) -> str:
    """One sentence per ``--rerecord`` the record went through (earliest first): which rows, at which points."""
    last = res.get("rerecorded")
    if not last:
        return ""
    out = []
    entries = [*last.get("earlier", []), last]
    for i, entry in enumerate(entries):
        if any(_covers(later, entry) for later in entries[i + 1 :]):
            continue  # every row it re-measured was re-measured again: the later sentence says so
        points = entry.get("points", ["main", "d256"])  # older records: both
        where = "both points" if len(points) == 2 else ("d = 256" if points == ["d256"] else "the main point")
        out.append(
            f" Rows of {', '.join(entry['methods'])} ({where}) re-measured later ({entry['command']}), "
            f"{_rerecord_runs(entry)}, each against the bound parts measured beside it."
        )
    return "".join(out)


def _loop_rows_text(res: dict) -> str:
    """Where the per-client loop ran, at each point: the clients of the first samples (scaled by N / samples),
    or every client."""

    def at(point: dict | None) -> str | None:
        rows = [r for r in (point or {}).get("rows", []) if "error" not in r and "loop_rows" in r]
        if not rows:
            return None
        n, done = int(point["shape"]["N"]), int(rows[0]["loop_rows"])
        return (
            "on every client"
            if done >= n
            else f"on the clients of the first {done:,} samples, scaled by N / samples"
        )

    main = at({"shape": res["shape"], "rows": res["rows"]})
    d256 = at(res.get("d256"))
    if d256 is None or d256 == main:
        return main or "on no client"
    return f"{main} (at d = 256 {d256})"


def reproduction(res: dict) -> dict:
    """Each ratio's values across the runs, their spread ((largest - least) / least), whether within REPRODUCE."""
    out = {}
    for key, v in _ratio_table(res).items():
        spread = (max(v) - min(v)) / min(v) if min(v) > 0 else float("inf")
        out[key] = {"values": v, "spread": spread, "reproduced": spread <= REPRODUCE}
    return out


def _both(res: dict, method: str, which: str, key: str, fmt: str) -> str:
    """``key`` of ``method`` at point ``which`` in every run, joined by ' / '."""
    vals = []
    for run in runs_of(res):
        point = run if which == "main" else run.get("d256")
        r = next(
            (x for x in (point or {}).get("rows", []) if x["method"] == method and "error" not in x), None
        )
        if r is not None:
            vals.append(format(method_ratios(r, point["bound"])[key], fmt))
    return " / ".join(vals)


def _params_text(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items()) or "-"


def _server_repeats(point: dict) -> int:
    return min((len(r["server"]["samples"]) for r in point["rows"] if "server" in r), default=0)


def _parts_text(b: dict) -> str:
    rows = b.get("spread_rows", {})
    labels = [
        ("to_float64_s", "float32 -> float64 of the input {:.3f}"),
        ("group_sum_C_s", "group sum into the C class rows {:.3f}"),
        ("group_sum_M_s", "into the M pair rows {:.3f}"),
        ("xtx_N_s", "X^T X over the N samples {:.3f}"),
        ("xtx_M_s", f"over the {rows.get('M', 0):,} pair rows FedCOF's spread takes " + "{:.3f}"),
        ("xtx_M4_s", f"({rows.get('M4', 0):,} with 4 means: " + "{:.3f})"),
        ("xtx_C_s", "over the C class rows {:.3f}"),
        ("cholesky_s", "d x d Cholesky {:.3f}"),
        ("solve_C_s", "solves of the d x C right-hand side {:.3f}"),
        ("pass_C_s", "one pass over the C x d class sums {:.4f}"),
        ("norms_C_s", "their C row norms {:.4f}"),
        ("root_C_s", "FedLog's one-dimensional root {:.4f}"),
    ]
    return ", ".join(text.format(b[key]) for key, text in labels if key in b)


def _table(point: dict, res: dict, title: str, which: str = "main") -> list[str]:
    real, d, b = point["shape"], point["d"], point["bound"]
    runs = len(runs_of(res))
    lines = [
        f"{title}: N={real['N']:,}, K={real['K']:,}, C={real['C']:,}, d={d:,}, M={real['M']:,} (float32 input "
        f"{point['input_mib']:.0f} MiB); {res['cores']} cores, {res['threads']} BLAS thread(s), CPU seconds, least "
        f"of {res['repeats']} ({_server_repeats(point)} for the server and its bound) interleaved with its bound's "
        "parts." + _rss_text(point["rows"]),
        "Bound parts (CPU s, as timed beside the first method using each): " + _parts_text(b) + ".",
        "",
        "| method | parameters | fit s | fit wall s | fit / bound"
        + (f" (runs 1–{runs})" if runs > 1 else "")
        + " | server s | server / its bound"
        + (f" (runs 1–{runs})" if runs > 1 else "")
        + " | server spread | loop / fit | loop / bound | peak RSS GiB | fit's RSS / input | traced peak / input |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in point["rows"]:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} |")
            continue
        q = method_ratios(r, b)
        spread = f"{r['server']['spread']:.0%}" if "server" in r else "-"
        traced = f"{q['traced_memory']:.3f}" if "traced_memory" in q else "-"
        lines.append(
            f"| {r['method']} | {_params_text(r['params'])} | {r['fit_s']:.2f} | {r['fit_wall_s']:.2f} | "
            f"{_both(res, r['method'], which, 'fit_bound', '.2f')} | "
            f"{r['server_s']:.3f} | {_both(res, r['method'], which, 'server_bound', '.2f')} | {spread} | "
            f"{q['loop_fit']:.1f} | {q['loop_bound']:.1f} | "
            f"{r['peak_rss'] / 2**30:.2f} | {q['added_memory']:.3f}{_rss_range(r)} | {traced} |"
        )
    return lines


def _rss_text(rows: list[dict]) -> str:
    """How a point's fit RSS was taken, where it is the median of several fresh processes."""
    full = [len(r["rss_samples"]) for r in rows if r.get("rss_samples") and "rss_error" not in r]
    failed = [f"{r['method']}: {len(r['rss_samples'])}" for r in rows if "rss_error" in r]
    if not failed and max(full, default=0) < 2:
        return ""
    n = (f"{max(full)} fresh processes" if full else "fresh processes") + (
        f" ({'; '.join(failed)}, a process failed: see rss_error)" if failed else ""
    )
    fixed = [r for r in rows if (r.get("rss_heap") or {}).get("MALLOC_MMAP_THRESHOLD_")]
    older = [r["method"] for r in rows if r.get("rss_samples") and r not in fixed]
    lone = [r["method"] for r in rows if "rss_samples" in r and not r["rss_samples"]]
    how = (
        "each with glibc's mmap threshold held at "
        f"{int(fixed[0]['rss_heap']['MALLOC_MMAP_THRESHOLD_']) // 1024} KiB and "
        f"{'one arena' if fixed[0]['rss_heap'].get('MALLOC_ARENA_MAX') == '1' else 'its arenas'}: under glibc's "
        "defaults the threshold rises after a large free, and the few MiB a fit adds here moved by about 1 MiB "
        "between processes and over time with what the allocator kept; beside it their range and, as 'default "
        "heap', the timed process's reading under the defaults"
        + (f"; {', '.join(older)}: the timed process and more, under the defaults" if older else "")
        if fixed
        else "the timed one and more; the few MiB a fit adds here move by about 1 MiB between processes and "
        "over time with what the allocator keeps; their range beside it"
    )
    alone = f" {', '.join(lone)}: the timed process's reading alone (no RSS process ran)." if lone else ""
    return (
        f" fit's RSS / input = the median of the RSS the first fit added in {n} ({how}; the traced peak is the "
        f"target's measure).{alone} peak RSS = the timed process's."
    )


def _rss_range(r: dict) -> str:
    """`` (least–largest)`` of a row's fit RSS over its processes, over the input (and the timed process's
    reading under glibc's default heap, where the processes held it fixed); empty for one process."""
    if len(r.get("rss_samples", ())) < 2:
        return ""
    added = [(q["peak_rss"] - q["rss_input"]) / r["input_bytes"] for q in r["rss_samples"]]
    default = (
        f"; default heap {(r['peak_rss'] - r['rss_input']) / r['input_bytes']:.3f}"
        if (r.get("rss_heap") or {}).get("MALLOC_MMAP_THRESHOLD_")
        else ""
    )
    return f" ({min(added):.3f}–{max(added):.3f}{default})"


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
        f"Command: {res['command']}; times and RSS are machine-dependent, ratios are within each run. Times are "
        "CPU seconds of one process on one BLAS thread (the work done, which other programs sharing the cores "
        "do not add to; wall seconds of fit beside them), the least over the repeats. Every time is a public call "
        "in a fresh process, and in that process each repeat of it is followed by one of each part of its bound "
        "(fit, its client parts, the server, its server parts, then again), so a change in the machine's load "
        "falls on both: fit = privfed.fit on the float32 input; server = Method.aggregate on the statistics "
        "folded as the Flower server and the sweep fold them; server spread = (largest - least) / least of its "
        "repeats. A call under 0.05 s (the server and bound parts at d = 256) is made back to back within each "
        "repeat until the repeat lasts 0.05 s, and its mean kept."
        + (
            f" {len(runs_of(res))} independent runs, one after the other; each ratio is given for every run "
            f"(run 1 / run 2): the tables' other columns are run 1's. Load average when each run ended: "
            + " / ".join(f"{x['load_average'][0]:.1f}" for x in runs_of(res) if x.get("load_average"))
            + "."
            if len(runs_of(res)) > 1
            else ""
        ),
        "Bound = the work the method must do (client: one pass converting and group-summing the input, plus "
        "X^T X over the N samples for fed3r, fed3r-within, fedcgs and the oracle; server: fedncm the C row norms "
        "of the class sums and one pass scaling them, fedlog the same plus its one-dimensional root (Newton's "
        "method on C numbers, each step O(C): the MAP of Eq. 15 needs it), fed3r Cholesky + solves, fed3r-within "
        "and the oracle X^T X over the C class rows + Cholesky + solves, fedcgs two Cholesky (its covariance's own, "
        "deciding the PSD repair, and the shrunk one) + solves, FedCOF X^T X over the pair rows its spread takes + "
        "Cholesky + solves). fit's RSS = peak RSS minus the RSS with the input loaded; traced peak = the largest "
        "allocation tracemalloc saw during one fit (numpy's buffers included); both over the input's bytes "
        f"(target {res.get('memory_target', MEMORY_TARGET):g})." + _rerecord_text(res),
        "loop = the seeds' per-client loop (per client, per class Python work), least of the repeats, timed in the "
        "method's own process after each fit (interleaved with it and its bound) "
        + _loop_rows_text(res)
        + "; FedCOF's server looped too (one rank-1 update per uploaded row, scaled by rows), the other methods' "
        "followed by privfed's server.",
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
        lines += [""] + _table(res["d256"], res, "The same at d = 256", "d256")
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
