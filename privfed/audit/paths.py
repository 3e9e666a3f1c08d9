"""Release paths for the black-box auditor: each returns what a server or a user receives.

A *run* is a callable ``(dataset kwargs, seed) -> dict`` for :func:`privfed.audit.audit_release`
(``seed=None``: as a user who gives no seed):

* :func:`fit_release`: :func:`privfed.fit` with a mechanism and a secure-aggregation protocol;
* :func:`tradeoff_release`: the trade-off sweep's path (``tradeoff_privacy.make_privacy`` and the
  pipeline's two stages);
* :func:`rounds_release`: the multi-round FedLog release (:class:`privfed.fedlog_rounds.RoundsDP`
  and :class:`~privfed.fedlog_rounds.RoundRelease`, as ``run_rounds`` uses them) over R rounds
  of frozen features;
* the Flower app: :func:`privfed.flower.audit.flower_release`.

Each returns ``arrays`` (the noisy uploads with local noise, the noisy aggregate with a trusted
aggregator, the secure sums under secure aggregation, the released sums of every round),
``meta``, ``report`` and ``noise`` (the std the ledger books for each array, for the noise-scale
check).  :class:`Tap` wraps a privacy hook or a protocol to record what the server receives.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Tap", "fit_release", "rounds_release", "server_view", "tradeoff_release"]


class Tap:
    """Wraps a privacy hook or a protocol and keeps what the server receives; delegates everything else."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.uploads = None
        self.aggregate = None
        self.sums: list = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @property
    def stream_target(self):
        """The hook whose streamed release the pipeline may take (through this tap's recording wrappers)."""
        return self._inner

    def fold_local_upload(self, stats, method, rng, *, chunk_bytes=None):
        """The inner streamed release (sum-only methods), recording every client's noisy upload."""
        parts: dict = {}

        def record(block, k0, k1, values):
            parts.setdefault(block, []).append(np.array(values))

        out = self._inner.fold_local_upload(stats, method, rng, chunk_bytes=chunk_bytes, observe=record)
        self.uploads = _uploads(parts, stats)
        return out

    def local_upload_stream(self, stats, rng, *, chunk_bytes=None):
        """The inner streamed release (per-client methods), recording every client's noisy upload."""
        counts, chunks = self._inner.local_upload_stream(stats, rng, chunk_bytes=chunk_bytes)
        tap = self

        def recording():
            sums = []
            for k0, k1, values in chunks:
                sums.append(np.array(values))
                yield k0, k1, values
            tap.uploads = _uploads({"counts": [counts], "sums": sums}, stats)

        return counts, recording()

    def before_upload(self, stats, method, rng):
        out = self._inner.before_upload(stats, method, rng)
        self.uploads = out
        return out

    def after_aggregate(self, total, method, rng):
        out = self._inner.after_aggregate(total, method, rng)
        self.aggregate = out
        return out

    def secure_sum(self, rng):
        fn = self._inner.secure_sum(rng)
        tap = self

        def wrapped(stack):
            total = fn(stack)
            tap.sums.append(np.array(total, dtype=np.float64))
            return total

        return wrapped

    def report(self, *args, **kwargs):
        return self._inner.report(*args, **kwargs)


def _uploads(parts: dict, stats):
    """The clients' recorded uploads (dense, one array per block) as a ClientStats."""
    from privfed.stats import ClientStats

    arrays = {block: np.concatenate(values) for block, values in parts.items()}
    return ClientStats(counts=arrays["counts"], sums=arrays["sums"], second=arrays.get("second"),
                       owners=stats.owners)


def _ledger_scales(hook) -> dict:
    """Block -> the Gaussian noise std the hook's ledger books for its latest release (what the report uses)."""
    events = list(getattr(getattr(hook, "ledger", None), "events", ()) or ())
    if not events:
        return {}
    last = max(e.release_id for e in events)
    return {e.block: float(e.scale) for e in events if e.release_id == last and e.mechanism == "gaussian"}


def server_view(head, ptap: Tap, stap: "Tap | None") -> dict:
    """What the server (or the user) receives from one ``fit``: arrays, metadata, report, stated noise."""
    rep = head.privacy
    C, d = np.shape(head.weight)
    by_shape = {(C,): "counts", (1, C): "counts", (C, d): "sums", (1, C, d): "sums", (d, d): "second",
                (1, d, d): "second"}
    if C == d:  # sums and second moment have the same shape: which is which is not stated
        by_shape = {s: b for s, b in by_shape.items() if b == "counts"}
    if stap is not None and stap.sums:
        arrays = list(stap.sums)
        names = [by_shape.get(tuple(np.shape(a))) for a in arrays]
    elif rep is not None and rep.placement == "central" and ptap.aggregate is not None:
        named = ptap.aggregate.arrays()
        arrays, names = list(named.values()), list(named)
    elif ptap.uploads is not None:
        named = ptap.uploads.arrays()
        arrays, names = list(named.values()), list(named)
    else:
        arrays, names = [], []
    scales = _ledger_scales(ptap.stream_target)
    noise = tuple((i, scales[b]) for i, b in enumerate(names) if b in scales)
    up = head.upload_bytes or {}
    meta = (
        head.weight.shape,
        tuple(sorted((str(k), v) for k, v in up.items())),
        tuple(head.notes),
    )
    return {"arrays": arrays, "meta": meta, "report": rep, "noise": noise}


