"""Every method on the embedded default: accuracy and upload bytes.

100 clients, Dirichlet alpha = 0.1 (the FedNCM / FedCOF scheme), 5 seeds, no
privacy.  Prints a markdown table (used in the README) and writes CSV/JSON.

    python experiments/methods_table.py [--clients 100] [--alpha 0.1] [--seeds 5] [--out results/methods_table]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

import privfed
from privfed.data import load_dataset
from privfed.federation import partition

# The papers' configurations where they differ from the defaults.
VARIANTS = [
    ("fedncm", {}),
    ("fed3r", {}),
    ("fed3r", {"bias": False}),
    ("fed3r-within", {}),
    ("fedcof", {}),
    ("fedcof", {"means_per_client": 4}),
    ("fedcof-oracle", {}),
    ("fedcgs", {}),
    ("fedcgs", {"covariance": "within"}),
    ("fedlog", {}),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", default="results/methods_table")
    args = p.parse_args(argv)
    if args.seeds < 1:  # 0 or fewer ran nothing and printed NaN (or failed) with exit 0
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    ds = load_dataset("digits")
    rows = []
    for name, params in VARIANTS:
        accs, upload, notes = [], [], set()
        for seed in range(args.seeds):
            part = partition(ds.train_labels, args.clients, "dirichlet", alpha=args.alpha, rng=seed)
            F, y, k = part.apply(ds.train_features, ds.train_labels)
            head = privfed.fit(name, F, y, k, num_classes=ds.num_classes, random_state=seed, **params)
            accs.append(head.score(ds.test_features, ds.test_labels))
            upload.append(head.upload_bytes["per_client"])
            notes.update(n.split(":")[0] for n in head.notes)
        label = name + ("" if not params else " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")")
        cls = privfed.methods.get_class(name)
        uploads = ", ".join(sorted(cls.requires))
        needs = "per client" if cls.per_client else "sums only"
        rows.append(
            dict(
                method=label,
                uploads=uploads,
                server_needs=needs,
                accuracy_mean=float(np.mean(accs)),
                accuracy_std=float(np.std(accs, ddof=1)),
                upload_bytes_per_client=float(np.mean(upload)),
                notes="; ".join(sorted(notes)),
            )
        )
    print(
        f"digits, {args.clients} clients, Dirichlet alpha={args.alpha}, {args.seeds} seeds "
        f"(N_train={ds.train_features.shape[0]}, d={ds.train_features.shape[1]}, test={ds.test_features.shape[0]})\n"
    )
    print("| method | accuracy (mean ± std) | upload bytes / client | uploads | server needs |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['method']} | {r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} | "
            f"{r['upload_bytes_per_client']:,.0f} | {r['uploads']} | {r['server_needs']} |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "methods_table.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "methods_table.json").write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
