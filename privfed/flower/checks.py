"""Checks a Flower run's configuration makes for its optional protocols, before any message.

:func:`rounds_config` (multi-round FedLog's settings) and :func:`check_limits` (what Flower's
SecAgg+ can carry) live here, below :mod:`privfed.flower.config` that calls them and the
protocol modules that use them, so that no module of the app imports one that imports it back.
"""

from __future__ import annotations

from dataclasses import fields

from privfed.errors import ConfigError

__all__ = [
    "CLIPPING_RANGE",
    "MODULUS_RANGE",
    "QUANTIZATION_RANGE",
    "check_limits",
    "rounds_config",
    "rounds_placement",
]

#: Flower's SecAgg+ pre-scales every entry into [-CLIPPING_RANGE, CLIPPING_RANGE], quantises it to
#: QUANTIZATION_RANGE levels and sums in a ring of MODULUS_RANGE.
CLIPPING_RANGE = 8.0
QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32

#: rounds-params keys a Flower multi-round FedLog run may set.
_ALLOWED = (
    "local_epochs",
    "batch_size",
    "lr",
    "families",
    "init",
    "classes_per_client",
    "head_init_scale",
    "clip_norm",
    "calibration",
    "record_bound",
)


#: rounds-params keys that set the DP release (no use without noise).
DP_ROUNDS_PARAMS = ("clip_norm", "calibration", "record_bound")


def rounds_config(cfg):
    """The :class:`privfed.rounds.RoundsConfig` of a Flower run (ConfigError naming a bad key).

    The budget, level, clip, ``max-records``, ``dropout-tolerance``, ``noise-seed`` and the partition
    (``partition``, ``alpha``, ``partition-seed``: the seed of digits' split and of the partition) come from
    the run config; the placement from it too: ``trusted-aggregator`` is central noise, ``secure=mask`` distributed
    noise under pairwise masking, neither the nodes' own (local) noise.
    """
    from privfed.release.settings import refuse_unused_dp
    from privfed.rounds import RoundsConfig

    params = dict(cfg.rounds_params)
    moved = sorted(set(params) & {"partition", "alpha", "seed"})
    if moved:  # one source: the run config's, which the run's report describes
        raise ConfigError(
            f"rounds-params {moved}: a Flower run's partition is the run config's (--partition, --alpha, "
            "--seeds; run config partition, alpha, partition-seed), for one round or many"
        )
    bad = sorted(set(params) - set(_ALLOWED))
    if bad:
        known = {f.name for f in fields(RoundsConfig)}
        why = "not settable here" if set(bad) <= known else "unknown"
        raise ConfigError(f"rounds-params key(s) {bad} {why}; allowed: {list(_ALLOWED)}")
    # as every command refuses a setting of the release without noise
    refuse_unused_dp(
        cfg.private, {f"rounds-params {k}": True for k in sorted(set(params) & set(DP_ROUNDS_PARAMS))}
    )
    extra = sorted(set(cfg.method_params) - {"nu"})
    if extra:
        raise ConfigError(f"multi-round FedLog takes method-params 'nu' only, got {extra}")
    dp = {}
    if cfg.private:
        dp = {
            "epsilon": float(cfg.epsilon),
            "delta": float(cfg.delta),
            "level": cfg.level,
            "placement": rounds_placement(cfg),
            "clip": float(cfg.clip),
            "max_records": cfg.max_records,
            "tolerate": int(cfg.dropout_tolerance),
        }
    return RoundsConfig(
        clients=cfg.clients,
        rounds=cfg.rounds,
        partition=cfg.partition,
        alpha=float(cfg.alpha),
        seed=int(cfg.partition_seed),
        nu=float(cfg.method_params.get("nu", 1.0)),
        baselines=(),
        noise_seed=cfg.noise_seed,
        secure_agg="mask" if cfg.secure == "mask" else "none",
        **dp,
        **params,
    ).validate()


def rounds_placement(cfg) -> str:
    """Who noises multi-round FedLog's releases on Flower: ``none``, ``central``, ``distributed`` or ``local``."""
    if not cfg.private:
        return "none"
    if cfg.trusted_aggregator:
        return "central"
    return "distributed" if cfg.secure == "mask" else "local"


def check_limits(cfg) -> None:
    """Refuse configurations Flower's SecAgg+ cannot carry (ConfigError naming the limit)."""
    if cfg.make_method().per_client:
        raise ConfigError(
            f"secure=flwr-secaggplus-insecure sums one vector; method {cfg.method!r} needs every node's "
            "statistics (its secure protocol runs with --secure-agg mask or ckks)"
        )
    if cfg.private:
        raise ConfigError(
            "DP noise is not offered with Flower's SecAgg+; use --secure-agg mask (its nodes add "
            "distributed noise shares) or drop --eps"
        )
    if cfg.clip is None or cfg.max_records is None:
        raise ConfigError(
            "secure=flwr-secaggplus-insecure needs public bounds to pre-scale the statistics into "
            f"[-{CLIPPING_RANGE:g}, {CLIPPING_RANGE:g}]: pass clip (the L2 bound of every record) "
            "and max-records (the most records a node holds)"
        )
    if cfg.clients < 3:
        raise ConfigError(
            f"Flower's SecAgg+ needs at least 3 nodes (its share threshold and graph), got "
            f"clients={cfg.clients}; use --secure-agg mask for 2 nodes"
        )
    if cfg.clients * QUANTIZATION_RANGE >= MODULUS_RANGE:
        raise ConfigError(
            f"Flower's SecAgg+ sums {cfg.clients} quantised values of up to 2^22 each in a 2^32 ring: they "
            f"could overflow (K * 2^22 >= 2^32 from K = {MODULUS_RANGE // QUANTIZATION_RANGE}); use at most "
            f"{MODULUS_RANGE // QUANTIZATION_RANGE - 1} clients, or --secure-agg mask"
        )
