"""FedLog as its paper runs it, on digits: training vs one-shot, and Fig. 3 (right) with both epsilon axes.

Part 1 (``--part compare``): non-private multi-round FedLog with local bodies
(heterogeneous families, and all ``cnn``) against one-shot frozen FedLog,
local-only training and FedAvg (asked for explicitly: ``run_rounds`` runs no
baseline by default), personalised and common-test accuracy, bytes uploaded,
and each method's own seconds (``method_seconds``) beside the whole run's.

Part 2 (``--part dp``): the paper's DP experiment (Sec. 4.5: features clipped
to b = 2 per coordinate, delta = 0.01, the classic sigma of Theorem 3.1 at the
same eps every round) over R rounds, drawn against the per-round eps the
paper states (bottom axis) and the eps the R releases compose to (top axis,
GDP exact).  Beside it, noise calibrated for the *total* budget with the
sensitivity that holds for trained bodies (each client's upload bounded to
n_max records, diameter 2 n_max Delta), and one-shot frozen FedLog (one
release, Theorem 3.1's sensitivity, valid).

Part 3 (``--part attack``): membership attacks on the whole sequence of
releases (:mod:`attacks.rounds`) with frozen public bodies, where Theorem
3.1's sensitivity holds and the composed GDP bound Phi(mu_total / sqrt 2) is
a real bound: the total-budget calibration and the paper's per-round one.
Parts 1 and 2 attack their runs too (clean tracing; differencing under DP).

    python experiments/fedlog_rounds.py --part all --seeds 1 --out results/fedlog-rounds --record

Writes ``compare.csv``, ``dp.csv``, ``attack.csv`` (+ JSON) and
``fig3_right.png`` under ``--out``, and the machine-readable summary the
README's FedLog numbers are checked against and the figure under ``docs/img/``
only with ``--record`` (or where ``--json`` and ``--figure`` say).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.attacks_common import write_rows  # noqa: E402  (one CSV + JSON writer for experiments)

#: Member / holdout pairs attacked in every run.
PAIRS = 200
#: The baselines part 1 compares against (run_rounds runs none unless asked; each is timed on its own).
BASELINES = ("oneshot", "local", "fedavg")


def _privacy_cols(p) -> dict:
    """The privacy columns of a run's row from its report (``None``: no noise)."""
    return {
        "per_round_epsilon": p.per_round_epsilon if p else math.inf,
        "per_round_epsilon_exact": p.per_round_epsilon_exact if p else math.inf,
        "composed_epsilon": p.epsilon if p else math.inf,
        "composed_epsilon_pld": p.epsilon_pld if p else math.inf,
        "sigma": p.sigma if p else 0.0,
        "sensitivity": p.sensitivity if p else 0.0,
        "formal_guarantee": p.formal if p else False,
        "guarantee": p.guarantee if p else "NO DP GUARANTEE: no noise",
    }


def _attack_cols(r) -> dict:
    from privfed.commands.tradeoff.rounds import attack_summary

    return attack_summary(r.attacks)


def compare(args) -> list[dict]:
    from privfed.rounds import FAMILIES, run_rounds

    rows = []
    for fams in (FAMILIES, ("cnn",)):
        for seed in range(args.seeds):
            r = run_rounds(
                clients=args.clients,
                rounds=args.rounds,
                local_epochs=args.local_epochs,
                families=fams,
                seed=seed,
                progress=not args.quiet,
                attack_pairs=PAIRS,
                baselines=BASELINES,
            )
            label = "+".join(fams)
            for name, acc in r.summary().items():
                rows.append(
                    {
                        "families": label,
                        "seed": seed,
                        "method": name,
                        "personalised": acc["personalised"],
                        "common": acc["common"],
                        "upload_bytes_per_round": acc["upload_bytes_per_round"],
                        "upload_bytes_total": acc["upload_bytes_total"],
                        "seconds": r.timing["total_s"],
                        "cpu_seconds": r.timing.get("cpu_s"),
                        # this method's own run (FedLog's without the baselines and the attack)
                        "method_seconds": r.timing.get(f"{name}_s"),
                        **(
                            {f"tracing_{k}_auc": v["auc"] for k, v in r.attacks["tracing"].items()}
                            if name == "fedlog"
                            else {}
                        ),
                    }
                )
            print(
                f"[compare] {label} seed {seed}: "
                + ", ".join(f"{n} {a['personalised']:.3f}/{a['common']:.3f}" for n, a in r.summary().items())
                + f"  ({r.timing['total_s']:.0f} s)",
                file=sys.stderr,
            )
    return rows


