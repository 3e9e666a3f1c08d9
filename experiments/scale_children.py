"""The scale benchmark's fresh-process runs: one public call per process, its time and peak RSS.

:func:`run_child` starts ``experiments/bench_scale.py --child ...`` in a new
interpreter (so its time and VmHWM are that call's and nothing else's) and
reads the JSON line it prints; :func:`child` (``privfed.fit`` and the server),
:func:`child_rss` (the RSS a first fit adds, once more), :func:`child_curve`
(one scaling-curve point) and :func:`child_local_dp` (record-level DP with
local noise) are what such a child runs.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from experiments.scale_baselines import BOUND_REPEATS, best_of
from experiments.scale_federation import inat_like, method_spec, shape_of, stated_params

__all__ = [
    "SCRIPT",
    "child",
    "child_curve",
    "child_local_dp",
    "child_rss",
    "load_state",
    "run_child",
    "summary",
]

#: The script a child runs: its ``--child`` flags dispatch to the functions here.
SCRIPT = str(Path(__file__).with_name("bench_scale.py"))


# -- one public call in a fresh process ---------------------------------------------------
def _proc_status(key: str) -> int:
    """VmRSS / VmHWM of this process in bytes (VmHWM, unlike ru_maxrss, restarts at exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover - not Linux


def summary(samples) -> dict:
    """Every repeat's CPU seconds, their least, median and spread ((largest - least) / least)."""
    v = [float(x) for x in samples]
    lo = min(v)
    return {
        "samples": v,
        "best": lo,
        "median": float(np.median(v)),
        "spread": (max(v) - lo) / lo if lo else 0.0,
    }


def load_state() -> dict:
    """The machine's load, CPUs and BLAS threads (recorded beside each measurement)."""
    from threadpoolctl import threadpool_info

    blas = sorted({int(i.get("num_threads", 0)) for i in threadpool_info() if i.get("user_api") == "blas"})
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "blas_threads": blas,
    }


def _cpu(fn, calls: int = 1) -> tuple[float, float]:
    """(CPU, wall) seconds of one call of ``fn``: the mean over ``calls`` calls made back to back."""
    c, t = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.process_time() - c) / calls, (time.perf_counter() - t) / calls


#: A timed sample lasts at least this many CPU seconds: a call shorter than this (a server at d = 256
#: takes milliseconds) is repeated back to back within each sample and the mean kept, so that a sample is
#: not one call's cache state and timer noise.
MIN_SAMPLE_S = 0.05


def _calls(fn) -> int:
    """How many back-to-back calls of ``fn`` make one sample of at least :data:`MIN_SAMPLE_S` (from one
    call, which also warms it)."""
    c, _ = _cpu(fn)
    return max(1, min(1000, int(np.ceil(MIN_SAMPLE_S / max(c, 1e-6)))))


def _loop_summary(loops: list[dict]) -> dict:
    """The per-client loop's repeats: each timed part (``*_s``) summarised, the counts as the first run's."""
    return {
        key: summary([x[key] for x in loops]) if key.endswith("_s") else loops[0][key] for key in loops[0]
    }


