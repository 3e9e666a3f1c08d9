"""Splitting a training set over federated clients.

Every scheme returns a :class:`Partition`: a client id per sample (``-1`` for
a sample the scheme leaves out) plus the scheme's parameters.  Nothing is
hidden: :meth:`Partition.report` lists empty clients, single-sample clients,
dropped samples and singleton (client, class) pairs, and
:meth:`Partition.apply` drops only what the report names.

Schemes (the methods page of the docs says which paper's code uses which):

``"dirichlet"``
    FedNCM (Legate et al.) / FedCOF (Goswami et al., Sec. 5): client k draws
    class proportions p_k ~ Dir(alpha 1_C) and receives exactly floor(N/K)
    samples drawn from Multinomial(p_k) without replacement from a shared
    pool; a class whose pool is exhausted is removed and p_k renormalised over
    the classes left.  No client is empty; the N - K floor(N/K) leftover
    samples are dropped.
``"dirichlet-class"``
    FedCGS (Guan et al.) / NIID-bench (Li et al.): for each class,
    proportions over clients ~ Dir(alpha 1_K) (a client already holding N/K
    samples gets no more), the class's samples cut at the cumulative
    proportions; the whole draw is repeated until every client has at least
    ``min_size`` samples.
``"shards"``
    FedLog (Yu et al., Sec. 5): every client holds exactly
    ``classes_per_client`` distinct classes (client k gets classes
    ``perm[(k s + j) mod C]``, j < s, of a random class permutation); each
    class's samples are split evenly over the clients holding it.
``"iid"``
    A random permutation cut into K near-equal parts.
``"natural"``
    The client ids a feature file provides, passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privfed._validation import as_int_vector
from privfed._validation.seeds import as_generator
from privfed.errors import ConfigError, InputError

__all__ = ["Partition", "available_schemes", "check_alpha", "partition"]


def _check_labels(labels, num_classes: int | None = None) -> tuple[np.ndarray, int]:
    y = as_int_vector(labels, "labels")
    if y.size == 0:
        raise InputError("labels is empty; pass at least one sample")
    if y.min() < 0:
        raise InputError(f"labels must be >= 0, found {int(y.min())}; encode classes as 0..C-1")
    C = int(y.max()) + 1
    if num_classes is None and C > y.size:  # refused before anything is sized by C
        raise InputError(
            f"labels contains {C - 1} but there are only {y.size} samples, so most classes have none; "
            "re-encode labels as 0..C-1"
        )
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
        if C > num_classes:
            raise InputError(f"labels contains {C - 1}, out of range for num_classes={num_classes}")
        C = int(num_classes)
    return y, C


@dataclass(frozen=True, eq=False)
class Partition:
    """Assignment of samples to clients.

    Parameters
    ----------
    clients : ndarray of int64, shape (N,)
        Client id per sample in ``0..K-1``, or ``-1`` for a sample the scheme
        leaves out (the Dirichlet scheme's leftovers).
    num_clients : int
        K, including clients that may have received no sample.
    scheme : str
        The scheme that produced it.
    params : dict
        The scheme's parameters (alpha, seed description, tries, ...).
    """

    clients: np.ndarray
    num_clients: int
    scheme: str
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = np.array(as_int_vector(self.clients, "Partition.clients"))  # 1.7 refused, not read as client 1
        n = self.num_clients
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise InputError(f"Partition.num_clients must be an integer >= 1, got {self.num_clients!r}")
        if k.size and (k.min() < -1 or k.max() >= self.num_clients):
            raise InputError(f"Partition.clients must lie in -1..{self.num_clients - 1}")
        k.setflags(write=False)
        object.__setattr__(self, "clients", k)
        object.__setattr__(self, "num_clients", int(self.num_clients))

    @property
    def num_samples(self) -> int:
        """N, including dropped samples."""
        return int(self.clients.size)

    @property
    def dropped(self) -> np.ndarray:
        """Indices of the samples no client received."""
        return np.flatnonzero(self.clients < 0)

    def sizes(self) -> np.ndarray:
        """Samples per client, shape (K,)."""
        kept = self.clients[self.clients >= 0]
        return np.bincount(kept, minlength=self.num_clients).astype(np.int64)

    def class_counts(self, labels, num_classes: int | None = None) -> np.ndarray:
        """n_kc: samples of class c on client k, shape (K, C)."""
        y, C = _check_labels(labels, num_classes)
        if y.size != self.clients.size:
            raise InputError(
                f"labels has {y.size} entries but the partition covers {self.clients.size} samples; "
                "they must match"
            )
        keep = self.clients >= 0
        flat = self.clients[keep] * C + y[keep]
        return np.bincount(flat, minlength=self.num_clients * C).reshape(self.num_clients, C).astype(np.int64)

    def report(self, labels=None, num_classes: int | None = None) -> dict[str, Any]:
        """What the partition looks like, problems included.

        Returns
        -------
        dict
            ``scheme``, ``params``, ``num_clients``, ``num_samples``,
            ``dropped_samples``, ``sizes`` (min / max / mean / list),
            ``empty_clients`` and ``single_sample_clients`` (id lists).  With
            ``labels``: ``classes_per_client`` (list and min / max / mean),
            ``clients_per_class``, ``singleton_pairs`` (number of (client,
            class) pairs holding exactly one sample, and the first pairs) and
            ``classes_without_data`` (classes no kept sample has).  ``warnings``
            spells out every problem in words.
        """
        sizes = self.sizes()
        empty = np.flatnonzero(sizes == 0)
        single = np.flatnonzero(sizes == 1)
        out: dict[str, Any] = {
            "scheme": self.scheme,
            "params": dict(self.params),
            "num_clients": self.num_clients,
            "num_samples": self.num_samples,
            "dropped_samples": int(self.dropped.size),
            "sizes": {
                "min": int(sizes.min()) if sizes.size else 0,
                "max": int(sizes.max()) if sizes.size else 0,
                "mean": float(sizes.mean()) if sizes.size else 0.0,
                "per_client": sizes.tolist(),
            },
            "empty_clients": empty.tolist(),
            "single_sample_clients": single.tolist(),
        }
        warnings = []
        if "num_clients_ignored" in self.params:
            warnings.append(
                f"num_clients={self.params['num_clients_ignored']} ignored: the natural split has "
                f"{self.num_clients} clients"
            )
        if self.dropped.size:
            warnings.append(
                f"{self.dropped.size} of {self.num_samples} samples are assigned to no client (dropped)"
            )
        if empty.size:
            warnings.append(f"{empty.size} client(s) have no sample: {empty[:10].tolist()}")
        if single.size:
            warnings.append(f"{single.size} client(s) hold a single sample: {single[:10].tolist()}")
        if labels is not None:
            n_kc = self.class_counts(labels, num_classes)
            cpc = (n_kc > 0).sum(axis=1)
            singles = np.argwhere(n_kc == 1)
            no_data = np.flatnonzero(n_kc.sum(axis=0) == 0)
            out.update(
                {
                    "num_classes": int(n_kc.shape[1]),
                    "classes_per_client": {
                        "min": int(cpc.min()),
                        "max": int(cpc.max()),
                        "mean": float(cpc.mean()),
                        "per_client": cpc.tolist(),
                    },
                    "clients_per_class": (n_kc > 0).sum(axis=0).tolist(),
                    "singleton_pairs": {"count": int(singles.shape[0]), "first": singles[:20].tolist()},
                    "classes_without_data": no_data.tolist(),
                }
            )
            if singles.shape[0]:
                warnings.append(
                    f"{singles.shape[0]} (client, class) pair(s) hold a single sample: their class mean "
                    "is that sample's feature"
                )
            if no_data.size:
                warnings.append(f"class(es) {no_data[:10].tolist()} have no sample on any client")
        out["warnings"] = warnings
        return out

    def apply(self, features, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keep the assigned samples and renumber non-empty clients ``0..K'-1``.

        Dropped samples (``-1``) and empty clients are removed (see
        :meth:`report` for how many); client order is kept.

        Returns
        -------
        features : ndarray, shape (N', d)
        labels : ndarray, shape (N',)
        clients : ndarray of int64, shape (N',), ids in ``0..K'-1``
        """
        F = np.asarray(features)
        y = np.asarray(labels)
        n = self.clients.size
        if F.ndim < 1 or F.shape[0] != n:
            raise InputError(
                f"features has {F.shape[0] if F.ndim else 0} rows but the partition covers {n} samples"
            )
        if y.ndim != 1 or y.shape[0] != n:
            raise InputError(
                f"labels has {y.shape[0] if y.ndim else 0} entries but the partition covers {n} samples"
            )
        keep = self.clients >= 0
        sizes = self.sizes()
        new_id = np.full(self.num_clients, -1, dtype=np.int64)
        nonempty = np.flatnonzero(sizes > 0)
        new_id[nonempty] = np.arange(nonempty.size)
        return F[keep], y[keep], new_id[self.clients[keep]]

    def __repr__(self) -> str:
        return (
            f"Partition(scheme={self.scheme!r}, K={self.num_clients}, N={self.num_samples}, "
            f"dropped={self.dropped.size}, params={self.params})"
        )


# -- schemes ----------------------------------------------------------------------


def _draw_class_counts(
    p: np.ndarray, left: np.ndarray, need: int, rng: np.random.Generator
) -> tuple[np.ndarray, bool]:
    """Class counts of ``need`` draws from ``p`` where class c has only ``left[c]`` samples.

    Each draw follows p renormalised over the classes not yet exhausted.  Drawn
    in batches: a multinomial batch, capped at what is left, with the excess
    draws redrawn.  Rejecting a draw of an exhausted class and drawing again is
    the same law as drawing from the renormalised p, and the draws within a
    batch are exchangeable, so which of them are rejected does not matter.

    Returns the counts and whether p had no mass on the classes left (then the
    classes left are drawn uniformly).
    """
    got = np.zeros(p.size, dtype=np.int64)
    fallback = False
    if need > int(left.sum()):
        raise InputError(f"cannot draw {need} samples from {int(left.sum())} left")  # pragma: no cover
    while need > 0:
        room = left - got
        q = np.where(room > 0, p, 0.0)
        if q.sum() <= 0:  # p put (numerically) no mass on the classes left
            q = (room > 0).astype(np.float64)
            fallback = True
        draw = rng.multinomial(need, q / q.sum())
        accept = np.minimum(draw, room)
        got += accept
        need -= int(accept.sum())
    return got, fallback


def _dirichlet_fixed_size(y, C, K, rng, alpha, **_) -> tuple[np.ndarray, dict]:
    """FedNCM / FedCOF: p_k ~ Dir(alpha), exactly floor(N/K) samples per client."""
    N = y.size
    per_client = N // K
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(C)]
    taken = np.zeros(C, dtype=np.int64)
    avail = np.array([p.size for p in pools], dtype=np.int64)
    out = np.full(N, -1, dtype=np.int64)
    uniform_fallbacks = 0
    for k in range(K):
        p = rng.dirichlet(np.full(C, alpha))
        got, fallback = _draw_class_counts(p, avail - taken, per_client, rng)
        uniform_fallbacks += fallback
        for c in np.flatnonzero(got):
            idx = pools[c][taken[c] : taken[c] + got[c]]
            out[idx] = k
        taken += got
    return out, {"per_client": int(per_client), "uniform_fallbacks": int(uniform_fallbacks)}


