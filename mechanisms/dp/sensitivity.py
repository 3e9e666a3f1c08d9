"""The L2 sensitivity of one client's statistic, and the Gaussian noise it is calibrated to.

A release adds noise to the clipped class sums, class counts and (optionally) second moments of
the clients.  How far those can move between neighbouring datasets depends on what a neighbour is
and on what the features depend on:

============  =====================  ==========================================================
bound         factor f               when
============  =====================  ==========================================================
record        1                      record level, features from a body that does not depend on
                                     the private records (frozen bodies: Theorem 3.1 of FedLog)
client        n_max                  client level: one client's upload, bounded to n_max records
upload        2 n_max                record level with bodies trained on the private records: one
                                     record moves every feature of its client, so the release is
                                     bounded only by the client's whole upload (bounded to n_max
                                     records' worth); its diameter is 2 n_max
============  =====================  ==========================================================

With every record clipped to ||f||_2 <= c, block b moves by f Delta_b with Delta = (c for ``sums``,
1 for ``counts``, c^2 for ``second``); sums and counts together (FedLog's augmented statistic
phi (x) e_y, phi = [1, f]) move by f sqrt(1 + c^2).

:func:`block_sigmas` is the one place a GDP parameter mu becomes the noise of every block:
sigma_b = Delta_b / (mu sqrt(w_b)) for shares w_b of mu^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from privfed.errors import ConfigError

__all__ = ["RECORD_BOUNDS", "StatisticSensitivity", "block_sigmas"]

#: How a record-level release is bounded: Theorem 3.1 (frozen bodies) or by the client's whole upload.
RECORD_BOUNDS = ("theorem", "upload")


@dataclass(frozen=True)
class StatisticSensitivity:
    """L2 sensitivity of one client's statistic under a neighbouring relation and bound.

    Parameters
    ----------
    clip_l2 : float
        c, the L2 bound of one clipped record (b sqrt(d) under coordinate clipping).
    level : {"record", "client"}
    record_bound : {"theorem", "upload"}
        Record level only (see the module docstring).
    max_records : int or None
        n_max: every client's upload is scaled down to at most this many records' worth
        (client level, and the ``upload`` bound).
    """

    clip_l2: float
    level: str = "record"
    record_bound: str = "theorem"
    max_records: int | None = None

    def __post_init__(self) -> None:
        from mechanisms.dp.calibration import as_real, check_count

        if self.level not in (
            "record",
            "client",
        ):  # "clients" was read as record level: n_max times too small
            raise ConfigError(f"level must be 'record' or 'client', got level={self.level!r}")
        try:
            clip = as_real(self.clip_l2)
        except (TypeError, ValueError):
            raise ConfigError(f"clip_l2 must be a number > 0, got clip_l2={self.clip_l2!r}") from None
        if not clip > 0:  # NaN, 0 or a negative bound bounds nothing
            raise ConfigError(f"clip_l2 must be a number > 0, got clip_l2={self.clip_l2!r}")
        if self.max_records is not None:
            check_count(self.max_records, "max_records")
        if self.record_bound not in RECORD_BOUNDS:
            raise ConfigError(
                f"record_bound must be one of {list(RECORD_BOUNDS)}, got record_bound={self.record_bound!r}"
            )
        if self.max_records is not None and not self.bounds_uploads:
            raise ConfigError(
                f"max_records={self.max_records!r} bounds nothing at record level under the 'theorem' bound (one "
                "record moves by c whatever a client holds); drop it, or use level='client' or record_bound='upload'"
            )
        if self.bounds_uploads and self.max_records is None:
            raise ConfigError(
                f"the {self.bound!r} bound needs max_records (the most records one client contributes)"
            )

    @property
    def bound(self) -> str:
        """``"record"``, ``"client"`` or ``"upload"``."""
        if self.level == "client":
            return "client"
        return "upload" if self.record_bound == "upload" else "record"

    @property
    def bounds_uploads(self) -> bool:
        """Whether every client's upload is scaled down to ``max_records`` records' worth before release."""
        return self.level == "client" or self.record_bound == "upload"

    @property
    def factor(self) -> float:
        """f: 1 (one record), n_max (one client) or 2 n_max (the diameter of a bounded upload)."""
        if self.bound == "record":
            return 1
        if self.bound == "client":
            return self.max_records
        return 2.0 * self.max_records

    def per_block(self, blocks: tuple[str, ...], *, strict: bool = True) -> dict[str, float]:
        """f Delta_b for each block named (``strict``: refuse one that under- or overflowed float64; the
        Gaussian mechanism, which bounds its clip itself and also reports runs without noise, passes False)."""
        n, c = self.factor, float(self.clip_l2)
        sens = {"sums": n * c, "counts": float(n), "second": n * c * c}
        out = {b: sens[b] for b in blocks}
        lost = [b for b, v in out.items() if v == 0.0 or (math.isinf(v) and math.isfinite(c))]
        # c (or c^2) under- or overflowed float64: a sensitivity of 0 calibrates no noise at all
        if lost and strict:
            raise ConfigError(
                f"clip_l2={self.clip_l2!r} gives the {lost[0]!r} block a sensitivity of {out[lost[0]]!r} in float64 "
                "(c or c^2 under- or overflows); rescale the features by a public constant so that a clip within "
                "[1e-100, 1e100] bounds them"
            )
        return out

    def joint(self) -> float:
        """Sums and counts together (FedLog's augmented statistic): f sqrt(1 + c^2)."""
        c = float(self.clip_l2)
        return self.factor * math.sqrt(1.0 + c * c)


def block_sigmas(
    sens: dict[str, float], mu: float, weights: str | dict[str, float], *, joint: float | None = None
) -> dict[str, float]:
    """sigma_b = Delta_b / (mu sqrt(w_b)): the noise making one release mu-GDP over all blocks together.

    ``weights`` are the shares w_b of mu^2 (summing to 1), or ``"equal"`` (1 / B each), ``"joint"``
    (w_b proportional to Delta_b^2: one sigma, the Gaussian on the concatenated statistic) or
    ``"augmented"`` (one sigma, ``joint`` / mu, ``joint`` defaulting to sqrt(sum_b Delta_b^2): FedLog's
    augmented statistic, :meth:`StatisticSensitivity.joint`).
    ``mu = inf`` (no noise) gives 0 everywhere.
    """
    if isinstance(mu, bool) or not (isinstance(mu, (int, float)) and mu > 0):  # mu = 0 is infinite noise
        raise ConfigError(f"mu must be a number > 0 (inf: no noise), got mu={mu!r}")
    if math.isinf(mu):
        return {b: 0.0 for b in sens}
    if isinstance(weights, str) and weights not in ("augmented", "joint", "equal"):
        raise ConfigError(
            f"weights must be 'equal', 'joint', 'augmented' or a mapping, got weights={weights!r}"
        )
    if not isinstance(weights, str) and (
        set(weights) != set(sens) or not all(isinstance(v, (int, float)) and v > 0 for v in weights.values())
    ):
        raise ConfigError(
            f"weights must give every block of {sorted(sens)} a share > 0, got weights={weights!r}"
        )
    if not isinstance(weights, str) and abs(sum(weights.values()) - 1.0) > 1e-9:
        # shares of mu^2 summing to 2 would make the release sqrt(2) mu-GDP while it is stated as mu
        raise ConfigError(
            f"weights are shares of mu^2 and must sum to 1, got a sum of {sum(weights.values())!r}"
        )
    if weights == "joint" and not any(v > 0 for v in sens.values()):
        raise ConfigError("weights='joint' needs a block with sensitivity > 0 (every block's is 0)")
    if weights == "augmented":
        joint = math.sqrt(sum(v * v for v in sens.values())) if joint is None else joint
        return {b: joint / mu for b in sens}
    if weights == "joint":
        total = sum(v * v for v in sens.values())
        w = {b: sens[b] ** 2 / total for b in sens}
    elif weights == "equal":
        w = {b: 1.0 / len(sens) for b in sens}
    else:
        w = weights
    return {b: sens[b] / (mu * math.sqrt(w[b])) for b in sens}
