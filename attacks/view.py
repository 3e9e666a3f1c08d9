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

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from privfed.errors import ConfigError, InputError
from privfed.stats import STAT_FIELDS, ClientStats

__all__ = [
    "COUNT_NOISE_KINDS",
    "GroundTruth",
    "NoiseSpec",
    "PublicData",
    "ServerView",
    "class_groups",
    "clip_rows",
    "count_noise",
]

#: Count-noise variants of FedCOF App. I.1 plus the discrete Laplace (two-sided geometric).
COUNT_NOISE_KINDS = ("laplace", "geometric", "gaussian", "uniform")


#: ``name`` of the count-noise mechanisms of :mod:`mechanisms.count_noise` -> count-noise kind.
_COUNT_MECHANISMS = {"laplace": "laplace", "geometric": "geometric", "gaussian-counts": "gaussian",
                     "uniform (no DP guarantee)": "uniform"}


def clip_rows(features: np.ndarray, clip: float) -> np.ndarray:
    """Scale every row to L2 norm at most ``clip`` (rows inside the ball are unchanged)."""
    F = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(F, axis=1, keepdims=True)
    return F * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def class_groups(labels, n: int, rng: np.random.Generator, *, max_groups: int | None = None) -> np.ndarray:
    """Client ids putting ``n`` samples of one class on each client (leftovers get -1, not uploaded).

    The controlled federation of the attack curves: every released class
    mean averages exactly ``n`` records.  ``max_groups`` caps the number of
    clients (taken round-robin over classes).
    """
    y = np.asarray(labels).astype(np.int64)
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ConfigError(f"n must be a positive int, got n={n!r}")
    n = int(n)
    clients = np.full(y.size, -1, dtype=np.int64)
    per_class = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        per_class.append([idx[i * n:(i + 1) * n] for i in range(idx.size // n)])
    order = [g for tier in range(max((len(p) for p in per_class), default=0)) for p in per_class
             if tier < len(p) for g in [p[tier]]]
    if max_groups is not None:
        order = order[: int(max_groups)]
    if not order:
        raise InputError(f"no class has {n} samples; lower n")
    for k, g in enumerate(order):
        clients[g] = k
    return clients


def count_noise(
    counts: np.ndarray,
    kind: str,
    *,
    epsilon: float,
    rng: np.random.Generator,
    delta: float | None = None,
) -> np.ndarray:
    """Perturb class counts as FedCOF App. I.1: ``max(n + noise, 0)``.

    Parameters
    ----------
    counts : ndarray
        True counts n (any shape).
    kind : {"laplace", "geometric", "gaussian", "uniform"}
        ``laplace``: Laplace(0, 1/eps) (eps-DP, sensitivity 1);
        ``geometric``: two-sided geometric with ratio exp(-eps) (eps-DP, integer);
        ``gaussian``: N(0, s^2) with s the analytic-Gaussian sigma of (eps, delta)
        at sensitivity 1 (Balle & Wang 2018, via dp-accounting);
        ``uniform``: U(-(1 - eps) n, (1 - eps) n), the paper's heuristic: it has
        *no* DP guarantee (a zero count stays exactly zero at every eps).
    epsilon : float
        Privacy parameter (for ``uniform``, the width parameter in (0, 1]).
    rng : numpy.random.Generator
    delta : float, optional
        Required for ``gaussian``.

    Returns
    -------
    ndarray
        Noisy counts, clipped at 0 (float64).
    """
    n = np.asarray(counts, dtype=np.float64)
    if kind not in COUNT_NOISE_KINDS:
        raise ConfigError(f"unknown count noise {kind!r}; choose from {list(COUNT_NOISE_KINDS)}")
    if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"count-noise epsilon must be a finite number > 0, got epsilon={epsilon!r}")
    if kind == "laplace":
        noise = rng.laplace(0.0, 1.0 / epsilon, size=n.shape)
    elif kind == "geometric":
        p = 1.0 - math.exp(-epsilon)
        noise = (rng.geometric(p, size=n.shape) - rng.geometric(p, size=n.shape)).astype(np.float64)
    elif kind == "gaussian":
        if delta is None or not 0 < delta < 1:
            raise ConfigError(f"gaussian count noise needs 0 < delta < 1, got delta={delta!r}")
        noise = rng.normal(0.0, gaussian_sigma(epsilon, delta), size=n.shape)
    else:
        if epsilon > 1:
            raise ConfigError(f"uniform count noise needs 0 < epsilon <= 1 (width (1 - eps) n), got {epsilon}")
        w = (1.0 - epsilon) * n
        noise = rng.uniform(-1.0, 1.0, size=n.shape) * w
    return np.maximum(n + noise, 0.0)


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Analytic-Gaussian sigma per unit L2 sensitivity for one (eps, delta) release (the mechanisms' calibration)."""
    from mechanisms.calibration import analytic_sigma

    return analytic_sigma(float(epsilon), float(delta))


@dataclass(frozen=True)
class NoiseSpec:
    """What noise the released statistics carry, as plain data.

    Parameters
    ----------
    sigma : mapping str -> float
        Standard deviation of the Gaussian noise added to every coordinate of
        each statistic block (``sums``, ``second``, ``class_second``,
        ``counts``).  Symmetric blocks get noise on the upper triangle,
        mirrored (privacy.md).  A block absent from the mapping is released
        without Gaussian noise.
    count_kind : str, optional
        Count noise from :data:`COUNT_NOISE_KINDS` (replaces Gaussian count noise).
    count_epsilon, count_delta : float, optional
        Parameters of the count noise.
    clip : float, optional
        L2 bound every feature was clipped to before the statistics.
    level : {"record", "client"}
        ``record``: each client's upload is noised before it leaves the
        client; ``client``: noise is added to the all-client sum only.
    epsilon, delta : float, optional
        The claimed budget (reporting only; ``inf`` for no noise).
    guarantee : str
        A short description of the formal guarantee ("none" for the clean
        release or the uniform heuristic).
    """

    sigma: Mapping[str, float] = field(default_factory=dict)
    count_kind: str | None = None
    count_epsilon: float | None = None
    count_delta: float | None = None
    clip: float | None = None
    level: str = "record"
    epsilon: float = math.inf
    delta: float = 0.0
    guarantee: str = "none"

    def __post_init__(self) -> None:
        sig = dict(self.sigma)
        for k, v in sig.items():
            if k not in STAT_FIELDS:
                raise ConfigError(f"NoiseSpec.sigma has unknown block {k!r}; blocks are {list(STAT_FIELDS)}")
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"sigma must be finite and non-negative, got sigma[{k!r}]={v!r}")
        object.__setattr__(self, "sigma", sig)
        if self.level not in ("record", "client"):
            raise ConfigError(f"level must be 'record' or 'client', got {self.level!r}")
        if self.count_kind is not None and self.count_kind not in COUNT_NOISE_KINDS:
            raise ConfigError(f"unknown count noise {self.count_kind!r}; choose from {list(COUNT_NOISE_KINDS)}")
        if self.clip is not None and not (self.clip > 0 and math.isfinite(self.clip)):
            raise ConfigError(f"clip must be a finite number > 0, got clip={self.clip!r}")

    @classmethod
    def none(cls) -> "NoiseSpec":
        """The clean release."""
        return cls()

    @classmethod
    def gaussian(
        cls,
        *,
        epsilon: float,
        delta: float,
        clip: float,
        blocks=("counts", "sums"),
        level: str = "record",
    ) -> "NoiseSpec":
        """One Gaussian release of the concatenated blocks, calibrated exactly.

        This is ``GaussianMechanism(..., split="joint")``'s noise (one sigma for
        every block), not the default mechanism's ``split="equal"``: to attack
        the release a mechanism makes, pass the mechanism itself to
        :meth:`ServerView.from_federation`, which runs its release.

        Add/remove-one sensitivity after clipping to ``clip`` (methods.md
        section 4): sums c, counts 1, second moment c^2 (Frobenius), per-class
        second moments c^2; jointly sqrt of the sum of squares.  Every block
        gets the same sigma = Delta * sigma_1(eps, delta) (analytic Gaussian,
        Balle & Wang 2018), so the release is (eps, delta)-DP with GDP
        mu = 1 / sigma_1.  ``epsilon = inf`` gives the clean (clipped) release.
        """
        if not (clip > 0 and math.isfinite(clip)):
            raise ConfigError(f"clip must be a finite number > 0, got clip={clip!r}")
        if math.isinf(epsilon):
            return cls(clip=clip, level=level, epsilon=math.inf, delta=0.0, guarantee="none")
        if not epsilon > 0:
            raise ConfigError(f"epsilon must be > 0 (or inf), got epsilon={epsilon!r}")
        if not 0 < delta < 1:
            raise ConfigError(f"delta must be in (0, 1), got delta={delta!r}")
        sens2 = {"sums": clip**2, "counts": 1.0, "second": clip**4, "class_second": clip**4}
        unknown = set(blocks) - set(sens2)
        if unknown:
            raise ConfigError(f"unknown block(s) {sorted(unknown)}; blocks are {list(sens2)}")
        Delta = math.sqrt(sum(sens2[b] for b in blocks))
        s = Delta * gaussian_sigma(epsilon, delta)
        return cls(sigma={b: s for b in blocks}, clip=clip, level=level, epsilon=float(epsilon),
                   delta=float(delta), guarantee=f"({epsilon:g}, {delta:g})-DP Gaussian, {level} level")

    @classmethod
    def from_mechanism(cls, mechanism: Any, method: Any = None, *, num_clients: int = 1,
                       secure_agg: bool = False) -> "NoiseSpec":
        """The noise on what the server sees, read off a mechanism object (duck-typed).

        Uses ``mechanism.sigma`` (block -> std of the noise one sum carries),
        ``clip_bound``, ``level``, ``epsilon``, ``delta`` and, without secure
        aggregation, ``upload_noise_variance(method, num_clients)`` (the noise
        on each client's own upload: zero where a trusted aggregator noises
        only the sum, so the server sees every clean upload).
        """
        kind = _COUNT_MECHANISMS.get(getattr(mechanism, "name", None))
        if kind is not None and hasattr(mechanism, "perturb"):  # a count-noise mechanism
            eps = float(mechanism.epsilon)
            return cls(count_kind=kind, count_epsilon=eps, count_delta=getattr(mechanism, "delta", None),
                       epsilon=eps, delta=float(getattr(mechanism, "delta", 0.0) or 0.0),
                       guarantee=f"{type(mechanism).__name__}(epsilon={eps:g}): counts only"
                       + ("" if getattr(mechanism, "dp", True) else ", NO DP GUARANTEE"))
        sigma = getattr(mechanism, "sigma", None) or {}
        if not isinstance(sigma, Mapping):
            raise ConfigError(f"mechanism {mechanism!r} has no per-block sigma mapping; pass a NoiseSpec instead")
        sigma = {k: float(v) for k, v in sigma.items() if k in STAT_FIELDS}
        upload = getattr(mechanism, "upload_noise_variance", None)
        if not secure_agg and upload is not None:
            sigma = {k: math.sqrt(max(float(v), 0.0)) for k, v in upload(method, num_clients).items()
                     if k in STAT_FIELDS}
        clip = getattr(mechanism, "clip_bound", None)
        clipping = getattr(mechanism, "clipping", None)
        if clipping is not None and getattr(clipping, "norm", "l2") != "l2":
            clip = None
        eps = float(getattr(mechanism, "epsilon", math.inf))
        return cls(
            sigma=sigma,
            clip=None if clip is None else float(clip),
            level=str(getattr(mechanism, "level", "record")),
            epsilon=eps,
            delta=float(getattr(mechanism, "delta", 0.0) or 0.0),
            guarantee=f"{type(mechanism).__name__}(epsilon={eps:g}, level={getattr(mechanism, 'level', '?')})",
        )

    @property
    def is_clean(self) -> bool:
        return not any(v > 0 for v in self.sigma.values()) and self.count_kind is None

    def add(self, stats: ClientStats, rng: np.random.Generator) -> ClientStats:
        """Noise every row of ``stats`` as specified (counts clipped at 0)."""
        new: dict[str, np.ndarray] = {}
        for name, arr in stats.arrays().items():
            s = self.sigma.get(name, 0.0)
            if name == "counts" and self.count_kind is not None:
                noisy = count_noise(arr, self.count_kind, epsilon=self.count_epsilon, delta=self.count_delta,
                                    rng=rng)
                new[name] = noisy
                # FedCOF App. I.1: the client sends its exact class mean, so the sum becomes n~ * mean
                # (a cell clipped to 0 is not sent at all).
                if "sums" in stats.available and self.sigma.get("sums", 0.0) <= 0:
                    ratio = np.where(arr > 0, noisy / np.where(arr > 0, arr, 1.0), 0.0)
                    new["sums"] = stats.sums * ratio[..., None]
                continue
            if s <= 0:
                continue
            if name in ("second", "class_second"):
                z = rng.normal(0.0, s, size=arr.shape)
                z = np.triu(z) + np.swapaxes(np.triu(z, 1), -1, -2)
                new[name] = arr + z
            elif name == "counts":
                new[name] = np.maximum(arr + rng.normal(0.0, s, size=arr.shape), 0.0)
            else:
                new[name] = arr + rng.normal(0.0, s, size=arr.shape)
        return stats.with_arrays(**new) if new else stats

    def as_dict(self) -> dict:
        return {
            "sigma": dict(self.sigma), "count_kind": self.count_kind, "count_epsilon": self.count_epsilon,
            "count_delta": self.count_delta, "clip": self.clip, "level": self.level,
            "epsilon": self.epsilon, "delta": self.delta, "guarantee": self.guarantee,
        }


@dataclass(frozen=True, eq=False)
class PublicData:
    """The attacker's public data: images, labels and their backbone features.

    Parameters
    ----------
    images : ndarray, shape (n, H, W), values in [0, 1], optional
    labels : int ndarray, shape (n,)
    features : ndarray, shape (n, d)
    """

    labels: np.ndarray
    features: np.ndarray
    images: np.ndarray | None = None

    def __post_init__(self) -> None:
        y = np.asarray(self.labels).astype(np.int64)
        F = np.asarray(self.features, dtype=np.float64)
        if F.ndim != 2 or y.shape != (F.shape[0],):
            raise InputError(f"PublicData needs features (n, d) and labels (n,), got {F.shape} and {y.shape}")
        object.__setattr__(self, "labels", y)
        object.__setattr__(self, "features", F)
        if self.images is not None:
            im = np.asarray(self.images, dtype=np.float32)
            if im.shape[0] != F.shape[0]:
                raise InputError(f"PublicData.images has {im.shape[0]} rows but features has {F.shape[0]}")
            object.__setattr__(self, "images", im)

    def class_means(self, num_classes: int) -> np.ndarray:
        """Public class-mean features (C, d); the overall mean for a class absent from the public data."""
        out = np.tile(self.features.mean(axis=0), (num_classes, 1))
        for c in range(num_classes):
            m = self.labels == c
            if m.any():
                out[c] = self.features[m].mean(axis=0)
        return out

    def class_mean_images(self, num_classes: int) -> np.ndarray:
        """Public class-mean images (C, H, W): the prior an inversion must beat."""
        if self.images is None:
            raise InputError("PublicData has no images; pass public images to use an image prior")
        out = np.tile(self.images.mean(axis=0), (num_classes, 1, 1))
        for c in range(num_classes):
            m = self.labels == c
            if m.any():
                out[c] = self.images[m].mean(axis=0)
        return out


@dataclass(frozen=True, eq=False)
class GroundTruth:
    """The private data the attacks are scored against (never read by an attack).

    Parameters
    ----------
    features : ndarray (N, d)
        The clients' raw (unclipped) features.
    labels, clients : int ndarray (N,)
        Class and client of every sample (client -1: not uploaded).
    images : ndarray (N, H, W), optional
    holdout_features, holdout_labels, holdout_images : optional
        Non-members from the same distribution (the negatives of membership games).
    """

    features: np.ndarray
    labels: np.ndarray
    clients: np.ndarray
    images: np.ndarray | None = None
    holdout_features: np.ndarray | None = None
    holdout_labels: np.ndarray | None = None
    holdout_images: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("features", "holdout_features"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, np.asarray(v, dtype=np.float64))
        for name in ("labels", "clients", "holdout_labels"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, np.asarray(v).astype(np.int64))
        N = self.features.shape[0]
        if self.labels.shape != (N,) or self.clients.shape != (N,):
            raise InputError(f"GroundTruth: labels and clients must have shape ({N},)")


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

    def with_(self, **changes) -> "ServerView":
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
    ) -> "ServerView":
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
            notes.append("client-level noise lands on the sum only; without secure aggregation the server "
                         "still sees every clean upload")
        return cls(method=method, stats=stats, per_client=not secure_agg, secure_agg=secure_agg, noise=noise,
                   backbone=backbone, public=public, notes=tuple(notes))

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
        **method_params: Any,
    ) -> "ServerView":
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
        secure_agg : bool or secure-aggregation object
            Truthy: the server learns only the all-client sums.
        backbone, public :
            The attacker's side knowledge.
        num_classes : int, optional
        rng : Generator or int
            Randomness of the method (multi-mean sampling) and of the noise.
        **method_params
            Parameters of the method.
        """
        from privfed import methods as _methods
        from privfed._validation import check_features, check_labels

        m = _methods.get(method, **method_params) if isinstance(method, str) else method
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)
        F = check_features(features)
        y, C = check_labels(labels, F.shape[0], num_classes)
        k = np.asarray(clients).astype(np.int64)
        if k.shape != y.shape:
            raise InputError(f"clients has shape {k.shape} but labels has {y.shape}; they must match")
        keep = k >= 0
        F, y, k = F[keep], y[keep], k[keep]
        K = int(k.max()) + 1
        secure = bool(secure_agg)
        if secure and m.per_client and type(m).secure_aggregate is _methods.Method.secure_aggregate:
            raise ConfigError(f"method {m.name!r} needs individual client statistics and has no secure "
                              "protocol; run it without secure_agg")
        if privacy is None or isinstance(privacy, NoiseSpec):
            spec = privacy or NoiseSpec()
            if spec.clip is not None:
                F = clip_rows(F, spec.clip)
            stats = m.client_stats(F, y, k, num_classes=C, num_clients=K, rng=rng)
            exposed = set(m.requires)
            if secure and m.per_client:
                exposed = {"counts", "sums"}
            view = cls.from_stats(stats, method=m.name, fields=exposed, secure_agg=secure, noise=spec, rng=rng,
                                  backbone=backbone, public=public)
        else:
            view = cls._from_release(m, F, y, k, C, K, privacy, secure_agg if secure else None, rng,
                                     backbone=backbone, public=public)
        if secure and m.per_client:
            view = view.with_(notes=view.notes + ("two-round secure protocol: the summed spread matrix of "
                                                  "round 2 is not part of this view",))
        return view

    @classmethod
    def _from_release(cls, m, F, y, k, C, K, privacy, secure_agg, rng, *, backbone, public) -> "ServerView":
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
            F, y, k, num_classes=C, num_clients=K, rng=rng, keep_uploads=True)
        seen = head.trace.server_view()
        secure = protection is not None
        spec = NoiseSpec.from_mechanism(privacy, m, num_clients=K, secure_agg=secure)
        exposed = set(m.requires) if not (secure and m.per_client) else {"counts", "sums"}
        if seen.kind == "secure-sums":
            stats = _named_sums(seen.arrays, exposed, C, F.shape[1])
        else:
            stats = seen.stats.select(exposed & seen.stats.available)
        return cls(method=m.name, stats=stats, per_client=not secure, secure_agg=secure, noise=spec,
                   backbone=backbone, public=public)

    def __repr__(self) -> str:
        return (f"ServerView(method={self.method!r}, K={self.stats.num_clients}, per_client={self.per_client}, "
                f"fields={sorted(self.fields)}, noise={self.noise.guarantee!r})")


def membership_targets(view: "ServerView", truth: "GroundTruth", max_targets: int, rng: np.random.Generator,
                       attack: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    m = int(max_targets)
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
    if view.noise.clip is not None:
        targets = clip_rows(targets, view.noise.clip)
    labels = np.concatenate([truth.labels[mem], truth.holdout_labels[hold]])
    ids = np.concatenate([mem, -np.ones(hold.size, dtype=np.int64)])
    return targets, labels, ids, np.concatenate([mem, mem])


def paired_mask(target_ids: np.ndarray, owners: np.ndarray, per_client: bool, truth: "GroundTruth",
                partners: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(member, keep)`` for scored (target, row) pairs.

    ``member``: the target is a private record uploaded into that row (its
    client owns the row; any uploaded record under a secure sum).  ``keep``:
    with ``partners`` (aligned with the pairs), only the pairs whose row
    belongs to the partner's client: a member on its own rows, its
    non-member counterpart on the same rows; without, every pair.
    """
    tid = np.asarray(target_ids)
    private = tid >= 0
    client = np.full(tid.shape, -2)
    client[private] = truth.clients[tid[private]]
    member = private & ((client == owners) if per_client else (client >= 0))
    if partners is None:
        return member, np.ones(tid.shape, dtype=bool)
    pc = truth.clients[np.asarray(partners)]
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
