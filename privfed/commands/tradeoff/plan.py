"""A sweep before it runs: its placements, clip bound, per-run seeds, cost estimate and data rules."""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from privfed.commands.tradeoff.config import TradeoffConfig
from privfed.errors import ConfigError

__all__ = [
    "SWEEP_FLOPS_PER_S",
    "SWEEP_NOISE_PER_S",
    "SWEEP_RUN_OVERHEAD_S",
    "blas_threads",
    "data_rules",
    "default_clip",
    "digits_public_clip",
    "placement_variants",
    "seed_for",
    "sweep_cost_note",
]


def seed_for(*parts: Any) -> np.random.Generator:
    """A Generator derived from stable parts (ints and strings), reproducible across runs."""
    words = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return np.random.default_rng(words)


def default_clip(cfg: TradeoffConfig, dataset) -> float:
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


def blas_threads(dim: int):
    """One BLAS thread for small d: the sweep's d x d algebra is too small to gain from threads,
    and on a busy machine OpenBLAS threads spin (measured 3x slower at d = 64 on 2 cores)."""
    import contextlib

    from privfed._linalg import one_blas_thread

    return one_blas_thread() if dim <= 256 else contextlib.nullcontext()


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


#: Rough rates for the estimate a large sweep prints before it starts (one core, float64); the fixed cost of
#: a run (noise, head, evaluation, bookkeeping) from digits: 200 fedncm runs more cost 0.33 s on the 2-core
#: machine the other rates were measured on (1.7 ms a run), taken as 5 ms for slower machines and methods.
SWEEP_FLOPS_PER_S = 2e9
SWEEP_NOISE_PER_S = 2e7
SWEEP_RUN_OVERHEAD_S = 0.005
#: A secure sum's cost in a run: pairwise masking per (client, neighbour) pair (two key agreements, the
#: Shamir shares and their encryption: 100 digits clients on the complete graph took 2.1 s a run) and CKKS
#: per client (its encryption and the key holder's share: 2 s a run for 100 clients), on the same machine.
SWEEP_MASK_PAIR_S = 2e-4
SWEEP_CKKS_CLIENT_S = 0.02


def sweep_cost_note(
    runs: int,
    *,
    n: int,
    d: int,
    k: int,
    c: int,
    attacks: int = 0,
    passes: int | None = None,
    secure_runs: int = 0,
    secure_kind: str = "mask",
    above_s: float = 300.0,
) -> str | None:
    """A one-line estimate when a sweep's predicted time is over ``above_s`` seconds, else None.

    Per run: a fixed cost, a d x d solve (d^3) and local noise on K x C x (d + 1) values; per statistics
    pass (``passes``, one per seed, method and placement, shared by its budgets; default one per run) N d^2
    flops for the second moments; ``secure_runs`` of the runs sum under ``secure_kind`` (masking on the
    complete graph, or CKKS); attacks count as as many runs again.  An order of magnitude, not a promise:
    the progress bar shows the measured ETA.
    """
    per_run = SWEEP_RUN_OVERHEAD_S + d**3 / SWEEP_FLOPS_PER_S + k * c * (d + 1) / SWEEP_NOISE_PER_S
    stats = (runs if passes is None else passes) * n * d * d / SWEEP_FLOPS_PER_S
    secure = secure_runs * (
        k * SWEEP_CKKS_CLIENT_S if secure_kind == "ckks" else k * (k - 1) * SWEEP_MASK_PAIR_S
    )
    seconds = (runs * per_run + stats + secure) * (1 + attacks)
    if seconds <= above_s:
        return None
    return (
        f"this sweep is {runs} runs over {n} samples of dimension {d}, {k} clients and {c} classes; expect "
        f"roughly {seconds / 60:.0f} minute(s) (the progress bar shows the measured ETA)"
    )


def data_rules(cfg: TradeoffConfig, ds, make_partition=None) -> dict[str, Any]:
    """The run's data rules (:func:`privfed.results.record.data_rules`): test split, partition, samples unused.

    Printed in the run's header (``data:``) and written to results.json, so no default is silent.
    """
    from privfed.results.record import data_rules as rules

    return rules(ds, clients=cfg.clients, partition=cfg.partition, alpha=cfg.alpha, seeds=cfg.seeds)
