"""The attack sweep behind ``python -m privfed.attack``: its resolved configuration and the runs.

:func:`resolve_config` turns the command line into an :class:`AttackConfig`;
:func:`run_attacks` builds the server's view of every method x epsilon x n x
seed on digits, runs the attack on its challenge and, for tracing and
inversion, the strongest attack of the suite on the same challenge
(:mod:`attacks.strongest`), one row per run.
"""

from __future__ import annotations

import math
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

import attacks
from privfed import methods as _methods
from privfed.commands.attack.config import AttackConfig, resolve_config
from privfed.commands.common import heartbeat, placement_word
from privfed.errors import ConfigError, InputError

__all__ = ["AttackConfig", "attack_data_rules", "resolve_config", "run_attacks"]


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


def attack_data_rules(
    cfg: AttackConfig, labels: np.ndarray, test_labels: np.ndarray, public_size: int
) -> dict[str, Any]:
    """The data rules of the sweep (:func:`privfed.results.record.data_rules`), for its first seed's partition."""
    from types import SimpleNamespace

    from privfed.results.record import data_rules

    ds = SimpleNamespace(
        name="digits",
        meta={"split": {"test": int(len(test_labels)), "public": int(public_size)}, "seed": cfg.data_seed},
        train_labels=labels,
        test_labels=test_labels,
        train_clients=None,
    )

    def groups(y, seed):
        k, _ = _clients(cfg, y, cfg.ns[0], seed)
        rule = (
            f"groups: exactly n samples of one class on each client, at most {cfg.max_groups} clients, n in "
            f"{','.join(map(str, cfg.ns))} (counts for n={cfg.ns[0]})"
        )
        return k, rule

    return data_rules(
        ds,
        clients=cfg.clients if cfg.partition != "groups" else cfg.max_groups,
        partition=cfg.partition,
        alpha=cfg.alpha,
        seeds=cfg.seeds,
        clients_of=groups if cfg.partition == "groups" else None,
    )


def _clients(cfg: AttackConfig, labels, n: int, seed: int) -> tuple[np.ndarray, int | None]:
    """Client ids and the public number of clients (the configured partition's; None for class groups,
    whose count follows from the labels by design of the attack curve).

    The federation depends on the seed (and a group curve's n) alone, drawn as ``privfed.tradeoff`` draws
    it (``partition(..., rng=seed)``): every method and budget of a sweep is attacked on the same clients,
    whatever the order or length of ``--method`` and ``--eps``."""
    from attacks.view import class_groups
    from privfed.federation import partition

    if cfg.partition == "groups":
        return class_groups(labels, n, np.random.default_rng([seed, n]), max_groups=cfg.max_groups), None
    part = partition(labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=seed)
    return part.clients, int(part.num_clients)


def run_generators(seed: int, n: int, method: str, eps: float) -> tuple[np.random.Generator, ...]:
    """The release-noise, attack and strongest-suite generators of one run: spawned from the seed, n, the
    method's name and the budget's value (never their positions in the command line, so a run draws the
    same noise in any sweep that holds it)."""
    key = [seed, n, zlib.crc32(method.encode()), zlib.crc32(float(eps).hex().encode())]
    return tuple(np.random.default_rng(s) for s in np.random.SeedSequence(key).spawn(3))


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


