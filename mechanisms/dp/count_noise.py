"""Noise on class counts only (FedCOF, Goswami et al., App. I.1, Eq. 23).

Every client perturbs its class counts, n~_kc = max(n_kc + noise, 0); a class
whose noisy count is 0 is not sent (count, sum and mean dropped), and the
server leaves it out of the estimator.  The client still sends its exact
class mean mu_kc, so the uploaded sum becomes n~_kc mu_kc.

Neighbouring relation: add or remove one record of one client, which moves
that client's count vector by 1 in one coordinate (L1 = L2 sensitivity 1).

* :class:`LaplaceCountNoise`: Laplace(0, 1/eps) per count, (eps, 0)-DP
  (Dwork et al. 2006).
* :class:`GeometricCountNoise`: two-sided geometric P(k) ~ exp(-eps |k|),
  the integer analogue, (eps, 0)-DP (Ghosh, Roughgarden & Sundararajan 2009).
* :class:`GaussianCountNoise`: N(0, sigma^2) with sigma from the analytic
  Gaussian at (eps, delta), sensitivity 1.  (FedCOF's N(0, 1/eps) is not
  calibrated to any guarantee.)
* :class:`UniformCountNoiseNoDP`: U(-(1 - eps) n, (1 - eps) n), noise
  proportional to the count itself, as in FedCOF.  It carries **no DP
  guarantee** (a count of 0 stays 0, and a width-W uniform is only
  (eps, Delta/W)-DP for any eps); its reports say so.

Only the counts are protected: the class means go out without noise, so no
count mechanism makes the whole release differentially private; every report
states this.  The clip-at-zero rule is post-processing and keeps the counts'
guarantee.
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms.dp.backends import NoiseBackend, get_backend
from mechanisms.dp.calibration import analytic_sigma, as_real, check_budget
from mechanisms.dp.ledger import PrivacyLedger, PrivacyReport, ReleaseEvent, format_up
from mechanisms.dp.params import Parameters
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError
from privfed.notes import Note
from privfed.stats import ClientStats

__all__ = [
    "GEOMETRIC_MIN_EPSILON",
    "CountNoise",
    "GaussianCountNoise",
    "GeometricCountNoise",
    "LaplaceCountNoise",
    "UniformCountNoiseNoDP",
    "drop_clipped",
]


def drop_clipped(stats: ClientStats, noisy_counts: np.ndarray) -> tuple[ClientStats, int]:
    """Apply Eq. 23's rule: clip noisy counts at 0, drop those classes, keep exact means.

    Which counts survive depends on the noisy counts only (a class the
    client lacks gets a positive noisy count as often as the noise says, so
    the counts keep their guarantee).  Sums become n~ times the exact mean;
    a class without data has no mean and gets a zero sum (the means carry no
    guarantee).

    Returns the new statistics and the number of noisy counts clipped to 0
    (a function of the released values only).
    """
    n = np.asarray(noisy_counts, dtype=np.float64)
    kept = n > 0
    dropped = int(np.count_nonzero(~kept))
    if stats.is_materialised("sums"):
        means = np.nan_to_num(stats.means())
        new_counts = np.where(kept, n, 0.0)
        new_sums = np.where(kept[..., None], means * new_counts[..., None], 0.0)
        return stats.with_arrays(counts=new_counts, sums=new_sums), dropped
    # The pair layout: the kept cells become the pairs (a kept class without data sends a zero sum).
    K, C = stats.num_clients, stats.num_classes
    kk, cc = np.nonzero(kept)
    nk = n[kk, cc]
    pkey = stats.pair_client * C + stats.pair_class  # sorted
    key = kk * C + cc
    j = np.minimum(np.searchsorted(pkey, key), max(pkey.size - 1, 0))
    has = np.zeros(key.size, dtype=bool)
    if pkey.size:
        has = (pkey[j] == key) & (stats.pair_counts[j] > 0)
    jh = j[has]
    kept_sums = stats.pair_sums[jh]  # n~ times the exact mean, in place: (s / n) n~
    kept_sums /= stats.pair_counts[jh, None]
    kept_sums *= nk[has, None]
    # a kept class the client lacks is a count-only cell: no row of zeros is stored for it
    rows = np.full(key.size, -1, dtype=np.int64)
    rows[has] = np.arange(int(has.sum()))
    out = ClientStats.from_pairs(
        num_clients=K,
        num_classes=C,
        pair_client=kk,
        pair_class=cc,
        pair_counts=nk,
        pair_sums=kept_sums,
        owners=stats.owners,
        sum_rows=rows,
    )
    return out, dropped


class CountNoise(Parameters):
    """Base class: perturb class counts per client, clip at 0 and drop (a ``privacy`` hook).

    Subclasses implement :meth:`perturb` and :meth:`_event`.
    """

    name = "count-noise"
    #: Whether the counts carry a DP guarantee.
    dp = True

    def __init__(self, *, epsilon: float, backend: str | NoiseBackend | None = None) -> None:
        self.epsilon = self._check_eps(epsilon)
        self.backend = get_backend(backend)
        self.ledger = PrivacyLedger()
        self.dropped = 0

    @staticmethod
    def _check_eps(epsilon: float) -> float:
        try:
            eps = as_real(epsilon)
        except (TypeError, ValueError):
            raise ConfigError(f"epsilon must be a number > 0, got epsilon={epsilon!r}") from None
        if not eps > 0:
            raise ConfigError(f"epsilon must be > 0, got epsilon={epsilon!r}")
        if (
            eps < COUNT_NOISE_MIN_EPSILON
        ):  # scale 1/eps near the float limit: the draws overflow to inf counts
            raise ConfigError(
                f"epsilon={epsilon!r} is below {COUNT_NOISE_MIN_EPSILON:g}: its noise (scale 1/epsilon) overflows "
                "float64 and would release inf counts"
            )
        return eps

    def perturb(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Noisy counts before the clip-at-zero rule (any shape)."""
        raise NotImplementedError

    def _event(self, release_id: int) -> ReleaseEvent:
        raise NotImplementedError

    def release(self, counts, rng: np.random.Generator) -> np.ndarray:
        """n~ = max(n + noise, 0) for an array of counts; records the release."""
        check_generator(rng)
        raw = np.asarray(counts)
        if (
            raw.dtype.kind not in "iuf"
        ):  # complex lost its imaginary part, True counted as 1, text raised numpy's error
            raise ConfigError(f"counts must be whole numbers, got values of dtype {raw.dtype}")
        c = raw.astype(np.float64, copy=False)
        if not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c != np.round(c)):  # inf == round(inf)
            raise ConfigError("counts must be finite, non-negative whole numbers")
        noisy = self.perturb(c, rng)
        if not np.all(np.isfinite(noisy)):  # nothing released, nothing booked
            raise ConfigError("the count noise overflowed float64 (inf counts); use a larger epsilon")
        self.ledger.record(self._event(self.ledger.new_release()))
        return np.maximum(noisy, 0.0)

    # -- privacy hook protocol ---------------------------------------------------
    def check(self, method, secure_agg) -> None:
        if secure_agg is not None:
            raise ConfigError(
                "count noise is a per-client perturbation of shared counts; with secure aggregation use "
                "GaussianMechanism (noise split across clients) instead"
            )
        requires = set(getattr(method, "requires", ()))
        regroups = getattr(method, "regrouping", lambda: None)()
        if regroups:
            raise ConfigError(
                f"count noise is refused for method {getattr(method, 'name', method)!r}: {regroups}, so one record "
                "moves several counts at once (the sensitivity of 1 does not hold)"
            )
        extra = requires - {"counts", "sums"}
        if extra:
            raise ConfigError(
                f"method {getattr(method, 'name', method)!r} also uploads {sorted(extra)}, which count noise "
                "leaves exact; use GaussianMechanism(blocks=('sums', 'counts', 'second'))"
            )

    def clip(self, features: np.ndarray) -> np.ndarray:
        return features

    def sent_pairs(self, stats: ClientStats, uploaded: ClientStats) -> int:
        """Pairs sent: those whose noisy count survived the clip at zero (a function of the noisy counts)."""
        return int(np.count_nonzero(uploaded.counts > 0))

    def declare_randomness(self, *, seeded: bool) -> None:
        """Whether the noise comes from a seed (see :meth:`GaussianMechanism.declare_randomness`)."""
        prev = getattr(self, "_seeded", None)
        self._seeded = bool(seeded) if prev is None else (prev or bool(seeded))

    feature_transform = None

    def before_upload(self, stats: ClientStats, method, rng: np.random.Generator) -> ClientStats:
        noisy = self.release(stats.counts, rng)
        out, dropped = drop_clipped(stats, noisy)
        # the uniform heuristic never draws below zero (its width is (1 - eps) n): its zeros are the classes a
        # client lacks, kept at 0, and nothing was clipped
        self.dropped += dropped if self.dp else 0
        return out

    def after_aggregate(self, total: ClientStats, method, rng: np.random.Generator) -> ClientStats:
        return total

    def _guarantee(self, eps: float, delta: float) -> str:
        # The release as a whole has no guarantee: say so first, then what the counts alone get.
        return (
            "NO DP GUARANTEE for the class means and sums, which are sent without noise (an exact zero sum "
            f"shows a class is absent); class counts only: ({format_up(eps)}, {format_up(delta)})-DP at record "
            f"level ({self.name})"
        )

    def report(self, delta: float = 0.0) -> PrivacyReport:
        from mechanisms.dp.accounting import ledger_epsilon

        delta = getattr(self, "delta", delta)
        eps, acc = ledger_epsilon(self.ledger.events, delta)
        if not self.dp:
            guarantee = (
                f"NO DP GUARANTEE: {self.name} noise U(-(1 - eps) n, (1 - eps) n) with eps={self.epsilon} is a "
                "heuristic (FedCOF App. I.1): its width depends on the count, a count of 0 stays 0"
            )
        elif not self.ledger.events:
            guarantee = "nothing released yet"
        else:
            guarantee = self._guarantee(eps, delta)
        notes = [
            Note(
                f"{self.dropped} noisy (client, class) count(s) clipped to 0 and not sent",
                "clipped_counts",
                self.dropped,
            )
        ]
        seeded = (
            getattr(self, "_seeded", None) is not False
            and bool(self.ledger.events)
            and not self.backend.secure
        )
        if seeded:
            notes.insert(0, "SIMULATION, NOT A RELEASE: the noise was drawn from a seed and can be replayed")
        if seeded and self.dp:
            # in the guarantee too (the line a user prints), after what leads it: the release as a whole has none
            guarantee += "; SIMULATION (seeded noise, replayable): the counts' noise came from a seed"
        if not self.dp:
            eps = math.inf  # a heuristic has no epsilon
        return PrivacyReport(
            epsilon=eps,
            delta=delta,
            level="record",
            mechanism=self.name,
            calibration="direct" if self.dp else "none (heuristic)",
            sigma={"counts": self.scale},
            sensitivity={"counts": 1.0},
            rounds=1,
            sampling_rate=1.0,
            accountant=acc,
            guarantee=guarantee,
            target_epsilon=self.epsilon if self.dp else math.nan,
            num_events=len(self.ledger),
            notes=tuple(notes),
            placement="local" if self.ledger.events else "none",
            simulation=seeded,
            protects="class counts only (means sent in clear)" if self.dp else "nothing",
        )

    @property
    def scale(self) -> float:
        return math.nan

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon})"


