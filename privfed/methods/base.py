"""The contract every aggregation method implements.

A method turns client statistics (:class:`privfed.stats.ClientStats`) into a
:class:`privfed.head.LinearHead`.  It declares

* ``requires``: which statistics it needs (among ``counts``, ``sums``,
  ``second``, ``class_second``);
* ``per_client``: whether the server needs them per client (``True``) or only
  summed over clients (``False``).  Only methods with ``per_client=False``, or
  with a secure variant (:meth:`Method.secure_aggregate` overridden), run under
  secure aggregation.

Methods never see privacy: mechanisms wrap the release path and hand the
method (possibly noisy) statistics.  A method must therefore stay finite and
well defined on noisy statistics (counts <= 0 or fractional, indefinite
matrices) and record in ``notes`` what it repaired.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from privfed._validation import check_memory
from privfed.errors import ConfigError, InputError
from privfed.head import LinearHead
from privfed.stats import ClientStats, compute_client_stats, stats_from_rows

__all__ = ["Method", "SecureSum"]

#: Sums a stack of per-client arrays (leading axis K) into one array.
SecureSum = Callable[[np.ndarray], np.ndarray]

BYTES_PER_FLOAT = 4


#: Class totals, means and head up to this many bytes are made without asking the system for the memory
#: (reading it takes 20 us, as long as FedNCM's whole server at d = 256; 256 MiB is far below what any
#: machine that runs a federation has free).
_SMALL_HEAD_BYTES = 256 * 2**20


class Method(abc.ABC):
    """Base class of aggregation methods.

    Subclasses set the class attributes, define ``defaults`` (parameter name
    -> default value), implement :meth:`aggregate` and
    :meth:`upload_floats`.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset({"counts", "sums"})
    per_client: ClassVar[bool] = False
    #: The secure-aggregation protocol a per-client method runs when the server may only learn sums
    #: (``"fedcof-two-round"``: FedCOF App. I.2); ``None`` for a sum-only method or one without such a protocol.
    secure_protocol: ClassVar[str | None] = None
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self.defaults)
        if unknown:
            allowed = ", ".join(sorted(self.defaults)) or "none"
            raise ConfigError(
                f"method {self.name!r} got unknown parameter(s) {sorted(unknown)}; it accepts: {allowed}"
            )
        self.params: dict[str, Any] = {**self.defaults, **params}
        self._validate_params()

    def _validate_params(self) -> None:
        """Check ``self.params``; raise ConfigError naming the bad one."""

    # -- client side ---------------------------------------------------------
    def client_stats(
        self,
        features: np.ndarray,
        labels: np.ndarray,
        clients: np.ndarray,
        *,
        num_classes: int,
        num_clients: int,
        rng: np.random.Generator,
    ) -> ClientStats:
        """What the clients compute locally (validated inputs).  Default: ``requires``.

        Rows are grouped by :meth:`row_groups` (clients, or pseudo-clients).
        """
        groups, owners = self.row_groups(
            labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng
        )
        K = num_clients if owners is None else owners.size
        F = features
        if not (isinstance(F, np.ndarray) and F.dtype == np.float64 and F.ndim == 2):
            return compute_client_stats(
                F, labels, groups, num_classes=num_classes, num_clients=K, fields=self.requires
            )
        y = np.asarray(labels, dtype=np.int64)
        return stats_from_rows(
            F, y, np.asarray(groups, dtype=np.int64), num_classes, K, self.requires, owners=owners
        )

    def row_groups(
        self,
        labels: np.ndarray,
        clients: np.ndarray,
        *,
        num_classes: int,
        num_clients: int,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The row (client or pseudo-client) of every sample, and each row's real client.

        Default: one row per client (``(clients, None)``).  Pseudo-client rows
        of one real client must be numbered contiguously, so that client
        chunks can be folded independently (:func:`privfed.release.pipeline.fold_statistics`).
        """
        return np.asarray(clients, dtype=np.int64), None

    def scale_invariant(self) -> bool:
        """Whether the head's predictions do not depend on a common scale of the features.

        :mod:`privfed.scaling` rescales the features of a scale-invariant method by a power of two when its
        statistics would not be exact in float64; any other method gets one clear error instead.
        """
        return False

    def regrouping(self) -> str | None:
        """Why one record can change how the other records are grouped into uploaded rows, or ``None``.

        A per-record sensitivity assumes one record moves one class row of its
        client's upload.  A method that regroups records (FedCOF's multi-mean
        sampling cuts each class into chunks whose number depends on the class
        size) says so here, in words a refusal can quote; privacy mechanisms
        refuse it rather than read the method's parameters.
        """
        return None

    # -- server side ---------------------------------------------------------
    @abc.abstractmethod
    def aggregate(self, stats: ClientStats) -> LinearHead:
        """Build the head.  ``stats`` is per client if ``per_client`` else may be a total (K = 1)."""

    def secure_aggregate(self, stats: ClientStats, secure_sum: SecureSum) -> LinearHead:
        """Build the head when the server only learns sums through ``secure_sum``.

        The default sums every required statistic and calls :meth:`aggregate`;
        methods that need per-client values and have no secure protocol refuse.
        """
        if self.per_client:
            raise ConfigError(
                f"method {self.name!r} needs every client's individual statistics, which secure "
                "aggregation hides; use a sum-only method (fedncm, fed3r, fed3r-within, fedcgs, fedlog) "
                "or one with a secure protocol (fedcof)"
            )
        total = ClientStats(
            **{k: secure_sum(v)[None] for k, v in stats.select(self.requires).arrays().items()}
        )
        return self.aggregate(total)

    # -- communication -------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def upload_floats(cls, *, M: int, K: int, d: int, C: int) -> int:
        """Floats uploaded by all K clients together (methods.md section 3).

        ``M`` is the number of (client, class) pairs with data.
        """

    @classmethod
    def upload_bytes(cls, *, M: int, K: int, d: int, C: int) -> int:
        """Bytes uploaded by all clients together, 4 bytes a float."""
        for nm, v in (("M", M), ("K", K), ("d", d), ("C", C)):
            if int(v) < 0:
                raise InputError(f"{nm} must be >= 0, got {v}")
        return BYTES_PER_FLOAT * int(cls.upload_floats(M=int(M), K=int(K), d=int(d), C=int(C)))

    def communication(self, stats: ClientStats, num_clients: int) -> dict[str, Any]:
        """Upload accounting of one run from its statistics."""
        M = stats.folded_pairs if stats.folded_pairs is not None else stats.num_pairs()
        total = self.upload_bytes(M=M, K=num_clients, d=stats.dim, C=stats.num_classes)
        return {"total": total, "per_client": total / max(num_clients, 1), "M": M, "K": num_clients}

    # -- helpers -------------------------------------------------------------
    def _check_stats(self, stats: ClientStats) -> None:
        if not isinstance(stats, ClientStats):
            raise InputError(
                f"method {self.name!r} aggregates a privfed.stats.ClientStats, got {type(stats).__name__}; "
                "build one with privfed.stats.compute_client_stats(...) or ClientStats.from_pairs(...)"
            )
        missing = set(self.requires) - stats.available
        if missing:
            raise InputError(
                f"method {self.name!r} needs statistics {sorted(missing)} that were not provided; "
                f"compute them with compute_client_stats(fields={sorted(self.requires)})"
            )
        C, d = stats.num_classes, stats.dim
        # class totals, means and the head are (C, d) each: a num_classes far beyond the data (statistics kept
        # as pairs hold it without cost) is refused here, before the first of them is allocated.  Below
        # _SMALL_HEAD_BYTES nothing is read from the system: the check costs more than a small server's work.
        need = 3 * 8.0 * C * (d + 2)
        if need > _SMALL_HEAD_BYTES:
            check_memory(
                need,
                f"method {self.name!r} on num_classes={C:,} x d={d} (its class totals and head)",
                "compute the statistics with the number of classes the data really has (num_classes=)",
            )

    def _refuse_non_finite(self, what: str, *arrays: np.ndarray) -> None:
        """Refuse NaN or inf in arrays built from the statistics (``what`` names them) before a solver meets
        them: a hand-made ClientStats holding NaN otherwise ends in LinAlgError or a NaN head."""
        if not all(np.isfinite(a).all() for a in arrays):
            raise InputError(
                f"method {self.name!r}: the {what} hold NaN or inf; NaN/inf is not a statistic (a corrupt or "
                "overflowed upload): recompute the statistics from finite features"
            )

    def _refuse_non_finite_totals(self, counts: np.ndarray, sums: np.ndarray) -> None:
        """Refuse class totals holding NaN or inf (statistics made by hand; uploads are checked as they are
        folded), naming the statistic and the class, instead of a head with a silently zeroed row."""
        for stat, arr in (("counts", counts), ("sums", sums)):
            bad = ~np.isfinite(arr)
            if bad.any():
                cls = int(np.flatnonzero(bad.reshape(arr.shape[0], -1).any(axis=1))[0])
                raise InputError(
                    f"method {self.name!r}: the class {stat} hold NaN or inf (class {cls} first); NaN/inf is not a "
                    "statistic (a corrupt or overflowed upload): recompute the statistics from finite features"
                )

    def _head(self, weight, bias, notes=(), *, weight_proved_finite: bool = False, **extras) -> LinearHead:
        """The head; ``weight_proved_finite`` when the server's construction proves every weight finite."""
        return LinearHead(
            weight=weight,
            bias=bias,
            method=self.name,
            params=dict(self.params),
            notes=list(notes),
            extras=extras,
            weight_proved_finite=weight_proved_finite,
            made_by_method=True,
        )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"
