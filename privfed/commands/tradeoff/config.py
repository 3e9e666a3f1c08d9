"""The trade-off sweep's settings: :class:`TradeoffConfig` and how flags and a config file resolve into it."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from privfed.commands.options import FEDERATION
from privfed.commands.shared import Settings, as_list
from privfed.commands.values import as_int, as_str, choose, parse_seeds, parse_str_list
from privfed.errors import ConfigError
from privfed.release.settings import COUNT_NOISE_KINDS, check_combination, refuse_unused_dp

__all__ = ["PLACEMENTS", "PLACEMENT_LABEL", "TradeoffConfig", "check_config", "resolve_config"]


@dataclass(frozen=True)
class TradeoffConfig:
    """Every setting of a trade-off run (the JSON output stores it resolved); :func:`run_tradeoff` checks one
    built in Python as the flags are checked (:func:`check_config`)."""

    methods: tuple[str, ...] = (FEDERATION["method"],)
    epsilons: tuple[float, ...] = (float(FEDERATION["eps"]),)
    delta: float = float(FEDERATION["delta"])
    level: str = FEDERATION["level"]
    clip: float | None = None
    clip_norm: str = "l2"
    calibration: str = "analytic"
    rounds: int = 1
    count_noise: str | None = None
    max_records: int | None = None
    trusted_aggregator: bool = False
    seeds: tuple[int, ...] = parse_seeds(FEDERATION["seeds"])
    clients: int = FEDERATION["clients"]
    partition: str = FEDERATION["partition"]
    alpha: float = float(FEDERATION["alpha"])
    dataset: str = FEDERATION["dataset"]
    #: The feature file's SHA-256 when the settings replay a recorded run on it (checked before any work).
    dataset_sha256: str | None = None
    backbone: str | None = None
    download: bool = False
    secure_agg: str = FEDERATION["secure_agg"]
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
    "dataset_sha256",
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


def _choice(value: Any, flag: str, choices: tuple[str, ...], what: str = "value") -> str:
    return choose(value, choices, flag, what=what)


def check_config(cfg: TradeoffConfig) -> TradeoffConfig:
    """A :class:`TradeoffConfig` built in Python, through the checks and messages of the flags and a settings
    file (:func:`~privfed.commands.tradeoff.sweep.run_tradeoff` calls it): a NaN budget, an unknown placement or
    two settings that contradict each other are refused in one line, never run as something else.  Returns the
    settings as the flags read them (``methods="fedlog"`` is one method, ``seeds=3`` three seeds)."""
    if not isinstance(cfg, TradeoffConfig):
        raise ConfigError(f"run_tradeoff takes a TradeoffConfig, got {type(cfg).__name__}")
    # the command's own (a replayed record's leniency included) is checked already
    if getattr(cfg, _RESOLVED, False):
        return cfg
    default = TradeoffConfig()
    # numpy scalars and arrays read as Python's; a value left at its default is not a setting given (--alpha
    # with an iid split is refused)
    plain = {f.name: _python(getattr(cfg, f.name)) for f in fields(cfg)}
    values = {k: v for k, v in plain.items() if v != getattr(default, k)}
    values.setdefault("placements", cfg.placements)  # none: the one the other settings select (not all three)
    try:
        return resolve_config(argparse.Namespace(), values=values)
    except ConfigError as exc:
        raise ConfigError(f"TradeoffConfig: {exc}") from None


#: Marks a config :func:`resolve_config` made (not a field: equality and the record ignore it).
_RESOLVED = "_privfed_resolved"


def _python(value: Any) -> Any:
    """A numpy scalar or array as the Python value or list the settings checks read (np.float32(30.0) is 30.0)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_python(v) for v in value)
    return value


