"""``python -m privfed.tradeoff``: privacy-utility(-attack) curves in one run.

Examples
--------
One budget on the embedded default (scikit-learn digits, offline): one row per
noise placement (each client noises its upload; clients add shares of the
noise under secure aggregation; a trusted aggregator adds it once) beside the
non-private accuracy::

    python -m privfed.tradeoff --method fedlog --eps 0.1

A sweep, written as a tidy CSV, a JSON with the resolved config and a PNG plot
(``--out``, default a fresh ``results/tradeoff-<methods>-eps<range>-<time>``)::

    python -m privfed.tradeoff --method fedcof,fed3r,fedlog --eps 0.05,0.1,0.5,1,4,inf --seeds 5

Every row names its trust model and guarantee: placement, protocol, level,
calibration, the delta used (0 for pure DP) and the epsilon the ledger
computes; heuristics without a guarantee (uniform count noise) show NO DP and
no epsilon.

Settings may also come from a TOML file (``--config sweep.toml``, keys named
like the flags with underscores, e.g. ``count_noise = "laplace"``); flags
given on the command line override it, and file values pass the same checks.
The JSON written by a previous run is accepted as ``--config`` too, which
reruns it bit for bit.

Results are written atomically (temporary name, then rename); Ctrl-C and
SIGTERM keep the finished runs in ``results.partial.csv`` / ``.json`` (also
checkpointed every 30 s); ``manifest.json`` lists the files of the run.

``eps = inf`` means *no protection at all* (no clipping, no noise): its rows
equal the method's non-private accuracy exactly.
"""

from __future__ import annotations

if __name__ == "__main__":  # --help answers before the imports below, in well under a second
    from privfed.cli_args import answer_help

    answer_help("tradeoff")

import argparse
import contextlib
import csv
import json
import math
import os
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from privfed import methods as _methods
from privfed import scaling
from privfed._cli import (
    OutputDir,
    as_bool,
    as_float,
    as_int,
    as_str,
    check_secure_agg,
    cli_entry,
    heartbeat,
    keep_finished,
    parse_float_list,
    parse_seeds,
    parse_str_list,
    periodic_checkpoint,
    placement_word,
    versions,
)
from privfed.cli_args import tradeoff_parser as build_parser
from privfed.errors import ConfigError, InputError
from privfed.notes import repairs as note_repairs
from privfed.pipeline import client_statistics, server_head
from privfed.results_io import manifest_names, verify_folder
from privfed.tradeoff_privacy import COUNT_NOISE_KINDS

__all__ = ["TradeoffConfig", "build_parser", "main", "run_tradeoff"]

PROG = "python -m privfed.tradeoff"

#: CSV / JSON record keys, in order.
RECORD_KEYS = (
    "method",
    "placement",
    "protocol",
    "mechanism",
    "level",
    "epsilon",
    "epsilon_reported",
    "delta",
    "calibration",
    "private",
    "protects",
    "seed",
    "accuracy",
    "nonprivate_accuracy",
    "sigma",
    "sigma_counts",
    "noise",
    "rounds",
    "clip",
    "count_noise",
    "secure_agg",
    "upload_bytes",
    "guarantee",
    "pairs_dropped",
    "repairs",
    "notes",
)


@dataclass(frozen=True)
class TradeoffConfig:
    """Every setting of a trade-off run (the JSON output stores it resolved)."""

    methods: tuple[str, ...] = ("fedlog",)
    epsilons: tuple[float, ...] = (0.1,)
    delta: float = 1e-5
    level: str = "record"
    clip: float | None = None
    clip_norm: str = "l2"
    calibration: str = "analytic"
    rounds: int = 1
    count_noise: str | None = None
    max_records: int | None = None
    trusted_aggregator: bool = False
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    clients: int = 100
    partition: str = "dirichlet"
    alpha: float = 0.1
    dataset: str = "digits"
    backbone: str | None = None
    download: bool = False
    secure_agg: str = "none"
    attacks: tuple[str, ...] = ()
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    plot: bool = True
    #: Noise placements compared side by side ("local", "secure-sum", "trusted"); empty: the one that
    #: ``trusted_aggregator`` / ``secure_agg`` select.
    placements: tuple[str, ...] = ()


# ---------------------------------------------------------------- parsing
#: --placement values: where the noise is added (who is trusted).
PLACEMENTS = ("local", "secure-sum", "trusted")
PLACEMENT_LABEL = {"local": "local", "secure-sum": "secure sum", "trusted": "trusted aggregator"}


def _default(name: str) -> Any:
    return getattr(TradeoffConfig(), name)


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _load_config_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path!r} does not exist")
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"--config {path!r} is not valid JSON ({exc}); pass a TOML file or a privfed results.json"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ConfigError(
                f"--config {path!r} is JSON but has no 'config' table (is it a privfed results.json?)"
            )
        if p.name in (manifest_names(p.parent) or ()):  # a saved run: its files must match their hashes
            verify_folder(p.parent)
        return data["config"]
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path!r} is not valid TOML: {exc}") from None


_FILE_KEYS = {
    "method",
    "methods",
    "eps",
    "epsilons",
    "delta",
    "level",
    "clip",
    "calibration",
    "rounds",
    "count_noise",
    "seeds",
    "clients",
    "partition",
    "alpha",
    "dataset",
    "backbone",
    "download",
    "secure_agg",
    "attack",
    "attacks",
    "method_params",
    "plot",
    "max_records",
    "clip_norm",
    "trusted_aggregator",
    "placement",
    "placements",
    "local_epochs",
    "families",
    "init",  # multi-round fedlog (results.json records them)
}


