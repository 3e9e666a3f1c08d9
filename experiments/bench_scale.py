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

and, in the parent process of the same run, each method's bound - the work
the method must do, with the same BLAS (:func:`measure_bound`):

* client side, every method: one pass over the N x d float32 input, converted
  to float64 (the statistics are float64) and group-summed into the C class
  rows (the M pair rows for FedCOF); plus X^T X over the N samples for the
  second-moment methods (fed3r, fed3r-within, fedcgs, fedcof-oracle);
* server side: fedncm and fedlog one pass over the C x d class sums (they
  factor nothing); fed3r one d x d Cholesky and the triangular solves of its
  d x C right-hand side; fed3r-within and the oracle X^T X over the C class
  rows (the between-class scatter) + Cholesky + solves; fedcgs (shrinkage > 0)
  two Cholesky factorisations (its covariance's own, which decides whether
  the PSD repair applies, and the shrunk one) + solves; FedCOF X^T X over the
  pair rows its spread multiplies (classes held by two or more clients) +
  Cholesky + solves.

A plain per-client Python loop computing the same uploads (timed on the
first clients holding ``--loop-rows`` samples and scaled by the sample ratio;
FedCOF's server looped as Eq. 6 is written) is the naive baseline.  The same
table is measured at d = 256 (K = 2,000, C = 300), where fixed costs weigh
more; scaling curves of ``privfed.fit`` (K at fixed M and N, M, d) for FedCOF
and fed3r-within run one fresh process per point.  Record-level DP with local
noise is timed through ``privfed.fit`` on the first ``--dp-clients`` clients.

    python experiments/bench_scale.py            # full iNat-120K shape (minutes)
    python experiments/bench_scale.py --small    # K=1,000, C=300, d=256: seconds

Each run writes ``bench_scale.json`` (raw seconds and bytes) and
``bench_scale.md`` (:func:`render` of it) under ``--out``; the recorded run
the docs quote is ``experiments/bench_scale.json`` / ``.md`` (every time and
RSS is machine-dependent; ratios are within the run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
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

METHODS = ("fedncm", "fedlog", "fedcof", "fedcof-mm4", "fed3r", "fed3r-within", "fedcgs", "fedcof-oracle")
SECOND = {"fed3r", "fed3r-within", "fedcgs", "fedcof-oracle"}
#: The shapes: iNat-120K, and the d = 256 point (the test suite's scaled-down federation).
INAT = dict(K=9275, C=1203, d=1280, N=120000, M=54600)
D256 = dict(K=2000, C=300, d=256, N=26000, M=11800)
SMALL = dict(K=1000, C=300, d=256, N=13000, M=5900)
#: Fewest repeats of each bound part (each is one BLAS call or one pass; their least CPU time is the
#: bound, and a loaded machine's page faults and cache misses only ever add to it).
BOUND_REPEATS = 5
#: Memory target: privfed.fit adds at most this fraction of its input.
MEMORY_TARGET = 0.25


def method_spec(name: str) -> tuple[str, dict]:
    """(registered name, parameters passed): the API's defaults, except FedCOF's 4 means a client."""
    if name == "fedcof-mm4":
        return "fedcof", {"means_per_client": 4}
    return name, {}


def stated_params(name: str) -> dict:
    """Every parameter the method ran with (defaults resolved), for the record."""
    import privfed

    mname, params = method_spec(name)
    return {k: v for k, v in privfed.methods.get(mname, **params).params.items()}


# -- the synthetic federation ----------------------------------------------------------
def inat_like(K: int, C: int, d: int, N: int, M: int, seed: int = 0):
    """(F float32 (N, d), labels, clients) with about M (client, class) pairs and N samples.

    Classes have Zipf(1) popularity; client k holds 1 + Poisson(M/K - 1) class
    draws; each pair gets 1 + Poisson(N/M - 1) samples; every client and class
    keeps at least one sample.  Features: ReLU(2 mu_c + 0.5 shift_k + noise).
    """
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, C + 1)
    pop /= pop.sum()
    per_client = 1 + rng.poisson(max(M / K - 1.0, 0.0) * 1.06, K)  # draws collide: aim a little high
    pc = np.repeat(np.arange(K), per_client)
    pk = rng.choice(C, size=pc.size, p=pop)
    if pk.size >= C:  # every class held somewhere
        pk[:C] = rng.permutation(C)
    key = np.unique(pc * C + pk)
    pc, pk = key // C, key % C
    n = 1 + rng.poisson(max(N / pc.size - 1.0, 0.0), pc.size)
    y = np.repeat(pk, n)
    k = np.repeat(pc, n)
    perm = rng.permutation(y.size)
    y, k = y[perm], k[perm]
    means = rng.standard_normal((C, d), dtype=np.float32)
    shift = rng.standard_normal((K, d), dtype=np.float32)
    F = np.empty((y.size, d), dtype=np.float32)
    step = 8192
    for a in range(0, y.size, step):
        b = min(a + step, y.size)
        blk = rng.standard_normal((b - a, d), dtype=np.float32)
        blk += 2.0 * means[y[a:b]]
        blk += 0.5 * shift[k[a:b]]
        np.maximum(blk, 0.0, out=blk)
        F[a:b] = blk
    # clients must be numbered 0..K-1 without gaps (privfed.fit refuses empty clients)
    k = np.unique(k, return_inverse=True)[1]
    y = np.unique(y, return_inverse=True)[1]
    return F, y.astype(np.int64), k.astype(np.int64)


def shape_of(y, k):
    C = int(y.max()) + 1
    return {"N": int(y.size), "K": int(k.max()) + 1, "C": C, "M": int(np.unique(k * C + y).size)}


# -- the bound -------------------------------------------------------------------------
#: Wall seconds of the last :func:`best_of` (best of its repeats), recorded beside the CPU seconds.
LAST_WALL = [0.0]


def best_of(fn, repeats: int) -> float:
    """Least CPU seconds of this process over ``repeats`` calls of ``fn`` (wall seconds in ``LAST_WALL``).

    With one BLAS thread and nothing else running in the process, CPU time is the work done and does
    not grow when other programs share the cores (the recording machine is shared); wall time does.
    """
    best, wall = np.inf, np.inf
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        best, wall = min(best, time.process_time() - c0), min(wall, time.perf_counter() - t0)
    LAST_WALL[0] = wall
    return best


def _spread_rows(groups, y, C: int) -> int:
    """Pair rows FedCOF's spread multiplies: those of classes held by two or more (pseudo-)clients."""
    key = np.unique(groups * C + y)
    Kc = np.bincount(key % C, minlength=C)
    return int(np.sum(Kc[key % C] >= 2))


def measure_bound(F32, y, k, repeats: int) -> dict:
    """The bound's parts, float64, with the BLAS every method uses (see the module docstring).

    Each is the least CPU time over at least :data:`BOUND_REPEATS` calls.
    """
    import scipy.linalg
    import scipy.sparse as sp

    import privfed

    N, d = F32.shape
    C, K = int(y.max()) + 1, int(k.max()) + 1
    F = np.asarray(F32, dtype=np.float64)
    _, pair = np.unique(k * C + y, return_inverse=True)
    M = int(pair.max()) + 1
    onehot_M = sp.csr_matrix((np.ones(N), (pair, np.arange(N))), shape=(M, N))
    onehot_C = sp.csr_matrix((np.ones(N), (y, np.arange(N))), shape=(C, N))
    Sc = np.asarray(onehot_C @ F)
    Nc = np.bincount(y, minlength=C).astype(float)
    rng = np.random.default_rng(0)  # fit's random_state=0: the same pseudo-clients
    pseudo, _ = privfed.methods.get("fedcof", means_per_client=4).row_groups(
        y, k, num_classes=C, num_clients=K, rng=rng
    )
    rows = {"M": _spread_rows(k, y, C), "M4": _spread_rows(np.asarray(pseudo), y, C)}
    out, wall = {}, {}
    repeats = max(repeats, BOUND_REPEATS)

    def part(key, fn):
        out[key] = best_of(fn, repeats)
        wall[key] = LAST_WALL[0]

    part("to_float64_s", lambda: np.asarray(F32, dtype=np.float64))
    part("group_sum_C_s", lambda: onehot_C @ F)
    part("group_sum_M_s", lambda: onehot_M @ F)
    part("xtx_N_s", lambda: F.T @ F)
    part("xtx_C_s", lambda: Sc.T @ Sc)
    del F, onehot_M, onehot_C
    buf = np.empty_like(Sc)
    part("pass_C_s", lambda: np.multiply(Sc, (1.0 / Nc)[:, None], out=buf))
    for key, m in rows.items():  # X^T X over the spread's rows (their values do not change the cost)
        X = np.random.default_rng(1).standard_normal((m, d))
        part(f"xtx_{key}_s", lambda: X.T @ X)
        del X
    A = np.random.default_rng(2).standard_normal((2 * d, d))
    G = A.T @ A + np.eye(d)
    part("cholesky_s", lambda: scipy.linalg.cho_factor(G, check_finite=False))
    factor = scipy.linalg.cho_factor(G, check_finite=False)
    B = np.ascontiguousarray(Sc.T)
    part("solve_C_s", lambda: scipy.linalg.cho_solve(factor, B, check_finite=False))
    out["spread_rows"] = rows
    out["wall"] = wall
    return out


#: What each method's client and server must do (keys of :func:`measure_bound`), see the module docstring.
CLIENT_PARTS = {
    name: (
        "to_float64_s",
        "group_sum_M_s" if name.startswith("fedcof") and name != "fedcof-oracle" else "group_sum_C_s",
    )
    + (("xtx_N_s",) if name in SECOND else ())
    for name in METHODS
}
SERVER_PARTS = {
    "fedncm": ("pass_C_s",),
    "fedlog": ("pass_C_s",),
    "fed3r": ("cholesky_s", "solve_C_s"),
    "fed3r-within": ("xtx_C_s", "cholesky_s", "solve_C_s"),
    "fedcof-oracle": ("xtx_C_s", "cholesky_s", "solve_C_s"),
    "fedcgs": ("cholesky_s", "cholesky_s", "solve_C_s"),
    "fedcof": ("xtx_M_s", "cholesky_s", "solve_C_s"),
    "fedcof-mm4": ("xtx_M4_s", "cholesky_s", "solve_C_s"),
}


def client_bound(name: str, b: dict) -> float:
    return sum(b[p] for p in CLIENT_PARTS[name])


def server_bound(name: str, b: dict) -> float:
    return sum(b[p] for p in SERVER_PARTS[name])


def bound_for(name: str, b: dict) -> float:
    return client_bound(name, b) + server_bound(name, b)


# -- one public call in a fresh process ---------------------------------------------------
def _proc_status(key: str) -> int:
    """VmRSS / VmHWM of this process in bytes (VmHWM, unlike ru_maxrss, restarts at exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover - not Linux


def child(data: str, name: str, repeats: int, threads: int) -> dict:
    """``privfed.fit`` (time, peak RSS), then the server on the folded statistics (time)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    import privfed
    from privfed.pipeline import fold_statistics

    F32 = np.load(os.path.join(data, "F.npy"))
    y = np.load(os.path.join(data, "y.npy"))
    k = np.load(os.path.join(data, "k.npy"))
    mname, params = method_spec(name)
    m = privfed.methods.get(mname, **params)
    # a tiny fit first loads what fit imports lazily and starts the BLAS (its buffers are per process)
    warm = np.random.default_rng(0).random((60, F32.shape[1]), dtype=np.float32)
    privfed.fit(mname, warm, np.arange(60) % 3, np.arange(60) % 6, random_state=0, **params)
    rss_input = _proc_status("VmRSS")  # interpreter, privfed and the input: what fit adds is above this
    M_up = []
    # best of repeats (CPU seconds, 1 BLAS thread; wall recorded beside): the machine may be shared
    fit_s = best_of(
        lambda: M_up.append(int(privfed.fit(mname, F32, y, k, random_state=0, **params).upload_bytes["M"])),
        repeats,
    )
    fit_wall = LAST_WALL[0]
    peak = _proc_status("VmHWM")  # before the server's statistics are folded below
    C, K = int(y.max()) + 1, int(k.max()) + 1
    folded = fold_statistics(m, F32, y, k, num_classes=C, num_clients=K, rng=np.random.default_rng(0))
    server_s = best_of(lambda: m.aggregate(folded), repeats)
    return {
        "method": name,
        "fit_s": fit_s,
        "server_s": server_s,
        "fit_wall_s": fit_wall,
        "server_wall_s": LAST_WALL[0],
        "peak_rss": peak,
        "rss_input": rss_input,
        "input_bytes": int(F32.nbytes),
        "M_uploaded": M_up[-1],
    }


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
    from privfed.pipeline import UPLOAD_CHUNK_BYTES

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


def run_child(args: list[str], threads: int) -> dict:
    cmd = [sys.executable, __file__, "--threads", str(threads)] + args
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the per-client loop baseline --------------------------------------------------------------
def loop_clients(F32, y, k, name: str, loop_rows: int) -> dict:
    """The seeds' per-client loop on the clients of the first ``loop_rows`` samples.

    Per client, per class Python work: each client's class sums and counts
    (and F_k^T F_k for the second-moment methods).  For FedCOF the server is
    looped too, as Eq. 5-6 are written: class totals, then one rank-1 update
    n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T per (client, class) row; a per-class
    variant (each class's rows stacked into one GEMM) is timed beside it.
    Returns CPU seconds and the samples / rows done (the caller scales).
    """
    C = int(y.max()) + 1
    d = F32.shape[1]
    order = np.argsort(k, kind="stable")
    ends = np.cumsum(np.bincount(k))
    last = int(np.searchsorted(ends, loop_rows))
    rows_done = int(ends[last])
    mname, params = method_spec(name)
    t0 = time.process_time()
    G = np.zeros((d, d))
    S = np.zeros((C, d))
    n = np.zeros(C)
    uploads = []
    start = 0
    for kk in range(last + 1):
        idx = order[start : ends[kk]]
        start = ends[kk]
        Fk = np.asarray(F32[idx], dtype=np.float64)
        yk = y[idx]
        classes = np.unique(yk)
        sums = np.stack([Fk[yk == c].sum(axis=0) for c in classes])
        cnt = np.array([np.sum(yk == c) for c in classes], dtype=float)
        if name == "fedcof-mm4":  # up to 4 means a class
            parts, pcls, pcnt = [], [], []
            for c in classes:
                rows = Fk[yk == c]
                g = max(1, min(4, rows.shape[0] // 2))
                for p in np.array_split(rows, g):
                    parts.append(p.sum(axis=0))
                    pcls.append(c)
                    pcnt.append(float(p.shape[0]))
            sums, classes, cnt = np.stack(parts), np.array(pcls), np.array(pcnt)
        if name in SECOND:
            if name == "fedcof-oracle":
                for c in classes:
                    Fc = Fk[yk == c]
                    G += Fc.T @ Fc
            else:
                G += Fk.T @ Fk
        if mname == "fedcof":
            uploads.append((classes, cnt, sums))
        else:
            S[classes] += sums
            n[classes] += cnt
    out = {"client_s": time.process_time() - t0, "rows": rows_done}
    if mname == "fedcof":
        from privfed.methods.fedcof import spread_weights

        t1 = time.process_time()
        Kc = np.zeros(C)
        for classes, cnt, sums in uploads:
            np.add.at(n, classes, cnt)
            np.add.at(S, classes, sums)
            np.add.at(Kc, classes, 1.0)
        mu = S / np.maximum(n, 1.0)[:, None]
        w = spread_weights(n, Kc)
        B = np.zeros((d, d))
        pairs = 0
        for classes, cnt, sums in uploads:
            for c, nc, sc in zip(classes, cnt, sums):
                diff = sc / nc - mu[c]
                B += (w[c] * nc) * np.outer(diff, diff)
                pairs += 1
        out["server_s"] = time.process_time() - t1
        out["pairs"] = pairs
        t2 = time.process_time()  # per class: the class's rows stacked, one GEMM each
        by_class: dict[int, list] = {}
        for classes, cnt, sums in uploads:
            for c, nc, sc in zip(classes, cnt, sums):
                by_class.setdefault(int(c), []).append(np.sqrt(w[c] * nc) * (sc / nc - mu[c]))
        B2 = np.zeros((d, d))
        for _c, rows in by_class.items():
            X = np.stack(rows)
            B2 += X.T @ X
        out["server_class_gemm_s"] = time.process_time() - t2
    return out


# -- one shape: data, bound, every method, the loop ----------------------------------------------
def measure_point(
    shape: dict, names, repeats: int, threads: int, loop_rows: int, tmp: str, label: str
) -> dict:
    t0 = time.perf_counter()
    F32, y, k = inat_like(**shape, seed=0)
    real = shape_of(y, k)
    print(f"[{label}] federation {real} d={shape['d']} built in {time.perf_counter() - t0:.1f} s", flush=True)
    for name, arr in (("F", F32), ("y", y), ("k", k)):
        np.save(os.path.join(tmp, f"{name}.npy"), arr)
    bound = measure_bound(F32, y, k, repeats)
    print(
        f"[{label}] bound parts:",
        {a: (round(b, 4) if isinstance(b, float) else b) for a, b in bound.items()},
        flush=True,
    )
    rows = []
    for name in names:
        r = run_child(["--child", name, "--data", tmp, "--repeats", str(repeats)], threads)
        r["method"] = name
        if "error" not in r:
            r["params"] = stated_params(name)
            lp = loop_clients(F32, y, k, name, loop_rows)
            r["loop_client_s"] = lp["client_s"] * real["N"] / lp["rows"]
            r["loop_rows"] = lp["rows"]
            if "server_s" in lp:  # FedCOF: the looped server, scaled by the rows uploaded / rows done
                r["loop_pairs"] = lp["pairs"]
                r["loop_server_s"] = lp["server_s"] * r["M_uploaded"] / lp["pairs"] + bound["cholesky_s"]
                r["loop_server_class_gemm_s"] = (
                    lp["server_class_gemm_s"] * r["M_uploaded"] / lp["pairs"] + bound["cholesky_s"]
                )
            r["bound_s"] = bound_for(name, bound)
            r["client_bound_s"] = client_bound(name, bound)
            r["server_bound_s"] = server_bound(name, bound)
        rows.append(r)
        print(f"[{label}]", json.dumps(r), flush=True)
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
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--loop-rows", type=int, default=None, help="samples the per-client loop is timed on")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-curves", action="store_true")
    p.add_argument("--no-d256", action="store_true", help="skip the d = 256 table")
    p.add_argument(
        "--curve-repeats", type=int, default=None, help="repeats per scaling-curve point (min taken)"
    )
    p.add_argument(
        "--dp-clients",
        type=int,
        default=None,
        help="clients the local-DP release is timed on (scaled to K; default 400, 0: all)",
    )
    p.add_argument("--no-dp", action="store_true")
    p.add_argument("--dp-method", default="fedncm", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help="BLAS threads for everything timed (default 1)")
    p.add_argument("--out", default="results/bench_scale")
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
    if args.child:
        print(json.dumps(child(args.data, args.child, args.repeats, args.threads)))
        return 0
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    shape = SMALL if args.small else INAT
    names = [m for m in args.methods.split(",") if m]
    loop_rows = args.loop_rows or (2000 if args.small else 6000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
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
                            "1",
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
            points["d256"] = measure_point(D256, names, args.repeats, args.threads, 2000, tmp, "d256")
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
    results = {
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
        "memory_target": MEMORY_TARGET,
        "command": "python experiments/bench_scale.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine_dependent": "every time and RSS (one run on one machine; ratios are within the run)",
    }
    text = render(results)
    print(text)
    _write_atomic(out / "bench_scale.json", json.dumps(results, indent=1) + "\n")
    _write_atomic(out / "bench_scale.md", text + "\n")
    return 0


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _upload_chunk_mib() -> float:
    from privfed.pipeline import UPLOAD_CHUNK_BYTES

    return UPLOAD_CHUNK_BYTES / 2**20


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
        f"over the C x d class sums {b['pass_C_s']:.4f}.",
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
        "X^T X over the N samples for fed3r, fed3r-within, fedcgs and the oracle; server: fedncm and fedlog one "
        "pass over the C x d class sums, fed3r Cholesky + solves, fed3r-within and the oracle X^T X over the C "
        "class rows + Cholesky + solves, fedcgs two Cholesky (its covariance's own, deciding the PSD repair, and "
        "the shrunk one) + solves, FedCOF X^T X over the pair rows its spread takes + Cholesky + solves). "
        f"fit's memory = peak RSS minus the RSS with the input loaded, over the input's bytes (target "
        f"{res.get('memory_target', MEMORY_TARGET):g}).",
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


if __name__ == "__main__":
    sys.exit(main())
