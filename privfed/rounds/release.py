"""Multi-round FedLog's release: each round one run of the release plan, the rounds composed from its traces.

:class:`RoundsDP` holds the privacy settings of a run of R releases and builds the one
:class:`~mechanisms.dp.gaussian.mechanism.GaussianMechanism` that noises every round: FedLog's augmented statistic
(the class sums of [1, f], ``split="augmented"``: one sigma, one draw), calibrated by the mechanism
over the R releases for the sensitivity the bound implies (:class:`mechanisms.dp.sensitivity.StatisticSensitivity`:
Theorem 3.1's Delta for frozen bodies, 2 n_max Delta for bodies trained on the records, n_max Delta at
client level).  :class:`RoundRelease` runs one round's per-client statistics through the
:class:`~privfed.release.ReleasePlan` of (FedLog, that mechanism, the round's secure aggregation):
the same stages ``privfed.fit`` runs, each round leaving its :class:`~privfed.release.ReleaseTrace`.
:func:`privfed.rounds.report.rounds_report` composes the traces' events into the guarantee.
:func:`noise_generator` gives a run's noise source: OS entropy, or a seeded simulation that says so.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from mechanisms.dp.calibration import check_count
from privfed._validation import check_real_dtype
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError, InputError
from privfed.methods.fedlog import FedLog
from privfed.rounds.bodies import FEATURE_DIM
from privfed.rounds.report import RoundsPrivacyReport, rounds_report, trace_events
from privfed.stats import ClientStats

__all__ = [
    "SECURE_CHOICES",
    "AugmentedFedLog",
    "RoundRelease",
    "RoundsDP",
    "RoundsPrivacyReport",
    "augmented",
    "distributed_note",
    "noise_generator",
    "released_statistic",
]

PLACEMENTS = ("central", "distributed", "local")
CALIBRATIONS = ("total", "paper")
BOUNDS = ("auto", "upload", "theorem")
SECURE_CHOICES = ("auto", "none", "mask", "ckks")


def augmented(stats: ClientStats) -> np.ndarray:
    """FedLog's augmented statistic [n_c, s_c] of every row of ``stats``: (K, C, d + 1), counts in column 0."""
    return np.concatenate([stats.counts[..., None], stats.sums], axis=-1)


class AugmentedFedLog(FedLog):
    """FedLog whose clients upload the augmented statistic [n_c, s_c] (C, d + 1) as one vector.

    Under secure aggregation the server learns one secure sum of the (K, C, d + 1) uploads (one
    protocol call a round: its masked vectors are the clients' whole uploads).
    """

    def secure_aggregate(self, stats: ClientStats, secure_sum):
        total = np.asarray(secure_sum(augmented(stats)), dtype=np.float64)
        return self.aggregate(ClientStats(counts=total[None, :, 0], sums=total[None, :, 1:]))


def released_statistic(trace) -> np.ndarray:
    """The (C, d + 1) statistic a round released, read from its trace (what the head was fit on)."""
    view = trace.release_view()
    if view.kind == "secure-sums":
        return np.asarray(view.arrays[0], dtype=np.float64)
    if view.stats is None:
        raise ConfigError(f"the round's trace kept no released statistic (server received {view.kind!r})")
    total = view.stats if view.stats.num_clients == 1 else view.stats.total()
    return augmented(total)[0]


def _positive_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {name}={value!r}")
    return int(value)


