"""The scale benchmark's baselines: each method's bound and the seeds' per-client loop.

:func:`measure_bound` times the work each method must do with the same BLAS
(least CPU seconds of at least :data:`BOUND_REPEATS` calls, :func:`best_of`);
:data:`CLIENT_PARTS` and :data:`SERVER_PARTS` say which parts make each
method's bound.  :func:`loop_once` times the naive per-client Python loop
computing the same uploads (FedCOF's server looped as Eq. 6 is written).
See :mod:`experiments.bench_scale` for what each part is.
"""

# The bound's lambdas time arrays deleted right after (ruff reads those as undefined names or late
# binding), as in the experiments/bench_*.py scripts.
# ruff: noqa: B023, F821

from __future__ import annotations

import time

import numpy as np

from experiments.scale_federation import METHODS, SECOND, method_spec

__all__ = [
    "BOUND_REPEATS",
    "CLIENT_PARTS",
    "LAST_WALL",
    "SERVER_PARTS",
    "best_of",
    "bound_calls",
    "bound_for",
    "bound_parts",
    "client_bound",
    "loop_once",
    "measure_bound",
    "server_bound",
]

#: Fewest repeats of the server and of each bound part (each is one BLAS call or one pass; their least CPU
#: time is the bound, and a loaded machine's page faults, cache misses and a busy sibling hyperthread only
#: ever add to it: with 5 the servers' ratios moved by up to 15 % between two runs).
BOUND_REPEATS = 11


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


def _sum_blocks(blocks, F) -> None:
    """Each block's group sums, one block's output alive at a time."""
    for b in blocks:
        b @ F


