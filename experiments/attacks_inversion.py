"""Feature inversion from shared class sums on digits: curves against n, eps and secure aggregation.

For each setting the reconstruction is compared with the public class-mean
image (the prior alone, ~14 dB on digits): delta-PSNR and identification
(the nearest private image is one of the cell's images) against chance.

* against n (samples averaged per released mean), clean, backends pixel and decoder;
* against eps at n = 1 (GaussianMechanism, record level, clip = public median norm);
* under secure aggregation (the server sees only the all-client class sums);
* mean + second moment (two-stage: symmetric NMF of G_k, then invert) at n = 2, 4.

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

KEYS = ["psnr", "ssim", "baseline_psnr", "delta_psnr", "delta_psnr_se", "identification", "baseline_identification",
        "chance_identification", "feature_cosine_true", "images_scored"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=40, help="released cells (clients) per setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/attacks-inversion")
    args = p.parse_args(argv)
    import attacks
    from attacks.view import class_groups
    from mechanisms import GaussianMechanism

    warnings.filterwarnings("ignore", message="noise backend")
    d = load_digits()
    rows = []

    def run(tag, method, n, groups, params=None, **kw):
        cl = class_groups(d["yp"], n, np.random.default_rng(args.seed + n), max_groups=groups)
        view, truth = scenario(d, method, cl, rng=args.seed, **kw)
        t = time.perf_counter()
        m = attacks.evaluate("inversion", view, truth, rng=args.seed, **(params or {}))
        row = {"setting": tag, "method": method, "n": n, **(params or {}), **{k: m[k] for k in KEYS},
               "seconds": round(time.perf_counter() - t, 2)}
        rows.append(row)
        print(tag, n, params or "", {k: round(m[k], 3) for k in ("delta_psnr", "identification")}, flush=True)

    for backend in ("pixel", "decoder"):
        for n in (1, 2, 4, 8, 16):
            run("clean", "fedncm", n, args.cells, {"backend": backend})
    for backend in ("pixel", "decoder"):
        for eps in (1000.0, 100.0, 10.0, 1.0, 0.1):
            mech = GaussianMechanism(epsilon=eps, delta=1e-5, clip=d["clip"])
            rows_before = len(rows)
            run(f"dp eps={eps:g}", "fedncm", 1, args.cells, {"backend": backend}, privacy=mech)
            rows[rows_before]["eps"] = eps
    for n in (1, 4):
        run("secure sum", "fedncm", n, None, {"backend": "pixel"}, secure_agg=True)
    for n in (2, 4):
        run("mean only", "fedcgs", n, args.cells // 2, {"source": "mean"})
        run("mean + G", "fedcgs", n, args.cells // 2, {"source": "second"})
    out = Path(args.out)
    write_rows(out, "inversion", rows, vars(args))
    print(markdown(rows, ["setting", "n", "backend", "source", "psnr", "baseline_psnr", "delta_psnr", "identification",
                          "chance_identification"]))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for backend in ("pixel", "decoder"):
        rr = [r for r in rows if r["setting"] == "clean" and r.get("backend") == backend]
        ax[0].errorbar([r["n"] for r in rr], [r["delta_psnr"] for r in rr], yerr=[3 * r["delta_psnr_se"] for r in rr],
                       marker="o", label=f"{backend}: delta-PSNR (dB)", capsize=2)
        ax[1].plot([r["n"] for r in rr], [r["identification"] for r in rr], marker="o", label=backend)
    rr = [r for r in rows if r["setting"] == "clean" and r.get("backend") == "pixel"]
    ax[1].plot([r["n"] for r in rr], [r["chance_identification"] for r in rr], "k--", label="chance")
    ax[0].axhline(0, color="k", lw=0.8)
    for a in ax[:2]:
        a.set_xscale("log", base=2), a.set_xlabel("n samples in the shared mean"), a.legend()
    ax[0].set_ylabel("PSNR gain over the public prior (dB)"), ax[1].set_ylabel("identification")
    for backend in ("pixel", "decoder"):
        rr = [r for r in rows if r["setting"].startswith("dp") and r.get("backend") == backend]
        ax[2].errorbar([r["eps"] for r in rr], [r["delta_psnr"] for r in rr], yerr=[3 * r["delta_psnr_se"] for r in rr],
                       marker="o", label=backend, capsize=2)
    ax[2].axhline(0, color="k", lw=0.8)
    ax[2].set_xscale("log"), ax[2].set_xlabel("epsilon (n = 1, record-level Gaussian)")
    ax[2].set_ylabel("PSNR gain over the public prior (dB)"), ax[2].legend()
    fig.tight_layout()
    fig.savefig(out / "inversion.png", dpi=120)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