class RoundsDP:
    """The privacy settings of R releases of the augmented FedLog statistic, and the mechanism they build.

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
        sigma^2/(K - t) under secure aggregation, or every client the full sigma.
    calibration : {"total", "paper"}
        ``total``: the mechanism's analytic calibration over R releases (exact in GDP); ``paper``: its
        classic calibration for one release (Theorem 3.1), the same epsilon every round.
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
        t: clients whose distributed noise share may be missing (dropouts, colluders).

    Attributes
    ----------
    mechanism : GaussianMechanism
        The mechanism every round's plan runs (its ledger books each release).
    traces : list of ReleaseTrace
        Every round's trace, appended by :class:`RoundRelease`; :meth:`report` composes their events.
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
        from mechanisms.dp.calibration import check_budget
        from mechanisms.dp.gaussian.mechanism import GaussianMechanism

        self.epsilon, self.delta = check_budget(epsilon, delta, allow_inf=False)
        self.rounds = _positive_int("rounds", rounds, 1)
        if level not in ("record", "client"):
            raise ConfigError(f"level must be 'record' or 'client', got level={level!r}")
        if placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {list(PLACEMENTS)}, got placement={placement!r}")
        if level == "client" and placement == "local":
            raise ConfigError(
                "level='client' needs noise on the aggregate: use placement='central' (trusted "
                "server) or 'distributed' (secure aggregation)"
            )
        if calibration not in CALIBRATIONS:
            raise ConfigError(
                f"calibration must be one of {list(CALIBRATIONS)}, got calibration={calibration!r}"
            )
        if record_bound not in BOUNDS:
            raise ConfigError(
                f"record_bound must be one of {list(BOUNDS)}, got record_bound={record_bound!r}"
            )
        if not isinstance(bodies_trained, (bool, np.bool_)):  # "no" is a non-empty string: it read as True
            raise ConfigError(f"bodies_trained must be True or False, got bodies_trained={bodies_trained!r}")
        if record_bound == "auto":
            record_bound = "upload" if bodies_trained else "theorem"
        self.level, self.placement, self.calibration = level, placement, calibration
        self.record_bound = record_bound if level == "record" else "client"
        self.tolerate = _positive_int("tolerate", tolerate, 0)
        self.bodies_trained = bool(bodies_trained)
        self.dim = _positive_int("dim", dim, 1)  # 2.7 was cut to 2, "3" read as 3
        if self.record_bound != "theorem":
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
        with warnings.catch_warnings():  # the report notes a classic sigma outside its proven range
            warnings.filterwarnings("ignore", message="calibration='classic' is only proven")
            self.mechanism = GaussianMechanism(
                epsilon=self.epsilon,
                delta=self.delta,
                clip=clip,
                level=level,
                blocks=("sums", "counts"),
                calibration="analytic" if calibration == "total" else "classic",
                clip_norm=clip_norm,
                rounds=self.rounds if calibration == "total" else 1,
                split="augmented",
                trusted_aggregator=placement == "central",
                max_records=None if self.record_bound == "theorem" else self.max_records,
                record_bound="upload" if self.record_bound == "upload" else "theorem",
                dropout_tolerance=self.tolerate,
                dim=self.dim,
            )
        self.clipping = self.mechanism.clipping
        self.backend = self.mechanism.backend
        self.sensitivity = self.mechanism.joint_sensitivity
        self.sigma = self.mechanism.sigma["sums"]
        how = self.mechanism.calibration_method
        self.calibration_text = (
            f"{how.split(', ', 1)[0]}, total budget over {self.rounds} release(s), {how.split(', ', 1)[-1]}"
            if calibration == "total"
            else "classic sigma per release (Theorem 3.1), the same epsilon every round"
        )
        self.accountant_check = bool(accountant_check)
        self.traces: list[Any] = []
        self.secure_notes: list[str] = []
        self.extra_notes: list[str] = []
        # None: not declared (a caller's Generator drove the noise: taken as a simulation)
        self.seeded: bool | None = None
        self.noise_seed: int | None = None

    def use_backend(self, backend, *, num_classes: int | None = None) -> None:
        """Draw the rounds' noise from ``backend`` (``"numpy"``, ``"opendp"`` or a backend object),
        recalibrated for its rounding slack at the same mu (:meth:`GaussianMechanism.set_backend`; a bounded
        upload's slack needs ``num_classes``)."""
        self.mechanism.set_backend(backend, dim=self.dim, num_classes=num_classes)
        self.backend = self.mechanism.backend
        self.sensitivity = self.mechanism.joint_sensitivity
        self.sigma = self.mechanism.sigma["sums"]

    def declare_randomness(self, *, seeded: bool, noise_seed: int | None = None) -> None:
        """Whether the noise comes from a seed (a replayable seeded simulation) or from OS entropy."""
        self.seeded = bool(seeded) if self.seeded is None else (self.seeded or bool(seeded))
        self.mechanism.declare_randomness(seeded=bool(seeded))
        if noise_seed is not None:
            self.noise_seed = int(noise_seed)

    @property
    def ledger(self):
        """The mechanism's ledger: every release booked so far."""
        return self.mechanism.ledger

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

    def upload_factors(self, A: np.ndarray) -> np.ndarray:
        """min(1, n_max / n_k): the mechanism's scaling of client k's upload (ones under the theorem bound)."""
        n_k = np.asarray(A)[..., 0].sum(axis=-1)
        if not self.mechanism.bounds_uploads:
            return np.ones_like(n_k)
        return np.minimum(1.0, self.max_records / np.where(n_k > 0, n_k, 1.0))

    def bound_uploads(self, A: np.ndarray) -> np.ndarray:
        """Client k's augmented statistic A_k (C, m) scaled as the mechanism bounds it before release."""
        A = np.asarray(A, dtype=np.float64)
        return A * self.upload_factors(A)[..., None, None]

    def composed_epsilon(self) -> float:
        """Epsilon of the releases traced so far, GDP only (cheap: for per-round curves)."""
        from mechanisms.dp.accounting import ledger_epsilon

        events = trace_events(self.traces)
        return ledger_epsilon(events, self.delta, "gdp")[0] if events else 0.0

    def report(self) -> RoundsPrivacyReport:
        """The guarantee of the releases traced so far (GDP exact; PLD cross-check for mu <= 8)."""
        return rounds_report(self, self.traces)


class RoundRelease:
    """One round's release: the per-client statistics through the release plan, one trace a round.

    Parameters
    ----------
    dp : RoundsDP or None
        The noise (None: no DP).  ``placement="distributed"`` needs a secure
        aggregation protocol: every client adds its share N(0, sigma^2/(K - t))
        before masking or encryption, t = ``dp.tolerate``.
    secure_agg : {"none", "mask", "ckks"}
        ``mask``: privfed's pairwise masking (:class:`mechanisms.secagg.protection.PairwiseMasking`,
        fresh X25519 keys from the OS CSPRNG every round, fixed point with
        ``frac_bits`` fractional bits); ``ckks``: CKKS through TenSEAL
        (:class:`mechanisms.secagg.protection.CKKSAggregation`); ``none``: the server
        sums the uploads it sees in clear.
    num_clients : int
    dropouts : int
        Clients that drop out of every round's secure sum (masking only), drawn
        per round from the release generator, in ``dropout_phase``.
    dropout_phase : {"before_upload", "after_upload"}
    frac_bits : int
        Fixed-point fractional bits of the masking protocol.
    nu : float
        FedLog's prior pseudo-count (the server's head).

    Each call is one release: the plan's stages bound, noise and sum the uploads, the mechanism books
    the noise present in the sum (only the shares of clients whose upload entered it), and the round's
    :class:`~privfed.release.ReleaseTrace` is kept in :attr:`traces` (and ``dp.traces``).
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
        nu: float = 1.0,
    ) -> None:
        from mechanisms.secagg.protection import CKKSAggregation, PairwiseMasking
        from privfed.release import ReleasePlan

        if secure_agg not in SECURE_CHOICES[1:]:
            raise ConfigError(
                f"secure_agg must be one of {list(SECURE_CHOICES[1:])}, got secure_agg={secure_agg!r}"
            )
        K = check_count(num_clients, "num_clients")  # '3' or 0 was taken
        self.dp, self.kind, self.num_clients = dp, secure_agg, K
        distributed = dp is not None and dp.placement == "distributed"
        if distributed and secure_agg == "none":
            raise ConfigError(
                "placement='distributed' splits the noise across clients and needs secure aggregation "
                "to hide each client's upload: use secure_agg='mask' or 'ckks'"
            )
        if dp is not None and not distributed and secure_agg != "none":
            raise ConfigError(
                f"placement={dp.placement!r} with secure_agg={secure_agg!r}: under secure aggregation the "
                "clients split the noise of the sum; use placement='distributed' (or secure_agg='none')"
            )
        if dropouts and secure_agg != "mask":
            raise ConfigError(
                f"dropouts={dropouts} are simulated by the masking protocol only: use secure_agg='mask'"
            )
        if distributed and not 0 <= dp.tolerate < K:
            raise ConfigError(
                f"tolerate must lie in [0, num_clients - 1 = {K - 1}], got tolerate={dp.tolerate}"
            )
        self.protocol = None
        if secure_agg == "mask":
            self.protocol = PairwiseMasking(
                frac_bits=frac_bits, dropouts=dropouts, dropout_phase=dropout_phase
            )
        elif secure_agg == "ckks":
            self.protocol = CKKSAggregation()
        self.method = AugmentedFedLog(nu=nu)
        self.plan = ReleasePlan.build(self.method, None if dp is None else dp.mechanism, self.protocol)
        self.traces: list[Any] = []
        self.calls: list[dict] = []
        self.views: list[Any] = []
        if distributed:
            self._note()

    def _note(self) -> None:
        self.dp.secure_notes[:] = [
            distributed_note(self.dp, self.kind, self.num_clients, [c["uploaded"] for c in self.calls])
        ]

    def release(self, A: np.ndarray, rng: np.random.Generator):
        """Run the round's plan on the per-client statistics ``A`` (K, C, m): the head, with ``head.trace``."""
        check_generator(rng)
        try:
            check_real_dtype(np.asarray(A), "a round's statistics")  # complex, bool, text: never cast
            A = np.asarray(A, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(
                f"a round's statistics must be a (num_clients, C, d + 1) array of numbers, got {A!r:.60}"
            ) from None
        if A.ndim != 3 or A.shape[0] != self.num_clients:
            raise ConfigError(
                f"a round's statistics must be (num_clients={self.num_clients}, C, d + 1), got shape {A.shape}"
            )
        dp = self.dp
        if dp is not None:
            _check_releasable(A, dp)
        stats = ClientStats(counts=A[:, :, 0].copy(), sums=A[:, :, 1:].copy())
        seeded = dp is None or dp.seeded is not False
        head = self.plan.release(stats, num_clients=self.num_clients, rng=rng, seeded=seeded)
        self.traces.append(head.trace)
        if dp is not None:
            dp.traces.append(head.trace)
        if self.protocol is not None:
            run = self.protocol.last_run
            self.calls.append(dict(run.calls[0]))
            self.views.append(run.views[0])
            if dp is not None and dp.placement == "distributed":
                self._note()
        return head

    def __call__(self, A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The released sum (C, m) of the per-client augmented statistics ``A`` (K, C, m)."""
        return released_statistic(self.release(A, rng).trace)

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


def _check_releasable(A: np.ndarray, dp: RoundsDP) -> None:
    """Refuse a release the guarantee does not cover: one past the ``rounds`` releases ``dp`` is calibrated
    and accounted for, or statistics no clipped records give (a count below 0, a sum past count x b in a
    coordinate: every feature a release is calibrated for lies in [-b, b], or has norm at most b)."""
    if len(dp.traces) >= dp.rounds:
        raise ConfigError(
            f"this RoundsDP covers {dp.rounds} release(s) and {len(dp.traces)} were made: another would spend "
            "budget the guarantee does not have; make a RoundsDP for more rounds"
        )
    counts, sums = A[:, :, 0], A[:, :, 1:]
    if not np.isfinite(A).all() or (counts < 0).any():
        raise InputError(
            "a round's statistics hold NaN/inf or a negative count; release clipped records' sums"
        )
    # the bodies clip in float32 (a saturated feature is float32(b), up to 6e-8 of it above b) and sum the
    # features in float32: the slack is float32 rounding's, orders below an unclipped feature's excess
    b = max(float(dp.mechanism.clip_bound), float(np.float32(dp.mechanism.clip_bound)))
    l2 = dp.mechanism.clipping.norm == "l2"
    reach = (
        (np.linalg.norm(sums, axis=2) if l2 else np.abs(sums).max(axis=2, initial=0.0))
        if sums.size
        else 0 * counts
    )
    over = reach > counts * b * (1 + 1e-5) + 1e-9
    if over.any():
        k, c = (int(i) for i in np.argwhere(over)[0])
        raise InputError(
            f"client {k}'s statistic for class {c} sums to {reach[k, c]:.4g} "
            f"{'in norm' if l2 else 'in a coordinate'}, past its {counts[k, c]:g} records x clip {b:g}: the "
            "guarantee is for clipped features; clip them first (the clip the RoundsDP was made with)"
        )


def distributed_note(dp: RoundsDP, kind: str, num_clients: int, present: list[int]) -> str:
    """The note of distributed noise under ``kind`` (mask, ckks): the shares, and how few reached a sum.

    ``present[r]`` is the number of noise shares in round r's sum; the Flower server states the same note
    from the uploaders of its masked sums.
    """
    K = int(num_clients)
    text = (
        f"each client adds N(0, sigma^2/(K - {dp.tolerate})) to its upload before "
        f"{'pairwise masking' if kind == 'mask' else 'CKKS encryption'}; the server sees only the "
        "masked uploads and their sum; epsilon is computed from the shares that reached each sum"
    )
    if present and min(present) < K:
        text += (
            f" (as few as {min(present)} of {K} shares present in a round: "
            f"{min(present)}/{K - dp.tolerate} of sigma^2)"
        )
    return text + (
        "; against the server plus c colluding clients (who know their own shares) only the others count"
    )


def noise_generator(noise_seed: int | None, stream: int) -> np.random.Generator:
    """The generator of a run's noise: fresh OS entropy, or (seeded simulation) derived from ``noise_seed``."""
    if noise_seed is None:
        return np.random.default_rng()  # OS entropy
    return np.random.default_rng([check_count(noise_seed, "noise_seed", low=0), stream])
