"""The attack sweep behind ``python -m privfed.attack``: its resolved configuration and the runs.

:func:`resolve_config` turns the command line into an :class:`AttackConfig`;
:func:`run_attacks` builds the server's view of every method x epsilon x n x
seed on digits, runs the attack on its challenge and, for tracing and
inversion, the strongest attack of the suite on the same challenge
(:mod:`attacks.strongest`), one row per run.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import attacks
from privfed import methods as _methods
from privfed.commands.common import (
    as_float,
    as_int,
    check_secure_agg,
    heartbeat,
    parse_float_list,
    parse_int_list,
    parse_seeds,
    parse_str_list,
    placement_word,
)
from privfed.errors import ConfigError, MissingDependencyError

__all__ = ["AttackConfig", "resolve_config", "run_attacks"]


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
    secure_agg: str
    count_noise: str | None
    seeds: tuple[int, ...]
    max_groups: int
    attack_params: dict = field(default_factory=dict)
    data_seed: int = 0
    device: str = "cpu"
    out: str = ""
    strongest: bool = True


def resolve_config(args: argparse.Namespace) -> AttackConfig:
    from attacks.view import COUNT_NOISE_KINDS
    from privfed.federation import available_schemes

    attacks.get_class(args.attack)  # ConfigError listing the names
    methods = tuple(parse_str_list(args.method, "--method"))
    for m in methods:
        _methods.get_class(m)
    eps = tuple(parse_float_list(args.eps, "--eps", positive=True))
    delta = as_float(args.delta, "--delta")
    if not 0 < delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {delta:g}")
    clip = None if args.clip is None else as_float(args.clip, "--clip")
    if clip is not None and not (clip > 0 and math.isfinite(clip)):
        raise ConfigError(f"--clip must be a finite number > 0, got {clip:g}")
    ns = tuple(parse_int_list(args.n, "--n", minimum=1))
    if args.partition != "groups" and args.partition not in available_schemes():
        raise ConfigError(
            f"--partition {args.partition!r} unknown; use groups or one of {available_schemes()}"
        )
    if args.count_noise is not None and args.count_noise not in COUNT_NOISE_KINDS:
        raise ConfigError(f"--count-noise must be one of {list(COUNT_NOISE_KINDS)}, got {args.count_noise!r}")
    clients = as_int(args.clients, "--clients", minimum=1)
    max_groups = as_int(args.max_groups, "--max-groups", minimum=1)
    alpha = as_float(args.alpha, "--alpha")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ConfigError(f"--alpha must be a finite number > 0, got {alpha:g}")
    # --seeds N is a count (0..N-1) or a list, as in the trade-off; the older --seed keeps its meaning (a list).
    if args.seeds is not None and args.seed_list is not None:
        raise ConfigError("pass --seeds or --seed, not both")
    if args.seed_list is not None:
        seeds = tuple(parse_int_list(args.seed_list, "--seed"))
    else:
        seeds = (0,) if args.seeds is None else parse_seeds(args.seeds, "--seeds")
    secure = "none" if args.secure_agg is None else check_secure_agg(args.secure_agg)
    params: dict[str, Any] = {}
    for flag in ("backend", "source", "steps", "max_cells"):
        v = getattr(args, flag)
        if v is not None:
            if args.attack != "inversion":
                raise ConfigError(f"--{flag.replace('_', '-')} applies to --attack inversion only")
            params[flag] = (
                as_int(v, f"--{flag.replace('_', '-')}", minimum=1) if flag in ("steps", "max_cells") else v
            )
    if params.get("backend") == "dip" and "steps" in params:
        params["dip_steps"] = params.pop("steps")
    attacks.get(args.attack, **params)  # validate the parameters now
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ConfigError(f"--device must be cpu or cuda[:i], got {args.device!r}")
    if args.attack == "inversion" and importlib.util.find_spec("skimage") is None:
        raise MissingDependencyError(
            "--attack inversion scores reconstructions with SSIM from scikit-image, "
            "which is not installed: pip install scikit-image"
        )
    return AttackConfig(
        attack=args.attack,
        methods=methods,
        epsilons=eps,
        delta=delta,
        clip=clip,
        ns=ns if args.partition == "groups" else (0,),
        partition=args.partition,
        clients=clients,
        alpha=alpha,
        secure_agg=secure,
        count_noise=args.count_noise,
        seeds=seeds,
        max_groups=max_groups,
        attack_params=params,
        device=args.device,
        out="" if args.out is None else str(args.out),
        strongest=bool(args.strongest) and args.attack in _SUITE_KINDS,
    )


#: Attacks with a suite whose strongest member is reported next to the individual attack.
_SUITE_KINDS = ("tracing", "inversion")
#: Parameters that pick a suite member (its own), not shared by the whole suite.
_MEMBER_PARAMS = ("backend", "source", "test", "reference")


def _strongest_columns(cfg: AttackConfig, view, truth, challenge: dict, rng, progress=None) -> dict[str, Any]:
    """The strongest attack of ``cfg.attack``'s suite on ``challenge``: its name, headline metrics, and
    every suite member's headline metrics as ``<name>:<metric>``."""
    from attacks.strongest import HEADLINE, strongest

    common = {k: v for k, v in cfg.attack_params.items() if k not in _MEMBER_PARAMS}
    rep = strongest(cfg.attack, view, truth, rng, challenge=challenge or None, progress=progress, **common)
    first, second = HEADLINE[cfg.attack]
    best2 = rep["strongest_by"][second]
    best = rep["attacks"][rep["strongest"]]
    out: dict[str, Any] = {
        "strongest_attack": rep["strongest"],
        f"strongest_{first}": rep["value"],
        f"strongest_{first}_se": best.get(f"{first}_se", float("nan")),
        f"strongest_by_{second}": best2,
        f"strongest_{second}": rep["attacks"][best2].get(second, float("nan")),
    }
    if cfg.attack == "inversion":  # chance and the n-guess prior for the strongest attack's guesses
        out["strongest_chance_identification"] = best.get("chance_identification", float("nan"))
        out["strongest_baseline_identification"] = best.get("baseline_identification", float("nan"))
    for name, m in rep["attacks"].items():
        for metric in (first, second):
            out[f"{name}:{metric}"] = m.get(metric, float("nan"))
    return out


