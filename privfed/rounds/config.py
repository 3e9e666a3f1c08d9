"""The settings and the outcome of a multi-round FedLog run (:func:`privfed.rounds.run_rounds`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mechanisms.dp.calibration import as_real, check_budget, check_count, check_nonnegative
from mechanisms.secagg.threat import default_threshold
from privfed.errors import ConfigError
from privfed.federation import available_schemes
from privfed.rounds.bodies import FAMILIES
from privfed.rounds.release import BOUNDS, CALIBRATIONS, PLACEMENTS, SECURE_CHOICES, RoundsPrivacyReport

__all__ = ["DEFAULT_MAX_RECORDS", "RoundsConfig", "RoundsResult"]

#: Public default of n_max (``max_records``) when the caller gives none: a fixed number, never read from the data
#: (clients holding more records are scaled down to DEFAULT_MAX_RECORDS records' worth).
DEFAULT_MAX_RECORDS = 100


def _names(name: str, value) -> tuple:
    """A setting that lists names, as a tuple: one string is one name (not its letters); None is no list."""
    if isinstance(value, str):
        return (value,)
    if value is None or not hasattr(value, "__iter__"):
        raise ConfigError(f"{name} must be a list of names, got {name}={value!r}")
    return tuple(value)


@dataclass(frozen=True)
class RoundsConfig:
    """Every setting of a multi-round FedLog run (defaults: the paper's MNIST recipe on digits)."""

    clients: int = 20
    rounds: int = 10
    local_epochs: int = 5
    batch_size: int = 10
    lr: float = 1e-3
    families: tuple[str, ...] = FAMILIES
    init: str = "public"
    partition: str = "shards"
    classes_per_client: int = 2
    alpha: float = 0.1
    seed: int = 0
    nu: float = 1.0
    head_init_scale: float | None = None
    #: baselines run beside FedLog only when asked (each costs a run of its own: timing["<name>_s"])
    baselines: tuple[str, ...] = ()
    fedavg_family: str = "cnn"
    # privacy (epsilon = inf: none)
    epsilon: float = math.inf
    delta: float = 1e-5
    level: str = "record"
    placement: str = "central"
    calibration: str = "total"
    record_bound: str = "auto"
    clip: float = 2.0
    clip_norm: str = "coordinate"
    #: n_max of the client bound; None: the public default DEFAULT_MAX_RECORDS (never the data's largest client)
    max_records: int | None = None
    #: None: every release's noise from fresh OS entropy; an int: a reproducible seeded simulation
    noise_seed: int | None = None
    # secure aggregation of every round's release ("auto": masking when placement is distributed)
    secure_agg: str = "auto"
    dropouts: int = 0
    dropout_phase: str = "before_upload"
    tolerate: int = 0
    # membership attacks across the rounds (attacks.rounds): member / holdout pairs tested, 0 for none
    attack_pairs: int = 0

    def validate(self) -> RoundsConfig:
        def pos_int(name, low=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {name}={v!r}")

        # inf is the run without noise; -inf, NaN, 0 or a string is no budget (-inf once ran without noise)
        try:
            eps = as_real(self.epsilon)
        except (TypeError, ValueError):
            raise ConfigError(
                f"epsilon must be a number > 0 (inf for no noise), got epsilon={self.epsilon!r}"
            ) from None
        if not eps > 0:
            raise ConfigError(f"epsilon must be > 0 (inf for no noise), got epsilon={self.epsilon!r}")
        if math.isfinite(eps):
            check_budget(eps, self.delta)
        # checked with or without noise: a misspelt setting of a run without DP is no less misspelt
        for name, allowed in (
            ("level", ("record", "client")),
            ("placement", PLACEMENTS),
            ("calibration", CALIBRATIONS),
            ("record_bound", BOUNDS),
            ("clip_norm", ("coordinate", "l2")),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} must be one of {list(allowed)}, got {name}={getattr(self, name)!r}"
                )
        schemes = [p for p in available_schemes() if p != "natural"]  # digits' split: no file's own clients
        if self.partition not in schemes:
            raise ConfigError(
                f"partition must be one of {schemes} (multi-round FedLog splits digits), got "
                f"partition={self.partition!r}"
            )
        check_count(self.rounds, "rounds")  # 10**20 rounds would run the release-free run first, for ever
        pos_int("clients")
        pos_int("batch_size")  # -1 trained on nothing (an empty range of batches), 0 was range()'s error
        pos_int("local_epochs", 0)
        pos_int("seed", 0)
        if self.noise_seed is not None:
            pos_int("noise_seed", 0)
            if self.noise_seed >= 2**64:  # as a Flower run takes it, so that a seeded run replays there
                raise ConfigError(f"noise_seed must be below 2**64, got noise_seed={self.noise_seed}")
        if self.max_records is not None:
            pos_int("max_records")

        # numbers, never a bool (lr=True trained at 1.0) or a string
        if check_nonnegative(self.lr, "lr") == 0:
            raise ConfigError("lr must be > 0, got lr=0")
        check_nonnegative(self.nu, "nu")
        # checked without noise too (as the names above): a clip of NaN or an alpha of "x" is no setting
        for name in ("clip", "alpha"):
            if check_nonnegative(getattr(self, name), name) == 0:
                raise ConfigError(f"{name} must be a finite number > 0, got {name}={getattr(self, name)!r}")
        pos_int("classes_per_client")
        if self.head_init_scale is not None:
            check_nonnegative(self.head_init_scale, "head_init_scale")  # 0: a zero initial head
        if self.init not in ("public", "scratch"):
            raise ConfigError(
                f"init must be 'public' (trained on the public split) or 'scratch', got {self.init!r}"
            )
        fams = _names("families", self.families)
        if not fams or any(f not in FAMILIES for f in fams):
            raise ConfigError(f"families must be a non-empty list from {list(FAMILIES)}, got {list(fams)}")
        if self.fedavg_family not in FAMILIES:
            raise ConfigError(f"fedavg_family must be one of {list(FAMILIES)}, got {self.fedavg_family!r}")
        baselines = _names("baselines", self.baselines)
        bad = [b for b in baselines if b not in ("oneshot", "local", "fedavg")]
        if bad:
            raise ConfigError(f"unknown baseline(s) {bad}; choose from ['oneshot', 'local', 'fedavg']")
        if self.secure_agg not in SECURE_CHOICES:
            raise ConfigError(
                f"secure_agg must be one of {list(SECURE_CHOICES)}, got secure_agg={self.secure_agg!r}"
            )
        pos_int("dropouts", 0)
        pos_int("tolerate", 0)
        if self.tolerate and (self.placement != "distributed" or not math.isfinite(eps)):
            raise ConfigError(
                f"tolerate={self.tolerate} sizes the noise shares of distributed noise (placement='distributed' "
                f"under DP); with placement={self.placement!r}{'' if math.isfinite(eps) else ' and no noise'} it "
                "would be ignored: drop it"
            )
        pos_int("attack_pairs", 0)
        if self.dropout_phase not in ("before_upload", "after_upload"):
            raise ConfigError(
                f"dropout_phase must be 'before_upload' or 'after_upload', got {self.dropout_phase!r}"
            )
        if not math.isinf(self.epsilon) and self.placement != "distributed" and self.secure_kind != "none":
            raise ConfigError(
                f"placement={self.placement!r} with secure aggregation (secure_agg={self.secure_agg!r}"
                f"{', chosen for dropouts' if self.secure_agg == 'auto' else ''}): under secure aggregation "
                "the clients split the noise of the sum; use placement='distributed', or no secure "
                "aggregation (secure_agg='none', dropouts=0)"
            )
        if self.dropouts >= self.clients:
            raise ConfigError(f"dropouts={self.dropouts} must be fewer than clients={self.clients}")
        if self.secure_kind == "mask" and self.dropouts > self.clients - default_threshold(self.clients):
            t = default_threshold(self.clients)
            raise ConfigError(
                f"dropouts={self.dropouts} with clients={self.clients}: every round's masked sum needs t={t} "
                f"clients to answer (it tolerates one colluding client), so at most {self.clients - t} may "
                "drop; use more clients or fewer dropouts"
            )
        return replace(self, epsilon=eps, families=fams, baselines=baselines)

    def data_rules(self) -> dict[str, Any]:
        """The run's data in words and counts (:func:`privfed.results.record.data_rules`) as multi-round
        FedLog splits it: the private split of digits for ``seed``, partitioned over ``clients`` by
        ``partition`` (``alpha``, ``classes_per_client``) with ``seed``; each client's test images follow
        its training classes."""
        from types import SimpleNamespace

        from privfed.data.digits_split import digits_splits
        from privfed.federation import partition
        from privfed.results.record import data_rules

        splits = digits_splits(self.seed)
        test = np.asarray(splits.test_labels)
        ds = SimpleNamespace(
            name="digits",
            train_labels=np.asarray(splits.private_labels),
            test_labels=test,
            meta={
                "test_split": f"{test.size} test images of digits (seed {self.seed}), split over the clients by their classes"
            },
        )
        rule = {
            "shards": f"shards ({self.classes_per_client} classes per client)",
            "dirichlet": f"dirichlet alpha {self.alpha:g}",
            "dirichlet-class": f"dirichlet-class alpha {self.alpha:g}",
        }.get(self.partition, self.partition)

        def clients_of(labels, seed):
            part = partition(
                labels,
                self.clients,
                self.partition,
                alpha=self.alpha,
                rng=seed,
                classes_per_client=self.classes_per_client,
            )
            return part.clients, rule

        return data_rules(
            ds,
            clients=self.clients,
            partition=self.partition,
            alpha=self.alpha,
            seeds=[self.seed],
            clients_of=clients_of,
        )

    @property
    def secure_kind(self) -> str:
        """The secure aggregation protocol run each round ("auto" resolved)."""
        if self.secure_agg != "auto":
            return self.secure_agg
        return (
            "mask"
            if (self.placement == "distributed" and not math.isinf(self.epsilon)) or self.dropouts
            else "none"
        )


@dataclass
class RoundsResult:
    """Outcome of :func:`run_rounds`."""

    config: RoundsConfig
    history: list[dict]
    personalised_accuracy: float
    common_accuracy: float
    head: Any
    families: list[str]
    bytes: dict
    privacy: RoundsPrivacyReport | None
    baselines: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: the secure aggregation protocol's report (None when the server summed plain uploads)
    secure_aggregation: dict | None = None
    #: what the server received each round under the protocol (mechanisms.secagg.masking.ServerView per round)
    server_views: list = field(default_factory=list, repr=False)
    #: membership attacks across the rounds (attacks.rounds), when ``attack_pairs`` > 0
    attacks: dict | None = None
    #: every round's privfed.release.ReleaseTrace (stages, randomness, what the server received, events)
    traces: list = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        out = {
            "fedlog": {
                "personalised": self.personalised_accuracy,
                "common": self.common_accuracy,
                "upload_bytes_per_round": self.bytes["upload_per_round"],
                "upload_bytes_total": self.bytes["upload_total"],
            },
        }
        for name, b in self.baselines.items():
            out[name] = {
                k: b[k]
                for k in ("personalised", "common", "upload_bytes_per_round", "upload_bytes_total")
                if k in b
            }
        return out
