"""``python -m privfed.tradeoff``: privacy-utility(-attack) curves in one run.

Examples
--------
One budget on the embedded default (scikit-learn digits, offline)::

    python -m privfed.tradeoff --method fedlog --eps 0.1

A sweep, written to ``--out`` as a tidy CSV, a JSON with the resolved config
and a PNG plot::

    python -m privfed.tradeoff --method fedcof,fed3r,fedlog --eps 0.05,0.1,0.5,1,4,inf --seeds 5

Settings may also come from a TOML file (``--config sweep.toml``, keys named
like the flags with underscores, e.g. ``count_noise = "laplace"``); flags
given on the command line override it.  The JSON written by a previous run is
accepted as ``--config`` too, which reruns it bit for bit.

``eps = inf`` means *no protection at all* (no clipping, no noise): its rows
equal the method's non-private accuracy exactly.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
import tomllib
import warnings
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from privfed import methods as _methods
from privfed._cli import (
    cli_entry,
    parse_float_list,
    parse_int_list,
    parse_str_list,
    prepare_out_dir,
    versions,
    write_json,
)
from privfed.errors import ConfigError
from privfed.pipeline import client_statistics, server_head

__all__ = ["TradeoffConfig", "build_parser", "main", "run_tradeoff"]

PROG = "python -m privfed.tradeoff"

#: CSV / JSON record keys, in order.
RECORD_KEYS = (
    "method", "mechanism", "level", "epsilon", "epsilon_reported", "delta", "seed", "accuracy", "nonprivate_accuracy",
    "sigma", "sigma_counts", "calibration", "rounds", "clip", "count_noise", "secure_agg",
    "upload_bytes", "guarantee", "notes",
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


# ---------------------------------------------------------------- parsing
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Accuracy of federated heads under differential privacy (and attacks), "
        "over methods x budgets x seeds, with a table, a CSV/JSON and a plot.",
        epilog="eps=inf means no protection (no clipping, no noise). Lists are comma-separated. "
        "Example: %(prog)s --method fedcof,fed3r,fedlog --eps 0.05,0.1,0.5,1,4,inf",
    )
    a = p.add_argument
    a("--config", metavar="FILE", help="TOML file (or a previous run's results.json) with the same settings; flags override it")
    a("--method", metavar="LIST", help=f"methods, from: {', '.join(_methods.available())} (default fedlog)")
    a("--eps", metavar="LIST", help="privacy budgets epsilon > 0, 'inf' for none (default 0.1)")
    a("--delta", type=float, metavar="D", help="delta of (eps, delta)-DP, in (0, 1) (default 1e-5)")
    a("--level", choices=("record", "client"), help="neighbouring relation: record (add/remove one sample; "
      "each client noises its upload) or client (add/remove one client; noise on the aggregate, needs --secure-agg "
      "or a trusted aggregator) (default record)")
    a("--clip", type=float, metavar="C", help="L2 clip bound of each feature; default for digits: the median "
      "feature norm of the public split (no privacy cost); required for other datasets")
    a("--clip-norm", choices=("l2", "coordinate"), help="l2 (default): ||f||_2 <= C; coordinate: every "
      "coordinate in [-C, C] (FedLog's Theorem 3.1; needs an explicit --clip)")
    a("--calibration", choices=("analytic", "classic"), help="analytic Gaussian (tight, default) or the classic "
      "bound of the FedLog paper (valid only for eps <= 1)")
    a("--rounds", type=int, metavar="T", help="number of releases composed (default 1); with --method fedlog "
      "alone, T > 1 runs multi-round FedLog with local bodies (privfed.fedlog_rounds) beside the one-shot head")
    a("--local-epochs", type=int, metavar="E", help="multi-round fedlog: local epochs per round (default 5)")
    a("--families", metavar="LIST", help="multi-round fedlog: body families assigned to clients (default "
      "cnn,cnn-narrow,mlp)")
    a("--init", choices=("public", "scratch"), help="multi-round fedlog: bodies start from networks trained on "
      "the public split (default) or from scratch")
    a("--count-noise", metavar="KIND", help="instead of the Gaussian mechanism on sums and counts, noise the class "
      "counts only, means in clear (FedCOF App. I.1): laplace, geometric, gaussian, or uniform (NO DP GUARANTEE)")
    a("--max-records", type=int, metavar="N", help="client level: the most records one client contributes")
    a("--trusted-aggregator", action="store_true", default=None,
      help="the server is trusted to add the noise once, to the sum (sum-only methods; required for "
      "--level client without --secure-agg); without it, record-level noise is added by every client")
    a("--seeds", metavar="N|LIST", help="number of seeds (0..N-1) or an explicit list like 3,7 (default 5)")
    a("--clients", type=int, metavar="K", help="number of clients (default 100)")
    a("--partition", metavar="SCHEME", help="dirichlet (default), dirichlet-class, shards, iid or natural")
    a("--alpha", type=float, metavar="A", help="Dirichlet concentration (default 0.1)")
    a("--dataset", metavar="NAME", help="digits (default, offline), file:PATH.npz, cifar100, cifar10")
    a("--backbone", metavar="NAME", help="feature extractor for torchvision datasets (squeezenet1_1, mobilenet_v2, vit_b_16)")
    a("--download", action="store_true", default=None, help="allow downloading a torchvision dataset / weights")
    a("--secure-agg", metavar="KIND", help="none (default), mask (pairwise masking) or ckks (TenSEAL)")
    a("--attack", metavar="LIST", help="attacks to add as columns and a plot panel (digits only): tracing, "
      "singleton, inversion, labels, subspace, unmixing, differencing")
    a("--param", action="append", default=[], metavar="METHOD.KEY=VALUE",
      help="a method parameter, e.g. fedcof.gamma=0.1 or fed3r.lam=0.1 (repeatable)")
    a("--out", metavar="DIR", help="output folder (default results/tradeoff-<time>); must not exist or be empty")
    a("--overwrite", action="store_true", help="allow writing into a non-empty --out")
    a("--no-plot", action="store_true", help="skip the PNG")
    a("--quiet", action="store_true", help="no progress bar")
    return p


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
        import json

        data = json.loads(p.read_text())
        if "config" not in data:
            raise ConfigError(f"--config {path!r} is JSON but has no 'config' key (is it a privfed results.json?)")
        return data["config"]
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path!r} is not valid TOML: {exc}") from None


_FILE_KEYS = {
    "method", "methods", "eps", "epsilons", "delta", "level", "clip", "calibration", "rounds", "count_noise",
    "seeds", "clients", "partition", "alpha", "dataset", "backbone", "download", "secure_agg", "attack",
    "attacks", "method_params", "plot", "max_records", "clip_norm", "trusted_aggregator",
}


def resolve_config(args: argparse.Namespace) -> TradeoffConfig:
    """Merge defaults < config file < flags into a validated TradeoffConfig."""
    base: dict[str, Any] = {}
    if args.config:
        raw = _load_config_file(args.config)
        unknown = set(raw) - _FILE_KEYS
        if unknown:
            raise ConfigError(f"--config: unknown setting(s) {sorted(unknown)}; allowed: {sorted(_FILE_KEYS)}")
        base = dict(raw)

    def pick(flag_value, *keys):
        if flag_value is not None:
            return flag_value
        for k in keys:
            if k in base:
                return base[k]
        return None

    def as_text(v):
        if isinstance(v, (list, tuple)):
            return ",".join(str(x) for x in v)
        return str(v)

    d = TradeoffConfig()
    method_v = pick(args.method, "method", "methods")
    methods = tuple(parse_str_list(as_text(method_v), "--method")) if method_v is not None else d.methods
    for m in methods:
        _methods.get_class(m)  # ConfigError listing the available ones
    eps_v = pick(args.eps, "eps", "epsilons")
    epsilons = tuple(parse_float_list(as_text(eps_v), "--eps", positive=True)) if eps_v is not None else d.epsilons
    delta = pick(args.delta, "delta")
    delta = d.delta if delta is None else float(delta)
    if not 0 < delta < 1:
        raise ConfigError(f"--delta must be in (0, 1), got {delta}")
    seeds_v = pick(args.seeds, "seeds")
    if seeds_v is None:
        seeds = d.seeds
    elif isinstance(seeds_v, int) or (isinstance(seeds_v, str) and "," not in seeds_v):
        n = parse_int_list(as_text(seeds_v), "--seeds", minimum=1)[0]
        seeds = tuple(range(n))
    else:
        seeds = tuple(parse_int_list(as_text(seeds_v), "--seeds", minimum=0))
    clip = pick(args.clip, "clip")
    if clip is not None and not (float(clip) > 0 and math.isfinite(float(clip))):
        raise ConfigError(f"--clip must be a finite number > 0, got {clip}")
    rounds = pick(args.rounds, "rounds")
    rounds = d.rounds if rounds is None else int(rounds)
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    clients = pick(args.clients, "clients")
    clients = d.clients if clients is None else int(clients)
    if clients < 1:
        raise ConfigError(f"--clients must be >= 1, got {clients}")
    alpha = pick(args.alpha, "alpha")
    alpha = d.alpha if alpha is None else float(alpha)
    if not alpha > 0:
        raise ConfigError(f"--alpha must be > 0, got {alpha}")
    from privfed.tradeoff_privacy import COUNT_NOISE_KINDS

    count_noise = pick(args.count_noise, "count_noise")
    if count_noise is not None and count_noise not in COUNT_NOISE_KINDS:
        raise ConfigError(f"--count-noise must be one of {', '.join(COUNT_NOISE_KINDS)}, got {count_noise!r}")
    max_records = pick(args.max_records, "max_records")
    if max_records is not None and int(max_records) < 1:
        raise ConfigError(f"--max-records must be >= 1, got {max_records}")
    secure = str(pick(args.secure_agg, "secure_agg") or d.secure_agg)
    if secure not in ("none", "mask", "ckks"):
        raise ConfigError(f"--secure-agg must be none, mask or ckks, got {secure!r}")
    attack_v = pick(args.attack, "attack", "attacks")
    attacks = tuple(parse_str_list(as_text(attack_v), "--attack")) if attack_v else ()
    params: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (base.get("method_params") or {}).items()}
    for item in args.param:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--param {item!r} must look like METHOD.KEY=VALUE, e.g. fedcof.gamma=0.1")
        lhs, value = item.split("=", 1)
        mname, key = lhs.split(".", 1)
        _methods.get_class(mname)
        params.setdefault(mname, {})[key] = _parse_value(value)
    for mname, p in params.items():
        _methods.get(mname, **p)  # validates names and values now, not mid-sweep
    level = str(pick(args.level, "level") or d.level)
    calibration = str(pick(args.calibration, "calibration") or d.calibration)
    clip_norm = str(pick(args.clip_norm, "clip_norm") or d.clip_norm)
    if clip_norm not in ("l2", "coordinate"):
        raise ConfigError(f"--clip-norm must be l2 or coordinate, got {clip_norm!r}")
    if level not in ("record", "client"):
        raise ConfigError(f"--level must be record or client, got {level!r}")
    if calibration not in ("analytic", "classic"):
        raise ConfigError(f"--calibration must be analytic or classic, got {calibration!r}")
    plot = not args.no_plot and bool(base.get("plot", True))
    return TradeoffConfig(
        methods=methods, epsilons=epsilons, delta=delta, level=level,
        clip=None if clip is None else float(clip), clip_norm=clip_norm, calibration=calibration, rounds=rounds,
        count_noise=count_noise, max_records=None if max_records is None else int(max_records),
        trusted_aggregator=bool(pick(args.trusted_aggregator, "trusted_aggregator") or False), seeds=seeds, clients=clients,
        partition=str(pick(args.partition, "partition") or d.partition), alpha=alpha,
        dataset=str(pick(args.dataset, "dataset") or d.dataset), backbone=pick(args.backbone, "backbone"),
        download=bool(pick(args.download, "download") or False), secure_agg=secure, attacks=attacks,
        method_params=params, plot=plot,
    )


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
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    splits = digits_splits(seed)
    feats = extract_features(get_backbone(seed=seed), splits.public_images)
    return float(np.median(np.linalg.norm(feats, axis=1)))


def run_tradeoff(cfg: TradeoffConfig, *, progress: bool = True,
                 records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run the sweep; returns ``{"records": [...], "dataset": {...}, "timing": {...}}``.

    Records are appended to ``records`` (a new list by default) as each run
    finishes, so a caller keeps what was done if the sweep is interrupted.
    """
    from tqdm.auto import tqdm

    from privfed.data import load_dataset
    from privfed.federation import partition as make_partition
    from privfed.tradeoff_privacy import make_privacy, make_secure_agg

    t0 = time.perf_counter()
    ds = load_dataset(cfg.dataset, backbone=cfg.backbone, download=cfg.download, progress=progress)
    t_data = time.perf_counter() - t0
    finite = [e for e in cfg.epsilons if math.isfinite(e)]
    clip = _default_clip(cfg, ds) if finite and cfg.count_noise is None else cfg.clip
    cfg = replace(cfg, clip=clip)
    # Pre-flight: refuse an incompatible method / protection pair before any work.
    for mname in cfg.methods:
        method = _methods.get(mname, **cfg.method_params.get(mname, {}))
        secure = make_secure_agg(cfg.secure_agg)
        if secure is not None and method.per_client and type(method).secure_aggregate is _methods.Method.secure_aggregate:
            raise ConfigError(f"method {mname!r} needs every client's statistics and has no secure protocol; "
                              "drop it from --method or use --secure-agg none")
        for eps in finite[:1]:
            make_privacy(cfg, method, eps, clip, secure_agg=secure)
    attack_ctx = _attack_context(cfg, ds) if cfg.attacks else None
    records = [] if records is None else records
    total = len(cfg.seeds) * len(cfg.methods) * len(cfg.epsilons)
    bar = tqdm(total=total, desc="tradeoff", unit="run", disable=not progress, file=sys.stderr)
    caught: set[str] = set()
    with warnings.catch_warnings(record=True) as wlist, _blas_threads(ds.dim):
        warnings.simplefilter("always")
        _sweep(cfg, ds, clip, records, bar, make_privacy, make_secure_agg, make_partition, attack_ctx)
    caught.update(str(w.message) for w in wlist)
    if attack_ctx is not None:
        caught.update(attack_ctx["skipped"])
    bar.close()
    return {
        "config": cfg,
        "warnings": sorted(caught),
        "records": records,
        "dataset": {"name": ds.name, "num_train": int(ds.train_features.shape[0]),
                    "num_test": int(ds.test_features.shape[0]), "dim": int(ds.train_features.shape[1]),
                    "num_classes": ds.num_classes, "meta": ds.meta},
        "timing": {"data_s": t_data, "total_s": time.perf_counter() - t0},
    }


