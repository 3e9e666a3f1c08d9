"""Calibration of :class:`~mechanisms.dp.gaussian.mechanism.GaussianMechanism`: from the budget to each block's sigma.

The budget (eps, delta) becomes one GDP mu over all rounds (:func:`mechanisms.dp.accounting.calibrate_round_mu`,
exact without subsampling), each round's mu is shared across blocks, and the sensitivity of every
block comes from :class:`mechanisms.dp.sensitivity.StatisticSensitivity` (record, client or upload
bound); :func:`mechanisms.dp.sensitivity.block_sigmas` turns them into sigmas.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

from mechanisms.dp.accounting import calibrate_round_mu
from mechanisms.dp.calibration import MAX_EPSILON, as_real, gdp_epsilon
from mechanisms.dp.sensitivity import StatisticSensitivity, block_sigmas
from privfed.errors import ConfigError, InputError

__all__ = ["GaussianCalibration", "check_noise_multiplier", "noise_multiplier_epsilon"]


class GaussianCalibration:
    """The mechanism's calibration: sensitivities, the per-round mu and every block's sigma (a mixin)."""

    def _split_weights(self, split) -> str | dict[str, float]:
        if isinstance(split, str):
            if split not in ("joint", "equal", "augmented"):
                raise ConfigError(
                    f"split must be 'joint', 'equal', 'augmented' or a dict of weights, got split={split!r}"
                )
            if split == "augmented" and self.blocks != ("sums", "counts"):
                raise ConfigError(
                    f"split='augmented' noises FedLog's augmented statistic [counts, sums]; it needs "
                    f"blocks=('sums', 'counts'), got blocks={self.blocks!r}"
                )
            return split
        if not isinstance(split, Mapping):
            raise ConfigError(f"split must be 'joint', 'equal' or a dict of weights, got split={split!r}")
        if set(split) != set(self.blocks):
            raise ConfigError(
                f"split weights must name exactly the blocks {list(self.blocks)}, got {sorted(split)}"
            )
        try:  # numbers only ("1" was a weight of 1)
            w = {b: as_real(split[b]) for b in self.blocks}
        except (TypeError, ValueError):
            raise ConfigError(f"split weights must be numbers, got {dict(split)!r}") from None
        if any(not (v > 0 and math.isfinite(v)) for v in w.values()):
            raise ConfigError(f"split weights must be finite and > 0, got {w}")
        top = max(w.values())  # scaled first: weights of 1e308 summed to inf and divided to 0
        s = sum(v / top for v in w.values())
        out = {b: v / top / s for b, v in w.items()}
        if not all(v > 0 for v in out.values()):  # 5e-324 beside 1e308: a share float64 rounds to 0
            raise ConfigError(
                f"split weights {w} differ by more than float64 can hold; keep their ratio below about 1e300"
            )
        return out

    def _round_mu(self) -> tuple[float, str]:
        if math.isinf(self.epsilon):
            return math.inf, "none (epsilon = inf)"
        if self.calibration == "classic":
            if self.epsilon > 1:
                warnings.warn(
                    f"calibration='classic' is only proven for epsilon <= 1 (got epsilon={self.epsilon}); the "
                    "report recomputes epsilon exactly from sigma; prefer calibration='analytic'",
                    UserWarning,
                    stacklevel=3,
                )
            mu = self.epsilon / math.sqrt(2.0 * math.log(1.25 / self.delta))
            return mu / math.sqrt(self.rounds), "classic"
        mu, how = calibrate_round_mu(
            self.epsilon,
            self.delta,
            rounds=self.rounds,
            sampling_rate=self.sampling_rate,
            accountant=self.accountant,
        )
        return mu, f"analytic, {how}"

    def _resolve(self, dim: int | None) -> None:
        """Sensitivities and sigmas once the feature dimension is known (coordinate clipping)."""
        c = self.clipping.l2_bound(dim) if dim is not None else float(self.clip_bound)
        bound = self.statistic_sensitivity(c)
        sens = bound.per_block(self.blocks, strict=False)  # the clip was bounded where noise needs it
        self._base_sens = dict(sens)
        joint = bound.joint()
        if dim is not None and any(self._slack(b, dim) for b in self.blocks):
            # Rounding to the backend's grid moves each coordinate that differs between neighbours by
            # at most grid/2 on each side: calibrate for Delta + slack over the coordinates that move.
            sens = {b: sens[b] + self._slack(b, dim) for b in self.blocks}
            joint = math.sqrt(sum(v * v for v in sens.values()))
        self._sens = sens
        self._joint_sens = joint
        sigma = block_sigmas(sens, self._mu_round, self._weights, joint=joint)
        if not all(math.isfinite(v) for v in sigma.values()):
            raise ConfigError(
                f"epsilon={self.epsilon!r} at delta={self.delta!r} over {self.rounds} round(s) calls for noise "
                f"beyond float64 (sigma={sigma}) that would release inf values; use a larger epsilon or delta, "
                "or fewer rounds"
            )
        self._sigma = sigma
        self._dim = dim

    def statistic_sensitivity(self, clip_l2: float) -> StatisticSensitivity:
        """The sensitivity object of this mechanism's statistic for records of L2 norm <= ``clip_l2``."""
        return StatisticSensitivity(
            clip_l2=clip_l2, level=self.level, record_bound=self.record_bound, max_records=self.max_records
        )

    @property
    def bounds_uploads(self) -> bool:
        """Whether each client's upload is scaled to at most ``max_records`` records' worth before release."""
        return self.level == "client" or self.record_bound == "upload"

    def _moving(self, block: str, dim: int, num_classes: int | None = None) -> int:
        """Coordinates of one upload's block that can differ between neighbours."""
        if block == "second":
            return dim * (dim + 1) // 2
        per_class = dim if block == "sums" else 1
        if not self.bounds_uploads:
            return per_class  # one record moves one class row
        # A bounded upload (client level, or a record moving a body trained on all records): every class row
        # can move, the counts too (the bound scales them all).
        if num_classes is None:
            raise ConfigError(
                "the rounding slack of a bounded upload needs the number of classes; release once first"
            )
        return per_class * num_classes

    def _slack(self, block: str, dim: int, num_classes: int | None = None) -> float:
        if self.backend.sensitivity_slack(1, "l2") == 0:
            return 0.0
        if self.bounds_uploads and num_classes is None and block != "second":
            num_classes = self._num_classes
            if num_classes is None:
                return 0.0  # resolved again at the first release, when C is known
        return self.backend.sensitivity_slack(self._moving(block, dim, num_classes), "l2")

    _num_classes: int | None = None

    def set_backend(self, backend, *, dim: int | None = None, num_classes: int | None = None) -> None:
        """Draw this mechanism's noise from ``backend`` (a name or a :class:`~mechanisms.dp.backends.NoiseBackend`)
        from now on, recalibrated for it: a rounding backend (OpenDP) adds its slack to the sensitivities, so
        sigma is recalibrated for the same mu (once ``dim``, and for a bounded upload ``num_classes``, are
        known: given here, or at the first release).

        For the node that draws the noise (its operator's choice), and for a server's copy of a mechanism
        whose releases other processes drew, so that its report states the backend they used.
        """
        from mechanisms.dp.backends import get_backend

        self.backend = get_backend(backend)
        if num_classes is not None:
            self._num_classes = int(num_classes)
        dim = self._dim if dim is None else int(dim)
        self._sigma = self._sens = None
        self._base_sens = {}
        self._dim = None
        slack_free = self.backend.sensitivity_slack(1, "l2") == 0
        if dim is not None or (self.clipping.norm == "l2" and slack_free):
            self._resolve(dim)

    def _ensure(self, dim: int) -> None:
        if self._sigma is None:
            self._resolve(dim)
        elif self._dim is not None and self._dim != dim:
            # A sensitivity that depends on d was fixed for another d: the noise drawn would be too small for
            # these features (and the guarantee stated too strong).  With L2 clipping and exact noise d
            # does not enter it.
            if self.clipping.norm == "coordinate":
                why = "coordinate clipping's sensitivity b sqrt(d) depends on d"
            elif self.backend.sensitivity_slack(1, "l2") != 0:
                why = f"the {type(self.backend).__name__} backend's rounding slack grows with sqrt(d)"
            else:
                return
            raise InputError(
                f"features have d={dim} but the mechanism was calibrated for d={self._dim} ({why}), by dim= "
                f"or by its first release; release them with a new mechanism of dim={dim}"
            )

    @property
    def sigma(self) -> dict[str, float]:
        """Noise standard deviation per block (full noise of one upload)."""
        if self._sigma is None:
            raise ConfigError(
                "sigma depends on the feature dimension (clip_norm='coordinate', or a rounding backend such as "
                "'opendp' whose slack grows with d); pass dim= to GaussianMechanism or release once"
            )
        return dict(self._sigma)

    @property
    def sensitivity(self) -> dict[str, float]:
        """L2 sensitivity per block under the neighbouring relation."""
        if self._sens is None:
            raise ConfigError("sensitivity depends on the feature dimension; pass dim= to GaussianMechanism")
        return dict(self._sens)

    @property
    def joint_sensitivity(self) -> float:
        """L2 sensitivity of all blocks together (FedLog's augmented statistic for sums and counts)."""
        if self._sens is None:
            raise ConfigError("sensitivity depends on the feature dimension; pass dim= to GaussianMechanism")
        return self._joint_sens

    @property
    def calibration_method(self) -> str:
        """How sigma was calibrated (``"analytic, gdp (exact)"``, ``"classic"``, ...)."""
        return self._calibrated_by

    @property
    def mu(self) -> float:
        """GDP mu of one round over all blocks together."""
        return self._mu_round

    def upload_noise_variance(self, method=None, num_clients: int = 1) -> dict[str, float]:
        """Per-coordinate noise variance on each client's uploaded block (for noise-aware estimation).

        Zero where the noise is added to the sum instead (trusted aggregator).
        """
        self._require_sigma()
        per_client = bool(getattr(method, "per_client", False))
        if self.level == "client" or (self.trusted_aggregator and not per_client and not self._secure):
            return {b: 0.0 for b in self.blocks}
        share = 1.0 / max(num_clients - self.dropout_tolerance, 1) if self._secure else 1.0
        return {b: self._sigma[b] ** 2 * share for b in self.blocks}

    def _require_sigma(self) -> None:
        if self._sigma is None:
            raise ConfigError(
                "pass dim= to GaussianMechanism (clip_norm='coordinate') before asking for sigma"
            )