def _as_list(value: Any, flag: str) -> str:
    """A comma-separated flag text from a flag's text or a config value (a string or a list)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{flag} must not be empty")
        for v in value:
            if isinstance(v, (bool, dict, list, tuple)) or v is None:
                raise ConfigError(f"{flag}: {v!r} is not allowed in the list")
        return ",".join(str(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return as_str(value, flag)


def _choice(value: Any, flag: str, choices: Sequence[str]) -> str:
    v = as_str(value, flag)
    if v not in choices:
        raise ConfigError(f"{flag} must be one of {', '.join(choices)}, got {v!r}")
    return v


def resolve_config(args: argparse.Namespace) -> TradeoffConfig:
    """Merge defaults < config file < flags into a validated TradeoffConfig.

    A config file's values pass the same checks, with the same messages, as
    the flags (``rounds = 2.5`` and ``clip = "abc"`` are refused alike).
    """
    base: dict[str, Any] = {}
    if args.config:
        raw = _load_config_file(args.config)
        unknown = set(raw) - _FILE_KEYS
        if unknown:
            raise ConfigError(
                f"--config: unknown setting(s) {sorted(unknown)}; allowed: {sorted(_FILE_KEYS)}"
            )
        base = dict(raw)
        # multi-round fedlog settings from a saved run (flags win), so that its config re-runs it
        for key in ("local_epochs", "families", "init"):
            if getattr(args, key, None) is None and base.get(key) is not None:
                v = base[key]
                setattr(
                    args,
                    key,
                    _as_list(v, "--families")
                    if key == "families"
                    else (
                        as_int(v, "--local-epochs", minimum=1)
                        if key == "local_epochs"
                        else as_str(v, "--init")
                    ),
                )

    def pick(flag_value, *keys):
        if flag_value is not None:
            return flag_value
        for k in keys:
            if k in base:
                return base[k]
        return None

    d = TradeoffConfig()
    method_v = pick(args.method, "method", "methods")
    methods = (
        tuple(parse_str_list(_as_list(method_v, "--method"), "--method"))
        if method_v is not None
        else d.methods
    )
    for m in methods:
        _methods.get_class(m)  # ConfigError listing the available ones
    eps_v = pick(args.eps, "eps", "epsilons")
    epsilons = (
        tuple(parse_float_list(_as_list(eps_v, "--eps"), "--eps", positive=True))
        if eps_v is not None
        else d.epsilons
    )
    delta = pick(args.delta, "delta")
    delta = d.delta if delta is None else as_float(delta, "--delta")
    if not 0 < delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {delta:g}")
    seeds_v = pick(args.seeds, "seeds")
    seeds = d.seeds if seeds_v is None else parse_seeds(seeds_v, "--seeds")
    clip = pick(args.clip, "clip")
    if clip is not None:
        clip = as_float(clip, "--clip")
        if not (clip > 0 and math.isfinite(clip)):
            raise ConfigError(f"--clip must be a finite number > 0, got {clip:g}")
    rounds = pick(args.rounds, "rounds")
    rounds = d.rounds if rounds is None else as_int(rounds, "--rounds", minimum=1)
    clients = pick(args.clients, "clients")
    clients = d.clients if clients is None else as_int(clients, "--clients", minimum=1)
    alpha = pick(args.alpha, "alpha")
    alpha = d.alpha if alpha is None else as_float(alpha, "--alpha")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ConfigError(f"--alpha must be a finite number > 0, got {alpha:g}")
    count_noise = pick(args.count_noise, "count_noise")
    if count_noise is not None:
        count_noise = _choice(count_noise, "--count-noise", COUNT_NOISE_KINDS)
    max_records = pick(args.max_records, "max_records")
    if max_records is not None:
        max_records = as_int(max_records, "--max-records", minimum=1)
    secure_v = pick(args.secure_agg, "secure_agg")
    secure = d.secure_agg if secure_v is None else check_secure_agg(secure_v)
    trusted_v = pick(args.trusted_aggregator, "trusted_aggregator")
    trusted = False if trusted_v is None else as_bool(trusted_v, "--trusted-aggregator")
    attack_v = pick(args.attack, "attack", "attacks")
    attacks = tuple(parse_str_list(_as_list(attack_v, "--attack"), "--attack")) if attack_v else ()
    mp = base.get("method_params") or {}
    if not isinstance(mp, dict) or not all(isinstance(v, dict) for v in mp.values()):
        raise ConfigError(
            f"method_params must be a table of tables like {{fedcof = {{gamma = 0.1}}}}, got {mp!r}"
        )
    params: dict[str, dict[str, Any]] = {k: dict(v) for k, v in mp.items()}
    for item in args.param:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--param {item!r} must look like METHOD.KEY=VALUE, e.g. fedcof.gamma=0.1")
        lhs, value = item.split("=", 1)
        mname, key = lhs.split(".", 1)
        _methods.get_class(mname)
        params.setdefault(mname, {})[key] = _parse_value(value)
    for mname, p in params.items():
        _methods.get_class(mname)
        if mname not in methods:
            raise ConfigError(
                f"--param {mname}.{next(iter(p), 'KEY')}=...: method {mname!r} is not in --method "
                f"({','.join(methods)}), so the parameter would be ignored; add {mname} to --method "
                "or drop the parameter"
            )
        _methods.get(mname, **p)  # validates names and values now, not mid-sweep
    level = _choice(pick(args.level, "level") or d.level, "--level", ("record", "client"))
    calibration = _choice(
        pick(args.calibration, "calibration") or d.calibration, "--calibration", ("analytic", "classic")
    )
    clip_norm = _choice(pick(args.clip_norm, "clip_norm") or d.clip_norm, "--clip-norm", ("l2", "coordinate"))
    plot_v = base.get("plot", True)
    plot = not args.no_plot and as_bool(plot_v, "plot")
    download_v = pick(args.download, "download")
    download = False if download_v is None else as_bool(download_v, "--download")
    backbone = pick(args.backbone, "backbone")
    backbone = None if backbone is None else as_str(backbone, "--backbone")
    placements = _resolve_placements(
        pick(args.placement, "placement", "placements"),
        epsilons=epsilons,
        level=level,
        count_noise=count_noise,
        secure=secure,
        trusted=trusted,
    )
    return TradeoffConfig(
        methods=methods,
        epsilons=epsilons,
        delta=delta,
        level=level,
        clip=clip,
        clip_norm=clip_norm,
        calibration=calibration,
        rounds=rounds,
        count_noise=count_noise,
        max_records=max_records,
        trusted_aggregator=trusted,
        seeds=seeds,
        clients=clients,
        partition=as_str(pick(args.partition, "partition") or d.partition, "--partition"),
        alpha=alpha,
        dataset=as_str(pick(args.dataset, "dataset") or d.dataset, "--dataset"),
        backbone=backbone,
        download=download,
        secure_agg=secure,
        attacks=attacks,
        method_params=params,
        plot=plot,
        placements=placements,
    )


def _resolve_placements(value: Any, *, epsilons, level, count_noise, secure, trusted) -> tuple[str, ...]:
    """--placement: explicit list, or 'all' by default for one finite eps with nothing else chosen.

    An empty list (a saved run that used the placement its settings select) is kept empty.
    """
    if isinstance(value, (list, tuple)) and not value:
        return ()
    if value is not None:
        items = parse_str_list(_as_list(value, "--placement"), "--placement")
        if items == ["all"]:
            items = list(PLACEMENTS)
        for it in items:
            if it not in PLACEMENTS:
                raise ConfigError(f"--placement must be all or a list of {', '.join(PLACEMENTS)}, got {it!r}")
        if len(set(items)) != len(items):
            raise ConfigError(f"--placement lists a placement twice: {value!r}")
        if trusted and items != ["trusted"]:
            raise ConfigError("--trusted-aggregator is --placement trusted; pass one of them")
        if count_noise is not None and items != ["local"]:
            raise ConfigError("--count-noise is added by every client (placement local); drop --placement")
        if level == "client" and "local" in items:
            raise ConfigError("--level client adds noise to the aggregate: --placement secure-sum or trusted")
        return tuple(items)
    single = len(epsilons) == 1 and math.isfinite(epsilons[0])
    if single and level == "record" and count_noise is None and secure == "none" and not trusted:
        return PLACEMENTS
    return ()


# ---------------------------------------------------------------- running
def _seed_for(*parts: Any) -> np.random.Generator:
    """A Generator derived from stable parts (ints and strings), reproducible across runs."""
    words = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return np.random.default_rng(words)


def _default_clip(cfg: TradeoffConfig, dataset) -> float:
    if cfg.clip is not None:
        return cfg.clip
    if cfg.clip_norm != "l2":
        raise ConfigError("--clip-norm coordinate needs an explicit --clip B (the per-coordinate bound)")
    public_clip = dataset.meta.get("public_clip")
    if public_clip is None and dataset.name == "digits":
        public_clip = digits_public_clip()
    if public_clip is None:
        raise ConfigError(
            f"dataset {cfg.dataset!r} has no public split to set a clip bound from; pass --clip C "
            "(the L2 bound of each feature, chosen without looking at the private data)"
        )
    return float(public_clip)


def _blas_threads(dim: int):
    """One BLAS thread for small d: the sweep's d x d algebra is too small to gain from threads,
    and on a busy machine OpenBLAS threads spin (measured 3x slower at d = 64 on 2 cores)."""
    import contextlib

    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas") if dim <= 256 else contextlib.nullcontext()


def digits_public_clip(seed: int = 0) -> float:
    """Median L2 norm of the digits backbone's features on the *public* split.

    The attacker and the clients both know the public split, so a clip bound
    read from it costs no privacy (the private data is never looked at).
    """
    from privfed.data.digits import digits_splits, embed

    splits = digits_splits(seed)
    feats = embed(splits.public_images, seed=seed)
    return float(np.median(np.linalg.norm(feats, axis=1)))


def placement_variants(cfg: TradeoffConfig) -> list[tuple[str, TradeoffConfig]]:
    """(placement, settings) pairs the sweep runs: ``cfg.placements``, or the one the settings select."""
    if not cfg.placements:
        key = "secure-sum" if cfg.secure_agg != "none" else ("trusted" if cfg.trusted_aggregator else "local")
        return [(key, cfg)]
    out = []
    for p in cfg.placements:
        if p == "local":
            out.append((p, replace(cfg, secure_agg="none", trusted_aggregator=False)))
        elif p == "secure-sum":
            out.append(
                (
                    p,
                    replace(
                        cfg,
                        secure_agg=cfg.secure_agg if cfg.secure_agg != "none" else "mask",
                        trusted_aggregator=False,
                    ),
                )
            )
        else:
            out.append((p, replace(cfg, secure_agg="none", trusted_aggregator=True)))
    return out


def _placement_label(key: str, method: Any, report: Any) -> str:
    """Where the noise was added, as the report states it (or as the settings imply)."""
    derived = "local" if key == "trusted" and getattr(method, "per_client", False) else PLACEMENT_LABEL[key]
    return placement_word(getattr(report, "placement", None), derived)


def _calibration_label(cfg: TradeoffConfig, report: Any) -> str:
    if cfg.count_noise in ("laplace", "geometric"):
        return "pure"
    if cfg.count_noise == "uniform":
        return "none (no DP)"
    if cfg.count_noise == "gaussian":
        return "analytic"
    cal = str(getattr(report, "calibration", "") or cfg.calibration)
    return cal if cal in ("analytic", "classic") else cfg.calibration


def _noise_label(cfg: TradeoffConfig, report: Any, eps: float) -> str:
    sig = getattr(report, "sigma", {}) or {}
    if cfg.count_noise == "laplace":
        return f"counts: Laplace b={1 / eps:.4g}"
    if cfg.count_noise == "geometric":
        return f"counts: geometric p=exp(-{eps:g})"
    if cfg.count_noise == "uniform":
        return f"counts: U(+-{1 - eps:.3g} n)"
    if cfg.count_noise == "gaussian":
        return f"counts: sigma={sig.get('counts', float('nan')):.4g}"
    return f"sigma {sig.get('sums', float('nan')):.4g} / {sig.get('counts', float('nan')):.4g}"


def repair_facts(notes: Sequence[str]) -> tuple[int | None, list[str]]:
    """What a method (or a count-noise rule) did to noisy statistics: (pairs dropped, other repairs).

    Read from the facts the notes carry (:class:`privfed.notes.Note`), never from their text.
    """
    return note_repairs(notes)


def _repairs_text(pairs: float | None, kinds: Sequence[str]) -> str:
    parts = [f"{pairs:.4g} pairs dropped"] if pairs else []
    return ", ".join([*parts, *kinds])


#: Rough rates for the estimate a large sweep prints before it starts (one core, float64); the fixed cost of
#: a run (partition, evaluation, bookkeeping) from digits: 200 fedncm runs took 10.7 s on the 2-core dev machine.
SWEEP_FLOPS_PER_S = 2e9
SWEEP_NOISE_PER_S = 2e7
SWEEP_RUN_OVERHEAD_S = 0.04


def sweep_cost_note(
    runs: int, *, n: int, d: int, k: int, c: int, attacks: int = 0, above_s: float = 300.0
) -> str | None:
    """A one-line estimate when a sweep's predicted time is over ``above_s`` seconds, else None.

    Per run: a fixed cost, the statistics pass (N d^2 flops for second moments), a d x d
    solve (d^3), and local noise on K x C x (d + 1) values; attacks count as
    as many runs again.  An order of magnitude, not a promise: the progress bar shows the measured ETA.
    """
    per_run = (
        SWEEP_RUN_OVERHEAD_S + (n * d * d + d**3) / SWEEP_FLOPS_PER_S + k * c * (d + 1) / SWEEP_NOISE_PER_S
    )
    seconds = runs * per_run * (1 + attacks)
    if seconds <= above_s:
        return None
    return (
        f"this sweep is {runs} runs over {n} samples of dimension {d}, {k} clients and {c} classes; expect "
        f"roughly {seconds / 60:.0f} minute(s) (the progress bar shows the measured ETA)"
    )


def run_tradeoff(
    cfg: TradeoffConfig,
    *,
    progress: bool = True,
    records: list[dict[str, Any]] | None = None,
    on_record: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """Run the sweep; returns ``{"records": [...], "dataset": {...}, "timing": {...}}``.

    Records are appended to ``records`` (a new list by default) as each run
    finishes, so a caller keeps what was done if the sweep is interrupted;
    ``on_record(records)`` is called after each (e.g. to checkpoint them).
    """
    from tqdm.auto import tqdm

    from privfed.data import load_dataset
    from privfed.federation import partition as make_partition
    from privfed.tradeoff_privacy import make_privacy, make_secure_agg

    t0 = time.perf_counter()
    ds = load_dataset(cfg.dataset, backbone=cfg.backbone, download=cfg.download, progress=progress)
    t_data = time.perf_counter() - t0
    classes = np.unique(np.asarray(ds.train_labels))
    if classes.size < 2 or np.unique(np.asarray(ds.test_labels)).size < 2:
        raise InputError(
            f"dataset {cfg.dataset!r} has a single class in its {'training' if classes.size < 2 else 'test'} "
            "labels: every head predicts it and accuracy is 1 whatever the privacy; use data with >= 2 classes"
        )
    finite = [e for e in cfg.epsilons if math.isfinite(e)]
    clip = _default_clip(cfg, ds) if finite and cfg.count_noise is None else cfg.clip
    cfg = replace(cfg, clip=clip)
    variants = placement_variants(cfg)
    skipped: dict[tuple[str, str], str] = {}
    # Pre-flight: refuse an incompatible method / protection pair before any work (when several
    # placements are compared, one that does not apply to a method is left out with a note).
    for mname in cfg.methods:
        method = _methods.get(mname, **cfg.method_params.get(mname, {}))
        errors = []
        for key, v in variants:
            try:
                secure = make_secure_agg(v.secure_agg)
                if (
                    secure is not None
                    and method.per_client
                    and type(method).secure_aggregate is _methods.Method.secure_aggregate
                ):
                    raise ConfigError(
                        f"method {mname!r} needs every client's statistics and has no secure "
                        "protocol; drop it from --method or use --secure-agg none"
                    )
                if key == "trusted" and method.per_client and finite:
                    raise ConfigError(
                        f"method {mname!r} needs every client's statistics, so a trusted aggregator "
                        "cannot add its noise to the sum; use --placement local"
                    )
                for eps in finite[:1]:
                    make_privacy(v, method, eps, clip, secure_agg=secure)
            except ConfigError as exc:
                errors.append(exc)
                skipped[(mname, key)] = str(exc)
        if len(errors) == len(variants):
            raise errors[0]
    attack_ctx = _attack_context(cfg, ds) if cfg.attacks else None
    records = [] if records is None else records
    n_var = {m: sum((m, k) not in skipped for k, _ in variants) for m in cfg.methods}
    n_inf = sum(not math.isfinite(e) for e in cfg.epsilons)
    total = len(cfg.seeds) * sum(n * len(finite) + n_inf for n in n_var.values())
    note = sweep_cost_note(
        total,
        n=int(ds.train_features.shape[0]),
        d=int(ds.dim),
        k=cfg.clients,
        c=int(ds.num_classes),
        attacks=len(cfg.attacks),
    )
    if note:  # a large sweep says so before it starts
        print(f"note: {note}", file=sys.stderr)
    bar = tqdm(total=total, desc="tradeoff", unit="run", disable=not progress, file=sys.stderr, delay=2)
    caught: set[str] = {
        f"placement {PLACEMENT_LABEL[k]!r} left out for method {m!r}: {why}"
        for (m, k), why in skipped.items()
    }
    with warnings.catch_warnings(record=True) as wlist, _blas_threads(ds.dim), heartbeat(bar):
        warnings.simplefilter("always")
        _sweep(
            cfg,
            ds,
            clip,
            records,
            bar,
            make_privacy,
            make_secure_agg,
            make_partition,
            attack_ctx,
            variants=variants,
            skipped=skipped,
            on_record=on_record,
        )
    caught.update(str(w.message) for w in wlist)
    if attack_ctx is not None:
        caught.update(attack_ctx["skipped"])
    bar.close()
    return {
        "config": cfg,
        "warnings": sorted(caught),
        "records": records,
        "dataset": {
            "name": ds.name,
            "num_train": int(ds.train_features.shape[0]),
            "num_test": int(ds.test_features.shape[0]),
            "dim": int(ds.train_features.shape[1]),
            "num_classes": ds.num_classes,
            "meta": ds.meta,
            "data_rules": data_rules(cfg, ds, make_partition),
        },
        "timing": {"data_s": t_data, "total_s": time.perf_counter() - t0},
    }


def data_rules(cfg: TradeoffConfig, ds, make_partition) -> dict[str, Any]:
    """The run's data defaults in words: the test split, the partition rule and what it leaves unused.

    Printed in the run's header (``data:``) and written to results.json, so no default is silent.
    """
    meta = ds.meta or {}
    n = int(ds.train_features.shape[0])
    if "test_split" in meta:
        test = meta["test_split"]
    elif ds.name == "digits":
        split = meta.get("split", {})
        test = (
            f"{split.get('test', ds.test_features.shape[0])} test images held out (20 % of digits, stratified, "
            f"seed {meta.get('seed', 0)}); {split.get('public', '?')} public images train the backbone"
        )
    else:
        test = "the dataset's own test split"
    natural = ds.train_clients if cfg.partition == "natural" else None
    part = make_partition(
        ds.train_labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=cfg.seeds[0], natural=natural
    )
    _, _, k = part.apply(ds.train_features, ds.train_labels)
    used = int(np.asarray(k).size)
    rule = {
        "dirichlet": f"dirichlet alpha {cfg.alpha:g} (FedNCM/FedCOF: each client gets floor(N/K) = "
        f"{n // max(cfg.clients, 1)} samples)",
        "natural": "natural (the file's own clients array)",
    }.get(cfg.partition, cfg.partition)
    if ds.train_clients is not None and cfg.partition != "natural":
        rule += "; the file's clients array is NOT used (pass --partition natural to use it)"
    return {
        "test_split": test,
        "partition": rule,
        "clients": int(cfg.clients),
        "train_samples": n,
        "used_samples": used,
        "unused_samples": n - used,
    }


def below_chance_line(summary: list[dict[str, Any]], num_classes: int) -> str | None:
    """A note naming the rows whose mean accuracy is below chance (1/C), with the reason, or None."""
    chance = 1.0 / max(int(num_classes), 1)
    below = [s for s in summary if s["accuracy_mean"] < chance]
    if not below:
        return None
    rows = ", ".join(f"{s['method']} {s['placement'] or 'none'} eps={s['epsilon']:g}" for s in below)
    if all(s["private"] and s["accuracy_mean"] + s["accuracy_std"] >= chance for s in below):
        why = (
            "chance lies within the spread over seeds: at these budgets the noise swamps the few records each "
            "client holds, so the head guesses"
        )
    else:
        why = (
            "below chance beyond the spread over seeds: the head is worse than guessing (a failed fit or noise "
            "far above the signal); check the data and --param, or try a larger --eps"
        )
    return f"note: below chance (1/{int(num_classes)} = {chance:.2g}) in {rows}: {why}"


def data_line(rules: dict[str, Any]) -> str:
    """One line of the header: what data the run used, and how it was split."""
    unused = f", {rules['unused_samples']} unused" if rules["unused_samples"] else ""
    return (
        f"data: {rules['train_samples']} training samples over {rules['clients']} clients by {rules['partition']}"
        f" ({rules['used_samples']} used{unused}); {rules['test_split']}"
    )


#: The metric of each attack drawn in the plot's attack panel (the CSV has them all).
ATTACK_HEADLINE = {
    "tracing": "auc",
    "singleton": "exposed_fraction",
    "inversion": "delta_psnr",
    "labels": "presence_auc",
    "subspace": "auc",
    "unmixing": "matched_cosine",
    "differencing": "exact_fraction",
}


#: Attacks whose column reports the strongest attack of the suite, named.
STRONGEST_ATTACKS = ("tracing",)


def _attack_context(cfg: TradeoffConfig, ds) -> dict[str, Any]:
    """What the attacks need: the backbone, the public split (attacker's knowledge) and the private images."""
    import attacks

    for name in cfg.attacks:
        attacks.get_class(name)  # ConfigError listing the available ones
    if ds.name != "digits":
        raise ConfigError(
            "--attack needs the digits default (its backbone and public split are the attacker's "
            f"knowledge); dataset {ds.name!r} has none"
        )
    from attacks.view import PublicData
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    splits = digits_splits(0)
    backbone = get_backbone(seed=0)
    public = PublicData(
        labels=splits.public_labels,
        features=extract_features(backbone, splits.public_images),
        images=splits.public_images,
    )
    return {"backbone": backbone, "public": public, "images": splits.private_images, "skipped": set()}


def _run_attacks(cfg, ds, ctx, rec, mname, clients, seed, eps, privacy, secure) -> None:
    """Add ``attack_<name>_<metric>`` columns to ``rec`` (NaN where the attack cannot see what it needs).

    Tracing reports the strongest test of its suite (:data:`attacks.strongest.SUITES`) on one challenge:
    its metrics under the usual keys, its name in ``attack_tracing_strongest`` and every test of the suite
    as ``attack_tracing_<test>:<metric>``.
    """
    import attacks
    from privfed.errors import InputError

    for name in cfg.attacks:
        try:
            metrics = attacks.evaluate_federation(
                name,
                mname,
                ds.train_features,
                ds.train_labels,
                clients,
                rng=_seed_for(seed, mname, eps, name),
                images=ctx["images"],
                holdout_features=ds.test_features,
                holdout_labels=ds.test_labels,
                privacy=privacy,
                secure_agg=secure,
                backbone=ctx["backbone"],
                public=ctx["public"],
                num_classes=ds.num_classes,
                strongest=name in STRONGEST_ATTACKS,
                **cfg.method_params.get(mname, {}),
            )
        except InputError as exc:
            ctx["skipped"].add(f"attack {name!r} skipped for method {mname!r}: {exc}")
            metrics = {ATTACK_HEADLINE.get(name, "value"): float("nan")}
        for key, value in metrics.items():
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                rec[f"attack_{name}_{key}"] = float(value)
        if name in STRONGEST_ATTACKS:
            rec[f"attack_{name}_strongest"] = str(metrics.get("strongest_attack", "-"))


def _sweep(
    cfg,
    ds,
    clip,
    records,
    bar,
    make_privacy,
    make_secure_agg,
    make_partition,
    attack_ctx=None,
    *,
    variants=None,
    skipped=None,
    on_record=None,
) -> None:
    """The seeds x methods x placements x budgets loop; statistics computed once per (seed, method, placement)."""
    variants = placement_variants(cfg) if variants is None else variants
    skipped = skipped or {}
    for seed in cfg.seeds:
        natural = ds.train_clients if cfg.partition == "natural" else None
        part = make_partition(
            ds.train_labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=seed, natural=natural
        )
        F, y, k = part.apply(ds.train_features, ds.train_labels)
        K = int(part.num_clients)  # public: the configured partition's size, never counted from the ids
        for mname in cfg.methods:
            method = _methods.get(mname, **cfg.method_params.get(mname, {}))
            common = dict(num_classes=ds.num_classes, num_clients=K)
            Fs, scale_info = scaling.prepare(method, F)  # statistics exact in float64, or one clear error
            stats0 = client_statistics(method, Fs, y, k, rng=_seed_for(seed, mname, "stats"), **common)
            head0 = scaling.finish(
                server_head(method, stats0, num_clients=K, rng=_seed_for(seed, mname, "server")), scale_info
            )
            acc0 = head0.score(ds.test_features, ds.test_labels)
            inf_done = False
            for key, v in variants:
                if (mname, key) in skipped:
                    continue
                clipped = None
                for eps in cfg.epsilons:
                    if not math.isfinite(eps):
                        if inf_done:  # no noise: one row, whatever the placement
                            continue
                        inf_done = True
                    rec: dict[str, Any] = dict(
                        method=mname,
                        placement="none",
                        protocol=v.secure_agg,
                        level=cfg.level,
                        epsilon=eps,
                        delta=0.0,
                        seed=seed,
                        nonprivate_accuracy=acc0,
                        calibration="-",
                        rounds=cfg.rounds,
                        count_noise=cfg.count_noise,
                        secure_agg=v.secure_agg,
                        clip=clip,
                    )
                    secure = make_secure_agg(v.secure_agg)
                    privacy = None
                    if not math.isfinite(eps):
                        head = (
                            head0
                            if secure is None
                            else server_head(
                                method,
                                stats0,
                                num_clients=K,
                                rng=_seed_for(seed, mname, "secure"),
                                secure_agg=secure,
                            )
                        )
                        rec.update(
                            mechanism="none",
                            accuracy=head.score(ds.test_features, ds.test_labels),
                            sigma=0.0,
                            sigma_counts=0.0,
                            clip=None,
                            guarantee="no protection (eps=inf)",
                            epsilon_reported=math.inf,
                            noise="none",
                            private=False,
                        )
                    else:
                        privacy = make_privacy(v, method, eps, clip, secure_agg=secure)
                        if clipped is None:
                            scaling.prepare(
                                method, F, privacy
                            )  # a range the clip cannot bring back: one error
                            clipped = client_statistics(
                                method,
                                F,
                                y,
                                k,
                                rng=_seed_for(seed, mname, "stats"),
                                privacy=privacy,
                                secure_agg=secure,
                                **common,
                            )
                        head = server_head(
                            method,
                            clipped,
                            num_clients=K,
                            rng=_seed_for(seed, mname, eps, "noise"),
                            privacy=privacy,
                            secure_agg=secure,
                        )
                        rep = head.privacy
                        # A finite guarantee on what it covers (count noise: the counts only, said in
                        # ``protects`` and in the guarantee text); the uniform heuristic reports no epsilon.
                        private = math.isfinite(rep.epsilon)
                        rec.update(
                            mechanism=rep.mechanism,
                            accuracy=head.score(ds.test_features, ds.test_labels),
                            sigma=rep.sigma.get("sums", float("nan")),
                            sigma_counts=rep.sigma.get("counts", float("nan")),
                            guarantee=rep.guarantee,
                            epsilon_reported=rep.epsilon if private else math.inf,
                            placement=_placement_label(key, method, rep),
                            delta=float(rep.delta) if private else float("nan"),
                            calibration=_calibration_label(v, rep),
                            noise=_noise_label(v, rep, eps),
                            private=private,
                            protects=getattr(rep, "protects", "all released statistics"),
                        )
                    upload = head.upload_bytes.get("per_client")
                    if head.secure_aggregation is not None:
                        upload = getattr(head.secure_aggregation, "bytes_per_client", upload)
                    rec["upload_bytes"] = upload
                    pairs, kinds = repair_facts(
                        [*head.notes, *getattr(privacy and head.privacy, "notes", ())]
                    )
                    rec["pairs_dropped"] = float("nan") if pairs is None else pairs
                    rec["repairs"] = _repairs_text(pairs, kinds)
                    rec["repair_kinds"] = "; ".join(kinds)
                    rec["notes"] = "; ".join(head.notes)
                    if attack_ctx is not None:
                        _run_attacks(
                            cfg, ds, attack_ctx, rec, mname, part.clients, seed, eps, privacy, secure
                        )
                    records.append(rec)
                    bar.update(1)
                    if on_record is not None:
                        on_record(records)


# ---------------------------------------------------------------- outputs
def _mean(values) -> float:
    a = np.array([float(v) for v in values], dtype=float)
    return (
        float(a.mean())
        if a.size and np.isfinite(a).all()
        else (float(np.nanmean(a)) if np.isfinite(a).any() else float("nan"))
    )


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (method, placement, epsilon)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["method"], r.get("placement", ""), r["epsilon"]), []).append(r)
    out = []
    morder = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    porder = {label: i for i, label in enumerate(["none", *PLACEMENT_LABEL.values()])}
    for (m, place, eps), rs in sorted(
        groups.items(),
        key=lambda kv: (
            morder[kv[0][0]],
            not math.isfinite(kv[0][2]),
            porder.get(kv[0][1], 9),
            float(kv[0][2]),
        ),
    ):
        acc = np.array([r["accuracy"] for r in rs])
        acc0 = np.array([r["nonprivate_accuracy"] for r in rs])
        pairs = [r["pairs_dropped"] for r in rs if np.isfinite(r.get("pairs_dropped", np.nan))]
        kinds = list(
            dict.fromkeys(k for r in rs for k in str(r.get("repair_kinds", "") or "").split("; ") if k)
        )
        rep = _repairs_text(float(np.mean(pairs)) if pairs else None, kinds)
        out.append(
            dict(
                method=m,
                placement=place,
                protocol=rs[0].get("protocol", rs[0].get("secure_agg", "none")),
                epsilon=eps,
                epsilon_reported=_mean(r.get("epsilon_reported", eps) for r in rs),
                private=bool(rs[0].get("private", math.isfinite(eps))),
                seeds=len(rs),
                accuracy_mean=float(acc.mean()),
                accuracy_std=float(acc.std(ddof=1)) if len(rs) > 1 else 0.0,
                nonprivate_mean=float(acc0.mean()),
                nonprivate_std=float(acc0.std(ddof=1)) if len(rs) > 1 else 0.0,
                delta=rs[0]["delta"],
                sigma=rs[0]["sigma"],
                sigma_counts=rs[0]["sigma_counts"],
                noise=rs[0].get("noise", ""),
                calibration=rs[0]["calibration"],
                level=rs[0]["level"],
                rounds=rs[0]["rounds"],
                mechanism=rs[0]["mechanism"],
                count_noise=rs[0].get("count_noise"),
                upload_bytes=float(np.mean([r["upload_bytes"] for r in rs])),
                guarantee=rs[0]["guarantee"],
                repairs=rep,
                pairs_dropped=float(np.mean(pairs)) if pairs else float("nan"),
                **{
                    k: float(np.nanmean([r.get(k, np.nan) for r in rs]))
                    if not all(np.isnan(r.get(k, np.nan)) for r in rs)
                    else float("nan")
                    for k in _headline_keys(rs)
                },
                **{
                    f"attack_{a}_strongest": "/".join(
                        dict.fromkeys(str(r[f"attack_{a}_strongest"]) for r in rs)
                    )
                    for a in STRONGEST_ATTACKS
                    if any(f"attack_{a}_strongest" in r for r in rs)
                },
            )
        )
    return out


