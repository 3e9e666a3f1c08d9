"""What noise the released statistics carry, as plain data (:class:`NoiseSpec`), and count noise.

The attacker knows the mechanism (Kerckhoffs): a :class:`NoiseSpec` says
which Gaussian sigma each statistic block carries, or which count noise,
and can draw it on statistics for what-if analyses (``ServerView.from_stats``).
To attack what a mechanism really released, pass the mechanism itself to
:meth:`attacks.view.ServerView.from_federation`, which runs its release.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mechanisms.dp.calibration import as_real, check_budget
from mechanisms.dp.clipping import CLIP_NORMS, check_bound, check_noise_clip
from mechanisms.dp.count_noise import GEOMETRIC_MIN_EPSILON
from privfed.errors import ConfigError
from privfed.stats import STAT_FIELDS, ClientStats

__all__ = ["COUNT_NOISE_KINDS", "NoiseSpec", "count_noise", "gaussian_sigma"]

#: Count-noise variants of FedCOF App. I.1 plus the discrete Laplace (two-sided geometric).
COUNT_NOISE_KINDS = ("laplace", "geometric", "gaussian", "uniform")


#: ``name`` of the count-noise mechanisms of :mod:`mechanisms.dp.count_noise` -> count-noise kind.
_COUNT_MECHANISMS = {
    "laplace": "laplace",
    "geometric": "geometric",
    "gaussian-counts": "gaussian",
    "uniform (no DP guarantee)": "uniform",
}


def count_noise(
    counts: np.ndarray,
    kind: str,
    *,
    epsilon: float,
    rng: np.random.Generator,
    delta: float | None = None,
) -> np.ndarray:
    """Perturb class counts as FedCOF App. I.1: ``max(n + noise, 0)``.

    Parameters
    ----------
    counts : ndarray
        True counts n (any shape).
    kind : {"laplace", "geometric", "gaussian", "uniform"}
        ``laplace``: Laplace(0, 1/eps) (eps-DP, sensitivity 1);
        ``geometric``: two-sided geometric with ratio exp(-eps) (eps-DP, integer);
        ``gaussian``: N(0, s^2) with s the analytic-Gaussian sigma of (eps, delta)
        at sensitivity 1 (Balle & Wang 2018, via dp-accounting);
        ``uniform``: U(-(1 - eps) n, (1 - eps) n), the paper's heuristic: it has
        *no* DP guarantee (a zero count stays exactly zero at every eps).
    epsilon : float
        Privacy parameter (for ``uniform``, the width parameter in (0, 1]).
    rng : numpy.random.Generator
    delta : float, optional
        Required for ``gaussian``.

    Returns
    -------
    ndarray
        Noisy counts, clipped at 0 (float64).
    """
    n = np.asarray(counts, dtype=np.float64)
    if kind not in COUNT_NOISE_KINDS:
        raise ConfigError(f"unknown count noise {kind!r}; choose from {list(COUNT_NOISE_KINDS)}")
    given = epsilon
    try:
        epsilon = as_real(epsilon)  # numpy numbers too (np.float32(1) was refused), never strings or bools
    except (TypeError, ValueError):
        epsilon = math.nan
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"count-noise epsilon must be a finite number > 0, got epsilon={given!r}")
    if kind == "geometric" and epsilon < GEOMETRIC_MIN_EPSILON:  # numpy's sampler fails below (p <= 0)
        raise ConfigError(
            f"geometric count noise needs epsilon >= {GEOMETRIC_MIN_EPSILON:g}, got {epsilon!r}; use a larger "
            "epsilon or Laplace count noise"
        )
    if kind == "laplace":
        noise = rng.laplace(0.0, 1.0 / epsilon, size=n.shape)
    elif kind == "geometric":
        p = 1.0 - math.exp(-epsilon)
        noise = (rng.geometric(p, size=n.shape) - rng.geometric(p, size=n.shape)).astype(np.float64)
    elif kind == "gaussian":
        if delta is None or not 0 < delta < 1:
            raise ConfigError(f"gaussian count noise needs 0 < delta < 1, got delta={delta!r}")
        noise = rng.normal(0.0, gaussian_sigma(epsilon, delta), size=n.shape)
    else:
        if epsilon > 1:
            raise ConfigError(
                f"uniform count noise needs 0 < epsilon <= 1 (width (1 - eps) n), got {epsilon}"
            )
        w = (1.0 - epsilon) * n
        noise = rng.uniform(-1.0, 1.0, size=n.shape) * w
    return np.maximum(n + noise, 0.0)


def _positive_clip(clip) -> float:
    """``clip`` as a finite float > 0 (:func:`mechanisms.dp.clipping.check_bound`, and not inf): a bool, a
    string, NaN or inf is refused (ConfigError naming clip)."""
    c = check_bound(clip)
    if not math.isfinite(c):
        raise ConfigError(f"clip must be a finite number > 0, got clip={clip!r}")
    return c


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Analytic-Gaussian sigma per unit L2 sensitivity for one (eps, delta) release (the mechanisms' calibration)."""
    from mechanisms.dp.calibration import analytic_sigma

    return analytic_sigma(float(epsilon), float(delta))