def check_noise_multiplier(z, epsilon, calibration: str, sampling_rate) -> float:
    """``noise_multiplier`` checked: a finite number > 0, without ``epsilon``, analytic, no subsampling."""
    if epsilon is not None:
        raise ConfigError("give epsilon or noise_multiplier, not both: one determines the other")
    try:
        z = as_real(z)  # a bool or a string is no multiplier, as it is no epsilon
    except (TypeError, ValueError):
        raise ConfigError(f"noise_multiplier must be a number > 0, got {z!r}") from None
    if not (z > 0 and math.isfinite(z)):
        raise ConfigError(f"noise_multiplier must be a finite number > 0, got {z!r}")
    if calibration != "analytic" or sampling_rate != 1:
        raise ConfigError(
            "noise_multiplier fixes the noise of an unsampled release under the exact (GDP) accounting: use it "
            "with calibration='analytic' and sampling_rate=1, or give epsilon"
        )
    return z


def noise_multiplier_epsilon(z: float, rounds: int, delta: float) -> float:
    """The epsilon (at ``delta``) of ``rounds`` (an int >= 1) releases at noise multiplier ``z`` (GDP:
    sqrt(rounds) / z), refused naming ``z`` when float64 cannot account for it or delta is met at epsilon = 0."""
    epsilon = gdp_epsilon(math.sqrt(rounds) / z, delta)
    if not 0 < epsilon <= MAX_EPSILON:  # refused naming what was given, not the epsilon computed
        raise ConfigError(
            f"noise_multiplier={z!r} gives epsilon={epsilon:g} at delta={delta!r}: "
            + (
                "so much noise that delta is met at epsilon = 0, and a release's accounting needs epsilon > 0; "
                "use a smaller noise_multiplier"
                if epsilon == 0
                else f"so little noise that its epsilon is beyond {MAX_EPSILON:g} (float64 cannot account for "
                "it, and it protects nothing); use a larger noise_multiplier, or epsilon=float('inf') for no noise"
            )
        )
    return epsilon
