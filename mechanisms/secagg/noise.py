"""Distributed Gaussian noise under secure aggregation, and what survives dropouts and collusion.

With secure aggregation the server sees only sum_k x_k, so client-level
differential privacy needs noise on the sum without a trusted party: each of
the K clients adds an independent share N(0, sigma^2 / K) to its input before
masking or encryption, and the shares add up to N(0, sigma^2) in the sum
(Kairouz, Liu, Steinke, "The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation", ICML 2021, Sec. 3, in its
continuous form).

Dropouts and collusion.  A client that drops before uploading contributes
no share, and t colluding clients know (and can subtract) their own shares,
so with t such clients only (K - t)/K of the variance protects the others:
sigma_t = sigma sqrt((K - t)/K).  :meth:`DistributedGaussian.guarantee`
reports (eps, delta) at full noise and at sigma_t, and
:meth:`DistributedGaussian.calibrate` scales sigma by sqrt(K / (K - t)) so
the target holds even then.

Guarantees use the analytic Gaussian (Balle and Wang, ICML 2018) through
``dp_accounting.get_sigma_gaussian`` / ``get_epsilon_gaussian``; several
summed statistics (one secure-sum call each) compose exactly in Gaussian DP,
mu = sqrt(sum_i (Delta_i / sigma_i)^2), and (eps, delta) is that of a single
Gaussian with sensitivity/sigma = mu.

Quantisation.  In the masking protocol a share is added to the client's
real input before the fixed-point encoding, so each coordinate of each
upload is rounded to the 2^-f grid: the decoded sum differs from the
continuous-noise sum by at most K 2^-(f+1) per coordinate (2.3e-8 for
K = 100, f = 32), negligible against any useful sigma; the stated guarantee
is the continuous one (a discrete-Gaussian share as in Kairouz et al.
would make it exact on the grid).  Shares come from a noise backend
(:mod:`mechanisms.dp.backends`): the default numpy Generator is a research
backend -- floating-point samplers leak in the low bits (Mironov, CCS
2012; Jin et al., S&P 2022); ``backend="opendp"`` rounds each client's input
to the backend's grid (a power of two, coarser than 2^-f, so the fixed-point
encoding is then exact) and adds exact discrete-Gaussian integers, and the
report adds the rounding slack grid * sqrt(D) to the sensitivity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mechanisms.dp.calibration import as_real, check_count, check_nonnegative, check_real
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError

__all__ = ["DistributedGaussian", "check_add_noise", "check_nonnegative", "noise_rng", "noise_share"]


def noise_rng(rng) -> np.random.Generator:
    """The generator a secure sum draws its noise shares from: ``rng``, or fresh OS entropy for None
    (ConfigError for anything else, before any share is drawn)."""
    return np.random.default_rng() if rng is None else check_generator(rng, optional=True)


def noise_share(row: np.ndarray, std: float, rng: np.random.Generator, add_noise=None) -> np.ndarray:
    """A client's input to a secure sum with its Gaussian noise share N(0, std^2) added (``std`` 0: the row).

    ``add_noise(row, std, rng)`` draws it (a noise backend's ``add_gaussian``); default numpy normal draws.
    """
    if std > 0:
        if add_noise is None:
            return row + rng.normal(0.0, std, row.shape)
        return _checked_share(add_noise(row, std, rng), row)
    return row


def check_add_noise(add_noise):
    """``add_noise`` when it is None or callable, else a ConfigError naming it, before any client draws its
    share."""
    if add_noise is not None and not callable(add_noise):
        raise ConfigError(
            f"add_noise must be a callable add_noise(row, std, rng) -> noisy row (e.g. a noise backend's "
            f"add_gaussian) or None, got add_noise={add_noise!r}"
        )
    return add_noise


def _checked_share(noisy, row: np.ndarray) -> np.ndarray:
    """What ``add_noise`` returned for ``row``, refused unless it is a finite real array of the row's shape."""
    try:
        out = np.asarray(noisy)
    except (ValueError, TypeError):
        out = np.asarray(None)
    if out.dtype.kind not in "iuf" or out.shape != np.shape(row):
        raise ConfigError(
            f"add_noise must return the noisy row: real numbers of shape {np.shape(row)}, got "
            f"{type(noisy).__name__} of shape {out.shape} and dtype {out.dtype}"
        )
    if not np.isfinite(out).all():
        raise ConfigError("add_noise returned NaN/inf values; a noise share must be finite")
    return out


def _as_tuple(value: float | Sequence[float], name: str) -> tuple[float, ...]:
    vals = (value,) if np.isscalar(value) else tuple(value)
    if not vals or any(
        isinstance(v, (bool, np.bool_))  # True was a sigma of 1
        or not (isinstance(v, (int, float, np.floating, np.integer)) and math.isfinite(v) and v > 0)
        for v in vals
    ):
        raise ConfigError(f"{name} must be a positive finite number or a sequence of them, got {value!r}")
    return tuple(float(v) for v in vals)


@dataclass(frozen=True)
class DistributedGaussian:
    """Gaussian noise of total standard deviation ``sigma`` on each secure sum, split across clients.

    Parameters
    ----------
    sigma : float or sequence of float
        Standard deviation of the noise in each summed statistic (one per
        secure-sum call, in call order; a single value serves every call).
        Methods sum counts, sums, then second moments (see
        ``ClientStats.arrays``); FedCOF sums one vector of counts, sums
        and presence indicators, then its spread matrix.
    sensitivity : float or sequence of float
        Client-level L2 sensitivity of each summed statistic (the bound on
        one client's contribution, which the caller enforces by clipping).
        Required: there is no default.  :func:`privfed.fit` refuses a
        protocol carrying this noise, since it does not clip to it; use
        ``privacy=GaussianMechanism(...)`` with the protocol instead.
    delta : float
        The delta of the reported guarantee.
    tolerate : int
        t, the number of clients that may drop out or collude; the report
        gives the guarantee with only (K - t)/K of the variance present.
    backend : str or NoiseBackend, optional
        Where the shares come from (:mod:`mechanisms.dp.backends`): ``"numpy"``
        (default, fast, floating point) or ``"opendp"`` (each client rounds
        its input to the backend's grid and adds exact discrete-Gaussian
        integers; the rounding slack is added to the sensitivity).
    """

    sigma: float | tuple[float, ...]
    sensitivity: float | tuple[float, ...] | None = None
    delta: float = 1e-5
    tolerate: int = 0
    backend: Any = None

    def __post_init__(self) -> None:
        from mechanisms.dp.backends import get_backend

        object.__setattr__(self, "backend", get_backend(self.backend))
        object.__setattr__(self, "sigma", _as_tuple(self.sigma, "sigma"))
        if self.sensitivity is None:
            raise ConfigError(
                "DistributedGaussian needs sensitivity= (the bound on one client's contribution to each summed "
                "statistic, enforced by clipping); there is no safe default"
            )
        object.__setattr__(self, "sensitivity", _as_tuple(self.sensitivity, "sensitivity"))
        delta = check_real(self.delta, "delta")  # "0.5" was accepted here and failed later, in the accounting
        if not (0 < delta < 1):
            raise ConfigError(f"delta must lie in (0, 1), got delta={self.delta}")
        object.__setattr__(self, "delta", delta)
        if (
            isinstance(self.tolerate, bool)
            or not isinstance(self.tolerate, (int, np.integer))
            or self.tolerate < 0
        ):
            raise ConfigError(
                f"tolerate must be an integer >= 0 (clients that may drop or collude), got {self.tolerate!r}"
            )

    # -- per call -------------------------------------------------------------
    def _pick(self, values: tuple[float, ...], call: int, name: str) -> float:
        if len(values) == 1:
            return values[0]
        if call >= len(values):
            raise ConfigError(
                f"DistributedGaussian has {len(values)} {name} values but the method made secure-sum call "
                f"number {call + 1}; give one value per summed statistic"
            )
        return values[call]

    def sigma_for(self, call: int) -> float:
        """Total noise standard deviation of secure-sum call ``call`` (0-based)."""
        return self._pick(self.sigma, call, "sigma")

    def sensitivity_for(self, call: int) -> float:
        return self._pick(self.sensitivity, call, "sensitivity")

    def add_share(self, row: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
        """One client's input plus its noise share of standard deviation ``std`` (from the backend)."""
        return np.asarray(self.backend.add_gaussian(row, std, rng), dtype=np.float64)

    def share_std(self, call: int, num_clients: int) -> float:
        """Standard deviation of one client's share: sigma / sqrt(K)."""
        return self.sigma_for(call) / math.sqrt(check_count(num_clients, "num_clients"))

    # -- calibration and guarantee ---------------------------------------------
    @classmethod
    def calibrate(
        cls,
        *,
        epsilon: float,
        delta: float,
        sensitivity: float | Sequence[float],
        num_clients: int,
        tolerate: int = 0,
    ) -> DistributedGaussian:
        """Noise so that all statistics together are (epsilon, delta)-DP even with ``tolerate`` shares missing.

        With n statistics of sensitivities Delta_i, sigma_i = Delta_i z
        sqrt(n) sqrt(K / (K - t)) where z = get_sigma_gaussian(epsilon,
        delta) is the analytic-Gaussian noise multiplier of one release.
        """
        import dp_accounting

        try:  # True was an epsilon of 1, "1" a TypeError
            epsilon, delta = as_real(epsilon), as_real(delta)
        except (TypeError, ValueError):
            raise ConfigError(
                f"epsilon and delta must be numbers, got epsilon={epsilon!r}, delta={delta!r}"
            ) from None
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ConfigError(f"epsilon must be positive and finite, got epsilon={epsilon}")
        if not (0 < delta < 1):
            raise ConfigError(f"delta must lie in (0, 1), got delta={delta}")
        # 2.9 clients were read as 2
        K, t = check_count(num_clients, "num_clients", low=2), check_count(tolerate, "tolerate", low=0)
        if not 0 <= t < K:
            raise ConfigError(f"tolerate must lie in [0, num_clients - 1 = {K - 1}], got {tolerate}")
        sens = _as_tuple(sensitivity, "sensitivity")
        z = dp_accounting.get_sigma_gaussian(epsilon, delta) * math.sqrt(len(sens)) * math.sqrt(K / (K - t))
        return cls(sigma=tuple(s * z for s in sens), sensitivity=sens, delta=delta, tolerate=t)

    def guarantee(
        self,
        num_clients: int,
        num_calls: int | None = None,
        *,
        present: int | None = None,
        sizes: list[int] | None = None,
    ) -> dict[str, Any]:
        """(eps, delta) of the composed release, at full noise and with ``tolerate`` shares missing.

        Parameters
        ----------
        num_clients : int
            K, the clients that were to add shares.
        num_calls : int, optional
            Statistics summed (defaults to the number of sigma values).
        present : int, optional
            Shares actually in the sum (uploaders); adds the guarantee of this run.
        sizes : list of int, optional
            Values per client of each statistic; with a rounding backend the
            sensitivity grows by its slack (grid * sqrt(size)).
        """
        import dp_accounting

        K = check_count(num_clients, "num_clients")
        n = len(self.sigma) if num_calls is None else check_count(num_calls, "num_calls")
        if present is not None:
            # a share count outside 0..K would state the noise of shares no client sent
            present = check_count(present, "present", low=0)
            if present > K:
                raise ConfigError(f"present={present} shares, but only num_clients={K} clients add one")
        if sizes is not None and len(sizes) != n:
            raise ConfigError(f"sizes gives {len(sizes)} statistics' sizes, but {n} statistics are summed")
        t = min(int(self.tolerate), K - 1)
        slack = (
            [0.0] * n
            if sizes is None
            else [self.backend.sensitivity_slack(check_count(sz, "sizes", low=0), "l2") for sz in sizes]
        )
        sens = [self.sensitivity_for(i) + slack[i] for i in range(n)]

        def at(fraction: float) -> dict[str, float]:
            mu = math.sqrt(sum((sens[i] / (self.sigma_for(i) * math.sqrt(fraction))) ** 2 for i in range(n)))
            return {
                "mu": mu,
                "epsilon": float(dp_accounting.get_epsilon_gaussian(1.0 / mu, self.delta)),
                "sigma": [self.sigma_for(i) * math.sqrt(fraction) for i in range(n)],
            }

        secure = bool(getattr(self.backend, "secure", False))
        out: dict[str, Any] = {
            "delta": self.delta,
            "num_clients": K,
            "statistics": n,
            "share_std": [self.share_std(i, K) for i in range(n)],
            "sensitivity": sens,
            "rounding_slack": slack,
            "full": at(1.0),
            "tolerate": t,
            f"with_{t}_missing": at((K - t) / K),
            "neighbouring": "client level (add/remove one client's whole contribution)",
            "backend": repr(self.backend),
            "note": "exact discrete-Gaussian shares on the backend's grid"
            if secure
            else "research backend: floating-point Gaussian shares; use backend='opendp' for a real release",
        }
        if present is not None:
            out["this_run"] = at(max(int(present), 1) / K)
            out["this_run"]["shares_present"] = int(present)
        return out
