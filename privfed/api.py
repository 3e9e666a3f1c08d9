"""The one-call entry point :func:`fit`."""

from __future__ import annotations

from typing import Any

import numpy as np

from privfed import _scale
from privfed import methods as _methods
from privfed._validation import as_generator, check_dataset
from privfed.errors import ConfigError, InputError
from privfed.head import LinearHead
from privfed.pipeline import run_federation

__all__ = ["fit"]


def fit(
    method: str,
    features,
    labels,
    clients=None,
    *,
    num_classes: int | None = None,
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
        C; defaults to ``max(labels) + 1``.  Every class must have data.
    privacy : mechanism, optional
        A privacy mechanism from :mod:`mechanisms` (clipping and noise).
    secure_agg : optional
        A secure-aggregation protocol from :mod:`mechanisms`.
    random_state : None, int or numpy.random.Generator
        Randomness of the method (multi-mean sampling) and of the noise.
    **params
        The method's parameters (e.g. ``lam`` for fed3r, ``gamma`` for fedcof).

    Returns
    -------
    LinearHead
        ``weight`` (C, d), ``bias`` (C,), ``predict``, ``score``, plus
        ``notes``, ``upload_bytes`` and ``privacy``.
    """
    m = _methods.get(method, **params) if isinstance(method, str) else method
    if not isinstance(m, _methods.Method):
        raise ConfigError(f"method must be a name from {_methods.available()} or a Method, got {method!r}")
    F, y, k, C, K = check_dataset(features, labels, clients, num_classes, every_class=True)
    absent = np.flatnonzero(np.bincount(y, minlength=C) == 0)
    if absent.size:
        raise InputError(
            f"class(es) {absent[:10].tolist()} have no sample on any client; "
            "re-encode labels without gaps or pass a smaller num_classes"
        )
    rng = as_generator(random_state, "random_state")
    F, scaled = _scale.prepare(m, F, privacy)  # statistics exact in float64, or one clear error
    head = run_federation(m, F, y, k, num_classes=C, num_clients=K, rng=rng, privacy=privacy, secure_agg=secure_agg)
    return _scale.finish(head, scaled)
