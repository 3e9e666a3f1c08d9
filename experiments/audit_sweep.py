"""Exhaustive black-box audit of every public DP configuration (method x level x noise placement x protocol).

Each configuration is run the way a user runs it (``privfed.fit`` with a mechanism and a protocol,
or the trade-off sweep's ``make_privacy`` path) on every pair of the neighbour battery of
:func:`privfed.audit.neighbour_battery`.  A difference constant over every metadata draw of both
sides fails at once; otherwise a linear test (released values and random metadata) is learnt on
held-out draws and a Clopper-Pearson lower bound from fresh draws is compared with the report's
composed claim (mu for reports computed in Gaussian DP, epsilon otherwise, e.g. with Poisson client
sampling).  CKKS costs about a second per release, so its configurations are checked for
deterministic differences on the first pair of each level only (``--ckks-draws`` to add a bound).

Usage (the committed results and the README table)::

    PRIVFED_CACHE=.privfed-cache python -m experiments.audit_sweep --draws 200 --heldout 100 \\
        --json experiments/audit_sweep_results.json

    python -m experiments.audit_sweep --table experiments/audit_sweep_results.json   # the README table

Prints one row per (configuration, pair) and a summary line; exits non-zero if any audit fails.

The auditor's own test (broken variants it must flag, beside the real releases, over 5 seeds)::

    python -m experiments.audit_sweep --broken --json experiments/audit_broken_results.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

# the repository root, so that ``python experiments/audit_sweep.py`` runs as ``python -m experiments.audit_sweep``
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.audit_broken import broken_catalogue  # noqa: E402
from mechanisms import GaussianMechanism  # noqa: E402
from mechanisms.secagg.protection import CKKSAggregation, PairwiseMasking  # noqa: E402
from privfed.audit import (  # noqa: E402
    MIN_META_DRAWS,
    audit_release,
    fit_release,
    neighbour_battery,
    tradeoff_release,
)
from privfed.tradeoff import TradeoffConfig  # noqa: E402

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
#: Poisson client sampling rate of the sampled configurations (client level, trusted aggregator).
SAMPLING = 0.25


def configurations(
    eps: float,
    clip: float,
    methods,
    placements,
    backends,
    levels=("record", "client"),
    tradeoff=True,
    sampling=SAMPLING,
):
    """(name, level, placement, run) of every configuration the public API accepts (refusals audited too)."""
    for method in methods:
        for level in levels:
            for placement in placements:
                if level == "client" and placement == "local":
                    continue  # client level puts the noise on a sum: no local placement exists
                for backend in backends:
                    kw = dict(
                        epsilon=eps,
                        delta=1e-5,
                        clip=clip,
                        blocks=METHODS[method],
                        level=level,
                        backend=backend,
                    )
                    if level == "client":
                        kw["max_records"] = 20
                    if placement == "central":
                        kw["trusted_aggregator"] = True
                    proto = {"mask": PairwiseMasking, "ckks": CKKSAggregation}.get(placement)
                    name = f"fit {method} {level} {placement} {backend}"
                    yield (
                        name,
                        level,
                        placement,
                        fit_release(
                            method, (lambda kw=kw: GaussianMechanism(**kw)), None if proto is None else proto
                        ),
                    )
                    if placement == "central" and sampling < 1:
                        skw = dict(kw, sampling_rate=sampling)
                        yield (
                            f"fit {method} {level} central sampled q={sampling:g} {backend}",
                            level,
                            "sampled",
                            fit_release(method, (lambda kw=skw: GaussianMechanism(**kw))),
                        )
    if not tradeoff:
        return
    # The trade-off command's path (make_privacy), including count noise (no claim for the means).
    for count in (None, "laplace"):
        cfg = TradeoffConfig(level="record", count_noise=count)
        yield (
            f"tradeoff fedncm record count_noise={count}",
            "record",
            "tradeoff",
            tradeoff_release(cfg, "fedncm", eps, clip),
        )
    cfg = TradeoffConfig(level="client", max_records=20)
    yield (
        "tradeoff fedncm client mask",
        "client",
        "tradeoff",
        tradeoff_release(cfg, "fedncm", eps, clip, secure="mask"),
    )


def _group(row: dict) -> str:
    """The README group of a configuration row."""
    name, level, placement = row["configuration"], row["level"], row["placement"]
    if name.startswith("tradeoff"):
        return "trade-off path (fedncm; record level, count noise, client level with masking)"
    what = {
        "local": "local noise",
        "central": "trusted aggregator",
        "mask": "pairwise masking",
        "ckks": "CKKS (metadata only, first pair)",
        "sampled": "trusted aggregator, Poisson client sampling",
    }[placement]
    return f"`fit`, {level} level, {what}"


def readme_table(results: dict) -> str:
    """The README's audit table, from the sweep's JSON results (one row per group of configurations)."""
    groups: dict[str, list] = defaultdict(list)
    for r in results["rows"]:
        groups[_group(r)].append(r)

    def num(x, digits=3):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"

    lines = [
        (
            "| configuration | methods | audits (statistical / metadata only / refused / no claim) | "
            "claimed ε | largest ε lower bound | largest μ lower bound (claimed μ) | draws per side |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in sorted(groups):
        rows = groups[g]
        stat = [r for r in rows if r["verdict"] == "statistical"]
        counts = [
            sum(r["verdict"] == v for r in rows)
            for v in ("statistical", "metadata only", "refused", "no claim")
        ]
        methods = sorted({r["configuration"].split()[1] for r in rows if r["verdict"] != "refused"})
        claims = sorted({round(r["claimed_eps"], 3) for r in stat})
        mus = sorted({round(r["claimed_mu"], 3) for r in stat if r["claimed_mu"] is not None})
        eps_lb = max((r["eps_lb"] for r in stat), default=None)
        mu_lb = max((r["mu_lb"] for r in stat), default=None)
        draws = sorted({r["draws"] for r in stat})
        lines.append(
            f"| {g} | {', '.join(methods) or 'none (refused)'} | {' / '.join(map(str, counts))} | "
            f"{', '.join(f'{c:.3f}' for c in claims) or '–'} | {num(eps_lb)} | "
            f"{num(mu_lb)}{f' ({mus[0]:.3f})' if len(mus) == 1 else ''} | {', '.join(map(str, draws)) or '–'} |"
        )
    flagged = sum(r["flagged"] for r in results["rows"])
    lines.append("")
    lines.append(f"{len(results['rows'])} audits, {flagged} failed.")
    return "\n".join(lines)


def run_broken(a, argv) -> int:
    """The auditor's own test: every broken variant flagged, every real release passing, over ``--seeds``."""
    records, t0, wrong = [], time.perf_counter(), 0
    for name, broken, go in broken_catalogue(a.broken_eps, a.clip):
        for seed in range(a.seeds):
            t = time.perf_counter()
            r = go(seed)
            ok = r["flagged"] == broken
            wrong += not ok
            records.append(
                {
                    "variant": name,
                    "broken": broken,
                    "seed": seed,
                    "ok": ok,
                    "seconds": round(time.perf_counter() - t, 2),
                    **{k: _clean(v) for k, v in r.items()},
                }
            )
            print(
                f"{name} seed {seed}: {r['verdict']}{' FLAGGED' if r['flagged'] else ''}"
                f"{'' if ok else '  <-- WRONG'}",
                flush=True,
            )
    out = {
        "command": "python -m experiments.audit_sweep " + " ".join(sys.argv[1:] if argv is None else argv),
        "eps": a.broken_eps,
        "clip": a.clip,
        "delta": 1e-5,
        "seeds": a.seeds,
        "complete": True,
        "seconds": round(time.perf_counter() - t0),
        "rows": records,
    }
    if a.json:
        _atomic_json(a.json, out)
    print(f"{len(records)} audits, {wrong} wrong")
    return 1 if wrong else 0