def dp(args) -> list[dict]:
    from privfed.rounds import run_rounds

    rows = []
    modes = {
        "paper": dict(calibration="paper", record_bound="theorem"),
        "total-upload-bound": dict(calibration="total", record_bound="upload"),
    }
    for eps in args.eps:
        for mode, kw in modes.items():
            if math.isinf(eps) and mode != "paper":
                continue
            for seed in range(args.seeds):
                extra = (
                    {}
                    if math.isinf(eps)
                    else dict(epsilon=eps, delta=args.delta, clip=args.clip, clip_norm="coordinate", **kw)
                )
                t = time.perf_counter()
                r = run_rounds(
                    clients=args.clients,
                    rounds=args.rounds,
                    local_epochs=args.local_epochs,
                    seed=seed,
                    noise_seed=seed,
                    baselines=("oneshot",) if mode == "paper" else (),
                    progress=not args.quiet,
                    attack_pairs=PAIRS,
                    **extra,
                )
                p = r.privacy
                row = {
                    "mode": mode if p is not None else "non-private",
                    "epsilon": eps,
                    "seed": seed,
                    "rounds": args.rounds,
                    "personalised": r.personalised_accuracy,
                    "common": r.common_accuracy,
                    **_privacy_cols(p),
                    "seconds": time.perf_counter() - t,
                    **_attack_cols(r),
                }
                rows.append(row)
                if "oneshot" in r.baselines:
                    o = r.baselines["oneshot"]
                    rows.append(
                        {
                            "mode": "one-shot frozen",
                            "epsilon": eps,
                            "seed": seed,
                            "rounds": 1,
                            "personalised": o["personalised"],
                            "common": o["common"],
                            **_privacy_cols(o["privacy"]),
                            "seconds": 0.0,
                        }
                    )
                write_rows(Path(args.out), "dp.partial", rows, {})
                print(
                    f"[dp] eps {eps:g} {row['mode']} seed {seed}: pers {row['personalised']:.3f} composed eps "
                    f"{row['composed_epsilon']:.4g} ({row['seconds']:.0f} s)",
                    file=sys.stderr,
                )
    return rows


def attack(args) -> list[dict]:
    """Frozen public cnn bodies (Theorem 3.1's sensitivity holds): the sequence attack against the composed bound."""
    from privfed.rounds import run_rounds

    rows = []
    settings = [("total", 1.0), ("total", 4.0), ("paper", 1.0)]
    for calibration, eps in settings:
        for seed in range(args.seeds):
            t = time.perf_counter()
            r = run_rounds(
                clients=args.clients,
                rounds=args.rounds,
                local_epochs=0,
                families=("cnn",),
                baselines=(),
                seed=seed,
                noise_seed=seed,
                epsilon=eps,
                delta=args.delta,
                clip=args.clip,
                calibration=calibration,
                record_bound="theorem",
                attack_pairs=PAIRS,
                progress=not args.quiet,
            )
            a, p = r.attacks, r.privacy
            row = {
                "bodies": "frozen public cnn",
                "calibration": calibration,
                "epsilon": eps,
                "seed": seed,
                "rounds": args.rounds,
                "personalised": r.personalised_accuracy,
                "per_round_epsilon": p.per_round_epsilon,
                "composed_epsilon": p.epsilon,
                "mu_per_release": p.mu_per_release,
                "mu_total": p.mu_total,
                "pairs": a["pairs"],
                "auc_bound_one_release": a["auc_bound_one_release"],
                "auc_bound": a["auc_bound"],
                "auc_tolerance_3sd": a["auc_tolerance_3sd"],
                "seconds": time.perf_counter() - t,
            }
            for name in ("differencing_replay", "differencing", "tracing"):
                for k, v in a[name].items():
                    row[f"{name}_{k}_auc"] = v["auc"]
                    row[f"{name}_{k}_tpr_1pct"] = v["tpr_at_1pct_fpr"]
            rows.append(row)
            print(
                f"[attack] {calibration} eps {eps:g} seed {seed}: differencing AUC first round "
                f"{row['differencing_replay_first_round_auc']:.3f}, {args.rounds} rounds "
                f"{row['differencing_replay_sequence_auc']:.3f} (bound {row['auc_bound']:.3f}; one release "
                f"{row['auc_bound_one_release']:.3f})",
                file=sys.stderr,
            )
    return rows


