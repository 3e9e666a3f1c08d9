"""Benchmark of pairwise masking at scale: the masked sum against the work it cannot skip.

**The masked sum against its floor** (``--clients`` K x each D in ``--values``, one run):

* plain: the float64 sum of the (K, D) stack;
* PRG: the AES-CTR expansions of D values the protocol needs, alone (each
  client a self mask and one mask per neighbour, the server one self mask
  per uploader);
* X25519: the key agreements it needs, alone (each client one channel key
  and one mask key per neighbour);
* masked: :func:`mechanisms.secagg.masking.masked_sum` end to end (key agreement,
  Shamir sharing, share encryption, masking, unmasking), and the same on
  D = 1 (its part that does not grow with the vector).

``ratio_to_floor`` = masked / (plain + PRG + X25519): every term of the
floor is work the protocol must do (no mask without its key, no key
without its agreement), so this is the ratio the target (<= 1.5) is set
on; ``vector_ratio`` = (masked - masked on D = 1) / (plain + PRG) is the
part that grows with the vector against the work that grows with it.
``ratio_to_plain_plus_prg`` (masked / (plain + PRG)) is reported, not
targeted: at small D the agreements alone exceed it.  Times are the least
CPU seconds of ``--repeats`` runs (one thread; robust on a shared machine).

The active protocol at 1,000 nodes over Flower messages, against its cryptographic floor, is
:mod:`experiments.bench_active_scale`.

``--record`` writes ``experiments/results/bench_secagg_scale.json``;
``tests/mechanisms/test_secagg_scale.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_secagg_scale.py [--clients 100] [--values 51200,204800] [--repeats 3]
[--record]``
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from mechanisms.secagg.masking import (  # noqa: E402
    masked_sum,
    prg_buffer,
    prg_uint64,
)
from privfed.commands.common import parse_int_list  # noqa: E402

#: Targets the record is checked against (tests/mechanisms/test_secagg_scale.py).
TARGET_RATIO = 1.5
FRAC_BITS = 32


def _best(fn, repeats: int) -> tuple[float, float, object]:
    """Least CPU seconds of ``repeats`` runs, that run's wall seconds and output."""
    best, wall, out = float("inf"), float("nan"), None
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        o = fn()
        dc, dt = time.process_time() - c, time.perf_counter() - t
        if dc < best:
            best, wall, out = dc, dt, o
    return best, wall, out


# --------------------------------------------------------------------------- part 1
def floor_rows(K: int, values: list[int], neighbours: int, repeats: int, seed: int) -> list[dict]:
    """The masked sum against plain + PRG + X25519, complete graph and SecAgg+, at each D."""
    rng = np.random.default_rng(seed)
    rows = []
    sk = [X25519PrivateKey.generate() for _ in range(2)]
    pk = [key.public_key() for key in sk]
    for D in values:
        X = rng.normal(size=(K, D))
        plain, _, _ = _best(lambda X=X: X.sum(axis=0), max(repeats, 10))
        for label, k in (("complete graph", None), (f"SecAgg+ k={neighbours}", neighbours)):
            deg = K - 1 if k is None else k
            n_prg = K * (deg + 1) + K
            key, buf = os.urandom(32), prg_buffer(D)
            prg, _, _ = _best(
                lambda n=n_prg, D=D: [prg_uint64(key, D, buf) for _ in range(n)] and None, repeats
            )
            n_agree = 2 * K * deg
            agree, _, _ = _best(
                lambda n=n_agree: [sk[i & 1].exchange(pk[(i >> 1) & 1]) for i in range(n)] and None, repeats
            )
            cpu, wall, res = _best(lambda X=X, k=k: masked_sum(X, neighbours=k, rng=rng), repeats)
            fixed, _, _ = _best(lambda X=X, k=k: masked_sum(X[:, :1], neighbours=k, rng=rng), repeats)
            rows.append(
                {
                    "variant": label,
                    "clients": K,
                    "values": D,
                    "neighbours": deg,
                    "plain_cpu_s": plain,
                    "prg_expansions": n_prg,
                    "prg_cpu_s": prg,
                    "x25519_agreements": n_agree,
                    "x25519_cpu_s": agree,
                    "masked_cpu_s": cpu,
                    "masked_wall_s": wall,
                    "masked_d1_cpu_s": fixed,
                    "ratio_to_floor": cpu / (plain + prg + agree),
                    "vector_ratio": (cpu - fixed) / (plain + prg),
                    "ratio_to_plain_plus_prg": cpu / (plain + prg),
                    "max_abs_error": float(np.abs(res.total - X.sum(axis=0)).max()),
                    "error_bound": K * 2.0 ** -(res.frac_bits + 1),
                }
            )
    return rows


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument(
        "--values", type=lambda s: parse_int_list(s, "--values", minimum=1), default=[51_200, 204_800]
    )
    p.add_argument("--neighbours", type=int, default=14, help="SecAgg+ degree (even)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_secagg_scale.json")
    a = p.parse_args(argv)
    if a.clients < 2 or a.repeats < 1 or min(a.values) < 1:
        p.error("--clients must be >= 2, --values and --repeats >= 1")
    data: dict = {
        "config": {
            "clients": a.clients,
            "values": a.values,
            "neighbours": a.neighbours,
            "repeats": a.repeats,
            "seed": a.seed,
            "target_ratio": TARGET_RATIO,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "numpy": np.__version__,
        }
    }
    rows = floor_rows(a.clients, a.values, a.neighbours, a.repeats, a.seed)
    data["floor"] = rows
    print(f"masked sum against its floor ({a.clients} clients; least CPU s of {a.repeats})\n")
    cols = ["variant", "values", "plain_cpu_s", "prg_cpu_s", "x25519_cpu_s", "masked_cpu_s"]
    print(markdown(rows, cols + ["ratio_to_floor", "vector_ratio", "ratio_to_plain_plus_prg"], ".4g"))
    if a.record:
        from experiments import recorded

        cmd = recorded.command("experiments/bench_secagg_scale.py", argv)
        print(f"recorded {recorded.save('bench_secagg_scale', data, cmd)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