def child(data: str, name: str, repeats: int, threads: int, loop_rows: int | None = None) -> dict:
    """``privfed.fit`` and the server, each interleaved with the parts of its bound, in this one process.

    First one fit for the peak RSS (VmHWM) and one under tracemalloc for the traced peak; then the
    statistics are folded as a server folds them and the bound's parts set up
    (:func:`experiments.scale_baselines.bound_calls`, the server's parts on the server's own class
    totals); then rounds of fit, the client's bound parts, the server (``Method.aggregate``) and the
    server's bound parts, one of each a round (A B A B):
    ``repeats`` rounds with fit, at least :data:`BOUND_REPEATS` with the server (milliseconds).  With
    ``loop_rows``, the seeds' per-client loop (:func:`experiments.scale_baselines.loop_once`, on the clients
    of the first ``loop_rows`` samples) follows the fit in each of the ``repeats`` rounds, so that it too is
    timed beside what it is compared with.  Every time is CPU seconds of this process on one BLAS thread;
    each keeps every repeat.
    """
    import privfed
    from experiments.scale_baselines import CLIENT_PARTS, SERVER_PARTS, bound_calls, loop_once
    from privfed.release.pipeline import fold_statistics

    before, F32, y, k, m = _set_up(data, name, threads)
    mname, params = method_spec(name)
    rss_input, peak, M_up = _first_fit(F32, y, k, name)
    tracemalloc.start()
    privfed.fit(mname, F32, y, k, random_state=0, **params)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    C, K = int(y.max()) + 1, int(k.max()) + 1
    folded = fold_statistics(m, F32, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(0))
    client_parts, server_parts = CLIENT_PARTS[name], SERVER_PARTS[name]
    # the server's parts read the server's own class totals (see bound_calls)
    calls, info = bound_calls(
        F32, y, k, set(client_parts) | set(server_parts), class_totals=folded.class_totals()
    )
    times: dict[str, list[float]] = {key: [] for key in ("fit", "server", *calls)}
    walls: dict[str, list[float]] = {"fit": [], "server": []}
    server = lambda: m.aggregate(folded)  # noqa: E731
    fit = lambda: privfed.fit(mname, F32, y, k, random_state=0, **params)  # noqa: E731
    per_sample = {key: _calls(fn) for key, fn in {"server": server, "fit": fit, **calls}.items()}
    loops: list[dict] = []
    for r in range(max(repeats, BOUND_REPEATS)):
        if r < repeats:
            c, w = _cpu(fit, per_sample["fit"])
            times["fit"].append(c)
            walls["fit"].append(w)
            for key in dict.fromkeys(client_parts):
                times[key].append(_cpu(calls[key], per_sample[key])[0])
            if loop_rows:
                loops.append(loop_once(F32, y, k, name, loop_rows))
        c, w = _cpu(server, per_sample["server"])
        times["server"].append(c)
        walls["server"].append(w)
        for key in dict.fromkeys(server_parts):
            times[key].append(_cpu(calls[key], per_sample[key])[0])
    parts = {key: summary(v) for key, v in times.items() if key not in ("fit", "server")}
    out = {
        "method": name,
        "fit": summary(times["fit"]),
        "server": summary(times["server"]),
        "fit_wall_s": min(walls["fit"]),
        "server_wall_s": min(walls["server"]),
        "peak_rss": peak,
        "rss_input": rss_input,
        "traced_peak": traced,
        "calls_per_sample": per_sample,
        **({"loop": _loop_summary(loops)} if loops else {}),
        "input_bytes": int(F32.nbytes),
        "M_uploaded": M_up,
        "parts": parts,
        "load_before": before,
        "load_after": load_state(),
        **info,
    }
    return out


def _set_up(data: str, name: str, threads: int):
    """What a child does before its first fit (the same in :func:`child` and :func:`child_rss`, so that their
    first fits start from the same process state): the BLAS threads, the modules the timing loads, the
    machine's load, the input, the method. Returns (load, F32, y, k, method)."""
    from threadpoolctl import threadpool_limits

    import experiments.scale_baselines  # noqa: F401  (child's imports, before the input is loaded)
    import privfed
    import privfed.release.pipeline  # noqa: F401

    threadpool_limits(threads)
    before = load_state()
    F32 = np.load(os.path.join(data, "F.npy"))
    y = np.load(os.path.join(data, "y.npy"))
    k = np.load(os.path.join(data, "k.npy"))
    mname, params = method_spec(name)
    return before, F32, y, k, privfed.methods.get(mname, **params)


def _first_fit(F32: np.ndarray, y: np.ndarray, k: np.ndarray, name: str) -> tuple[int, int, int]:
    """(RSS before, peak RSS during, M uploaded) of the process's first ``privfed.fit`` on the input, after a
    tiny fit has loaded what fit imports lazily and started the BLAS (its buffers are per process)."""
    import privfed

    mname, params = method_spec(name)
    warm = np.random.default_rng(0).random((60, F32.shape[1]), dtype=np.float32)
    privfed.fit(mname, warm, np.arange(60) % 3, np.arange(60) % 6, random_state=0, **params)
    rss_input = _proc_status("VmRSS")  # interpreter, privfed and the input: what fit adds is above this
    M_up = int(privfed.fit(mname, F32, y, k, random_state=0, **params).upload_bytes["M"])
    return rss_input, _proc_status("VmHWM"), M_up  # the peak read before anything else is allocated


