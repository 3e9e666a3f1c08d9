"""``python -m privfed.attack``: what a curious server recovers, next to the formal budget.

Runs one attack (see :func:`attacks.available`) on the server's view of a
federation of the digits data set (scikit-learn digits through the
public-trained CNN backbone; the public split is the attacker's knowledge),
over methods x epsilons x group sizes x seeds, and writes

* ``results.csv``: one row per method x eps x n x seed with every metric;
* ``results.json``: the same rows plus the resolved configuration, seeds and
  package versions (``config.json`` holds the configuration alone);
* for ``--attack inversion``, ``grid_<method>_eps<eps>_n<n>.png``: true
  images, reconstructions and the public class-mean prior, one column each.

Example::

    python -m privfed.attack --attack inversion --method fedcof --eps inf,1,0.1 --n 1,4,16 --out results/inv

``eps=inf`` is the clean release (no clipping, no noise).  A finite eps uses
:class:`mechanisms.GaussianMechanism` (record level, analytic calibration)
with the clip bound ``--clip`` (default: the median feature norm on the
public split, which costs no privacy).  ``--partition groups`` puts exactly
``n`` samples of one class on each client (the controlled curves);
``dirichlet`` / ``iid`` / ... use :func:`privfed.federation.partition`.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from privfed._cli import cli_entry, parse_float_list, parse_int_list, parse_str_list, prepare_out_dir, versions, \
    write_json
from privfed.errors import ConfigError

__all__ = ["AttackConfig", "build_parser", "main", "resolve_config", "run_attacks"]

PROG = "privfed-attack"


@dataclass(frozen=True)
class AttackConfig:
    """Resolved configuration of one attack sweep (saved next to the results)."""

    attack: str
    methods: tuple[str, ...]
    epsilons: tuple[float, ...]
    delta: float
    clip: float | None
    ns: tuple[int, ...]
    partition: str
    clients: int
    alpha: float
    secure_agg: bool
    count_noise: str | None
    seeds: tuple[int, ...]
    max_groups: int
    attack_params: dict = field(default_factory=dict)
    data_seed: int = 0
    device: str = "cpu"
    out: str = ""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise ConfigError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    import attacks

    p = _Parser(prog=PROG, description="Attacks of an honest-but-curious server on shared statistics.",
                epilog="Lists are comma-separated. Example: %(prog)s --attack inversion --method fedcof "
                       "--eps inf,1,0.1 --out results/inv")
    a = p.add_argument
    a("--attack", required=True, help=f"one of {', '.join(attacks.available())}")
    a("--method", default="fedncm", help="method name(s) whose uploads the server sees (comma list)")
    a("--eps", default="inf", help="privacy budgets (comma list; inf = clean release)")
    a("--delta", type=float, default=1e-5, help="delta of the Gaussian mechanism (default 1e-5)")
    a("--clip", type=float, default=None, help="L2 clip bound for finite eps (default: public median norm)")
    a("--n", default="1,4,16", help="samples per client for --partition groups (comma list)")
    a("--partition", default="groups", help="groups, or a privfed.federation scheme (dirichlet, iid, ...)")
    a("--clients", type=int, default=30, help="number of clients for non-group partitions")
    a("--alpha", type=float, default=0.1, help="Dirichlet concentration")
    a("--max-groups", type=int, default=40, help="at most this many clients in --partition groups")
    a("--secure-agg", action="store_true", help="the server sees only the all-client sums")
    a("--count-noise", default=None, help="noise on the counts only (FedCOF App. I.1) instead of the Gaussian "
      "mechanism: laplace, geometric, gaussian or uniform (no DP)")
    a("--seed", default="0", help="seeds (comma list)")
    a("--backend", default=None, help="inversion backend: pixel, decoder or dip")
    a("--source", default=None, help="inversion source: mean or second (two-stage)")
    a("--steps", type=int, default=None, help="inversion optimisation steps (pixel or dip backend)")
    a("--max-cells", type=int, default=None, help="inversion: released cells inverted per run")
    a("--device", default="cpu", help="torch device for the backbone (cpu or cuda)")
    a("--out", required=True, help="output folder (new or empty)")
    a("--overwrite", action="store_true", help="allow a non-empty --out")
    return p


def resolve_config(args: argparse.Namespace) -> AttackConfig:
    import attacks
    from privfed import methods as _methods
    from privfed.federation import available_schemes
    from attacks.view import COUNT_NOISE_KINDS

    attacks.get_class(args.attack)  # ConfigError listing the names
    methods = tuple(parse_str_list(args.method, "--method"))
    for m in methods:
        _methods.get_class(m)
    eps = tuple(parse_float_list(args.eps, "--eps", positive=True))
    if not 0 < args.delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {args.delta}")
    if args.clip is not None and not (args.clip > 0 and math.isfinite(args.clip)):
        raise ConfigError(f"--clip must be a finite number > 0, got {args.clip}")
    ns = tuple(parse_int_list(args.n, "--n", minimum=1))
    if args.partition != "groups" and args.partition not in available_schemes():
        raise ConfigError(f"--partition {args.partition!r} unknown; use groups or one of {available_schemes()}")
    if args.count_noise is not None and args.count_noise not in COUNT_NOISE_KINDS:
        raise ConfigError(f"--count-noise must be one of {list(COUNT_NOISE_KINDS)}, got {args.count_noise!r}")
    if args.clients < 1 or args.max_groups < 1:
        raise ConfigError("--clients and --max-groups must be >= 1")
    seeds = tuple(parse_int_list(args.seed, "--seed"))
    params: dict[str, Any] = {}
    for flag, key in (("backend", "backend"), ("source", "source"), ("steps", "steps"), ("max_cells", "max_cells")):
        v = getattr(args, flag)
        if v is not None:
            if args.attack != "inversion":
                raise ConfigError(f"--{flag.replace('_', '-')} applies to --attack inversion only")
            params[key] = v
    if params.get("backend") == "dip" and "steps" in params:
        params["dip_steps"] = params.pop("steps")
    attacks.get(args.attack, **params)  # validate the parameters now
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ConfigError(f"--device must be cpu or cuda[:i], got {args.device!r}")
    return AttackConfig(attack=args.attack, methods=methods, epsilons=eps, delta=float(args.delta),
                        clip=args.clip, ns=ns if args.partition == "groups" else (0,), partition=args.partition,
                        clients=int(args.clients), alpha=float(args.alpha), secure_agg=bool(args.secure_agg),
                        count_noise=args.count_noise, seeds=seeds, max_groups=int(args.max_groups),
                        attack_params=params, device=args.device, out=str(args.out))


def _load(cfg: AttackConfig):
    import torch

    from attacks.view import PublicData
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    sp = digits_splits(cfg.data_seed)
    bb = get_backbone(seed=cfg.data_seed)
    if cfg.device != "cpu":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device} requested but torch sees no CUDA device; use --device cpu")
        bb = bb.to(cfg.device)
    data = {
        "private": (extract_features(bb, sp.private_images), sp.private_labels, sp.private_images),
        "test": (extract_features(bb, sp.test_images), sp.test_labels, sp.test_images),
    }
    Fpub = extract_features(bb, sp.public_images)
    public = PublicData(labels=sp.public_labels, features=Fpub, images=sp.public_images)
    return bb, data, public


def _clients(cfg: AttackConfig, labels, n: int, rng: np.random.Generator) -> np.ndarray:
    from attacks.view import class_groups
    from privfed.federation import partition

    if cfg.partition == "groups":
        return class_groups(labels, n, rng, max_groups=cfg.max_groups)
    return partition(labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=rng).clients


def _privacy(cfg: AttackConfig, method, eps: float, clip: float):
    if cfg.count_noise is not None:
        if math.isinf(eps):
            return None
        import mechanisms

        if cfg.count_noise == "gaussian":
            return mechanisms.GaussianCountNoise(epsilon=eps, delta=cfg.delta)
        cls = {"laplace": mechanisms.LaplaceCountNoise, "geometric": mechanisms.GeometricCountNoise,
               "uniform": mechanisms.UniformCountNoiseNoDP}[cfg.count_noise]
        return cls(epsilon=eps)
    if math.isinf(eps):
        return None
    from mechanisms import GaussianMechanism

    blocks = ("sums", "counts", "second") if "second" in method.requires else ("sums", "counts")
    return GaussianMechanism(epsilon=eps, delta=cfg.delta, clip=clip, blocks=blocks)


def run_attacks(cfg: AttackConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the sweep; returns ``{"records": [...], "grids": [...], "clip": float, "timing": {...}}``."""
    import warnings

    import attacks
    from privfed import methods as _methods
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    bb, data, public = _load(cfg)
    Fp, yp, imp = data["private"]
    Ft, yt, imt = data["test"]
    clip = cfg.clip if cfg.clip is not None else float(np.median(np.linalg.norm(public.features, axis=1)))
    t_data = time.perf_counter() - t0
    records, grids = [], []
    combos = [(m, e, n, s) for m in cfg.methods for e in cfg.epsilons for n in cfg.ns for s in cfg.seeds]
    for mname, eps, n, seed in tqdm(combos, disable=not progress, desc=cfg.attack):
        method = _methods.get(mname)
        ss = np.random.SeedSequence([seed, cfg.ns.index(n), cfg.epsilons.index(eps), cfg.methods.index(mname)])
        r_part, r_view, r_att = (np.random.default_rng(s) for s in ss.spawn(3))
        clients = _clients(cfg, yp, n, r_part)
        privacy = _privacy(cfg, method, eps, clip)
        t1 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the fast noise backend's reminder
            view, truth = attacks.scenario(mname, Fp, yp, clients, images=imp, holdout_features=Ft,
                                           holdout_labels=yt, holdout_images=imt, privacy=privacy,
                                           secure_agg=cfg.secure_agg, backbone=bb, public=public, rng=r_view)
        att = attacks.get(cfg.attack, **cfg.attack_params)
        if att.name == "differencing":  # the challenge is a second release, built by evaluate()
            result, metrics = None, att.evaluate(view, truth, r_att)
        else:
            result = att.run(view, r_att, **_challenge(att, truth, view, r_att))
            metrics = att.score(result, truth)
        row = {"attack": cfg.attack, "method": mname, "eps": eps, "delta": cfg.delta if math.isfinite(eps) else 0.0,
               "clip": clip if (math.isfinite(eps) and cfg.count_noise is None) else None, "n": n,
               "partition": cfg.partition, "secure_agg": cfg.secure_agg, "count_noise": cfg.count_noise,
               "seed": seed, "clients": int(view.stats.num_clients) if view.per_client else int(clients.max() + 1),
               "noise": view.noise.guarantee, "seconds": round(time.perf_counter() - t1, 3)}
        row.update({k: v for k, v in metrics.items() if not isinstance(v, (list, dict, np.ndarray))})
        records.append(row)
        if cfg.attack == "inversion" and seed == cfg.seeds[0]:
            grids.append((mname, eps, n, result, truth))
    return {"records": records, "grids": grids, "clip": clip,
            "timing": {"data_s": t_data, "total_s": time.perf_counter() - t0}}