def fit_release(method: str, make_privacy: Callable[[], object], make_secure_agg: Callable[[], object] | None = None,
                **params) -> Callable[[dict, int], dict]:
    """A release through :func:`privfed.fit`, as a user runs it, for :func:`audit_release`.

    ``make_privacy`` / ``make_secure_agg`` build fresh objects per draw; the
    returned arrays are what the server receives (each noisy upload with
    local noise, the noisy aggregate with a trusted aggregator, the secure
    sums under secure aggregation).
    """
    import privfed

    def run(data: dict, seed: int) -> dict:
        ptap = Tap(make_privacy())
        stap = None if make_secure_agg is None else Tap(make_secure_agg())
        head = privfed.fit(method, random_state=seed, privacy=ptap, secure_agg=stap, **data, **params)
        return server_view(head, ptap, stap)

    return run


def tradeoff_release(cfg, method: str, epsilon: float, clip: float | None, secure: str = "none",
                     **params) -> Callable[[dict, int], dict]:
    """The trade-off sweep's path (``tradeoff_privacy.make_privacy`` + the pipeline's two stages)."""
    from privfed import methods as _methods
    from privfed.pipeline import client_statistics, server_head
    from privfed.tradeoff_privacy import make_privacy, make_secure_agg

    def run(data: dict, seed: int) -> dict:
        m = _methods.get(method, **params)
        sa = make_secure_agg(secure)
        stap = None if sa is None else Tap(sa)
        ptap = Tap(make_privacy(cfg, m, epsilon, clip, secure_agg=stap))
        declare = getattr(ptap, "declare_randomness", None)
        if declare is not None:
            declare(seeded=True)
        K, C = int(data["num_clients"]), int(data["num_classes"])
        rng = np.random.default_rng(seed)  # None: OS entropy (the sweep still declares a seeded simulation)
        stats = client_statistics(m, np.asarray(data["features"], float), np.asarray(data["labels"]),
                                  np.asarray(data["clients"]), num_classes=C, num_clients=K, rng=rng,
                                  privacy=ptap, secure_agg=stap)
        head = server_head(m, stats, num_clients=K, rng=rng, privacy=ptap, secure_agg=stap)
        return server_view(head, ptap, stap)

    return run


def rounds_release(*, epsilon: float, clip: float, rounds: int = 3, delta: float = 1e-5, level: str = "record",
                   placement: str = "central", secure: str = "none", clip_norm: str = "l2",
                   max_records: int | None = None, tolerate: int = 0) -> Callable[[dict, "int | None"], dict]:
    """The multi-round FedLog release path on frozen features: R rounds of one statistic, one ledger.

    Each client's upload is the augmented statistic [n_c, s_c] (C, d + 1) of its clipped features,
    bounded at client level to ``max_records`` records' worth (:meth:`RoundsDP.bound_uploads`); every
    round is one :class:`RoundRelease` call with the run's noise generator
    (:func:`privfed.fedlog_rounds.noise_generator`: OS entropy for ``seed=None``, else a seeded
    simulation, declared so).  The arrays are the R released sums.
    """
    from privfed.fedlog_rounds import RoundRelease, RoundsDP, noise_generator

    def run(data: dict, seed) -> dict:
        F = np.asarray(data["features"], dtype=np.float64)
        y = np.asarray(data["labels"], dtype=np.int64)
        k = np.asarray(data["clients"], dtype=np.int64)
        K, C = int(data["num_clients"]), int(data["num_classes"])
        d = F.shape[1]
        dp = RoundsDP(epsilon=epsilon, delta=delta, clip=clip, clip_norm=clip_norm, rounds=rounds, level=level,
                      placement=placement, record_bound="theorem" if level == "record" else "auto",
                      max_records=max_records, dim=d, bodies_trained=False, tolerate=tolerate)
        dp.declare_randomness(seeded=seed is not None, noise_seed=seed)
        Fc = dp.clipping(F) if F.size else F
        A = np.zeros((K, C, d + 1))
        np.add.at(A, (k, y, 0), 1.0)
        np.add.at(A[..., 1:], (k, y), Fc)
        release = RoundRelease(dp, secure, num_clients=K)
        rng = noise_generator(seed, 0x0153)
        arrays = [release(A, rng) for _ in range(rounds)]
        rep = dp.report()
        noise = tuple((i, float(e.scale)) for i, e in enumerate(dp.ledger.events))
        meta = (tuple(np.shape(a) for a in arrays), len(dp.ledger.events))
        return {"arrays": arrays, "meta": meta, "report": rep, "noise": noise}

    return run
