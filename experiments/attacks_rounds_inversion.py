"""Feature inversion against the multi-round FedLog release, with the strongest attack of privfed.

Multi-round FedLog (:mod:`privfed.rounds`) releases, every round r,
each client's per-class sums of the augmented features [1, f_r(x)] of its
records (plain FedLog: every client's upload; under secure aggregation only
their sum).  The inversion suite (:func:`attacks.strongest`, the same
attackers and knowledge as ``experiments/attacks_inversion.py``: backbone,
public images, the augmented bank) needs the feature map f_r.  It is public
when the clients keep the public body frozen (``local_epochs = 0``, family
``cnn``: the digits backbone itself); this script measures that release:

1. ``run_rounds`` runs the protocol (the default recipe, ``--rounds`` rounds);
2. every client's upload is recomputed through the public body
   (``RoundsSetup``, ``public_body``, ``client_statistic``) and checked
   against the run: their sum equals every round's released statistic
   (relative error recorded, at most 1e-9), they equal the digits features
   of the same records summed per client and class, and the rounds' statistics are
   identical (a frozen body releases the same statistic every round, so R
   rounds tell the server what one does);
3. the strongest inversion suite attacks the per-client release (plain
   FedLog) and, once, its all-client sum (secure aggregation: the class
   totals, the same for any number of clients).

Settings: ``--clients`` federations of the recipe's shards (2 classes per
client): 20 clients (the recipe's; 22-23 records per released cell), 100
(4-5) and 300 (1-2).  Trained bodies (``local_epochs`` > 0) pass every
round's records through each client's private body, which FedLog does not
send: not measured here.

    PYTHONPATH=. python experiments/attacks_rounds_inversion.py --results-json docs/attacks-rounds-inversion.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks_common import load_digits  # noqa: E402
from flag_types import count, int_list, seed  # noqa: E402

SUITE_ORDER = ("pixel", "learned", "set", "joint", "joint-fit", "joint-wide", "per-cell")


def rounds_release(d: dict, clients: int, rounds: int, seed: int = 0) -> dict:
    """Run multi-round FedLog with frozen public bodies; the per-client release and its checks.

    Returns ``counts`` (K, C) and ``sums`` (K, C, d) of every client's upload,
    ``owners`` (N,) the client of every private record, the largest relative
    difference between their sum and each round's released statistic
    (``max_rel_error``) and whether every round released the same statistic
    (``rounds_identical``), and the largest relative difference between the
    uploads' sums and the digits backbone's features of the same records
    summed per client and class (``max_rel_error_vs_features``).
    """
    from attacks.inversion.learned import backbone_digest
    from privfed.errors import InputError
    from privfed.rounds import RoundsSetup, client_statistic, run_rounds
    from privfed.rounds.bodies import public_body

    cfg = dict(clients=clients, rounds=rounds, families=("cnn",), local_epochs=0, seed=seed)
    result = run_rounds(**cfg)
    setup = RoundsSetup(result.config)
    if not np.array_equal(np.asarray(setup.y_all), d["yp"]):
        raise InputError("the rounds run's private records are not the digits private split")
    body = public_body("cnn", seed)
    if backbone_digest(body) != backbone_digest(d["backbone"]):
        raise InputError("the frozen FedLog body is not the digits backbone the decoders are trained for")
    A = np.stack(
        [client_statistic(body, *setup.client_data(k)[:2], num_classes=setup.C) for k in range(clients)]
    )
    total = A.sum(0)
    # independently: the digits backbone's features of the private records, summed per client and class
    S = np.zeros_like(A[:, :, 1:])
    up = np.asarray(setup.clients) >= 0
    np.add.at(S, (np.asarray(setup.clients)[up], d["yp"][up]), d["Fp"][up])
    rel_features = float(np.abs(S - A[:, :, 1:]).max() / np.abs(S).max())
    stats = [np.asarray(h["statistic"], np.float64) for h in result.history]
    rel = max(float(np.abs(s - total).max() / np.abs(total).max()) for s in stats)
    return {
        "counts": A[:, :, 0],
        "sums": A[:, :, 1:],
        "owners": np.asarray(setup.clients),
        "max_rel_error": rel,
        "max_rel_error_vs_features": rel_features,
        "rounds_identical": all(np.array_equal(s, stats[0]) for s in stats),
        "rounds": len(stats),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()},
    }


def views(d: dict, release: dict, secure: bool = True):
    """(setting, ServerView, GroundTruth) of the per-client release and (``secure``) of its secure sum."""
    from attacks.knowledge import GroundTruth
    from attacks.view import ServerView
    from privfed.stats import ClientStats

    stats = ClientStats(counts=release["counts"], sums=release["sums"])
    truth = GroundTruth(features=d["Fp"], labels=d["yp"], clients=release["owners"], images=d["imp"])
    for summed in (False, True) if secure else (False,):
        view = ServerView.from_stats(
            stats,
            method="fedlog",
            secure_agg=summed,
            backbone=d["backbone"],
            public=d["public"],
        )
        yield ("secure sum" if summed else "uploads"), view, truth


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--clients",
        type=int_list(2),
        default="20,100,300",
        help="federation sizes (clients of the recipe's shards)",
    )
    p.add_argument("--rounds", type=count(1), default=10)
    p.add_argument("--cells", type=count(1), default=30, help="released cells attacked per setting")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--results-json", default=None)
    args = p.parse_args(argv)
    import attacks

    t_all = time.perf_counter()
    d = load_digits(args.seed)
    rows, checks = [], []
    for i, K in enumerate(args.clients):
        release = rounds_release(d, K, args.rounds, args.seed)
        checks.append(
            {
                "clients": K,
                "rounds": release["rounds"],
                "max_rel_error": release["max_rel_error"],
                "rounds_identical": release["rounds_identical"],
                "max_rel_error_vs_features": release["max_rel_error_vs_features"],
                "run": release["config"],
            }
        )
        # the features cache is float32: its sums agree to float32 rounding, the run's own to float64
        bad = release["max_rel_error"] > 1e-9 or release["max_rel_error_vs_features"] > 1e-5
        if bad or not release["rounds_identical"]:
            raise RuntimeError(f"the recomputed uploads are not the release: {checks[-1]}")
        n = release["counts"][release["counts"] > 0.5]
        # the secure sum is the class totals over every record: the same release for any number of clients
        for setting, view, truth in views(d, release, secure=i == 0):
            t = time.perf_counter()
            print(f"attacking {setting}, {K} clients", file=sys.stderr, flush=True)
            rep = attacks.strongest("inversion", view, truth, rng=args.seed, max_cells=args.cells)
            best = rep["attacks"][rep["strongest"]]
            row = {
                "setting": setting,
                "clients": K,
                "rounds": release["rounds"],
                "median_records_per_cell": float(np.median(n))
                if setting == "uploads"
                else float(np.median(release["counts"].sum(0))),
                "n": int(round(np.median(n))) if setting == "uploads" else int(release["counts"].sum()),
                "strongest": rep["strongest"],
                **{k: v for k, v in best.items() if not isinstance(v, (dict, list))},
                "seconds": round(time.perf_counter() - t, 1),
            }
            for name in SUITE_ORDER:
                m = rep["attacks"].get(name, {})
                for k in ("identification", "identification_se", "delta_psnr"):
                    row[f"{name}:{k}"] = m.get(k, float("nan"))
            rows.append(row)
            print(setting, K, rep["strongest"], round(best["identification"], 3), flush=True)
    config = {
        **vars(args),
        "command": "PYTHONPATH=. python experiments/attacks_rounds_inversion.py "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "checks": checks,
        "seconds_total": round(time.perf_counter() - t_all, 1),
    }
    if args.results_json:
        from privfed.results.writer import atomic_write

        text = json.dumps({"config": config, "rows": rows}, indent=2, default=str) + "\n"
        atomic_write(args.results_json, lambda tmp: tmp.write_text(text))
    for r in rows:
        print(
            r["setting"],
            r["clients"],
            r["median_records_per_cell"],
            r["strongest"],
            f"{r['identification']:.3f} ({r['identification_se']:.3f})",
            f"chance {r['chance_identification']:.3f} prior {r['baseline_identification']:.3f}",
        )
    return 0


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