def _load(cfg: AttackConfig):
    import torch

    from attacks.view import PublicData
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    sp = digits_splits(cfg.data_seed)
    bb = get_backbone(seed=cfg.data_seed)
    if cfg.device != "cpu":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {cfg.device} requested but torch sees no CUDA device; use --device cpu"
            )
        bb = bb.to(cfg.device)
    data = {
        "private": (extract_features(bb, sp.private_images), sp.private_labels, sp.private_images),
        "test": (extract_features(bb, sp.test_images), sp.test_labels, sp.test_images),
        "num_classes": sp.num_classes,
    }
    Fpub = extract_features(bb, sp.public_images)
    public = PublicData(labels=sp.public_labels, features=Fpub, images=sp.public_images)
    return bb, data, public


def _clients(cfg: AttackConfig, labels, n: int, rng: np.random.Generator) -> tuple[np.ndarray, int | None]:
    """Client ids and the public number of clients (the configured partition's; None for class groups,
    whose count follows from the labels by design of the attack curve)."""
    from attacks.view import class_groups
    from privfed.federation import partition

    if cfg.partition == "groups":
        return class_groups(labels, n, rng, max_groups=cfg.max_groups), None
    part = partition(labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=rng)
    return part.clients, int(part.num_clients)


def _privacy(cfg: AttackConfig, method, eps: float, clip: float):
    import mechanisms

    if math.isinf(eps):
        return None
    if cfg.count_noise is not None:
        if cfg.count_noise == "gaussian":
            return mechanisms.GaussianCountNoise(epsilon=eps, delta=cfg.delta)
        cls = {
            "laplace": mechanisms.LaplaceCountNoise,
            "geometric": mechanisms.GeometricCountNoise,
            "uniform": mechanisms.UniformCountNoiseNoDP,
        }[cfg.count_noise]
        return cls(epsilon=eps)
    blocks = ("sums", "counts", "second") if "second" in method.requires else ("sums", "counts")
    return mechanisms.GaussianMechanism(epsilon=eps, delta=cfg.delta, clip=clip, blocks=blocks)


def _trust_columns(cfg: AttackConfig, eps: float, view) -> dict[str, Any]:
    """Where the noise was added and the guarantee, for one row (from the run's settings and view)."""
    if math.isinf(eps):
        return {
            "placement": "none",
            "protocol": cfg.secure_agg,
            "level": "-",
            "delta": 0.0,
            "calibration": "-",
            "private": False,
        }
    count = cfg.count_noise
    secure = cfg.secure_agg != "none"
    placement = placement_word(
        getattr(view.noise, "placement", None), "secure sum" if secure and count is None else "local"
    )
    private = count != "uniform"
    delta = 0.0 if count in ("laplace", "geometric") else (cfg.delta if private else float("nan"))
    cal = {"laplace": "pure", "geometric": "pure", "gaussian": "analytic", "uniform": "none (no DP)"}.get(
        count or "", "analytic"
    )
    return {
        "placement": placement,
        "protocol": cfg.secure_agg,
        "level": "record",
        "delta": delta,
        "calibration": cal,
        "private": private,
    }