def _dirichlet_class(y, C, K, rng, alpha, min_size, max_tries, **_) -> tuple[np.ndarray, dict]:
    """FedCGS / NIID-bench: per-class Dir(alpha) over clients, redrawn until min size holds."""
    N = y.size
    if min_size * K > N:
        raise ConfigError(
            f"min_size={min_size} with num_clients={K} needs {min_size * K} samples but there are {N}; "
            f"lower min_size or num_clients (on the command line: --clients {max(1, N // min_size)} at most)"
        )
    class_idx = [np.flatnonzero(y == c) for c in range(C)]
    for attempt in range(1, max_tries + 1):
        out = np.full(N, -1, dtype=np.int64)
        sizes = np.zeros(K, dtype=np.int64)
        for c in range(C):
            idx = rng.permutation(class_idx[c])
            if idx.size == 0:
                continue
            props = rng.dirichlet(np.full(K, alpha))
            props = props * (sizes < N / K)  # a client already holding N/K samples gets no more
            if props.sum() <= 0:
                props = np.full(K, 1.0 / K)
            props = props / props.sum()
            cuts = (np.cumsum(props) * idx.size).astype(np.int64)[:-1]
            for k, part in enumerate(np.split(idx, cuts)):
                out[part] = k
                sizes[k] += part.size
        if sizes.min() >= min_size:
            return out, {"tries": attempt}
    raise ConfigError(
        f"dirichlet-class could not give every one of {K} clients >= {min_size} samples in {max_tries} "
        f"draws with alpha={alpha}; lower min_size, raise alpha or use fewer clients (on the command line: "
        "--alpha, --clients, or another --partition)"
    )


