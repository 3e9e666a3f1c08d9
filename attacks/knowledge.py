"""The attacker's side knowledge and the private truth attacks are scored against.

:class:`PublicData` is what the attacker holds (labelled public records, their
features, optionally images); :class:`GroundTruth` is the clients' private
data, read only by the scoring (breaching's split between reconstructing
and scoring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privfed._validation import as_int_vector, check_features
from privfed.data.digits_numpy import pixel_problem
from privfed.errors import InputError

__all__ = ["GroundTruth", "PublicData", "check_truth"]


def check_images(value, name: str) -> np.ndarray:
    """Images (n, H, W) as float32, else one InputError naming ``name``: text, complex, NaN or a shape without
    rows of 2-D images (0-d, flattened) failed later, deep inside the inversion's scoring."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf" or arr.ndim != 3:
        raise InputError(
            f"{name} must be real images of shape (n, H, W), got dtype {arr.dtype}, shape {arr.shape}"
        )
    im = arr.astype(np.float32)
    problem = pixel_problem(im)  # the inversions' pixel range (and PSNR's peak)
    if problem is not None:
        lo, hi, hint = problem
        if math.isnan(lo):
            raise InputError(f"{name} holds NaN or inf pixels; images are values in [0, 1]")
        raise InputError(
            f"{name} holds pixels in [{lo:g}, {hi:g}]; images are values in [0, 1]"
            + (f" ({hint})" if hint else "")
        )
    return im


def check_truth(truth, view=None) -> None:
    """Refuse anything but a :class:`GroundTruth` as the truth an attack is scored against (one line).

    With ``view`` (a :class:`attacks.view.ServerView`), also a truth of another federation: features of
    another width, a class or (per-client view) a client the view does not have: scored, its unmatched
    records would count as not exposed.
    """
    if not isinstance(truth, GroundTruth):
        raise InputError(
            f"truth must be a GroundTruth(features=..., labels=..., clients=...), got {type(truth).__name__}; "
            "attacks.scenario(...) returns the view and its truth"
        )
    stats = getattr(view, "stats", None)
    if stats is None:
        return
    fix = "score a view against the truth of its own federation (attacks.scenario returns both)"
    if truth.features.shape[1] != stats.dim:
        raise InputError(
            f"GroundTruth.features has {truth.features.shape[1]} columns but the view has d={stats.dim}; {fix}"
        )
    y = truth.labels
    if y.size and not 0 <= int(y.min()) <= int(y.max()) < stats.num_classes:
        raise InputError(
            f"GroundTruth.labels holds classes {int(y.min())}..{int(y.max())} but the view has "
            f"num_classes={stats.num_classes}; {fix}"
        )
    if not getattr(view, "per_client", False):
        return
    owners = stats.owners
    K = stats.num_clients if owners is None else int(owners.max(initial=-1)) + 1
    top = int(truth.clients.max(initial=-1))
    if top >= K:
        raise InputError(
            f"GroundTruth.clients holds client {top} but the view has {K} clients (ids 0..{K - 1}); {fix}"
        )


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
        # fractional, NaN or text labels and non-finite features are refused, never cast (0.7 was class 0)
        y = as_int_vector(self.labels, "PublicData.labels")
        F = check_features(self.features, "PublicData.features")
        if F.ndim != 2 or y.shape != (F.shape[0],):
            raise InputError(f"PublicData needs features (n, d) and labels (n,), got {F.shape} and {y.shape}")
        object.__setattr__(self, "labels", y)
        object.__setattr__(self, "features", F)
        if self.images is not None:
            im = check_images(self.images, "PublicData.images")
            if im.shape[0] != F.shape[0]:
                raise InputError(f"PublicData.images has {im.shape[0]} rows but features has {F.shape[0]}")
            object.__setattr__(self, "images", im)

    def class_means(self, num_classes: int) -> np.ndarray:
        """Public class-mean features (C, d); the overall mean for a class absent from the public data."""
        from mechanisms.dp.calibration import check_count

        num_classes = check_count(num_classes, "num_classes")
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
        # every check in one place, one line each: NaN features scored "nothing exposed", a client id of
        # 2.7 was read as 2 (ServerView refuses it), images of another row count crashed the inversion scoring
        for name in ("features", "holdout_features"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, check_features(v, f"GroundTruth.{name}"))
        for name in ("labels", "clients", "holdout_labels"):
            v = getattr(self, name)
            if v is None and name != "holdout_labels":
                raise InputError(f"GroundTruth.{name} is required: one integer per record of features")
            if v is not None:
                object.__setattr__(self, name, as_int_vector(v, f"GroundTruth.{name}"))
        # a label is a class (>= 0); a client id is >= 0, or -1 for a record left out (as ServerView reads them)
        for name, low in (("labels", 0), ("holdout_labels", 0), ("clients", -1)):
            v = getattr(self, name)
            if v is not None and v.size and int(v.min()) < low:
                raise InputError(
                    f"GroundTruth.{name} holds {int(v.min())}: "
                    + (
                        "labels are classes 0..C-1"
                        if low == 0
                        else "client ids are >= 0, or -1 for a record left out"
                    )
                )
        N = self.features.shape[0]
        if self.labels.shape != (N,) or self.clients.shape != (N,):
            raise InputError(f"GroundTruth: labels and clients must have shape ({N},)")
        for name, rows in (("images", N), ("holdout_images", None)):
            im = getattr(self, name)
            if im is None:
                continue
            im = check_images(im, f"GroundTruth.{name}")
            object.__setattr__(self, name, im)
            if rows is None:
                rows = None if self.holdout_features is None else self.holdout_features.shape[0]
            if rows is not None and np.shape(im)[:1] != (rows,):
                owner = "features" if name == "images" else "holdout_features"
                raise InputError(
                    f"GroundTruth.{name} has shape {np.shape(im)} but {owner} has {rows} rows; "
                    f"pass one image per {owner} row"
                )
        if self.holdout_features is not None:
            H, d = self.holdout_features, self.features.shape[1:]
            if H.shape[1:] != d:  # targets are stacked with the members' features: one width
                raise InputError(
                    f"GroundTruth: holdout_features has shape {H.shape} but features {self.features.shape}; "
                    "the non-members must have the members' feature dimension"
                )
            if self.holdout_labels is not None and self.holdout_labels.shape != (H.shape[0],):
                raise InputError(
                    f"GroundTruth: holdout_labels must have shape ({H.shape[0]},), one per holdout_features row, "
                    f"got {self.holdout_labels.shape}"
                )
