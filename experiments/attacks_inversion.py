"""Feature inversion from shared class sums on digits: every attack, the strongest named, against the prior.

Each setting runs the inversion suite of :func:`attacks.strongest` on the
same released cells: pixel optimisation with TV (``pixel``), the feature
decoder trained on the augmented public bank plus refinement (``learned``),
the set decoder returning n images for a mean of n plus joint refinement
(``set``), the joint set attacker (``joint`` / ``joint-fit`` / ``joint-wide``: bank search by
mean feature, n latent codes of the feature decoder optimised jointly against
the released mean and, where uploaded, the client's second moment, joint
pixel polish; attacks.inversion.joint), and, where second moments are uploaded,
unmixing then the learned inversion (``two-stage``); ``per-cell`` keeps, per
released cell, the member whose reconstructions' mean feature best matches
the release (chosen without the truth).  Scores (attacks.inversion.attack): Hungarian matching
per cell, identification per true image among all 899 private images,
against the n-guess prior (k-means centres of the public class, as many
guesses as reconstructions) and chance; delta-PSNR over that prior with
standard errors clustered by cell.

* clean means of n = 1, 2, 4, 8, 16 records (FedNCM uploads, one class per client);
* record-level Gaussian DP at n = 1 and 2 (``--dp-ns``; GaussianMechanism, clip = public median norm);
* secure aggregation (the server sees only the all-client class sums);
* FedCGS (mean + second moment) at n = 2, 4.

The decoders train once (minutes on 2 cores), each until its validation loss
stops improving, and are cached by the hash of what determines them
(PRIVFED_CACHE); the record's ``config.feature_decoder`` holds the steps each
took and its validation loss (``set_decoders``: per n).  ``--train-steps``
caps the set decoders' steps (the attack's default cap otherwise).

Outputs: ``inversion.csv`` / ``inversion.json`` under ``--out`` (every
metric of every attack per setting, the configuration and the command),
``--results-json PATH`` a copy of the JSON (the README's attack numbers are
checked against it), and with ``--grids DIR`` the grids
``inversion_fedcof_n1.png`` / ``inversion_fedcof_eps1_n1.png`` (true images,
the strongest attack's reconstructions, the public prior) on FedCOF uploads.

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
from flag_types import count, float_list, int_list, out_path, seed  # noqa: E402

SUITE_ORDER = ("pixel", "learned", "set", "joint", "joint-fit", "joint-wide", "two-stage", "per-cell")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=count(1), default=40, help="released cells (clients) per setting")
    p.add_argument("--seed", type=seed, default=0)
    for flag, default, what in (  # the settings: records per released mean (or per client), '' = none
        ("--ns", "1,2,4,8,16", "clean settings: records per released mean"),
        ("--dp-ns", "1", "records per released mean in the DP settings"),
        ("--secure", "1,4", "secure-sum settings: records per released mean ('' = none)"),
        ("--cgs", "2,4", "FedCGS (mean + G) settings: records per client ('' = none)"),
    ):
        p.add_argument(flag, type=int_list(1, empty=True), default=default, help=what)
    p.add_argument(
        "--eps",
        type=float_list(positive=True, empty=True),
        default="10,1,0.1",
        help="record-level DP settings",
    )
    p.add_argument(
        "--train-steps",
        type=count(1),
        default=None,
        help="cap on the set decoders' training steps (default: the attack's)",
    )
    p.add_argument("--grids", default=None, help="folder for the FedCOF n = 1 grids (clean and eps = 1)")
    p.add_argument("--results-json", default=None, help="also write the results JSON here")
    p.add_argument("--out", type=out_path, default="results/attacks-inversion")
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
        extra = {} if args.train_steps is None else {"train_steps": args.train_steps}
        print(f"attacking {tag} n={n}: " + ", ".join(SUITE_ORDER), file=sys.stderr, flush=True)
        rep = attacks.strongest("inversion", view, truth, rng=args.seed, max_cells=args.cells, **extra)
        best = rep["attacks"][rep["strongest"]]
        row = {
            "setting": tag,
            "method": method,
            "n": n,
            "strongest": rep["strongest"],
            "strongest_by_delta_psnr": rep["strongest_by"]["delta_psnr"],
            **best,
            "seconds": round(time.perf_counter() - t, 1),
        }
        for name in SUITE_ORDER:
            m = rep["attacks"].get(name, {})
            for k in ("identification", "identification_se", "delta_psnr", "delta_psnr_se", "psnr", "ssim"):
                row[f"{name}:{k}"] = m.get(k, float("nan"))
        rows.append(row)
        print(
            tag,
            n,
            rep["strongest"],
            {
                k: round(best[k], 3)
                for k in ("identification", "baseline_identification", "delta_psnr", "delta_psnr_se")
            },
            {nm: round(rep["attacks"][nm].get("identification", float("nan")), 3) for nm in rep["attacks"]},
            row["seconds"],
            "s",
            flush=True,
        )

    from attacks.inversion.learned import progress_bars

    bars = progress_bars(True)  # decoder training and the joint attack's cells, with ETAs, on stderr
    bars.__enter__()
    for n in args.ns:
        run("clean", "fedncm", n, args.cells)
    clip = float(np.median(np.linalg.norm(d["public"].features, axis=1)))
    for eps in args.eps:
        for n in args.dp_ns:
            run(
                f"dp eps={eps:g}",
                "fedncm",
                n,
                args.cells,
                privacy=GaussianMechanism(epsilon=eps, delta=1e-5, clip=clip),
            )
    for n in args.secure:
        run("secure sum", "fedncm", n, None, secure_agg=True)
    for n in args.cgs:
        run("mean + G", "fedcgs", n, max(1, args.cells // 2))
    bars.__exit__(None, None, None)
    out = Path(args.out)
    import shlex

    config = {
        **vars(args),
        "command": "PYTHONPATH=. python experiments/attacks_inversion.py "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "seconds_total": round(time.perf_counter() - t_all, 1),
        "feature_decoder": _decoder_record(d, args),
    }
    write_rows(out, "inversion", rows, config)
    json_rows = [dict(r) for r in rows]
    if args.results_json:
        import json

        from privfed.results.writer import atomic_write

        Path(args.results_json).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"config": config, "rows": rows}, indent=2, default=str) + "\n"
        atomic_write(args.results_json, lambda tmp: tmp.write_text(text))
    if args.grids:
        _grids(d, args, Path(args.grids), clip)
    for r in rows:
        r["delta_psnr (se)"] = f"{r['delta_psnr']:+.2f} ({r['delta_psnr_se']:.2f})"
        for name in SUITE_ORDER:
            v = r[f"{name}:identification"]
            r[f"{name}"] = "n/a" if v != v else f"{v:.3f} / {r[f'{name}:delta_psnr']:+.2f}"
    print(
        f"feature decoder: {config['feature_decoder']['steps_trained']} steps, validation mse "
        f"{config['feature_decoder']['validation_mse']:.5f}"
    )
    print(
        markdown(
            rows,
            [
                "setting",
                "n",
                "strongest",
                "identification",
                "baseline_identification",
                "chance_identification",
                "psnr",
                "baseline_psnr",
                "delta_psnr (se)",
                "ssim",
                "baseline_ssim",
                *SUITE_ORDER,
            ],
        )
    )
    print()
    print("\n".join(readme_table(json_rows)))
    print(f"total {time.perf_counter() - t_all:.0f} s; wrote {out}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    clean = [r for r in rows if r["setting"] == "clean"]
    ns = [r["n"] for r in clean]
    for name in SUITE_ORDER[:5]:
        ax[0].plot(ns, [r[f"{name}:identification"] for r in clean], marker="o", label=name)
        ax[1].plot(ns, [r[f"{name}:delta_psnr"] for r in clean], marker="o", label=name)
    ax[0].plot(ns, [r["baseline_identification"] for r in clean], "k:", label="prior (strongest's guesses)")
    ax[0].plot(ns, [r["chance_identification"] for r in clean], "k--", label="chance")
    ax[1].axhline(0, color="k", lw=0.8)
    for a in ax:
        a.set_xscale("log", base=2), a.set_xlabel("n records in the shared mean"), a.legend(fontsize=7)
    (
        ax[0].set_ylabel("identification (per true image)"),
        ax[1].set_ylabel("PSNR gain over the n-guess prior (dB)"),
    )
    fig.tight_layout()
    fig.savefig(out / "inversion.png", dpi=120)
    return 0


def _decoder_record(d, args) -> dict:
    """The decoders the learned, set and joint attacks used: training length and validation loss of each."""
    import attacks
    from attacks.inversion.learned import feature_decoder, set_decoder

    extra = {} if args.train_steps is None else {"train_steps": args.train_steps}
    att = attacks.get("inversion", backend="set", **extra)
    cfg = att.decoder_config()
    dec = feature_decoder(d["backbone"], d["public"], 10, cfg)  # cached by hash: the one the attacks used
    sets = {}
    for n in sorted(set(args.ns) | set(args.dp_ns)):
        if 1 < n <= int(att.params["max_set"]):  # the set decoders the clean and DP settings trained
            s = set_decoder(d["backbone"], d["public"], 10, n, cfg)
            sets[str(n)] = {
                "steps_trained": s.steps_trained,
                "validation_mse": s.val_loss,
                "cache_key": s.key,
            }
    return {
        "config": cfg.as_dict(),
        "steps_trained": dec.steps_trained,
        "validation_mse": dec.val_loss,
        "cache_key": dec.key,
        "set_decoders": sets,
    }


def readme_table(rows: list[dict]) -> list[str]:
    """The README's inversion table (markdown lines) from the results rows (the JSON's ``rows``)."""

    def f(v):
        return "n/a" if v != v else f"{v:.3f}"  # NaN: the attack does not apply

    lines = [
        "| setting | n | strongest | identification (SE) | n-guess prior | chance | ΔPSNR over the prior (SE) | "
        + " | ".join(SUITE_ORDER)
        + " |",
        "|" + " --- |" * (7 + len(SUITE_ORDER)),
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['n']} | {r['strongest']} | {f(r['identification'])} "
            f"({r['identification_se']:.3f}) | "
            f"{f(r['baseline_identification'])} | {f(r['chance_identification'])} | "
            f"{r['delta_psnr']:+.2f} dB ({r['delta_psnr_se']:.2f}) | "
            + " | ".join(f(r[f"{name}:identification"]) for name in SUITE_ORDER)
            + " |"
        )
    return lines


def _grids(d, args, folder: Path, clip: float) -> None:
    """Grids of the strongest attack on FedCOF uploads at n = 1, clean and at eps = 1 (record level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import attacks
    from attacks.inversion.attack import challenge_cells
    from attacks.strongest import SUITES
    from attacks.view import class_groups
    from mechanisms import GaussianMechanism
    from privfed.attack import grid_figure

    folder.mkdir(parents=True, exist_ok=True)
    extra = {} if args.train_steps is None else {"train_steps": args.train_steps}
    for eps, name in ((None, "inversion_fedcof_n1.png"), (1.0, "inversion_fedcof_eps1_n1.png")):
        cl = class_groups(d["yp"], 1, np.random.default_rng(args.seed + 1), max_groups=args.cells)
        kw = {} if eps is None else {"privacy": GaussianMechanism(epsilon=eps, delta=1e-5, clip=clip)}
        view, truth = scenario(d, "fedcof", cl, rng=args.seed, **kw)
        rep = attacks.strongest("inversion", view, truth, rng=args.seed, max_cells=args.cells, **extra)
        # the strongest single attack (the per-cell report mixes members; its best member is drawn)
        ok = {
            k: v for k, v in rep["attacks"].items() if k in SUITES["inversion"] and "not_applicable" not in v
        }
        best = max(ok, key=lambda k: (ok[k]["identification"], ok[k]["delta_psnr"]))
        attack, params = SUITES["inversion"][best]
        att = attacks.get(attack, **{**extra, "max_cells": args.cells, **params})
        cells = challenge_cells(view, truth, np.random.default_rng(args.seed), args.cells)
        res = att.run(view, np.random.default_rng(args.seed), cells=cells)
        m = att.score(res, truth)
        where = "no noise" if eps is None else f"eps={eps:g} record level, local noise"
        fig = grid_figure(
            res,
            truth,
            f"fedcof, n=1, {where}: strongest single attack {best!r}, "
            f"identification {m['identification']:.2f}",
        )
        fig.savefig(folder / name, dpi=120)
        plt.close(fig)
        print("wrote", folder / name, flush=True)


if __name__ == "__main__":
    from privfed.commands.start import run_script

    run_script(main)