def _shards(y, C, K, rng, classes_per_client, **_) -> tuple[np.ndarray, dict]:
    """FedLog: s distinct classes per client, each class split evenly over its holders."""
    s = classes_per_client
    present = np.flatnonzero(np.bincount(y, minlength=C) > 0)
    if s > present.size:
        raise ConfigError(
            f"classes_per_client={s} exceeds the {present.size} classes with data; lower classes_per_client"
        )
    perm = rng.permutation(present)
    holders: list[list[int]] = [[] for _ in range(C)]
    for k in range(K):
        for j in range(s):
            holders[int(perm[(k * s + j) % perm.size])].append(k)
    out = np.full(y.size, -1, dtype=np.int64)
    for c in present:
        if not holders[c]:
            continue  # K * s < C: class c goes to nobody (reported as dropped)
        idx = rng.permutation(np.flatnonzero(y == c))
        for k, part in zip(holders[c], np.array_split(idx, len(holders[c]))):
            out[part] = k
    return out, {"unassigned_classes": [int(c) for c in present if not holders[c]]}


def _iid(y, C, K, rng, **_) -> tuple[np.ndarray, dict]:
    out = np.empty(y.size, dtype=np.int64)
    for k, part in enumerate(np.array_split(rng.permutation(y.size), K)):
        out[part] = k
    return out, {}


