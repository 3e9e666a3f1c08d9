"""Benchmark of pairwise masking at scale: the masked sum against the work it cannot skip.

Part 1, **the masked sum against its floor** (``--clients`` K x each D in ``--values``, one run):

* plain: the float64 sum of the (K, D) stack;
* PRG: the AES-CTR expansions of D values the protocol needs, alone (each
  client a self mask and one mask per neighbour, the server one self mask
  per uploader);
* X25519: the key work it needs, alone: each client draws two key pairs (its
  channel key and its mask key, a private key loaded and its public key
  derived: a scalar multiplication each) and agrees one channel key and one
  mask key with every neighbour;
* masked: :func:`mechanisms.secagg.masking.masked_sum` end to end (key agreement,
  Shamir sharing, share encryption, masking, unmasking) with the server a
  deployment runs (``keep_view=False``: each upload folded into the sum as
  it arrives, nothing kept for analysis), and the same on D = 1 (its part
  that does not grow with the vector);
* ring and KDF, the rest of the work no masked sum can skip, each alone: the
  ring work (each client encodes its D values into the ring and adds or
  subtracts its self mask and one mask per neighbour, the server adds each
  upload and removes each self mask: vector additions of D 64-bit words) and
  the key derivation (HKDF-SHA256 of every agreement, of each client's self-mask seed and of
  its rebuild at the server: a raw X25519 output is no key).

``ratio_to_floor`` = masked / (plain + PRG + X25519): every term of the
floor is work the protocol must do (no mask without its key, no key
without its agreement), so this is the ratio the target (<= 1.3) is set
on; ``vector_ratio`` = (masked - masked on D = 1) / (plain + PRG) is the
part that grows with the vector against the work that grows with it.
``ratio_to_plain_plus_prg`` (masked / (plain + PRG)) is reported, not
targeted: at small D the agreements alone exceed it.  ``ratio_to_work`` =
masked / (plain + PRG + X25519 + ring + KDF) is reported beside the target's
ratio, not instead of it: the floor leaves out the ring work and the key
derivation, which every masked sum does too, so this ratio is what the
implementation adds (Shamir sharing, share encryption, the protocol's
messages) on top of work that cannot be avoided.

Timing.  Every part runs on one BLAS thread (fixed before numpy loads, as
each node on its own machine would run) and is timed in CPU seconds of this
process (the work done, which other programs on a shared machine do not
add to, where wall time grows with them).  The parts are interleaved: each
of ``--repeats`` rounds times plain, PRG, X25519, masked and masked on D = 1
once for every graph and D, so a change in the machine's load falls on all
of them alike; each part records every repeat (``samples``), its least
(``best``), its median and its spread ((largest - least) / least), and the
ratios are given from the least and from the medians.  The machine's load
(``os.getloadavg``), CPU count and BLAS threads are recorded beside each
run.  ``--runs`` R (default 2) makes R independent runs, each in a fresh
interpreter one after the other, recorded side by side: a ratio is stated
as reproduced when every run's lies within 10 % of the others'.

The active protocol at 1,000 nodes over Flower messages and on Flower's simulation runtime, against
its cryptographic floor and Flower's SecAgg+, is :mod:`experiments.bench_active_scale` and
:mod:`experiments.bench_flower_masked`.

``--record`` writes ``experiments/results/bench_secagg_scale.json``;
``tests/mechanisms/test_secagg_scale.py`` checks its claims and that the docs quote it.

Run: ``python experiments/bench_secagg_scale.py [--clients 100] [--values 51200,204800] [--repeats 9]
[--runs 2] [--record]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# One BLAS thread for everything timed, fixed before numpy loads its OpenBLAS (the node process and
# the child runs inherit the environment).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import markdown  # noqa: E402  (the experiments' one table writer)
from experiments.flag_types import count, even_degree, int_list, name_list, seed  # noqa: E402
from experiments.scale_children import load_state as machine_state  # noqa: E402  (load, CPUs, BLAS threads)
from experiments.scale_children import summary  # noqa: E402  (every repeat, least, median, spread)
from mechanisms.secagg import fixed_point  # noqa: E402
from mechanisms.secagg.crypto import INFO_PAIR, MASK_BLOCK, hkdf  # noqa: E402
from mechanisms.secagg.masking import (  # noqa: E402
    masked_sum,
    prg_buffer,
    prg_uint64,
)

#: Targets the record is checked against (tests/mechanisms/test_secagg_scale.py).
TARGET_RATIO = 1.3
#: A ratio is reproduced when every independent run's lies within this share of the others'.
REPRODUCE = 0.10
FRAC_BITS = 32


def _cpu(fn) -> tuple[float, float, object]:
    """CPU and wall seconds of one call of ``fn``, and its output."""
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - t, out


# --------------------------------------------------------------------------- part 1
FLOOR_PARTS = ("plain", "prg", "x25519", "ring", "kdf", "masked", "masked_d1")


def ring_work(X: np.ndarray, deg: int, mask: np.ndarray) -> np.ndarray:
    """The ring work of a masked sum of the rows of ``X`` on a graph of degree ``deg``, alone: each client
    encodes its row and adds ``deg`` + 1 masks (its self mask, one per neighbour), a block of
    :data:`~mechanisms.secagg.crypto.MASK_BLOCK` values at a time (each block stays in a core's cache
    while its masks are added, as the masked sum adds them), the server adds each upload and removes its
    self mask (``mask`` stands for every keystream: the values do not change the cost)."""
    total = np.zeros(X.shape[1], dtype=np.uint64)
    for row in X:
        y = fixed_point.encode(row, FRAC_BITS)
        for a in range(0, y.size, MASK_BLOCK):
            part, m = y[a : a + MASK_BLOCK], mask[a : a + MASK_BLOCK]
            for _ in range(deg + 1):
                np.add(part, m, out=part)
        np.add(total, y, out=total)
        np.subtract(total, mask, out=total)
    return total


def floor_rows(K: int, values: list[int], neighbours: int, repeats: int, seed: int) -> list[dict]:
    """The masked sum against plain + PRG + X25519, complete graph and SecAgg+, at each D, interleaved."""
    rng = np.random.default_rng(seed)
    sk = [X25519PrivateKey.generate() for _ in range(2)]
    pk = [key.public_key() for key in sk]
    graphs = [("complete graph", None), (f"SecAgg+ k={neighbours}", neighbours)]
    cases = []
    for D in values:
        X = rng.normal(size=(K, D))
        for label, k in graphs:
            deg = K - 1 if k is None else k
            cases.append(
                {
                    "X": X,
                    "label": label,
                    "k": k,
                    "deg": deg,
                    "D": D,
                    "buf": prg_buffer(D),
                    "mask": prg_uint64(b"m" * 32, D),
                }
            )
    key = os.urandom(32)
    raws = [os.urandom(32) for _ in range(2 * K)]
    for c in cases:  # the first call of each kind loads what it imports lazily; not timed
        masked_sum(c["X"][:, :1], neighbours=c["k"], rng=rng, keep_view=False)
    times = [{p: [] for p in FLOOR_PARTS} for _ in cases]
    walls, results = [[] for _ in cases], [None] * len(cases)
    for _ in range(repeats):  # A B A B: every part once a round, every case once a round
        for i, c in enumerate(cases):
            X, k, D, buf = c["X"], c["k"], c["D"], c["buf"]
            n_prg, n_agree = K * (c["deg"] + 1) + K, 2 * K * c["deg"]
            n_kdf = n_agree + 2 * K  # channel and pair keys, each client's self mask, the server's rebuild
            t = times[i]
            t["plain"].append(_cpu(lambda X=X: X.sum(axis=0))[0])
            t["prg"].append(
                _cpu(lambda n=n_prg, D=D, buf=buf: [prg_uint64(key, D, buf) for _ in range(n)])[0]
            )
            t["x25519"].append(
                _cpu(
                    lambda n=n_agree: (
                        [X25519PrivateKey.from_private_bytes(r).public_key() for r in raws],
                        [sk[i & 1].exchange(pk[(i >> 1) & 1]) for i in range(n)],
                    )
                )[0]
            )
            t["ring"].append(_cpu(lambda X=X, c=c: ring_work(X, c["deg"], c["mask"]))[0])
            t["kdf"].append(
                _cpu(lambda n=n_kdf: [hkdf(raws[i % len(raws)], INFO_PAIR + key[:16]) for i in range(n)])[0]
            )
            cpu, wall, res = _cpu(lambda X=X, k=k: masked_sum(X, neighbours=k, rng=rng, keep_view=False))
            t["masked"].append(cpu)
            walls[i].append(wall)
            results[i] = res
            t["masked_d1"].append(
                _cpu(lambda X=X, k=k: masked_sum(X[:, :1], neighbours=k, rng=rng, keep_view=False))[0]
            )
    rows = []
    for c, t, wall, res in zip(cases, times, walls, results):
        parts = {p: summary(v) for p, v in t.items()}
        row = {
            "variant": c["label"],
            "clients": K,
            "values": c["D"],
            "neighbours": c["deg"],
            "prg_expansions": K * (c["deg"] + 1) + K,
            "x25519_agreements": 2 * K * c["deg"],
            "x25519_key_pairs": 2 * K,
            "kdf_derivations": 2 * K * c["deg"] + 2 * K,
            "parts": parts,
            "masked_wall_s": summary(wall),
            "max_abs_error": float(np.abs(res.total - c["X"].sum(axis=0)).max()),
            "error_bound": K * 2.0 ** -(res.frac_bits + 1),
        }
        for stat in ("best", "median"):
            q = {p: parts[p][stat] for p in FLOOR_PARTS}
            row[stat] = floor_ratios(q)
        rows.append(row)
    return rows


def floor_ratios(q: dict) -> dict:
    """The ratios of one set of part seconds (least or median): against the floor, the growing part."""
    return {
        "ratio_to_floor": q["masked"] / (q["plain"] + q["prg"] + q["x25519"]),
        "vector_ratio": (q["masked"] - q["masked_d1"]) / (q["plain"] + q["prg"]),
        "ratio_to_plain_plus_prg": q["masked"] / (q["plain"] + q["prg"]),
        "ratio_to_work": q["masked"] / (q["plain"] + q["prg"] + q["x25519"] + q["ring"] + q["kdf"]),
    }


# --------------------------------------------------------------------------- part 2
def one_run(a) -> dict:
    """One independent run of the parts not skipped (its machine state before and after)."""
    skip = set(a.skip)
    data: dict = {"machine_before": machine_state()}
    if "floor" not in skip:
        data["floor"] = floor_rows(a.clients, a.values, a.neighbours, a.repeats, a.seed)
    data["machine_after"] = machine_state()
    return data


def reproduction(runs: list[dict]) -> dict:
    """Each recorded ratio's values across the runs and their spread ((largest - least) / least)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for r in run.get("floor", []):
            for stat in ("best", "median"):
                values.setdefault(f"{r['variant']} D={r['values']} {stat} ratio_to_floor", []).append(
                    r[stat]["ratio_to_floor"]
                )
    out = {}
    for key, v in values.items():
        spread = (max(v) - min(v)) / min(v) if min(v) > 0 else float("inf")
        out[key] = {"values": v, "spread": spread, "reproduced": spread <= REPRODUCE}
    return out