def run_attacks(
    cfg: AttackConfig,
    *,
    progress: bool = True,
    records: list[dict[str, Any]] | None = None,
    on_record: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """Run the sweep; returns ``{"records": [...], "grids": [...], "clip": float, "timing": {...}}``.

    Rows are appended to ``records`` as each run finishes (a caller keeps them
    if the sweep is interrupted); ``on_record(records)`` is called after each.
    """
    import warnings

    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    bb, data, public = _load(cfg)
    Fp, yp, imp = data["private"]
    Ft, yt, imt = data["test"]
    num_classes = int(data["num_classes"])  # public: the data set's, never counted from the labels
    clip = cfg.clip if cfg.clip is not None else float(np.median(np.linalg.norm(public.features, axis=1)))
    t_data = time.perf_counter() - t0
    records = [] if records is None else records
    grids = []
    from attacks.inversion.learned import progress_bars
    from attacks.strongest import SUITES

    combos = [(m, e, n, s) for m in cfg.methods for e in cfg.epsilons for n in cfg.ns for s in cfg.seeds]
    # one step per attack run: the attack itself, then each member of the strongest suite
    per_run = 1 + (len(SUITES[cfg.attack]) if cfg.strongest and cfg.attack in SUITES else 0)
    bar = tqdm(
        total=len(combos) * per_run,
        disable=not progress,
        desc=f"attacking cells ({cfg.attack})",
        unit="attack",
        file=sys.stderr,
        delay=2,
    )
    with heartbeat(bar), progress_bars(progress):
        for mname, eps, n, seed in combos:
            where = (
                f"{mname} eps={eps:g}" + (f" n={n}" if cfg.partition == "groups" else "") + f" seed={seed}"
            )
            bar.set_postfix_str(f"{where}: {cfg.attack}", refresh=False)

            def step(name: str, finished: bool, where=where) -> None:
                if finished:
                    bar.update(1)
                else:
                    bar.set_postfix_str(f"{where}: strongest suite, {name}", refresh=True)

            method = _methods.get(mname)
            ss = np.random.SeedSequence(
                [seed, cfg.ns.index(n), cfg.epsilons.index(eps), cfg.methods.index(mname)]
            )
            r_part, r_view, r_att, r_strong = (np.random.default_rng(s) for s in ss.spawn(4))
            clients, num_clients = _clients(cfg, yp, n, r_part)
            privacy = _privacy(cfg, method, eps, clip)
            t1 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the fast noise backend's reminder
                view, truth = attacks.scenario(
                    mname,
                    Fp,
                    yp,
                    clients,
                    images=imp,
                    holdout_features=Ft,
                    holdout_labels=yt,
                    holdout_images=imt,
                    privacy=privacy,
                    secure_agg=cfg.secure_agg != "none",
                    backbone=bb,
                    public=public,
                    num_classes=num_classes,
                    num_clients=num_clients,
                    rng=r_view,
                )
            att = attacks.get(cfg.attack, **cfg.attack_params)
            extra: dict[str, Any] = {}
            if att.name == "differencing":  # the challenge is a second release, built by evaluate()
                result, metrics = None, att.evaluate(view, truth, r_att)
            else:
                challenge = _challenge(att, truth, view, r_att)
                result = att.run(view, r_att, **challenge)
                metrics = att.score(result, truth)
                if att.name == "tracing" and "test" not in cfg.attack_params:
                    # The same targets scored by the inner-product tracer, so both tests are reported.
                    other = "inner" if att.params["test"] != "inner" else "lrt"
                    att2 = attacks.get("tracing", test=other)
                    m2 = att2.score(att2.run(view, np.random.default_rng(0), **challenge), truth)
                    extra = {
                        f"{k}_{other}": v
                        for k, v in m2.items()
                        if k in ("auc", "auc_se", "tpr@0.01", "tpr@0.001", "eps_lower_bound")
                    }
            row = {
                "attack": cfg.attack,
                "method": mname,
                "eps": eps,
                **_trust_columns(cfg, eps, view),
                "clip": clip if (math.isfinite(eps) and cfg.count_noise is None) else None,
                "n": n,
                "partition": cfg.partition,
                "secure_agg": cfg.secure_agg,
                "count_noise": cfg.count_noise,
                "seed": seed,
                "clients": int(view.stats.num_clients) if view.per_client else int(clients.max() + 1),
                "noise": view.noise.guarantee,
                "seconds": round(time.perf_counter() - t1, 3),
            }
            row.update({k: v for k, v in metrics.items() if not isinstance(v, (list, dict, np.ndarray))})
            row.update(extra)
            bar.update(1)
            if cfg.strongest and result is not None:
                row.update(_strongest_columns(cfg, view, truth, challenge, r_strong, step))
            elif per_run > 1:
                bar.update(per_run - 1)
            records.append(row)
            if on_record is not None:
                on_record(records)
            if cfg.attack == "inversion" and seed == cfg.seeds[0]:
                grids.append((mname, eps, n, result, truth))
    bar.close()
    return {
        "records": records,
        "grids": grids,
        "clip": clip,
        "timing": {"data_s": t_data, "total_s": time.perf_counter() - t0},
    }


def _challenge(att, truth, view, rng) -> dict:
    """The challenge: cells to invert (those holding data), or targets to trace (members and non-members)."""
    name = att.name
    if name == "inversion":
        from attacks.inversion.attack import challenge_cells

        if view.stats.owners is not None:
            return {}
        return {"cells": challenge_cells(view, truth, rng, int(att.params["max_cells"]))}
    if name not in ("tracing", "subspace"):
        return {}
    from attacks.view import membership_targets

    targets, labels, ids, partners = membership_targets(view, truth, att.params["max_targets"], rng, name)
    return {"targets": targets, "target_ids": ids, "target_labels": labels, "partners": partners}