#: The metric of each attack drawn in the plot's attack panel (the CSV has them all).
ATTACK_HEADLINE = {
    "tracing": "auc", "singleton": "exposed_fraction", "inversion": "delta_psnr", "labels": "presence_auc",
    "subspace": "auc", "unmixing": "matched_cosine", "differencing": "exact_fraction",
}


def _attack_context(cfg: TradeoffConfig, ds) -> dict[str, Any]:
    """What the attacks need: the backbone, the public split (attacker's knowledge) and the private images."""
    import attacks

    for name in cfg.attacks:
        attacks.get_class(name)  # ConfigError listing the available ones
    if ds.name != "digits":
        raise ConfigError("--attack needs the digits default (its backbone and public split are the attacker's "
                          f"knowledge); dataset {ds.name!r} has none")
    from attacks.view import PublicData
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    splits = digits_splits(0)
    backbone = get_backbone(seed=0)
    public = PublicData(labels=splits.public_labels, features=extract_features(backbone, splits.public_images),
                        images=splits.public_images)
    return {"backbone": backbone, "public": public, "images": splits.private_images, "skipped": set()}


def _run_attacks(cfg, ds, ctx, rec, mname, clients, seed, eps, privacy, secure) -> None:
    """Add ``attack_<name>_<metric>`` columns to ``rec`` (NaN where the attack cannot see what it needs)."""
    import attacks

    from privfed.errors import InputError

    for name in cfg.attacks:
        try:
            metrics = attacks.evaluate_federation(
                name, mname, ds.train_features, ds.train_labels, clients, rng=_seed_for(seed, mname, eps, name),
                images=ctx["images"], holdout_features=ds.test_features, holdout_labels=ds.test_labels,
                privacy=privacy, secure_agg=secure, backbone=ctx["backbone"], public=ctx["public"],
                num_classes=ds.num_classes, **cfg.method_params.get(mname, {}),
            )
        except InputError as exc:
            ctx["skipped"].add(f"attack {name!r} skipped for method {mname!r}: {exc}")
            metrics = {ATTACK_HEADLINE.get(name, "value"): float("nan")}
        for key, value in metrics.items():
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                rec[f"attack_{name}_{key}"] = float(value)


