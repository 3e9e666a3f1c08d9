"""The trade-off sweep's settings: :class:`TradeoffConfig` and how flags and a config file resolve into it."""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privfed import methods as _methods
from privfed.commands.common import (
    as_bool,
    as_float,
    as_int,
    as_str,
    check_secure_agg,
    parse_float_list,
    parse_seeds,
    parse_str_list,
)
from privfed.errors import ConfigError
from privfed.release.settings import COUNT_NOISE_KINDS
from privfed.results.writer import manifest_names, verify_folder

__all__ = ["PLACEMENTS", "PLACEMENT_LABEL", "TradeoffConfig", "resolve_config"]


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
