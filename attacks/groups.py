"""The controlled federation of the attack curves: ``n`` records of one class on each client."""

from __future__ import annotations

import numpy as np

from mechanisms.dp.calibration import check_count
from privfed._validation import as_int_vector
from privfed._validation.seeds import check_generator
from privfed.errors import InputError

__all__ = ["class_groups"]


def class_groups(labels, n: int, rng: np.random.Generator, *, max_groups: int | None = None) -> np.ndarray:
    """Client ids putting ``n`` samples of one class on each client (leftovers get -1, not uploaded).

    The controlled federation of the attack curves: every released class
    mean averages exactly ``n`` records.  ``max_groups`` caps the number of
    clients (taken round-robin over classes).
    """
    y = as_int_vector(labels, "labels")  # 0.5, NaN or a 2-D array is no label vector
    if y.size and int(y.min()) < 0:
        raise InputError(f"labels holds {int(y.min())}: labels are classes 0..C-1")
    n = check_count(n, "n")
    rng = check_generator(rng)
    if max_groups is not None:
        max_groups = check_count(max_groups, "max_groups")  # -1 sliced the last group off, 2.7 read as 2
    clients = np.full(y.size, -1, dtype=np.int64)
    per_class = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        per_class.append([idx[i * n : (i + 1) * n] for i in range(idx.size // n)])
    order = [
        g
        for tier in range(max((len(p) for p in per_class), default=0))
        for p in per_class
        if tier < len(p)
        for g in [p[tier]]
    ]
    if max_groups is not None:
        order = order[:max_groups]
    if not order:
        raise InputError(f"no class has {n} samples; lower n")
    for k, g in enumerate(order):
        clients[g] = k
    return clients
