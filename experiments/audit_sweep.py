"""Exhaustive black-box audit of every public DP configuration (method x level x noise placement x protocol).

Each configuration is run the way a user runs it (``privfed.fit`` with a mechanism and a protocol,
or the trade-off sweep's ``make_privacy`` path) on every pair of the neighbour battery of
:func:`privfed.audit.neighbour_battery`.  A deterministic difference between neighbours fails at
once; otherwise a linear test is learnt on held-out draws and a Clopper-Pearson lower bound from
fresh draws is compared with the report's composed claim (mu for reports computed in Gaussian DP).

Usage::

    PRIVFED_CACHE=.privfed-cache python -m experiments.audit_sweep --draws 400 --heldout 200 \\
        --out results/audit_sweep.md

Prints one row per (configuration, pair) and a summary line; exits non-zero if any audit fails.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings

import numpy as np

from mechanisms import GaussianMechanism
from mechanisms.secagg import CKKSAggregation, PairwiseMasking
from privfed.audit import audit_release, fit_release, neighbour_battery, tradeoff_release
from privfed.tradeoff import TradeoffConfig

SECOND = ("sums", "counts", "second")
METHODS = {
    "fedncm": ("sums", "counts"),
    "fed3r": SECOND,
    "fed3r-within": SECOND,
    "fedcgs": SECOND,
    "fedlog": ("sums", "counts"),
    "fedcof": ("sums", "counts"),
    "fedcof-oracle": ("sums", "counts"),
}
PLACEMENTS = ("local", "central", "mask", "ckks")


def configurations(eps: float, clip: float, methods, placements, backends, levels=("record", "client"),
                   tradeoff=True):
    """(name, run) of every configuration the public API accepts (refusals are audited too)."""
    for method in methods:
        for level in levels:
            for placement in placements:
                if level == "client" and placement == "local":
                    continue  # client level puts the noise on a sum: no local placement exists
                for backend in backends:
                    kw = dict(epsilon=eps, delta=1e-5, clip=clip, blocks=METHODS[method], level=level,
                              backend=backend)
                    if level == "client":
                        kw["max_records"] = 20
                    if placement == "central":
                        kw["trusted_aggregator"] = True
                    proto = {"mask": PairwiseMasking, "ckks": CKKSAggregation}.get(placement)
                    name = f"fit {method} {level} {placement} {backend}"
                    yield name, level, fit_release(method, (lambda kw=kw: GaussianMechanism(**kw)),
                                                   None if proto is None else proto)
    if not tradeoff:
        return
    # The trade-off command's path (make_privacy), including count noise (no claim for the means).
    for count in (None, "laplace"):
        cfg = TradeoffConfig(level="record", count_noise=count)
        yield f"tradeoff fedncm record count_noise={count}", "record", tradeoff_release(cfg, "fedncm", eps, clip)
    cfg = TradeoffConfig(level="client", max_records=20)
    yield "tradeoff fedncm client mask", "client", tradeoff_release(cfg, "fedncm", eps, clip, secure="mask")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eps", type=float, default=4.0)
    p.add_argument("--clip", type=float, default=3.0)
    p.add_argument("--draws", type=int, default=2000, help="fresh draws per side for each bound")
    p.add_argument("--heldout", type=int, default=1000, help="held-out draws per side (direction, threshold)")
    p.add_argument("--meta-draws", type=int, default=6)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    p.add_argument("--backends", default="numpy")
    p.add_argument("--levels", default="record,client")
    p.add_argument("--no-tradeoff", action="store_true", help="skip the trade-off path's configurations")
    p.add_argument("--pairs", default="all", help="'all' or comma-separated indices into the battery")
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = ["| configuration | pair | verdict | claimed eps | claimed mu | eps lower bound | mu lower bound | draws |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    failed = total = 0
    t0 = time.perf_counter()
    for name, level, run in configurations(a.eps, a.clip, a.methods.split(","), a.placements.split(","),
                                           a.backends.split(","), a.levels.split(","), not a.no_tradeoff):
        pairs = neighbour_battery(level)
        if a.pairs != "all":
            pairs = [pairs[int(i)] for i in a.pairs.split(",") if int(i) < len(pairs)]
        for r in audit_release(run, pairs, draws=a.draws, heldout=a.heldout, meta_draws=a.meta_draws):
            total += 1
            failed += r.flagged

            def f(x):
                return "" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"

            row = (f"| {name} | {r.pair} | {r.verdict}{' FAIL' if r.flagged else ''} | {f(r.claimed_eps)} | "
                   f"{f(r.claimed_mu)} | {f(r.eps_lb)} | {f(r.mu_lb)} | {r.draws} |")
            rows.append(row)
            print(row, flush=True)
    summary = f"{total} audits, {failed} failed, {time.perf_counter() - t0:.0f} s"
    print(summary)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write("\n".join(rows + ["", summary, ""]))
    return 1 if failed else 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
