"""Benchmark: privfed.fit and every server at the FedCOF paper's iNat-120K scale, against each one's bound.

Builds a synthetic federation of the iNat-120K shape (K = 9,275 clients,
C = 1,203 classes, d = 1,280 as MobileNetV2, about 120K samples in about
54,600 (client, class) pairs; seeded, no data files): long-tailed class
popularity, each client holding a few classes, features ReLU(class mean +
client shift + noise) in float32.  Every method runs with the API's default
parameters (FedCOF's gamma = 1.0; each row states its parameters).  In one
run it measures, each in a fresh process (so time and peak RSS are the
public call's and nothing else's):

* ``privfed.fit`` on the float32 input, the call users make: wall time
  (best of ``--repeats``), peak RSS (VmHWM) and the memory it adds above the
  process with its input loaded, against the input's size (target 25 %);
* the server a Flower app or the sweep runs, ``Method.aggregate`` on the
  statistics folded as :class:`privfed.stats.StatsFold` folds the uploads;

and, in the same child process, interleaved with them, each method's bound - the
work the method must do, with the same BLAS
(:func:`experiments.scale_baselines.bound_calls`; fedncm's and fedlog's server
parts on the server's own class totals):

* client side, every method: one pass over the N x d float32 input, converted
  to float64 (the statistics are float64) and group-summed into the C class
  rows (the M pair rows for FedCOF); plus X^T X over the N samples for the
  second-moment methods (fed3r, fed3r-within, fedcgs, fedcof-oracle);
* server side: fedncm the C row norms of the class sums (one BLAS dot per
  row) and one pass scaling them; fedlog the same plus its one-dimensional
  root (Newton's method on C numbers; they factor nothing); fed3r one d x d Cholesky and the triangular solves of its
  d x C right-hand side; fed3r-within and the oracle X^T X over the C class
  rows (the between-class scatter) + Cholesky + solves; fedcgs (shrinkage > 0)
  two Cholesky factorisations (its covariance's own, which decides whether
  the PSD repair applies, and the shrunk one) + solves; FedCOF X^T X over the
  pair rows its spread multiplies (classes held by two or more clients) +
  Cholesky + solves.

A plain per-client Python loop computing the same uploads (timed on the
first clients holding ``--loop-rows`` samples and scaled by the sample ratio,
at d = 256 on every client; FedCOF's server looped as Eq. 6 is written) is
the naive baseline.  The same
table is measured at d = 256 (K = 2,000, C = 300), where fixed costs weigh
more; scaling curves of ``privfed.fit`` (K at fixed M and N, M, d) for FedCOF
and fed3r-within run one fresh process per point.  Record-level DP with local
noise is timed through ``privfed.fit`` on the first ``--dp-clients`` clients.

    python experiments/bench_scale.py            # full iNat-120K shape (minutes)
    python experiments/bench_scale.py --small    # K=1,000, C=300, d=256: seconds
    python experiments/bench_scale.py --methods fedncm,fedlog --rerecord experiments/bench_scale.json
                                                 # only those rows (both points) re-measured in place
                                                 # (--points d256: at d = 256 only)

Each run writes ``bench_scale.json`` (raw seconds and bytes) and
``bench_scale.md`` (:func:`render` of it) under ``--out``; the recorded run
the docs quote is ``experiments/bench_scale.json`` / ``.md`` (every time and
RSS is machine-dependent; ratios are within the run).

This script is the command line and the run's driver; its parts are
:mod:`experiments.scale_federation` (the methods, shapes and data),
:mod:`experiments.scale_baselines` (the bound and the per-client loop),
:mod:`experiments.scale_children` (one public call per fresh process) and
:mod:`experiments.scale_report` (the record's ratios and tables).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# BLAS threads are fixed before numpy or scipy load their OpenBLAS (threadpoolctl cannot
# reach a library loaded later); children inherit the environment.
_THREADS = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _THREADS

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.flag_types import count, name_list, out_path  # noqa: E402
from experiments.scale_baselines import (  # noqa: E402
    BOUND_REPEATS,
    CLIENT_PARTS,
    LAST_WALL,
    SERVER_PARTS,
    best_of,
    bound_for,
    bound_parts,
    client_bound,
    measure_bound,
    server_bound,
)
from experiments.scale_children import (  # noqa: E402
    child,
    child_curve,
    child_local_dp,
    child_rss,
    run_child,
)
from experiments.scale_federation import (  # noqa: E402
    D256,
    INAT,
    METHODS,
    SECOND,
    SMALL,
    inat_like,
    method_spec,
    shape_of,
    stated_params,
)
from experiments.scale_report import MEMORY_TARGET, method_ratios, render, reproduction, runs_of  # noqa: E402

#: The benchmark's parts live in experiments.scale_*; their names stay importable from here.
__all__ = [
    "BOUND_REPEATS",
    "CLIENT_PARTS",
    "D256",
    "INAT",
    "LAST_WALL",
    "MEMORY_TARGET",
    "METHODS",
    "SECOND",
    "SERVER_PARTS",
    "SMALL",
    "best_of",
    "bound_for",
    "bound_parts",
    "child",
    "child_curve",
    "child_local_dp",
    "client_bound",
    "fit_exponent",
    "inat_like",
    "main",
    "measure_bound",
    "measure_point",
    "method_ratios",
    "method_spec",
    "render",
    "run_child",
    "scaling",
    "server_bound",
    "shape_of",
    "stated_params",
]


# -- one shape: data, bound, every method, the loop ----------------------------------------------
#: Below this input size (the d = 256 point's 25 MiB) the RSS a fit adds is a few MiB, and under glibc's
#: defaults it moved by about 1 MiB between fresh processes and over minutes: glibc raises its mmap
#: threshold after a large block is freed, so whether a fit's temporaries come from fresh mappings or from
#: heap memory kept from earlier frees (and how much of that stays resident) depends on what the process
#: did before.  The record takes the RSS a first fit adds in :data:`RSS_PROCESSES` fresh processes that
#: hold the threshold at its default (:data:`RSS_HEAP_ENV`: every block of 128 KiB or more its own mapping,
#: returned when freed; one arena), so that what the RSS added counts does not depend on what the
#: allocator kept from before; its ratio is their median, and the timed process's reading under glibc's
#: defaults (0.2-0.25 of the input for most fits here, about 1 MiB more) is shown beside it.  Above it (the
#: main point's 586 MiB) the timed process's reading is the measure.
RSS_SAMPLES_BELOW = 64 * 2**20
RSS_PROCESSES = 9
#: The environment of the RSS processes (glibc reads it at start-up; ignored elsewhere).
RSS_HEAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "1"}


def measure_point(
    shape: dict, names, repeats: int, threads: int, loop_rows: int | None, tmp: str, label: str, parts=None
) -> dict:
    """One shape: its federation, then every method in a fresh process, timed interleaved with the parts
    of its own bound (:func:`experiments.scale_children.child`), then the per-client loop (on the clients
    of the first ``loop_rows`` samples; None: on every client, nothing scaled).  For an input under
    :data:`RSS_SAMPLES_BELOW` bytes the RSS the first fit adds is measured in :data:`RSS_PROCESSES` more
    fresh processes under :data:`RSS_HEAP_ENV` (:func:`experiments.scale_children.child_rss`), every sample
    kept in ``rss_samples``; a failed one is named in ``rss_error``."""
    t0 = time.perf_counter()
    F32, y, k = inat_like(**shape, seed=0)
    real = shape_of(y, k)
    if loop_rows is None:
        loop_rows = int(real["N"])
    print(f"[{label}] federation {real} d={shape['d']} built in {time.perf_counter() - t0:.1f} s", flush=True)
    for name, arr in (("F", F32), ("y", y), ("k", k)):
        np.save(os.path.join(tmp, f"{name}.npy"), arr)
    rows, bound = [], {}
    for name in names:
        r = run_child(
            ["--child", name, "--data", tmp, "--repeats", str(repeats), "--loop-rows", str(loop_rows)],
            threads,
        )
        r["method"] = name
        if "error" not in r and F32.nbytes < RSS_SAMPLES_BELOW:
            r["rss_samples"] = []
            for _ in range(RSS_PROCESSES):
                more = run_child(["--child", f"rss:{name}", "--data", tmp], threads, RSS_HEAP_ENV)
                if "error" in more:  # the timed row stands; the RSS is of the processes that ran
                    r["rss_error"] = more["error"]
                    break
                r["rss_samples"].append(more)
            if r["rss_samples"]:  # the heap the RSS processes saw (the timed one ran under the defaults)
                r["rss_heap"] = r["rss_samples"][0].get("heap", {})
        if "error" not in r:
            r["params"] = stated_params(name)
            r["fit_s"], r["server_s"] = r["fit"]["best"], r["server"]["best"]
            r["bound_parts"] = {q: v["best"] for q, v in r["parts"].items()}
            for q, v in r["bound_parts"].items():
                bound.setdefault(q, v)  # the header's parts: as first measured beside a method
            if "spread_rows" in r:
                bound["spread_rows"] = r["spread_rows"]
            r["bound_s"] = bound_for(name, r["bound_parts"])
            r["client_bound_s"] = client_bound(name, r["bound_parts"])
            r["server_bound_s"] = server_bound(name, r["bound_parts"])
            lp = {q: (v["best"] if isinstance(v, dict) else v) for q, v in r.pop("loop").items()}
            r["loop_client_s"] = lp["client_s"] * real["N"] / lp["rows"]
            r["loop_rows"] = lp["rows"]
            if "server_s" in lp:  # FedCOF: the looped server, scaled by the rows uploaded / rows done
                chol = r["bound_parts"]["cholesky_s"]
                r["loop_pairs"] = lp["pairs"]
                r["loop_server_s"] = lp["server_s"] * r["M_uploaded"] / lp["pairs"] + chol
                r["loop_server_class_gemm_s"] = (
                    lp["server_class_gemm_s"] * r["M_uploaded"] / lp["pairs"] + chol
                )
        rows.append(r)
        print(f"[{label}]", json.dumps({q: v for q, v in r.items() if q != "parts"}), flush=True)
    return {"shape": real, "d": shape["d"], "input_mib": F32.nbytes / 2**20, "bound": bound, "rows": rows}


def scaling(base: dict, repeats: int, threads: int) -> list[dict]:
    plans = {
        "K (M, N fixed)": [dict(base, K=int(base["K"] * f)) for f in (0.25, 0.5, 1.0)],
        "M (K fixed, N = 2.2 M)": [
            dict(base, M=int(base["M"] * f), N=int(base["N"] * f)) for f in (0.25, 0.5, 1.0)
        ],
        # d upwards from the base: the d^2 terms (X^T X) dominate the N d group sum only at larger d
        "d": [dict(base, d=int(base["d"] * f)) for f in (2.0, 4.0, 8.0)],
    }
    curves = []
    for curve, plan in plans.items():
        for name in ("fedcof", "fed3r-within"):
            xs, ts = [], []
            for p in plan:
                r = run_child(
                    [
                        "--child",
                        "curve",
                        "--curve-method",
                        name,
                        "--curve-shape",
                        json.dumps(p),
                        "--repeats",
                        str(repeats),
                    ],
                    threads,
                )
                if "error" in r:
                    raise RuntimeError(f"curve point {p} of {name} failed: {r['error']}")
                xs.append({"K (M, N fixed)": r["K"], "M (K fixed, N = 2.2 M)": r["M"], "d": p["d"]}[curve])
                ts.append(r["seconds"])
            curves.append(
                {"curve": curve, "method": name, "x": xs, "seconds": ts, "exponent": fit_exponent(xs, ts)}
            )
            print(json.dumps(curves[-1]), flush=True)
    return curves


def fit_exponent(x, t) -> float:
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(t, float)), 1)[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="K=1,000, C=300, d=256, N=13K (seconds)")
    p.add_argument("--methods", type=name_list(METHODS), default=",".join(METHODS))
    p.add_argument("--loop-rows", type=count(1), default=None, help="samples the per-client loop is timed on")
    p.add_argument("--repeats", type=count(1), default=3)
    p.add_argument("--no-curves", action="store_true")
    p.add_argument("--no-d256", action="store_true", help="skip the d = 256 table")
    p.add_argument(
        "--curve-repeats", type=count(1), default=None, help="repeats per scaling-curve point (min taken)"
    )
    p.add_argument(
        "--dp-clients",
        type=count(0),
        default=None,
        help="clients the local-DP release is timed on (scaled to K; default 400, 0: all)",
    )
    p.add_argument("--no-dp", action="store_true")
    p.add_argument("--dp-method", default="fedncm", help=argparse.SUPPRESS)
    p.add_argument(
        "--threads", type=count(1), default=1, help="BLAS threads for everything timed (default 1)"
    )
    p.add_argument(
        "--runs", type=count(1), default=2, help="independent runs recorded side by side (default 2)"
    )
    p.add_argument(
        "--dp-repeats", type=count(1), default=1, help="repeats of each local-DP release (least taken)"
    )
    p.add_argument("--out", type=out_path, default="results/bench_scale")
    p.add_argument(
        "--rerecord",
        default=None,
        help="a record (JSON): re-measure only --methods (rows, their bound parts) at --points, once for "
        "each of the record's runs, and replace their rows in it",
    )
    p.add_argument(
        "--points",
        default=None,
        help="with --rerecord: the points re-measured (main, d256 or both; default every point the record has)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--curve-method", default=None, help=argparse.SUPPRESS)
    p.add_argument("--curve-shape", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "local-dp":
        print(
            json.dumps(child_local_dp(args.data, args.dp_clients, args.repeats, args.threads, args.dp_method))
        )
        return 0
    if args.child == "curve":
        print(
            json.dumps(
                child_curve(json.loads(args.curve_shape), args.curve_method, args.repeats, args.threads)
            )
        )
        return 0
    if args.child and args.child.startswith("rss:"):
        print(json.dumps(child_rss(args.data, args.child[4:], args.threads)))
        return 0
    if args.child:
        print(json.dumps(child(args.data, args.child, args.repeats, args.threads, args.loop_rows)))
        return 0
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    shape = SMALL if args.small else INAT
    names = args.methods
    if args.rerecord:
        return rerecord(Path(args.rerecord), names, args, argv)
    loop_rows = args.loop_rows or (2000 if args.small else 6000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from experiments import recorded

    command = recorded.command("experiments/bench_scale.py", argv)  # without where the outputs go
    results = run_once(args, names, shape, loop_rows, out)
    results["command"] = command
    if args.runs > 1:  # independent runs, one after the other: each ratio is stated with its reproduction
        results["repeat_runs"] = [run_once(args, names, shape, loop_rows, out) for _ in range(args.runs - 1)]
        results["reproduction"] = reproduction(results)
    text = render(results)
    print(text)
    _write_atomic(out / "bench_scale.json", json.dumps(results, indent=1) + "\n")
    _write_atomic(out / "bench_scale.md", text + "\n")
    return 0


def run_once(args, names, shape: dict, loop_rows: int, out: Path) -> dict:
    """One independent run: both points, the local-DP release, the scaling curves."""
    points = {}
    dp = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        points["main"] = measure_point(shape, names, args.repeats, args.threads, loop_rows, tmp, "main")
        (out / "bench_scale.partial.json").write_text(json.dumps(points))  # survives an interrupted run
        if not args.no_dp:
            K = points["main"]["shape"]["K"]
            kdp = K if args.dp_clients == 0 else min(args.dp_clients or 400, K)
            for meth in ("fedncm", "fedcof"):
                for kk in sorted({max(1, kdp // 2), kdp}):  # two sizes: the peak RSS must not grow with K
                    r = run_child(
                        [
                            "--child",
                            "local-dp",
                            "--data",
                            tmp,
                            "--repeats",
                            str(args.dp_repeats),
                            "--dp-clients",
                            str(kk),
                            "--dp-method",
                            meth,
                        ],
                        args.threads,
                    )
                    print(json.dumps(r), flush=True)
                    dp.append(dict(r, method=meth))
        if not args.small and not args.no_d256:
            points["d256"] = measure_point(
                D256, names, args.repeats, args.threads, D256_LOOP_ROWS, tmp, "d256"
            )
            (out / "bench_scale.partial.json").write_text(json.dumps(points))
    curves = (
        []
        if args.no_curves
        else scaling(
            D256 if not args.small else dict(K=500, C=100, d=128, N=6500, M=3000),
            args.curve_repeats or args.repeats,
            args.threads,
        )
    )
    main_point = points["main"]
    return {
        "shape": main_point["shape"],
        "d": main_point["d"],
        "bound": main_point["bound"],
        "rows": main_point["rows"],
        "input_mib": main_point["input_mib"],
        "d256": points.get("d256"),
        "curves": curves,
        "local_dp": dp,
        "upload_chunk_mib": _upload_chunk_mib(),
        "small": args.small,
        "repeats": args.repeats,
        "threads": args.threads,
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "memory_target": MEMORY_TARGET,
        "machine_dependent": "every time and RSS (one run on one machine; ratios are within the run)",
    }


#: The per-client loop at d = 256 runs on every client (None), not on the first samples scaled up: a pass
#: there takes milliseconds, and timed on the clients of 2,000 of the 26,000 samples and scaled by 13, the
#: loop gave five of the seven ratios of the earlier record that a second run did not reproduce.
D256_LOOP_ROWS = None


def rerecord(path: Path, names, args, argv) -> int:
    """Re-measure ``names`` at the record's points, in every run of the record, and replace their rows (see
    ``--rerecord``).

    Each of the record's runs (the first and its ``repeat_runs``) gets its own later measurement, one
    after the other, so that the re-measured ratios are stated with their reproduction as the rest are.
    Each replaced row keeps its own bound (``bound_s``, ``client_bound_s``, ``server_bound_s``) and the
    parts it sums (``bound_parts``), measured beside it; the point's ``bound`` takes that measurement's
    value of every part no other method of the point uses; ``rerecorded`` says what was re-measured.
    """
    res = json.loads(path.read_text())
    parts = bound_parts(names)
    small = res.get("small", False)
    runs = runs_of(res)
    has_d256 = all(run.get("d256") for run in runs)
    if args.points is None:
        which = ["main", "d256"] if has_d256 else ["main"]
    else:
        which = [q for q in args.points.split(",") if q]
        if not which or set(which) - {"main", "d256"}:
            raise SystemExit(f"--points must name main and/or d256, got {args.points!r}")
        if "d256" in which and not has_d256:
            raise SystemExit(f"--points names d256 but {path} has no d = 256 point in every run")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for i, run in enumerate(runs):
            points = [("main", SMALL if small else INAT, run, 2000 if small else 6000)]
            if run.get("d256"):
                points.append(("d256", D256, run["d256"], D256_LOOP_ROWS))
            for label, shape, point, loop_rows in points:
                if label not in which:
                    continue
                print(f"re-measuring {', '.join(names)} at {label}, run {i + 1} of {len(runs)}", flush=True)
                fresh = measure_point(shape, names, args.repeats, args.threads, loop_rows, tmp, label, parts)
                by = {r["method"]: r for r in fresh["rows"]}  # each carries the bound parts timed beside it
                # the header keeps the parts that other methods of this point use, as first timed beside them
                others = {r["method"] for r in point["rows"]} - set(names)
                shared = {p for name in others for p in CLIENT_PARTS[name] + SERVER_PARTS[name]}
                point["rows"] = [by.get(r["method"], r) for r in point["rows"]]
                point["bound"].update({q: fresh["bound"][q] for q in parts - shared if q in fresh["bound"]})
    if len(runs) > 1:
        res["reproduction"] = reproduction(res)
    earlier = res.get("rerecorded")
    res["rerecorded"] = {
        "methods": names,
        "points": [q for q in ("main", "d256") if q in which],
        "runs": len(runs),
        "command": "python experiments/bench_scale.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "parts": sorted(parts),
        "note": "these methods' rows (at the points named) and the bound parts no other method of a point uses were "
        "re-measured later, once for each of the record's runs; each such row carries the bound parts it was "
        "measured against (bound_parts)",
    }
    if earlier:  # what an earlier rerecord re-measured stays stated
        res["rerecorded"]["earlier"] = [*earlier.pop("earlier", []), earlier]
    _write_atomic(path, json.dumps(res, indent=1) + "\n")
    _write_atomic(path.with_suffix(".md"), render(res) + "\n")
    return 0


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _upload_chunk_mib() -> float:
    from privfed.release.pipeline import UPLOAD_CHUNK_BYTES

    return UPLOAD_CHUNK_BYTES / 2**20


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
