"""The threat model as data: what an honest-but-curious server received.

A :class:`ServerView` holds exactly what the server saw for one method and
one protection (attacks.md, "Threat model as data"): the statistics it
received, per client or only the all-client sum under secure aggregation;
which statistics those are (the method's ``requires``); the noise
specification (:class:`NoiseSpec`); the frozen backbone; and the attacker's
public data (:class:`PublicData`).  Attacks read a view and nothing else.

The private truth the attacks are scored against lives in a separate
:class:`GroundTruth` (breaching's split between reconstructing and
scoring); attacks never read it.

What each method exposes (methods.md sections 1-2): every method uploads
per client unless secure aggregation is used, so without it the server sees
each client's ``requires`` (FedNCM: counts and class sums; Fed3R / FedCGS:
plus the second moment G_k; FedCOF: means and counts; the FedCOF oracle:
per-class second moments).  Under secure aggregation a sum-only method
exposes only the all-client sums; FedCOF's two-round protocol (FedCOF
paper, App. I.2) exposes the summed counts and class sums (and a summed
spread matrix not modelled here).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attacks.groups import class_groups
from attacks.knowledge import GroundTruth, PublicData
from attacks.noise_spec import COUNT_NOISE_KINDS, NoiseSpec, count_noise, gaussian_sigma
from attacks.params import secure_agg_of
from privfed.errors import ConfigError, InputError
from privfed.stats import STAT_FIELDS, ClientStats
from privfed.stats.checks import check_upload_finite

__all__ = [
    "COUNT_NOISE_KINDS",
    "GroundTruth",
    "NoiseSpec",
    "PublicData",
    "ServerView",
    "class_groups",
    "clip_rows",
    "count_noise",
    "gaussian_sigma",
]


def clip_rows(features: np.ndarray, clip: float | None, norm: str = "l2") -> np.ndarray:
    """Every row clipped to ``clip`` in ``norm`` (L2, or each coordinate; ``None``: the rows as they are).

    The release's own clipping (:class:`mechanisms.dp.clipping.Clipping`), so a scorer compares a recovered
    record with the record exactly as the client clipped it.
    """
    from mechanisms.dp.clipping import Clipping

    F = np.asarray(features, dtype=np.float64)
    return F if clip is None else Clipping(clip, norm)(F)


@dataclass(frozen=True, eq=False)
class ServerView:
    """Exactly what the server received.

    Parameters
    ----------
    method : str
        The method whose uploads these are.
    stats : ClientStats
        What arrived: one row per client (``per_client``) or one row, the
        all-client sum (secure aggregation).  Only the exposed fields are set.
    per_client : bool
        Whether rows are individual clients' uploads.
    secure_agg : bool
    noise : NoiseSpec
        How the statistics were noised (the attacker knows the mechanism).
    backbone : torch.nn.Module, optional
        The frozen feature extractor (public).
    public : PublicData, optional
        The attacker's own labelled data.
    num_classes : int
    notes : tuple of str
    """

    method: str
    stats: ClientStats
    per_client: bool
    secure_agg: bool = False
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    backbone: Any = None
    public: PublicData | None = None
    notes: tuple = ()

    @property
    def fields(self) -> frozenset[str]:
        """The statistics the server holds."""
        return self.stats.available

    @property
    def num_classes(self) -> int:
        return self.stats.num_classes

    def second_moments(self) -> np.ndarray:
        """G_k per row: the uploaded second moments, or the sum of the per-class ones (FedCOF oracle)."""
        if self.stats.second is not None:
            return self.stats.second
        if self.stats.class_second is not None:
            return self.stats.class_second.sum(axis=1)
        raise InputError(f"this view of method {self.method!r} holds no second moment")

    @property
    def available(self) -> frozenset[str]:
        """Every requirement this view can satisfy (statistics plus context).

        ``second`` counts as available when per-class second moments are (their sum is G_k).
        """
        out = set(self.fields)
        if "class_second" in out:
            out.add("second")
        if self.per_client:
            out.add("per_client")
        if self.backbone is not None:
            out.add("backbone")
        if self.public is not None:
            out.add("public")
            if self.public.images is not None:
                out.add("public_images")
        return frozenset(out)

    def require(self, needs, who: str) -> None:
        """Raise :class:`InputError` naming what ``who`` needs and this view lacks."""
        missing = set(needs) - self.available
        if missing:
            hints = {
                "per_client": "individual client uploads (the view is a secure-aggregation sum)",
                "backbone": "the backbone (pass backbone=...)",
                "public": "public data (pass public=PublicData(...))",
                "public_images": "public images (pass PublicData(images=...))",
            }
            what = ", ".join(hints.get(m, f"the statistic {m!r}") for m in sorted(missing))
            raise InputError(
                f"attack {who!r} needs {what}, which this view of method {self.method!r} "
                f"(fields {sorted(self.fields)}, secure_agg={self.secure_agg}) does not have"
            )

    def __post_init__(self) -> None:
        # NaN or inf in what the server holds is a corrupt view: an attack on it would find nothing and report
        # "nothing exposed" (the singleton and differencing attacks did), an audit then reads no risk
        check_upload_finite(
            self.stats, f"the server view ({self.method})", None, "being attacked (nothing would be found)"
        )
        d = self.stats.dim
        if self.public is not None and self.public.features.shape[1] != d:
            raise InputError(
                f"PublicData.features has {self.public.features.shape[1]} columns but the statistics have d={d}: "
                "the attacker's public data must come from the same backbone"
            )

    def with_(self, **changes) -> ServerView:
        return replace(self, **changes)

    @classmethod
    def from_stats(
        cls,
        stats: ClientStats,
        *,
        method: str = "custom",
        fields=None,
        secure_agg: bool = False,
        noise: NoiseSpec | None = None,
        rng: np.random.Generator | None = None,
        backbone: Any = None,
        public: PublicData | None = None,
    ) -> ServerView:
        """The view of uploads ``stats`` (clean, per client), noised per ``noise``.

        ``noise.level == "record"`` noises each client's row before summing;
        ``"client"`` noises only the sum (so it needs ``secure_agg=True``, or the
        server would see the clean per-client rows anyway).
        """
        noise = noise or NoiseSpec()
        if fields is not None:
            stats = stats.select(fields)
        if not noise.is_clean and rng is None:
            raise ConfigError("a noisy view needs rng=np.random.Generator(...) to draw the noise")
        notes = []
        if noise.level == "record" and not noise.is_clean:
            stats = noise.add(stats, rng)
        if secure_agg:
            stats = stats.total()
            if noise.level == "client" and not noise.is_clean:
                stats = noise.add(stats, rng)
        elif noise.level == "client" and not noise.is_clean:
            notes.append(
                "client-level noise lands on the sum only; without secure aggregation the server "
                "still sees every clean upload"
            )
            # The rows this server reads carry no noise: the attacks must not model any (they would be
            # weaker than the server is), and no budget holds against it.  The clip stays: it shaped them.
            noise = replace(
                noise,
                sigma={},
                count_kind=None,
                count_epsilon=None,
                count_delta=None,
                epsilon=float("inf"),
                delta=0.0,
                guarantee="none (client-level noise on the sum only; the server sees the clean uploads)",
            )
        return cls(
            method=method,
            stats=stats,
            per_client=not secure_agg,
            secure_agg=secure_agg,
            noise=noise,
            backbone=backbone,
            public=public,
            notes=tuple(notes),
        )

    @classmethod
    def from_federation(
        cls,
        method: str,
        features,
        labels,
        clients,
        *,
        privacy: Any = None,
        secure_agg: Any = False,
        backbone: Any = None,
        public: PublicData | None = None,
        num_classes: int | None = None,
        rng: np.random.Generator | int | None = None,
        num_clients: int | None = None,
        **method_params: Any,
    ) -> ServerView:
        """Build the server's view of one federation.

        Parameters
        ----------
        method : str
            A method name (:func:`privfed.methods.available`); its ``requires``
            are the statistics exposed.
        features, labels, clients : arrays
            The private data (clients -1: dropped samples, not uploaded).
        privacy : NoiseSpec or mechanism, optional
            A :class:`NoiseSpec`, or a mechanism object with the pipeline's
            ``clip`` / ``before_upload`` / ``after_aggregate`` hooks (its noise
            specification is read with :meth:`NoiseSpec.from_mechanism`).
        secure_agg : bool, "none", "mask", "ckks" or a secure-aggregation object
            True or a protocol: the server learns only the all-client sums.
        backbone, public :
            The attacker's side knowledge.
        num_classes, num_clients : int, optional
            The public sizes of the release (C and K); ``None`` takes them
            from the labels and the client ids.
        rng : Generator or int
            Randomness of the method (multi-mean sampling) and of the noise.
        **method_params
            Parameters of the method.
        """
        from privfed import methods as _methods
        from privfed._validation import as_int_vector, check_features, check_labels, check_num_classes
        from privfed._validation.seeds import as_generator

        m = _methods.get(method, **method_params) if isinstance(method, str) else method
        rng = as_generator(rng, "rng")  # None: seed 0; a seed outside 0..2**64 - 1 is one line
        F = check_features(features)
        y, C = check_labels(labels, F.shape[0], num_classes)
        k = as_int_vector(clients, "clients")  # an id of 2.5 is refused, never read as 2
        if k.shape != y.shape:
            raise InputError(f"clients has shape {k.shape} but labels has {y.shape}; they must match")
        if k.size and k.min() < -1:  # -2 is a typo, not a second way to say "not uploaded"
            raise InputError(
                f"clients: id {int(k.min())} is below -1; client ids are 0..K-1, and -1 marks a sample "
                "that was not uploaded"
            )
        keep = k >= 0
        if not keep.any() and num_clients is None:
            raise InputError(
                "clients: every id is -1 (no sample uploaded), so there is no federation to attack; give the "
                "uploaded samples their client ids 0..K-1"
            )
        F, y, k = F[keep], y[keep], k[keep]
        # True or 2.5 was cast to 1 or 2 and the error then showed the cast value
        K = int(k.max()) + 1 if num_clients is None else check_num_classes(num_clients, "num_clients")
        if k.size and k.max() >= K:
            raise InputError(f"clients contains {int(k.max())}, out of range for num_clients={K}")
        secure_agg = secure_agg_of(secure_agg)
        secure = secure_agg is not False
        if (
            privacy is not None
            and not isinstance(privacy, NoiseSpec)
            and not hasattr(privacy, "after_aggregate")
        ):
            raise ConfigError(
                f"privacy must be a NoiseSpec or a mechanism (e.g. GaussianMechanism), got {privacy!r}"
            )
        if secure and m.per_client and type(m).secure_aggregate is _methods.Method.secure_aggregate:
            raise ConfigError(
                f"method {m.name!r} needs individual client statistics and has no secure "
                "protocol; run it without secure_agg"
            )
        if privacy is None or isinstance(privacy, NoiseSpec):
            spec = privacy or NoiseSpec()
            F = clip_rows(F, spec.clip, spec.clip_norm)
            stats = m.client_stats(F, y, k, num_classes=C, num_clients=K, rng=rng)
            exposed = set(m.requires)
            if secure and m.per_client:
                exposed = {"counts", "sums"}
            view = cls.from_stats(
                stats,
                method=m.name,
                fields=exposed,
                secure_agg=secure,
                noise=spec,
                rng=rng,
                backbone=backbone,
                public=public,
            )
        else:
            view = cls._from_release(
                m,
                F,
                y,
                k,
                C,
                K,
                privacy,
                secure_agg if secure else None,
                rng,
                backbone=backbone,
                public=public,
            )
        if secure and m.per_client:
            view = view.with_(
                notes=view.notes
                + ("two-round secure protocol: the summed spread matrix of round 2 is not part of this view",)
            )
        return view

    @classmethod
    def _from_release(cls, m, F, y, k, C, K, privacy, secure_agg, rng, *, backbone, public) -> ServerView:
        """The view read off the release itself: run the release plan and take what its trace says the
        server received (under ``secure_agg=True``, the ideal functionality of secure aggregation)."""
        import copy

        from privfed.release import ReleasePlan
        from privfed.release.ideal import IdealSecureSum

        # A private copy: building the view must not append releases to the caller's ledger.
        privacy = copy.deepcopy(privacy)
        protection = None
        if secure_agg is not None:
            protection = IdealSecureSum() if isinstance(secure_agg, bool) else copy.deepcopy(secure_agg)
        head = ReleasePlan.build(m, privacy, protection).run(
            F, y, k, num_classes=C, num_clients=K, rng=rng, keep_uploads=True
        )
        seen = head.trace.server_view()
        secure = protection is not None
        spec = NoiseSpec.from_mechanism(privacy, m, num_clients=K, secure_agg=secure)
        exposed = set(m.requires) if not (secure and m.per_client) else {"counts", "sums"}
        if seen.kind == "secure-sums":
            stats = _named_sums(seen.arrays, exposed, C, F.shape[1])
        else:
            stats = seen.stats.select(exposed & seen.stats.available)
        return cls(
            method=m.name,
            stats=stats,
            per_client=not secure,
            secure_agg=secure,
            noise=spec,
            backbone=backbone,
            public=public,
        )

    def __repr__(self) -> str:
        return (
            f"ServerView(method={self.method!r}, K={self.stats.num_clients}, per_client={self.per_client}, "
            f"fields={sorted(self.fields)}, noise={self.noise.guarantee!r})"
        )


def membership_targets(
    view: ServerView, truth: GroundTruth, max_targets: int, rng: np.random.Generator, attack: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The membership game's targets: up to ``max_targets`` uploaded private records (members), each paired
    with a holdout record of the same class (its non-member counterpart), clipped as the clients clipped so a
    member matches its upload.

    The pairing makes the game measure membership and nothing else: a scorer
    (``score(..., partners)``) tests each member on its own client's released
    rows and its counterpart on exactly the same rows, so members and
    non-members meet rows of one distribution (a non-member is never tested
    on a row that holds no data, e.g. the pure noise a DP client releases for
    a class it lacks).  Members whose class has no holdout record left are
    not drawn.

    Returns ``(targets, target_labels, target_ids, partners)``: id -1 for
    non-members; ``partners`` is the member record whose rows each target is
    tested on (a member's own id; for a non-member, its counterpart's id).
    """
    if truth.holdout_features is None:
        raise InputError(f"{attack} evaluation needs GroundTruth.holdout_features (non-members)")
    from mechanisms.dp.calibration import check_count
    from privfed._validation.seeds import check_generator

    m = check_count(max_targets, "max_targets")  # -5 took all but 5 pairs, True one
    rng = check_generator(rng)
    up = rng.permutation(np.flatnonzero(truth.clients >= 0))
    yl, hl = np.asarray(truth.labels)[up], np.asarray(truth.holdout_labels)
    mem_parts, hold_parts = [], []
    for c in np.unique(yl):
        pool = rng.permutation(np.flatnonzero(hl == c))
        mc = np.flatnonzero(yl == c)[: pool.size]  # positions in the member draw order
        mem_parts.append(mc)
        hold_parts.append(pool[: mc.size])
    if not mem_parts:
        raise InputError(f"{attack} evaluation needs uploaded private records (members); none was uploaded")
    pos = np.concatenate(mem_parts)
    hold_all = np.concatenate(hold_parts)
    keep = np.argsort(pos, kind="stable")[:m]  # the first m pairs in the member draw order
    mem, hold = up[pos[keep]], hold_all[keep]
    if mem.size == 0:
        raise InputError(f"{attack} evaluation needs holdout records of the members' classes; none matches")
    targets = np.concatenate([truth.features[mem], truth.holdout_features[hold]])
    targets = clip_rows(targets, view.noise.clip, view.noise.clip_norm)
    labels = np.concatenate([truth.labels[mem], truth.holdout_labels[hold]])
    ids = np.concatenate([mem, -np.ones(hold.size, dtype=np.int64)])
    return targets, labels, ids, np.concatenate([mem, mem])