@dataclass(frozen=True)
class NoiseSpec:
    """What noise the released statistics carry, as plain data.

    Parameters
    ----------
    sigma : mapping str -> float
        Standard deviation of the Gaussian noise added to every coordinate of
        each statistic block (``sums``, ``second``, ``class_second``,
        ``counts``).  Symmetric blocks get noise on the upper triangle,
        mirrored (privacy.md).  A block absent from the mapping is released
        without Gaussian noise.
    count_kind : str, optional
        Count noise from :data:`COUNT_NOISE_KINDS` (replaces Gaussian count noise).
    count_epsilon, count_delta : float, optional
        Parameters of the count noise.
    clip : float, optional
        Bound every feature was clipped to before the statistics.
    clip_norm : {"l2", "coordinate"}
        The norm of that bound (the mechanism's ``clip_norm``): L2, or each coordinate to [-clip, clip].
    level : {"record", "client"}
        ``record``: each client's upload is noised before it leaves the
        client; ``client``: noise is added to the all-client sum only.
    epsilon, delta : float, optional
        The claimed budget (reporting only; ``inf`` for no noise).
    guarantee : str
        A short description of the formal guarantee ("none" for the clean
        release or the uniform heuristic).
    """

    sigma: Mapping[str, float] = field(default_factory=dict)
    count_kind: str | None = None
    count_epsilon: float | None = None
    count_delta: float | None = None
    clip: float | None = None
    clip_norm: str = "l2"
    level: str = "record"
    epsilon: float = math.inf
    delta: float = 0.0
    guarantee: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.sigma, Mapping):  # None or a number: one line, not a TypeError
            raise ConfigError(
                f"NoiseSpec.sigma must be a mapping block -> std (e.g. {{'sums': 1.0}}), got {self.sigma!r}"
            )
        sig = dict(self.sigma)
        for k, v in sig.items():
            if k not in STAT_FIELDS:
                raise ConfigError(f"NoiseSpec.sigma has unknown block {k!r}; blocks are {list(STAT_FIELDS)}")
            try:  # "1" or True is no std
                sig[k] = as_real(v)
            except (TypeError, ValueError):
                raise ConfigError(f"sigma must be a number, got sigma[{k!r}]={v!r}") from None
            if not (sig[k] >= 0 and math.isfinite(sig[k])):
                raise ConfigError(f"sigma must be finite and non-negative, got sigma[{k!r}]={v!r}")
        object.__setattr__(self, "sigma", sig)
        if self.level not in ("record", "client"):
            raise ConfigError(f"level must be 'record' or 'client', got {self.level!r}")
        if self.count_kind is not None and self.count_kind not in COUNT_NOISE_KINDS:
            raise ConfigError(
                f"unknown count noise {self.count_kind!r}; choose from {list(COUNT_NOISE_KINDS)}"
            )
        if self.clip is not None:
            object.__setattr__(self, "clip", _positive_clip(self.clip))
        if self.clip_norm not in CLIP_NORMS:
            raise ConfigError(f"clip_norm must be one of {list(CLIP_NORMS)}, got {self.clip_norm!r}")

    @classmethod
    def none(cls) -> NoiseSpec:
        """The clean release."""
        return cls()

    @classmethod
    def gaussian(
        cls,
        *,
        epsilon: float,
        delta: float,
        clip: float,
        blocks=("counts", "sums"),
        level: str = "record",
    ) -> NoiseSpec:
        """One Gaussian release of the concatenated blocks, calibrated exactly.

        This is ``GaussianMechanism(..., split="joint")``'s noise (one sigma for
        every block), not the default mechanism's ``split="equal"``: to attack
        the release a mechanism makes, pass the mechanism itself to
        :meth:`ServerView.from_federation`, which runs its release.

        Add/remove-one sensitivity after clipping to ``clip`` (methods.md
        section 4): sums c, counts 1, second moment c^2 (Frobenius), per-class
        second moments c^2; jointly sqrt of the sum of squares.  Every block
        gets the same sigma = Delta * sigma_1(eps, delta) (analytic Gaussian,
        Balle & Wang 2018), so the release is (eps, delta)-DP with GDP
        mu = 1 / sigma_1.  ``epsilon = inf`` gives the clean (clipped) release.
        """
        clip = _positive_clip(clip)
        try:
            eps = as_real(epsilon)
        except (TypeError, ValueError):  # "1" or True is no epsilon
            raise ConfigError(
                f"epsilon must be a number > 0 (inf: no noise), got epsilon={epsilon!r}"
            ) from None
        if eps == math.inf:  # -inf, NaN and 0 go on to check_budget's refusal
            return cls(clip=clip, level=level, epsilon=math.inf, delta=0.0, guarantee="none")
        epsilon, delta = check_budget(epsilon, delta, allow_inf=False)
        check_noise_clip(clip)  # the mechanism's range: c^4 underflowed to sigma 0 under a DP label at 1e-90
        # each block's L2 sensitivity, joined by hypot: c^4 of a second moment underflowed to sigma 0 at c = 1e-90
        sens = {"sums": clip, "counts": 1.0, "second": clip * clip, "class_second": clip * clip}
        blocks = (blocks,) if isinstance(blocks, str) else tuple(blocks)
        if not blocks:  # no noised block: a clean release that would be labelled (eps, delta)-DP
            raise ConfigError(
                f"blocks is empty: no statistic would carry noise, yet the release would claim ({epsilon:g}, "
                f"{delta:g})-DP; name the noised blocks (e.g. blocks=('counts', 'sums')) or use epsilon=inf"
            )
        unknown = set(blocks) - set(sens)
        if unknown:
            raise ConfigError(f"unknown block(s) {sorted(unknown)}; blocks are {list(sens)}")
        Delta = math.hypot(*(sens[b] for b in blocks))
        s = Delta * gaussian_sigma(epsilon, delta)
        return cls(
            sigma={b: s for b in blocks},
            clip=clip,
            level=level,
            epsilon=float(epsilon),
            delta=float(delta),
            guarantee=f"({epsilon:g}, {delta:g})-DP Gaussian, {level} level",
        )

    @classmethod
    def from_mechanism(
        cls, mechanism: Any, method: Any = None, *, num_clients: int = 1, secure_agg: bool = False
    ) -> NoiseSpec:
        """The noise on what the server sees, read off a mechanism object (duck-typed).

        Uses ``mechanism.sigma`` (block -> std of the noise one sum carries),
        ``clip_bound``, ``level``, ``epsilon``, ``delta`` and, without secure
        aggregation, ``upload_noise_variance(method, num_clients)`` (the noise
        on each client's own upload: zero where a trusted aggregator noises
        only the sum, so the server sees every clean upload).
        """
        kind = _COUNT_MECHANISMS.get(getattr(mechanism, "name", None))
        if kind is not None and hasattr(mechanism, "perturb"):  # a count-noise mechanism
            eps = float(mechanism.epsilon)
            return cls(
                count_kind=kind,
                count_epsilon=eps,
                count_delta=getattr(mechanism, "delta", None),
                epsilon=eps,
                delta=float(getattr(mechanism, "delta", 0.0) or 0.0),
                guarantee=f"{type(mechanism).__name__}(epsilon={eps:g}): counts only"
                + ("" if getattr(mechanism, "dp", True) else ", NO DP GUARANTEE"),
            )
        sigma = getattr(mechanism, "sigma", None) or {}
        if not isinstance(sigma, Mapping):
            raise ConfigError(
                f"mechanism {mechanism!r} has no per-block sigma mapping; pass a NoiseSpec instead"
            )
        sigma = {k: float(v) for k, v in sigma.items() if k in STAT_FIELDS}
        upload = getattr(mechanism, "upload_noise_variance", None)
        if not secure_agg and upload is not None:
            sigma = {
                k: math.sqrt(max(float(v), 0.0))
                for k, v in upload(method, num_clients).items()
                if k in STAT_FIELDS
            }
        clip = getattr(mechanism, "clip_bound", None)
        clipping = getattr(mechanism, "clipping", None)
        eps = float(getattr(mechanism, "epsilon", math.inf))
        return cls(
            sigma=sigma,
            clip=None if clip is None else float(clip),
            clip_norm=str(getattr(clipping, "norm", "l2")),  # scored as the release clipped (coordinate too)
            level=str(getattr(mechanism, "level", "record")),
            epsilon=eps,
            delta=float(getattr(mechanism, "delta", 0.0) or 0.0),
            guarantee=f"{type(mechanism).__name__}(epsilon={eps:g}, level={getattr(mechanism, 'level', '?')})",
        )

    @property
    def is_clean(self) -> bool:
        return not any(v > 0 for v in self.sigma.values()) and self.count_kind is None

    def add(self, stats: ClientStats, rng: np.random.Generator) -> ClientStats:
        """Noise every row of ``stats`` as specified (counts clipped at 0)."""
        new: dict[str, np.ndarray] = {}
        for name, arr in stats.arrays().items():
            s = self.sigma.get(name, 0.0)
            if name == "counts" and self.count_kind is not None:
                noisy = count_noise(
                    arr, self.count_kind, epsilon=self.count_epsilon, delta=self.count_delta, rng=rng
                )
                new[name] = noisy
                # FedCOF App. I.1: the client sends its exact class mean, so the sum becomes n~ * mean
                # (a cell clipped to 0 is not sent at all).
                if "sums" in stats.available and self.sigma.get("sums", 0.0) <= 0:
                    ratio = np.where(arr > 0, noisy / np.where(arr > 0, arr, 1.0), 0.0)
                    new["sums"] = stats.sums * ratio[..., None]
                continue
            if s <= 0:
                continue
            if name in ("second", "class_second"):
                z = rng.normal(0.0, s, size=arr.shape)
                z = np.triu(z) + np.swapaxes(np.triu(z, 1), -1, -2)
                new[name] = arr + z
            elif name == "counts":
                new[name] = np.maximum(arr + rng.normal(0.0, s, size=arr.shape), 0.0)
            else:
                new[name] = arr + rng.normal(0.0, s, size=arr.shape)
        return stats.with_arrays(**new) if new else stats

    def as_dict(self) -> dict:
        return {
            "sigma": dict(self.sigma),
            "count_kind": self.count_kind,
            "count_epsilon": self.count_epsilon,
            "count_delta": self.count_delta,
            "clip": self.clip,
            "level": self.level,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "guarantee": self.guarantee,
        }