def bound_calls(F32, y, k, parts=None, class_totals=None) -> tuple[dict, dict]:
    """The bound's parts as calls, set up once, float64, with the BLAS every method uses: ``(calls, info)``.

    ``calls`` maps each part (``parts``, default all; see the module docstring) to a zero-argument call
    doing that work once; ``info`` holds the row counts of FedCOF's spread (``spread_rows``).  The
    server parts of fedncm and fedlog: ``norms_C_s`` the C row sums of squares of the class sums (one
    BLAS dot per row: a row is scaled by its own norm, so it is read for that norm before it is
    written), ``pass_C_s`` one pass scaling the C x d class sums into an output, and ``root_C_s``
    FedLog's one-dimensional root (:func:`privfed.methods.fedlog.map_multipliers`: Newton's method on C
    numbers, each evaluation O(C), to machine precision), which the MAP of Eq. 15 needs and no pass
    replaces.  The arrays the calls read stay alive with them (the float64 input: 2x the float32 one).

    ``class_totals`` (``(N, S)``, the server's own: ``stats.class_totals()`` of the folded statistics, which
    for folded statistics (one row, K = 1) are views of them) makes fedncm's and fedlog's server parts
    (``norms_C_s``, ``pass_C_s``, ``root_C_s``) read the very arrays the server reads, and ``pass_C_s``
    then writes a new C x d output each call, as a server returning its head must.  In a process that has
    run whole fits, FedLog's server (which reads S and writes one new C x d array, 11.7 MiB at the
    iNat-120K shape) took 5.1-5.6 ms beside bound parts of 3.2-3.4 ms on arrays of their own, and
    3.5-3.9 ms once they read its arrays and allocated as it does: the server and its bound must meet the
    same memory.
    """
    import scipy.linalg
    import scipy.sparse as sp

    import privfed
    from privfed._linalg import row_squares
    from privfed.methods.fedlog import map_multipliers

    want = set(parts) if parts is not None else None

    def wanted(key: str) -> bool:
        return want is None or key in want

    N, d = F32.shape
    C, K = int(y.max()) + 1, int(k.max()) + 1
    info: dict = {}
    calls: dict = {}
    needs_F = {"to_float64_s", "group_sum_C_s", "group_sum_M_s", "xtx_N_s"}
    onehot_C = sp.csr_matrix((np.ones(N), (y, np.arange(N))), shape=(C, N))
    if want is None or want & needs_F:
        F = np.asarray(F32, dtype=np.float64)
        _, pair = np.unique(k * C + y, return_inverse=True)
        pair = pair.reshape(-1)
        onehot_M = sp.csr_matrix((np.ones(N), (pair, np.arange(N))), shape=(int(pair.max()) + 1, N))
        # the group sums a block of output rows at a time (4 MiB): the fit folds its rows into outputs it
        # reuses, so a fresh M x d output (its page faults) is no part of the work
        step = max(1, 4 * 2**20 // (8 * d))
        blocks_C = [onehot_C[a : a + step] for a in range(0, C, step)]
        blocks_M = [onehot_M[a : a + step] for a in range(0, onehot_M.shape[0], step)]
        if wanted("group_sum_C_s"):
            calls["group_sum_C_s"] = lambda: _sum_blocks(blocks_C, F)
        if wanted("group_sum_M_s"):
            calls["group_sum_M_s"] = lambda: _sum_blocks(blocks_M, F)
        if wanted("xtx_N_s"):
            calls["xtx_N_s"] = lambda: F.T @ F
        if wanted("to_float64_s"):
            # the conversion's work, into memory already touched: fit converts chunk by chunk into one reused
            # buffer, so a fresh N x d allocation (its page faults) is no part of what it must do
            calls["to_float64_s"] = lambda: np.copyto(F, F32)
    Sc = np.asarray(onehot_C @ F32, dtype=np.float64)  # the class sums
    Nc = np.bincount(y, minlength=C).astype(float)
    if wanted("xtx_C_s"):
        calls["xtx_C_s"] = lambda: Sc.T @ Sc
    # fedncm's and fedlog's parts: on the server's own class totals when given, each pass into a fresh output
    Ns, Ss, buf = (Nc, Sc, np.empty_like(Sc)) if class_totals is None else (*class_totals, None)
    if wanted("pass_C_s"):
        calls["pass_C_s"] = lambda: np.multiply(Ss, (1.0 / Ns)[:, None], out=buf)
    if wanted("norms_C_s"):
        calls["norms_C_s"] = lambda: row_squares(Ss)
    if wanted("root_C_s"):
        A = (Ns * Ns + row_squares(Ss)) / 4.0  # FedLog's |a_y|^2 / 4 with its defaults (chi = 0, scale 1)
        calls["root_C_s"] = lambda: map_multipliers(A, 1.0 + float(Ns.sum()))
    if wanted("xtx_M_s") or wanted("xtx_M4_s"):
        rng = np.random.default_rng(0)  # fit's random_state=0: the same pseudo-clients
        pseudo, _ = privfed.methods.get("fedcof", means_per_client=4).row_groups(
            y, k, num_classes=C, num_clients=K, rng=rng
        )
        info["spread_rows"] = {"M": _spread_rows(k, y, C), "M4": _spread_rows(np.asarray(pseudo), y, C)}
        for key, m in info[
            "spread_rows"
        ].items():  # X^T X over the spread's rows (values do not change the cost)
            if wanted(f"xtx_{key}_s"):
                X = np.random.default_rng(1).standard_normal((m, d))
                calls[f"xtx_{key}_s"] = lambda X=X: X.T @ X
    if wanted("cholesky_s") or wanted("solve_C_s"):
        R = np.random.default_rng(2).standard_normal((2 * d, d))
        G = R.T @ R + np.eye(d)
        calls["cholesky_s"] = lambda: scipy.linalg.cho_factor(G, check_finite=False)
        factor = scipy.linalg.cho_factor(G, check_finite=False)
        B = np.ascontiguousarray(Sc.T)
        calls["solve_C_s"] = lambda: scipy.linalg.cho_solve(factor, B, check_finite=False)
    if want is not None:
        calls = {key: fn for key, fn in calls.items() if key in want}
    return calls, info


def measure_bound(F32, y, k, repeats: int, parts=None) -> dict:
    """The bound's parts (:func:`bound_calls`), each the least CPU time of at least :data:`BOUND_REPEATS`
    calls, timed one part after another (the benchmark itself times them interleaved with each method,
    :func:`experiments.scale_children.child`, where fedncm's and fedlog's server parts read the server's
    own class totals; here they read class sums of their own, into one reused output)."""
    calls, info = bound_calls(F32, y, k, parts)
    out, wall = {}, {}
    for key, fn in calls.items():
        out[key] = best_of(fn, max(repeats, BOUND_REPEATS))
        wall[key] = LAST_WALL[0]
    out.update(info)
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
    "fedncm": ("norms_C_s", "pass_C_s"),
    "fedlog": ("norms_C_s", "root_C_s", "pass_C_s"),
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


def bound_parts(names) -> set[str]:
    """The parts of :func:`measure_bound` the bounds of ``names`` sum (what a re-record of them measures)."""
    return {p for name in names for p in CLIENT_PARTS[name] + SERVER_PARTS[name]}


# -- the per-client loop baseline --------------------------------------------------------------
def loop_once(F32, y, k, name: str, loop_rows: int) -> dict:
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
    last = min(int(np.searchsorted(ends, loop_rows)), ends.size - 1)  # loop_rows >= N: every client
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
