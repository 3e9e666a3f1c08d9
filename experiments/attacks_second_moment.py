"""Second moments G_k = sum_i f_i f_i^T: subspace membership and unmixing into individual features.

* Subspace membership: AUC of ||P_k y||^2 / ||y||^2 (P_k the signal subspace
  of G_k) against n, clean, and against the Gaussian noise on G (sigma per
  entry; features clipped to the public median norm).
* Unmixing: symmetric NMF of G_k (alone, or augmented with the class sums and
  counts) into n non-negative features: Hungarian-matched cosine and
  nearest-neighbour identification against n.

    python experiments/attacks_second_moment.py [--out results/attacks-second-moment]
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
    p.add_argument("--clients", type=int, default=12, help="clients unmixed per n")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write experiments/results/attacks_second_moment.json, the record the README's figures are checked against",
    )
    p.add_argument("--out", default="results/attacks-second-moment")
    args = p.parse_args(argv)
    import attacks
    from attacks.view import NoiseSpec, class_groups

    warnings.filterwarnings("ignore", message="noise backend")
    d = load_digits()
    sub, unm = [], []
    for n in (1, 2, 4, 8, 16, 32, 64):
        cl = class_groups(d["yp"], n, np.random.default_rng(n))
        for s in (0.0, 30.0, 100.0, 300.0, 1000.0):
            spec = NoiseSpec(sigma={"second": s}, clip=d["clip"]) if s else NoiseSpec(clip=d["clip"])
            view, truth = scenario(d, "fed3r", cl, privacy=spec, rng=0)
            m = attacks.evaluate("subspace", view, truth, rng=0)
            sub.append(
                {
                    "n": n,
                    "sigma_second": s,
                    "auc": m["auc"],
                    "auc_se": m["auc_se"],
                    "tpr@0.01": m["tpr@0.01"],
                    "mean_rank": m["mean_rank"],
                }
            )
        if n <= 16:
            cl = class_groups(d["yp"], n, np.random.default_rng(100 + n), max_groups=args.clients)
            view, truth = scenario(d, "fedcgs", cl)
            for use_sums in (False, True):
                m = attacks.evaluate("unmixing", view, truth, rng=0, use_sums=use_sums)
                unm.append({"n": n, "with_sums": use_sums, **m})
        print("n", n, "done", flush=True)
    out = Path(args.out)
    write_rows(out, "subspace", sub, vars(args))
    write_rows(out, "unmixing", unm, vars(args))
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from experiments import recorded

        cmd = recorded.command("experiments/attacks_second_moment.py", argv)
        print(
            f"recorded {recorded.save('attacks_second_moment', dict(config=vars(args), subspace=sub, unmixing=unm), cmd)}"
        )
    table = []
    for n in sorted({r["n"] for r in sub}):
        row = {"n": n}
        row.update({f"auc@sigma={r['sigma_second']:g}": r["auc"] for r in sub if r["n"] == n})
        table.append(row)
    print(markdown(table, list(table[0])))
    print()
    print(
        markdown(
            unm, ["n", "with_sums", "matched_cosine", "identification", "label_accuracy", "mean_residual"]
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
