"""The attack sweep's settings: :class:`AttackConfig` and how flags and a config file resolve into it."""

from __future__ import annotations

import argparse
import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any

import attacks
from privfed.commands.options import FEDERATION
from privfed.commands.shared import Settings, as_list
from privfed.commands.values import as_int, parse_int_list, parse_seeds
from privfed.errors import ConfigError, MissingDependencyError
from privfed.release.settings import check_combination, refuse_unused_dp

__all__ = ["SUITE_KINDS", "AttackConfig", "resolve_config"]

#: Attacks with a suite whose strongest member is reported next to the individual attack.
SUITE_KINDS = ("tracing", "inversion")
_SUITE_KINDS = SUITE_KINDS


@dataclass(frozen=True)
class AttackConfig:
    """Resolved configuration of one attack sweep (saved as the record's ``config``; ``--config`` replays it)."""

    attack: str
    methods: tuple[str, ...] = (FEDERATION["method"],)
    epsilons: tuple[float, ...] = (float(FEDERATION["eps"]),)
    delta: float = float(FEDERATION["delta"])
    clip: float | None = None
    ns: tuple[int, ...] = (0,)
    partition: str = FEDERATION["partition"]
    clients: int = FEDERATION["clients"]
    alpha: float = float(FEDERATION["alpha"])
    secure_agg: str = FEDERATION["secure_agg"]
    count_noise: str | None = None
    seeds: tuple[int, ...] = (0,)
    max_groups: int = 40
    attack_params: dict = field(default_factory=dict)
    data_seed: int = 0
    device: str = "cpu"
    out: str = ""
    strongest: bool = True
    dataset: str = FEDERATION["dataset"]
    level: str = FEDERATION["level"]
    method_params: dict = field(default_factory=dict)
    plot: bool = True


#: Keys a --config file may hold: the flags (with underscores) and the fields of a saved run's config.
_FILE_KEYS = {
    "attack",
    "method",
    "methods",
    "eps",
    "epsilons",
    "delta",
    "clip",
    "n",
    "ns",
    "partition",
    "clients",
    "alpha",
    "secure_agg",
    "count_noise",
    "seeds",
    "max_groups",
    "attack_params",
    "backend",
    "source",
    "steps",
    "max_cells",
    "data_seed",
    "device",
    "strongest",
    "dataset",
    "level",
    "method_params",
    "plot",
}


