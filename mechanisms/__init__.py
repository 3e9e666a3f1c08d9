"""Privacy mechanisms: clipping, calibrated noise, accounting, audits and secure aggregation.

Differential privacy (record or client level) wraps the release path of
:func:`privfed.fit` through the ``privacy`` hook::

    >>> from mechanisms import GaussianMechanism
    >>> mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0)
    >>> round(mech.sigma["sums"] / 2**0.5, 4)  # sums and counts each get half of mu^2
    3.7306

Every release appends events to ``mech.ledger``; ``mech.report()`` recomputes
(eps, delta) from it.  Secure-aggregation protocols live in their own modules
and are imported lazily (their optional dependencies are heavy).
"""

from __future__ import annotations

import importlib

from mechanisms.dp.accounting import ACCOUNTANTS, calibrate_round_mu, ledger_epsilon
from mechanisms.dp.backends import (
    NoiseBackend,
    NumpyNoise,
    OpenDPNoise,
    available_backends,
    get_backend,
    register_backend,
)
from mechanisms.dp.calibration import analytic_sigma, classic_sigma, gaussian_delta, gdp_epsilon, gdp_mu
from mechanisms.dp.clipping import Clipping, clip_coordinates, clip_l2
from mechanisms.dp.count_noise import (
    CountNoise,
    GaussianCountNoise,
    GeometricCountNoise,
    LaplaceCountNoise,
    UniformCountNoiseNoDP,
)
from mechanisms.dp.gaussian.mechanism import BLOCKS, GaussianMechanism
from mechanisms.dp.ledger import PrivacyLedger, PrivacyReport, ReleaseEvent
from mechanisms.dp.noise_aware import (
    debias_covariances,
    drop_small_counts,
    fedcof_spread_bias,
    outer_product_bias,
    repair_psd,
)
from mechanisms.dp.sensitivity import StatisticSensitivity

__all__ = [
    "ACCOUNTANTS",
    "BLOCKS",
    "Clipping",
    "CountNoise",
    "GaussianCountNoise",
    "GaussianMechanism",
    "GeometricCountNoise",
    "LaplaceCountNoise",
    "NoiseBackend",
    "NumpyNoise",
    "OpenDPNoise",
    "PrivacyLedger",
    "PrivacyReport",
    "ReleaseEvent",
    "StatisticSensitivity",
    "UniformCountNoiseNoDP",
    "analytic_sigma",
    "available_backends",
    "calibrate_round_mu",
    "classic_sigma",
    "clip_coordinates",
    "clip_l2",
    "debias_covariances",
    "drop_small_counts",
    "fedcof_spread_bias",
    "gaussian_delta",
    "gdp_epsilon",
    "gdp_mu",
    "get_backend",
    "ledger_epsilon",
    "outer_product_bias",
    "register_backend",
    "repair_psd",
]

# Secure aggregation, imported on first use (TenSEAL and the key-agreement stack are heavy): these names
# are :mod:`mechanisms.secagg`'s own.
_SECAGG = (
    "CKKSAggregation",
    "CKKSParams",
    "DistributedGaussian",
    "PairwiseMasking",
    "ProtocolAbort",
    "SecureAggReport",
    "make_secure_agg",
    "secagg_upload_bytes",
)


def __getattr__(name: str):
    if name not in _SECAGG:
        raise AttributeError(f"module 'mechanisms' has no attribute {name!r}")
    return getattr(importlib.import_module("mechanisms.secagg"), name)