def _sweep(cfg, ds, clip, records, bar, make_privacy, make_secure_agg, make_partition, attack_ctx=None) -> None:
    """The seeds x methods x budgets loop; statistics computed once per (seed, method)."""
    for seed in cfg.seeds:
        natural = ds.train_clients if cfg.partition == "natural" else None
        part = make_partition(ds.train_labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=seed, natural=natural)
        F, y, k = part.apply(ds.train_features, ds.train_labels)
        K = int(k.max()) + 1
        for mname in cfg.methods:
            method = _methods.get(mname, **cfg.method_params.get(mname, {}))
            common = dict(num_classes=ds.num_classes, num_clients=K)
            stats0 = client_statistics(method, F, y, k, rng=_seed_for(seed, mname, "stats"), **common)
            head0 = server_head(method, stats0, num_clients=K, rng=_seed_for(seed, mname, "server"))
            acc0 = head0.score(ds.test_features, ds.test_labels)
            clipped = None
            for eps in cfg.epsilons:
                rec: dict[str, Any] = dict(
                    method=mname, level=cfg.level, epsilon=eps, delta=cfg.delta, seed=seed,
                    nonprivate_accuracy=acc0, calibration=cfg.calibration, rounds=cfg.rounds,
                    count_noise=cfg.count_noise, secure_agg=cfg.secure_agg, clip=clip,
                )
                secure = make_secure_agg(cfg.secure_agg)
                if not math.isfinite(eps):
                    head = head0 if secure is None else server_head(
                        method, stats0, num_clients=K, rng=_seed_for(seed, mname, "secure"), secure_agg=secure)
                    rec.update(mechanism="none", accuracy=head.score(ds.test_features, ds.test_labels),
                               sigma=0.0, sigma_counts=0.0, clip=None, guarantee="no protection (eps=inf)",
                               epsilon_reported=math.inf)
                else:
                    privacy = make_privacy(cfg, method, eps, clip, secure_agg=secure)
                    if clipped is None:
                        clipped = client_statistics(method, F, y, k, rng=_seed_for(seed, mname, "stats"),
                                                    privacy=privacy, secure_agg=secure, **common)
                    head = server_head(method, clipped, num_clients=K, rng=_seed_for(seed, mname, eps, "noise"),
                                       privacy=privacy, secure_agg=secure)
                    rep = head.privacy
                    rec.update(mechanism=rep.mechanism, accuracy=head.score(ds.test_features, ds.test_labels),
                               sigma=rep.sigma.get("sums", float("nan")),
                               sigma_counts=rep.sigma.get("counts", float("nan")),
                               guarantee=rep.guarantee, epsilon_reported=rep.epsilon)
                upload = head.upload_bytes.get("per_client")
                if head.secure_aggregation is not None:
                    upload = getattr(head.secure_aggregation, "bytes_per_client", upload)
                rec["upload_bytes"] = upload
                rec["notes"] = "; ".join(head.notes)
                if attack_ctx is not None:
                    _run_attacks(cfg, ds, attack_ctx, rec, mname, part.clients, seed, eps,
                                 None if not math.isfinite(eps) else privacy, secure)
                records.append(rec)
                bar.update(1)


