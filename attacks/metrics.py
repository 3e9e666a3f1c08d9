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

from attacks.params import check_fpr, check_fprs
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


def _scores_labels(scores, members) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    m = np.asarray(members).astype(bool).ravel()
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


def _as_images(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise InputError(f"images must have shape (n, H, W), got {a.shape}")
    if not np.isfinite(a).all():  # a diverged reconstruction scored inf dB (an exact copy) under NaN
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
    return np.array([structural_similarity(a, b, data_range=1.0, win_size=win_size) for a, b in zip(r, t)])


def cosine(a, b) -> np.ndarray:
    """Row-wise cosine similarity (0 where a row is zero)."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if not (np.isfinite(a).all() and np.isfinite(b).all()):  # NaN rows scored 0, a plausible similarity
        raise InputError("cosine: the vectors contain NaN or inf values; they have no similarity")
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    den = na * nb
    return np.where(den > 0, (a * b).sum(axis=1) / np.where(den > 0, den, 1.0), 0.0)


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
    R = np.asarray(recon, float).reshape(len(recon), -1)
    P = np.asarray(pool, float).reshape(len(pool), -1)
    if metric == "l2":
        d = (R**2).sum(1)[:, None] - 2 * R @ P.T + (P**2).sum(1)[None, :]
    elif metric == "cosine":
        d = -_cos_matrix(R, P)
    else:
        raise InputError(f"metric must be 'l2' or 'cosine', got {metric!r}")
    nn = d.argmin(axis=1)
    return np.array([nn[i] in set(np.asarray(member_index[i]).tolist()) for i in range(R.shape[0])])


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