def _headline_keys(rows: list[dict[str, Any]]) -> list[str]:
    keys = {k for r in rows for k in r}
    return [f"attack_{a}_{m}" for a, m in ATTACK_HEADLINE.items() if f"attack_{a}_{m}" in keys]


def _eps_cell(s: dict[str, Any]) -> str:
    if not math.isfinite(s["epsilon"]):
        return "inf"
    if not s.get("private", True):
        return f"NO DP ({s['epsilon']:g})"
    from mechanisms.ledger import format_up

    rep = s.get("epsilon_reported", s["epsilon"])
    if isinstance(rep, float) and math.isfinite(rep) and format_up(rep) != f"{s['epsilon']:g}":
        return f"{format_up(rep)} (asked {s['epsilon']:g})"  # rounded up: never below the ledger's epsilon
    return f"{s['epsilon']:g}"


TABLE_LEGEND = (
    "placement: where the noise is added (local = each client; secure sum = shares under secure aggregation; "
    "trusted aggregator = the server, once)\n"
    "eps: computed by the ledger ('asked' when the calibration gives another); delta 0 = pure DP; "
    "NO DP = a heuristic without a guarantee (its nominal parameter in brackets)\n"
    "noise: Gaussian sigma on sums / counts, or the count-noise law; repairs: what the method did to noisy "
    "statistics; --help lists every column"
)