def _report(run: dict, a) -> None:
    if "floor" in run:
        rows = [
            {
                "variant": r["variant"],
                "values": r["values"],
                **{p: r["parts"][p]["best"] for p in FLOOR_PARTS},
                "ratio": r["best"]["ratio_to_floor"],
                "ratio (medians)": r["median"]["ratio_to_floor"],
                "vs all work": r["best"]["ratio_to_work"],
                "masked spread": r["parts"]["masked"]["spread"],
            }
            for r in run["floor"]
        ]
        print(
            f"masked sum against its floor ({a.clients} clients; CPU s, least of {a.repeats}, interleaved)\n"
        )
        print(markdown(rows, list(rows[0]), ".4g"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=count(2), default=100)
    p.add_argument("--values", type=int_list(1), default=[51_200, 204_800])
    p.add_argument("--neighbours", type=even_degree, default=14, help="SecAgg+ degree in part 1 (even)")
    p.add_argument("--repeats", type=count(1), default=9, help="interleaved rounds of part 1")
    p.add_argument("--runs", type=count(1), default=2, help="independent runs, each in a fresh interpreter")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--skip",
        type=name_list(["floor"], empty=True),
        default="",
        help="comma-separated parts to skip: floor",
    )
    p.add_argument("--record", action="store_true", help="write experiments/results/bench_secagg_scale.json")
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one_run:
        print("RESULT " + json.dumps(one_run(a)), flush=True)
        return 0
    args = list(sys.argv[1:] if argv is None else argv)
    args = [x for x in args if x != "--record"]
    runs = []
    for i in range(a.runs):  # independent: a fresh interpreter each, one after the other
        print(f"run {i + 1} of {a.runs}", flush=True)
        proc = subprocess.run(
            [sys.executable, __file__, *args, "--one-run"], capture_output=True, text=True, check=False
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            return 1
        runs.append(json.loads(lines[-1][len("RESULT ") :]))
        _report(runs[-1], a)
    data: dict = {
        "config": {
            "clients": a.clients,
            "values": a.values,
            "neighbours": a.neighbours,
            "repeats": a.repeats,
            "runs": a.runs,
            "seed": a.seed,
            "target_ratio": TARGET_RATIO,
            "reproduce": REPRODUCE,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "numpy": np.__version__,
        },
        "runs": runs,
        "reproduction": reproduction(runs),
    }
    for key, r in data["reproduction"].items():
        print(f"{key}: {[round(v, 4) for v in r['values']]} spread {r['spread']:.1%}")
    if a.record:
        from experiments import recorded

        cmd = recorded.command("experiments/bench_secagg_scale.py", argv)
        print(f"recorded {recorded.save('bench_secagg_scale', data, cmd)}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
