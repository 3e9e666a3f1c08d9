"""Release paths for the black-box auditor: each returns what a server or a user receives.

A *run* is a callable ``(dataset kwargs, seed) -> dict`` for :func:`privfed.audit.audit_release`
(``seed=None``: as a user who gives no seed):

* :func:`fit_release`: :func:`privfed.fit` with a mechanism and a secure-aggregation protocol;
* :func:`tradeoff_release`: the trade-off sweep's path (``settings.make_privacy`` and the
  pipeline's two stages);
* :func:`rounds_release`: the multi-round FedLog release (:class:`privfed.rounds.RoundsDP`
  and :class:`~privfed.rounds.RoundRelease`, as ``run_rounds`` uses them) over R rounds
  of frozen features;
* the Flower app: :func:`privfed.flower.audit.flower_release`.

Each returns ``arrays`` (the noisy uploads with local noise, the noisy aggregate with a trusted
aggregator, the secure sums under secure aggregation, the released sums of every round),
``meta``, ``report`` and ``noise`` (the std the ledger books for each array, for the noise-scale
check), all read off the release's own trace (:class:`privfed.release.ReleaseTrace`): the auditor
sees what the release sent, never a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from privfed.release import keeping_uploads

__all__ = ["fit_release", "rounds_release", "server_view", "tradeoff_release"]


def _ledger_scales(events) -> dict:
    """Block -> the Gaussian noise std the release's events book (its latest release: what the report uses)."""
    events = [e for e in events if e.get("mechanism") == "gaussian"]
    if not events:
        return {}
    last = max(e["release_id"] for e in events)
    return {e["block"]: float(e["scale"]) for e in events if e["release_id"] == last}


def server_view(head) -> dict:
    """What the server (or the user) receives from one release, read off its trace: arrays, metadata,
    report, stated noise.

    With a trusted aggregator that is the noisy sum it releases; otherwise what the server received (each
    noisy upload with local noise, the outputs of a secure-sum protocol).  The release must have kept its
    uploads (:func:`privfed.release.keeping_uploads`) where it streams them.
    """
    rep = head.privacy
    seen = head.trace.release_view()
    C, d = np.shape(head.weight)
    by_shape = {
        (C,): "counts",
        (1, C): "counts",
        (C, d): "sums",
        (1, C, d): "sums",
        (d, d): "second",
        (1, d, d): "second",
    }
    if C == d:  # sums and second moment have the same shape: which is which is not stated
        by_shape = {s: b for s, b in by_shape.items() if b == "counts"}
    if seen.kind == "secure-sums":
        arrays = list(seen.arrays)
        names = [by_shape.get(tuple(np.shape(a))) for a in arrays]
    elif seen.stats is not None:
        named = seen.stats.arrays()
        arrays, names = list(named.values()), list(named)
    else:
        arrays, names = [], []
    scales = _ledger_scales(head.trace.events)
    noise = tuple((i, scales[b]) for i, b in enumerate(names) if b in scales)
    up = head.upload_bytes or {}
    meta = (
        head.weight.shape,
        tuple(sorted((str(k), v) for k, v in up.items())),
        tuple(head.notes),
    )
    return {"arrays": arrays, "meta": meta, "report": rep, "noise": noise}


def fit_release(
    method: str,
    make_privacy: Callable[[], object],
    make_secure_agg: Callable[[], object] | None = None,
    **params,
) -> Callable[[dict, int], dict]:
    """A release through :func:`privfed.fit`, as a user runs it, for :func:`audit_release`.

    ``make_privacy`` / ``make_secure_agg`` build fresh objects per draw; the
    returned arrays are what the server receives (each noisy upload with
    local noise, the noisy aggregate with a trusted aggregator, the secure
    sums under secure aggregation).
    """
    import privfed

    def run(data: dict, seed: int) -> dict:
        secure = None if make_secure_agg is None else make_secure_agg()
        with keeping_uploads():
            head = privfed.fit(
                method, random_state=seed, privacy=make_privacy(), secure_agg=secure, **data, **params
            )
        return server_view(head)

    return run


def tradeoff_release(
    cfg, method: str, epsilon: float, clip: float | None, secure: str = "none", **params
) -> Callable[[dict, int], dict]:
    """The trade-off sweep's path (``settings.make_privacy`` + the pipeline's two stages)."""
    from privfed import methods as _methods
    from privfed.release.pipeline import client_statistics, server_head
    from privfed.release.settings import make_privacy, make_secure_agg

    def run(data: dict, seed: int) -> dict:
        m = _methods.get(method, **params)
        sa = make_secure_agg(secure)
        privacy = make_privacy(cfg, m, epsilon, clip, secure_agg=sa)
        declare = getattr(privacy, "declare_randomness", None)
        if declare is not None:
            declare(seeded=True)
        K, C = int(data["num_clients"]), int(data["num_classes"])
        rng = np.random.default_rng(seed)  # None: OS entropy (the sweep still declares a seeded simulation)
        stats = client_statistics(
            m,
            np.asarray(data["features"], float),
            np.asarray(data["labels"]),
            np.asarray(data["clients"]),
            num_classes=C,
            num_clients=K,
            rng=rng,
            privacy=privacy,
            secure_agg=sa,
        )
        head = server_head(
            m, stats, num_clients=K, rng=rng, privacy=privacy, secure_agg=sa, keep_uploads=True
        )
        return server_view(head)

    return run


def rounds_release(
    *,
    epsilon: float,
    clip: float,
    rounds: int = 3,
    delta: float = 1e-5,
    level: str = "record",
    placement: str = "central",
    secure: str = "none",
    clip_norm: str = "l2",
    max_records: int | None = None,
    tolerate: int = 0,
) -> Callable[[dict, int | None], dict]:
    """The multi-round FedLog release path on frozen features: R rounds of one statistic, one ledger.

    Each client's upload is the augmented statistic [n_c, s_c] (C, d + 1) of its clipped features,
    bounded at client level to ``max_records`` records' worth (:meth:`RoundsDP.bound_uploads`); every
    round is one :class:`RoundRelease` call with the run's noise generator
    (:func:`privfed.rounds.noise_generator`: OS entropy for ``seed=None``, else a seeded
    simulation, declared so).  The arrays are the R released sums.
    """
    from privfed.rounds import RoundRelease, RoundsDP, noise_generator

    def run(data: dict, seed) -> dict:
        F = np.asarray(data["features"], dtype=np.float64)
        y = np.asarray(data["labels"], dtype=np.int64)
        k = np.asarray(data["clients"], dtype=np.int64)
        K, C = int(data["num_clients"]), int(data["num_classes"])
        d = F.shape[1]
        dp = RoundsDP(
            epsilon=epsilon,
            delta=delta,
            clip=clip,
            clip_norm=clip_norm,
            rounds=rounds,
            level=level,
            placement=placement,
            record_bound="theorem" if level == "record" else "auto",
            max_records=max_records,
            dim=d,
            bodies_trained=False,
            tolerate=tolerate,
        )
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
