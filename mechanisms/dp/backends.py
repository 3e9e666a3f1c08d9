"""Noise backends: where the random numbers of every mechanism come from.

* :class:`NumpyNoise` (default): a seedable ``numpy.random.Generator``,
  fast enough for sweeps.  Floating-point samplers are not safe against
  attacks on the low-order bits of the output (Mironov 2012 for Laplace;
  Jin et al., IEEE S&P 2022 for Gaussian), so it warns once.
* :class:`OpenDPNoise`: for real releases.  The statistic is rounded to a
  grid of step ``grid`` (a power of two) and integer noise from OpenDP's exact
  samplers (discrete Gaussian, Canonne, Kamath & Steinke 2020; discrete
  Laplace) is added on that grid.  Rounding moves each neighbouring
  statistic by at most ``grid / 2`` per coordinate, so the mechanism records
  the sensitivity ``Delta + grid * sqrt(D)`` (L2) or ``Delta + grid * D``
  (L1) in the ledger (:meth:`sensitivity_slack`).  The accountant treats the
  discrete Gaussian as the continuous one of the same scale (Canonne et al.
  show it is at least as private in one dimension and within a negligible
  term in several).  OpenDP draws from the operating system's CSPRNG: the
  ``rng`` argument is ignored and results are not reproducible by design.

A backend implements ``add_gaussian(x, sigma, rng)``, ``add_laplace(x,
scale, rng)``, ``add_geometric(x, epsilon, rng)`` and
``sensitivity_slack(size, norm)``.  Register more with
:func:`register_backend`; :func:`get_backend` resolves names.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

from mechanisms.dp.calibration import check_nonnegative, check_real
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError, InputError, MissingDependencyError


def _real_values(x) -> np.ndarray:
    """``x`` as float64, refusing what a cast would change: complex values (their imaginary part dropped), text."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"noise is added to real numbers, got values of dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)  # no copy of a float64 upload: the noise is the one temporary


__all__ = [
    "NoiseBackend",
    "NumpyNoise",
    "OpenDPNoise",
    "available_backends",
    "get_backend",
    "register_backend",
]


