"""Per-record clipping: the bound every sensitivity below rests on.

* L2 clipping (default): f -> f min(1, c / ||f||_2), so ||f||_2 <= c
  (Abadi et al. 2016).  One record then moves the class sums by at most c,
  its second moment f f^T by at most c^2 in Frobenius norm
  (docs: privacy, sensitivities).
* Per-coordinate clipping to [-b, b] (FedLog, Yu et al., Theorem 3.1):
  ||f||_2 <= b sqrt(d), and FedLog's statistic phi (x) e_y with the constant
  feature phi_1 = 1 moves by at most sqrt(1 + (m - 1) b^2), m = d + 1.

The bound is always a parameter; it is never estimated from the data (that
would itself leak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechanisms.dp.calibration import as_real
from privfed.errors import ConfigError, InputError

__all__ = ["Clipping", "clip_coordinates", "clip_l2"]

CLIP_NORMS = ("l2", "coordinate")


def check_bound(bound: float, name: str = "clip") -> float:
    try:
        b = as_real(bound)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number > 0, got {name}={bound!r}") from None
    if not (b > 0):
        raise ConfigError(
            f"{name} must be > 0, got {name}={bound!r}; pick it from public knowledge of the backbone "
            "(never from the private data)"
        )
    return b


#: Largest clip a noise is calibrated to: N c^2 and its noise stay finite in float64 for any N below 1e100 records.
MAX_CLIP = 1e100
#: Smallest clip a noise is calibrated to: c^2 and the noise stay normal float64 numbers (a subnormal sigma
#: carries too few bits to meet its target epsilon).
MIN_CLIP = 1e-100


def check_noise_clip(clip: float, given=None) -> float:
    """``clip`` (a number > 0, from :func:`check_bound`) when noise can be calibrated to it, inside
    [:data:`MIN_CLIP`, :data:`MAX_CLIP`]; else a ConfigError naming ``given`` (what the caller passed)."""
    given = clip if given is None else given
    if not clip <= MAX_CLIP:
        raise ConfigError(
            f"clip={given!r} is beyond {MAX_CLIP:g}: second moments (c^2 per record) and their noise would "
            "overflow float64 for some datasets and not others; rescale the features (e.g. divide them by a "
            "public constant) and pick a clip <= 1e100"
        )
    if not clip >= MIN_CLIP:
        raise ConfigError(
            f"clip={given!r} is below {MIN_CLIP:g}: its noise (and c^2 for second moments) would be computed "
            "in subnormal floats and miss its target epsilon; rescale the features (e.g. multiply them by a "
            "public constant) and pick a clip >= 1e-100"
        )
    return clip


def _finite(F: np.ndarray) -> np.ndarray:
    """``F`` itself if it holds no NaN or inf (read by its min and max: no mask the size of the features), else
    the one-line refusal every clipping rule gives."""
    if F.size and not (np.isfinite(F.min()) and np.isfinite(F.max())):
        raise InputError(
            "features hold NaN/inf values, which clipping cannot bound; remove or impute those records first"
        )
    return F


def clip_l2(features: np.ndarray, c: float) -> np.ndarray:
    """Scale each row to L2 norm at most ``c`` (rows already inside are unchanged)."""
    c = check_bound(c)
    F = np.asarray(features, dtype=np.float64)
    if math.isinf(c):  # no bound, but no NaN/inf either: refused as a finite bound refuses them
        return _finite(F).copy()
    with np.errstate(over="ignore"):
        norms = np.linalg.norm(F, axis=-1, keepdims=True)
    big = ~np.isfinite(norms[..., 0])
    if big.any():
        # ||f||^2 overflows (||f|| > 1.3e154, far above any bound): the row's direction, from the row scaled
        # by its largest entry, times c (its norm itself may overflow, and c / inf would zero the row)
        rows = F[big]
        peak = np.abs(rows).max(axis=-1, keepdims=True)
        _finite(peak)  # an inf or NaN entry: no scaling brings the row within c
        unit = rows / peak
        unit /= np.linalg.norm(unit, axis=-1, keepdims=True)
        norms[big] = 1.0  # these rows are replaced below
    out = F * np.minimum(1.0, c / np.where(norms > 0, norms, 1.0))
    if big.any():
        out[big] = c * unit
    return out


def clip_coordinates(features: np.ndarray, b: float) -> np.ndarray:
    """Clip every coordinate to [-b, b]."""
    b = check_bound(b)
    # np.clip passes NaN through and turns inf into b: refused as clip_l2 refuses them
    return np.clip(_finite(np.asarray(features, dtype=np.float64)), -b, b)


@dataclass(frozen=True)
class Clipping:
    """A per-record clipping rule, usable as a feature transform.

    Parameters
    ----------
    bound : float
        c (``norm="l2"``) or b (``norm="coordinate"``).
    norm : {"l2", "coordinate"}
    """

    bound: float
    norm: str = "l2"

    def __post_init__(self) -> None:
        check_bound(self.bound)
        if self.norm not in CLIP_NORMS:
            raise ConfigError(f"clip_norm must be one of {list(CLIP_NORMS)}, got {self.norm!r}")

    def __call__(self, features: np.ndarray) -> np.ndarray:
        if self.norm == "l2":
            return clip_l2(features, self.bound)
        return clip_coordinates(features, self.bound)

    def l2_bound(self, dim: int) -> float:
        """The largest L2 norm of a clipped record of dimension ``dim``."""
        if self.norm == "l2":
            return float(self.bound)
        return float(self.bound) * math.sqrt(dim)