def format_table(summary: list[dict[str, Any]]) -> str:
    """The console table: one row per method x placement x eps (mean ± std over seeds)."""
    show_rounds = any(s["rounds"] != 1 for s in summary)
    head = [
        "method",
        "placement",
        "protocol",
        "eps",
        "accuracy",
        "non-private",
        "delta",
        "noise",
        "calibration",
        "level",
        *(["rounds"] if show_rounds else []),
        "repairs",
        "bytes/client",
    ]
    rows = []
    for s in summary:
        private = math.isfinite(s["epsilon"]) and s.get("private", True)
        noised = math.isfinite(s["epsilon"])
        rows.append(
            [
                s["method"],
                s.get("placement", ""),
                s.get("protocol", ""),
                _eps_cell(s),
                f"{s['accuracy_mean']:.4f} ± {s['accuracy_std']:.4f}",
                f"{s['nonprivate_mean']:.4f} ± {s['nonprivate_std']:.4f}",
                f"{s['delta']:g}" if private else "-",
                (s.get("noise") or "-") if noised else "none",
                s["calibration"] if noised else "-",
                s["level"] if noised else "-",
                *([str(s["rounds"]) if noised else "-"] if show_rounds else []),
                s.get("repairs") or "-",
                f"{s['upload_bytes']:,.0f}",
            ]
        )
    att = [k for k in ATTACK_HEADLINE.items() if any(f"attack_{k[0]}_{k[1]}" in s for s in summary)]
    if att:
        head = [*head, *(f"{a} {m}" + (" (strongest)" if a in STRONGEST_ATTACKS else "") for a, m in att)]
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.3f}"  # noqa: E731
        name = lambda s, a: f" {s[f'attack_{a}_strongest']}" if s.get(f"attack_{a}_strongest") else ""  # noqa: E731
        rows = [
            [*r, *(fmt(s.get(f"attack_{a}_{m}", float("nan"))) + name(s, a) for a, m in att)]
            for r, s in zip(rows, summary)
        ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def guarantee_lines(summary: list[dict[str, Any]], methods: Sequence[str]) -> list[str]:
    """One line per method x placement x eps with the report's guarantee, in method order and numeric eps."""
    order = {m: i for i, m in enumerate(methods)}
    porder = {label: i for i, label in enumerate(PLACEMENT_LABEL.values())}
    rows = sorted(
        (s for s in summary if math.isfinite(s["epsilon"])),
        key=lambda s: (order.get(s["method"], 99), porder.get(s.get("placement"), 9), s["epsilon"]),
    )
    return [
        f"guarantee [{s['method']}, {s.get('placement', '')}, eps={s['epsilon']:g}]: {s['guarantee']}"
        for s in rows
    ]


def record_fields(records: list[dict[str, Any]]) -> list[str]:
    """CSV columns: the documented ones first, then any extra (attack metrics) sorted."""
    return [*RECORD_KEYS, *sorted({k for r in records for k in r} - set(RECORD_KEYS))]


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    """Write ``records`` as a CSV to ``path`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.privfed-tmp")
    fields = record_fields(records)
    try:
        with tmp.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for r in records:
                w.writerow({k: r.get(k, "") for k in fields})
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def accuracy_axis(
    ax, handles: list, labels: list, ticks, *, band_seeds: int | None, num_classes: int | None
) -> None:
    """Finish an accuracy-against-epsilon axis the way every privfed plot does.

    Adds the legend entries for the ± 1 std band (when ``band_seeds``) and
    the chance line (when ``num_classes``), puts epsilon on a log axis with
    readable ticks at the budgets drawn and shows the whole accuracy range,
    so that small differences are not magnified.
    """
    from matplotlib.patches import Patch

    if band_seeds:
        handles.append(Patch(color="0.5", alpha=0.3, lw=0))
        labels.append(f"band: ± 1 std over {band_seeds} seeds")
    if num_classes:
        ax.axhline(1 / num_classes, color="0.4", ls=":", lw=1)
        handles.append(ax.lines[-1])
        labels.append(f"chance (1/{num_classes} classes)")
    ax.set_xscale("log")
    _eps_ticks(ax, sorted(ticks))
    ax.set_ylim(0, 1.02)


def _eps_ticks(ax, ticks: list[float]) -> None:
    """Label the budgets drawn (log axes otherwise crowd minor labels); pad a short range.

    Ticks closer than a factor 1.8 to the previous label are dropped, so that
    ledger epsilons next to the asked ones (classic calibration) stay readable.
    """
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    def rank(t: float) -> int:  # powers of ten first, then 2 and 5 times them, then one-digit values
        m = t / 10 ** math.floor(math.log10(t))
        close = lambda v: math.isclose(m, v, rel_tol=1e-9)  # noqa: E731
        return 0 if close(1) or close(10) else 1 if close(2) or close(5) else 2 if close(round(m, 1)) else 3

    kept: list[float] = []
    for t in sorted(ticks, key=lambda t: (rank(t), t)):  # round budgets first, others where there is room
        if all(max(t, k) / min(t, k) >= 1.8 for k in kept):
            kept.append(t)
    kept.sort()
    if kept:
        ax.xaxis.set_major_locator(FixedLocator(kept))
        ax.set_xticklabels([f"{t:.2g}" for t in kept])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        lo, hi = min(ticks), max(ticks)
        if hi / lo < 10:  # one or two budgets: keep them off the frame
            ax.set_xlim(lo / 2, hi * 2)


#: Reference value of each attack metric with no information (drawn as the chance line).
CHANCE = {"auc": 0.5, "presence_auc": 0.5, "delta_psnr": 0.0}


def _series_label(s: dict[str, Any], multi_placement: bool) -> str:
    label = s["method"]
    if multi_placement:
        label += f", {s.get('placement', '')}"
    if not s.get("private", True):
        label += " — NO DP GUARANTEE (x = nominal parameter)"
    return label


def plot_tradeoff(
    path: Path | tuple, summary: list[dict[str, Any]], title: str = "", *, num_classes: int | None = None
) -> None:
    """Accuracy against the ledger's epsilon (one curve per method x placement), one panel per attack metric.

    ``path`` is a file path, or ``(OutputDir, name)`` to write through the
    result folder (atomically).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attack_cols = [k for k in _headline_keys(summary) if any(np.isfinite(s.get(k, np.nan)) for s in summary)]
    n = 1 + len(attack_cols)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n + 2.8, 4.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series = list(
        dict.fromkeys(
            (s["method"], s.get("placement", ""), bool(s.get("private", True)))
            for s in summary
            if math.isfinite(s["epsilon"])
        )
    )
    multi_placement = len({p for _, p, _ in series}) > 1
    methods = list(dict.fromkeys(s["method"] for s in summary))
    styles = {label: st for label, st in zip(PLACEMENT_LABEL.values(), ("-", "--", "-."))}
    markers = {label: mk for label, mk in zip(PLACEMENT_LABEL.values(), ("o", "s", "^"))}
    seeds = max((s["seeds"] for s in summary), default=1)

    def points(m, place, private, col):
        rows = [
            s
            for s in summary
            if s["method"] == m
            and s.get("placement", "") == place
            and bool(s.get("private", True)) == private
            and math.isfinite(s["epsilon"])
            and np.isfinite(s.get(col, np.nan))
        ]
        x = [s["epsilon_reported"] if private else s["epsilon"] for s in rows]
        order = np.argsort(x)
        return [rows[i] for i in order], np.asarray(x, float)[order]

    ax = axes[0, 0]
    ticks: set[float] = set()
    for m, place, private in series:
        c = colors[methods.index(m) % len(colors)]
        rows, x = points(m, place, private, "accuracy_mean")
        if not rows:
            continue
        ticks.update(x.tolist())
        mu = np.array([s["accuracy_mean"] for s in rows])
        sd = np.array([s["accuracy_std"] for s in rows])
        ls = styles.get(place, "-") if private else ":"
        ax.plot(
            x,
            mu,
            marker=markers.get(place, "o") if private else "x",
            ls=ls,
            color=c,
            ms=6 if private else 7,
            mfc=c if private else "none",
            label=_series_label(rows[0], multi_placement),
        )
        if len(x) > 1:
            ax.fill_between(x, mu - sd, mu + sd, color=c, alpha=0.15, lw=0)
        else:  # a single budget: the band is an error bar
            ax.errorbar(x, mu, yerr=sd, color=c, capsize=3, lw=1, ls="none")
    for i, m in enumerate(methods):
        base = [s["nonprivate_mean"] for s in summary if s["method"] == m]
        ax.axhline(
            base[0], color=colors[i % len(colors)], ls=(0, (6, 3)), lw=1, alpha=0.8, label=f"{m} non-private"
        )
    handles, labels = ax.get_legend_handles_labels()
    accuracy_axis(
        ax, handles, labels, ticks, band_seeds=seeds if seeds > 1 else None, num_classes=num_classes
    )
    ax.set_xlabel("epsilon computed by the ledger (log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_title("accuracy", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    for p, col in enumerate(attack_cols, start=1):
        ax2 = axes[0, p]
        metric = col.split("_", 2)[2]
        for m, place, private in series:
            c = colors[methods.index(m) % len(colors)]
            rows, x = points(m, place, private, col)
            if rows:
                ax2.plot(
                    x,
                    [s[col] for s in rows],
                    marker=markers.get(place, "o") if private else "x",
                    ls=styles.get(place, "-") if private else ":",
                    color=c,
                    ms=4,
                )
            clean = [
                s[col]
                for s in summary
                if s["method"] == m and not math.isfinite(s["epsilon"]) and np.isfinite(s.get(col, np.nan))
            ]
            if clean:
                ax2.axhline(clean[0], color=c, ls=(0, (6, 3)), lw=0.8, alpha=0.7)
        if metric in CHANCE:
            ax2.axhline(CHANCE[metric], color="0.4", ls=":", lw=1)
        if metric.endswith("auc") or metric.endswith("fraction"):
            ax2.set_ylim(0, 1.02)
        ax2.set_xscale("log")
        _eps_ticks(ax2, sorted(ticks))
        ax2.set_xlabel("epsilon computed by the ledger (log scale)")
        ax2.set_ylabel(metric)
        chance = f"; dotted: chance ({CHANCE[metric]:g})" if metric in CHANCE else ""
        ax2.set_title(
            f"{col[7:].split('_', 1)[0]} attack: {metric}\n(dashed: no protection{chance})", fontsize=9
        )
        ax2.grid(alpha=0.3, which="both")
    fig.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.0 - 2.6 / (5.0 * n + 2.8), 0.9),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(title or "privacy-utility trade-off", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1.0 - 2.8 / (5.0 * n + 2.8), 0.93))
    if isinstance(path, tuple):
        out, name = path
        out.save_figure(name, fig, dpi=130, bbox_inches="tight")
    else:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def plot_title(cfg: TradeoffConfig, dataset: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    """What a reader needs to judge the curves: data, trust model, delta, level, calibration, protocol."""
    places = list(dict.fromkeys(s.get("placement", "") for s in summary if math.isfinite(s["epsilon"])))
    protocols = list(dict.fromkeys(s.get("protocol", "none") for s in summary if math.isfinite(s["epsilon"])))
    cals = list(dict.fromkeys(s["calibration"] for s in summary if math.isfinite(s["epsilon"])))
    deltas = sorted({s["delta"] for s in summary if math.isfinite(s["epsilon"]) and s.get("private", True)})
    noise = (
        f"count noise ({cfg.count_noise}) on class counts only, means in clear"
        if cfg.count_noise
        else f"Gaussian noise on the uploaded statistics, clip {cfg.clip:.4g}"
        if cfg.clip
        else "no noise"
    )
    line1 = (
        f"{dataset['name']}: {cfg.clients} clients, {cfg.partition}"
        + (f" alpha={cfg.alpha:g}" if cfg.partition.startswith("dirichlet") else "")
        + f"; {noise}"
    )
    line2 = (
        f"{cfg.level} level, delta={'/'.join(f'{d:g}' for d in deltas) or '-'}, calibration: "
        f"{', '.join(cals) or '-'}; placement: {', '.join(places) or '-'}; protocol: {', '.join(protocols)}"
    )
    return line1 + "\n" + line2


def _name_parts(cfg: TradeoffConfig) -> list[str]:
    """Words for the default result folder name: methods and budget range."""
    eps = sorted(cfg.epsilons)
    rng = f"eps{eps[0]:g}" + (f"-{eps[-1]:g}" if len(eps) > 1 else "")
    return [
        "+".join(cfg.methods) if len(cfg.methods) <= 3 else f"{len(cfg.methods)}methods",
        rng,
        *(["count-" + cfg.count_noise] if cfg.count_noise else []),
    ]


PARTIAL = ("results.partial.csv", "results.partial.json")
#: Seconds between checkpoints of the finished runs to results.partial.* during a sweep.
CHECKPOINT_S = 30.0


def _body(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)
    if cfg.methods == ("fedlog",) and cfg.rounds > 1:  # the paper's multi-round protocol
        from privfed.fedlog_rounds import tradeoff_main

        return tradeoff_main(cfg, args, argv)
    command = " ".join([PROG, *argv])
    out = OutputDir(
        args.out, "tradeoff", overwrite=args.overwrite, name_parts=_name_parts(cfg), command=command
    )
    done: list[dict[str, Any]] = []

    def write_partial(records: list[dict[str, Any]]) -> None:
        out.write_csv(PARTIAL[0], records, record_fields(records))
        out.write_json(
            PARTIAL[1],
            {
                "config": asdict(cfg),
                "versions": versions(),
                "records": records,
                "complete": False,
                "command": command,
            },
        )
        out.checkpoint()  # the staging folder describes itself: a killed sweep can be recovered

    checkpoint = periodic_checkpoint(write_partial, CHECKPOINT_S)

    try:
        result = run_tradeoff(cfg, progress=not args.quiet, records=done, on_record=checkpoint)
        records, summary = result["records"], summarise(result["records"])
        out.write_csv("results.csv", records, record_fields(records))
        out.write_json(
            "results.json",
            {
                "config": asdict(result["config"]),
                "versions": versions(),
                "warnings": result["warnings"],
                "dataset": result["dataset"],
                "timing": result["timing"],
                "records": records,
                "summary": summary,
                "command": command,
            },
        )
        if cfg.plot:
            title = plot_title(result["config"], result["dataset"], summary)
            plot_tradeoff(
                (out, "tradeoff.png"), summary, title=title, num_classes=result["dataset"]["num_classes"]
            )
        out.finish(command, complete=True, drop=PARTIAL)  # the partial files go only now
    except BaseException:
        keep_finished(out, done, write_partial, command, PROG)
        raise
    print(format_table(summary))
    print(TABLE_LEGEND)
    print(data_line(result["dataset"]["data_rules"]))
    below = below_chance_line(summary, result["dataset"]["num_classes"])
    if below:
        print(below)
    for g in guarantee_lines(summary, cfg.methods):
        print(g)
    if any(math.isfinite(e) for e in cfg.epsilons) and result["config"].clip is not None:
        origin = (
            "--clip" if cfg.clip is not None else "median feature norm of the public split (no privacy cost)"
        )
        print(f"clip: {result['config'].clip:.4g} ({result['config'].clip_norm}; {origin})")
    for w in result["warnings"]:
        print(f"note: {w}")
    print(f"wrote {out.published}/: {', '.join(out.files())}  ({result['timing']['total_s']:.1f} s)")
    return 0


main = cli_entry(PROG, _body)

if __name__ == "__main__":
    sys.exit(main())