class NoiseBackend:
    """Base class of noise backends."""

    name: str = ""
    secure: bool = False

    def add_gaussian(self, x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def add_laplace(self, x: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def add_geometric(self, x: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def sensitivity_slack(self, size: int, norm: str = "l2") -> float:
        """Extra sensitivity the backend's own processing (rounding) adds."""
        return 0.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NumpyNoise(NoiseBackend):
    """Floating-point noise from the injected ``numpy.random.Generator`` (fast, seedable).

    Not safe against floating-point attacks: use :class:`OpenDPNoise` for a
    real release.  Warns once per process.
    """

    name = "numpy"
    secure = False
    _warned = False

    def _warn(self) -> None:
        if not NumpyNoise._warned:
            NumpyNoise._warned = True
            warnings.warn(
                "noise backend 'numpy' draws floating-point noise that is not safe against "
                "floating-point attacks on the released values; use backend='opendp' for a real release",
                UserWarning,
                stacklevel=3,
            )

    def add_gaussian(self, x, sigma, rng):
        # a NaN or inf scale returned NaN or inf values, a negative one numpy's error (OpenDP refuses them too)
        x = _real_values(x)  # complex values kept their imaginary part unnoised
        if check_nonnegative(sigma, "sigma") == 0:
            return x.copy()
        self._warn()
        return x + check_generator(rng).normal(0.0, sigma, size=np.shape(x))

    def add_laplace(self, x, scale, rng):
        x = _real_values(x)
        if check_nonnegative(scale, "scale") == 0:
            return x.copy()
        self._warn()
        return x + check_generator(rng).laplace(0.0, scale, size=np.shape(x))

    def add_geometric(self, x, epsilon, rng):
        """Two-sided geometric noise, P(k) proportional to exp(-epsilon |k|), k integer."""
        x = _real_values(x)
        epsilon = check_real(epsilon, "epsilon")
        if not epsilon > 0:  # 0 is infinite noise, NaN no scale at all
            raise ConfigError(f"epsilon of geometric noise must be > 0 (inf: no noise), got {epsilon!r}")
        if math.isinf(epsilon):
            return x.copy()
        rng = check_generator(rng)
        p = -math.expm1(-epsilon)  # success probability 1 - e^-eps
        shape = np.shape(x)
        # The difference of two iid Geometric(p) variables (support 1, 2, ...) is two-sided geometric.
        return x + (rng.geometric(p, size=shape) - rng.geometric(p, size=shape)).astype(np.float64)


#: Largest |value| in grid steps before noise, and largest noise scale times _TAIL_STEPS: their sum stays inside
#: int64, the integers OpenDP samples in.
_INTEGER_LIMIT = 2.0**61
_TAIL_STEPS = 64


class OpenDPNoise(NoiseBackend):
    """Exact integer noise from OpenDP on a grid of step ``grid`` (power of two).

    Parameters
    ----------
    grid : float
        Quantisation step, a power of two (default 2**-10).  Values are
        rounded to multiples of ``grid`` before noise is added.
    """

    name = "opendp"
    secure = True

    def __init__(self, grid: float = 2.0**-10) -> None:
        g = check_real(grid, "grid")  # True was a grid of 1, "0.5" one of 0.5
        if not (g > 0 and math.isfinite(g)) or math.frexp(g)[0] != 0.5:
            raise ConfigError(f"grid must be a positive power of two (e.g. 2**-10), got grid={grid!r}")
        self.grid = g
        try:
            import opendp.prelude as dp
        except ImportError:  # pragma: no cover - opendp is in the 'all' extra
            raise MissingDependencyError(
                "backend 'opendp' needs the opendp package; install privfed[secure-noise]"
            ) from None
        dp.enable_features("contrib")
        self._dp = dp

    def __repr__(self) -> str:
        return f"OpenDPNoise(grid={self.grid!r})"

    def sensitivity_slack(self, size: int, norm: str = "l2") -> float:
        # Rounding each dataset's statistic moves it by <= grid/2 per coordinate, so
        # two neighbours' rounded values differ by <= Delta + 2 * (grid/2) * ||1||.
        return self.grid * (math.sqrt(size) if norm == "l2" else size)

    def _integers(self, x) -> np.ndarray:
        v = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(v)):  # rint(NaN) cast to int64 is an arbitrary integer, not an error
            raise ConfigError("the values to noise contain NaN/inf; noise is added to finite statistics only")
        q = np.rint(v / self.grid)
        if np.any(np.abs(q) > _INTEGER_LIMIT):
            raise ConfigError(f"values too large for grid={self.grid}; use a coarser grid")
        return q.astype(np.int64)

    def _sample(self, maker: str, scale: float, size: int) -> np.ndarray:
        """``size`` integer draws in 64-bit integers (OpenDP's ``int`` is 32 bits: its draws saturated at
        +-2**31 grid steps, so a sigma above about 3.5e5 at the default grid was silently cut)."""
        s = float(scale)  # > 0: a zero scale returned before, and 1 / epsilon of an epsilon > 0
        if s * _TAIL_STEPS > _INTEGER_LIMIT:  # a draw beyond 64 scales has probability below 1e-800
            raise ConfigError(
                f"a noise scale of {s * self.grid:.4g} is too large for grid={self.grid} (64-bit integers): use a "
                "coarser grid, e.g. OpenDPNoise(grid=2**0)"
            )
        dp = self._dp
        metric = dp.l2_distance(T="i64") if maker == "make_gaussian" else dp.l1_distance(T="i64")
        meas = getattr(dp.m, maker)(dp.vector_domain(dp.atom_domain(T="i64")), metric, scale=s)
        return np.asarray(meas([0] * size), dtype=np.int64)

    def add_gaussian(self, x, sigma, rng=None):
        x = _real_values(x)
        check_nonnegative(sigma, "sigma")
        if sigma == 0:
            return x.copy()
        q = self._integers(x)
        z = self._sample("make_gaussian", sigma / self.grid, q.size)
        return ((q + z.reshape(q.shape)) * self.grid).astype(np.float64)

    def add_laplace(self, x, scale, rng=None):
        x = _real_values(x)
        check_nonnegative(scale, "scale")
        if scale == 0:
            return x.copy()
        q = self._integers(x)
        z = self._sample("make_laplace", scale / self.grid, q.size)
        return ((q + z.reshape(q.shape)) * self.grid).astype(np.float64)

    def add_geometric(self, x, epsilon, rng=None):
        """Discrete Laplace with scale 1/epsilon on integers (integer-valued x, no rounding slack)."""
        x = _real_values(x)
        epsilon = check_real(epsilon, "epsilon")
        if math.isinf(epsilon):
            return x.copy()
        if not epsilon > 0:
            raise ConfigError(f"add_geometric needs epsilon > 0, got {epsilon!r}")
        if not np.all(np.isfinite(x)) or np.any(np.abs(x) > _INTEGER_LIMIT):
            raise ConfigError("add_geometric needs finite integer-valued input (counts) below 2**61")
        q = np.rint(x).astype(np.int64)
        if np.any(q != x):
            raise ConfigError("add_geometric needs integer-valued input (counts)")
        z = self._sample("make_laplace", 1.0 / epsilon, q.size)
        return (q + z.reshape(q.shape)).astype(np.float64)


_BACKENDS: dict[str, Callable[[], NoiseBackend]] = {"numpy": NumpyNoise, "opendp": OpenDPNoise}


def register_backend(name: str, factory: Callable[[], NoiseBackend]) -> None:
    """Register a backend factory under ``name``."""
    if not isinstance(name, str) or not name or not callable(factory):  # else get_backend failed later
        raise ConfigError(
            f"register_backend takes a name (a non-empty str) and a callable factory, got {name!r}, {factory!r}"
        )
    _BACKENDS[name] = factory


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(backend: str | NoiseBackend | None) -> NoiseBackend:
    """Resolve ``None`` (numpy), a registered name or a backend instance."""
    if backend is None:
        return NumpyNoise()
    if isinstance(backend, NoiseBackend):
        return backend
    if isinstance(backend, str) and backend in _BACKENDS:
        return _BACKENDS[backend]()
    raise ConfigError(f"unknown noise backend {backend!r}; available: {', '.join(available_backends())}")
