"""What a secure sum carries for each method, and how the server reads the sum.

Sum-only methods (``per_client = False``) securely sum one vector: every
statistic the method requires, flattened in :data:`privfed.stats.STAT_FIELDS`
order.  FedCOF runs its two-round protocol (FedCOF paper, App. I.2, as
:meth:`privfed.methods.fedcof.FedCOF.secure_aggregate`):

round ``fedcof-1``  counts n_kc, class sums s_kc and presence [n_kc > 0]
                    (plus 1/n_kc when ``noise_var > 0``), summed over the
                    node's pseudo-clients;
round ``fedcof-2``  the node's d x d spread
                    sum_c (N_c - 1)/(K_c - 1) n_kc (mu_kc - mu_c)(mu_kc - mu_c)^T
                    from the broadcast N_c, mu_c, K_c of round 1.
"""

from __future__ import annotations

import numpy as np

from privfed.errors import InputError
from privfed.head import LinearHead
from privfed.methods import fedcof as _fedcof
from privfed.stats import STAT_FIELDS, ClientStats

__all__ = [
    "stat_fields",
    "stat_shape",
    "fedcof_head",
    "fedcof_round_vector",
    "fedcof_round1_length",
    "split_sum_vector",
    "sum_vector",
    "sum_vector_length",
]


def stat_fields(method) -> list[str]:
    return [f for f in STAT_FIELDS if f in method.requires]


def stat_shape(name: str, C: int, d: int) -> tuple[int, ...]:
    return {"counts": (C,), "sums": (C, d), "second": (d, d), "class_second": (C, d, d)}[name]


def sum_vector(stats: ClientStats, method) -> np.ndarray:
    """A node's statistics (rows summed) as one flat vector, in STAT_FIELDS order."""
    return np.concatenate([getattr(stats, f).sum(axis=0).ravel() for f in stat_fields(method)])


def sum_vector_length(method, C: int, d: int) -> int:
    return int(sum(np.prod(stat_shape(f, C, d)) for f in stat_fields(method)))


def split_sum_vector(vec: np.ndarray, method, C: int, d: int) -> ClientStats:
    """The summed vector back as a ClientStats with K = 1."""
    out, i = {}, 0
    for f in stat_fields(method):
        shape = stat_shape(f, C, d)
        n = int(np.prod(shape))
        out[f] = vec[i : i + n].reshape((1,) + shape)
        i += n
    if i != vec.size:
        raise InputError(f"a summed vector of length {vec.size} does not match C={C}, d={d}")
    return ClientStats(**out)


def fedcof_round1_length(method, C: int, d: int) -> int:
    return 2 * C + C * d + (C if method.params["noise_var"] > 0 else 0)


def fedcof_round_vector(stats: ClientStats, method, round_name: str, broadcast: dict | None) -> np.ndarray:
    """This node's input to FedCOF's secure round 1 or 2 (see the module docstring)."""
    mask, _ = _fedcof.valid_pairs(stats.counts)
    counts = np.where(mask, stats.counts, 0.0)
    if round_name == "fedcof-1":
        sums = np.where(mask[..., None], stats.sums, 0.0)
        parts = [counts.sum(axis=0), sums.sum(axis=0).ravel(), mask.astype(np.float64).sum(axis=0)]
        if method.params["noise_var"] > 0:
            parts.append(np.where(mask, 1.0 / np.where(mask, stats.counts, 1.0), 0.0).sum(axis=0))
        return np.concatenate(parts)
    if round_name == "fedcof-2":
        if broadcast is None:
            raise InputError("FedCOF round 2 needs the broadcast N_c, mu_c, K_c of round 1")
        N, mu, Kc = broadcast["N"], broadcast["mu"], broadcast["Kc"]
        if mu.shape != (stats.num_classes, stats.dim):
            raise InputError(f"broadcast mu has shape {mu.shape}, expected {(stats.num_classes, stats.dim)}")
        w = _fedcof.spread_weights(N, Kc)
        spread = _fedcof.spread_matrix(stats.counts, stats.sums, mu, w, mask, per_client=True)
        return spread.sum(axis=0).ravel()
    raise InputError(f"unknown secure round {round_name!r}")


def fedcof_broadcast(vec1: np.ndarray, method, C: int, d: int) -> dict[str, np.ndarray]:
    """N_c, S_c, mu_c, K_c (and sum_k 1/n_kc) from round 1's sum."""
    N = vec1[:C]
    S = vec1[C : C + C * d].reshape(C, d)
    Kc = np.rint(vec1[C + C * d : 2 * C + C * d])
    mu = np.where(N[:, None] > 0, S / np.where(N > 0, N, 1.0)[:, None], 0.0)
    out = {"N": N, "S": S, "mu": mu, "Kc": Kc}
    if method.params["noise_var"] > 0:
        out["inv"] = vec1[2 * C + C * d :]
    return out


def fedcof_head(method, round1: dict[str, np.ndarray], spread: np.ndarray) -> LinearHead:
    """The head of FedCOF's secure protocol from the two sums (as ``FedCOF.secure_aggregate``)."""
    N, S, mu, Kc = round1["N"], round1["S"], round1["mu"], round1["Kc"]
    notes: list[str] = []
    beta = None
    if method.params["noise_var"] > 0:
        beta = _fedcof.bias_from_sums(round1["inv"], N, Kc, method.params["noise_var"])
        notes.append(f"noise-aware: subtracted the noise bias (sigma^2={method.params['noise_var']:g})")
    notes += method.class_notes(N, Kc)
    G_hat = _fedcof.within_matrix(N, S, Kc, spread, method.params["gamma"], beta)
    est = _fedcof.FedCOFEstimate(N=N, mu=mu, Kc=Kc, G_hat=G_hat, notes=notes)
    return method.finish(est, rounds=2)
