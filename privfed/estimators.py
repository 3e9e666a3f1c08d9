"""scikit-learn estimators wrapping :func:`privfed.fit`.

>>> import numpy as np
>>> from privfed.estimators import FederatedHeadClassifier
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 5)); y = np.where(X[:, 0] > 0, "yes", "no")
>>> clf = FederatedHeadClassifier("fed3r", clients=4, random_state=0).fit(X, y)
>>> clf.classes_.tolist(), clf.coef_.shape
(['no', 'yes'], (2, 5))

The estimator follows scikit-learn's conventions: ``__init__`` only stores
parameters, :meth:`fit` validates and returns ``self``, fitted attributes end
in ``_``, labels may be any sortable values (``classes_`` maps them to
``0..C-1``), and randomness comes from ``random_state``.  Federation comes
from the ``clients`` parameter (a fixed number of IID clients or a
partition function) or from the ``clients`` argument of :meth:`fit` (the
client of every sample).

Privacy and secure aggregation are parameters, as in :func:`privfed.fit`::

    from mechanisms import GaussianMechanism
    from mechanisms.secagg.protection import PairwiseMasking
    clf = FederatedHeadClassifier("fedlog", clients=10, classes=["no", "yes"],
                                  privacy=GaussianMechanism(epsilon=2.0, delta=1e-5, clip=30.0),
                                  secure_agg=PairwiseMasking())
    clf.fit(X, y).head_.privacy.guarantee   # the guarantee, computed from the run's ledger

Under privacy the label set and the number of clients are public parameters
of the release, never read from the data: pass ``classes`` (and
``num_clients`` when the clients come from a callable or from :meth:`fit`'s
``clients`` argument; an int ``clients`` is the number itself).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from privfed import methods as _methods
from privfed._validation import as_int_vector, check_real_dtype, check_release_size, is_integer, refuse_masked
from privfed._validation.seeds import as_generator
from privfed.api import fit as _fit
from privfed.errors import ConfigError, InputError
from privfed.head import LinearHead

__all__ = ["FederatedHeadClassifier", "iid_clients"]


def iid_clients(n_samples: int, n_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Client ids of an IID split of ``n_samples`` into ``min(n_clients, n_samples)`` non-empty clients (``rng``:
    a Generator, or a seed for one)."""
    if not is_integer(n_samples) or n_samples < 0:
        raise ConfigError(f"n_samples must be an int >= 0, got {n_samples!r}")
    if not is_integer(n_clients) or n_clients < 1:
        raise ConfigError(f"n_clients must be an int >= 1, got {n_clients!r}")
    rng = as_generator(rng, "rng")
    n_samples = int(n_samples)
    K = max(1, min(int(n_clients), n_samples))
    ids = np.empty(n_samples, dtype=np.int64)
    for k, part in enumerate(np.array_split(rng.permutation(n_samples), K)):
        ids[part] = k
    return ids


def _coef_over_inputs(head: LinearHead) -> np.ndarray:
    """The head's weight over the features as the user passed them.  A head fitted on features rescaled by an
    exact power of two 2^-e (:mod:`privfed.scaling`) scores f 2^-e, so its weight over f is weight 2^-e: exact
    but where an entry falls below the smallest normal float (rounded to within 2^-1075, its term in a score
    moves by at most 2^-1075 |f| < 2^-51, as |f| < 2^e <= 2^1024); where an entry would overflow, the weight stays
    over the rescaled features and a note says so."""
    e = head.extras.get("feature_exponent")
    if e is None:
        return head.weight
    with np.errstate(over="ignore", under="ignore"):
        folded = np.ldexp(head.weight, -int(e))
    if np.isfinite(folded).all():
        return folded
    head.notes.append(
        f"coef_ is the weight over the features multiplied by 2^{-int(e)} (as the head scores them): over the "
        "features as given it would leave float64's range; decision_function and predict rescale X themselves"
    )
    return head.weight


