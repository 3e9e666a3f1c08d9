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
:mod:`privfed.pipeline`).  Who adds the noise:

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
import warnings
from collections.abc import Mapping

import numpy as np

from mechanisms.accounting import ACCOUNTANTS, calibrate_round_mu, ledger_epsilon
from mechanisms.backends import NoiseBackend, get_backend
from mechanisms.calibration import check_budget
from mechanisms.clipping import CLIP_NORMS, Clipping, check_bound
from mechanisms.ledger import NEIGHBOURING, PrivacyLedger, PrivacyReport, ReleaseEvent, format_up
from mechanisms.sensitivity import RECORD_BOUNDS, StatisticSensitivity, block_sigmas
from privfed.errors import ConfigError, InputError
from privfed.stats import ClientStats, compute_client_stats

__all__ = ["BLOCKS", "GaussianMechanism"]

#: Largest clip accepted: N c^2 and its noise stay finite in float64 for any N below 1e100 records.
MAX_CLIP = 1e100

#: Statistic blocks the mechanism can noise.
BLOCKS = ("sums", "counts", "second")
_LEVELS = tuple(NEIGHBOURING)
_CALIBRATIONS = ("analytic", "classic")


class GaussianMechanism:
    """Gaussian noise on clipped class sums, counts and second moments.

    Parameters
    ----------
    epsilon : float
        Target epsilon (> 0) over all ``rounds``; ``float('inf')`` adds no
        noise (clipping still applies) and reports no DP guarantee.
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
        order c / mu); a dict of positive weights otherwise.
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
    """

    name = "gaussian"

    def __init__(
        self,
        *,
        epsilon: float,
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
    ) -> None:
        self.epsilon, self.delta = check_budget(epsilon, delta)
        self.clip_bound = check_bound(clip)
        if not (self.clip_bound <= MAX_CLIP or math.isinf(self.epsilon)):  # no noise: nothing to calibrate
            raise ConfigError(
                f"clip={clip!r} is beyond {MAX_CLIP:g}: second moments (c^2 per record) and their noise would "
                "overflow float64 for some datasets and not others; rescale the features (e.g. divide them by a "
                "public constant) and pick a clip <= 1e100"
            )
        if level not in _LEVELS:
            raise ConfigError(f"level must be one of {list(_LEVELS)}, got level={level!r}")
        self.level = level
        blocks = tuple(blocks)
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
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
            raise ConfigError(f"rounds must be an integer >= 1, got rounds={rounds!r}")
        self.rounds = int(rounds)
        try:
            q = float(sampling_rate)
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
            if (
                isinstance(max_records, bool)
                or not isinstance(max_records, (int, np.integer))
                or max_records < 1
            ):
                raise ConfigError(f"max_records must be an integer >= 1, got max_records={max_records!r}")
            if level == "record" and record_bound != "upload":
                raise ConfigError(
                    f"max_records={max_records!r} bounds a whole client's contribution and applies at "
                    "level='client' only; at level='record' every record is its own unit: drop max_records"
                )
        self.max_records = None if max_records is None else int(max_records)
        if (
            isinstance(dropout_tolerance, bool)
            or not isinstance(dropout_tolerance, (int, np.integer))
            or (dropout_tolerance < 0)
        ):
            raise ConfigError(f"dropout_tolerance must be an integer >= 0, got {dropout_tolerance!r}")
        self.dropout_tolerance = int(dropout_tolerance)
        if dim is not None and (not isinstance(dim, (int, np.integer)) or dim < 1):
            raise ConfigError(f"dim must be a positive integer, got dim={dim!r}")
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
        self._notes: list[str] = []
        self._weights = self._split_weights(split)
        self._mu_round, self._calibrated_by = self._round_mu()
        self._dim: int | None = None
        self._sigma: dict[str, float] | None = None
        self._sens: dict[str, float] | None = None
        self._base_sens: dict[str, float] = {}
        # Rounding backends (OpenDP) add a slack that depends on d: calibrate once d is known.
        slack_free = self.backend.sensitivity_slack(1, "l2") == 0
        if dim is not None or (clip_norm == "l2" and slack_free):
            self._resolve(int(dim) if dim is not None else None)

    # -- calibration ---------------------------------------------------------
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
        w = {b: float(split[b]) for b in self.blocks}
        if any(not (v > 0 and math.isfinite(v)) for v in w.values()):
            raise ConfigError(f"split weights must be finite and > 0, got {w}")
        s = sum(w.values())
        return {b: v / s for b, v in w.items()}

    def _round_mu(self) -> tuple[float, str]:
        if math.isinf(self.epsilon):
            return math.inf, "none (epsilon = inf)"
        if self.calibration == "classic":
            if self.epsilon > 1:
                warnings.warn(
                    f"calibration='classic' is only proven for epsilon < 1 (got epsilon={self.epsilon}); the "
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
        sens = bound.per_block(self.blocks)
        self._base_sens = dict(sens)
        joint = bound.joint()
        if dim is not None and any(self._slack(b, dim) for b in self.blocks):
            # Rounding to the backend's grid moves each coordinate that differs between neighbours by
            # at most grid/2 on each side: calibrate for Delta + slack over the coordinates that move.
            sens = {b: sens[b] + self._slack(b, dim) for b in self.blocks}
            joint = math.sqrt(sum(v * v for v in sens.values()))
        self._sens = sens
        self._joint_sens = joint
        self._sigma = block_sigmas(sens, self._mu_round, self._weights, joint=joint)
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
        if self.level == "record":
            return per_class  # one record moves one class row
        if num_classes is None:
            raise ConfigError("client-level rounding slack needs the number of classes; release once first")
        return per_class * num_classes

    def _slack(self, block: str, dim: int, num_classes: int | None = None) -> float:
        if self.backend.sensitivity_slack(1, "l2") == 0:
            return 0.0
        if self.level == "client" and num_classes is None and block != "second":
            num_classes = self._num_classes
            if num_classes is None:
                return 0.0  # resolved again at the first release, when C is known
        return self.backend.sensitivity_slack(self._moving(block, dim, num_classes), "l2")

    _num_classes: int | None = None

    def _ensure(self, dim: int) -> None:
        if self._sigma is None:
            self._resolve(dim)
        elif self.clipping.norm == "coordinate" and self._dim != dim:
            raise InputError(
                f"features have d={dim} but the mechanism was calibrated for d={self._dim} "
                "(coordinate clipping's sensitivity b sqrt(d) depends on d)"
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

    # -- noise -----------------------------------------------------------------
    def _noisy(
        self,
        stats: ClientStats,
        rng: np.random.Generator,
        relation: str,
        *,
        share: float = 1.0,
        copies: int = 1,
        sampling_rate: float = 1.0,
    ) -> ClientStats:
        """Add noise to every row of every block and record one release in the ledger.

        Each row gets N(0, share * sigma_b^2); ``share = 1/K`` when K clients
        split the noise of one sum (the ledger records the sigma_b the sum
        carries).  ``copies`` independent releases are recorded as that many
        rounds.  ``sampling_rate`` is the Poisson rate this release was actually sampled at (the ledger
        credits amplification only for sampling that happened).
        """
        self._ensure(stats.dim)
        if (
            self.level == "client"
            and self._num_classes != stats.num_classes
            and self.backend.sensitivity_slack(1, "l2") > 0
        ):
            self._num_classes = stats.num_classes
            self._resolve(stats.dim)
        rid = self.ledger.new_release()
        if self._weights == "augmented":
            return self._noisy_augmented(stats, rng, relation, share, copies, sampling_rate, rid)
        out: dict[str, np.ndarray] = {}
        for block in self.blocks:
            arr = getattr(stats, block)
            if arr is None:
                continue
            s = self._sigma[block]
            out[block] = self._add_noise(arr, block, s * math.sqrt(share), rng)
            # The sensitivity includes the backend's rounding slack (calibrated for in _resolve).
            # Each call is ONE release; ``rounds`` is what sigma was calibrated for, not what happened.
            self.ledger.record(
                ReleaseEvent(
                    mechanism="gaussian" if s > 0 else "none",
                    block=block,
                    sensitivity=self._sens[block],
                    scale=s,
                    relation=relation,
                    rounds=copies,
                    sampling_rate=sampling_rate,
                    release_id=rid,
                )
            )
        return stats.with_arrays(**out)

    def _noisy_augmented(self, stats, rng, relation, share, copies, sampling_rate, rid) -> ClientStats:
        """One draw on FedLog's augmented statistic [counts, sums] (K, C, d + 1), one event of its sensitivity."""
        s = self._sigma["sums"]
        A = np.concatenate([stats.counts[..., None], stats.sums], axis=-1)
        A = self._add_noise(A, "augmented", s * math.sqrt(share), rng)
        self.ledger.record(
            ReleaseEvent(
                mechanism="gaussian" if s > 0 else "none",
                block="augmented",
                sensitivity=self._joint_sens,
                scale=s,
                relation=relation,
                rounds=copies,
                sampling_rate=sampling_rate,
                release_id=rid,
            )
        )
        return stats.with_arrays(counts=A[..., 0].copy(), sums=A[..., 1:].copy())

    def _add_noise(self, arr: np.ndarray, block: str, sigma: float, rng: np.random.Generator) -> np.ndarray:
        if sigma == 0:
            return np.array(arr, dtype=np.float64)
        if block != "second":
            return self.backend.add_gaussian(arr, sigma, rng)
        # Symmetric matrices: noise the upper triangle (with diagonal) and mirror it.
        d = arr.shape[-1]
        iu = np.triu_indices(d)
        upper = self.backend.add_gaussian(arr[..., iu[0], iu[1]], sigma, rng)
        out = np.empty(arr.shape, dtype=np.float64)
        out[..., iu[0], iu[1]] = upper
        out[..., iu[1], iu[0]] = upper
        return out

    def _bound_clients(self, stats: ClientStats) -> ClientStats:
        """Client level: scale each client's statistics to at most ``max_records`` records' worth.

        Client k's counts, sums and second moments are all multiplied by
        min(1, n_max / n_k) before anything is summed, each client kept
        separate (:meth:`ClientStats.scale_clients`), so secure aggregation and
        sampling still see one bounded upload per client whatever its size.
        """
        if stats.is_materialised("counts"):
            n_k = stats.counts.sum(axis=1)
        else:  # the pair layout: no (K, C, d) view
            n_k = np.bincount(stats.pair_client, weights=stats.pair_counts, minlength=stats.num_clients)
        factor = np.minimum(1.0, self.max_records / np.where(n_k > 0, n_k, 1.0))
        if np.all(factor == 1.0):
            return stats
        return stats.scale_clients(factor)

    # -- direct release ----------------------------------------------------------
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
        if not isinstance(rng, np.random.Generator):
            raise ConfigError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self._refuse_sampling()
        self._seeded = True  # the caller's Generator drives the noise: a simulation
        self._placements.append("local")
        F = self.clip(np.asarray(features, dtype=np.float64))
        fields = ("counts", "sums", "second") if "second" in self.blocks else ("counts", "sums")
        stats = compute_client_stats(F, labels, None, num_classes=num_classes, fields=fields)
        n = 1 if draws is None else int(draws)
        if n < 1:
            raise ConfigError(f"draws must be >= 1, got draws={draws!r}")
        if n > 1:
            stats = ClientStats(**{k: np.repeat(v, n, axis=0) for k, v in stats.arrays().items()})
        return self._noisy(stats, rng, self.level, copies=n)

    # -- privacy hook protocol (privfed.pipeline) -------------------------------
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
                f"method {name!r} is refused under DP: {regroups}, which no per-record sensitivity bounds"
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
        self._secure = secure_agg is not None
        self._secagg = secure_agg
        if self.level == "client":
            if not (self.trusted_aggregator or self._secure):
                raise ConfigError(
                    "level='client' needs noise on the aggregate: pass trusted_aggregator=True (the server is "
                    "trusted to add it) or a secure_agg protocol (clients split the noise)"
                )
            if per_client:
                raise ConfigError(
                    f"method {name!r} needs every client's individual statistics; client-level DP protects "
                    "whole clients only through noise on a sum; use a sum-only method (fedncm, fed3r, "
                    "fed3r-within, fedcgs, fedlog)"
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

    def _refuse_sampling(self, why: str = "this release path does not subsample clients") -> None:
        if self.sampling_rate < 1:
            raise ConfigError(
                f"sampling_rate={self.sampling_rate} credits amplification by Poisson client sampling, but "
                f"{why}: the noise would not meet the stated guarantee; use sampling_rate=1, or sample "
                "clients with GaussianMechanism(..., level='client', trusted_aggregator=True, "
                "sampling_rate=q) and a sum-only method without secure_agg"
            )

    def _check_sampling(self, name: str, per_client: bool, secure_agg) -> None:
        """Poisson client sampling amplifies only where the server cannot tell who is in the sum."""
        if self.sampling_rate == 1:
            return
        if secure_agg is not None:
            self._refuse_sampling(
                "under secure aggregation the server runs the protocol with the clients "
                "that upload, so it sees who was sampled (amplification does not hold)"
            )
        if per_client or not self.trusted_aggregator:
            self._refuse_sampling(
                f"with local noise (method {name!r}"
                f"{'' if self.trusted_aggregator else ', no trusted aggregator'}) the server "
                "sees each upload and so who was sampled (amplification does not hold)"
            )
        if self.level != "client":
            self._refuse_sampling(
                "client sampling amplifies only client-level guarantees: at record level "
                "the rest of a record's client shows in the sum whether it was sampled, so "
                "only delta is amplified"
            )

    def _poisson_sample(self, stats: ClientStats, rng: np.random.Generator) -> ClientStats:
        """The trusted aggregator keeps each client's upload with probability q, independently.

        The draw comes from fresh OS entropy unless the run is a declared seeded simulation; the kept set
        is neither returned nor stored (only the noisy sum of the kept clients leaves the aggregator).
        """
        gen = rng if self._seeded is not False else np.random.default_rng()  # default_rng(): OS entropy
        self._sampling_seeded = self._sampling_seeded or self._seeded is not False
        keep = gen.random(stats.num_clients) < self.sampling_rate
        self._sampled_pending += 1
        return stats.scale_clients(keep.astype(np.float64))

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

    def before_upload(self, stats: ClientStats, method, rng: np.random.Generator) -> ClientStats:
        """Client side: bound (client level) and noise each upload where clients add the noise."""
        per_client = bool(getattr(method, "per_client", False))
        if self.record_bound == "upload":
            stats = self._bound_clients(stats)
        if self.level == "client":
            stats = self._bound_clients(stats)
            if self._secure:
                return self._distributed(stats, rng)
            if self.sampling_rate < 1 and self.trusted_aggregator and not per_client:
                return self._poisson_sample(stats, rng)  # the aggregator's sampling, before the sum
            return stats
        if self._secure:
            return self._distributed(stats, rng)
        if self.trusted_aggregator and not per_client:
            return stats
        self._placements.append("local")
        return self._noisy(stats, rng, "record")

    # -- record level, local noise, streamed: one release, noised chunk by chunk ----------------
    def streams_upload(self, method) -> bool:
        """Whether each client noises its own upload and the server needs only their sum.

        Record level without a trusted aggregator or secure aggregation, and a
        method that aggregates sums (``per_client = False``): the uploads can be
        noised and folded a chunk of clients at a time
        (:meth:`fold_local_upload`), memory independent of K.
        """
        return (
            self.level == "record"
            and self.record_bound == "theorem"
            and self._weights != "augmented"
            and not self._secure
            and not self.trusted_aggregator
            and not bool(getattr(method, "per_client", False))
        )

    def streams_pairs(self, method) -> bool:
        """Whether each client noises its own upload and a per-client method folds the noisy uploads.

        Record level without a trusted aggregator or secure aggregation, and a
        per-client method with a streamed server (FedCOF's ``aggregate_stream``):
        the noisy counts of every client come first (K C values), then the
        noisy sums a chunk of clients at a time (:meth:`local_upload_stream`).
        """
        return (
            self.level == "record"
            and self.record_bound == "theorem"
            and self._weights != "augmented"
            and not self._secure
            and not self.trusted_aggregator
            and bool(getattr(method, "per_client", False))
            and callable(getattr(method, "aggregate_stream", None))
        )

    def local_upload_stream(
        self, stats: ClientStats, rng: np.random.Generator, *, chunk_bytes: int | None = None
    ):
        """(counts, sum chunks): the clients' noisy uploads, for :meth:`streams_pairs` methods.

        One release, as :meth:`local_noise_blocks` (``order=("counts", "sums")``):
        the (K, C) noisy counts of every client, then an iterator of
        ``(k0, k1, sums)`` with the noisy (k1 - k0, C, d) sums of clients
        k0..k1-1, each drawn when the server asks for it.
        """
        stream = self.local_noise_blocks(stats, rng, chunk_bytes=chunk_bytes, order=("counts", "sums"))
        parts, first = [], None  # blocks always hold "counts" and "sums": every count chunk comes first
        for item in stream:
            if item[0] != "counts":
                first = item
                break
            parts.append(item[3])
        counts = np.concatenate(parts)

        def sums():
            yield first[1:]
            for _, k0, k1, values in stream:
                yield k0, k1, values

        return counts, sums()

    def local_noise_blocks(
        self,
        stats: ClientStats,
        rng: np.random.Generator,
        *,
        chunk_bytes: int | None = None,
        order: tuple[str, ...] | None = None,
    ):
        """The clients' noisy uploads (record level, local noise), one block and chunk of clients at a time.

        Every client noises every class it could hold (zeros included) and its
        second moment when released: its upload is C (d + 1) (+ d^2) values
        whatever it holds.  The whole stream is the ONE release
        :meth:`before_upload` makes, booked in the ledger when the stream
        starts, with the same noise drawn in the same order: block by block
        (``sums``, ``counts``, ``second``), clients in order within a block,
        so the values equal ``before_upload``'s bit for bit whatever
        ``chunk_bytes`` is (a chunk holds at most that many bytes of one
        block's dense uploads, at least one client; ``None``: all at once).
        ``order`` draws the blocks in another order (the same distribution,
        other values): a server that needs every count before the sums.

        Yields
        ------
        (block, k0, k1, values)
            ``values`` are the noisy ``block`` uploads of clients ``k0..k1-1``.
        """
        self._ensure(stats.dim)
        K, C, d = stats.num_clients, stats.num_classes, stats.dim
        booked = [b for b in self.blocks if b in stats.available]
        blocks = [b for b in (order or self.blocks) if b in booked]
        rid = self.ledger.new_release()
        for block in booked:  # the ledger lists the blocks as before_upload does, whatever the draw order
            s = self._sigma[block]
            self.ledger.record(
                ReleaseEvent(
                    mechanism="gaussian" if s > 0 else "none",
                    block=block,
                    sensitivity=self._sens[block],
                    scale=s,
                    relation="record",
                    rounds=1,
                    sampling_rate=self.sampling_rate,
                    release_id=rid,
                )
            )
        self._placements.append("local")
        per_client = {"sums": C * d, "counts": C, "second": d * d}
        for block in blocks:
            step = K if chunk_bytes is None else max(1, int(chunk_bytes) // (8 * per_client[block]))
            for k0 in range(0, K, step):
                k1 = min(K, k0 + step)
                values = _client_block(stats, block, k0, k1)
                yield block, k0, k1, self._add_noise(values, block, self._sigma[block], rng)

    def fold_local_upload(
        self,
        stats: ClientStats,
        method,
        rng: np.random.Generator,
        *,
        chunk_bytes: int | None = None,
        observe=None,
    ) -> ClientStats:
        """The sum of the clients' noisy uploads, folded chunk by chunk (:meth:`local_noise_blocks`).

        Memory O(chunk + C d + d^2), independent of K; no (K, C, d) stack.
        Returns the aggregate (K = 1) that summing :meth:`before_upload`'s
        output gives (same noise values, summed in the same client order).
        ``observe(block, k0, k1, values)``, if given, sees every chunk of
        uploads as the server receives it (an audit recording them).
        """
        C, d = stats.num_classes, stats.dim
        total = {"sums": np.zeros((C, d)), "counts": np.zeros(C), "second": np.zeros((d, d))}
        kept = 0
        for block, k0, k1, values in self.local_noise_blocks(stats, rng, chunk_bytes=chunk_bytes):
            if observe is not None:
                observe(block, k0, k1, values)
            for row in values:  # clients in order: the summation order of one (K, ...) reduction
                total[block] += row
            if block == "counts":
                kept += int(np.count_nonzero(values > 0))
        second = total["second"][None] if "second" in stats.available and "second" in self.blocks else None
        out = ClientStats(counts=total["counts"][None], sums=total["sums"][None], second=second)
        object.__setattr__(out, "folded_pairs", kept)
        return out

    def _distributed(self, stats: ClientStats, rng: np.random.Generator) -> ClientStats:
        """Every client adds its share sigma^2 / (K - t); what reaches the sum is settled in :meth:`report`."""
        K = stats.num_clients
        out = self._noisy(stats, rng, self.level, share=self._share(K))
        self._pending_secure.append(
            (self.ledger._next_id, K, self._share(K), getattr(self._secagg, "last_run", None))
        )
        self._placements.append("distributed")
        return out

    # -- the same release split across processes (a Flower node and its server) ------------------------
    def node_release(self, stats: ClientStats, num_clients: int, rng: np.random.Generator) -> ClientStats:
        """One node's upload under secure aggregation, as :meth:`before_upload` makes every client's in ``fit``.

        At client level the node's statistics are first bounded to ``max_records`` records' worth; the node
        then adds its share sigma^2 / (K - t) of the noise (K = ``num_clients``; ConfigError when K <= t)
        and the release is booked in this mechanism's ledger.
        """
        if self.bounds_uploads:
            stats = self._bound_clients(stats)
        return self._noisy(stats, rng, self.level, share=self._share(int(num_clients)))

    def book_distributed(self, events: list[dict], num_clients: int, protocol) -> None:
        """The server's side of :meth:`node_release`: book the nodes' release once, settled in :meth:`report`.

        ``events`` are one node's release events (every node books the same); ``protocol`` stands for
        the secure-sum protocol: its ``last_run.calls`` (each with ``uploaded``) say whose shares reached
        each sum once it ran, as for ``fit``.
        """
        rid = self.ledger.new_release()
        for e in events:
            self.ledger.record(
                ReleaseEvent(**{**{k: v for k, v in e.items() if k != "release_id"}, "release_id": rid})
            )
        K = int(num_clients)
        self._pending_secure.append((rid, K, self._share(K), getattr(protocol, "last_run", None)))
        self._secagg = protocol
        self.record_placement("distributed")

    def _settle_secure(self) -> None:
        """Rewrite distributed releases with the noise that actually reached the sum.

        Each of the K clients added sigma^2 / (K - t); only the shares of clients whose upload entered
        the sum protect it, so a release with U uploaders carries U / (K - t) sigma^2.
        """
        if not self._pending_secure:
            return
        still = []
        for rid, K, share, run in self._pending_secure:
            current = getattr(self._secagg, "last_run", None)
            calls = getattr(current, "calls", None) if current is not run else None
            if not calls:
                still.append((rid, K, share, run))
                continue
            present = min(int(c.get("uploaded", K)) for c in calls)
            factor = math.sqrt(present * share)
            self.ledger.events = [
                e
                if e.release_id != rid
                else ReleaseEvent(
                    mechanism=e.mechanism,
                    block=e.block,
                    sensitivity=e.sensitivity,
                    scale=e.scale * factor,
                    relation=e.relation,
                    rounds=e.rounds,
                    sampling_rate=e.sampling_rate,
                    release_id=rid,
                )
                for e in self.ledger.events
            ]
            self._settled.append((present, K))
        self._pending_secure = still

    def _share(self, K: int) -> float:
        """Fraction of sigma^2 each of K clients adds so that K - t of them carry all of it."""
        if K - self.dropout_tolerance < 1:
            raise ConfigError(
                f"dropout_tolerance={self.dropout_tolerance} needs more than that many clients, got K={K}"
            )
        return 1.0 / (K - self.dropout_tolerance)

    def after_aggregate(self, total: ClientStats, method, rng: np.random.Generator) -> ClientStats:
        """Server side: noise on the sum when a trusted aggregator adds it."""
        if self.trusted_aggregator and not self._secure:
            q = 1.0
            if self.sampling_rate < 1:
                if not self._sampled_pending:
                    self._refuse_sampling("no client sampling preceded this sum")
                self._sampled_pending -= 1
                q = self.sampling_rate
            self._placements.append("central")
            return self._noisy(total, rng, self.level, sampling_rate=q)
        return total

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

    # -- report --------------------------------------------------------------------
    def report(self) -> PrivacyReport:
        """The guarantee of every release recorded so far, computed from the ledger."""
        self._settle_secure()
        events = self.ledger.events
        eps, acc = ledger_epsilon(events, self.delta, self.accountant)
        notes = []
        placement = (
            "none"
            if not self._placements
            else (
                self._placements[0]
                if len(set(self._placements)) == 1
                else "mixed: " + ", ".join(sorted(set(self._placements)))
            )
        )
        # OpenDP draws from the OS CSPRNG whatever the seed: only a seeded numpy backend is replayable.
        sampled = any(e.sampling_rate < 1 for e in events)
        simulation = self._seeded is not False and (not self.backend.secure or self._sampling_seeded)
        if simulation and events:
            notes.append(
                "SIMULATION, NOT A RELEASE: the noise was drawn from a seed (or a caller's Generator) and can be "
                "replayed by anyone who knows it; run with random_state=None (fresh OS entropy) or "
                "backend='opendp' for a release"
            )
        # A protocol whose key material comes from a seed (PairwiseMasking(key_seed=...)): whoever knows the
        # seed removes the masks and sees every client's upload with only its own noise share.
        key_seed = getattr(self._secagg, "key_seed", None)
        if key_seed is not None and events:
            simulation = True
            notes.append(
                f"SIMULATION, NOT A RELEASE: secure aggregation ran with key_seed={key_seed!r}; its masks are "
                "replayable from the seed, so against anyone who knows it each upload is seen with its own "
                "noise share only (the guarantee above does not hold against them); use key_seed=None"
            )
        if "distributed" in self._placements:
            t = self.dropout_tolerance
            notes.append(
                f"noise split across the K clients (each adds sigma^2/(K - {t})); holds while secure aggregation "
                "hides individual uploads; epsilon is computed from the shares that reached the sum; "
                "against the server plus c colluding clients (who know their own "
                "shares) only the other shares count"
            )
            for present, K in self._settled:
                if present < K - t:
                    notes.append(
                        f"only {present} of {K} clients' noise shares reached the sum (more than the tolerated "
                        f"{t} dropped): the noise present is {present}/{K - t} of sigma^2 and epsilon is "
                        "recomputed from it"
                    )
        if sampled:
            notes.append(
                f"the trusted aggregator kept each client in the sum independently with probability "
                f"{self.sampling_rate:g} ({'seeded simulation' if self._sampling_seeded else 'OS entropy'}); "
                "which clients, and how many, is not released; epsilon credits amplification by Poisson "
                "subsampling"
            )
        if self.record_bound == "upload":
            notes.append(
                f"each client's upload bounded to max_records={self.max_records} records' worth; sensitivity "
                "= its diameter 2 n_max Delta (valid when the features come from bodies trained on the records)"
            )
        if self.level == "client":
            notes.append(
                f"each client's contribution is bounded to max_records={self.max_records} records' worth"
            )
            notes.append("neighbouring clients: " + NEIGHBOURING["client"])
        if "central" in self._placements:
            notes.append("noise on the aggregate is added by a trusted aggregator (it sees exact statistics)")
        if "local" in self._placements:
            notes.append("each client adds the full noise to its own upload (local DP at record level)")
        if self.rounds > 1 and events:
            releases = len({e.release_id for e in events})
            notes.append(
                f"noise calibrated so that {self.rounds} releases together meet the target epsilon="
                f"{self.epsilon:g}; {releases} recorded so far (epsilon above is for those)"
            )
        if self.backend.sensitivity_slack(1, "l2") > 0 and self._base_sens:
            notes.append(
                "sensitivity includes the rounding slack of backend "
                f"{self.backend.name!r} over the coordinates that move (calibrated for)"
            )
        if not self.backend.secure and math.isfinite(self.epsilon):
            notes.append(
                "floating-point noise (backend 'numpy'): not hardened against floating-point attacks"
            )
        if self.calibration == "classic" and self.epsilon > 1:
            notes.append("classic calibration outside its proven range (epsilon > 1)")
        lvl = NEIGHBOURING[self.level]
        if not events:
            guarantee = "nothing released yet"
        elif math.isinf(eps):
            guarantee = (
                f"NO DP GUARANTEE: no noise (epsilon = inf); statistics clipped to {self.clip_bound} "
                f"({self.clipping.norm}) but released exactly"
            )
        else:
            releases = len({e.release_id for e in events})
            guarantee = (
                ("SIMULATION (seeded noise, replayable): " if simulation else "")
                + f"({format_up(eps)}, {format_up(self.delta)})-DP at {self.level} level ({lvl})"
                + f" over {releases} release(s)"
                + f"; Gaussian noise ({placement}) on {', '.join(self.blocks)}"
                + (
                    f"; clients Poisson-sampled at rate {self.sampling_rate:g} (amplification credited)"
                    if sampled
                    else ""
                )
                + f"; accountant: {acc}"
            )
        return PrivacyReport(
            epsilon=eps,
            delta=self.delta,
            level=self.level,
            mechanism=f"gaussian ({self.clipping.norm} clip {self.clip_bound})",
            calibration=self._calibrated_by,
            sigma=dict(self._sigma or {}),
            sensitivity=dict(self._sens or {}),
            rounds=self.rounds,
            sampling_rate=min((e.sampling_rate for e in events), default=self.sampling_rate),
            accountant=acc,
            guarantee=guarantee,
            target_epsilon=self.epsilon,
            num_events=len(events),
            notes=tuple(notes),
            placement=placement,
            simulation=bool(simulation and events),
        )

    def __repr__(self) -> str:
        return (
            f"GaussianMechanism(epsilon={self.epsilon}, delta={self.delta}, clip={self.clip_bound}, "
            f"level={self.level!r}, blocks={self.blocks}, calibration={self.calibration!r}, "
            f"clip_norm={self.clipping.norm!r}, rounds={self.rounds}"
            + (f", record_bound={self.record_bound!r}" if self.record_bound != "theorem" else "")
            + ")"
        )


def _client_block(stats: ClientStats, block: str, k0: int, k1: int) -> np.ndarray:
    """Dense ``block`` of clients k0..k1-1, built from what ``stats`` stores (no other block copied)."""
    if (k0, k1) == (0, stats.num_clients) or stats.is_materialised(block):
        return getattr(stats, block)[k0:k1]
    if block == "second":
        return stats.clients(np.arange(k0, k1)).second
    pc = stats.pair_client  # sorted by client
    a, b = np.searchsorted(pc, [k0, k1])
    if block == "counts":
        out = np.zeros((k1 - k0, stats.num_classes))
        out[pc[a:b] - k0, stats.pair_class[a:b]] = stats.pair_counts[a:b]
    else:
        out = np.zeros((k1 - k0, stats.num_classes, stats.dim))
        out[pc[a:b] - k0, stats.pair_class[a:b]] = stats.pair_sums[a:b]
    return out
