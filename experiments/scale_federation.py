"""The scale benchmark's federation: the methods it times, the shapes, and the seeded iNat-like data.

:func:`inat_like` builds a synthetic federation of a given shape (K clients,
C classes, d features, about N samples in about M (client, class) pairs);
:data:`INAT` is the FedCOF paper's iNat-120K shape, :data:`D256` the d = 256
point, :data:`SMALL` the ``--small`` run.  :func:`method_spec` and
:func:`stated_params` name the parameters each timed method runs with.
Used by :mod:`experiments.bench_scale` and the tests of the scale path.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "D256",
    "INAT",
    "METHODS",
    "SECOND",
    "SMALL",
    "inat_like",
    "method_spec",
    "shape_of",
    "stated_params",
]

METHODS = ("fedncm", "fedlog", "fedcof", "fedcof-mm4", "fed3r", "fed3r-within", "fedcgs", "fedcof-oracle")
SECOND = {"fed3r", "fed3r-within", "fedcgs", "fedcof-oracle"}
#: The shapes: iNat-120K, and the d = 256 point (the test suite's scaled-down federation).
INAT = dict(K=9275, C=1203, d=1280, N=120000, M=54600)
D256 = dict(K=2000, C=300, d=256, N=26000, M=11800)
SMALL = dict(K=1000, C=300, d=256, N=13000, M=5900)


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