# ---------------------------------------------------------------- outputs
def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (method, mechanism, epsilon)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    out = []
    for (m, eps), rs in groups.items():
        acc = np.array([r["accuracy"] for r in rs])
        acc0 = np.array([r["nonprivate_accuracy"] for r in rs])
        out.append(dict(
            method=m, epsilon=eps, seeds=len(rs), accuracy_mean=float(acc.mean()),
            accuracy_std=float(acc.std(ddof=1)) if len(rs) > 1 else 0.0,
            nonprivate_mean=float(acc0.mean()),
            nonprivate_std=float(acc0.std(ddof=1)) if len(rs) > 1 else 0.0,
            delta=rs[0]["delta"], sigma=rs[0]["sigma"], sigma_counts=rs[0]["sigma_counts"], calibration=rs[0]["calibration"],
            level=rs[0]["level"], rounds=rs[0]["rounds"], mechanism=rs[0]["mechanism"],
            upload_bytes=float(np.mean([r["upload_bytes"] for r in rs])), guarantee=rs[0]["guarantee"],
            **{k: float(np.nanmean([r.get(k, np.nan) for r in rs])) if not all(
                np.isnan(r.get(k, np.nan)) for r in rs) else float("nan")
               for k in _headline_keys(rs)},
        ))
    return out