def resolve_config(args: argparse.Namespace) -> AttackConfig:
    """Flags over a ``--config`` file over the shared defaults, into a validated :class:`AttackConfig`."""
    from attacks.view import COUNT_NOISE_KINDS

    s = Settings(args, _FILE_KEYS, "attack")
    named = s.attacks() if s.raw("attack") is not None else ()
    if not named:
        raise ConfigError("--attack is required: one of " + ", ".join(attacks.available()))
    if len(named) > 1:
        raise ConfigError(
            f"--attack takes one attack here, got {','.join(named)}; run one command per attack, or put "
            "several as columns of python -m privfed.tradeoff --attack LIST"
        )
    (attack,) = named
    attacks.get_class(attack)
    methods = s.methods()
    if "second" in attacks.get_class(attack).requires:  # found after the methods before it had run
        from privfed import methods as _methods

        has = [m for m in _methods.available() if {"second", "class_second"} & set(_methods.get(m).requires)]
        lacking = [m for m in methods if m not in has]
        if lacking:
            raise ConfigError(
                f"--attack {attack} reads each client's second moment, which {' and '.join(lacking)} "
                f"{'does' if len(lacking) == 1 else 'do'} not upload; use --method "
                f"{','.join(h for h in has if h != 'fedcof-oracle')}"
            )
    eps = s.epsilons()
    delta = s.delta()
    clip = s.clip()
    level = s.level()
    if level != "record":
        raise ConfigError(
            "--level client: the attacks' releases add the noise at record level (each client noises its "
            "upload); run the client-level trade-off with python -m privfed.tradeoff --level client"
        )
    dataset = s.dataset()
    if dataset != "digits":
        raise ConfigError(
            f"--dataset {dataset!r}: the attacks need the digits data set's backbone and public split (the "
            "attacker's knowledge); use --dataset digits"
        )
    partition = s.partition(extra=("groups",))
    for dest in ("n", "max_groups"):
        if s.given(dest) and partition != "groups":  # a flag, or a user's settings file
            raise ConfigError(
                f"{s.named(dest)} applies to --partition groups (exactly n samples of one class on each client); "
                f"add --partition groups, or drop it (--partition {partition} splits by its own rule)"
            )
    if s.given("clients") and partition == "groups":  # as --n outside groups: refused, never ignored
        raise ConfigError(
            f"{s.named('clients')} applies to the splits privfed draws; --partition groups makes one client per "
            "class group (at most --max-groups of them): drop it, or set --max-groups"
        )
    seed_v = s.base.get("data_seed")  # recorded with every run; the attacker's knowledge is seed 0's
    if seed_v is not None and (isinstance(seed_v, bool) or seed_v != 0):
        raise ConfigError(
            f"data_seed in --config: the attacks run on the digits split and backbone of seed 0 (the record "
            f"states it; it is not a setting), got {seed_v!r}; drop it"
        )
    ns_v = s.raw("n", "n", "ns") if partition == "groups" else None  # n applies to class groups only
    ns = tuple(parse_int_list(as_list("1,4,16" if ns_v is None else ns_v, "--n"), "--n", minimum=1))
    if len(set(ns)) != len(ns):  # as --seeds: a repeated n would run the same groups twice
        raise ConfigError(f"--n lists a size twice: {ns_v!r}")
    count_noise = s.count_noise(tuple(COUNT_NOISE_KINDS))
    s.check_count_noise(count_noise, eps)
    clients = s.clients()
    mg = s.raw("max_groups")
    max_groups = 40 if mg is None else as_int(mg, "--max-groups", minimum=1)
    alpha = s.alpha()
    s.refuse_unused_alpha(partition)  # as --n and --max-groups outside --partition groups
    # --seeds N is a count (0..N-1) or a list, as in every command; the older --seed keeps its meaning (a list).
    if getattr(args, "seed_list", None) is not None:
        if args.seeds is not None:
            raise ConfigError("pass --seeds or --seed, not both")
        seeds = parse_seeds(parse_int_list(args.seed_list, "--seed"), "--seed")  # each in 0..2**64 - 1
    else:
        seeds = s.seeds()
    secure = s.secure_agg()
    if secure != "none" and clients < 2 and partition not in ("groups", "natural"):  # as privfed.tradeoff
        raise ConfigError(
            f"--secure-agg {secure} needs --clients 2 or more (a sum of one input is that input); raise "
            "--clients or drop --secure-agg"
        )
    if secure != "none" and partition == "groups" and max_groups < 2:  # each group is one client
        raise ConfigError(
            f"--secure-agg {secure} needs 2 or more clients (a sum of one input is that input), but "
            "--max-groups 1 makes one group, one client; raise --max-groups or drop --secure-agg"
        )
    if not any(math.isfinite(e) for e in eps):  # a DP record replayed under --eps inf: no setting of this run
        clip = None if s.replayed("clip") else clip
        count_noise = None if s.replayed("count_noise") else count_noise
    # one configuration: a pair that contradicts itself is refused now, naming both (never one ignored)
    check_combination(count_noise=count_noise, level=level, secure_agg=secure, clip=clip)
    refuse_unused_dp(
        any(math.isfinite(e) for e in eps),
        {
            "--clip": clip is not None,
            f"--count-noise {count_noise}": count_noise is not None,
            "--delta": s.given("delta") and not s.replayed("delta"),
        },
    )
    table = s.base.get("attack_params") or {}
    if not isinstance(table, dict):
        raise ConfigError(f"attack_params in --config must be a table like {{lr = 0.05}}, got {table!r}")
    params: dict[str, Any] = dict(table)
    for flag in ("backend", "source", "steps", "max_cells"):
        v = getattr(args, flag, None)
        if v is None:
            v = s.base.get(flag)
        if v is not None:
            if attack != "inversion":
                raise ConfigError(f"--{flag.replace('_', '-')} applies to --attack inversion only")
            params[flag] = (
                as_int(v, f"--{flag.replace('_', '-')}", minimum=1) if flag in ("steps", "max_cells") else v
            )
    backend = params.get("backend", attacks.get_class("inversion").defaults["backend"])
    # the learned backends run no such steps (a replayed record's are kept as recorded)
    steps_set = getattr(args, "steps", None) is not None or ("steps" in params and not s.replay)
    if steps_set and backend not in ("pixel", "dip"):
        raise ConfigError(f"--steps applies to the pixel and dip backends, not --backend {backend}; drop it")
    if backend == "dip" and "steps" in params:
        params["dip_steps"] = params.pop("steps")
    attacks.get(attack, **params)  # validate the parameters now
    method_params = s.params(methods)
    device = s.raw("device") or "cpu"
    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise ConfigError(f"--device must be cpu or cuda[:i], got {device!r}")
    if attack == "inversion" and importlib.util.find_spec("skimage") is None:
        raise MissingDependencyError(
            "--attack inversion scores reconstructions with SSIM from scikit-image, "
            "which is not installed: pip install scikit-image"
        )
    flag = getattr(args, "strongest", None)
    if flag is not None and attack not in _SUITE_KINDS:  # given as a flag where no suite runs: never ignored
        raise ConfigError(
            f"--{'' if flag else 'no-'}strongest applies to --attack {' or '.join(sorted(_SUITE_KINDS))} (the "
            f"attacks with a suite); drop it for --attack {attack}"
        )
    strongest = flag if flag is not None else s.base.get("strongest", True)
    if not isinstance(strongest, bool):  # "false" in a file is no False (bool("false") ran the suite)
        raise ConfigError(f"strongest in --config must be true or false, got {strongest!r}")
    return AttackConfig(
        attack=attack,
        methods=methods,
        epsilons=eps,
        delta=delta,
        clip=clip,
        ns=ns if partition == "groups" else (0,),
        partition=partition,
        clients=clients,
        alpha=alpha,
        secure_agg=secure,
        count_noise=count_noise,
        seeds=seeds,
        max_groups=max_groups,
        attack_params=params,
        device=device,
        out="" if args.out is None else str(args.out),
        strongest=bool(strongest) and attack in _SUITE_KINDS,
        dataset=dataset,
        level=level,
        method_params=method_params,
        plot=s.plot(),
    )