class LaplaceCountNoise(CountNoise):
    """Laplace(0, 1/eps) on each count: (eps, 0)-DP for the counts (L1 sensitivity 1)."""

    name = "laplace"

    @property
    def scale(self) -> float:
        return 1.0 / self.epsilon

    def perturb(self, counts, rng):
        return self.backend.add_laplace(counts, self.scale, rng)

    def _event(self, rid):
        return ReleaseEvent("laplace", "counts", 1.0, self.scale, release_id=rid)


#: Smallest epsilon any count noise accepts: below it Laplace draws of scale 1/epsilon overflow float64.
COUNT_NOISE_MIN_EPSILON = 1e-300
#: Smallest epsilon :class:`GeometricCountNoise` accepts.  A draw of magnitude 2**53 or more is not an exact
#: integer in float64 and numpy's geometric sampler saturates at 2**63 - 1 (at eps = 1e-300 it returns
#: 2**63 - 1 for both draws, so every count came out unchanged); at eps >= 1e-9 the chance of any draw reaching
#: 2**53 is at most 2 exp(-eps 2**53) < exp(-9e6) per count.  Noise of scale 1e9 destroys every count anyway.
GEOMETRIC_MIN_EPSILON = 1e-9


class GeometricCountNoise(CountNoise):
    """Two-sided geometric noise P(k) ~ exp(-eps |k|): integer counts, (eps, 0)-DP.

    ``epsilon`` below :data:`GEOMETRIC_MIN_EPSILON` (1e-9) is refused: the
    sampler cannot draw such noise exactly, and a run would report a
    guarantee for noise it did not add.
    """

    name = "geometric"

    def __init__(self, *, epsilon: float, backend: str | NoiseBackend | None = None) -> None:
        eps = self._check_eps(epsilon)
        if eps < GEOMETRIC_MIN_EPSILON:
            raise ConfigError(
                f"geometric count noise needs epsilon >= {GEOMETRIC_MIN_EPSILON:g}, got epsilon={epsilon!r}: below "
                "it the integer noise (scale 1/epsilon) overflows the sampler's 64-bit range and would leave the "
                "counts unchanged while reporting the guarantee; use a larger epsilon or Laplace count noise"
            )
        super().__init__(epsilon=eps, backend=backend)

    @property
    def scale(self) -> float:
        return 1.0 / self.epsilon

    def perturb(self, counts, rng):
        return self.backend.add_geometric(counts, self.epsilon, rng)

    def _event(self, rid):
        return ReleaseEvent("geometric", "counts", 1.0, self.epsilon, release_id=rid)