def child_rss(data: str, name: str, threads: int) -> dict:
    """The RSS a process's first fit adds to it (``rss_input``, ``peak_rss``), after the set-up
    :func:`child` makes and nothing else (the same first fit :func:`child` measures, in a process of its
    own), and the glibc heap settings this process was started with (``heap``: the ``MALLOC_*``
    environment variables it saw)."""
    _, F32, y, k, _ = _set_up(data, name, threads)
    rss_input, peak, _ = _first_fit(F32, y, k, name)
    heap = {key: value for key, value in sorted(os.environ.items()) if key.startswith("MALLOC_")}
    return {"rss_input": rss_input, "peak_rss": peak, "heap": heap}


def child_curve(shape: dict, name: str, repeats: int, threads: int) -> dict:
    """``privfed.fit`` on a federation of ``shape`` (built here, seed 1), best of ``repeats``."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    import privfed

    F32, y, k = inat_like(**shape, seed=1)
    mname, params = method_spec(name)
    t = best_of(lambda: privfed.fit(mname, F32, y, k, random_state=0, **params), repeats)
    return {"method": name, "seconds": t, **shape_of(y, k)}


def child_local_dp(data: str, clients: int, repeats: int, threads: int, method: str = "fedncm") -> dict:
    """Record-level DP with local noise through ``privfed.fit``, on the first ``clients`` clients.

    Every client noises all C classes; fedncm's server folds the noisy uploads chunk by chunk,
    FedCOF's takes every noisy count first, then folds the noisy sums chunk by chunk into its
    spread: one release either way.  Bound: drawing the same noise alone in the same chunks, and
    for FedCOF also X^T X over the rows its spread takes (the kept cells, in blocks of one chunk's).
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    import privfed
    from mechanisms import GaussianMechanism
    from privfed.release.pipeline import UPLOAD_CHUNK_BYTES

    F32 = np.load(os.path.join(data, "F.npy"), mmap_mode="r")
    y = np.load(os.path.join(data, "y.npy"))
    k = np.load(os.path.join(data, "k.npy"))
    C, d = int(y.max()) + 1, F32.shape[1]
    rows = np.flatnonzero(k < clients)
    F, y, k = np.asarray(F32[rows]), y[rows], k[rows]
    rss_input = _proc_status("VmRSS")
    best_run, best_noise, best_xtx, head, mech = np.inf, np.inf, np.inf, None, None
    for _ in range(repeats):
        mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=float(np.sqrt(d)))
        t0 = time.process_time()
        head = privfed.fit(method, F, y, k, num_classes=C, num_clients=clients, privacy=mech, random_state=0)
        best_run = min(best_run, time.process_time() - t0)
        sig = mech.sigma
        t0 = time.process_time()  # the noise alone: the same values drawn in the same chunks, nothing else
        g = np.random.default_rng(1)
        for block, per in (("sums", C * d), ("counts", C)):
            step = max(1, UPLOAD_CHUNK_BYTES // (8 * per))
            for a in range(0, clients, step):
                shape = (min(step, clients - a), C, d) if block == "sums" else (min(step, clients - a), C)
                g.normal(0.0, sig[block], size=shape)
        best_noise = min(best_noise, time.process_time() - t0)
        if method == "fedcof":  # X^T X over the kept rows, in blocks of one chunk's kept rows
            kept = int(np.sum(head.extras["Kc"]))
            chunks = -(-clients // max(1, UPLOAD_CHUNK_BYTES // (8 * C * d)))
            X = np.random.default_rng(2).standard_normal((-(-kept // chunks), d))
            t0 = time.process_time()
            for _ in range(chunks):
                X.T @ X
            best_xtx = min(best_xtx, time.process_time() - t0)
    out = {
        "method": method,
        "params": stated_params(method),
        "clients": clients,
        "C": C,
        "d": d,
        "run_s": best_run,
        "noise_s": best_noise,
        "peak_rss": _proc_status("VmHWM"),
        "rss_input": rss_input,
        "releases": len({e.release_id for e in mech.ledger.events}),
        "sent_M": head.upload_bytes["M"],
        "guarantee": head.privacy.guarantee,
    }
    if method == "fedcof":
        out.update(xtx_s=best_xtx, kept_rows=int(np.sum(head.extras["Kc"])))
    return out


def run_child(args: list[str], threads: int, env: dict[str, str] | None = None) -> dict:
    """One child process's JSON result (``{"error": [...]}`` when it failed); ``env``: more environment
    variables for it (read by the C library at its start, such as glibc's heap settings)."""
    cmd = [sys.executable, SCRIPT, "--threads", str(threads)] + args
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), **(env or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])