def _challenge(att, truth, view, rng) -> dict:
    """The challenge: cells to invert (those holding data), or targets to trace (members and non-members)."""
    name = att.name
    if name == "inversion":
        from attacks.inversion import challenge_cells

        if view.stats.owners is not None:
            return {}
        return {"cells": challenge_cells(view, truth, rng, int(att.params["max_cells"]))}
    if name not in ("tracing", "subspace"):
        return {}
    from attacks.view import membership_targets

    targets, labels, ids = membership_targets(view, truth, att.params["max_targets"], rng, name)
    return {"targets": targets, "target_ids": ids, "target_labels": labels}


def _write_grid(path: Path, result, truth, title: str, columns: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = min(columns, result.images.shape[0])
    true_im = []
    for i in range(r):
        mem = np.flatnonzero((truth.clients == result.owners[i]) & (truth.labels == result.classes[i])) \
            if result.per_client and result.group_by_class else \
            np.flatnonzero(truth.clients == result.owners[i]) if result.per_client else \
            np.flatnonzero((truth.clients >= 0) & (truth.labels == result.classes[i]))
        if mem.size == 0:
            true_im.append(np.zeros(result.images.shape[1:]))
            continue
        d = ((truth.images[mem] - result.images[i]) ** 2).reshape(mem.size, -1).sum(1)
        true_im.append(truth.images[mem[d.argmin()]])
    fig, ax = plt.subplots(3, r, figsize=(1.2 * r, 3.9), squeeze=False)
    for i in range(r):
        for j, (im, lab) in enumerate(((true_im[i], "true"), (result.images[i], "reconstructed"),
                                       (result.baseline[i], "public prior"))):
            ax[j, i].imshow(im, cmap="gray", vmin=0, vmax=1)
            ax[j, i].set_xticks([]), ax[j, i].set_yticks([])
            if i == 0:
                ax[j, i].set_ylabel(lab, fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _body(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)
    out = prepare_out_dir(cfg.out, "attack", overwrite=args.overwrite)
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    res = run_attacks(cfg, progress=sys.stderr.isatty())
    records = res["records"]
    cols: list[str] = []
    for r in records:
        cols += [k for k in r if k not in cols]
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in records:
            w.writerow(r)
    config = {**asdict(cfg), "clip_used": res["clip"], "versions": versions(),
              "seeding": "numpy SeedSequence([seed, n index, eps index, method index]) spawned into "
                         "partition / view noise / attack generators"}
    write_json(out / "config.json", config)
    write_json(out / "results.json", {"config": config, "records": records, "timing": res["timing"]})
    for mname, eps, n, result, truth in res["grids"]:
        _write_grid(out / f"grid_{mname}_eps{eps:g}_n{n}.png", result, truth,
                    f"{mname}, eps={eps:g}, n={n}{', secure sum' if cfg.secure_agg else ''}")
    keys = [k for k in ("auc", "tpr@0.01", "identification", "delta_psnr", "psnr", "exposed_fraction", "exact_fraction",
                        "matched_cosine", "total_variation", "singleton_auc") if k in cols]
    for r in records:
        print(f"{r['method']:>12} eps={r['eps']:<6g} n={r['n']:<3} seed={r['seed']} " +
              " ".join(f"{k}={r[k]:.3f}" for k in keys if isinstance(r.get(k), (int, float))))
    print(f"wrote {out / 'results.csv'}")
    return 0


main = cli_entry(PROG, _body)

if __name__ == "__main__":
    sys.exit(main())
