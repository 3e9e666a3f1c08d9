"""From a run's settings to its release's mechanism and protection: what the trade-off sweep, the attack
command and the audit all build (kept apart from any one command)."""

from __future__ import annotations

from typing import Any

from privfed.errors import ConfigError

__all__ = ["COUNT_NOISE_KINDS", "make_privacy", "make_secure_agg"]

#: --count-noise values: FedCOF App. I.1, noise on class counts only (means in clear).
COUNT_NOISE_KINDS = ("laplace", "geometric", "gaussian", "uniform")


def make_secure_agg(kind: str):
    """The secure-aggregation protocol for ``--secure-agg`` (None for 'none')."""
    if kind in (None, "none"):
        return None
    from mechanisms.secagg.protection import make_secure_agg as _make

    return _make(kind)


def make_privacy(cfg: Any, method: Any, epsilon: float, clip: float | None, *, secure_agg: Any = None):
    """The privacy hook of one run at budget ``epsilon``.

    Default: the Gaussian mechanism on the clipped statistics the method uploads
    (sums and counts, plus the second moment when the method needs it).  With
    ``count_noise`` set: FedCOF's count-only perturbation (its reports say the
    means carry no guarantee; the uniform variant carries none at all).
    """
    from mechanisms import (
        GaussianCountNoise,
        GaussianMechanism,
        GeometricCountNoise,
        LaplaceCountNoise,
        UniformCountNoiseNoDP,
    )

    if cfg.count_noise is not None:
        kinds = {
            "laplace": lambda: LaplaceCountNoise(epsilon=epsilon),
            "geometric": lambda: GeometricCountNoise(epsilon=epsilon),
            "gaussian": lambda: GaussianCountNoise(epsilon=epsilon, delta=cfg.delta),
            "uniform": lambda: UniformCountNoiseNoDP(epsilon=epsilon),
        }
        if cfg.count_noise not in kinds:
            raise ConfigError(
                f"--count-noise must be one of {', '.join(COUNT_NOISE_KINDS)}, got {cfg.count_noise!r}"
            )
        mech = kinds[cfg.count_noise]()
    else:
        if clip is None:
            raise ConfigError("a finite --eps needs a clip bound: pass --clip C")
        blocks = ("sums", "counts", "second") if "second" in method.requires else ("sums", "counts")
        if cfg.level == "client" and cfg.max_records is None:
            raise ConfigError(
                "--level client needs --max-records N (the most records one client may contribute; "
                "larger clients are scaled down to it)"
            )
        if cfg.level == "client" and secure_agg is None and not cfg.trusted_aggregator:
            raise ConfigError(
                "--level client adds noise to the aggregate: pass --secure-agg mask|ckks (clients split the "
                "noise) or --trusted-aggregator (the server is trusted to add it)"
            )
        mech = GaussianMechanism(
            epsilon=epsilon,
            delta=cfg.delta,
            clip=clip,
            level=cfg.level,
            blocks=blocks,
            calibration=cfg.calibration,
            rounds=cfg.rounds,
            clip_norm=cfg.clip_norm,
            trusted_aggregator=bool(cfg.trusted_aggregator and secure_agg is None),
            max_records=cfg.max_records if cfg.level == "client" else None,
        )
    mech.check(method, secure_agg)
    # The sweep draws every noise from seeded generators: its reports say they are simulations.
    mech.declare_randomness(seeded=True)
    return mech
