"""The release as a plan: the ordered stages one (method, privacy, protection) runs.

A release is one sequence: clip the records, compute each client's
statistics, let each client bound/sample/noise its upload, sum (plainly,
through a secure protocol, or not at all for a per-client method), add
noise on the sum, and fit the method.  :meth:`ReleasePlan.build` chooses
the stages once from the method, the privacy mechanism and the protection;
:meth:`ReleasePlan.run` (from raw features) and :meth:`ReleasePlan.release`
(from client statistics computed earlier, as sweeps do) execute them and
return the head with its :class:`~privfed.release.trace.ReleaseTrace`
(``head.trace``).

This is the only in-process implementation of the release: :func:`privfed.fit`,
the trade-off sweeps, the auditor and the attacks' view run it.

Streaming is a property of the plan: when each client noises its own upload
and the server needs only their sum (or a per-client method has a streamed
server), the plan's client-release stage folds the uploads a chunk of
clients at a time and never holds a (K, C, d) stack.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from privfed.errors import ConfigError
from privfed.methods.base import Method
from privfed.release import stages as S
from privfed.release.streaming import stream_stands_for
from privfed.release.trace import ReleaseTrace
from privfed.stats import ClientStats

__all__ = ["ReleasePlan", "check_hooks", "keeping_uploads"]

#: The mechanism hooks a streamed local release stands for (its entry points among them).
UPLOAD_STREAM_HOOKS = (
    "before_upload",
    "_noisy",
    "local_noise_blocks",
    "fold_local_upload",
    "local_upload_stream",
)

#: The per-client method hooks its streamed server (``aggregate_stream``) stands for.
SERVER_STREAM_HOOKS = ("aggregate", "estimate")

_KEEP_UPLOADS: ContextVar[bool] = ContextVar("privfed_keep_uploads", default=False)


@contextmanager
def keeping_uploads():
    """Within this block every release keeps each client's upload in its trace, streamed or not.

    For audits and attacks on small data that call the public API (``privfed.fit``): the trace's
    :meth:`~privfed.release.ReleaseTrace.server_view` then holds what the server received even where
    the release streams (memory K C d).
    """
    token = _KEEP_UPLOADS.set(True)
    try:
        yield
    finally:
        _KEEP_UPLOADS.reset(token)


def check_hooks(privacy: Any, secure_agg: Any) -> None:
    """Refuse a user's ``privacy`` or ``secure_agg`` that is not a mechanism or a protection object (a name such
    as ``"mask"``, ``True``, a class instead of an instance) in one line naming the object to pass.

    Called at the public doors (:func:`privfed.fit`); inside, a plan may take ``secure_agg=True`` to mean that
    the sum is secured elsewhere (a Flower node's statistics)."""
    if privacy is not None and (isinstance(privacy, type) or not callable(getattr(privacy, "check", None))):
        raise ConfigError(
            f"privacy must be a mechanism object such as mechanisms.GaussianMechanism(epsilon=1.0, delta=1e-5, "
            f"clip=C) or None, got {privacy!r}"
        )
    if secure_agg is not None and (
        isinstance(secure_agg, type) or not callable(getattr(secure_agg, "secure_sum", None))
    ):
        raise ConfigError(
            "secure_agg must be a protection object such as mechanisms.secagg.PairwiseMasking() (or "
            f"CKKSAggregation()) or None, got {secure_agg!r}"
        )


class ReleasePlan:
    """The stages of one release of ``method`` under ``privacy`` and ``secure_agg``.

    Parameters
    ----------
    method : Method
    privacy : privacy mechanism or None
        A hook object from :mod:`mechanisms` (``GaussianMechanism``, a count-noise mechanism).
    secure_agg : protection or None
        A secure-sum protocol from :mod:`mechanisms` (``PairwiseMasking``, ``CKKSAggregation``).

    Attributes
    ----------
    stages : tuple of Stage
        The server-side stages, in order (the client statistics come first, from
        :meth:`run`, or are given to :meth:`release`).
    streamed : bool
        Whether the release folds the clients' uploads chunk by chunk.
    """

    def __init__(self, method: Method, privacy: Any = None, secure_agg: Any = None) -> None:
        self.method, self.privacy, self.secure_agg = method, privacy, secure_agg
        self.stages: tuple[S.Stage, ...] = tuple(self._choose())

    @classmethod
    def build(cls, method: Method, privacy: Any = None, secure_agg: Any = None) -> ReleasePlan:
        """The plan for one (method, privacy, protection); refuses incompatible settings first."""
        if privacy is not None:
            privacy.check(method, secure_agg)
        return cls(method, privacy, secure_agg)

    def _choose(self) -> list[S.Stage]:
        m, privacy, secure = self.method, self.privacy, self.secure_agg
        if privacy is not None and secure is None and _streams(privacy, m, "streams_upload"):
            return [S.StreamedLocalSum(), S.CentralNoise(), S.Aggregate()]
        if privacy is not None and secure is None and _streams(privacy, m, "streams_pairs"):
            return [S.StreamedLocalPairs()]
        out: list[S.Stage] = [S.ClientRelease()] if privacy is not None else []
        if secure is not None:
            out.append(S.SecureSum())
        elif m.per_client:
            out.append(S.PerClientAggregate())
        else:
            out.append(S.PlainSum())
            if privacy is not None:
                out.append(S.CentralNoise())
            out.append(S.Aggregate())
        return out

    @property
    def streamed(self) -> bool:
        return any(s.streamed for s in self.stages)

    def describe(self) -> list[str]:
        """The stages' names, client side first."""
        client = (["clip"] if self.privacy is not None else []) + ["statistics"]
        return client + [s.name for s in self.stages] + ["report"]

    @property
    def name(self) -> str:
        parts = [self.method.name]
        if self.privacy is not None:
            parts.append(type(self.privacy).__name__)
        if self.secure_agg is not None:
            parts.append(getattr(self.secure_agg, "name", type(self.secure_agg).__name__))
        return " + ".join(parts)

    # -- running ---------------------------------------------------------------------------
    def client_statistics(
        self,
        features: np.ndarray,
        labels: np.ndarray,
        clients: np.ndarray,
        *,
        num_classes: int,
        num_clients: int,
        rng: np.random.Generator,
        trace: ReleaseTrace | None = None,
    ) -> ClientStats:
        """What the clients compute before any noise: (clipped) statistics, per client."""
        if self.privacy is not None:
            self.privacy.check(self.method, self.secure_agg)
            features = self.privacy.clip(features)
            if trace is not None:
                bound = getattr(self.privacy, "clip_bound", None)
                trace.record(
                    "clip",
                    f"every record clipped by {type(self.privacy).__name__}"
                    + ("" if bound is None else f" (bound {bound:g})"),
                    values={} if bound is None else {"bound": float(bound)},
                )
        stats = self.method.client_stats(
            features, labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng
        )
        if trace is not None:
            trace.record(
                "statistics",
                f"{self.method.name}: each client's {', '.join(sorted(stats.available))}",
                clients_out=stats.num_clients,
            )
        return stats

    def run(
        self,
        features: np.ndarray,
        labels: np.ndarray,
        clients: np.ndarray,
        *,
        num_classes: int,
        num_clients: int,
        rng: np.random.Generator,
        seeded: bool = True,
        keep_uploads: bool = False,
    ):
        """The release from validated raw data: the head, with ``head.trace``."""
        trace = ReleaseTrace(self.name)
        stats = self.client_statistics(
            features, labels, clients, num_classes=num_classes, num_clients=num_clients, rng=rng, trace=trace
        )
        return self.release(
            stats, num_clients=num_clients, rng=rng, seeded=seeded, keep_uploads=keep_uploads, trace=trace
        )

    def release(
        self,
        stats: ClientStats,
        *,
        num_clients: int,
        rng: np.random.Generator,
        seeded: bool = True,
        keep_uploads: bool = False,
        trace: ReleaseTrace | None = None,
    ):
        """Everything after the clients computed ``stats``: the head, with ``head.trace``.

        ``seeded`` says whether ``rng`` comes from a seed (the trace labels the
        randomness of each stage that draws); ``keep_uploads`` keeps every
        client's upload in the trace even on a streamed plan (memory K C d:
        for audits and attacks on small data).
        """
        trace = trace if trace is not None else ReleaseTrace(self.name)
        secure_backend = bool(getattr(getattr(self.privacy, "backend", None), "secure", False))
        state = S.ReleaseState(
            method=self.method,
            stats=stats,
            num_clients=num_clients,
            rng=rng,
            trace=trace,
            privacy=self.privacy,
            secure_agg=self.secure_agg,
            keep_uploads=keep_uploads or _KEEP_UPLOADS.get(),
            randomness="seeded" if seeded and not secure_backend else "os-entropy",
        )
        start = state.ledger_size()
        for stage in self.stages:
            stage.apply(state)
        S.Finish(start).apply(state)
        return state.head

    def __repr__(self) -> str:
        return f"ReleasePlan({self.name!r}, stages={[s.name for s in self.stages]}, streamed={self.streamed})"


def _streams(privacy: Any, method: Method, predicate: str) -> bool:
    """Whether the mechanism's streamed release stands for its one-call release for this method.

    The mechanism says so (``streams_upload`` / ``streams_pairs``).  A subclass
    that replaced one of the hooks the stream stands for (``before_upload``,
    ``_noisy``, the stream's own methods), or a per-client method whose
    ``aggregate``/``estimate`` is not the one its ``aggregate_stream`` agrees
    with, keeps the one-call release: the stream would bypass what it changed.
    """
    target = privacy
    entry = "fold_local_upload" if predicate == "streams_upload" else "local_upload_stream"
    if not stream_stands_for(target, entry, UPLOAD_STREAM_HOOKS):
        return False
    if predicate == "streams_pairs" and not stream_stands_for(
        method, "aggregate_stream", SERVER_STREAM_HOOKS
    ):
        return False
    check = getattr(target, predicate, None)
    return bool(check(method)) if check is not None else False