_SCHEMES: dict[str, Callable[..., tuple[np.ndarray, dict]]] = {
    "dirichlet": _dirichlet_fixed_size,
    "dirichlet-class": _dirichlet_class,
    "shards": _shards,
    "iid": _iid,
    "natural": None,  # type: ignore[dict-item]  # handled in partition()
}


def check_alpha(alpha) -> float:
    """The Dirichlet concentration ``alpha`` as a float, if it is a finite number > 0 (ConfigError otherwise)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise ConfigError(f"alpha must be a finite number > 0 (the Dirichlet concentration), got {alpha!r}")
    alpha = float(alpha)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ConfigError(
            f"alpha must be a finite number > 0, got alpha={alpha}; e.g. 0.1 (non-IID) or 100 (near IID)"
        )
    return alpha


def available_schemes() -> list[str]:
    """Names :func:`partition` accepts."""
    return sorted(_SCHEMES)


def _positive_int(value, name: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}; {fix}")
    return int(value)


def partition(
    labels,
    num_clients: int | None,
    scheme: str = "dirichlet",
    *,
    alpha: float = 0.1,
    rng=None,
    min_size: int = 10,
    classes_per_client: int = 2,
    natural=None,
    max_tries: int = 1000,
) -> Partition:
    """Split samples over ``num_clients`` clients.

    Parameters
    ----------
    labels : int array, shape (N,)
        Classes in ``0..C-1``.
    num_clients : int
        K, between 1 and N.  For ``"natural"`` K is ``max(natural) + 1``: pass
        ``None``; another value is ignored and the report's warnings say so.
    scheme : str
        One of :func:`available_schemes` (see the module docstring).
    alpha : float
        Dirichlet concentration (``"dirichlet"``, ``"dirichlet-class"``);
        smaller is more heterogeneous.  Must be > 0.
    rng : numpy.random.Generator or int, optional
        Randomness (``None`` means seed 0: reproducible).
    min_size : int
        ``"dirichlet-class"``: minimum samples per client.
    classes_per_client : int
        ``"shards"``: classes per client (FedLog: 2 for CIFAR-10, 10 for CIFAR-100).
    natural : int array, shape (N,), optional
        ``"natural"``: the client id of every sample (``0..K-1``).
    max_tries : int
        ``"dirichlet-class"``: draws before giving up.

    Returns
    -------
    Partition

    Raises
    ------
    ConfigError
        Unknown scheme (the message lists the available ones), alpha <= 0,
        num_clients < 1 or > N, ``dirichlet-class`` failing ``max_tries`` times,
        ``"natural"`` without ``natural``.
    InputError
        Bad labels, or ``natural`` of the wrong length or with negative ids.
    """
    if not isinstance(scheme, str) or scheme not in _SCHEMES:
        raise ConfigError(f"unknown partition scheme {scheme!r}; available: {available_schemes()}")
    y, C = _check_labels(labels)
    N = y.size
    if scheme == "natural":
        if natural is None:
            raise ConfigError(
                "scheme 'natural' needs the client id of every sample (natural=, e.g. a feature file's "
                "'clients' array); this data set has none: use another scheme such as 'dirichlet'"
            )
        k = as_int_vector(natural, "natural clients")
        if k.size != N:
            raise InputError(f"natural clients has {k.size} entries but labels has {N}; they must match")
        if k.min() < 0:
            raise InputError(f"natural clients must be >= 0, found {int(k.min())}; number clients 0..K-1")
        K = int(k.max()) + 1
        if K > N:  # refused before anything is sized by K
            raise InputError(
                f"natural clients contains id {K - 1} but there are only {N} samples; renumber clients 0..K-1"
            )
        params: dict[str, Any] = {}
        if num_clients is not None:
            num_clients = _positive_int(num_clients, "num_clients", "leave it None for the natural split")
            if num_clients != K:
                params["num_clients_ignored"] = num_clients  # named in the report's warnings
        return Partition(k, K, "natural", params)
    K = _positive_int(num_clients, "num_clients", f"pass 1 <= num_clients <= {N}")
    if K > N:
        raise ConfigError(
            f"num_clients={K} exceeds the {N} samples; pass 1 <= num_clients <= {N} (on the command line: "
            f"--clients {N} at most)"
        )
    if scheme in ("dirichlet", "dirichlet-class"):
        alpha = check_alpha(alpha)
    if scheme == "dirichlet-class":
        if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 0:
            raise ConfigError(f"min_size must be a non-negative int, got {min_size!r}")
        max_tries = _positive_int(max_tries, "max_tries", "e.g. 1000")
    if scheme == "shards":
        classes_per_client = _positive_int(classes_per_client, "classes_per_client", "e.g. 2")
    gen = as_generator(rng, "rng")
    clients, extra = _SCHEMES[scheme](
        y,
        C,
        K,
        gen,
        alpha=alpha,
        min_size=int(min_size),
        classes_per_client=classes_per_client,
        max_tries=max_tries,
    )
    params: dict[str, Any] = {}
    if scheme in ("dirichlet", "dirichlet-class"):
        params["alpha"] = alpha
    if scheme == "dirichlet-class":
        params["min_size"] = int(min_size)
    if scheme == "shards":
        params["classes_per_client"] = classes_per_client
    if isinstance(rng, (int, np.integer)) or rng is None:
        params["seed"] = 0 if rng is None else int(rng)
    params.update(extra)
    return Partition(clients, K, scheme, params)
