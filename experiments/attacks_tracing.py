"""Tracing (membership) on shared class means: measured AUC / TPR against the closed form and the DP bound.

(1) Clean means of n records (replace-one game, 2000 trials per side, the
    class with the most private samples): inner-product (Dwork et al. 2015),
    Gaussian likelihood ratio and Homer tests, next to the closed form
    AUC = Phi(sqrt(d_eff / n) / sqrt 2) (attacks.md) and its version with the
    public reference mean's offset (attacks.theory.tracing_snr).
    The support test (post-ReLU features are non-negative: a member of a
    clean sum S satisfies S - y >= 0) combined with the likelihood ratio
    (``lrt+support``) runs next to them; ``strongest`` names the best test.
(2) Gaussian DP at n = 1 (add/remove game, sigma = z sqrt(c^2 + 1) on sum and
    count): every test against the GDP bound Phi(1 / (z sqrt 2)).
(3) The server's view of per-client FedNCM uploads (n records of one class
    per client, 400 members each paired with a holdout non-member of its
    class, tested on the member's own row): the tracing suite of
    :func:`attacks.strongest`, including the LRT with the other rows' pooled
    mean as reference and the classifier trained on public simulations.
(4) The same suite on FedNCM with 20 Dirichlet(0.1) clients, clean and under
    record-level local Gaussian DP (eps = 10, 1; delta 1e-5), against the
    GDP bound of the release.

    python experiments/attacks_tracing.py [--trials 2000] [--out results/attacks-tracing]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks_common import load_digits, markdown, scenario, write_rows  # noqa: E402
from flag_types import count, out_path, seed  # noqa: E402

CLEAN_TESTS = ("inner", "lrt", "homer", "lrt+support")
DP_TESTS = ("sum", "lrt", "inner", "lrt+support")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=count(2), default=2000)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--record",
        action="store_true",
        help="also write experiments/results/attacks_tracing.json, the record the README's figures are checked against",
    )
    p.add_argument("--out", type=out_path, default="results/attacks-tracing")
    p.add_argument(
        "--parts",
        default="clean,dp,views,local",
        help="comma-separated parts to run (clean, dp, views, local); with --record, the parts not run "
        "are kept from the existing record",
    )
    args = p.parse_args(argv)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    unknown = parts - {"clean", "dp", "views", "local"}
    if unknown or not parts:
        p.error(f"--parts takes clean, dp, views, local; got {args.parts!r}")

    from attacks.metrics import auc, auc_se, tpr_at_fpr
    from attacks.theory import effective_dimension, gdp_auc_bound, gdp_tpr_bound, tracing_auc, tracing_tpr
    from attacks.tracing.attack import reference_model, tracing_game
    from attacks.view import clip_rows

    t_all = time.perf_counter()
    d = load_digits()
    c = int(np.bincount(d["yp"]).argmax())
    pool = d["Fp"][d["yp"] == c]
    pub = d["public"]
    model = reference_model(pub.features[pub.labels == c])
    cov = np.cov(pool, rowvar=False)
    offset = pool.mean(axis=0) - model.mean  # the public reference mean is off by this
    rng = np.random.default_rng(args.seed)
    T = args.trials
    clean = []
    for n in (1, 2, 4, 8, 16, 32, 64) if "clean" in parts else ():
        row = {
            "n": n,
            "d_eff": effective_dimension(cov),
            "pred_auc_exact_ref": float(tracing_auc(cov, n)),
            "pred_auc": float(tracing_auc(cov, n, offset=offset)),
            "pred_tpr@0.01": float(tracing_tpr(cov, n, 0.01, offset=offset)),
        }
        for test in CLEAN_TESTS:
            g = tracing_game(pool, model, n=n, trials=T, rng=rng, test=test)
            a = auc(g["scores"], g["members"])
            r1 = tpr_at_fpr(g["scores"], g["members"], 0.01)
            r01 = tpr_at_fpr(g["scores"], g["members"], 0.001)
            row.update(
                {
                    f"{test}_auc": a,
                    f"{test}_auc_se": auc_se(a, T, T),
                    f"{test}_tpr@0.01": r1["tpr"],
                    f"{test}_fpr@0.01": r1["fpr"],
                    f"{test}_tpr@0.001": r01["tpr"],
                    f"{test}_fpr@0.001": r01["fpr"],
                }
            )
        # each test plays its own games: the strongest is named per metric (AUC, TPR at 1% and 0.1% FPR)
        for k in ("auc", "tpr@0.01", "tpr@0.001"):
            best = max(CLEAN_TESTS, key=lambda t: row[f"{t}_{k}"])
            row[f"strongest_{k}"], row[f"strongest_{k}_test"] = row[f"{best}_{k}"], best
        row["strongest"] = row["strongest_auc_test"]
        clean.append(row)
    clip = d["clip"]
    model_c = reference_model(clip_rows(pub.features[pub.labels == c], clip))
    dp = []
    for z in (0.25, 0.5, 1.0, 2.0, 4.0) if "dp" in parts else ():
        sigma = z * math.sqrt(clip**2 + 1)
        row = {
            "z": z,
            "mu": 1 / z,
            "auc_bound": gdp_auc_bound(1 / z),
            "tpr@0.05_bound": gdp_tpr_bound(1 / z, 0.05),
        }
        for test in DP_TESTS:
            g = tracing_game(
                pool,
                model_c,
                n=1,
                trials=T,
                rng=rng,
                test=test,
                sigma=sigma,
                count_sigma=sigma,
                clip=clip,
                design="add-remove",
            )
            a = auc(g["scores"], g["members"])
            r = tpr_at_fpr(g["scores"], g["members"], 0.05)
            row.update(
                {
                    f"{test}_auc": a,
                    f"{test}_auc_se": auc_se(a, T, T),
                    f"{test}_tpr@0.05": r["tpr"],
                    f"{test}_fpr@0.05": r["fpr"],
                }
            )
        row["strongest"] = max(DP_TESTS, key=lambda t: row[f"{t}_auc"])
        row["strongest_auc"] = row[f"{row['strongest']}_auc"]
        dp.append(row)
    views = []
    import attacks
    from attacks.view import class_groups

    for n in (1, 2, 4, 8, 16) if "views" in parts else ():
        cl = class_groups(d["yp"], n, np.random.default_rng(args.seed + n))
        view, truth = scenario(d, "fedncm", cl)
        row = {"n": n, **attacks.strongest_flat("tracing", view, truth, rng=args.seed, max_targets=400)}
        views.append(row)
        print("view n", n, row["strongest_attack"], round(row["auc"], 3), flush=True)
    from attacks.theory import gdp_auc_bound as _bound
    from mechanisms import GaussianMechanism
    from privfed.federation import partition

    local = []
    cl20 = partition(d["yp"], 20, "dirichlet", alpha=0.1, rng=args.seed).clients
    for eps in (math.inf, 10.0, 1.0) if "local" in parts else ():
        # the default mechanism, run through the release plan: the view is what its release sent
        mech = GaussianMechanism(epsilon=eps, delta=1e-5, clip=clip)
        view, truth = scenario(d, "fedncm", cl20, privacy=mech, rng=np.random.default_rng(args.seed + 1))
        row = {
            "eps": eps,
            "auc_bound": _bound(mech.mu) if math.isfinite(eps) else 1.0,
            "sigma_sums": mech.sigma["sums"],
            "sigma_counts": mech.sigma["counts"],
            **attacks.strongest_flat("tracing", view, truth, rng=args.seed, max_targets=400),
        }
        local.append(row)
        print(
            "local eps",
            eps,
            row["strongest_attack"],
            round(row["auc"], 3),
            "bound",
            round(row["auc_bound"], 3),
            flush=True,
        )
    out = Path(args.out)
    cfg = {"trials": T, "seed": args.seed, "class": c, "pool": int(pool.shape[0]), "clip": clip}
    # only the parts that ran: another part's files in --out (an earlier run's) are left as they are
    for part, name, rows in (
        ("clean", "clean", clean),
        ("dp", "dp", dp),
        ("views", "views", views),
        ("local", "local_dp", local),
    ):
        if part in parts:
            write_rows(out, name, rows, cfg)
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from experiments import recorded

        data = dict(config=cfg, clean=clean, dp=dp, views=views, local=local)
        cmd = recorded.command("experiments/attacks_tracing.py", argv)
        if parts != {"clean", "dp", "views", "local"}:  # keep the parts not rerun, and say which were
            old = recorded.load("attacks_tracing")
            if old["data"]["config"] != cfg:
                raise SystemExit(
                    f"--parts {args.parts} with --record needs the recorded config {old['data']['config']}"
                )
            data = {**old["data"], **{k: v for k, v in data.items() if k in parts}}
            cmd = f"{old['command']}; then {cmd}"
        print(f"recorded {recorded.save('attacks_tracing', data, cmd)}")
    if parts != {"clean", "dp", "views", "local"}:
        print(f"total {time.perf_counter() - t_all:.0f} s (parts {sorted(parts)})")
        return 0
    print(
        markdown(
            clean,
            [
                "n",
                "pred_auc_exact_ref",
                "pred_auc",
                "inner_auc",
                "lrt_auc",
                "homer_auc",
                "lrt+support_auc",
                "strongest",
                "strongest_auc",
                "lrt_tpr@0.01",
                "strongest_tpr@0.01",
                "strongest_tpr@0.01_test",
                "strongest_tpr@0.001",
                "strongest_tpr@0.001_test",
            ],
        )
    )
    print()
    print(
        markdown(
            dp,
            [
                "z",
                "auc_bound",
                "sum_auc",
                "lrt_auc",
                "inner_auc",
                "lrt+support_auc",
                "strongest",
                "strongest_auc",
                "tpr@0.05_bound",
                "sum_tpr@0.05",
            ],
        )
    )
    print()
    names = [k[:-4] for k in views[0] if k.endswith(":auc")]
    print(
        markdown(
            views, ["n", "strongest_attack", "auc", "tpr@0.01", "tpr@0.001", *[f"{k}:auc" for k in names]]
        )
    )
    print()
    print(
        markdown(
            local,
            [
                "eps",
                "auc_bound",
                "strongest_attack",
                "auc",
                "tpr@0.01",
                "tpr@0.001",
                *[f"{k}:auc" for k in names],
            ],
        )
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["n"] for r in clean]
    for test in CLEAN_TESTS:
        ax[0].errorbar(
            ns,
            [r[f"{test}_auc"] for r in clean],
            yerr=[3 * r[f"{test}_auc_se"] for r in clean],
            marker="o",
            label=test,
            capsize=2,
        )
    ax[0].plot(ns, [r["pred_auc"] for r in clean], "k--", label="closed form (inner, public reference)")
    ax[0].plot(ns, [r["pred_auc_exact_ref"] for r in clean], "k:", label="closed form (exact reference)")
    ax[0].set_xscale("log", base=2), ax[0].set_xlabel("n records in the mean"), ax[0].set_ylabel("AUC")
    ax[0].legend(), ax[0].set_title(f"clean class means (digits class {c})")
    zs = [r["z"] for r in dp]
    for test in DP_TESTS:
        ax[1].errorbar(
            zs,
            [r[f"{test}_auc"] for r in dp],
            yerr=[3 * r[f"{test}_auc_se"] for r in dp],
            marker="o",
            label=test,
            capsize=2,
        )
    ax[1].plot(zs, [r["auc_bound"] for r in dp], "k--", label="GDP bound")
    ax[1].set_xscale("log"), ax[1].set_xlabel("noise multiplier z"), ax[1].set_ylabel("AUC")
    ax[1].minorticks_off(), ax[1].set_xticks(zs), ax[1].set_xticklabels([f"{z:g}" for z in zs])
    ax[1].legend(), ax[1].set_title("n = 1, Gaussian DP (add/remove)")
    fig.tight_layout()
    fig.savefig(out / "tracing.png", dpi=120)
    print(f"total {time.perf_counter() - t_all:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