def _headline_keys(rows: list[dict[str, Any]]) -> list[str]:
    keys = {k for r in rows for k in r}
    return [f"attack_{a}_{m}" for a, m in ATTACK_HEADLINE.items() if f"attack_{a}_{m}" in keys]


def format_table(summary: list[dict[str, Any]]) -> str:
    head = ("method", "eps", "accuracy", "non-private", "delta", "sigma sums/counts", "calibration", "level",
            "rounds", "bytes/client")
    rows = []
    for s in summary:
        eps = "inf" if not math.isfinite(s["epsilon"]) else f"{s['epsilon']:g}"
        private = math.isfinite(s["epsilon"])
        rows.append((
            s["method"], eps, f"{s['accuracy_mean']:.4f} ± {s['accuracy_std']:.4f}",
            f"{s['nonprivate_mean']:.4f} ± {s['nonprivate_std']:.4f}",
            f"{s['delta']:g}" if private else "-",
            f"{s['sigma']:.4g} / {s['sigma_counts']:.4g}" if private else "0",
            s["calibration"] if private else "-", s["level"] if private else "-",
            str(s["rounds"]) if private else "-", f"{s['upload_bytes']:,.0f}",
        ))
    att = [k for k in ATTACK_HEADLINE.items() if any(f"attack_{k[0]}_{k[1]}" in s for s in summary)]
    if att:
        head = (*head, *(f"{a} {m}" for a, m in att))
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.3f}"  # noqa: E731
        rows = [(*r, *(fmt(s.get(f"attack_{a}_{m}", float("nan"))) for a, m in att))
                for r, s in zip(rows, summary)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    extra = sorted({k for r in records for k in r} - set(RECORD_KEYS))
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*RECORD_KEYS, *extra])
        w.writeheader()
        for r in records:
            w.writerow({k: r.get(k, "") for k in (*RECORD_KEYS, *extra)})