def _clean(x):
    return (
        None
        if isinstance(x, float) and math.isnan(x)
        else (str(x) if isinstance(x, float) and math.isinf(x) else x)
    )


def _check_flags(p: argparse.ArgumentParser, a) -> None:
    """Every flag checked before any audit runs: an auditor that ran nothing, or ran something else than asked,
    must not report '0 failed' (one line and exit 2 naming the flag)."""
    from mechanisms.dp.backends import available_backends

    for flag, v in (("--eps", a.eps), ("--clip", a.clip), ("--broken-eps", a.broken_eps)):
        if not (math.isfinite(v) and v > 0):
            p.error(f"{flag} must be a finite number > 0, got {v}")
    if not 0 < a.sampling <= 1:
        p.error(f"--sampling must lie in (0, 1], got {a.sampling}")
    for flag, v, low in (
        ("--draws", a.draws, 0),
        ("--heldout", a.heldout, 0),
        ("--meta-draws", a.meta_draws, 1),
        ("--ckks-draws", a.ckks_draws, 0),
        ("--seeds", a.seeds, 1),
    ):
        if v < low:
            p.error(f"{flag} must be >= {low}, got {v}")
    for flag, given, known in (
        ("--methods", a.methods, METHODS),
        ("--ckks-methods", a.ckks_methods, METHODS),
        ("--placements", a.placements, PLACEMENTS),
        ("--levels", a.levels, ("record", "client")),
        ("--backends", a.backends, available_backends()),
    ):
        names = given.split(",")
        bad = [n for n in names if n not in known]
        if bad or not given:
            p.error(f"{flag}: unknown or empty name(s) {bad or [given]}; choose from {sorted(known)}")
    if a.pairs != "all":
        sizes = {level: len(neighbour_battery(level)) for level in a.levels.split(",")}
        try:
            idx = [int(i) for i in a.pairs.split(",")]
        except ValueError:
            idx = [-1]
        if any(not 0 <= i < max(sizes.values()) for i in idx):  # an index of either level's battery
            p.error(
                f"--pairs must be 'all' or indices 0..{max(sizes.values()) - 1} into the battery, got {a.pairs!r}"
            )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eps", type=float, default=4.0)
    p.add_argument("--clip", type=float, default=3.0)
    p.add_argument("--draws", type=int, default=200, help="fresh draws per side for each bound")
    p.add_argument("--heldout", type=int, default=100, help="held-out draws per side (direction, threshold)")
    p.add_argument("--meta-draws", type=int, default=MIN_META_DRAWS)
    p.add_argument(
        "--ckks-draws", type=int, default=0, help="fresh draws per side for CKKS (0: metadata only)"
    )
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    p.add_argument("--ckks-methods", default="fedncm,fed3r", help="methods audited under CKKS")
    p.add_argument("--backends", default="numpy")
    p.add_argument("--levels", default="record,client")
    p.add_argument(
        "--sampling", type=float, default=SAMPLING, help="rate of the sampled configurations (1: none)"
    )
    p.add_argument("--no-tradeoff", action="store_true", help="skip the trade-off path's configurations")
    p.add_argument("--pairs", default="all", help="'all' or comma-separated indices into the battery")
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    p.add_argument("--json", default=None, help="also write every audit (machine-readable) here")
    p.add_argument("--table", default=None, help="print the README table of a JSON results file and exit")
    p.add_argument(
        "--broken",
        action="store_true",
        help="run the auditor's own test instead: broken variants it must flag beside the real releases",
    )
    p.add_argument("--broken-eps", type=float, default=1.0, help="epsilon of the --broken variants")
    p.add_argument("--seeds", type=int, default=5, help="audit seeds per --broken variant")
    a = p.parse_args(argv)
    _check_flags(p, a)
    if a.broken:
        warnings.simplefilter("ignore")
        return run_broken(a, argv)
    if a.table:
        try:
            with open(a.table) as fh:
                print(readme_table(json.load(fh)))
        except (OSError, ValueError) as exc:
            p.error(f"--table {a.table!r} cannot be read as an audit_sweep JSON file ({exc})")
        return 0
    warnings.simplefilter("ignore")
    rows = [
        "| configuration | pair | verdict | claimed eps | claimed mu | eps lower bound | mu lower bound | draws |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    records = []
    failed = total = 0
    t0 = time.perf_counter()
    ckks_methods = set(a.ckks_methods.split(","))
    for name, level, placement, run in configurations(
        a.eps,
        a.clip,
        a.methods.split(","),
        a.placements.split(","),
        a.backends.split(","),
        a.levels.split(","),
        not a.no_tradeoff,
        a.sampling,
    ):
        pairs = neighbour_battery(level)
        if a.pairs != "all":
            pairs = [pairs[int(i)] for i in a.pairs.split(",") if int(i) < len(pairs)]
        draws, heldout = a.draws, a.heldout
        if placement == "ckks":
            if name.split()[1] not in ckks_methods:
                continue
            pairs, draws, heldout = pairs[:1], a.ckks_draws, a.ckks_draws // 2
        for r in audit_release(run, pairs, draws=draws, heldout=heldout, meta_draws=a.meta_draws):
            total += 1
            failed += r.flagged

            def f(x):
                return "" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"

            row = (
                f"| {name} | {r.pair} | {r.verdict}{' FAIL' if r.flagged else ''} | {f(r.claimed_eps)} | "
                f"{f(r.claimed_mu)} | {f(r.eps_lb)} | {f(r.mu_lb)} | {r.draws} |"
            )
            rows.append(row)
            records.append(
                {
                    "configuration": name,
                    "level": level,
                    "placement": placement,
                    "pair": r.pair,
                    "verdict": r.verdict,
                    "flagged": bool(r.flagged),
                    "reason": r.reason,
                    "claimed_eps": _clean(r.claimed_eps),
                    "claimed_mu": _clean(r.claimed_mu),
                    "eps_lb": _clean(r.eps_lb),
                    "mu_lb": _clean(r.mu_lb),
                    "draws": r.draws,
                    "heldout": heldout if r.verdict == "statistical" else 0,
                    "meta_draws": max(a.meta_draws, MIN_META_DRAWS),
                }
            )
            print(row, flush=True)
        _write_json(
            a, argv, records, time.perf_counter() - t0, complete=False
        )  # partial results survive a stop
    seconds = time.perf_counter() - t0
    summary = f"{total} audits, {failed} failed, {seconds:.0f} s"
    print(summary)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write("\n".join(rows + ["", summary, ""]))
    _write_json(a, argv, records, seconds, complete=True)
    if total == 0:  # nothing audited is no pass
        print("audit_sweep: error: no configuration matched the flags; nothing was audited", file=sys.stderr)
        return 2
    return 1 if failed else 0


def _write_json(a, argv, records, seconds, *, complete: bool) -> None:
    if a.json:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            commit = ""
        out = {
            "command": "python -m experiments.audit_sweep "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "commit": commit,
            "seconds": round(seconds),
            "eps": a.eps,
            "clip": a.clip,
            "delta": 1e-5,
            "sampling": a.sampling,
            "complete": complete,
            "rows": records,
        }
        _atomic_json(a.json, out)


def _atomic_json(path: str, out: dict) -> None:
    """Write JSON to a temporary file beside ``path``, then rename it over (a reader never sees half a file)."""
    import os
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".audit-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


if __name__ == "__main__":
    np.seterr(all="ignore")
    from privfed.commands.start import run_script

    run_script(main)