def paired_mask(
    target_ids: np.ndarray,
    owners: np.ndarray,
    per_client: bool,
    truth: GroundTruth,
    partners: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(member, keep)`` for scored (target, row) pairs.

    ``member``: the target is a private record uploaded into that row (its
    client owns the row; any uploaded record under a secure sum).  ``keep``:
    with ``partners`` (aligned with the pairs), only the pairs whose row
    belongs to the partner's client: a member on its own rows, its
    non-member counterpart on the same rows; without, every pair.
    """
    from attacks.params import index_vector

    N = truth.clients.shape[0]
    tid = index_vector(
        target_ids, "target_ids", N, low=-1, what="ids for this truth (-1: a non-member; i: truth row i)"
    )
    if owners is not None and tid.shape != np.shape(owners):
        raise InputError(
            f"target_ids must have one id per scored pair ({np.shape(owners)[0]}), got {tid.shape}"
        )
    private = tid >= 0
    client = np.full(tid.shape, -2)
    client[private] = truth.clients[tid[private]]
    member = private & ((client == owners) if per_client else (client >= 0))
    if partners is None:
        return member, np.ones(tid.shape, dtype=bool)
    pc = truth.clients[index_vector(partners, "partners", N, what="truth rows")]
    keep = (pc == owners) if per_client else (pc >= 0)
    return member, keep


def _named_sums(arrays, exposed, C: int, d: int) -> ClientStats:
    """The secure-sum outputs as a one-row ClientStats of the exposed statistics.

    A method asks for its sums in :data:`privfed.stats.STAT_FIELDS` order (FedCOF's protocol: counts,
    class sums, then its own terms), so each exposed statistic is the first output of its shape not
    taken by an earlier one.
    """
    shapes = {"counts": (C,), "sums": (C, d), "second": (d, d), "class_second": (C, d, d)}
    out, used = {}, set()
    for name in [f for f in STAT_FIELDS if f in exposed]:
        i = next((i for i, a in enumerate(arrays) if i not in used and np.shape(a) == shapes[name]), None)
        if i is None:
            raise InputError(f"the secure sums hold no {name} of shape {shapes[name]}")
        used.add(i)
        out[name] = np.asarray(arrays[i], dtype=np.float64)[None]
    return ClientStats(**out)
