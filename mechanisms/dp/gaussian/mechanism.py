"""Gaussian mechanism on clipped client statistics (record or client level).

Releases class sums, class counts and (optionally) the second moment of
clipped features with Gaussian noise (Dwork & Roth 2014, App. A; tight
calibration by the analytic Gaussian of Balle & Wang 2018; composition over
rounds exact in GDP, Dong, Roth & Su 2019, or by an accountant with client
subsampling).  FedLog's Theorem 3.1 (Yu et al.) is the special case
``clip_norm="coordinate"``, ``split="joint"``, ``calibration="classic"``.

Neighbouring relation and sensitivities (docs: privacy), with every record clipped to ||f||_2 <= c (or to
[-b, b] per coordinate, so ||f||_2 <= c := b sqrt(d)):

============  ==============================  ===============================
block         record level (add/remove one)   client level (add/remove one
                                              client of <= n_max records)
============  ==============================  ===============================
``sums``      c                               n_max c
``counts``    1                               n_max
``second``    c^2 (Frobenius)                 n_max c^2
============  ==============================  ===============================

The budget (eps, delta) is turned into one GDP mu over all rounds (exactly);
each round gets mu_round = mu / sqrt(T) (or an accountant's value when
clients are subsampled at rate q < 1), split across blocks in mu^2:
sigma_b = Delta_b / (mu_round sqrt(w_b)).  The default ``split="equal"`` gives
every block the same share (w_b = 1/B), so the counts get noise of order
1/mu whatever the clip; ``split="joint"`` takes
w_b proportional to Delta_b^2, i.e. one sigma for all blocks, the Gaussian
mechanism on the concatenated statistic with sensitivity sqrt(sum Delta_b^2)
(FedLog's phi (x) e_y with the counts as the constant coordinate).

The same object is the ``privacy`` hook of :func:`privfed.fit` (see
:mod:`privfed.release.pipeline`).  Who adds the noise:

* record level, no trusted aggregator, no secure aggregation: every client
  noises its own upload with the full sigma (the server sees each upload
  with N(0, sigma^2) and, for sum-only methods, a sum with K sigma^2);
* record level with ``trusted_aggregator=True`` and a sum-only method: noise
  is added once, to the sum;
* with secure aggregation (sum-only methods): every client adds
  N(0, sigma^2 / K), so the sum carries sigma^2 when all K uploads arrive;
* client level (neighbours: one client's data replaced by none, the
  client still taking part, so the set of clients is public): each
  client's statistics are first bounded to at most
  ``max_records`` records' worth (a client with n_k > n_max records has all
  its statistics multiplied by n_max / n_k, done client-side before upload);
  noise is then added to the sum by a trusted aggregator, or split across
  clients under secure aggregation.  Methods needing individual uploads
  (FedCOF) are refused at client level.

Means are only ever post-processing of noisy sums and noisy counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from mechanisms.dp.accounting import ACCOUNTANTS
from mechanisms.dp.backends import NoiseBackend, get_backend
from mechanisms.dp.calibration import as_real, check_budget, check_count, check_rounds
from mechanisms.dp.clipping import CLIP_NORMS, Clipping, check_bound, check_noise_clip
from mechanisms.dp.gaussian.calibration import (
    GaussianCalibration,
    check_noise_multiplier,
    noise_multiplier_epsilon,
)
from mechanisms.dp.gaussian.clients import ClientBounding
from mechanisms.dp.gaussian.noise import GaussianNoise
from mechanisms.dp.gaussian.report import GaussianReport
from mechanisms.dp.ledger import NEIGHBOURING, PrivacyLedger
from mechanisms.dp.params import Parameters
from mechanisms.dp.sensitivity import RECORD_BOUNDS
from privfed._validation import check_features
from privfed._validation.seeds import check_generator
from privfed.errors import ConfigError, InputError
from privfed.stats import ClientStats, compute_client_stats

__all__ = ["BLOCKS", "GaussianMechanism"]


#: Statistic blocks the mechanism can noise.
BLOCKS = ("sums", "counts", "second")
_LEVELS = tuple(NEIGHBOURING)
_CALIBRATIONS = ("analytic", "classic")


class GaussianMechanism(Parameters, GaussianCalibration, GaussianNoise, ClientBounding, GaussianReport):
    """Gaussian noise on clipped class sums, counts and second moments.

    Parameters
    ----------
    epsilon : float
        Target epsilon (> 0) over all ``rounds``; ``float('inf')`` adds no
        noise (clipping still applies) and reports no DP guarantee.  Give
        ``epsilon`` or ``noise_multiplier``, not both.
    delta : float
        Target delta in (0, 1).
    clip : float
        The clipping bound (required, never estimated from data): L2 norm c
        for ``clip_norm="l2"``, coordinate bound b for ``"coordinate"``.
    level : {"record", "client"}
        Neighbouring relation: add/remove one record, or one whole client.
    blocks : tuple of str
        Statistics to noise: ``("sums", "counts")`` or with ``"second"``
        (needed by fed3r, fed3r-within, fedcgs).  ``sums`` and ``counts``
        are always released, so both must be present.
    calibration : {"analytic", "classic"}
        Exact analytic Gaussian (default) or the classic bound (FedLog
        paper; warns for eps > 1).
    clip_norm : {"l2", "coordinate"}
    rounds : int
        Number of identical releases T the budget must cover: sigma is
        calibrated so that T releases together meet (epsilon, delta).  The
        ledger books the releases that actually happen (one per fit), so the
        report after k < T fits states the smaller epsilon of those k.
    sampling_rate : float
        Poisson client sampling rate q of each release.  With q < 1 the
        trusted aggregator keeps each client's upload in the sum
        independently with probability q (fresh OS entropy; a seeded run
        samples from its seed and is a simulation), never reveals which
        clients (nor how many) were kept, and the report credits
        amplification by Poisson subsampling (dp-accounting's PLD of a
        ``PoissonSampledDpEvent`` of the Gaussian).  Amplification holds
        only where the server cannot see who is in the sum, and only for
        neighbours that differ in one sampled unit, so q < 1 needs
        ``level="client"``, ``trusted_aggregator=True``, a sum-only method
        and no secure aggregation; anything else is refused.
    split : "equal", "joint" or mapping block -> weight
        How mu^2 is shared across blocks (see module docstring): ``"equal"``
        (default) the same share per block; ``"joint"`` one sigma for all
        blocks (the Gaussian on the concatenated statistic, FedLog's
        Theorem 3.1; with a large clip c it buries the counts under noise of
        order c / mu); ``"augmented"`` the same one sigma, drawn as FedLog's
        augmented statistic [counts, sums] (C, d + 1) in one draw and booked as
        one event of its joint sensitivity (multi-round FedLog's release; no
        streamed local release); a dict of positive weights otherwise.
    trusted_aggregator : bool
        Whether the server may add the noise to the sum (central DP).
    max_records : int, optional
        Client level only: the most records a client contributes (its
        statistics are scaled down beyond that).  Required at client level.
    dropout_tolerance : int
        With secure aggregation: each client adds N(0, sigma^2 / (K - t))
        so that the guarantee survives up to t = ``dropout_tolerance``
        dropped clients (the noise actually present never falls below sigma^2).
    dim : int, optional
        Feature dimension d; needed up front only for ``clip_norm="coordinate"``
        (sensitivity b sqrt(d)), otherwise learnt at the first release.
    accountant : {"auto", "gdp", "pld", "prv", "rdp"}
        Accountant for calibration with q < 1 and for the report.
    backend : str or NoiseBackend, optional
        ``"numpy"`` (default, fast, warns) or ``"opendp"`` (exact samplers).
    noise_multiplier : float, optional
        Instead of ``epsilon``, as Opacus users give it: each round's noise is
        ``noise_multiplier`` times the sensitivity of the released statistic
        (one round is ``(1 / noise_multiplier)``-GDP over all blocks together;
        with ``split="joint"`` every block's sigma is ``noise_multiplier``
        times the joint L2 sensitivity).  ``epsilon`` is then the one the
        ``rounds`` releases give at ``delta``, computed exactly
        (``gdp_epsilon(sqrt(rounds) / noise_multiplier, delta)``).  Needs the
        analytic calibration and no subsampling.
    record_bound : {"theorem", "upload"}
        Record level: ``"theorem"`` (default) bounds one record's move by its
        clipped norm, valid when the features do not depend on the private
        records; ``"upload"`` is for features from bodies trained on them (one
        record moves its client's whole upload): every client's upload is
        scaled to at most ``max_records`` records' worth (required) and the
        sensitivity is its diameter, 2 ``max_records`` times the record's
        (:class:`mechanisms.dp.sensitivity.StatisticSensitivity`).

    Attributes
    ----------
    sigma : dict
        Noise standard deviation per block (of one upload with full noise).
    sensitivity : dict
        L2 sensitivity per block under ``level``.
    ledger : PrivacyLedger
        Every release made so far; :meth:`report` is computed from it.

    Examples
    --------
    >>> mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=10.0)
    >>> round(mech.sigma["sums"] / mech.sigma["counts"], 6)  # equal shares of mu^2: ratio of sensitivities
    10.0
    >>> opacus_style = GaussianMechanism(noise_multiplier=1.0, delta=1e-5, clip=10.0, split="joint")
    >>> opacus_style.sigma["sums"] == 1.0 * opacus_style.joint_sensitivity, round(opacus_style.epsilon, 3)
    (True, 4.377)
    """

    name = "gaussian"

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float,
        clip: float,
        level: str = "record",
        blocks: tuple[str, ...] = ("sums", "counts"),
        calibration: str = "analytic",
        clip_norm: str = "l2",
        rounds: int = 1,
        sampling_rate: float = 1.0,
        split: str | Mapping[str, float] = "equal",
        trusted_aggregator: bool = False,
        max_records: int | None = None,
        dropout_tolerance: int = 0,
        dim: int | None = None,
        accountant: str = "auto",
        backend: str | NoiseBackend | None = None,
        record_bound: str = "theorem",
        noise_multiplier: float | None = None,
    ) -> None:
        self.rounds = check_rounds(rounds)
        z = None
        if noise_multiplier is not None:
            z = check_noise_multiplier(noise_multiplier, epsilon, calibration, sampling_rate)
            check_budget(1.0, delta)  # delta's own checks, with their messages
            epsilon = noise_multiplier_epsilon(z, self.rounds, delta)
        elif epsilon is None:
            raise ConfigError(
                "GaussianMechanism needs a budget: epsilon=... (the noise is calibrated to it) or "
                "noise_multiplier=... (epsilon is computed from it)"
            )
        self.noise_multiplier_given = z
        self.epsilon, self.delta = check_budget(epsilon, delta)
        self.clip_bound = check_bound(clip)
        if math.isfinite(self.epsilon):  # no noise: nothing to calibrate, any clip is taken
            check_noise_clip(self.clip_bound, clip)
        if level not in _LEVELS:
            raise ConfigError(f"level must be one of {list(_LEVELS)}, got level={level!r}")
        self.level = level
        blocks = (
            tuple(blocks) if isinstance(blocks, (tuple, list)) else (blocks,)
        )  # None or "sums": named below
        bad = [b for b in blocks if b not in BLOCKS]
        if bad or len(set(blocks)) != len(blocks):
            raise ConfigError(f"blocks must be distinct names from {list(BLOCKS)}, got blocks={blocks!r}")
        if not {"sums", "counts"} <= set(blocks):
            raise ConfigError(
                f"blocks must include 'sums' and 'counts' (every release carries both), got blocks={blocks!r}"
            )
        self.blocks = tuple(b for b in BLOCKS if b in blocks)
        if calibration not in _CALIBRATIONS:
            raise ConfigError(f"calibration must be one of {list(_CALIBRATIONS)}, got {calibration!r}")
        self.calibration = calibration
        if clip_norm not in CLIP_NORMS:
            raise ConfigError(f"clip_norm must be one of {list(CLIP_NORMS)}, got clip_norm={clip_norm!r}")
        self.clipping = Clipping(self.clip_bound, clip_norm)
        try:
            q = as_real(sampling_rate)
        except (TypeError, ValueError):
            raise ConfigError(
                f"sampling_rate must be a number in (0, 1], got sampling_rate={sampling_rate!r}"
            ) from None
        if not 0 < q <= 1:
            raise ConfigError(f"sampling_rate must lie in (0, 1], got sampling_rate={sampling_rate!r}")
        self.sampling_rate = q
        if calibration == "classic" and q < 1:
            raise ConfigError("calibration='classic' has no subsampled version; use calibration='analytic'")
        if accountant not in ACCOUNTANTS:
            raise ConfigError(f"accountant must be one of {list(ACCOUNTANTS)}, got {accountant!r}")
        if accountant == "gdp" and q < 1:
            raise ConfigError(
                "accountant='gdp' is exact only without subsampling; use 'pld', 'prv' or 'rdp' for q < 1"
            )
        self.accountant = accountant
        self.split = split
        if not isinstance(trusted_aggregator, (bool, np.bool_)):  # "no" is a non-empty string: truthy
            raise ConfigError(f"trusted_aggregator must be True or False, got {trusted_aggregator!r}")
        self.trusted_aggregator = bool(trusted_aggregator)
        if record_bound not in RECORD_BOUNDS:
            raise ConfigError(
                f"record_bound must be one of {list(RECORD_BOUNDS)}, got record_bound={record_bound!r}"
            )
        if record_bound == "upload" and level != "record":
            raise ConfigError(
                "record_bound='upload' is a record-level bound (bodies trained on the records); at "
                "level='client' the bound is max_records records' worth already: drop record_bound"
            )
        self.record_bound = record_bound
        if record_bound == "upload" and max_records is None:
            raise ConfigError(
                "record_bound='upload' needs max_records (every client's upload is bounded to that many "
                "records' worth, sensitivity 2 max_records Delta); e.g. max_records=100"
            )
        if level == "client" and max_records is None:
            raise ConfigError(
                "level='client' needs max_records (the most records one client contributes) to bound "
                "a client's contribution; e.g. GaussianMechanism(..., level='client', max_records=500)"
            )
        if max_records is not None:
            check_count(max_records, "max_records")
            if level == "record" and record_bound != "upload":
                raise ConfigError(
                    f"max_records={max_records!r} bounds a whole client's contribution and applies at "
                    "level='client' only; at level='record' every record is its own unit: drop max_records"
                )
        self.max_records = None if max_records is None else int(max_records)
        self.dropout_tolerance = check_count(dropout_tolerance, "dropout_tolerance", low=0)
        if dim is not None:  # True was a dim of 1
            check_count(dim, "dim")
        self.backend = get_backend(backend)
        self.ledger = PrivacyLedger()
        self._secure = False
        self._secagg = None
        self._pending_secure: list[tuple[int, int, float, object]] = []
        self._placements: list[str] = []
        self._seeded: bool | None = None
        self._sampled_pending = 0
        self._sampling_seeded = False
        self._settled: list[tuple[int, int]] = []
        self._split: list[list[int]] = []  # part sizes of a secure sum whose uploaders' graph split
        self._notes: list[str] = []
        self._weights = self._split_weights(split)
        self._mu_round, self._calibrated_by = (
            (1.0 / z, f"noise multiplier {z:g} (epsilon computed: gdp, exact)")
            if z is not None
            else self._round_mu()
        )
        self._dim: int | None = None
        self._sigma: dict[str, float] | None = None
        self._sens: dict[str, float] | None = None
        self._base_sens: dict[str, float] = {}
        # Rounding backends (OpenDP) add a slack that depends on d: calibrate once d is known.
        slack_free = self.backend.sensitivity_slack(1, "l2") == 0
        if dim is not None or (clip_norm == "l2" and slack_free):
            self._resolve(int(dim) if dim is not None else None)

    @property
    def noise_multiplier(self) -> float:
        """Each round's noise over the sensitivity of the whole released statistic, 1 / mu (Opacus' word)."""
        return 1.0 / self._mu_round if self._mu_round > 0 else math.inf

    def release(
        self,
        features,
        labels,
        *,
        rng: np.random.Generator,
        num_classes: int | None = None,
        draws: int | None = None,
    ) -> ClientStats:
        """Noisy clipped statistics of ONE client (record level).

        Parameters
        ----------
        features : array, shape (n, d)
        labels : int array, shape (n,)
        rng : numpy.random.Generator
        num_classes : int, optional
        draws : int, optional
            Independent releases to draw at once (vectorised, for audits);
            each is recorded in the ledger.

        Returns
        -------
        ClientStats
            ``K = 1`` (or ``K = draws``): noisy ``counts``, ``sums`` (and
            ``second`` when in ``blocks``).
        """
        check_generator(rng)
        n = 1 if draws is None else check_count(draws, "draws")  # 2.7 booked 2 draws, True one
        self._refuse_sampling()
        self._seeded = True  # the caller's Generator drives the noise: a simulation
        raw = check_features(features)  # complex, object, text or non-finite data refused, never cast
        self._placements.append("local")
        F = self.clip(raw)
        fields = ("counts", "sums", "second") if "second" in self.blocks else ("counts", "sums")
        stats = compute_client_stats(F, labels, None, num_classes=num_classes, fields=fields)
        if n > 1:
            stats = ClientStats(**{k: np.repeat(v, n, axis=0) for k, v in stats.arrays().items()})
        return self._noisy(stats, rng, self.level, copies=n)

    def check(self, method, secure_agg) -> None:
        """Refuse settings under which the stated guarantee would not hold.

        A method that uploads the second moment (fed3r, fed3r-within, fedcgs)
        is refused unless ``blocks`` includes ``"second"``, and ``"second"``
        is refused for methods that do not upload it: the budget split is
        never changed behind the caller's back.  Client level needs a trusted
        aggregator or secure aggregation and a sum-only method; DP noise on
        FedCOF's two-round secure protocol is refused.
        """
        name = getattr(method, "name", repr(method))
        requires = set(getattr(method, "requires", ()))
        per_client = bool(getattr(method, "per_client", False))
        if getattr(secure_agg, "noise", None) is not None:
            raise ConfigError(
                "the secure_agg protocol carries its own DistributedGaussian noise; with a privacy mechanism "
                "the clients already split the mechanism's noise: drop noise= from the protocol"
            )
        regroups = getattr(method, "regrouping", lambda: None)()
        if regroups:
            raise ConfigError(
                f"method {name!r} is refused under DP: no per-record sensitivity bounds its release, since {regroups}"
            )
        if "class_second" in requires:
            raise ConfigError(
                f"method {name!r} uploads per-class second moments, which this mechanism does not noise; "
                "use fedcof (means and counts) or fed3r-within (summed second moment) instead"
            )
        if "second" in requires and "second" not in self.blocks:
            raise ConfigError(
                f"method {name!r} uploads the second moment, which this mechanism does not noise; construct "
                "GaussianMechanism(..., blocks=('sums', 'counts', 'second'))"
            )
        if "second" in self.blocks and "second" not in requires:
            raise ConfigError(
                f"method {name!r} does not use the second moment but blocks includes 'second' (budget spent on "
                "nothing); use blocks=('sums', 'counts')"
            )
        if self.trusted_aggregator and secure_agg is not None:
            raise ConfigError(
                f"trusted_aggregator=True contradicts secure_agg={getattr(secure_agg, 'name', secure_agg)!r}: a "
                "trusted aggregator sees the exact sum, which secure aggregation hides from the server; drop one "
                "of them"
            )
        self._secure = secure_agg is not None
        self._secagg = secure_agg
        if self.level == "client":
            if per_client:  # first: no place for the noise makes such a method work at client level
                raise ConfigError(
                    f"method {name!r} needs every client's individual statistics; client-level DP protects "
                    "whole clients only through noise on a sum; use a sum-only method (fedncm, fed3r, "
                    "fed3r-within, fedcgs, fedlog)"
                )
            if not (self.trusted_aggregator or self._secure):
                raise ConfigError(
                    "level='client' needs noise on the aggregate: pass trusted_aggregator=True (the server is "
                    "trusted to add it) or a secure_agg protocol (clients split the noise)"
                )
        if self._secure and per_client:
            raise ConfigError(
                f"noise on method {name!r}'s secure protocol is not supported (its second round has no bounded "
                "sensitivity); use fed3r-within for secure aggregation with DP, or drop secure_agg"
            )
        self._check_sampling(name, per_client, secure_agg)

    def sent_pairs(self, stats: ClientStats, uploaded: ClientStats) -> int:
        """(client, class) pairs sent: every client sends every class under DP (zeros noised too)."""
        return stats.num_clients * stats.num_classes

    def declare_randomness(self, *, seeded: bool) -> None:
        """Whether the noise of the next release comes from a seed (a replayable simulation).

        :func:`privfed.fit` declares it; a release driven by a caller's Generator without a
        declaration is taken as a simulation.  Once seeded, the ledger stays a simulation.
        """
        self._seeded = bool(seeded) if self._seeded is None else (self._seeded or bool(seeded))

    def clip(self, features: np.ndarray) -> np.ndarray:
        """Clip every record (the bound all sensitivities rest on)."""
        F = np.asarray(features, dtype=np.float64)
        if F.ndim != 2:
            raise InputError(f"features must be a 2-D (N, d) array, got shape {F.shape}")
        self._ensure(F.shape[1])
        return self.clipping(F)

    @property
    def feature_transform(self) -> Clipping:
        """The same clipping, applied to test features so train and test match."""
        return self.clipping

    def record_placement(self, placement: str) -> None:
        """Record where noise was added when another process added it (a Flower node noising its upload).

        ``placement`` is ``"local"``, ``"central"`` or ``"distributed"``; the report states it.
        """
        if placement not in ("local", "central", "distributed"):
            raise ConfigError(f"placement must be 'local', 'central' or 'distributed', got {placement!r}")
        self._placements.append(placement)

    def __repr__(self) -> str:
        return (
            f"GaussianMechanism(epsilon={self.epsilon}, delta={self.delta}, clip={self.clip_bound}, "
            f"level={self.level!r}, blocks={self.blocks}, calibration={self.calibration!r}, "
            f"clip_norm={self.clipping.norm!r}, rounds={self.rounds}"
            + (f", record_bound={self.record_bound!r}" if self.record_bound != "theorem" else "")
            + ")"
        )
