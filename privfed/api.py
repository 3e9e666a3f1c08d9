"""The one-call entry point :func:`fit`."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from privfed import methods as _methods
from privfed import scaling
from privfed._validation import (
    as_int_vector,
    check_dataset,
    check_features,
    check_labels,
    check_num_classes,
    check_real_dtype,
    check_release_size,
    refuse_masked,
    release_cost_note,
)
from privfed._validation.seeds import as_generator
from privfed.errors import ConfigError, InputError
from privfed.head import LinearHead
from privfed.release import ReleasePlan
from privfed.release.pipeline import run_federation
from privfed.release.plan import check_hooks
from privfed.release.stages import check_release_memory
from privfed.stats import dense_view_limit

__all__ = ["fit"]


def fit(
    method: str,
    features,
    labels,
    clients=None,
    *,
    num_classes: int | None = None,
    num_clients: int | None = None,
    privacy: Any = None,
    secure_agg: Any = None,
    random_state=None,
    **params: Any,
) -> LinearHead:
    """Fit a federated linear head on frozen features.

    Parameters
    ----------
    method : str
        A name from :func:`privfed.methods.available`.
    features : array, shape (N, d)
        Frozen-backbone features of every client's training samples.
    labels : int array, shape (N,)
        Class of each sample, in ``0..C-1``.
    clients : int array, shape (N,), optional
        Client of each sample, in ``0..K-1`` with no empty client.  ``None``
        puts every sample on one client (the centralised case).
    num_classes : int, optional
        C; defaults to ``max(labels) + 1``.  Every class must have data,
        except under ``privacy``, where C is a public parameter of the
        release: it is required (never taken from the data) and a class
        without records is handled from the noisy statistics.
    num_clients : int, optional
        K; defaults to ``max(clients) + 1``.  Under ``privacy`` with
        ``clients`` given, K is a public parameter of the release: it is
        required (never taken from the data) and a client may hold no record.
    privacy : mechanism, optional
        A privacy mechanism from :mod:`mechanisms` (clipping and noise).
    secure_agg : optional
        A secure-aggregation protocol from :mod:`mechanisms`.
    random_state : None, int or numpy.random.Generator
        Randomness of the method (multi-mean sampling), of the noise and of
        a mechanism's Poisson client sampling (``sampling_rate < 1``).
        With ``privacy`` or ``secure_agg``, ``None`` (the default) draws
        fresh entropy from the operating system, so nobody can replay the
        noise or the sample; a seed or a Generator makes the run a
        reproducible *simulation* whose noise and sample can be replayed,
        and its privacy report says so.  Without either, ``None`` means
        seed 0.
    **params
        The method's parameters (e.g. ``lam`` for fed3r, ``gamma`` for fedcof).

    Returns
    -------
    LinearHead
        ``weight`` (C, d), ``bias`` (C,), ``predict``, ``score``, plus
        ``notes``, ``upload_bytes``, ``privacy`` and ``trace`` (what the release
        did, stage by stage, and what the server received:
        :class:`privfed.release.ReleaseTrace`).
    """
    if isinstance(method, _methods.Method) and params:
        raise ConfigError(
            f"parameters {sorted(params)} cannot be applied to the Method object {method!r}; pass them when "
            f"building it ({type(method).__name__}(...)) or name the method by string: fit({method.name!r}, ..., "
            f"{', '.join(f'{k}=...' for k in sorted(params))})"
        )
    m = _methods.get(method, **params) if isinstance(method, str) else method
    if not isinstance(m, _methods.Method):
        raise ConfigError(f"method must be a name from {_methods.available()} or a Method, got {method!r}")
    dense_view_limit()  # a malformed $PRIVFED_DENSE_VIEW_LIMIT is refused before any work, as the commands do
    check_hooks(privacy, secure_agg)  # "mask" or True for an object: one line naming the object, not mid-run
    if privacy is None:
        _refuse_unclipped_noise(secure_agg)
        # float32 stays float32: the statistics convert it a chunk at a time (float64 sums, no N x d copy)
        F, y, k, C, K = check_dataset(
            features, labels, clients, num_classes, every_class=True, keep_float32=True
        )
        if num_clients is not None and _check_num_clients(num_clients) != K:
            raise InputError(
                (
                    f"num_clients={num_clients} but no clients were given (every sample on one client)"
                    if clients is None
                    else f"num_clients={num_clients} but clients numbers {K} client(s), 0..{K - 1}"
                )
                + "; without privacy every client must hold data: leave num_clients out, or give each client data"
            )
        absent = np.flatnonzero(np.bincount(y, minlength=C) == 0)
        if absent.size:
            raise InputError(
                f"class(es) {absent[:10].tolist()} have no sample on any client; "
                "re-encode labels without gaps or pass a smaller num_classes"
            )
    else:
        # Under DP nothing may be refused or shaped from the raw data: a class or a client without
        # records is handled from the noisy statistics (every client uploads every class).
        F, y, k, C, K = _check_private_dataset(features, labels, clients, num_classes, num_clients)
    if secure_agg is not None and K < 2:
        # a sum of one upload is that upload: no protocol hides it, and the masked sum refuses mid-run
        raise InputError(
            "secure_agg sums the uploads of K >= 2 clients, but this run has 1 client (clients=None puts every "
            "sample on one client): pass clients with at least two ids"
        )
    protected = privacy is not None or secure_agg is not None
    dense = protected and not ReleasePlan(m, privacy, secure_agg).streamed
    check_release_memory(m, F.shape[1], C, K, dense_uploads=dense)  # before any allocation
    if privacy is not None:
        note = release_cost_note(K, C, F.shape[1], local=not getattr(privacy, "trusted_aggregator", False))
        if note:  # a large run says so before it starts
            warnings.warn(note, UserWarning, stacklevel=2)
    private_run = privacy is not None or getattr(secure_agg, "noise", None) is not None
    if random_state is None and private_run:
        rng = np.random.default_rng()  # fresh OS entropy: the noise cannot be replayed
    else:
        rng = as_generator(random_state, "random_state")
    seeded = random_state is not None
    for hook in (privacy, secure_agg):
        declare = getattr(hook, "declare_randomness", None)
        if declare is not None:
            declare(seeded=seeded)
    # statistics exact in float64, or one clear error; a rescaling is in place only on our own copy
    F, scaled = scaling.prepare(m, F, privacy, owned=_is_private_copy(F, features), labels=y)
    head = run_federation(
        m,
        F,
        y,
        k,
        num_classes=C,
        num_clients=K,
        rng=rng,
        privacy=privacy,
        secure_agg=secure_agg,
        seeded=seeded,
    )
    return scaling.finish(head, scaled)


def _is_private_copy(F: np.ndarray, features) -> bool:
    """Whether validation made ``F`` as a new array (from a list, or another dtype): then nobody else holds it."""
    if not isinstance(features, (np.ndarray, list, tuple)) or F is features or not F.flags.owndata:
        return False
    return not (isinstance(features, np.ndarray) and np.may_share_memory(F, features))


def _refuse_unclipped_noise(secure_agg: Any) -> None:
    """Distributed noise needs a sensitivity that the pipeline enforces; without a mechanism nothing clips."""
    if getattr(secure_agg, "noise", None) is not None:
        raise ConfigError(
            "secure_agg carries DistributedGaussian noise but no privacy mechanism clips the records, so the "
            "sensitivity it is calibrated for is not enforced; pass privacy=GaussianMechanism(..., clip=C) "
            "with the secure_agg protocol (its clients split the noise) and no noise= on the protocol"
        )


def _check_num_clients(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"num_clients must be an integer >= 1, got num_clients={value!r}")
    return int(value)


def _private_features(features) -> np.ndarray:
    """Features of a private run: no rows at all is a dataset like any other (the release is noise)."""
    arr = features
    if getattr(arr, "ndim", None) == 2 and arr.shape[0] == 0 and arr.shape[1] > 0:
        refuse_masked(arr, "features")
        check_real_dtype(np.asarray(arr), "features")  # no rows, but still no complex or text features
        return np.zeros((0, arr.shape[1]))
    return check_features(features)


def _check_private_dataset(features, labels, clients, num_classes, num_clients=None):
    """Validate a dataset for a private run: empty classes, empty clients and no records are allowed.

    The number of classes and of clients are public parameters of a release: they must be passed
    (never taken from the data), and clients are numbered ``0..K-1``.
    """
    missing = [
        n
        for n, v in (("num_classes", num_classes), ("num_clients", num_clients if clients is not None else 1))
        if v is None
    ]
    if missing:
        raise ConfigError(
            f"under privacy {' and '.join(missing)} must be given: they are public parameters of the release "
            "(the shape of what every client sends), and taken from the data a record of a new class or "
            f"client would change the release's shape; pass {', '.join(n + '=...' for n in missing)} to fit"
        )
    F = _private_features(features)
    check_release_size(1, check_num_classes(num_classes), F.shape[1], F.shape[0])  # before any allocation
    if not F.shape[0]:  # no records: labels and clients must hold none either (not be read past)
        for name, v in (("labels", labels), ("clients", clients)):
            n = 0 if v is None else np.size(np.asarray(v, dtype=object))
            if n:
                raise InputError(f"{name} has {n} entries but features has 0 rows; they must match")
    y, C = (
        check_labels(labels, F.shape[0], num_classes) if F.shape[0] else (np.zeros(0, np.int64), num_classes)
    )
    K = None if num_clients is None else _check_num_clients(num_clients)
    if K is not None:
        check_release_size(K, C, F.shape[1], F.shape[0])
    if clients is None:
        if K not in (None, 1):
            raise InputError(f"num_clients={K} but no clients were given (every sample on one client)")
        return F, y, np.zeros(F.shape[0], dtype=np.int64), C, 1
    k = as_int_vector(clients, "clients") if F.shape[0] else np.zeros(0, np.int64)
    if k.shape[0] != F.shape[0]:
        raise InputError(
            f"clients has {k.shape[0]} entries but features has {F.shape[0]} rows; they must match"
        )
    if k.size and k.min() < 0:
        raise InputError(f"clients must be >= 0, found {int(k.min())}; number clients 0..K-1")
    if k.size and k.max() >= K:
        raise InputError(f"clients contains {int(k.max())}, out of range for num_clients={K}")
    return F, y, k, C, K
