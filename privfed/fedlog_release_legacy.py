"""Multi-round FedLog's release: the Gaussian noise over R releases and how each round's sum reaches the server.

:class:`RoundsDP` calibrates the noise on the augmented FedLog statistic (the class sums of [1, f])
over the run's R releases and books each in its ledger; :class:`RoundRelease` carries one round's
per-client statistics to the server (bounded, noised where the placement says, summed plainly or
through pairwise masking or CKKS with distributed shares); :class:`RoundsPrivacyReport` is the
guarantee of what was released.  :func:`noise_generator` gives a run's noise source: OS entropy,
or a seeded simulation that says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from mechanisms.ledger import format_up
from privfed.errors import ConfigError
from privfed.fedlog_bodies import FEATURE_DIM

__all__ = ["SECURE_CHOICES", "RoundRelease", "RoundsDP", "RoundsPrivacyReport", "noise_generator"]

_PLACEMENTS = ("central", "distributed", "local")
_CALIBRATIONS = ("total", "paper")
_BOUNDS = ("auto", "upload", "theorem")
#: Largest composed GDP mu for which the report cross-checks epsilon with a PLD accountant.
_PLD_MAX_MU = 8.0


# ---------------------------------------------------------------- privacy
@dataclass(frozen=True)
class RoundsPrivacyReport:
    """What R releases of the FedLog statistic guarantee, computed from the run's ledger.

    ``per_round_epsilon`` is the eps each release is calibrated for (what the
    paper states per round); ``per_round_epsilon_exact`` what one release
    alone satisfies exactly (the classic sigma is loose); ``epsilon`` is what
    the releases made compose to (GDP, exact); ``epsilon_pld`` cross-checks
    it with dp-accounting's PLD.
    """

    epsilon: float
    epsilon_pld: float
    per_round_epsilon: float
    per_round_epsilon_exact: float
    target_epsilon: float
    delta: float
    level: str
    placement: str
    calibration: str
    record_bound: str
    sensitivity: float
    sigma: float
    mu_per_release: float
    mu_total: float
    releases: int
    formal: bool
    guarantee: str
    notes: tuple = ()
    #: True when the noise came from a seed (``noise_seed``) or a caller's Generator: a seeded simulation
    simulation: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }

    @property
    def is_private(self) -> bool:
        """Whether the releases carry the stated formal (finite) guarantee."""
        return bool(self.formal) and math.isfinite(self.epsilon)

    @property
    def auc_bound(self) -> float:
        """The largest AUC of any membership test against mu_total-GDP releases: Phi(mu / sqrt(2))."""
        from scipy.stats import norm

        return float(norm.cdf(self.mu_total / math.sqrt(2.0)))

    def describe(self) -> str:
        """Several lines: the guarantee, both epsilons (per round and composed) and the notes."""
        ratio = self.epsilon / self.per_round_epsilon if self.per_round_epsilon > 0 else math.inf
        pld_note = f" skipped: mu > {_PLD_MAX_MU:g}" if math.isnan(self.epsilon_pld) else ""
        lines = [
            self.guarantee,
            f"  per-round epsilon (as calibrated / as the paper states): {format_up(self.per_round_epsilon)} "
            f"(one release alone is exactly {format_up(self.per_round_epsilon_exact)}-DP at delta = "
            f"{format_up(self.delta)})",
            f"  composed over {self.releases} release(s): epsilon = {format_up(self.epsilon)} (GDP, exact; "
            f"PLD {format_up(self.epsilon_pld)}{pld_note}), {ratio:.3g} x the per-round epsilon",
            f"  sigma = {self.sigma:.4g} on a sensitivity of {self.sensitivity:.4g} ({self.record_bound} bound)",
            f"  any membership test on all {self.releases} release(s) has AUC <= {self.auc_bound:.4g} "
            f"(mu-GDP: Phi(mu / sqrt 2), mu = {self.mu_total:.4g})",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.guarantee


class RoundsDP:
    """Gaussian noise on the augmented FedLog statistic, calibrated over ``rounds`` releases.

    Parameters
    ----------
    epsilon, delta : float
        The budget: of all R releases together (``calibration="total"``) or of
        each release (``"paper"``).
    clip : float
        b (``clip_norm="coordinate"``, every feature in [-b, b]) or the L2 bound c.
    clip_norm : {"coordinate", "l2"}
    rounds : int
        R, the number of releases the run will make.
    level : {"record", "client"}
    placement : {"central", "distributed", "local"}
        Who adds the noise: a trusted server (to the sum), every client a share
        sigma^2/(K - t) under secure aggregation (:class:`RoundRelease`; :meth:`noisy_sum`
        simulates it with sigma^2/K as a plain sum), or every client the full sigma.
    calibration : {"total", "paper"}
    record_bound : {"auto", "upload", "theorem"}
        Record level only: ``upload`` calibrates for 2 n_max Delta (valid when
        bodies are trained on the private records), ``theorem`` for Delta
        (Theorem 3.1; valid for frozen bodies only).  ``auto``: ``upload``
        when ``bodies_trained`` else ``theorem``.
    max_records : int, optional
        n_max: clients with more records are scaled down to n_max records' worth.
        Required unless the bound is ``theorem``.
    dim : int
        d, the body's feature width (m = d + 1).
    bodies_trained : bool
        Whether the released features come from bodies trained on the private records.
    tolerate : int
        t: clients whose distributed noise share may be missing (dropouts,
        colluders); each client adds sigma^2/(K - t) so K - t shares carry sigma^2.
    """

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        clip: float,
        clip_norm: str = "coordinate",
        rounds: int = 1,
        level: str = "record",
        placement: str = "central",
        calibration: str = "total",
        record_bound: str = "auto",
        max_records: int | None = None,
        dim: int = FEATURE_DIM,
        bodies_trained: bool = True,
        accountant_check: bool = True,
        tolerate: int = 0,
    ) -> None:
        from mechanisms.accounting import calibrate_round_mu
        from mechanisms.calibration import check_budget, classic_sigma
        from mechanisms.clipping import Clipping
        from mechanisms.ledger import PrivacyLedger

        self.epsilon, self.delta = check_budget(epsilon, delta, allow_inf=False)
        self.clipping = Clipping(clip, clip_norm)
        from mechanisms.gaussian import MAX_CLIP

        if not float(self.clipping.bound) <= MAX_CLIP:
            raise ConfigError(
                f"clip={clip!r} is beyond {MAX_CLIP:g}: the statistic's noise would overflow float64 "
                "for some datasets; rescale the features and pick a clip <= 1e100"
            )
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
            raise ConfigError(f"rounds must be an integer >= 1, got rounds={rounds!r}")
        self.rounds = int(rounds)
        if level not in ("record", "client"):
            raise ConfigError(f"level must be 'record' or 'client', got level={level!r}")
        if placement not in _PLACEMENTS:
            raise ConfigError(f"placement must be one of {list(_PLACEMENTS)}, got placement={placement!r}")
        if level == "client" and placement == "local":
            raise ConfigError(
                "level='client' needs noise on the aggregate: use placement='central' (trusted "
                "server) or 'distributed' (secure aggregation)"
            )
        if calibration not in _CALIBRATIONS:
            raise ConfigError(
                f"calibration must be one of {list(_CALIBRATIONS)}, got calibration={calibration!r}"
            )
        if record_bound not in _BOUNDS:
            raise ConfigError(
                f"record_bound must be one of {list(_BOUNDS)}, got record_bound={record_bound!r}"
            )
        if record_bound == "auto":
            record_bound = "upload" if bodies_trained else "theorem"
        self.level, self.placement, self.calibration = level, placement, calibration
        self.record_bound = record_bound if level == "record" else "client"
        if isinstance(tolerate, bool) or not isinstance(tolerate, (int, np.integer)) or tolerate < 0:
            raise ConfigError(
                f"tolerate must be an integer >= 0 (clients whose noise share may be missing), got "
                f"tolerate={tolerate!r}"
            )
        self.tolerate = int(tolerate)
        self.secure_notes: list[str] = []
        self.bodies_trained = bool(bodies_trained)
        self.dim = int(dim)
        c = self.clipping.l2_bound(self.dim)
        self.record_sensitivity = math.sqrt(
            1.0 + c * c
        )  # one phi (x) e_y: counts coordinate 1, features <= c
        needs_n = self.record_bound != "theorem"
        if needs_n:
            if (
                isinstance(max_records, bool)
                or not isinstance(max_records, (int, np.integer))
                or max_records < 1
            ):
                raise ConfigError(
                    f"max_records must be an integer >= 1 (the most records one client contributes), got "
                    f"max_records={max_records!r}; it bounds a client's upload when bodies are trained or at "
                    "client level"
                )
        self.max_records = None if max_records is None else int(max_records)
        if self.record_bound == "theorem":
            self.sensitivity = self.record_sensitivity
        elif self.record_bound == "upload":
            self.sensitivity = 2.0 * self.max_records * self.record_sensitivity
        else:
            self.sensitivity = self.max_records * self.record_sensitivity
        if calibration == "total":
            mu, how = calibrate_round_mu(self.epsilon, self.delta, rounds=self.rounds)
            self.sigma = self.sensitivity / mu
            self._how = f"analytic, total budget over {self.rounds} release(s), {how}"
        else:
            self.sigma = classic_sigma(self.epsilon, self.delta, self.sensitivity, warn=False)
            self._how = "classic sigma per release (Theorem 3.1), the same epsilon every round"
        from mechanisms.backends import get_backend

        self.backend = get_backend(None)
        self.ledger = PrivacyLedger()
        self.accountant_check = bool(accountant_check)
        self.extra_notes: list[str] = []
        # None: not declared (a caller's Generator drove noisy_sum: taken as a simulation)
        self.seeded: bool | None = None
        self.noise_seed: int | None = None

    def declare_randomness(self, *, seeded: bool, noise_seed: int | None = None) -> None:
        """Whether the noise comes from a seed (a replayable seeded simulation) or from OS entropy."""
        self.seeded = bool(seeded) if self.seeded is None else (self.seeded or bool(seeded))
        if noise_seed is not None:
            self.noise_seed = int(noise_seed)

    @property
    def mu_per_release(self) -> float:
        return self.sensitivity / self.sigma

    def clip_tensor(self, f: torch.Tensor) -> torch.Tensor:
        """The clipping as the body's last activation (the paper's g(x)), differentiable."""
        b = float(self.clipping.bound)
        if self.clipping.norm == "coordinate":
            return torch.clamp(f, -b, b)
        norms = f.norm(dim=1, keepdim=True)
        return f * torch.clamp(b / torch.clamp(norms, min=1e-30), max=1.0)

    def bound_uploads(self, A: np.ndarray) -> np.ndarray:
        """Scale client k's augmented statistic A_k (C, m) to at most n_max records' worth."""
        if self.max_records is None or self.record_bound == "theorem":
            return A
        n_k = A[..., 0].sum(axis=-1)
        factor = np.minimum(1.0, self.max_records / np.where(n_k > 0, n_k, 1.0))
        return A * factor[..., None, None]

    def noisy_sum(self, A: np.ndarray, rng: np.random.Generator, *, record: bool = True) -> np.ndarray:
        """The sum over clients (axis -3) of the per-client augmented statistics, noised once.

        ``A`` has shape (..., K, C, m) (leading axes: independent draws, for audits).
        One call is one release; it is appended to the ledger when ``record``.
        """
        A = self.bound_uploads(np.asarray(A, dtype=np.float64))
        K = A.shape[-3]
        if self.placement == "central":
            total = self.backend.add_gaussian(A.sum(axis=-3), self.sigma, rng)
        elif self.placement == "distributed":
            total = self.backend.add_gaussian(A, self.sigma / math.sqrt(K), rng).sum(axis=-3)
        else:
            total = self.backend.add_gaussian(A, self.sigma, rng).sum(axis=-3)
        if record:
            self.record_release(self.sigma)
        return total

    def record_release(self, scale: float) -> None:
        """Append one release whose sum carried Gaussian noise of standard deviation ``scale`` to the ledger."""
        from mechanisms.ledger import ReleaseEvent

        self.ledger.record(
            ReleaseEvent(
                mechanism="gaussian",
                block="fedlog-statistic",
                sensitivity=self.sensitivity,
                scale=float(scale),
                relation=self.level,
                rounds=1,
                release_id=self.ledger.new_release(),
            )
        )

    def composed_epsilon(self) -> float:
        """Epsilon of the releases recorded so far, GDP only (cheap: for per-round curves)."""
        from mechanisms.accounting import ledger_epsilon

        return ledger_epsilon(self.ledger.events, self.delta, "gdp")[0] if self.ledger.events else 0.0

    def report(self) -> RoundsPrivacyReport:
        """The guarantee of the releases recorded so far (GDP exact; PLD cross-check for mu <= 8)."""
        from mechanisms.accounting import ledger_epsilon
        from mechanisms.calibration import gdp_epsilon

        events = self.ledger.events
        n = len(events)
        eps, _ = ledger_epsilon(events, self.delta, "gdp") if n else (0.0, "")
        eps_pld = math.nan
        # from the noise each release really carried (distributed shares: only those that reached the sum)
        mu_total = math.sqrt(sum((e.sensitivity / e.scale) ** 2 for e in events)) if n else 0.0
        # dp-accounting's PLD grid grows with the privacy-loss range (~ mu^2): cross-check moderate mu only
        if n and self.accountant_check and mu_total <= _PLD_MAX_MU:
            eps_pld, _ = ledger_epsilon(events, self.delta, "pld")
        mu1 = self.mu_per_release
        per_round = self.epsilon if self.calibration == "paper" else gdp_epsilon(mu1, self.delta)
        notes = []
        formal = True
        if self.level == "record" and self.record_bound == "theorem" and self.bodies_trained:
            formal = False
            notes.append(
                "Theorem 3.1's sensitivity assumes a body independent of the private records; these bodies were "
                "trained on them, so one record can move every feature of its client: the epsilons below are "
                "what the paper's accounting gives, NOT a formal guarantee (use record_bound='upload')"
            )
        if self.record_bound == "upload":
            notes.append(
                f"trained bodies: each client's upload bounded to max_records={self.max_records} records' "
                "worth; sensitivity = its diameter 2 n_max Delta (valid under adaptive composition)"
            )
        if self.level == "client":
            notes.append(
                f"client level: each client's upload bounded to max_records={self.max_records} records' "
                "worth; sensitivity n_max Delta"
            )
        if self.calibration == "paper" and self.epsilon > 1:
            notes.append(
                "classic sigma outside its proven range (epsilon > 1): the per-round epsilon is not proven"
            )
        if self.placement == "distributed":
            if self.secure_notes:
                notes.extend(self.secure_notes)
            else:
                notes.append(
                    "each client adds N(0, sigma^2/K); holds while secure aggregation hides the individual "
                    "uploads and no client drops out or colludes (simulated as a plain sum here)"
                )
        elif self.placement == "central":
            notes.append("noise on the sum added by a trusted server")
        else:
            notes.append("every client noises its own upload with the full sigma (the sum carries K sigma^2)")
        notes.append("floating-point noise (backend 'numpy'): not hardened against floating-point attacks")
        simulation = bool(n) and self.seeded is not False
        if simulation:
            src = f"noise_seed={self.noise_seed}" if self.noise_seed is not None else "a caller's Generator"
            notes.insert(
                0,
                f"seeded simulation, NOT A RELEASE: the noise was drawn from {src} and can be replayed "
                "by anyone who knows it; run without noise_seed (fresh OS entropy) for a release",
            )
        notes.extend(self.extra_notes)
        where = {"central": "trusted server", "distributed": "secure aggregation", "local": "local noise"}
        if formal:
            guarantee = (
                f"({format_up(eps)}, {format_up(self.delta)})-DP at {self.level} level over {n} release(s) "
                f"(GDP mu = {format_up(mu_total)}); {where[self.placement]}; {self._how}"
            )
        else:
            guarantee = (
                f"NO FORMAL GUARANTEE (bodies trained on the private records): the paper's accounting "
                f"gives eps = {format_up(per_round)} per round, composing to eps = {format_up(eps)} over "
                f"{n} releases at delta = {format_up(self.delta)}"
            )
        if simulation:
            guarantee = "SIMULATION (seeded simulation, replayable noise): " + guarantee
        return RoundsPrivacyReport(
            epsilon=float(eps),
            epsilon_pld=float(eps_pld),
            per_round_epsilon=float(per_round),
            per_round_epsilon_exact=float(gdp_epsilon(mu1, self.delta)),
            target_epsilon=self.epsilon,
            delta=self.delta,
            level=self.level,
            placement=self.placement,
            calibration=self._how,
            record_bound=self.record_bound,
            sensitivity=self.sensitivity,
            sigma=self.sigma,
            mu_per_release=mu1,
            mu_total=mu_total,
            releases=n,
            formal=formal,
            guarantee=guarantee,
            notes=tuple(notes),
            simulation=simulation,
        )


SECURE_CHOICES = ("auto", "none", "mask", "ckks")


class RoundRelease:
    """How one round's statistic reaches the server: clipping bound, noise and (secure) summation.

    Parameters
    ----------
    dp : RoundsDP or None
        The noise (None: no DP).  ``placement="distributed"`` needs a secure
        aggregation protocol: every client adds its share N(0, sigma^2/(K - t))
        before masking or encryption, t = ``dp.tolerate``.
    secure_agg : {"none", "mask", "ckks"}
        ``mask``: privfed's pairwise masking (:class:`mechanisms.secagg.PairwiseMasking`,
        fresh X25519 keys from the OS CSPRNG every round, fixed point with
        ``frac_bits`` fractional bits); ``ckks``: CKKS through TenSEAL
        (:class:`mechanisms.secagg.CKKSAggregation`); ``none``: the server
        sums the uploads it sees in clear.
    num_clients : int
    dropouts : int
        Clients that drop out of every round's secure sum (masking only), drawn
        per round from the release generator, in ``dropout_phase``.
    dropout_phase : {"before_upload", "after_upload"}
        Before uploading (input and noise share missing from the sum) or after.
    frac_bits : int
        Fixed-point fractional bits of the masking protocol.

    Each call is one release: the epsilon it is charged is computed from the
    noise present in the sum (only the shares of clients whose upload entered it).
    """

    def __init__(
        self,
        dp: RoundsDP | None,
        secure_agg: str = "none",
        *,
        num_clients: int,
        dropouts: int = 0,
        dropout_phase: str = "before_upload",
        frac_bits: int = 32,
    ) -> None:
        from mechanisms.secagg import CKKSAggregation, PairwiseMasking
        from mechanisms.secagg_noise import DistributedGaussian

        if secure_agg not in SECURE_CHOICES[1:]:
            raise ConfigError(
                f"secure_agg must be one of {list(SECURE_CHOICES[1:])}, got secure_agg={secure_agg!r}"
            )
        K = int(num_clients)
        self.dp, self.kind, self.num_clients = dp, secure_agg, K
        distributed = dp is not None and dp.placement == "distributed"
        if distributed and secure_agg == "none":
            raise ConfigError(
                "placement='distributed' splits the noise across clients and needs secure aggregation "
                "to hide each client's upload: use secure_agg='mask' or 'ckks'"
            )
        if dropouts and secure_agg != "mask":
            raise ConfigError(
                f"dropouts={dropouts} are simulated by the masking protocol only: use secure_agg='mask'"
            )
        noise = None
        if distributed:
            t = dp.tolerate
            if not 0 <= t < K:
                raise ConfigError(f"tolerate must lie in [0, num_clients - 1 = {K - 1}], got tolerate={t}")
            # share std sigma / sqrt(K - t): DistributedGaussian's share is sigma_total / sqrt(K)
            noise = DistributedGaussian(
                sigma=dp.sigma * math.sqrt(K / (K - t)),
                sensitivity=dp.sensitivity,
                delta=dp.delta,
                tolerate=t,
                backend=dp.backend,
            )
        self.protocol = None
        if secure_agg == "mask":
            self.protocol = PairwiseMasking(
                frac_bits=frac_bits, dropouts=dropouts, dropout_phase=dropout_phase, noise=noise
            )
        elif secure_agg == "ckks":
            self.protocol = CKKSAggregation(noise=noise)
        self.calls: list[dict] = []
        self.views: list[Any] = []
        if distributed:
            self._note()

    def _note(self) -> None:
        dp, K = self.dp, self.num_clients
        present = [c["uploaded"] for c in self.calls]
        text = (
            f"each client adds N(0, sigma^2/(K - {dp.tolerate})) to its upload before "
            f"{'pairwise masking' if self.kind == 'mask' else 'CKKS encryption'}; the server sees only the "
            "masked uploads and their sum; epsilon is computed from the shares that reached each sum"
        )
        if present and min(present) < K:
            text += (
                f" (as few as {min(present)} of {K} shares present in a round: "
                f"{min(present)}/{K - dp.tolerate} of sigma^2)"
            )
        text += (
            "; against the server plus c colluding clients (who know their own shares) only the others count"
        )
        dp.secure_notes[:] = [text]

    def __call__(self, A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The released sum (C, m) of the per-client augmented statistics ``A`` (K, C, m)."""
        dp = self.dp
        A = np.asarray(A, dtype=np.float64)
        if dp is not None:
            A = dp.bound_uploads(A)
            if dp.placement == "local":
                A = dp.backend.add_gaussian(A, dp.sigma, rng)
        K = A.shape[0]
        present = K
        if self.protocol is None:
            total = A.sum(axis=0)
        else:
            run = self.protocol.secure_sum(rng)
            total = run(A)
            call = dict(run.calls[0])
            present = int(call.get("uploaded", K))
            self.calls.append(call)
            self.views.append(run.views[0])
        if dp is not None:
            if dp.placement == "central":
                total = dp.backend.add_gaussian(total, dp.sigma, rng)
                scale = dp.sigma
            elif dp.placement == "distributed":
                scale = dp.sigma * math.sqrt(present / (K - dp.tolerate))
                self._note()
            else:
                scale = dp.sigma  # every uploaded row carries its own full sigma
            dp.record_release(scale)
        return total

    def report(self) -> dict | None:
        """Protocol, parameters, per-round calls (uploaders, dropouts, bytes) and threat model; None without one."""
        if self.protocol is None:
            return None
        up = [c["upload_bytes_mean"] for c in self.calls]
        return {
            "protocol": self.kind,
            "parameters": self.protocol.parameters(),
            "rounds": len(self.calls),
            "calls": [{k: v for k, v in c.items() if k != "seconds"} for c in self.calls],
            "upload_bytes_per_client_round": float(np.mean(up)) if up else 0.0,
            "threat_model": self.protocol.threat_model,
        }


def noise_generator(noise_seed: int | None, stream: int) -> np.random.Generator:
    """The generator of a run's noise: fresh OS entropy, or (seeded simulation) derived from ``noise_seed``."""
    if noise_seed is None:
        return np.random.default_rng()  # OS entropy
    return np.random.default_rng([int(noise_seed), stream])