def plot(out: Path, rows: list[dict], args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mechanisms.dp.calibration import gdp_epsilon

    def curve(mode, key):
        pts = {}
        for r in rows:
            if r["mode"] == mode and math.isfinite(r["epsilon"]):
                pts.setdefault(r[key], []).append(r["personalised"])
        xs = sorted(pts)
        return np.array(xs), np.array([np.mean(pts[x]) for x in xs]), np.array([np.std(pts[x]) for x in xs])

    nonpriv = [r["personalised"] for r in rows if r["mode"] == "non-private"]
    R, delta = args.rounds, args.delta
    z = math.sqrt(2 * math.log(1.25 / delta))

    def per_to_composed(e):
        e = np.atleast_1d(np.asarray(e, dtype=float))
        return np.array([gdp_epsilon(math.sqrt(R) * x / z, delta) if x > 0 else 0.0 for x in e])

    grid = np.logspace(-4, 3, 400)
    comp_grid = per_to_composed(grid)
    keep = comp_grid > 0  # below some eps the releases already meet delta at eps = 0
    grid, comp_grid = grid[keep], comp_grid[keep]
    lg, lc = np.log(grid), np.log(comp_grid)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    x, y, s = curve("paper", "per_round_epsilon")
    a1.plot(x, y, "o-", color="C0", label=f"FedLog, {R} rounds (paper's DP: classic sigma each round)")
    a1.fill_between(x, y - s, y + s, color="C0", alpha=0.2)
    x, y, s = curve("one-shot frozen", "per_round_epsilon")
    a1.plot(x, y, "s--", color="C2", label="one-shot frozen FedLog (1 release)")
    if nonpriv:
        a1.axhline(np.mean(nonpriv), color="grey", lw=0.8, label="no noise")
    a1.set_xscale("log")
    a1.set_xlabel("per-round epsilon, as the paper states (delta = %g)" % delta)
    a1.set_ylabel("personalised accuracy")
    top = a1.secondary_xaxis(
        "top",
        functions=(
            lambda e: np.exp(np.interp(np.log(np.maximum(e, 1e-300)), lg, lc)),
            lambda c: np.exp(np.interp(np.log(np.maximum(c, 1e-300)), lc, lg)),
        ),
    )
    top.set_xlabel(f"epsilon the {R} releases compose to (GDP, exact)")
    a1.set_title("digits, Fig. 3 (right) setting: b = 2, delta = 0.01", fontsize=9)
    a1.legend(fontsize=7, loc="lower right")
    a1.grid(alpha=0.3, which="both")

    x, y, s = curve("paper", "composed_epsilon")
    a2.plot(x, y, "o-", color="C0", label="paper's DP (NO formal guarantee: bodies trained on the records)")
    x, y, s = curve("total-upload-bound", "composed_epsilon")
    a2.plot(x, y, "^-", color="C3", label="total budget, trained-body bound 2 n_max Delta (valid)")
    a2.fill_between(x, y - s, y + s, color="C3", alpha=0.2)
    x, y, s = curve("one-shot frozen", "composed_epsilon")
    a2.plot(x, y, "s--", color="C2", label="one-shot frozen FedLog (valid)")
    if nonpriv:
        a2.axhline(np.mean(nonpriv), color="grey", lw=0.8)
    a2.set_xscale("log")
    a2.set_xlabel("total epsilon over all releases (delta = %g)" % delta)
    a2.set_title("the same runs against what they really spend", fontsize=9)
    a2.legend(fontsize=7, loc="lower right")
    a2.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "fig3_right.png", dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("compare", "dp", "attack", "both", "all"), default="all")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--eps", default="0.01,0.1,1,10,100,inf")
    p.add_argument("--delta", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=2.0)
    p.add_argument("--out", default="results/fedlog-rounds")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write the record the README is checked against (experiments/results/fedlog_rounds.json) "
        "and the docs' figure (docs/img/fedlog_rounds_fig3_right.png); without it the repository is untouched",
    )
    p.add_argument(
        "--json", default=None, help="machine-readable summary of every part run (default: --record's)"
    )
    p.add_argument("--figure", default=None, help="a copy of fig3_right.png (default: --record's)")
    args = p.parse_args(argv)
    if args.seeds < 1:  # 0 or fewer ran nothing and printed NaN (or failed) with exit 0
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    root = Path(__file__).resolve().parents[1]
    if args.record:  # the repository's own copies, wherever the script is run from
        args.json = args.json or str(root / "experiments" / "results" / "fedlog_rounds.json")
        args.figure = args.figure or str(root / "docs" / "img" / "fedlog_rounds_fig3_right.png")
    args.eps = [float(e) for e in args.eps.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items()}
    summary: dict = {
        "config": config,
        "command": "python experiments/fedlog_rounds.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    if args.part in ("compare", "both", "all"):
        summary["compare"] = compare(args)
        write_rows(out, "compare", summary["compare"], config)
    if args.part in ("dp", "both", "all"):
        rows = dp(args)
        summary["dp"] = rows
        write_rows(out, "dp", rows, config)
        plot(out, rows, args)
        if args.figure:
            import shutil

            Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / "fig3_right.png", args.figure)
    if args.part in ("attack", "all"):
        summary["attack"] = attack(args)
        write_rows(out, "attack", summary["attack"], config)
    if args.json:
        import json

        from privfed.commands.common import versions

        summary["versions"] = versions()
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str, allow_nan=True) + "\n")
    print(f"wrote {out}" + (f", {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
