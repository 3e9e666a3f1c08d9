"""The fitted linear head every method returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np

from privfed._validation import check_features, check_labels, check_real_dtype
from privfed.errors import InputError

__all__ = ["LinearHead"]


@dataclass(eq=False)
class LinearHead:
    """A linear classifier ``argmax_c (W f + b)_c`` on frozen features.

    Attributes
    ----------
    weight : ndarray, shape (C, d)
    bias : ndarray, shape (C,)
    method : str
        Registered name of the method that produced it.
    params : dict
        The method's resolved parameters.
    notes : list of str
        What the method had to report or repair (classes seen by one client,
        noisy counts dropped, matrices projected to the PSD cone, ...).
    upload_bytes : dict
        Communication of the run: ``per_client`` (mean bytes a client
        uploads), ``total`` and the formula used.
    privacy : object or None
        The privacy report of the release (see :mod:`mechanisms`), ``None``
        for a non-private run.
    secure_aggregation : object or None
        The secure-aggregation report, ``None`` when statistics went in clear.
    feature_transform : callable or None
        Applied to features before scoring (e.g. the clipping the
        statistics were computed under), so train and test match.
    trace : ReleaseTrace or None
        What the release did, stage by stage, and what the server received
        (:class:`privfed.release.ReleaseTrace`); set by :func:`privfed.fit`.

    Every head is checked finite when it is made.  A method's server whose
    construction already proves every weight finite (e.g. rows divided by
    their own norm, see :func:`privfed._linalg.normalise_rows`) passes
    ``weight_proved_finite=True`` (init-only) to skip the one extra read of
    the (C, d) weight; the bias is always checked.  A non-finite head is the
    caller's input error, or, from a method's server (``made_by_method=True``,
    init-only), a bug to report.
    """

    weight: np.ndarray
    bias: np.ndarray
    method: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    upload_bytes: dict[str, Any] = field(default_factory=dict)
    privacy: Any = None
    secure_aggregation: Any = None
    feature_transform: Callable[[np.ndarray], np.ndarray] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    trace: Any = field(default=None, repr=False)
    weight_proved_finite: InitVar[bool] = False
    made_by_method: InitVar[bool] = False

    def __post_init__(self, weight_proved_finite: bool = False, made_by_method: bool = False) -> None:
        for name in ("weight", "bias"):
            try:
                arr = np.asarray(getattr(self, name))
            except (TypeError, ValueError) as exc:  # ragged lists
                raise InputError(f"LinearHead {name} must hold real numbers ({exc})") from None
            check_real_dtype(
                arr, f"LinearHead {name}"
            )  # text (even "1.5"), complex, bool, objects: never cast
            setattr(self, name, arr.astype(np.float64, copy=False))
        if self.weight.ndim != 2 or self.bias.shape != (self.weight.shape[0],) or self.weight.shape[0] < 1:
            raise InputError(
                f"LinearHead weight must be (C, d) and bias (C,) with C >= 1 classes, got {self.weight.shape} and "
                f"{self.bias.shape}"
            )
        if self.feature_transform is not None and not callable(self.feature_transform):
            raise InputError(
                f"LinearHead feature_transform must be a callable (features -> features) or None, got "
                f"{self.feature_transform!r}"
            )
        finite_weight = weight_proved_finite is True or bool(np.isfinite(self.weight).all())
        if not (finite_weight and np.isfinite(self.bias).all()):
            if made_by_method is not True:  # the caller's own numbers, not a method's server
                raise InputError(
                    "LinearHead weight and bias must be finite; the values given hold NaN or inf"
                )
            raise FloatingPointError(
                f"method {self.method!r} produced a non-finite head; this is a bug, please report it with the inputs"
            )

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    def decision_function(self, features) -> np.ndarray:
        """Scores ``F W^T + b``, shape (N, C)."""
        F = check_features(features, dim=self.dim)
        if self.feature_transform is not None:
            n, F = F.shape[0], np.asarray(self.feature_transform(F))
            if F.ndim != 2 or F.shape != (n, self.dim):
                raise InputError(
                    f"the head's feature_transform returned shape {F.shape} for {n} rows, not ({n}, {self.dim}) "
                    "(the weight's columns): give the head a transform onto its own feature space"
                )
        with np.errstate(over="ignore", invalid="ignore"):
            scores = F @ self.weight.T + self.bias
        if not np.isfinite(scores).all():  # finite features so large that a score leaves float64
            rows = np.flatnonzero(~np.isfinite(scores).all(axis=1))
            raise InputError(
                f"features: row(s) {rows[:5].tolist()} give scores beyond the float64 range (largest |value| "
                f"{float(np.abs(F[rows[0]]).max()):.3g}); scale the features as the head was fitted on them"
            )
        return scores

    def predict(self, features) -> np.ndarray:
        """Predicted class of each row of ``features``."""
        return np.argmax(self.decision_function(features), axis=1)

    def predict_proba(self, features) -> np.ndarray:
        """Softmax of the scores (the FedLog posterior predictive at the MAP)."""
        z = self.decision_function(features)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def score(self, features, labels) -> float:
        """Accuracy on ``(features, labels)``."""
        F = check_features(features, dim=self.dim)
        y, _ = check_labels(labels, F.shape[0], self.num_classes, classes_of="the head")
        return float(np.mean(self.predict(F) == y))

    def __repr__(self) -> str:
        extra = f", notes={len(self.notes)}" if self.notes else ""
        priv = "" if self.privacy is None else ", private"
        return f"LinearHead(method={self.method!r}, C={self.num_classes}, d={self.dim}{priv}{extra})"
