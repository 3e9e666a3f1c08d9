"""Scoring functions shared by the attacks (the scoring half of breaching's split).

Membership: ROC AUC by the Mann-Whitney statistic (ties count one half),
its standard error by Hanley & McNeil (Radiology 1982, Eq. 2), and the TPR
at a target FPR with the realised FPR and threshold recorded.
Reconstruction: PSNR, SSIM (scikit-image, ``data_range=1``, ``win_size=7``),
cosine, Hungarian-matched cosine and nearest-neighbour identification.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import rankdata

from attacks.params import check_fpr, check_fprs, index_vector
from mechanisms.dp.calibration import as_real
from privfed._validation import check_real_dtype, is_integer
from privfed.errors import InputError, MissingDependencyError

__all__ = [
    "auc",
    "auc_se",
    "cosine",
    "identification",
    "lpips_distance",
    "matched_cosine",
    "membership_metrics",
    "psnr",
    "ssim",
    "tpr_at_fpr",
]


def _vector(values, name: str) -> np.ndarray:
    """``values`` as a 1-D array: a column or a row is flattened; a table of several rows and columns is refused."""
    a = np.asarray(values)
    if sum(n > 1 for n in a.shape) > 1:
        raise InputError(f"{name} must be a 1-D array, one value per target, got shape {a.shape}")
    return a.ravel()


def _scores_labels(scores, members) -> tuple[np.ndarray, np.ndarray]:
    s, m = _vector(scores, "scores"), _vector(members, "members")
    if s.dtype.kind not in "biuf":
        raise InputError(f"scores must be real numbers, got dtype {s.dtype}")
    # only booleans or 0/1 say membership (2, 0.5, NaN or "no" would cast to True: a member)
    if m.dtype.kind not in "biuf" or (m.dtype.kind != "b" and not np.isin(m, (0, 1)).all()):
        raise InputError("members must be booleans or 0/1 (1: a member), one per score")
    s, m = s.astype(np.float64), m.astype(bool)
    if s.shape != m.shape:
        raise InputError(f"scores ({s.shape}) and members ({m.shape}) must have the same length")
    ok = np.isfinite(s)
    if not ok.all():
        raise InputError(f"{int((~ok).sum())} membership scores are NaN/inf; drop those pairs before scoring")
    if m.all() or not m.any():
        raise InputError("membership scoring needs both members and non-members")
    return s, m


def auc(scores, members) -> float:
    """ROC AUC = P(score of a member > score of a non-member), ties counting 1/2."""
    s, m = _scores_labels(scores, members)
    r = rankdata(s)
    n1, n0 = int(m.sum()), int((~m).sum())
    return float((r[m].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auc_se(a: float, n_pos: int, n_neg: int) -> float:
    """Hanley-McNeil standard error of an AUC from ``n_pos`` members and ``n_neg`` non-members."""
    try:
        a = as_real(a)
    except (TypeError, ValueError):
        raise InputError(f"auc_se: a must be an AUC in [0, 1], got a={a!r}") from None
    if not 0.0 <= a <= 1.0:
        raise InputError(f"auc_se: a must be an AUC in [0, 1], got a={a!r}")
    for name, n in (("n_pos", n_pos), ("n_neg", n_neg)):
        if not is_integer(n) or n < 1:
            raise InputError(f"auc_se: {name} must be an integer >= 1 (a count of scored targets), got {n!r}")
    a = min(max(float(a), 1e-12), 1 - 1e-12)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def tpr_at_fpr(scores, members, fpr: float) -> dict:
    """Best TPR among thresholds whose realised FPR is at most ``fpr``.

    Decision rule: member iff score >= threshold.  Returns ``tpr``,
    ``fpr`` (realised), ``threshold`` and the target ``fpr_target``.
    """
    fpr = check_fpr(fpr)  # NaN, 2.0 or -0.1 gave a ValueError or a wrong rate
    s, m = _scores_labels(scores, members)
    neg = np.sort(s[~m])[::-1]
    n0 = neg.size
    allowed = int(math.floor(fpr * n0 + 1e-9))  # false positives allowed
    # Threshold just above the (allowed+1)-th largest negative score.
    if allowed >= n0:
        thr = -np.inf
    else:
        thr = np.nextafter(neg[allowed], np.inf)
    fp = int(np.count_nonzero(s[~m] >= thr))
    tp = int(np.count_nonzero(s[m] >= thr))
    return {"tpr": tp / int(m.sum()), "fpr": fp / n0, "threshold": float(thr), "fpr_target": float(fpr)}


def membership_metrics(scores, members, fprs=(0.01, 0.001)) -> dict:
    """AUC (with Hanley-McNeil SE) and TPR at each FPR in ``fprs`` (realised FPR and threshold kept)."""
    fprs = check_fprs(fprs)
    s, m = _scores_labels(scores, members)
    a = auc(s, m)
    out = {
        "auc": a,
        "auc_se": auc_se(a, int(m.sum()), int((~m).sum())),
        "n_pos": int(m.sum()),
        "n_neg": int((~m).sum()),
    }
    for f in fprs:
        r = tpr_at_fpr(s, m, f)
        tag = f"{f:g}"
        out[f"tpr@{tag}"] = r["tpr"]
        out[f"fpr_realised@{tag}"] = r["fpr"]
        out[f"threshold@{tag}"] = r["threshold"]
    return out


def _check_real(a: np.ndarray, name: str) -> None:
    """Refuse text, objects or complex values (booleans are 0/1 and pass)."""
    if a.dtype.kind != "b":
        check_real_dtype(a, name)


def _as_images(x) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.size == 0:
        raise InputError(f"images must have shape (n, H, W) with n, H, W >= 1, got {a.shape}")
    _check_real(a, "images")
    a = np.asarray(a, dtype=np.float64)
    # NaN or inf has no score (under NaN a diverged reconstruction would read as an exact copy, inf dB)
    if not (np.isfinite(a.min()) and np.isfinite(a.max())):
        raise InputError("images contain NaN or inf values; a reconstruction that diverged has no score")
    return a


def psnr(recon, truth) -> np.ndarray:
    """PSNR in dB per image pair, images in [0, 1] (data range 1); inf for an exact copy."""
    r, t = _as_images(recon), _as_images(truth)
    if r.shape != t.shape:
        raise InputError(f"reconstructions {r.shape} and truths {t.shape} must have the same shape")
    mse = ((r - t) ** 2).reshape(r.shape[0], -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        return np.where(mse > 0, -10.0 * np.log10(np.maximum(mse, 1e-300)), np.inf)


def ssim(recon, truth, win_size: int = 7) -> np.ndarray:
    """SSIM per image pair (scikit-image, data_range=1, Gaussian weights off, ``win_size`` 7)."""
    from skimage.metrics import structural_similarity

    r, t = _as_images(recon), _as_images(truth)
    if r.shape != t.shape:
        raise InputError(f"reconstructions {r.shape} and truths {t.shape} must have the same shape")
    side, w = min(r.shape[1:]), 7 if win_size is None else win_size
    if not is_integer(w) or w < 3 or w % 2 == 0 or w > side:
        raise InputError(
            f"ssim: win_size must be an odd integer in 3..{side} (the images' smaller side), got {win_size!r}"
        )
    return np.array([structural_similarity(a, b, data_range=1.0, win_size=win_size) for a, b in zip(r, t)])


def cosine(a, b) -> np.ndarray:
    """Row-wise cosine similarity (0 where a row is zero)."""
    a, b = _rows(a, "cosine: a"), _rows(b, "cosine: b")
    if a.shape[1] != b.shape[1] or (a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0])):
        raise InputError(
            f"cosine: a {a.shape} and b {b.shape} must have the same shape (or one of them a single row)"
        )
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    den = na * nb
    return np.where(den > 0, (a * b).sum(axis=1) / np.where(den > 0, den, 1.0), 0.0)


def _rows(x, name: str, *, flatten: bool = False) -> np.ndarray:
    """``x`` as a finite 2-D float array of rows (one vector: one row; ``flatten``: each row flattened)."""
    a = np.asarray(x)
    if flatten and a.ndim > 2:
        a = a.reshape(a.shape[0], int(np.prod(a.shape[1:])))
    a = np.atleast_2d(a)
    if a.ndim != 2:
        raise InputError(f"{name} must be vectors, shape (n, d), got shape {a.shape}")
    _check_real(a, name)
    a = np.asarray(a, dtype=np.float64)
    # a NaN row has no similarity (it would score 0, a plausible one, and match anything)
    if a.size and not (np.isfinite(a.min()) and np.isfinite(a.max())):
        raise InputError(
            f"{name} contains NaN or inf values; they have no similarity: drop or fix those rows"
        )
    return a


def _cos_matrix(a, b) -> np.ndarray:
    a = np.atleast_2d(np.asarray(a, float))
    b = np.atleast_2d(np.asarray(b, float))
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-300)
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-300)
    return an @ bn.T


def matched_cosine(recovered, true) -> tuple[float, np.ndarray]:
    """Mean cosine after the Hungarian matching of recovered to true rows.

    Returns the mean over matched pairs and, for every true row, the index of
    its matched recovered row (-1 if there are fewer recovered rows).
    """
    recovered, true = _rows(recovered, "matched_cosine: recovered"), _rows(true, "matched_cosine: true")
    if recovered.shape[1] != true.shape[1] or not (recovered.size and true.size):
        raise InputError(
            f"matched_cosine: recovered {recovered.shape} and true {true.shape} must be non-empty rows "
            "of the same width"
        )
    S = _cos_matrix(true, recovered)
    rows, cols = linear_sum_assignment(-S)
    match = np.full(S.shape[0], -1)
    match[rows] = cols
    return float(S[rows, cols].mean()), match


def identification(recon, member_index, pool, metric: str = "l2") -> np.ndarray:
    """For each reconstruction: is its nearest pool item one of its true members?

    Parameters
    ----------
    recon : ndarray (r, ...)
        Reconstructions (images or features), flattened per row.
    member_index : sequence of int arrays
        For each reconstruction, the pool indices that count as a hit.
    pool : ndarray (P, ...)
        The candidate set (e.g. every private image).
    metric : {"l2", "cosine"}

    Returns
    -------
    ndarray of bool (r,)
    """
    if metric not in ("l2", "cosine"):
        raise InputError(f"metric must be 'l2' or 'cosine', got {metric!r}")
    R, P = _rows(recon, "recon", flatten=True), _rows(pool, "pool", flatten=True)
    if np.ndim(recon) < 2 or np.ndim(pool) < 2 or R.shape[1] != P.shape[1] or not (R.size and P.size):
        raise InputError(
            f"identification: recon {np.shape(recon)} and pool {np.shape(pool)} must be non-empty arrays of rows "
            "(r, ...) and (P, ...) with the same size per row"
        )
    if isinstance(member_index, (str, bytes)) or not hasattr(member_index, "__len__"):
        raise InputError(
            f"member_index must hold one array of pool indices per reconstruction, got {member_index!r}"
        )
    if len(member_index) != R.shape[0]:
        raise InputError(
            f"member_index has {len(member_index)} entries but recon has {R.shape[0]} rows; pass one per reconstruction"
        )
    hits = [
        set(index_vector(m, f"member_index[{i}]", P.shape[0], what="pool rows").tolist())
        for i, m in enumerate(member_index)
    ]
    if metric == "l2":
        d = (R**2).sum(1)[:, None] - 2 * R @ P.T + (P**2).sum(1)[None, :]
    elif metric == "cosine":
        d = -_cos_matrix(R, P)
    nn = d.argmin(axis=1)
    return np.array([nn[i] in hits[i] for i in range(R.shape[0])])


def lpips_distance(recon, truth, *, weights_path: str | None = None):
    """LPIPS distance; refuses to run without the ``lpips`` package and its pretrained weights.

    LPIPS is meaningful only with its trained AlexNet/VGG weights; this
    function never downloads them and never runs with random weights
    (attacks.md).  On 8x8 digits it is not informative anyway.

    Raises
    ------
    MissingDependencyError
        If the ``lpips`` package is not installed or ``weights_path`` does not exist.
    """
    import os

    try:
        import lpips  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            "LPIPS needs the 'lpips' package and its pretrained weights, which privfed never downloads; "
            "install lpips and pass weights_path= to a local copy, or use psnr/ssim"
        ) from None
    if weights_path is None or not os.path.exists(weights_path):
        raise MissingDependencyError(
            f"LPIPS weights not found at {weights_path!r}; pass weights_path= to a local copy of the trained "
            "network (privfed never downloads weights nor runs LPIPS with random ones)"
        )
    import lpips as _lp
    import torch

    net = _lp.LPIPS(net="alex", pretrained=True, pnet_rand=True, model_path=weights_path, verbose=False)
    r = torch.as_tensor(_as_images(recon), dtype=torch.float32)[:, None].repeat(1, 3, 1, 1) * 2 - 1
    t = torch.as_tensor(_as_images(truth), dtype=torch.float32)[:, None].repeat(1, 3, 1, 1) * 2 - 1
    with torch.no_grad():
        return net(r, t).reshape(-1).numpy()
