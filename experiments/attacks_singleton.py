"""Singleton exposure: the fraction of samples uploaded as a class mean of one, for every partition.

A client with exactly one sample of a class uploads that sample's raw
feature (sum = mean = f).  Measured on the digits private split (899
samples) for Dirichlet label skew (FedNCM / FedCOF scheme) at several
concentrations and client sizes, the FedCGS per-class Dirichlet, shards and
IID; the attack (read every cell whose count rounds to 1) is checked to
recover each exposed feature exactly, also under Laplace count noise.

    python experiments/attacks_singleton.py [--seeds 3] [--out results/attacks-singleton]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks_common import load_digits, markdown, scenario, write_rows  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--record",
        action="store_true",
        help="also write experiments/results/attacks_singleton.json, the record the README's figures are checked against",
    )
    p.add_argument("--out", default="results/attacks-singleton")
    args = p.parse_args(argv)
    if args.seeds < 1:  # 0 or fewer ran nothing and printed NaN (or failed) with exit 0
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    import attacks
    from attacks.singleton import singleton_fraction
    from attacks.view import NoiseSpec
    from privfed.federation import partition

    d = load_digits()
    N = d["yp"].size
    settings = []
    for alpha in (0.1, 0.3, 1.0):
        for spc in (10, 20, 50):
            settings.append(("dirichlet", dict(alpha=alpha), N // spc, spc))
    settings += [
        ("dirichlet-class", dict(alpha=0.5), 30, N // 30),
        ("shards", {}, 45, N // 45),
        ("iid", {}, 90, N // 90),
    ]
    rows = []
    for scheme, kw, K, spc in settings:
        fr, ex, exn = [], [], []
        for seed in range(args.seeds):
            part = partition(d["yp"], K, scheme, rng=seed, **kw)
            fr.append(singleton_fraction(d["yp"], part.clients))
            view, truth = scenario(d, "fedncm", part.clients)
            ex.append(attacks.evaluate("singleton", view, truth)["exposed_fraction"])
            noisy, truth = scenario(
                d,
                "fedncm",
                part.clients,
                privacy=NoiseSpec(count_kind="laplace", count_epsilon=1.0),
                rng=seed,
            )
            exn.append(attacks.evaluate("singleton", noisy, truth)["exposed_fraction"])
        rows.append(
            {
                "scheme": scheme,
                **kw,
                "clients": K,
                "samples_per_client": spc,
                "singleton_fraction": float(np.mean(fr)),
                "exposed_clean": float(np.mean(ex)),
                "exposed_laplace_eps1": float(np.mean(exn)),
                "seeds": args.seeds,
            }
        )
    out = Path(args.out)
    write_rows(out, "singleton", rows, vars(args))
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from experiments import recorded

        cmd = recorded.command("experiments/attacks_singleton.py", argv)
        print(f"recorded {recorded.save('attacks_singleton', dict(config=vars(args), rows=rows), cmd)}")
    print(
        markdown(
            rows,
            [
                "scheme",
                "alpha",
                "clients",
                "samples_per_client",
                "singleton_fraction",
                "exposed_clean",
                "exposed_laplace_eps1",
            ],
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