class GaussianCountNoise(CountNoise):
    """N(0, sigma^2) on each count, sigma = analytic Gaussian at (eps, delta) for sensitivity 1."""

    name = "gaussian-counts"

    def __init__(self, *, epsilon: float, delta: float, backend=None) -> None:
        eps, dl = check_budget(epsilon, delta, allow_inf=False)
        super().__init__(epsilon=eps, backend=backend)
        self.delta = dl
        self.sigma = analytic_sigma(eps, dl, 1.0)

    @property
    def scale(self) -> float:
        return self.sigma

    def perturb(self, counts, rng):
        return self.backend.add_gaussian(counts, self.sigma, rng)

    def _event(self, rid):
        return ReleaseEvent("gaussian", "counts", 1.0, self.sigma, release_id=rid)

    def __repr__(self) -> str:
        return f"GaussianCountNoise(epsilon={self.epsilon}, delta={self.delta})"


class UniformCountNoiseNoDP(CountNoise):
    """FedCOF's uniform count noise U(-(1 - eps) n, (1 - eps) n), eps in (0, 1]: NO DP guarantee.

    The noise is proportional to the count, so it hides nothing about which
    classes a client lacks (0 stays 0); kept to reproduce FedCOF App. I.1.
    Every report it produces says "NO DP GUARANTEE".
    """

    name = "uniform (no DP guarantee)"
    dp = False

    def __init__(self, *, epsilon: float, backend=None) -> None:
        super().__init__(epsilon=epsilon, backend=backend)
        if self.epsilon > 1:
            raise ConfigError(
                f"uniform count noise needs epsilon in (0, 1] (width (1 - eps) n), got {epsilon!r}"
            )

    @property
    def scale(self) -> float:
        return 1.0 - self.epsilon

    def perturb(self, counts, rng):
        w = (1.0 - self.epsilon) * counts
        return counts + rng.uniform(-1.0, 1.0, size=np.shape(counts)) * w

    def _event(self, rid):
        return ReleaseEvent("uniform", "counts", 1.0, self.scale, release_id=rid)