def _eps_ticks(ax, ticks: list[float]) -> None:
    """Label exactly the budgets swept (log axes otherwise crowd minor labels)."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())


def plot_tradeoff(path: Path, summary: list[dict[str, Any]], title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attack_cols = [k for k in _headline_keys(summary)
                   if any(np.isfinite(s.get(k, np.nan)) for s in summary)]
    fig, axes = plt.subplots(1, 2 if attack_cols else 1, figsize=(11 if attack_cols else 6.5, 4.2), squeeze=False)
    ax = axes[0, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, m in enumerate(dict.fromkeys(s["method"] for s in summary)):
        c = colors[i % len(colors)]
        rows = sorted((s for s in summary if s["method"] == m and math.isfinite(s["epsilon"])), key=lambda s: s["epsilon"])
        base = [s["nonprivate_mean"] for s in summary if s["method"] == m]
        if rows:
            x = np.array([s["epsilon"] for s in rows])
            mu = np.array([s["accuracy_mean"] for s in rows])
            sd = np.array([s["accuracy_std"] for s in rows])
            ax.plot(x, mu, "o-", color=c, label=m, ms=4)
            ax.fill_between(x, mu - sd, mu + sd, color=c, alpha=0.2, lw=0)
        if base:
            ax.axhline(base[0], color=c, ls="--", lw=1, label=f"{m} non-private" if not rows else None)
    eps_ticks = sorted({s["epsilon"] for s in summary if math.isfinite(s["epsilon"])})
    ax.set_xscale("log")
    _eps_ticks(ax, eps_ticks)
    ax.set_xlabel("epsilon (log scale); dashed: non-private")
    ax.set_ylabel("test accuracy")
    ax.set_title(title or "privacy-utility trade-off")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if attack_cols:
        ax2 = axes[0, 1]
        for j, col in enumerate(attack_cols):
            for i, m in enumerate(dict.fromkeys(s["method"] for s in summary)):
                rows = sorted((s for s in summary if s["method"] == m and math.isfinite(s["epsilon"])
                               and np.isfinite(s.get(col, np.nan))), key=lambda s: s["epsilon"])
                clean = [s[col] for s in summary if s["method"] == m and not math.isfinite(s["epsilon"])
                         and np.isfinite(s.get(col, np.nan))]
                if clean:
                    ax2.axhline(clean[0], color=colors[i % len(colors)], ls=["-", ":", "-.", "--"][j % 4], lw=0.8,
                                alpha=0.6)
                if rows:
                    ax2.plot([s["epsilon"] for s in rows], [s[col] for s in rows], marker="o",
                             ls=["-", ":", "-.", "--"][j % 4], color=colors[i % len(colors)],
                             label=f"{m}: {col[7:]}", ms=4)
        ax2.set_xscale("log")
        _eps_ticks(ax2, eps_ticks)
        ax2.set_xlabel("epsilon (log scale); thin lines: no protection")
        ax2.set_ylabel("attack metric")
        ax2.set_title("what a curious server recovers")
        ax2.grid(alpha=0.3, which="both")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _body(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)
    if cfg.methods == ("fedlog",) and cfg.rounds > 1:  # the paper's multi-round protocol
        from privfed.fedlog_rounds import tradeoff_main

        return tradeoff_main(cfg, args)
    out = prepare_out_dir(args.out, "tradeoff", overwrite=args.overwrite)
    done: list[dict[str, Any]] = []
    try:
        result = run_tradeoff(cfg, progress=not args.quiet, records=done)
    except BaseException:
        if done:  # nothing lost: what finished is written before the error is reported
            write_csv(out / "results.partial.csv", done)
            write_json(out / "results.partial.json", {"config": asdict(cfg), "versions": versions(),
                                                      "records": done, "complete": False})
            print(f"{PROG}: the sweep stopped after {len(done)} run(s); they are in {out}/results.partial.csv",
                  file=sys.stderr)
        raise
    records, summary = result["records"], summarise(result["records"])
    write_csv(out / "results.csv", records)
    write_json(out / "results.json", {
        "config": asdict(result["config"]), "versions": versions(), "warnings": result["warnings"], "dataset": result["dataset"],
        "timing": result["timing"], "records": records, "summary": summary,
        "command": " ".join([PROG, *(argv if argv is not None else sys.argv[1:])]),
    })
    if cfg.plot:
        plot_tradeoff(out / "tradeoff.png", summary, title=f"{result['dataset']['name']}: {cfg.clients} clients, "
                      f"{cfg.partition} alpha={cfg.alpha:g}, {cfg.level} level")
    print(format_table(summary))
    guarantees = sorted({s["guarantee"] for s in summary if math.isfinite(s["epsilon"])})
    for g in guarantees:
        print(f"guarantee: {g}")
    if any(math.isfinite(e) for e in cfg.epsilons) and result["config"].clip is not None:
        origin = "--clip" if cfg.clip is not None else "median feature norm of the public split (no privacy cost)"
        print(f"clip: {result['config'].clip:.4g} ({result['config'].clip_norm}; {origin})")
    for w in result["warnings"]:
        print(f"note: {w}")
    print(f"wrote {out}/results.csv, results.json" + (", tradeoff.png" if cfg.plot else "")
          + f"  ({result['timing']['total_s']:.1f} s)")
    return 0


main = cli_entry(PROG, _body)

if __name__ == "__main__":
    sys.exit(main())
