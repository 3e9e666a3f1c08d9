"""From a run's settings to its release's mechanism and protection: what the trade-off sweep, the attack
command and the audit all build (kept apart from any one command)."""

from __future__ import annotations

from typing import Any

from privfed.errors import ConfigError

__all__ = [
    "COUNT_NOISE_KINDS",
    "check_combination",
    "make_privacy",
    "make_secure_agg",
    "refuse_unused_dp",
    "vacuous_delta",
]

#: --count-noise values: FedCOF App. I.1, noise on class counts only (means in clear).
COUNT_NOISE_KINDS = ("laplace", "geometric", "gaussian", "uniform")


def check_combination(
    *,
    count_noise: str | None = None,
    level: str = "record",
    secure_agg: str | None = "none",
    trusted_aggregator: bool = False,
    placements: tuple[str, ...] = (),
    clip: float | None = None,
    clip_norm: str | None = None,
    calibration: str | None = None,
    max_records: int | None = None,
    rounds: int = 1,
    prefix: str = "--",
) -> None:
    """Refuse a combination of settings that contradicts itself, before any work, in one line naming both.

    The commands (tradeoff, attack, flower) and the Flower run config meet here with the same settings
    (``prefix`` is ``--`` for flags, empty for run-config keys); each contradiction would otherwise run with
    one of the two silently ignored, and the run's rows would say what was asked rather than what ran.

    * ``count_noise`` is a per-client perturbation of the counts at record level (sensitivity 1: one
      record moves one count by one): it contradicts ``level="client"`` (a client with n records moves
      its counts by n, so the stated epsilon would be n times too small), secure aggregation and a trusted
      aggregator (the noise is added by every client, never to the sum), and a clip bound or clipping rule
      (count noise clips nothing).
    * a trusted aggregator sees the exact sum, which secure aggregation hides from the server: the two
      cannot both describe one run.
    * a placement ``local`` or ``trusted`` runs without secure aggregation (a secure-agg protocol given
      with them would be dropped).
    * ``max_records`` bounds a client's records for client-level DP; in a one-shot record-level release it
      changes nothing (multi-round FedLog's record level uses it to bound a trained body's upload).
    """
    f = lambda name: f"{prefix}{name}"  # noqa: E731
    secure = secure_agg not in (None, "none")
    if count_noise is not None:
        clash = [
            (
                level == "client",
                f"{f('level')} client",
                "count noise is added at record level (sensitivity 1 "
                "per record); a client with n records would be at n times the stated epsilon: drop one of them "
                "(client level: the Gaussian mechanism with --max-records)",
            ),
            (
                secure,
                f"{f('secure-agg')} {secure_agg}",
                "count noise is added by every client to its own "
                "counts, never to a secure sum: drop one of them",
            ),
            (
                trusted_aggregator,
                f("trusted-aggregator"),
                "count noise is added by every client, never by the server: drop one of them",
            ),
            (
                clip is not None,
                f"{f('clip')} {clip:g}" if isinstance(clip, (int, float)) else f("clip"),
                "count noise clips nothing (the means are sent in clear): drop one of them",
            ),
            (
                clip_norm not in (None, "l2"),
                f"{f('clip-norm')} {clip_norm}",
                "count noise clips nothing: drop one of them",
            ),
            (
                calibration not in (None, "analytic"),
                f"{f('calibration')} {calibration}",
                "count noise is calibrated by its own law: drop one of them",
            ),
            (
                rounds > 1,
                f"{f('rounds')} {rounds}",
                "multi-round FedLog carries the counts in its noised statistic: drop one of them",
            ),
        ]
        for bad, other, why in clash:
            if bad:
                raise ConfigError(f"{f('count-noise')} {count_noise} contradicts {other}: {why}")
    if trusted_aggregator and secure:
        raise ConfigError(
            f"{f('trusted-aggregator')} contradicts {f('secure-agg')} {secure_agg}: a trusted aggregator sees the "
            "exact sum, which secure aggregation hides from the server; drop one of them"
        )
    clear = [p for p in placements if p in ("local", "trusted")]
    if secure and clear:
        raise ConfigError(
            f"{f('placement')} {','.join(placements)} contradicts {f('secure-agg')} {secure_agg}: placement "
            f"{clear[0]} runs without secure aggregation; pass {f('placement')} secure-sum, or drop "
            f"{f('secure-agg')}"
        )
    if max_records is not None and level != "client" and rounds == 1:
        raise ConfigError(
            f"{f('max-records')} {max_records} contradicts {f('level')} {level}: the bound on a client's records "
            f"applies to client-level DP only; pass {f('level')} client, or drop {f('max-records')}"
        )


def refuse_unused_dp(private: bool, given: dict[str, bool]) -> None:
    """Settings of the DP release (``given``: the name a user wrote -> whether it was set) in a run without
    noise are refused, naming them: no release uses them, yet the record would carry them as if one had."""
    unused = [name for name, on in given.items() if on]
    if unused and not private:
        many = len(unused) > 1
        them = "them" if many else "it"
        raise ConfigError(
            f"{', '.join(unused)} {'are settings' if many else 'is a setting'} of the DP release, but no eps is "
            f"finite (no noise), so the run would ignore {them}; give a finite eps or drop {them}"
        )


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


def vacuous_delta(delta: float, units: int, what: str) -> str | None:
    """A note when ``delta`` is not below 1 / ``units`` (the records, or the clients at client level, a release
    protects; ``what`` names them): formally a guarantee, but one met by a release that publishes each unit in
    the clear with probability delta.  None when delta is below it."""
    if not delta * units >= 1:
        return None
    return (
        f"--delta {delta:g} is not below 1/N = 1/{units:,} (the {what}): a release that publishes each of them "
        "with probability delta meets it, so it protects little; pick delta well below 1/N (the default is 1e-5)"
    )
