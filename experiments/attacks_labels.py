"""Label distribution from counts under each count-noise variant (FedCOF App. I.1) against epsilon.

Dirichlet(0.3) partition of the digits private split over 50 clients; for
Laplace, geometric, Gaussian (analytic, delta = 1e-5) and the uniform
heuristic (no DP): total variation of the inferred class histograms, count
MAE, exact support, presence AUC and singleton AUC (count 0 vs 1), next to
the bound of any test: e^eps / (1 + e^eps) (pure DP), Phi(1 / (sigma sqrt 2))
(Gaussian, GDP).  The uniform variant keeps every zero at zero, so presence and singleton AUC stay 1 at every eps.

    python experiments/attacks_labels.py [--seeds 3] [--out results/attacks-labels]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks_common import load_digits, markdown, scenario, write_rows  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--out", default="results/attacks-labels")
    args = p.parse_args(argv)
    if args.seeds < 1:  # 0 or fewer ran nothing and printed NaN (or failed) with exit 0
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    import attacks
    import mechanisms
    from attacks.theory import gdp_auc_bound, pure_dp_auc_bound
    from attacks.view import gaussian_sigma
    from privfed.federation import partition

    warnings.filterwarnings("ignore", message="noise backend")
    d = load_digits()
    rows = []
    make = {
        "laplace": lambda e: mechanisms.LaplaceCountNoise(epsilon=e),
        "geometric": lambda e: mechanisms.GeometricCountNoise(epsilon=e),
        "gaussian": lambda e: mechanisms.GaussianCountNoise(epsilon=e, delta=1e-5),
        "uniform": lambda e: mechanisms.UniformCountNoiseNoDP(epsilon=e),
    }
    for kind, mk in make.items():
        for eps in (0.1, 0.5, 1.0, 2.0, 4.0):
            if kind == "uniform" and eps > 1:
                continue
            ms = []
            for seed in range(args.seeds):
                part = partition(d["yp"], args.clients, "dirichlet", alpha=0.3, rng=seed)
                view, truth = scenario(d, "fedncm", part.clients, privacy=mk(eps), rng=seed)
                ms.append(attacks.evaluate("labels", view, truth))
            if kind in ("laplace", "geometric"):
                bound = pure_dp_auc_bound(eps)
            elif kind == "gaussian":  # mu-GDP with mu = 1 / sigma (sensitivity 1)
                bound = gdp_auc_bound(1.0 / gaussian_sigma(eps, 1e-5))
            else:
                bound = float("nan")  # no guarantee
            row = {"noise": kind, "eps": eps, "auc_bound": bound}
            for k in ("total_variation", "count_mae", "exact_support", "presence_auc", "singleton_auc"):
                row[k] = float(np.nanmean([m[k] for m in ms]))
            rows.append(row)
    out = Path(args.out)
    write_rows(out, "labels", rows, vars(args))
    print(
        markdown(
            rows,
            [
                "noise",
                "eps",
                "total_variation",
                "count_mae",
                "exact_support",
                "presence_auc",
                "singleton_auc",
                "auc_bound",
            ],
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