def resolve_config(args: argparse.Namespace, *, values: dict[str, Any] | None = None) -> TradeoffConfig:
    """Merge defaults < config file < flags into a validated TradeoffConfig.

    A config file's values pass the same checks, with the same messages, as
    the flags (``rounds = 2.5`` and ``clip = "abc"`` are refused alike); the
    shared settings resolve as in every command (:class:`privfed.commands.shared.Settings`).
    ``values``: settings a program wrote (:func:`check_config`), in place of a config file.
    """
    s = (
        Settings(args, _FILE_KEYS, "tradeoff")
        if values is None
        else Settings.of_values(values, _FILE_KEYS, "in the TradeoffConfig")
    )
    base = s.base
    given = [s.named(k) for k in ("local_epochs", "families", "init") if s.given(k)]
    if getattr(args, "local_epochs", None) is not None:  # '1e9' or 'abc': one line, not int()'s ValueError
        args.local_epochs = as_int(args.local_epochs, "--local-epochs", minimum=0)
    if getattr(args, "families", None) is not None:
        args.families = ",".join(parse_str_list(as_list(args.families, "--families"), "--families"))
    # multi-round fedlog settings from a saved run (flags win), so that its config re-runs it
    for key in ("local_epochs", "families", "init"):
        if getattr(args, key, None) is None and base.get(key) is not None:
            v = base[key]
            setattr(
                args,
                key,
                as_list(v, "--families")
                if key == "families"
                else (
                    as_int(v, "--local-epochs", minimum=0) if key == "local_epochs" else as_str(v, "--init")
                ),
            )
    pick = s.raw
    d = TradeoffConfig()
    methods = s.methods()
    epsilons = s.epsilons()
    delta = s.delta()
    seeds = s.seeds()
    clip = s.clip()
    rounds = pick("rounds")
    rounds = d.rounds if rounds is None else as_int(rounds, "--rounds", minimum=1)
    if rounds == 1 and given:  # they shape the local bodies of a multi-round run; a one-shot run has none
        raise ConfigError(
            f"{', '.join(given)} applies to multi-round FedLog only (--rounds T with T > 1); add --rounds or drop "
            f"{given[0]}"
        )
    if rounds > 1 and tuple(methods) != ("fedlog",):
        # first: every other setting of a multi-round run (its placement, level, clipping) is FedLog's
        raise ConfigError(
            f"{s.named('rounds')} {rounds}: only fedlog runs several rounds (local bodies); pass "
            f"{s.named('method', 'method', 'methods')} fedlog alone, or drop {s.named('rounds')}"
        )
    clients = s.clients()
    alpha = s.alpha()
    count_noise = s.count_noise(tuple(COUNT_NOISE_KINDS))
    s.check_count_noise(count_noise, epsilons)
    max_records = pick("max_records")
    if max_records is not None:
        max_records = as_int(max_records, "--max-records", minimum=1)
    secure = s.secure_agg()
    trusted = s.switch("trusted_aggregator")
    attacks = s.attacks()
    if rounds > 1 and attacks:
        if s.replay and getattr(args, "attack", None) is None:
            attacks = ()  # a record written before this was refused: its multi-round run never ran them
        else:
            raise ConfigError(
                f"{s.named('attack', 'attack', 'attacks')} applies to one-shot runs: a multi-round run (--rounds "
                f"{rounds}) attacks the sequence of its releases itself (the tracing likelihood ratio, or "
                "differencing replayed under noise: its attack columns); drop --attack"
            )
    params = s.params(methods)
    level = s.level()
    calibration = _choice(pick("calibration") or d.calibration, "--calibration", ("analytic", "classic"))
    clip_norm = _choice(pick("clip_norm") or d.clip_norm, "--clip-norm", ("l2", "coordinate"))
    download = s.switch("download")
    backbone = pick("backbone")
    backbone = None if backbone is None else as_str(backbone, "--backbone")
    noise = any(math.isfinite(e) for e in epsilons)
    placement = pick("placement", "placement", "placements")  # where the noise goes
    if not noise:
        # a DP record replayed under --eps inf: its settings of the release are no settings of this run (the same
        # given as flags, or in a settings file a user wrote, are refused below)
        clip = None if s.replayed("clip") else clip
        trusted = False if s.replayed("trusted_aggregator") else trusted
        level = "record" if s.replayed("level") else level
        max_records = None if s.replayed("max_records") else max_records
        calibration = d.calibration if s.replayed("calibration") else calibration
        clip_norm = d.clip_norm if s.replayed("clip_norm") else clip_norm
        count_noise = None if s.replayed("count_noise") else count_noise
        delta = d.delta if s.replayed("delta") else delta
        # a record writes its placements under another key than the flag's, so replayed() would not see them
        placement = None if s.replay and getattr(args, "placement", None) is None else placement
    # one configuration: a pair that contradicts itself is refused now, naming both (never one ignored)
    check_combination(
        count_noise=count_noise,
        level=level,
        secure_agg=secure,
        trusted_aggregator=trusted,
        placements=_explicit_placements(placement),
        clip=clip,
        clip_norm=clip_norm,
        calibration=calibration,
        max_records=max_records,
        rounds=rounds,
    )
    refuse_unused_dp(
        noise,
        {
            "--clip": clip is not None,
            "--trusted-aggregator": trusted,
            s.named("delta"): s.given("delta") and not s.replayed("delta"),
            f"{s.named('count_noise')} {count_noise}": count_noise is not None,
            s.named("placement", "placement", "placements"): bool(_explicit_placements(placement)),
            "--level client": level == "client",
            "--calibration classic": calibration == "classic",
            "--clip-norm coordinate": clip_norm == "coordinate",
        },
    )
    if clip_norm == "coordinate" and clip is None:
        raise ConfigError("--clip-norm coordinate needs an explicit --clip B (the per-coordinate bound)")
    if rounds > 1 and noise and clip is None and s.given("clip_norm"):
        # multi-round FedLog's default bound is per coordinate: a norm a user asked for without its bound is
        # never replaced by it in silence (a replayed record's default norm is no request)
        raise ConfigError(
            f"{s.named('clip_norm')} {clip_norm} under {rounds} rounds needs --clip B: without it "
            f"multi-round FedLog clips each coordinate at 2 (its default bound); give the bound, or drop "
            f"{s.named('clip_norm')}"
        )
    placements = _resolve_placements(
        placement,
        epsilons=epsilons,
        level=level,
        count_noise=count_noise,
        secure=secure,
        trusted=trusted,
        rounds=rounds,
    )
    if rounds > 1 and level == "client" and not placements and secure == "none" and not trusted:
        # a multi-round run's default placement is each client's own noise, which client level cannot use
        raise ConfigError(
            "--level client adds noise to the aggregate: pass --placement trusted (the server adds it) or "
            "--placement secure-sum (the clients split it under secure aggregation)"
        )
    if secure == "none" and s.given("secure_agg") and "secure-sum" in placements:
        # an explicit "no secure aggregation": the secure-sum placement would run masking all the same
        if _explicit_placements(placement):
            raise ConfigError(
                f"--placement secure-sum contradicts {s.named('secure_agg')} none: the secure-sum placement sums "
                "the noised statistics under secure aggregation (mask unless told); drop one of them"
            )
        # the default comparison, less that row
        placements = tuple(p for p in placements if p != "secure-sum")
    partition = s.partition()
    s.refuse_unused_alpha(partition)
    if partition == "natural" and s.given("clients"):  # as --alpha: refused, never ignored
        raise ConfigError(
            f"{s.named('clients')} applies to the splits privfed draws; --partition natural keeps the file's own "
            "clients array (its number of clients): drop it"
        )
    if clients < 2 and partition != "natural":  # refused now, not after the local runs finished
        if secure != "none":
            raise ConfigError(
                f"--secure-agg {secure} needs --clients 2 or more (a sum of one input is that input); raise "
                "--clients or drop --secure-agg"
            )
        if "secure-sum" in placements:
            raise ConfigError(
                f"--clients {clients}: the secure-sum placement needs 2 or more clients (a sum of one input is that "
                "input); pass --placement local,trusted, or --clients 2 or more"
            )
    out = TradeoffConfig(
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
        partition=partition,
        alpha=alpha,
        dataset=s.dataset(),
        dataset_sha256=s.dataset_sha256(),
        backbone=backbone,
        download=download,
        secure_agg=secure,
        attacks=attacks,
        method_params=params,
        plot=s.plot(),
        placements=placements,
    )
    object.__setattr__(out, _RESOLVED, True)
    return out


def _explicit_placements(value: Any) -> tuple[str, ...]:
    """The placements a --placement value names (nothing when absent or malformed: checked later)."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ()
    try:
        items = parse_str_list(as_list(value, "--placement"), "--placement")
    except ConfigError:
        return ()
    return tuple(PLACEMENTS) if items == ["all"] else tuple(items)


def _resolve_placements(
    value: Any, *, epsilons, level, count_noise, secure, trusted, rounds=1
) -> tuple[str, ...]:
    """--placement: explicit list, or 'all' by default for one finite eps with nothing else chosen
    (one-shot runs: a multi-round run trains its bodies once per placement, so it runs one unless told).

    An empty list (a saved run that used the placement its settings select) is kept empty.
    """
    if isinstance(value, (list, tuple)) and not value:
        return ()
    if value is not None:
        items = parse_str_list(as_list(value, "--placement"), "--placement")
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
    if (
        single
        and rounds == 1
        and level == "record"
        and count_noise is None
        and secure == "none"
        and not trusted
    ):
        return PLACEMENTS
    return ()
