"""Benchmark: every method at the FedCOF paper's iNat-120K scale, against the BLAS bound.

Builds a synthetic federation of the iNat-120K shape (K = 9,275 clients,
C = 1,203 classes, d = 1,280 as MobileNetV2, about 120K samples in about
54,600 (client, class) pairs; seeded, no data files): long-tailed class
popularity, each client holding a few classes, features ReLU(class mean +
client shift + noise) in float32.  In one run it measures

* the bound: the group sum of the N x d features into the M pairs, plus
  X^T X over the rows the method needs (all N samples for the second-moment
  methods' clients; the M pair rows for FedCOF's server, the C class rows for
  the between-class scatter of fed3r-within, FedCGS and the oracle), plus one
  d x d Cholesky and, for every head G^-1 B, the two triangular solves of its
  d x C right-hand side - each timed here with the same BLAS (see
  :func:`measure_bound`);
* for every method, in a fresh subprocess (so peak RSS is the method's):
  ``privfed.fit``'s time split into input checks (float32 -> float64),
  client statistics (float32 converted and folded a chunk at a time, :func:`privfed.pipeline.fold_statistics`)
  and server (``Method.aggregate``), and the peak RSS against
  2 (N d + M d + d^2) floats plus the input features;
* a plain per-client Python loop computing the same uploads (timed on the
  first clients holding ``--loop-rows`` samples and scaled by the sample
  ratio - this is stated in the table) followed by the same server;
* scaling curves (K at fixed M and N, M at fixed K, d) on FedCOF and
  fed3r-within with the fitted log-log exponents.

    python experiments/bench_scale.py            # full iNat-120K shape (~6 GiB peak, minutes)
    python experiments/bench_scale.py --small    # K=1,000, C=300, d=256: seconds

It also times record-level DP with local noise (every client noises all C
classes; the server folds the noisy uploads chunk by chunk as one release)
against drawing the same noise alone, on the first ``--dp-clients`` clients
and scaled to K.  Each run writes ``bench_scale.json`` (raw seconds and
bytes) and ``bench_scale.md`` (:func:`render` of it) under ``--out``; the
recorded run the README quotes is ``experiments/bench_scale.json`` / ``.md``
(``--repeats 3 --curve-repeats 3``; every time and RSS is machine-dependent).
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


def method_spec(name: str) -> tuple[str, dict]:
    if name == "fedcof-mm4":
        return "fedcof", {"means_per_client": 4, "gamma": 0.1}
    if name == "fedcof":
        return "fedcof", {"gamma": 0.1}
    return name, {}


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
def best_of(fn, repeats: int) -> float:
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bound(F32, y, k, repeats: int) -> dict:
    """The bound's parts, float64, with the BLAS every method uses.

    Group sum (N x d -> M x d pairs, one sparse-dense product), X^T X over the
    N samples, the M pair rows and the C class rows, one d x d Cholesky, and
    the two triangular solves of a d x C right-hand side with that factor
    (every method but fedncm and fedlog returns G^-1 B, d x C: with C close to
    d those solves are 6 C / d times the Cholesky's flops, so a bound without
    them is below what such a head must cost).
    """
    import scipy.linalg
    import scipy.sparse as sp

    F = np.asarray(F32, dtype=np.float64)
    N, d = F.shape
    C = int(y.max()) + 1
    _, pair = np.unique(k * C + y, return_inverse=True)
    M = int(pair.max()) + 1
    onehot = sp.csr_matrix((np.ones(N), (pair, np.arange(N))), shape=(M, N))
    S = np.asarray(onehot @ F)
    Sc = np.asarray(sp.csr_matrix((np.ones(N), (y, np.arange(N))), shape=(C, N)) @ F)
    out = {
        "to_float64_s": best_of(lambda: np.asarray(F32, dtype=np.float64), repeats),
        "group_sum_s": best_of(lambda: onehot @ F, repeats),
        "xtx_N_s": best_of(lambda: F.T @ F, repeats),
        "xtx_M_s": best_of(lambda: S.T @ S, repeats),
        "xtx_C_s": best_of(lambda: Sc.T @ Sc, repeats),
    }
    G = F.T @ F + np.eye(d)
    out["cholesky_s"] = best_of(lambda: scipy.linalg.cho_factor(G, check_finite=False), repeats)
    factor = scipy.linalg.cho_factor(G, check_finite=False)
    B = np.ascontiguousarray(Sc.T)
    out["solve_C_s"] = best_of(lambda: scipy.linalg.cho_solve(factor, B, check_finite=False), repeats)
    return out


#: The parts of the bound each method's server needs (besides the clients' group sum and X^T X).
SERVER_PARTS = {
    "fedncm": ("cholesky_s",), "fedlog": ("cholesky_s",),
    "fed3r": ("cholesky_s", "solve_C_s"),
    "fed3r-within": ("xtx_C_s", "cholesky_s", "solve_C_s"), "fedcgs": ("xtx_C_s", "cholesky_s", "solve_C_s"),
    "fedcof-oracle": ("xtx_C_s", "cholesky_s", "solve_C_s"),
    "fedcof": ("xtx_M_s", "cholesky_s", "solve_C_s"), "fedcof-mm4": ("xtx_M_s", "cholesky_s", "solve_C_s"),
}


def client_bound(name: str, b: dict) -> float:
    """One pass of the group sum over the N x d samples, plus X^T X over them for the second-moment methods."""
    return b["group_sum_s"] + (b["xtx_N_s"] if name in SECOND else 0.0)


def server_bound(name: str, b: dict) -> float:
    return sum(b[p] for p in SERVER_PARTS[name])


def bound_for(name: str, b: dict) -> float:
    return client_bound(name, b) + server_bound(name, b)


# -- one method in a fresh process ---------------------------------------------------------
def _proc_status(key: str) -> int:
    """VmRSS / VmHWM of this process in bytes (VmHWM, unlike ru_maxrss, restarts at exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover - not Linux


def child(data: str, name: str, repeats: int, threads: int) -> dict:
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    import privfed
    from privfed._validation import check_dataset
    from privfed.pipeline import fold_statistics

    F32 = np.load(os.path.join(data, "F.npy"))
    y = np.load(os.path.join(data, "y.npy"))
    k = np.load(os.path.join(data, "k.npy"))
    rss_input = _proc_status("VmRSS")
    mname, params = method_spec(name)
    m = privfed.methods.get(mname, **params)
    best = [np.inf, np.inf, np.inf]
    for _ in range(repeats):  # best of repeats: the machine may be shared
        t0 = time.perf_counter()
        F, y2, k2, C, K = check_dataset(F32, y, k, keep_float32=True)  # as privfed.fit: float32 kept
        t1 = time.perf_counter()
        folded = fold_statistics(m, F, y2, k2, num_classes=C, num_clients=K, rng=np.random.default_rng(0))
        t2 = time.perf_counter()
        head = m.aggregate(folded)
        t3 = time.perf_counter()
        best = [min(b, t) for b, t in zip(best, (t1 - t0, t2 - t1, t3 - t2))]
        rows, notes = int(folded.folded_pairs), [n for n in head.notes if "Cholesky" in n or "eigen" in n]
        del F, folded, head  # freed before the next repeat, as the bound's results are
    return {
        "method": name, "check_s": best[0], "client_s": best[1], "server_s": best[2],
        "peak_rss": _proc_status("VmHWM"), "rss_input": rss_input,
        "rows": rows if mname == "fedcof" else None,
        "notes": notes,
        "M_uploaded": rows,
    }


def child_local_dp(data: str, clients: int, repeats: int, threads: int, method: str = "fedncm") -> dict:
    """Record-level DP with local noise, streamed, on the first ``clients`` clients (fedncm or fedcof).

    Times ``server_head`` (every client noises all C classes; fedncm's server folds the noisy uploads
    chunk by chunk, FedCOF's takes every noisy count first, then folds the noisy sums chunk by chunk
    into its spread: one release either way) against drawing the same noise alone, in the same
    chunks, and for FedCOF also against X^T X over the rows its spread takes (the kept cells, in
    blocks of the same size).
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads)
    import privfed
    from mechanisms import GaussianMechanism
    from privfed.pipeline import UPLOAD_CHUNK_BYTES, client_statistics, server_head

    F32 = np.load(os.path.join(data, "F.npy"), mmap_mode="r")
    y = np.load(os.path.join(data, "y.npy"))
    k = np.load(os.path.join(data, "k.npy"))
    C, d = int(y.max()) + 1, F32.shape[1]
    rows = np.flatnonzero(k < clients)
    F, y, k = np.asarray(F32[rows], dtype=np.float64), y[rows], k[rows]
    rss_input = _proc_status("VmRSS")
    m = privfed.methods.get(method, **({"gamma": 0.1} if method == "fedcof" else {}))
    best_run, best_noise, best_xtx, head = np.inf, np.inf, np.inf, None
    for _ in range(repeats):
        mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=float(np.sqrt(d)))
        rng = np.random.default_rng(0)
        stats = client_statistics(m, F, y, k, num_classes=C, num_clients=clients, rng=rng, privacy=mech)
        t0 = time.perf_counter()
        head = server_head(m, stats, num_clients=clients, rng=rng, privacy=mech)
        best_run = min(best_run, time.perf_counter() - t0)
        sig = mech.sigma
        t0 = time.perf_counter()  # the noise alone: the same values drawn in the same chunks, nothing else
        g = np.random.default_rng(1)
        for block, per in (("sums", C * d), ("counts", C)):
            step = max(1, UPLOAD_CHUNK_BYTES // (8 * per))
            for a in range(0, clients, step):
                shape = (min(step, clients - a), C, d) if block == "sums" else (min(step, clients - a), C)
                g.normal(0.0, sig[block], size=shape)
        best_noise = min(best_noise, time.perf_counter() - t0)
        if method == "fedcof":  # X^T X over the kept rows, in blocks of one chunk's kept rows
            kept = int(np.sum(head.extras["Kc"]))
            chunks = -(-clients // max(1, UPLOAD_CHUNK_BYTES // (8 * C * d)))
            X = np.random.default_rng(2).standard_normal((-(-kept // chunks), d))
            t0 = time.perf_counter()
            for _ in range(chunks):
                X.T @ X
            best_xtx = min(best_xtx, time.perf_counter() - t0)
    out = {"method": method, "clients": clients, "C": C, "d": d, "run_s": best_run, "noise_s": best_noise,
           "peak_rss": _proc_status("VmHWM"), "rss_input": rss_input,
           "releases": len({e.release_id for e in mech.ledger.events}),
           "sent_M": head.upload_bytes["M"], "guarantee": head.privacy.guarantee}
    if method == "fedcof":
        out.update(xtx_s=best_xtx, kept_rows=int(np.sum(head.extras["Kc"])))
    return out


def run_child(data: str, name: str, repeats: int, threads: int, dp_clients: int | None = None,
              dp_method: str = "fedncm") -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--data", data, "--repeats", str(repeats),
           "--threads", str(threads)] + ([] if dp_clients is None else ["--dp-clients", str(dp_clients),
                                                                        "--dp-method", dp_method])
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        return {"method": name, "error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the per-client loop baseline --------------------------------------------------------------
def loop_clients(F32, y, k, name: str, loop_rows: int) -> dict:
    """The seeds' per-client loop on the clients of the first ``loop_rows`` samples.

    Per client, per class Python work: each client's class sums and counts
    (and F_k^T F_k for the second-moment methods).  For FedCOF the server is
    looped too, as Eq. 5-6 are written: class totals, then one rank-1 update
    n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T per (client, class) row; a per-class
    variant (each class's rows stacked into one GEMM) is timed beside it.
    Returns seconds and the samples / rows done (the caller scales).
    """
    C = int(y.max()) + 1
    d = F32.shape[1]
    order = np.argsort(k, kind="stable")
    ends = np.cumsum(np.bincount(k))
    last = int(np.searchsorted(ends, loop_rows))
    rows_done = int(ends[last])
    mname, params = method_spec(name)
    t0 = time.perf_counter()
    G = np.zeros((d, d))
    S = np.zeros((C, d))
    n = np.zeros(C)
    uploads = []
    start = 0
    for kk in range(last + 1):
        idx = order[start:ends[kk]]
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
    out = {"client_s": time.perf_counter() - t0, "rows": rows_done}
    if mname == "fedcof":
        from privfed.methods.fedcof import spread_weights

        t1 = time.perf_counter()
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
        out["server_s"] = time.perf_counter() - t1
        out["pairs"] = pairs
        t2 = time.perf_counter()  # per class: the class's rows stacked, one GEMM each
        by_class: dict[int, list] = {}
        for classes, cnt, sums in uploads:
            for c, nc, sc in zip(classes, cnt, sums):
                by_class.setdefault(int(c), []).append(np.sqrt(w[c] * nc) * (sc / nc - mu[c]))
        B2 = np.zeros((d, d))
        for c, rows in by_class.items():
            X = np.stack(rows)
            B2 += X.T @ X
        out["server_class_gemm_s"] = time.perf_counter() - t2
    return out


# -- scaling curves ------------------------------------------------------------------------------
def fit_exponent(x, t) -> float:
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(t, float)), 1)[0])


def scaling(base: dict, repeats: int) -> list[dict]:
    import privfed
    from privfed._validation import check_dataset
    from privfed.pipeline import fold_statistics

    curves = []

    def time_fit(name, K, C, d, N, M):
        F32, y, k = inat_like(K, C, d, N, M, seed=1)
        F, y, k, C2, K2 = check_dataset(F32, y, k, keep_float32=True)
        m = privfed.methods.get(name)
        shp = shape_of(y, k)

        def go():
            m.aggregate(fold_statistics(m, F, y, k, num_classes=C2, num_clients=K2, rng=np.random.default_rng(0)))
        return best_of(go, repeats), shp

    plans = {
        "K (M, N fixed)": [dict(base, K=int(base["K"] * f)) for f in (0.25, 0.5, 1.0)],
        "M (K fixed, N = 2.2 M)": [dict(base, M=int(base["M"] * f), N=int(base["N"] * f)) for f in (0.25, 0.5, 1.0)],
        # d upwards from the base: the d^2 terms (X^T X) dominate the N d group sum only at larger d
        "d": [dict(base, d=int(base["d"] * f)) for f in (2.0, 4.0, 8.0)],
    }
    for curve, plan in plans.items():
        for name in ("fedcof", "fed3r-within"):
            xs, ts = [], []
            for p in plan:
                t, shp = time_fit(name, **p)
                x = {"K (M, N fixed)": shp["K"], "M (K fixed, N = 2.2 M)": shp["M"], "d": p["d"]}[curve]
                xs.append(x)
                ts.append(t)
            curves.append({"curve": curve, "method": name, "x": xs, "seconds": ts, "exponent": fit_exponent(xs, ts)})
    return curves


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="K=1,000, C=300, d=256, N=13K (seconds)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--loop-rows", type=int, default=None, help="samples the per-client loop is timed on")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-curves", action="store_true")
    p.add_argument("--curve-repeats", type=int, default=None, help="repeats per scaling-curve point (min taken)")
    p.add_argument("--dp-clients", type=int, default=None,
                   help="clients the local-DP release is timed on (scaled to K; default 400, 0: all)")
    p.add_argument("--no-dp", action="store_true")
    p.add_argument("--dp-method", default="fedncm", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help="BLAS threads for everything timed (default 1)")
    p.add_argument("--out", default="results/bench_scale")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "local-dp":
        print(json.dumps(child_local_dp(args.data, args.dp_clients, args.repeats, args.threads, args.dp_method)))
        return 0
    if args.child:
        print(json.dumps(child(args.data, args.child, args.repeats, args.threads)))
        return 0
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    shape = (dict(K=1000, C=300, d=256, N=13000, M=5900) if args.small
             else dict(K=9275, C=1203, d=1280, N=120000, M=54600))
    loop_rows = args.loop_rows or (2000 if args.small else 6000)
    t0 = time.perf_counter()
    F32, y, k = inat_like(**shape, seed=0)
    real = shape_of(y, k)
    print(f"federation {real} d={shape['d']} built in {time.perf_counter() - t0:.1f} s", flush=True)
    N, d = real["N"], shape["d"]
    names = [m for m in args.methods.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        np.save(os.path.join(tmp, "F.npy"), F32)
        np.save(os.path.join(tmp, "y.npy"), y)
        np.save(os.path.join(tmp, "k.npy"), k)
        bound = measure_bound(F32, y, k, args.repeats)
        print("bound parts:", {a: round(b, 4) for a, b in bound.items()}, flush=True)
        rows = []
        for name in names:
            r = run_child(tmp, name, args.repeats, args.threads)
            if "error" not in r:
                lp = loop_clients(F32, y, k, name, loop_rows)
                r["loop_client_s"] = lp["client_s"] * N / lp["rows"]
                r["loop_rows"] = lp["rows"]
                if "server_s" in lp:  # FedCOF: the looped server, scaled by the rows uploaded / rows done
                    r["loop_pairs"] = lp["pairs"]
                    r["loop_server_s"] = lp["server_s"] * r["M_uploaded"] / lp["pairs"] + bound["cholesky_s"]
                    r["loop_server_class_gemm_s"] = (lp["server_class_gemm_s"] * r["M_uploaded"] / lp["pairs"]
                                                     + bound["cholesky_s"])
                r["bound_s"] = bound_for(name, bound)
                r["client_bound_s"] = client_bound(name, bound)
                r["server_bound_s"] = server_bound(name, bound)
            rows.append(r)
            print(json.dumps(r), flush=True)
            Path(args.out).mkdir(parents=True, exist_ok=True)  # partial results survive an interrupted run
            (Path(args.out) / "bench_scale.partial.json").write_text(json.dumps({"bound": bound, "rows": rows}))
        dp = []
        if not args.no_dp:
            kdp = real["K"] if args.dp_clients == 0 else min(args.dp_clients or 400, real["K"])
            for meth in ("fedncm", "fedcof"):
                for kk in sorted({max(1, kdp // 2), kdp}):  # two sizes: the peak RSS must not grow with K
                    r = run_child(tmp, "local-dp", 1, args.threads, dp_clients=kk, dp_method=meth)
                    print(json.dumps(r), flush=True)
                    dp.append(r)
    curves = [] if args.no_curves else scaling(
        dict(K=2000, C=300, d=256, N=26000, M=11800) if not args.small else dict(K=500, C=100, d=128, N=6500, M=3000),
        args.curve_repeats or args.repeats)
    results = {"shape": real, "d": d, "bound": bound, "rows": rows, "curves": curves, "local_dp": dp,
               "upload_chunk_mib": _upload_chunk_mib(), "small": args.small, "repeats": args.repeats, "threads": args.threads, "cores": os.cpu_count(),
               "input_mib": F32.nbytes / 2**20, "command": "python experiments/bench_scale.py " + " ".join(
                   argv if argv is not None else sys.argv[1:]),
               "machine_dependent": "every time and RSS (one run on one machine; ratios are within the run)"}
    text = render(results)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_scale.md").write_text(text + "\n")
    (out / "bench_scale.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _upload_chunk_mib() -> float:
    from privfed.pipeline import UPLOAD_CHUNK_BYTES

    return UPLOAD_CHUNK_BYTES / 2**20


def method_ratios(r: dict, bound: dict, budget: float) -> dict:
    """The table's ratios of one method's row (all from the raw seconds and bytes of one run)."""
    fit_s = r["client_s"] + r["server_s"]
    loop_s = r["loop_client_s"] + r.get("loop_server_s", r["server_s"])
    out = {
        "fit_bound": fit_s / r["bound_s"],
        "client_bound": r["client_s"] / r["client_bound_s"],
        "server_bound": r["server_s"] / r["server_bound_s"],
        "loop_fit": loop_s / fit_s,
        "loop_bound": loop_s / r["bound_s"],
        "rss_budget": r["peak_rss"] / (budget + r["rss_input"]),
    }
    if "loop_server_class_gemm_s" in r:
        out["class_gemm_loop_fit"] = (r["loop_client_s"] + r["loop_server_class_gemm_s"]) / fit_s
    return out


def render(res: dict) -> str:
    """The markdown tables of one run (README's scale section is this text)."""
    real, d, bound, rows = res["shape"], res["d"], res["bound"], res["rows"]
    N, M = real["N"], real["M"]
    budget = 2 * (N * d + M * d + d * d) * 8
    done = [r for r in rows if "error" not in r]
    lines = [
        f"iNat-120K-shaped synthetic federation: N={N:,}, K={real['K']:,}, C={real['C']:,}, d={d:,}, M={M:,} "
        f"(float32 input {res['input_mib']:.0f} MiB); {res['cores']} cores, {res['threads']} BLAS thread(s), "
        f"best of {res['repeats']}; command: {res['command']}; times and RSS are machine-dependent, ratios are "
        "within this run.",
        f"bound = client: group sum {bound['group_sum_s']:.3f} s (+ X^T X over the N samples {bound['xtx_N_s']:.3f} s "
        f"for the second-moment methods); server: Cholesky {bound['cholesky_s']:.3f} s (+ the triangular solves of "
        f"the d x C right-hand side {bound['solve_C_s']:.3f} s for every head G^-1 B, + X^T X over the M pair rows "
        f"{bound['xtx_M_s']:.3f} s for FedCOF or over the C class rows {bound['xtx_C_s']:.3f} s for fed3r-within, "
        f"FedCGS and the oracle); float32 -> float64 of the whole input {bound['to_float64_s']:.3f} s (not in the "
        "bound).",
        f"loop = the seeds' per-client loop (per client, per class Python work), timed on the clients of the first "
        f"{done[0]['loop_rows'] if done else 0:,} samples and scaled by N / samples; FedCOF's server looped too "
        "(one rank-1 update per uploaded row, scaled by rows), the other methods' followed by privfed's server. "
        "loop / bound is the most any implementation at the bound could gain over that loop.",
        "",
        "| method | check s | client s | server s | fit / bound | client / its bound | server / its bound "
        "| loop / fit | loop / bound | peak RSS GiB | RSS / (2(Nd+Md+d^2) floats + input) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} |")
            continue
        q = method_ratios(r, bound, budget)
        lines.append(
            f"| {r['method']} | {r['check_s']:.2f} | {r['client_s']:.2f} | {r['server_s']:.2f} | "
            f"{q['fit_bound']:.2f} | {q['client_bound']:.2f} | {q['server_bound']:.2f} | {q['loop_fit']:.1f} | "
            f"{q['loop_bound']:.1f} | "
            f"{r['peak_rss'] / 2**30:.2f} | {q['rss_budget']:.2f} |"
        )
    gemm = [(r["method"], method_ratios(r, bound, budget)["class_gemm_loop_fit"]) for r in done
            if "loop_server_class_gemm_s" in r]
    if gemm:
        lines += ["", "FedCOF against a per-class loop (each class's uploaded rows stacked into one GEMM instead of "
                  "rank-1 updates): " + ", ".join(f"{m} loop / fit {v:.1f}" for m, v in gemm) + "."]
    dp = [r for r in res.get("local_dp", []) if "error" not in r]
    if dp:
        K, C = real["K"], real["C"]
        lines += [
            "",
            f"Record-level DP with local noise (GaussianMechanism eps=1, delta=1e-5): every client noises all "
            f"C = {C:,} classes, so it sends C (d + 1) = {C * (d + 1):,} values whatever it holds "
            f"({K:,} clients: {K * C * (d + 1) * 4 / 2**30:.1f} GiB in float32). fedncm's server folds the noisy "
            "uploads chunk by chunk; FedCOF's takes every client's noisy counts first (K C values), then folds the "
            "noisy sums chunk by chunk into its spread, each kept cell a row of X^T X: one release either way. "
            "Timed on the first clients (d and C of the full shape) and scaled to K by K / clients (each client's "
            "work is the same C (d + 1) draws); bound = the noise alone, plus for FedCOF X^T X over the kept rows "
            "in blocks of one chunk's:",
            "",
            "| method | clients | release s | noise alone s | X^T X over kept rows s | release / bound | scaled to K s "
            "| peak RSS GiB | RSS - input GiB | releases booked |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in dp:
            xtx = r.get("xtx_s", 0.0)
            lines.append(
                f"| {r.get('method', 'fedncm')} | {r['clients']:,} | {r['run_s']:.2f} | {r['noise_s']:.2f} | "
                f"{f'{xtx:.2f}' if 'xtx_s' in r else '-'} | {r['run_s'] / (r['noise_s'] + xtx):.2f} | "
                f"{r['run_s'] * K / r['clients']:.0f} | {r['peak_rss'] / 2**30:.2f} | "
                f"{(r['peak_rss'] - r['rss_input']) / 2**30:.2f} | {r['releases']} |"
            )
        for meth in dict.fromkeys(r.get("method", "fedncm") for r in dp):
            mine = [r for r in dp if r.get("method", "fedncm") == meth]
            if len(mine) > 1:
                big, small = max(mine, key=lambda r: r["clients"]), min(mine, key=lambda r: r["clients"])
                lines += ["", (
                    f"{meth}: peak RSS above the input at {big['clients']:,} clients / at {small['clients']:,}: "
                    f"{(big['peak_rss'] - big['rss_input']) / max(small['peak_rss'] - small['rss_input'], 1):.2f} "
                    f"(chunks of {res.get('upload_chunk_mib', 16):g} MiB of uploads"
                    + ("; FedCOF also holds the K C noisy counts)." if meth == "fedcof" else
                       ": memory independent of K)."))]
    curves = res.get("curves") or []
    if curves:
        lines += ["", "Scaling curves (fit time, min over repeats; fitted log-log exponent):", "",
                  "| curve | method | x | seconds | fitted exponent |", "| --- | --- | --- | --- | --- |"]
        for c in curves:
            lines.append(f"| {c['curve']} | {c['method']} | {c['x']} | {[round(t, 3) for t in c['seconds']]} | "
                         f"{c['exponent']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
