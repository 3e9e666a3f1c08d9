"""Feature inversion from shared class sums on digits: every attack, the strongest named, against the prior.

Each setting runs the inversion suite of :func:`attacks.strongest` on the
same released cells: pixel optimisation with TV (``pixel``), the feature
decoder trained on the augmented public bank plus refinement (``learned``),
the set decoder returning n images for a mean of n plus joint refinement
(``set``), and, where second moments are uploaded, unmixing then the learned
inversion (``two-stage``).  Scores (attacks.inversion): Hungarian matching
per cell, identification per true image among all 899 private images,
against the n-guess prior (k-means centres of the public class, as many
guesses as reconstructions) and chance; delta-PSNR over that prior with
standard errors clustered by cell.

* clean means of n = 1, 2, 4, 8, 16 records (FedNCM uploads, one class per client);
* record-level Gaussian DP at n = 1 (GaussianMechanism, clip = public median norm);
* secure aggregation (the server sees only the all-client class sums);
* FedCGS (mean + second moment) at n = 2, 4.

The decoders train once (minutes on 2 cores) and are cached by the hash of
what determines them (PRIVFED_CACHE).

    python experiments/attacks_inversion.py [--cells 40] [--out results/attacks-inversion]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks_common import load_digits, markdown, scenario, write_rows  # noqa: E402

SUITE_ORDER = ("pixel", "learned", "set", "two-stage")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=40, help="released cells (clients) per setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ns", default="1,2,4,8,16", help="clean settings: records per released mean")
    p.add_argument("--eps", default="10,1,0.1", help="record-level DP settings at n = 1")
    p.add_argument("--out", default="results/attacks-inversion")
    args = p.parse_args(argv)
    import attacks
    from attacks.view import class_groups
    from mechanisms import GaussianMechanism

    warnings.filterwarnings("ignore", message="noise backend")
    t_all = time.perf_counter()
    d = load_digits()
    rows = []

    def run(tag, method, n, groups, **kw):
        cl = class_groups(d["yp"], n, np.random.default_rng(args.seed + n), max_groups=groups)
        view, truth = scenario(d, method, cl, rng=args.seed, **kw)
        t = time.perf_counter()
        rep = attacks.strongest("inversion", view, truth, rng=args.seed, max_cells=args.cells)
        best = rep["attacks"][rep["strongest"]]
        row = {"setting": tag, "method": method, "n": n, "strongest": rep["strongest"],
               "strongest_by_delta_psnr": rep["strongest_by"]["delta_psnr"], **best,
               "seconds": round(time.perf_counter() - t, 1)}
        for name in SUITE_ORDER:
            m = rep["attacks"].get(name, {})
            for k in ("identification", "delta_psnr", "delta_psnr_se", "psnr", "ssim"):
                row[f"{name}:{k}"] = m.get(k, float("nan"))
        rows.append(row)
        print(tag, n, rep["strongest"], {k: round(best[k], 3) for k in ("identification", "baseline_identification",
                                                                        "delta_psnr", "delta_psnr_se")},
              {nm: round(rep["attacks"][nm].get("identification", float("nan")), 3) for nm in rep["attacks"]},
              row["seconds"], "s", flush=True)

    for n in (int(x) for x in args.ns.split(",") if x):
        run("clean", "fedncm", n, args.cells)
    clip = float(np.median(np.linalg.norm(d["public"].features, axis=1)))
    for eps in (float(x) for x in args.eps.split(",") if x):
        run(f"dp eps={eps:g}", "fedncm", 1, args.cells, privacy=GaussianMechanism(epsilon=eps, delta=1e-5, clip=clip))
    for n in (1, 4):
        run("secure sum", "fedncm", n, None, secure_agg=True)
    for n in (2, 4):
        run("mean + G", "fedcgs", n, args.cells // 2)
    out = Path(args.out)
    write_rows(out, "inversion", rows, {**vars(args), "seconds_total": round(time.perf_counter() - t_all, 1)})
    for r in rows:
        r["delta_psnr (se)"] = f"{r['delta_psnr']:+.2f} ({r['delta_psnr_se']:.2f})"
        for name in SUITE_ORDER:
            v = r[f"{name}:identification"]
            r[f"{name}"] = "n/a" if v != v else f"{v:.3f} / {r[f'{name}:delta_psnr']:+.2f}"
    print(markdown(rows, ["setting", "n", "strongest", "identification", "baseline_identification",
                          "chance_identification", "psnr", "baseline_psnr", "delta_psnr (se)", "ssim",
                          "baseline_ssim", *SUITE_ORDER]))
    print(f"total {time.perf_counter() - t_all:.0f} s; wrote {out}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    clean = [r for r in rows if r["setting"] == "clean"]
    ns = [r["n"] for r in clean]
    for name in SUITE_ORDER[:3]:
        ax[0].plot(ns, [r[f"{name}:identification"] for r in clean], marker="o", label=name)
        ax[1].plot(ns, [r[f"{name}:delta_psnr"] for r in clean], marker="o", label=name)
    ax[0].plot(ns, [r["baseline_identification"] for r in clean], "k:", label="prior (strongest's guesses)")
    ax[0].plot(ns, [r["chance_identification"] for r in clean], "k--", label="chance")
    ax[1].axhline(0, color="k", lw=0.8)
    for a in ax:
        a.set_xscale("log", base=2), a.set_xlabel("n records in the shared mean"), a.legend(fontsize=7)
    ax[0].set_ylabel("identification (per true image)"), ax[1].set_ylabel("PSNR gain over the n-guess prior (dB)")
    fig.tight_layout()
    fig.savefig(out / "inversion.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