def _check_types(X, y=None) -> None:
    """What scikit-learn's float64 conversion would change is refused: complex features or labels (the
    imaginary part), extended precision and integers beyond 2**53 (rounded).  Object, boolean and text
    arrays of numbers convert exactly and follow scikit-learn's rules."""
    import scipy.sparse as sp

    for name, a in (("X", X), ("y", y)):
        if a is None or sp.issparse(a):
            continue
        refuse_masked(a, name)
        try:
            arr = np.asarray(a)
        except (TypeError, ValueError):
            continue  # ragged input: scikit-learn's own check names it
        if arr.dtype.kind == "c":
            raise InputError(
                f"{name} is complex ({arr.dtype}): Complex data not supported, the imaginary part would be lost; "
                "pass real values"
            )
        if name == "X" and arr.dtype.kind in "iuf":
            check_real_dtype(arr, "X")


def _fresh(mechanism):
    """A copy of ``mechanism`` that has released nothing: rebuilt from its parameters where it has them (a copy
    would carry the releases its ledger booked before), else a deep copy."""
    if hasattr(mechanism, "get_params") and not isinstance(mechanism, type):
        from sklearn.base import clone

        return clone(mechanism)
    return copy.deepcopy(mechanism)


def _unique(values: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``; labels that cannot be ordered (None beside text, text beside
    numbers) are one line naming them instead of numpy's TypeError."""
    try:
        return np.unique(values, return_inverse=True)
    except TypeError:
        kinds = sorted({type(v).__name__ for v in np.asarray(values, dtype=object).ravel()})
        raise InputError(
            f"{name} mixes labels of types {kinds} that cannot be ordered; use labels of one type"
        ) from None


class FederatedHeadClassifier(ClassifierMixin, BaseEstimator):
    """A linear head fitted by a federated method from client statistics.

    Parameters
    ----------
    method : str, default "fedcof"
        A name from :func:`privfed.methods.available`.
    method_params : dict, optional
        The method's parameters (e.g. ``{"gamma": 0.1}`` for fedcof,
        ``{"lam": 0.01}`` for fed3r).
    clients : None, int or callable, default None
        How training samples are spread over clients when :meth:`fit` gets
        no ``clients``: ``None`` puts them on one client (centralised), an
        int K splits them IID into K non-empty clients, a callable
        ``clients(y, rng) -> ids`` returns the client of each sample (read
        as :meth:`fit`'s ``clients`` argument).
    privacy : mechanism, optional
        A privacy mechanism from :mod:`mechanisms` (clipping and noise), as
        ``privacy=`` of :func:`privfed.fit`.  The label set and the number
        of clients are public parameters of the release: under privacy
        ``classes`` is required, and so is ``num_clients`` unless
        ``clients`` is None or an int.  Each :meth:`fit` uses a fresh copy (scikit-learn
        estimators never change their parameters), so ``head_.privacy``
        covers that fit alone: fitting several times on the same data
        (cross-validation, a grid search) spends the budget each time, and
        the total is the composition of the fits.
    secure_agg : optional
        A secure-aggregation protocol from :mod:`mechanisms.secagg.protection` (e.g.
        ``PairwiseMasking()``), as ``secure_agg=`` of :func:`privfed.fit`.
    random_state : None, int or numpy.random.Generator
        Seeds the partition and the method (multi-mean sampling).  With
        ``privacy`` or ``secure_agg``, ``None`` (the default) draws fresh OS
        entropy for the noise, the masks and the partition, as ``fit`` does;
        a seed makes the run a reproducible simulation, and its privacy
        report says so.  Without either, ``None`` means seed 0.
    classes : None, int or array-like, default None
        The public label set: the labels (any sortable values), or their
        number C for labels ``0..C-1``.  ``None`` reads the labels from ``y``,
        which ``privacy`` refuses (a record of a new class would change the
        release's shape).  A class with no sample is allowed under privacy.
    num_clients : None or int, default None
        The public number of clients K (ids ``0..K-1``, empty clients allowed
        under privacy) when the clients come from a callable or from
        :meth:`fit`'s ``clients``; ``None`` counts them from the ids, which
        ``privacy`` refuses.  An int ``clients`` is the number itself.

    Attributes
    ----------
    classes_ : ndarray, shape (C,)
        The labels, sorted; column c of the scores is ``classes_[c]``.
    coef_ : ndarray, shape (C, d)
    intercept_ : ndarray, shape (C,)
        The scores are ``X @ coef_.T + intercept_`` (features the fit rescaled by a power of two, to keep
        float64 statistics exact, are scored with that factor folded into ``coef_``, unless folding it
        would overflow: ``coef_`` then stays over the rescaled features and ``head_.notes`` says so);
        under ``privacy`` each row is first clipped to the clip bound, as the statistics were, so the
        formula holds only for rows within the bound.
    head_ : LinearHead
        The fitted head (notes, communication, privacy report).
    n_features_in_ : int

    Notes
    -----
    FedCOF estimates class covariances from the spread of per-client class
    means; with one client (``clients=None``) every class has a single mean
    and gets the shrinkage ``gamma I`` alone (see ``head_.notes``).
    """

    def __init__(
        self,
        method: str = "fedcof",
        method_params: dict[str, Any] | None = None,
        clients: int | Callable | None = None,
        random_state=None,
        privacy: Any = None,
        secure_agg: Any = None,
        classes: Any = None,
        num_clients: int | None = None,
    ) -> None:
        self.method = method
        self.method_params = method_params
        self.clients = clients
        self.random_state = random_state
        self.privacy = privacy
        self.secure_agg = secure_agg
        self.classes = classes
        self.num_clients = num_clients

    def set_params(self, **params) -> FederatedHeadClassifier:
        """scikit-learn's ``set_params``, where ``method_params__<name>`` sets one method parameter (a grid
        search over ``method_params__lam``): the dict is copied with it, never changed in place."""
        nested = {k.split("__", 1)[1]: params.pop(k) for k in list(params) if k.startswith("method_params__")}
        if nested:
            base = params.get("method_params", self.method_params)
            if base is not None and not isinstance(base, dict):
                raise ConfigError(
                    f"method_params__{next(iter(nested))} sets a key of method_params, which is {base!r}, "
                    "not a dict; pass method_params={...} whole"
                )
            params["method_params"] = {**(base or {}), **nested}
        return super().set_params(**params)

    def _encode_labels(self, y: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """``classes_`` and the codes of ``y``: from the public ``classes``, or without privacy from ``y``."""
        spec = self.classes
        if spec is None:
            if self.privacy is not None:
                raise ConfigError(
                    "under privacy the label set is a public parameter of the release (a record of a new "
                    "class would change its shape), never read from y: pass classes= to "
                    "FederatedHeadClassifier (the labels, or their number C for labels 0..C-1)"
                )
            return _unique(y, "y")
        if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
            if spec < 1:
                raise ConfigError(f"classes={spec!r}: give the labels or their number C >= 1")
            try:  # the same bound as fit's num_classes, before np.arange sizes anything by it
                check_release_size(1, int(spec), shape[1], shape[0], classes="classes")
            except InputError as exc:
                raise ConfigError(str(exc)) from None  # a parameter of the estimator, not of the data
            classes = np.arange(int(spec))
        else:
            if np.ndim(spec) == 0:  # 1.5, np.float64(3), True: neither labels nor a number of them
                raise ConfigError(
                    f"classes must be distinct labels (a non-empty 1-D list) or an int C, got {spec!r}"
                )
            texts = {
                isinstance(v, (str, bytes, np.str_, np.bytes_))
                for v in np.asarray(spec, dtype=object).ravel()
            }
            if len(texts) > 1:  # np.asarray would turn [0, "a"] into ["0", "a"], and y's 0 would not be in it
                raise ConfigError(f"classes={spec!r} mixes text and other labels; use labels of one type")
            classes = _unique(np.asarray(spec), "classes")[0]
            if classes.ndim != 1 or classes.size < 1 or classes.size != len(spec):
                raise ConfigError(
                    f"classes must be distinct labels (a non-empty 1-D list) or an int C, got {spec!r}"
                )
        codes = np.searchsorted(classes, y).clip(0, classes.size - 1)
        bad = classes[codes] != y
        if np.any(bad):
            label = y[bad][:1].tolist()[0]
            raise InputError(f"y contains {label!r}, not in classes={spec!r}; add it to classes")
        return classes, codes

    def _num_clients(self, ids, clients) -> int | None:
        """The number of clients for fit: public under privacy (an int ``clients``, or ``num_clients``)."""
        spec, K = self.clients, self.num_clients
        from_int = clients is None and isinstance(spec, (int, np.integer)) and not isinstance(spec, bool)
        if K is not None:
            if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
                raise ConfigError(f"num_clients must be an int >= 1, got {K!r}")
            if from_int and int(K) != int(spec):
                raise ConfigError(f"num_clients={K} but clients={spec}; give one of them, or the same number")
            if ids is None and int(K) != 1:
                # no ids: every sample is one client's, and a release over K clients would claim K - 1 more
                raise ConfigError(
                    f"num_clients={K} but no clients were given, which puts every sample on one client: pass "
                    "clients= (the ids to fit, or an int or a callable to the estimator)"
                )
            return None if ids is None else int(K)
        if ids is None:
            return None
        if self.privacy is None:
            return None
        if from_int:
            return int(spec)
        raise ConfigError(
            "under privacy the number of clients is a public parameter of the release (a record of a new "
            "client would change its shape), never counted from the ids: pass num_clients= to "
            "FederatedHeadClassifier"
        )

    def _client_ids(self, y: np.ndarray, clients, rng: np.random.Generator) -> np.ndarray | None:
        if clients is not None:
            refuse_masked(clients, "clients")  # np.asarray would drop the mask and read the values under it
            ids = np.asarray(clients)
            if (
                self.privacy is None
                and self.num_clients is None
                and ids.ndim == 1
                and ids.dtype.kind in "iuf"
                and ids.size
            ):
                # Without privacy the ids only group the samples (as labels do): any integers (whole floats
                # too), such as a cross-validation fold's clients with the held-out ones missing, are
                # renumbered 0..K-1.  -1 is what a partition writes for a sample it left out (Partition.clients).
                k = as_int_vector(ids, "clients") if ids.dtype.kind == "f" else ids
                if np.any(k == -1):
                    raise InputError(
                        "clients holds -1, which marks the samples a partition left out (Partition.clients): "
                        "drop them first (Partition.apply), or give them a client id of their own"
                    )
                return np.unique(k, return_inverse=True)[1].reshape(-1)
            return ids
        spec = self.clients
        if spec is None:
            return None
        if callable(spec):
            import inspect

            try:
                inspect.signature(spec).bind(y, rng)
            except TypeError as exc:
                raise ConfigError(
                    f"clients must be a callable (y, rng) -> ids; {spec!r} cannot take them ({exc})"
                ) from None
            except ValueError:  # no signature to read (some builtins): called as it is
                pass
            ids = spec(y, rng)
            if ids is None:
                raise ConfigError(
                    f"clients={spec!r} returned None; a clients callable returns each sample's client"
                )
            # read as fit's clients argument (renumbered without privacy)
            return self._client_ids(y, ids, rng)
        if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool) and spec >= 1:
            return iid_clients(y.shape[0], int(spec), rng)
        raise ConfigError(f"clients must be None, an int >= 1 or a callable (y, rng) -> ids, got {spec!r}")

    def fit(self, X, y, clients=None) -> FederatedHeadClassifier:
        """Fit the head.

        Parameters
        ----------
        X : array, shape (N, d)
            Frozen features.
        y : array, shape (N,)
            Labels (any sortable values).
        clients : int array, shape (N,), optional
            Client of each sample; overrides the ``clients`` parameter.
            Without privacy any integer ids but -1, which a partition writes
            for a sample it left out (renumbered 0..K-1, so a
            cross-validation fold may miss some); under privacy 0..K-1 with
            K = ``num_clients``.

        Returns
        -------
        self
        """
        fitted = {k: v for k, v in vars(self).items() if k.endswith("_") and not k.startswith("_")}
        try:
            return self._fit(X, y, clients)
        except BaseException:  # a failed fit leaves the earlier one as it was, not half replaced
            for k in [k for k in vars(self) if k.endswith("_") and not k.startswith("_")]:
                delattr(self, k)
            vars(self).update(fitted)
            raise

    def _fit(self, X, y, clients) -> FederatedHeadClassifier:
        _check_types(X, y)
        try:
            X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=False)
            check_classification_targets(y)
        except ValueError as exc:
            # scikit-learn's own checks, as one line naming the input (its TypeErrors stay, but for y's own)
            first = str(exc).splitlines()[0]  # the lines after it print the data
            if "Expected 2D array" in first:
                first += " (one feature: X.reshape(-1, 1); one sample: X.reshape(1, -1))"
            raise InputError(f"X or y: {first}") from None
        except TypeError:  # labels that cannot be ordered ('a' and 1): sklearn's sort fails on them
            _unique(y, "y")
            raise
        self.classes_, y_enc = self._encode_labels(y, X.shape)
        if self.privacy is None and self.classes is not None:
            empty = np.setdiff1d(np.arange(len(self.classes_)), y_enc)
            if empty.size:
                raise InputError(
                    f"classes={self.classes!r} names {self.classes_[empty][:5].tolist()} with no sample in y: "
                    "without privacy every class of the head needs a sample (under privacy= an empty class "
                    "is allowed: the label set is public); drop it from classes"
                )
        if self.method_params is not None and not isinstance(self.method_params, dict):
            raise ConfigError(
                f"method_params must be a dict of the method's parameters, e.g. {{'gamma': 0.1}}, got "
                f"{self.method_params!r}"
            )
        params = dict(self.method_params or {})
        method = _methods.get(self.method, **params)
        protected = self.privacy is not None or self.secure_agg is not None
        if protected and self.random_state is None:
            # a release: the partition from OS entropy, and fit draws its own noise and masks from it too
            rng, fit_state = np.random.default_rng(), None
        else:
            rng = as_generator(self.random_state)
            fit_state = rng
        ids = self._client_ids(y_enc, clients, rng)
        num_clients = self._num_clients(ids, clients)
        privacy = None if self.privacy is None else _fresh(self.privacy)  # its ledger starts empty
        secure = None if self.secure_agg is None else copy.deepcopy(self.secure_agg)
        head = _fit(
            method,
            X,
            y_enc,
            ids,
            num_classes=len(self.classes_),
            num_clients=num_clients,
            privacy=privacy,
            secure_agg=secure,
            random_state=fit_state,
        )
        self.head_: LinearHead = head
        self.coef_ = _coef_over_inputs(head)
        self.intercept_ = head.bias
        return self

    def _scores(self, X) -> np.ndarray:
        check_is_fitted(self, "head_")
        _check_types(X)
        try:
            X = validate_data(self, X, dtype=np.float64, reset=False)
        except ValueError as exc:
            # wrong width, NaN, no rows: one line naming X (scikit-learn's TypeErrors stay)
            raise InputError(f"X: {' '.join(str(exc).split())}") from None  # its advice kept, on one line
        return self.head_.decision_function(X)

    def decision_function(self, X) -> np.ndarray:
        """Scores, shape (N, C); for two classes, the score of ``classes_[1]`` minus ``classes_[0]`` (N,)."""
        s = self._scores(X)
        if s.shape[1] == 2:
            return s[:, 1] - s[:, 0]
        return s

    def predict(self, X) -> np.ndarray:
        """Predicted labels (from ``classes_``)."""
        scores = self._scores(X)
        return self.classes_[np.argmax(scores, axis=1)]

    def predict_proba(self, X) -> np.ndarray:
        """Softmax of the scores.

        FedLog's posterior predictive at the MAP; uncalibrated for the other methods.
        """
        s = self._scores(X)
        s = s - s.max(axis=1, keepdims=True)
        p = np.exp(s)
        return p / p.sum(axis=1, keepdims=True)

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy on ``(X, y)`` (scikit-learn's), with one line naming the input that does not fit."""
        try:
            return super().score(X, y, sample_weight=sample_weight)
        except InputError:
            raise
        except ValueError as exc:
            # y or sample_weight of another length than X: scikit-learn's words, on one line
            raise InputError(f"score: {' '.join(str(exc).split())}") from None

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags
