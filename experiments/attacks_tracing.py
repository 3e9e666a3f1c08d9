"""Tracing (membership) on shared class means: measured AUC / TPR against the closed form and the DP bound.

(1) Clean means of n records (replace-one game, 2000 trials per side, the
    class with the most private samples): inner-product (Dwork et al. 2015),
    Gaussian likelihood ratio and Homer tests, next to the closed form
    AUC = Phi(sqrt(d_eff / n) / sqrt 2) (attacks.md) and its version with the
    public reference mean's offset (attacks.theory.tracing_snr).
(2) Gaussian DP at n = 1 (add/remove game, sigma = z sqrt(c^2 + 1) on sum and
    count): every test against the GDP bound Phi(1 / (z sqrt 2)).

    python experiments/attacks_tracing.py [--trials 2000] [--out results/attacks-tracing]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks_common import load_digits, markdown, write_rows  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/attacks-tracing")
    args = p.parse_args(argv)

    from attacks.metrics import auc, auc_se, tpr_at_fpr
    from attacks.theory import effective_dimension, gdp_auc_bound, gdp_tpr_bound, tracing_auc, tracing_tpr
    from attacks.tracing import reference_model, tracing_game
    from attacks.view import clip_rows

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
    for n in (1, 2, 4, 8, 16, 32, 64):
        row = {"n": n, "d_eff": effective_dimension(cov), "pred_auc_exact_ref": float(tracing_auc(cov, n)),
               "pred_auc": float(tracing_auc(cov, n, offset=offset)),
               "pred_tpr@0.01": float(tracing_tpr(cov, n, 0.01, offset=offset))}
        for test in ("inner", "lrt", "homer"):
            g = tracing_game(pool, model, n=n, trials=T, rng=rng, test=test)
            a = auc(g["scores"], g["members"])
            r1 = tpr_at_fpr(g["scores"], g["members"], 0.01)
            r01 = tpr_at_fpr(g["scores"], g["members"], 0.001)
            row.update({f"{test}_auc": a, f"{test}_auc_se": auc_se(a, T, T), f"{test}_tpr@0.01": r1["tpr"],
                        f"{test}_fpr@0.01": r1["fpr"], f"{test}_tpr@0.001": r01["tpr"],
                        f"{test}_fpr@0.001": r01["fpr"]})
        clean.append(row)
    clip = d["clip"]
    model_c = reference_model(clip_rows(pub.features[pub.labels == c], clip))
    dp = []
    for z in (0.25, 0.5, 1.0, 2.0, 4.0):
        sigma = z * math.sqrt(clip**2 + 1)
        row = {"z": z, "mu": 1 / z, "auc_bound": gdp_auc_bound(1 / z), "tpr@0.05_bound": gdp_tpr_bound(1 / z, 0.05)}
        for test in ("sum", "lrt", "inner"):
            g = tracing_game(pool, model_c, n=1, trials=T, rng=rng, test=test, sigma=sigma, count_sigma=sigma,
                             clip=clip, design="add-remove")
            a = auc(g["scores"], g["members"])
            r = tpr_at_fpr(g["scores"], g["members"], 0.05)
            row.update({f"{test}_auc": a, f"{test}_auc_se": auc_se(a, T, T), f"{test}_tpr@0.05": r["tpr"],
                        f"{test}_fpr@0.05": r["fpr"]})
        dp.append(row)
    out = Path(args.out)
    cfg = {"trials": T, "seed": args.seed, "class": c, "pool": int(pool.shape[0]), "clip": clip}
    write_rows(out, "clean", clean, cfg)
    write_rows(out, "dp", dp, cfg)
    print(markdown(clean, ["n", "pred_auc_exact_ref", "pred_auc", "inner_auc", "lrt_auc", "homer_auc",
                           "inner_tpr@0.01", "lrt_tpr@0.01"]))
    print()
    print(markdown(dp, ["z", "auc_bound", "sum_auc", "lrt_auc", "inner_auc", "tpr@0.05_bound", "sum_tpr@0.05"]))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["n"] for r in clean]
    for test in ("inner", "lrt", "homer"):
        ax[0].errorbar(ns, [r[f"{test}_auc"] for r in clean], yerr=[3 * r[f"{test}_auc_se"] for r in clean],
                       marker="o", label=test, capsize=2)
    ax[0].plot(ns, [r["pred_auc"] for r in clean], "k--", label="closed form (inner, public reference)")
    ax[0].plot(ns, [r["pred_auc_exact_ref"] for r in clean], "k:", label="closed form (exact reference)")
    ax[0].set_xscale("log", base=2), ax[0].set_xlabel("n records in the mean"), ax[0].set_ylabel("AUC")
    ax[0].legend(), ax[0].set_title(f"clean class means (digits class {c})")
    zs = [r["z"] for r in dp]
    for test in ("sum", "lrt", "inner"):
        ax[1].errorbar(zs, [r[f"{test}_auc"] for r in dp], yerr=[3 * r[f"{test}_auc_se"] for r in dp], marker="o",
                       label=test, capsize=2)
    ax[1].plot(zs, [r["auc_bound"] for r in dp], "k--", label="GDP bound")
    ax[1].set_xscale("log"), ax[1].set_xlabel("noise multiplier z"), ax[1].set_ylabel("AUC")
    ax[1].minorticks_off(), ax[1].set_xticks(zs), ax[1].set_xticklabels([f"{z:g}" for z in zs])
    ax[1].legend(), ax[1].set_title("n = 1, Gaussian DP (add/remove)")
    fig.tight_layout()
    fig.savefig(out / "tracing.png", dpi=120)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