def _trust_columns(cfg: AttackConfig, eps: float, view, report=None) -> dict[str, Any]:
    """Where the noise was added and the guarantee, for one row: read from the release's privacy
    ``report`` (level, whether every statistic is protected) and the server's ``view`` (the protocol)."""
    protocol = cfg.secure_agg if view.secure_agg else "none"
    if math.isinf(eps) or report is None:
        return {
            "placement": "none",
            "protocol": protocol,
            "level": "none",
            "delta": 0.0,
            "calibration": "-",
            "private": False,
        }
    count = cfg.count_noise
    secure = cfg.secure_agg != "none"
    placement = placement_word(
        getattr(view.noise, "placement", None), "secure sum" if secure and count is None else "local"
    )
    private = bool(report.is_private)
    delta = float(report.delta) if math.isfinite(report.epsilon) else float("nan")
    cal = {"laplace": "pure", "geometric": "pure", "gaussian": "analytic", "uniform": "none (no DP)"}.get(
        count or "", "analytic"
    )
    return {
        "placement": placement,
        "protocol": protocol,
        "level": report.level,
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
    finite = [e for e in cfg.epsilons if math.isfinite(e)]
    if finite:  # a method the DP release refuses is refused before any run, not after the eps = inf ones
        from privfed.release.settings import make_secure_agg, vacuous_delta

        vacuous = vacuous_delta(cfg.delta, int(len(yp)), "private records")
        if vacuous and cfg.count_noise in (None, "gaussian") and progress:
            print(f"note: {vacuous}", file=sys.stderr, flush=True)

        for mname in cfg.methods:
            method = _methods.get(mname, **cfg.method_params.get(mname, {}))
            _privacy(cfg, method, finite[0], clip).check(method, make_secure_agg(cfg.secure_agg))
    records = [] if records is None else records
    grids = []
    from attacks.inversion.learned import progress_bars
    from attacks.strongest import SUITES

    combos = [(m, e, n, s) for m in cfg.methods for e in cfg.epsilons for n in cfg.ns for s in cfg.seeds]

    def release(combo):
        """One run's release, drawn from its own seeds (the plan below draws it the same way)."""
        mname, eps, n, seed = combo
        method = _methods.get(mname, **cfg.method_params.get(mname, {}))
        r_view, r_att, r_strong = run_generators(seed, n, mname, eps)
        clients, num_clients = _clients(cfg, yp, n, seed)
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
                privacy=_privacy(cfg, method, eps, clip),
                secure_agg=cfg.secure_agg != "none",
                backbone=bb,
                public=public,
                num_classes=num_classes,
                num_clients=num_clients,
                rng=r_view,
                **cfg.method_params.get(mname, {}),
            )
        return method, clients, view, truth, r_att, r_strong, num_clients

    def planned(combo):
        _, _, view, truth, r_att, _, _ = release(combo)
        att = attacks.get(cfg.attack, **cfg.attack_params)
        return view, truth, (_challenge(att, truth, view, r_att) if att.name != "differencing" else {})

    planned.context = (bb, public, num_classes)
    from privfed.commands.attack.prepare import cost_note, plan_sweep, train_decoders

    plan = plan_sweep(cfg, combos, planned)
    note = cost_note(cfg, plan)
    if note and progress:
        print(f"note: {note}", file=sys.stderr, flush=True)
    t_prep = time.perf_counter()
    with progress_bars(progress):
        train_decoders(cfg, plan, bb, public, num_classes)  # first, so the sweep's bar counts attacks only
    t_prep = time.perf_counter() - t_prep
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

            t1, c1 = time.perf_counter(), time.process_time()
            method, clients, view, truth, r_att, r_strong, num_clients = release((mname, eps, n, seed))
            att = attacks.get(cfg.attack, **cfg.attack_params)
            extra: dict[str, Any] = {}
            if att.name == "differencing":  # the challenge is a second release, built by evaluate()
                result, metrics = None, att.evaluate(view, truth, r_att)
            else:
                challenge = _challenge(att, truth, view, r_att)
                att.check(view)  # what the setting lacks (a statistic the method does not upload) is refused
                try:
                    result = att.run(view, r_att, **challenge)
                except InputError as exc:
                    if not math.isfinite(eps):  # on the exact statistics: the setting's own mistake
                        raise
                    # the noise left the attack nothing to work on (no count in range): that row is not
                    # applicable, and the sweep goes on
                    result, metrics = None, {"not_applicable": f"on this noisy release: {exc}"}
                else:
                    metrics = att.score(result, truth)
                if result is not None and att.name == "tracing" and "test" not in cfg.attack_params:
                    # The same targets scored by the inner-product tracer, so both tests are reported.
                    other = "inner" if att.params["test"] != "inner" else "lrt"
                    att2 = attacks.get("tracing", test=other)
                    m2 = att2.score(att2.run(view, np.random.default_rng(0), **challenge), truth)
                    extra = {
                        f"{k}_{other}": v
                        for k, v in m2.items()
                        if k in ("auc", "auc_se", "tpr@0.01", "tpr@0.001", "eps_lower_bound")
                    }
            report = _guarantee(cfg, method, eps, clip, Fp, yp, clients, num_classes, num_clients, seed)
            row = {
                "attack": cfg.attack,
                "method": mname,
                "epsilon": eps,
                **_trust_columns(cfg, eps, view, report),
                "clip": clip if (math.isfinite(eps) and cfg.count_noise is None) else None,
                "n": n,
                "partition": cfg.partition,
                "secure_agg": cfg.secure_agg if view.secure_agg else "none",
                "count_noise": cfg.count_noise,
                "seed": seed,
                "clients": int(view.stats.num_clients) if view.per_client else int(clients.max() + 1),
                "noise": view.noise.guarantee,
                "guarantee": "no protection (eps=inf)" if report is None else report.guarantee,
                "upload_bytes": _upload_per_client(method, clients, yp, num_classes, Fp.shape[1], eps),
                "seconds": round(time.perf_counter() - t1, 3),
                "cpu_s": round(time.process_time() - c1, 3),
            }
            if result is not None and "cells" in challenge:
                row.update(_cell_sizes(view, truth, challenge["cells"]))
            row.update({k: v for k, v in metrics.items() if not isinstance(v, (list, dict, np.ndarray))})
            row.update(extra)
            bar.update(1)
            if cfg.strongest and result is not None:
                t2, c2 = time.perf_counter(), time.process_time()
                row.update(_strongest_columns(cfg, view, truth, challenge, r_strong, step))
                row["strongest_seconds"] = round(time.perf_counter() - t2, 3)
                row["strongest_cpu_s"] = round(time.process_time() - c2, 3)
            elif per_run > 1:
                bar.update(per_run - 1)
            records.append(row)
            if on_record is not None:
                on_record(records)
            if cfg.attack == "inversion" and seed == cfg.seeds[0] and result is not None:
                grids.append((mname, eps, n, result, truth))
    bar.close()
    return {
        "records": records,
        "grids": grids,
        "clip": clip,
        "data_rules": attack_data_rules(cfg, yp, yt, len(public.labels)),
        "timing": {
            "data_s": t_data,
            "decoders_s": t_prep,
            "total_s": time.perf_counter() - t0,
            "estimate_s": plan.train_s + plan.attack_s,
        },
        "decoders_trained": [f"{k}" + (f" n={n}" if n else "") for k, n in plan.missing],
    }


