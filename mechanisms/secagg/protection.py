"""Secure aggregation for :func:`privfed.fit`: pairwise masking and CKKS, with distributed noise.

Two protocols implement the ``secure_agg`` hook of :mod:`privfed.release.pipeline`
(``secure_sum(rng) -> SecureSum`` and ``report(method, stats)``):

* :class:`PairwiseMasking` -- Bonawitz et al., "Practical Secure Aggregation
  for Privacy-Preserving Machine Learning", CCS 2017 (X25519 + HKDF key
  agreement, AES-CTR masks in Z_{2^64}, Shamir-shared seeds for dropouts;
  :mod:`mechanisms.secagg.masking`), optionally with the sparse graph of SecAgg+
  (Bell et al., CCS 2020);
* :class:`CKKSAggregation` -- CKKS homomorphic encryption through TenSEAL with
  a key holder separate from the aggregator (:mod:`mechanisms.secagg.ckks.scheme`).

Each call of the returned :class:`SecureSumRun` is one full protocol run on
a (K, ...) stack, with fresh keys: ``Method.secure_aggregate`` calls it once
per summed statistic (counts, sums, second moments, ...); FedCOF's two-round
protocol (FedCOF paper, App. I.2) calls it twice: one vector of counts, sums
and presence indicators, then the per-client d x d spread matrices.

Encoding.  Real statistics use ``frac_bits`` fractional bits (default 32:
the sum of K clients is within K 2^-33 of the real sum per coordinate,
2.3e-8 for K = 100, so heads agree with plain aggregation to ~1e-7 or
better).  Integer statistics (counts, indicators) are encoded with f = 0
and come out exact: with ``integers="auto"`` a stack whose values are all
whole numbers (and that gets no noise) is treated as integer -- a public
one-bit choice that for counts and indicators reveals nothing.  CKKS
releases integer statistics rounded to whole numbers (exact) and real ones
rounded to 2^-precision_bits.

Which methods run (see :mod:`mechanisms.secagg.comm` for bytes):

* sums only (``per_client = False``): fedncm, fed3r, fed3r-within, fedcgs,
  fedlog, fedcof-oracle -- under both protocols, identical heads up to the
  encoding resolution;
* fedcof -- under both protocols through its two-round secure protocol
  (App. I.2), identical head; the server additionally learns K_c and
  broadcasts mu_c, N_c;
* any per-client method without a secure protocol is refused by the method.

Distributed noise: pass ``noise=DistributedGaussian(...)``
(:mod:`mechanisms.secagg.noise`); every uploading client adds its
N(0, sigma^2/K) share before masking or encryption.  Do not also add noise
on the aggregate through a privacy mechanism unless that is intended.

Threat model: computed for each run (:mod:`mechanisms.secagg.threat`) from K,
the threshold, the graph, the uploaders and the noise, never typed: the
report's ``threat_model`` is its text, ``threat`` its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mechanisms.dp.params import Parameters
from mechanisms.secagg import fixed_point
from mechanisms.secagg.ckks import ckks_sum
from mechanisms.secagg.ckks.scheme import CKKSParams
from mechanisms.secagg.comm import has_secure_protocol, secagg_upload_bytes
from mechanisms.secagg.masking import ProtocolAbort, masked_sum
from mechanisms.secagg.noise import DistributedGaussian
from mechanisms.secagg.threat import ThreatModel, ckks_threat, masking_threat, threshold_rule
from privfed._validation import is_integer
from privfed._validation.seeds import check_generator, check_seed
from privfed.errors import ConfigError

__all__ = [
    "CKKSAggregation",
    "PairwiseMasking",
    "ProtocolAbort",
    "SecureAggReport",
    "SecureSumRun",
    "make_secure_agg",
]


@dataclass(eq=False)
class SecureAggReport:
    """What a secure aggregation cost and guaranteed.

    Attributes
    ----------
    protocol : str
        ``"mask"`` or ``"ckks"``.
    method : str
        The method aggregated.
    bytes_per_client : float
        Bytes one client uploads for the whole aggregation (protocol
        overhead and expansion included; :func:`secagg_upload_bytes`).
    bytes : dict
        The breakdown (payload, keys, shares, unmasking / ciphertexts,
        context, download, plain upload and expansion).
    measured_bytes_per_client : float
        Mean bytes a client actually uploaded in this run.
    parameters : dict
        Protocol parameters (ring, fractional bits, threshold, graph; or CKKS
        N, moduli, scale, release grid).
    calls : list of dict
        One entry per secure sum: shape, encoding, uploaders, dropouts, seconds.
    dropouts : dict
        Clients dropped before / after upload over all calls.
    noise : dict or None
        The distributed-noise guarantee (full, with t missing, this run).
    threat_model : str
        :attr:`threat`'s text.
    secure_variant : str
        How the method ran: ``"sums"`` or ``"two-round protocol (App. I.2)"``.
    """

    protocol: str
    method: str
    bytes_per_client: float
    bytes: dict[str, Any]
    measured_bytes_per_client: float
    parameters: dict[str, Any]
    calls: list[dict[str, Any]]
    dropouts: dict[str, Any]
    noise: dict[str, Any] | None
    threat_model: str
    secure_variant: str
    views: list[Any] = field(default_factory=list, repr=False)
    #: The computed threat model (:class:`mechanisms.secagg.threat.ThreatModel`) of the last aggregation.
    threat: Any = None


class SecureSumRun:
    """The ``SecureSum`` callable of one aggregation: each call runs the protocol on one (K, ...) stack."""

    def __init__(self, protocol: _Protocol, rng: np.random.Generator) -> None:
        self.protocol = protocol
        self.rng = rng
        self.results: list[Any] = []
        self.calls: list[dict[str, Any]] = []
        self.state: dict[str, Any] = {}

    def __call__(self, stack: np.ndarray) -> np.ndarray:
        i = len(self.results)
        stack = np.asarray(stack, dtype=np.float64)
        res, record = self.protocol._run(stack, i, self)
        record = {"call": i, "shape": tuple(stack.shape[1:]), "clients": int(stack.shape[0]), **record}
        self.results.append(res)
        self.calls.append(record)
        return res.total

    @property
    def views(self) -> list[Any]:
        """What the server (masking) or aggregator (CKKS) saw, per call."""
        return [r.view for r in self.results]


class _Protocol(Parameters):
    name = ""

    def __init__(self, *, integers: str | bool, noise: DistributedGaussian | None) -> None:
        # np.True_ is True; 1 is refused, as the sums refuse it
        integers = fixed_point.integers_flag(integers)
        if noise is not None and not isinstance(noise, DistributedGaussian):
            raise ConfigError(f"noise must be a DistributedGaussian or None, got {type(noise).__name__}")
        self.integers = integers
        self.noise = noise
        self.last_run: SecureSumRun | None = None

    def secure_sum(self, rng: np.random.Generator) -> SecureSumRun:
        """A fresh :class:`SecureSumRun` (one aggregation) drawing simulation randomness from ``rng``."""
        self.last_run = SecureSumRun(self, check_generator(rng))
        return self.last_run

    def _noise_std(self, call: int, K: int) -> float:
        return 0.0 if self.noise is None else self.noise.share_std(call, K)

    def _run(self, stack: np.ndarray, call: int, run: SecureSumRun):  # pragma: no cover - abstract
        raise NotImplementedError

    def parameters(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _bytes(self, method, M: int, K: int, d: int, C: int) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def threat(self) -> ThreatModel | None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def threat_model(self) -> str:
        """The computed threat model of the last aggregation (:meth:`threat`), as text."""
        threat = self.threat()
        return (
            "no aggregation has run yet: the threat model is computed from a run"
            if threat is None
            else threat.text()
        )

    def _epsilon_of(self, K: int, calls: list[dict]):
        """epsilon of a sum carrying m of the K noise shares (None without distributed noise)."""
        if self.noise is None or not calls:
            return None
        sizes = [int(np.prod(c["shape"])) for c in calls]
        return lambda m: self.noise.guarantee(K, len(calls), present=m, sizes=sizes)["this_run"]["epsilon"]

    def report(self, method: Any, stats: Any) -> SecureAggReport:
        """Cost, parameters, dropouts, noise guarantee and threat model of the last aggregation."""
        run = self.last_run
        calls = [] if run is None else list(run.calls)
        K = stats.num_clients if getattr(stats, "owners", None) is None else int(np.max(stats.owners)) + 1
        try:
            # Secure sums carry every (client, class) pair, zeros included: count what is sent.
            b = self._bytes(method, K * stats.num_classes, K, stats.dim, stats.num_classes)
        except ConfigError as exc:
            b = {"upload": float("nan"), "error": str(exc)}
        measured = float(np.mean([c["upload_bytes_mean"] for c in calls])) * len(calls) if calls else 0.0
        before = sorted({u for c in calls for u in c.get("dropped_before_upload", ())})
        after = sorted({u for c in calls for u in c.get("dropped_after_upload", ())})
        noise = None
        if self.noise is not None and calls:
            noise = self.noise.guarantee(
                K,
                len(calls),
                present=min(c.get("smallest_part", c["uploaded"]) for c in calls),
                sizes=[int(np.prod(c["shape"])) for c in calls],
            )
        threat = self.threat()
        return SecureAggReport(
            protocol=self.name,
            method=getattr(method, "name", str(method)),
            bytes_per_client=float(b["upload"]),
            bytes=b,
            measured_bytes_per_client=measured,
            parameters=self.parameters(),
            calls=calls,
            dropouts={"before_upload": before, "after_upload": after},
            noise=noise,
            threat_model=self.threat_model,
            secure_variant="two-round protocol (App. I.2)" if has_secure_protocol(type(method)) else "sums",
            views=[] if run is None else run.views,
            threat=threat,
        )


class PairwiseMasking(_Protocol):
    """Pairwise masking with dropout recovery (Bonawitz et al. 2017; SecAgg+ with ``neighbours``).

    Parameters
    ----------
    frac_bits : int
        Fractional bits of the fixed-point encoding of real statistics
        (default 32: per-coordinate error <= K 2^-33 in the sum).
    integers : {"auto", True, False}
        Encoding of integer statistics with f = 0 (exact); see the module docstring.
    threshold : int, optional
        Shamir threshold t (default: the smallest that tolerates a colluding node,
        :func:`mechanisms.secagg.threat.default_threshold` of each client's group; at least a majority).
    neighbours : int, optional
        Even degree k of the SecAgg+ graph; ``None`` for the complete graph.
    dropouts : int
        Clients that drop out of the aggregation, drawn once per aggregation
        with its rng; they drop in every secure sum, in ``dropout_phase``.
    dropout_phase : {"after_upload", "before_upload"}
        After uploading (the input still counts; its self-mask seed is
        rebuilt) or before (the input is left out; its mask key is rebuilt).
    noise : DistributedGaussian, optional
        Distributed Gaussian noise shares.
    key_seed : int, optional
        Reproducible key material for tests; ``None`` (default) uses the OS CSPRNG.

    Examples
    --------
    >>> import numpy as np, privfed
    >>> from mechanisms.secagg import PairwiseMasking
    >>> rng = np.random.default_rng(0)
    >>> F, y, k = rng.normal(size=(60, 4)), np.arange(60) % 3, np.arange(60) % 4
    >>> head = privfed.fit("fedncm", F, y, k, secure_agg=PairwiseMasking())
    >>> plain = privfed.fit("fedncm", F, y, k)
    >>> bool(np.abs(head.weight - plain.weight).max() < 1e-7)
    True
    """

    name = "mask"

    def __init__(
        self,
        *,
        frac_bits: int = 32,
        integers: str | bool = "auto",
        threshold: int | None = None,
        neighbours: int | None = None,
        dropouts: int = 0,
        dropout_phase: str = "after_upload",
        noise: DistributedGaussian | None = None,
        key_seed: int | None = None,
    ) -> None:
        super().__init__(integers=integers, noise=noise)
        self.frac_bits = fixed_point.check_frac_bits(frac_bits)
        # 3.0 and NaN too; t = 1 gives every share holder the secret, so no masked sum runs with it
        if threshold is not None and (not is_integer(threshold) or threshold < 2):
            raise ConfigError(f"threshold must be an integer >= 2 or None, got {threshold!r}")
        if neighbours is not None and (
            isinstance(neighbours, bool)
            or not isinstance(neighbours, (int, np.integer))
            or neighbours < 2
            or neighbours % 2
        ):
            raise ConfigError(f"neighbours must be an even integer >= 2 or None, got {neighbours!r}")
        if isinstance(dropouts, bool) or not isinstance(dropouts, (int, np.integer)) or dropouts < 0:
            raise ConfigError(f"dropouts must be an integer >= 0, got {dropouts!r}")
        if dropout_phase not in ("after_upload", "before_upload"):
            raise ConfigError(
                f"dropout_phase must be 'after_upload' or 'before_upload', got {dropout_phase!r}"
            )
        self.threshold = threshold
        self.neighbours = neighbours
        self.dropouts = int(dropouts)
        self.dropout_phase = dropout_phase
        # a seed as everywhere (0..2**64 - 1); -1 or 2.5 would have been hashed into keys without a word
        self.key_seed = None if key_seed is None else check_seed(key_seed, "key_seed")

    def parameters(self) -> dict[str, Any]:
        return {
            "ring": "Z_2^64",
            "frac_bits": self.frac_bits,
            "resolution": 2.0**-self.frac_bits,
            "integers": self.integers,
            "threshold": self.threshold if self.threshold is not None else "default: " + threshold_rule(),
            "graph": "complete" if self.neighbours is None else f"{self.neighbours}-regular Harary (SecAgg+)",
            "key_agreement": "X25519 + HKDF-SHA256",
            "prg": "AES-256-CTR",
            "share_channel": "AES-256-GCM",
            "shamir_field": "GF(2^256 - 189)",
            "dropouts_per_sum": self.dropouts,
            "dropout_phase": self.dropout_phase,
            "key_material": "operating-system CSPRNG (keys, masks, SecAgg+ graph)"
            if self.key_seed is None
            else f"SEEDED (key_seed={self.key_seed}): replayable, for tests only, not a secure run",
        }

    def _run(self, stack: np.ndarray, call: int, run: SecureSumRun):
        K, rng = stack.shape[0], run.rng
        if "dropped" not in run.state:
            # The same clients drop in every secure sum of one aggregation.
            run.state["dropped"] = (
                sorted(rng.choice(K, size=min(self.dropouts, K), replace=False).tolist())
                if self.dropouts
                else []
            )
        drop = run.state["dropped"]
        before = drop if self.dropout_phase == "before_upload" else []
        after = drop if self.dropout_phase == "after_upload" else []
        res = masked_sum(
            stack,
            frac_bits=self.frac_bits,
            integers=self.integers,
            threshold=self.threshold,
            neighbours=self.neighbours,
            dropped_before_upload=before,
            dropped_after_upload=after,
            noise_std=self._noise_std(call, K),
            add_noise=None if self.noise is None else self.noise.add_share,
            rng=rng,
            key_seed=None if self.key_seed is None else f"{self.key_seed}:{call}".encode(),
            name=f"secure sum {call + 1} (shape {stack.shape[1:]})",
        )
        ups = [sum(v.values()) for v in res.upload_bytes.values()]
        run.state["last"] = res
        record = {
            "encoding": f"fixed point, f={res.frac_bits}" + (" (integer, exact)" if res.exact else ""),
            "frac_bits": res.frac_bits,
            "exact": res.exact,
            "threshold": res.threshold,
            "uploaded": len(res.uploaded),
            "dropped_before_upload": res.dropped_before_upload,
            "dropped_after_upload": res.dropped_after_upload,
            "upload_bytes_mean": float(np.mean(ups)),
            "download_bytes_mean": float(np.mean(list(res.download_bytes.values()))),
            "seconds": res.seconds,
            # the parts the uploaders' graph falls into: the server decodes each part's sum alone
            "parts": [len(p) for p in res.parts],
            "smallest_part": min((len(p) for p in res.parts), default=0),
        }
        return res, record

    def _bytes(self, method, M, K, d, C):
        return secagg_upload_bytes(method, M, K, d, C, "mask", neighbours=self.neighbours)

    def threat(self) -> ThreatModel | None:
        """The threat model of the last aggregation, computed (:func:`mechanisms.secagg.threat.masking_threat`):
        the honest-but-curious version, its threshold and graph, the uploaders of its smallest sum."""
        run = self.last_run
        if run is None or not run.calls:
            return None
        res = run.state["last"]
        K = run.calls[0]["clients"]
        worst = min(run.results, key=lambda r: min((len(p) for p in r.parts), default=0))
        degree = None if self.neighbours is None or self.neighbours >= K - 1 else int(self.neighbours)
        return masking_threat(
            K,
            res.threshold,
            degree,
            active=False,
            graph=list(worst.graph),
            uploaded=worst.uploaded,
            epsilon_of=self._epsilon_of(K, run.calls),
            key_material="operating-system CSPRNG"
            if self.key_seed is None
            else f"SEEDED (key_seed={self.key_seed}): replayable, a simulation, not a secure run",
        )


class CKKSAggregation(_Protocol):
    """CKKS secure summation through TenSEAL with a separate key holder (fresh keys per sum).

    Parameters
    ----------
    params : CKKSParams
        N = 8192, moduli [60, 40, 40, 60], scale 2^40, release grid 2^-20 by default.
    integers : {"auto", True, False}
        Integer statistics are released rounded to whole numbers (exact).
    noise : DistributedGaussian, optional
        Distributed Gaussian noise shares.
    """

    name = "ckks"

    def __init__(
        self,
        *,
        params: CKKSParams | None = None,
        integers: str | bool = "auto",
        noise: DistributedGaussian | None = None,
    ) -> None:
        super().__init__(integers=integers, noise=noise)
        self.params = CKKSParams() if params is None else params
        if not isinstance(self.params, CKKSParams):
            raise ConfigError(f"params must be a CKKSParams, got {type(params).__name__}")

    def parameters(self) -> dict[str, Any]:
        return {
            **self.params.as_dict(),
            "integers": self.integers,
            "keys": "fresh per secure sum",
            "key_holder": "separate from the aggregator (public context only)",
        }

    def check_clients(self, num_clients: int) -> None:
        """Refuse before any sum a K whose decryption error would reach the release grid of a real-valued sum
        (every method sums real features): it was refused at the second sum, after the counts' had run."""
        if self.integers is not True:
            from mechanisms.secagg.ckks.node import check_num_nodes

            check_num_nodes(self.params, num_clients)

    def _run(self, stack: np.ndarray, call: int, run: SecureSumRun):
        K, rng = stack.shape[0], run.rng
        res = ckks_sum(
            stack,
            params=self.params,
            integers=self.integers,
            noise_std=self._noise_std(call, K),
            add_noise=None if self.noise is None else self.noise.add_share,
            rng=rng,
            name=f"secure sum {call + 1} (shape {stack.shape[1:]})",
        )
        record = {
            "encoding": "CKKS, released as integers"
            if res.integral
            else f"CKKS, released on the 2^-{self.params.precision_bits} grid",
            "ciphertexts": res.num_ciphertexts,
            "uploaded": K,
            # the real sum is released rounded to this grid (privfed.release.stages.rounding_note)
            "release_bits": None if res.integral else int(self.params.precision_bits),
            "upload_bytes_mean": float(np.mean(list(res.upload_bytes.values()))),
            "download_bytes_mean": float(res.download_bytes),
            "seconds": res.seconds,
        }
        return res, record

    def _bytes(self, method, M, K, d, C):
        return secagg_upload_bytes(method, M, K, d, C, "ckks", ckks_params=self.params)

    def threat(self) -> ThreatModel | None:
        """The threat model of the last aggregation, computed (:func:`mechanisms.secagg.threat.ckks_threat`)."""
        run = self.last_run
        if run is None or not run.calls:
            return None
        K = run.calls[0]["clients"]
        uploaded = min(c["uploaded"] for c in run.calls)
        return ckks_threat(
            K,
            run.results[-1].threshold,
            uploaded=range(uploaded),
            epsilon_of=self._epsilon_of(K, run.calls),
        )


def make_secure_agg(kind: str, **options: Any) -> PairwiseMasking | CKKSAggregation | None:
    """The protocol named ``kind`` ("none", "mask" or "ckks") with ``options``."""
    if kind in (None, "none"):
        if options:
            raise ConfigError(f"secure aggregation 'none' takes no options, got {sorted(options)}")
        return None
    if kind == "mask":
        return PairwiseMasking(**options)
    if kind == "ckks":
        return CKKSAggregation(**options)
    raise ConfigError(f"secure aggregation must be none, mask or ckks, got {kind!r}")
