"""The run configuration of a privfed Flower app, shared by server and nodes.

One :class:`FlowerConfig` describes a run: the method and its parameters,
the privacy mechanism, the secure-aggregation protocol, how many nodes to
wait for and for how long, and where the nodes' data comes from.  The server
reads it from Flower's run config (``[tool.flwr.app.config]`` or
``flwr run --run-config``) or from the command line, and sends it to every
node inside its first message, so nodes never disagree on it.

Keys (run config; the same names as the commands' flags, ``--eps`` is ``eps``):

==========================  ===================================================
``method``                  a name from :func:`privfed.methods.available` (any case)
``param``                   JSON object of the method's parameters
``clients``                 how many nodes the server waits for
``min-clients``             fewest replies a plain run accepts (default: all)
``eps`` ``delta``           DP budget; ``eps = inf`` adds no noise
``clip``                    L2 clipping bound of every record (DP on digits: by default the
                            median feature norm of its public split)
``level``                   ``record`` or ``client``
``trusted-aggregator``      the server adds the noise to the sum
``max-records``             client level: records per client bound
``dropout-tolerance``       secure DP runs: t, nodes that may drop while the others' noise
                            shares still carry sigma^2 (each adds sigma^2/(K - t))
``secure-agg``              ``none``, ``mask`` (pairwise masking, active-adversary
                            version), ``ckks`` (CKKS, a node holding the keys) or
                            ``flwr-secaggplus-insecure`` (Flower's SecAgg+ workflow, for
                            comparison only: a deviating server recovers any node's
                            input; needs clip and max-records)
``threshold``               Shamir threshold t (default: the smallest that tolerates a
                            colluding node, :func:`mechanisms.secagg.threat.threshold_rule`;
                            minimum: a majority, t >= 2 and t > K/2; with ``degree`` k per
                            group of k + 1; the nodes' roster must say the same)
``degree``                  ``secure=mask``: the SecAgg+ degree k (even, 2 <= k < K) of
                            the graph the operator drew into the nodes' roster; each
                            node masks with and shares among k neighbours (bytes per
                            node grow with k, not K); default: the complete graph.
                            With ``flwr-secaggplus-insecure``: Flower's own graph of
                            k + 1 shares a node (``num_shares``), drawn by its server
``frac-bits``               fixed-point fractional bits of masked statistics (the nodes'
                            roster fixes them: a node refuses others)
``wire``                    plain uploads: ``float64`` (default: dense, exact) or ``compact``
                            (float32; without DP only the held classes' rows, as fit's byte model counts)
``rounds``                  rounds of a multi-round method (``fedlog`` with local bodies, R > 1;
                            under DP with local, trusted (central) or masked (distributed) noise)
``rounds-params``           JSON object of :class:`privfed.rounds.RoundsConfig` settings
                            (local_epochs, batch_size, lr, families, init, classes_per_client,
                            head_init_scale, clip_norm, calibration, record_bound); the
                            partition is the run config's, for one round or many
``dataset``                 ``digits`` (embedded, default), ``file:PATH`` or
                            ``synthetic:D:N`` (N random D-dim samples a node)
``num-classes``             C; defaults to the data set's
``partition`` ``alpha``     how ``digits`` is split over ``num-partitions``
``seeds``                   the seed of that split (the one ``fit`` users pass), as the commands
                            write it: ``1`` is seed 0, ``"7,"`` seed 7; one run is one release
``noise-seed``              reproducible noise (a simulation); default OS entropy
``timeout``                 seconds any one stage may take
``connect-timeout``         seconds to wait for the nodes to connect
``out``                     folder for the run's record (``results.json``), ``head.npz``, ``report.json``
==========================  ===================================================
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from privfed import methods as _methods
from privfed.errors import ConfigError
from privfed.flower.values import coerce, synthetic_spec, wire_value

__all__ = [
    "INSECURE_FLWR",
    "MASKING",
    "RUN_CONFIG_KEYS",
    "SECURE_PROTOCOLS",
    "WIRE_EXTRA",
    "FlowerConfig",
    "check_num_cpus",
    "public_clip",
    "usable_cpus",
    "request_config",
]

#: Keys the server adds to the config it sends (beside the fields): its nonce, telling runs apart.
WIRE_EXTRA = ("run-nonce",)

#: Secure-aggregation protocols the Flower app runs as message stages.
SECURE_PROTOCOLS = ("none", "mask", "ckks", "flwr-secaggplus-insecure")
#: Flower's SecAgg+ under the name that says what it is (see :mod:`privfed.flower.flwr_secagg`).
INSECURE_FLWR = "flwr-secaggplus-insecure"
#: The pairwise-masking protocols: the ones a SecAgg+ degree, a Shamir threshold and fixed-point bits apply to.
MASKING = ("mask", INSECURE_FLWR)
#: Run-config keys named like the commands' flags where the field's name differs (key -> field).
RUN_CONFIG_KEYS = {
    "eps": "epsilon",
    "secure-agg": "secure",
    "seeds": "partition_seed",
    "out": "output",
    "param": "method_params",
}


def public_clip(dataset: str) -> float | None:
    """The default clip of a DP run: for digits the median feature norm of its public split (no privacy cost)."""
    if dataset != "digits":
        return None
    import numpy as np

    from privfed.data.digits import digits_splits, embed

    splits = digits_splits(0)
    return float(np.median(np.linalg.norm(embed(splits.public_images, seed=0), axis=1)))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's cpuset, a taskset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_num_cpus(num_cpus, flag: str = "num_cpus") -> int:
    """CPUs for Ray's node workers: an integer from 1 to the CPUs this process may use.  Ray starts a worker for
    every CPU it is told of, so a count past them runs dozens of workers on a few cores, and the simulation
    crawls past its timeouts."""
    have = usable_cpus()
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, numbers.Integral) or not 1 <= num_cpus <= have:
        raise ConfigError(
            f"{flag} must be an integer from 1 to the {have} CPU(s) this process may use, got {num_cpus!r}: "
            "Ray starts one worker per CPU it is told of"
        )
    return int(num_cpus)


@dataclass(frozen=True)
class FlowerConfig:
    """Everything server and nodes must agree on for one run (see the module docstring)."""

    method: str = "fedncm"
    method_params: dict = field(default_factory=dict)
    clients: int = 2
    min_clients: int | None = None
    epsilon: float = math.inf
    delta: float = 1e-5
    clip: float | None = None
    level: str = "record"
    trusted_aggregator: bool = False
    max_records: int | None = None
    dropout_tolerance: int = 0
    secure: str = "none"
    threshold: int | None = None
    degree: int | None = None
    frac_bits: int = 32
    wire: str = "float64"
    rounds: int = 1
    rounds_params: dict = field(default_factory=dict)
    dataset: str = "digits"
    num_classes: int | None = None
    partition: str = "dirichlet"
    alpha: float = 0.5
    partition_seed: int = 0
    noise_seed: int | None = None
    timeout: float = 120.0
    connect_timeout: float = 120.0
    output: str | None = None

    def __post_init__(self) -> None:
        if self.method not in _methods.available():
            raise ConfigError(f"unknown method {self.method!r}; choose from {_methods.available()}")
        if not isinstance(self.method_params, dict):
            raise ConfigError(
                f"param (method-params) must be a JSON object of the method's parameters, got {self.method_params!r}"
            )
        self.make_method()  # unknown / bad parameters fail here, on the server, before any message
        if not isinstance(self.trusted_aggregator, bool):  # "no" is a non-empty string: truthy
            raise ConfigError(f"trusted-aggregator must be true or false, got {self.trusted_aggregator!r}")
        _positive_int(self.clients, "clients", "the number of nodes the server waits for, e.g. 10")
        if self.min_clients is not None:
            _positive_int(self.min_clients, "min-clients", "e.g. the number of clients")
            if self.min_clients > self.clients:
                raise ConfigError(
                    f"min-clients={self.min_clients} exceeds clients={self.clients}; lower min-clients"
                )
        if self.secure == "flwr-secaggplus":
            raise ConfigError(
                "secure-agg flwr-secaggplus is not offered as a secure choice: against a server that deviates, "
                "Flower's SecAgg+ gives up any node's input (listed both alive and dropped, every node reveals both "
                'of its shares). Use --secure-agg mask (run config secure-agg="mask"; secure against a deviating '
                f"server); Flower's implementation runs as --secure-agg {INSECURE_FLWR} for comparison only"
            )
        # the data first: a misspelt data set is named, not blamed on the clip its default would have
        if not (
            isinstance(self.dataset, str)
            and (self.dataset == "digits" or self.dataset.startswith(("file:", "synthetic:")))
        ):
            raise ConfigError(
                f"dataset must be 'digits', 'file:PATH' or 'synthetic:D:N', got {self.dataset!r}"
            )
        if self.dataset.startswith("synthetic:"):
            synthetic_spec(self.dataset)  # malformed or too large: refused here, before any message
        if self.secure not in SECURE_PROTOCOLS:
            raise ConfigError(f"secure-agg must be one of {list(SECURE_PROTOCOLS)}, got {self.secure!r}")
        from privfed.release.settings import check_combination, make_secure_agg, refuse_unused_dp

        check_combination(  # one configuration: a pair that contradicts itself is refused, naming both
            level=self.level,
            secure_agg=self.secure,
            trusted_aggregator=bool(self.trusted_aggregator),
            max_records=None if self.secure == INSECURE_FLWR else self.max_records,
            rounds=self.rounds if isinstance(self.rounds, int) else 1,
            prefix="",
        )
        if self.secure != "none" and self.clients < 2:
            raise ConfigError("secure aggregation needs clients >= 2 (a sum of one input is that input)")
        if self.degree is not None:
            if self.secure not in MASKING:
                raise ConfigError(
                    f"degree={self.degree!r} is the SecAgg+ graph of pairwise masking: use it with "
                    f"--secure-agg mask (or {INSECURE_FLWR}, where each node shares with k others), or drop it"
                )
            from mechanisms.secagg.graph import check_degree

            check_degree(self.degree, self.clients)
        if self.threshold is not None:
            if self.secure not in MASKING:
                raise ConfigError(
                    f"threshold={self.threshold!r} is the Shamir threshold of pairwise masking: use it with "
                    f"--secure-agg mask (or {INSECURE_FLWR}), or drop it"
                )
            _positive_int(self.threshold, "threshold", "e.g. a majority of the clients")
            if self.threshold > self.clients:
                raise ConfigError(f"threshold={self.threshold} exceeds clients={self.clients}")
            from mechanisms.secagg.identity import min_threshold

            if self.degree is not None and self.threshold > self.degree + 1:
                raise ConfigError(
                    f"threshold={self.threshold} exceeds the group size degree + 1 = {self.degree + 1}: "
                    "a node's seeds are shared among itself and its neighbours only; lower threshold"
                )
            if self.degree is not None and self.threshold < min_threshold(self.degree + 1):
                raise ConfigError(
                    f"threshold={self.threshold} is too low for degree={self.degree}: secure aggregation "
                    f"against a deviating server needs t >= 2 and 2t > k + 1 (here t >= "
                    f"{min_threshold(self.degree + 1)}); raise threshold"
                )
            low = min_threshold(self.clients)
            if self.secure == "mask" and self.degree is None and self.threshold < low:
                raise ConfigError(
                    f"threshold={self.threshold} is too low for clients={self.clients}: secure aggregation against a "
                    f"deviating server needs t >= 2 and t > K/2 (here t >= {low}), or a server that shows two "
                    "halves of the nodes different survivor lists unmasks a node; raise threshold"
                )
        if self.secure == "ckks":
            from mechanisms.secagg.ckks.scheme import CKKSParams
            from privfed.flower.ckks import check_num_nodes

            check_num_nodes(CKKSParams(), self.clients)
        if isinstance(self.frac_bits, bool) or not isinstance(self.frac_bits, int):
            raise ConfigError(f"frac-bits must be an integer, got {self.frac_bits!r}")
        from mechanisms.secagg import fixed_point

        fixed_point.check_frac_bits(self.frac_bits)
        eps = float(self.epsilon)
        if math.isnan(eps) or eps <= 0:  # a run config (flwr run) reaches here without the command's checks
            raise ConfigError(
                f"eps (epsilon) must be a number > 0 (inf for no noise), got {self.epsilon!r}; a NaN or "
                "negative budget would run without noise"
            )
        if self.private:
            if self.secure == INSECURE_FLWR:  # before any DP setting's own check, whose fix could not help
                from privfed.flower.checks import check_limits

                check_limits(self)
            if self.clip is None:
                raise ConfigError(
                    "a DP run (finite epsilon) needs clip, the L2 bound of every record; e.g. --clip 10"
                )
            method = self.make_method()  # read by the checks below
            if self.secure != "none" and method.per_client:
                raise ConfigError(
                    f"DP noise on method {self.method!r}'s secure protocol is not supported (its second round "
                    "has no bounded sensitivity); use a sum-only method (fedncm, fed3r, fed3r-within, fedcgs, "
                    "fedlog) with --secure-agg, or drop --secure-agg"
                )
            # named as the command and the run config name it, not as GaussianMechanism's argument
            if self.level == "client" and self.max_records is None:
                raise ConfigError(
                    "level client needs max-records N (--max-records N, or max-records in the run config): the "
                    "most records one node contributes, which bounds what one node changes in the sums"
                )
            # the mechanism's check below names its Python arguments, and multi-round FedLog's names placements:
            # this one names the flags (a per-client method is left to the mechanism, which names the method)
            noised = self.secure != "none" or self.trusted_aggregator or method.per_client
            if self.level == "client" and not noised:
                raise ConfigError(
                    f"level client adds noise to the aggregate: pass --secure-agg {'mask|ckks' if self.rounds == 1 else 'mask'} "
                    "(the nodes split the noise) or --trusted-aggregator (the server adds it), or their run-config keys"
                )
            if self.rounds == 1:  # budget, level and method, before any message (multi-round FedLog's: below)
                self.make_privacy().check(method, make_secure_agg(self.secure))
            if self.secure != "none" and not 0 <= self.dropout_tolerance < self.clients:
                raise ConfigError(
                    f"dropout-tolerance={self.dropout_tolerance} must lie in 0..clients-1={self.clients - 1}"
                )
        # settings of the DP release a run without noise would record as if it had used them
        refuse_unused_dp(
            self.private,
            {
                "clip": self.clip is not None and self.secure != INSECURE_FLWR,  # its pre-scaling
                "trusted-aggregator": self.trusted_aggregator,
                "level": self.level != "record",
                "max-records": self.max_records is not None and self.secure != INSECURE_FLWR,
                "noise-seed": self.noise_seed is not None,
                "dropout-tolerance": bool(self.dropout_tolerance),
            },
        )
        if self.secure == "none" and self.dropout_tolerance:
            raise ConfigError(
                f"dropout-tolerance={self.dropout_tolerance} sizes the noise shares of secure aggregation; "
                "with --secure-agg none each node noises its own upload: drop it or choose --secure-agg mask"
            )
        if self.wire not in ("float64", "compact"):
            raise ConfigError(f"wire must be 'float64' or 'compact', got {self.wire!r}")
        if self.wire != "float64" and self.secure != "none":
            raise ConfigError(
                "wire=compact applies to plain uploads; secure aggregation has its own encoding "
                "(fixed point for masking, CKKS ciphertexts): drop --wire or --secure-agg"
            )
        _positive_int(self.rounds, "rounds", "e.g. --rounds 10 for multi-round FedLog")
        if self.min_clients is not None and self.secure != "none" and self.rounds == 1:
            raise ConfigError(
                f"min-clients counts the replies a plain run accepts; a --secure-agg {self.secure} sum follows its "
                "protocol's own dropout rule (masking: the threshold, --threshold): drop --min-clients"
            )
        if not isinstance(self.rounds_params, dict):
            raise ConfigError(f"rounds-params must be a JSON object, got {self.rounds_params!r}")
        # a run config (flwr run) reaches here without the command's checks: refused on the server, not by
        # every node once the federation has started
        from privfed.federation import available_schemes, check_alpha

        if self.partition not in available_schemes():
            raise ConfigError(f"partition must be one of {available_schemes()}, got {self.partition!r}")
        check_alpha(self.alpha)
        c = self.num_classes
        if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1):
            raise ConfigError(f"num-classes must be an integer >= 1 or none (the data set's), got {c!r}")
        for name in ("partition_seed", "noise_seed"):  # every node splits by the partition seed: it is one
            v = getattr(self, name)
            if (v is not None or name == "partition_seed") and (
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64
            ):
                raise ConfigError(
                    f"{name.replace('_', '-')} must be an integer seed in 0..2**64 - 1, got {v!r}"
                )
        if self.rounds > 1:
            if self.method != "fedlog":
                raise ConfigError(
                    f"rounds={self.rounds}: only fedlog runs several rounds (local bodies); "
                    f"{self.method!r} is one-shot: drop --rounds"
                )
            if self.secure not in ("none", "mask"):
                raise ConfigError(
                    f"multi-round FedLog on Flower sums each round in clear or under pairwise masking; "
                    f"secure={self.secure!r} is not offered over rounds: use --secure-agg mask"
                )
            from privfed.flower.checks import rounds_config

            rc = rounds_config(self)  # bad rounds-params fail here, before any message
            if self.private:
                from privfed.rounds import make_dp

                make_dp(rc, rounds=rc.rounds, bodies_trained=rc.local_epochs > 0)  # bad DP settings too
        elif self.rounds_params:
            raise ConfigError("rounds-params applies to multi-round FedLog (rounds > 1) only")
        if self.secure == INSECURE_FLWR:
            from privfed.flower.checks import check_limits

            check_limits(self)
        for name in ("timeout", "connect_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name.replace('_', '-')} must be a positive number of seconds, got {v!r}")

    # -- derived ---------------------------------------------------------------
    @property
    def private(self) -> bool:
        """Whether DP noise is released (a finite epsilon)."""
        return math.isfinite(float(self.epsilon))

    @property
    def secagg_threshold(self) -> int:
        """The masking threshold t: the configured one, or the default for K nodes (or groups of k + 1), the
        smallest that tolerates a colluding node (:func:`mechanisms.secagg.threat.default_threshold`)."""
        from mechanisms.secagg.threat import sum_threshold

        return sum_threshold(self.clients, self.threshold, self.degree)

    @property
    def min_replies(self) -> int:
        return self.clients if self.min_clients is None else int(self.min_clients)

    def make_method(self):
        """The method object (ConfigError naming the bad parameter otherwise)."""
        return _methods.get(self.method, **self.method_params)

    def make_privacy(self):
        """A fresh :class:`mechanisms.GaussianMechanism`, or ``None`` without DP."""
        if not self.private:
            return None
        from mechanisms import GaussianMechanism

        method = self.make_method()
        blocks = ("sums", "counts", "second") if "second" in method.requires else ("sums", "counts")
        return GaussianMechanism(
            epsilon=float(self.epsilon),
            delta=float(self.delta),
            clip=float(self.clip),
            level=self.level,
            blocks=blocks,
            trusted_aggregator=bool(self.trusted_aggregator),
            max_records=self.max_records,
            dropout_tolerance=int(self.dropout_tolerance),
        )

    # -- (de)serialisation ------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """A flat dict of str / int / float / bool (a Flower ConfigRecord's value types)."""
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            if v is None:
                continue
            out[k] = json.dumps(v) if isinstance(v, dict) else v
        return out

    @classmethod
    def from_wire(cls, values: dict[str, Any]) -> FlowerConfig:
        """The config a node receives (:meth:`to_wire` plus the server's ``run-nonce``); unknown keys are refused.

        A key the node does not know changes nothing it computes but would change the aggregation id that
        hashes the config: a server could get a fresh id per question and ask a node again and again.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known - set(WIRE_EXTRA))
        if unknown:
            raise ConfigError(
                f"the run config carries key(s) {unknown[:5]} this node does not know; it refuses the run "
                "(an unknown key would name a new aggregation for the same statistics). Run server and nodes "
                "with the same privfed version"
            )
        # every value typed at the door, one line naming the key: a lying or broken server sends 1.7 for
        # an int, true for a number of seconds, or JSON that does not parse
        kwargs = {k: wire_value(k, v) for k, v in values.items() if k in known}
        return cls(**kwargs)

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> FlowerConfig:
        """Parse Flower's run config (dashed keys named like the commands' flags; unknown keys are an error
        naming them).  A DP run on digits without ``clip`` takes the public split's median norm."""
        by_field = {f.name: f for f in fields(cls)}
        renamed = {v: k for k, v in RUN_CONFIG_KEYS.items()}
        names = {renamed.get(f.name, f.name.replace("_", "-")): f for f in by_field.values()}
        unknown = sorted(set(run_config) - set(names))
        if unknown:
            raise ConfigError(f"unknown run-config key(s) {unknown}; known keys: {sorted(names)}")
        kwargs: dict[str, Any] = {}
        for key, value in run_config.items():
            f = names[key]
            if isinstance(value, str) and value.strip().lower() in ("", "none", "null") and f.default is None:
                continue
            kwargs[f.name] = coerce(f.name, value, renamed.get(f.name, f.name.replace("_", "-")))
        if isinstance(kwargs.get("method"), str):  # any case, as on the command line
            low = {m.lower(): m for m in _methods.available()}
            kwargs["method"] = low.get(kwargs["method"].lower(), kwargs["method"])
        eps = float(kwargs.get("epsilon", by_field["epsilon"].default))
        if kwargs.get("clip") is None and math.isfinite(eps) and eps > 0:
            clip = public_clip(str(kwargs.get("dataset", by_field["dataset"].default)))
            if clip is not None:
                kwargs["clip"] = clip
        return cls(**kwargs)


def _positive_int(value, name: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}; {fix}")
    return value


def request_config(content) -> FlowerConfig:
    """The run config a request carries (:meth:`privfed.flower.config.FlowerConfig.from_wire`); a request
    without one, or with a ``config`` that is no record, is a malformed request (ProtocolAbort), never a
    KeyError escaping the node's handler."""
    from mechanisms.secagg.crypto import ProtocolAbort

    try:
        values = dict(content["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolAbort(
            f"malformed request: it carries no run config record ({type(exc).__name__}: {exc})",
            stage="config",
            deviation="malformed",
        ) from None
    return FlowerConfig.from_wire(values)