def _guarantee(cfg, method, eps, clip, F, y, clients, num_classes, num_clients, seed):
    """The privacy report of the run's release, from a ledger (the view's noise drawn from a seed: a
    simulation); None without noise."""
    if math.isinf(eps):
        return None
    import warnings

    import privfed
    from privfed.release.ideal import IdealSecureSum

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fast noise backend's reminder
        keep = np.asarray(clients) >= 0  # samples the partition leaves out are uploaded by nobody
        head = privfed.fit(
            method,
            F[keep],
            y[keep],
            np.asarray(clients)[keep],
            num_classes=num_classes,
            num_clients=num_clients if num_clients is not None else int(np.max(clients)) + 1,
            privacy=_privacy(cfg, method, eps, clip),
            secure_agg=IdealSecureSum() if cfg.secure_agg != "none" else None,
            random_state=seed,
        )
    return head.privacy


def _cell_sizes(view, truth, cells) -> dict[str, int]:
    """How many cells the attack inverted and how many records they hold together (its cost grows with both)."""
    from privfed.commands.attack.prepare import cell_records

    n = cell_records(view, truth, cells)
    return {"cells": int(n.size), "cell_records": int(n.sum())}


def _upload_per_client(method, clients: np.ndarray, labels: np.ndarray, C: int, d: int, eps: float) -> float:
    """What one client uploads, by the method's byte model: every class under noise, held classes without."""
    k = np.asarray(clients)
    K = int(k.max()) + 1 if k.size and k.max() >= 0 else 1
    held = np.unique(k[k >= 0] * C + np.asarray(labels)[k >= 0]).size
    M = K * C if math.isfinite(eps) else held
    return float(method.upload_bytes(M=M, K=K, d=d, C=C)) / K


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
