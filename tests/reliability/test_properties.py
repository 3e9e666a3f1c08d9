"""Property-based checks of the public entry points (hypothesis).

``privfed.fit``, alone or with a :class:`mechanisms.GaussianMechanism`,
driven with generated features (any scale from 1e-300 to 1e300, constant or
all-zero columns, NaN/inf), labels, client ids, class counts, method
parameters and privacy settings, must either return a finite head of shape
(C, d), whose weight is all zero only when its notes say so, or raise exactly
one :class:`privfed.errors.PrivfedError`: never another exception, never a
silent zero or non-finite head.  Examples are derandomised (the same on every
run) and the database is off, so the suite is deterministic.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import privfed  # noqa: E402
from privfed.errors import PrivfedError  # noqa: E402

SCALES = [1e-300, 1e-170, 1e-20, 1e-3, 1.0, 31.0, 1e3, 1e20, 1e160, 1e300]
GOOD_PARAMS = {
    "fedncm": st.just({}),
    "fed3r": st.fixed_dictionaries(
        {}, optional={"lam": st.sampled_from([0.0, 1e-9, 1.0, 1e6]), "bias": st.booleans()}
    ),
    "fed3r-within": st.fixed_dictionaries({}, optional={"gamma": st.sampled_from([0.0, 1.0, 1e3])}),
    "fedcof": st.fixed_dictionaries(
        {},
        optional={
            "gamma": st.sampled_from([0.0, 0.1, 1.0, 1e9]),
            "means_per_client": st.sampled_from([1, 2]),
        },
    ),
    "fedcof-oracle": st.fixed_dictionaries({}, optional={"gamma": st.sampled_from([0.0, 1.0])}),
    "fedcgs": st.fixed_dictionaries(
        {},
        optional={
            "shrinkage": st.sampled_from([0.0, 1e-4, 0.5, 1.0]),
            "covariance": st.sampled_from(["total", "within"]),
        },
    ),
    "fedlog": st.fixed_dictionaries(
        {},
        optional={
            "nu": st.sampled_from([0.0, 1.0, 1e6]),
            "feature_scale": st.sampled_from([1.0, "auto", 1e-3]),
            "solver": st.sampled_from(["exact", "lbfgs"]),
        },
    ),
}
BAD_PARAMS = {
    "fedncm": {"gamma": 1.0},
    "fed3r": {"lam": -1.0},
    "fed3r-within": {"gamma": "x"},
    "fedcof": {"means_per_client": 2.5},
    "fedcof-oracle": {"gamma": float("nan")},
    "fedcgs": {"shrinkage": 2.0},
    "fedlog": {"feature_scale": 0.0},
}
#: At most one fault per example, so that most examples are valid and reach a fitted head.
FAULTS = ["none"] * 8 + [
    "nan",
    "inf",
    "labels-negative",
    "labels-1e20",
    "labels-fractional",
    "labels-1e12",
    "num_classes-3.7",
    "num_classes-str",
    "num_classes-1e12",
    "clients-gap",
    "clients-1e12",
    "param",
    "clip-0",
]


@st.composite
def problems(draw):
    method = draw(st.sampled_from(sorted(GOOD_PARAMS)))
    fault = draw(st.sampled_from(FAULTS))
    params = dict(BAD_PARAMS[method]) if fault == "param" else draw(GOOD_PARAMS[method])
    C = draw(st.integers(1, 4))
    n = draw(st.integers(C, 24))
    d = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(n, d)) + draw(st.sampled_from([0.0, 3.0]))
    kind = draw(st.sampled_from(["plain", "plain", "relu", "zero", "constant", "one-hot"]))
    if kind == "relu":
        F = np.maximum(F, 0.0)
    elif kind == "zero":
        F = np.zeros_like(F)
    elif kind == "constant":
        F[:] = F[0]
    F = F * draw(st.sampled_from(SCALES))
    y = np.arange(n) % C  # every class present
    rng.shuffle(y)
    if kind == "one-hot":
        F = np.eye(C, d)[y] * F[:, :1]
    if fault in ("nan", "inf"):
        F[rng.integers(n), rng.integers(d)] = np.nan if fault == "nan" else np.inf
    if fault == "labels-negative":
        y[0] = -1
    elif fault in ("labels-1e20", "labels-fractional"):
        y = y.astype(np.float64)
        y[0] = 1e20 if fault == "labels-1e20" else 0.5
    elif fault == "labels-1e12":
        y[0] = 10**12
    K = draw(st.integers(1, n))
    k = draw(st.sampled_from([None, np.arange(n) % K, rng.permutation(np.arange(n) % K)]))
    if fault == "clients-gap":
        k = (np.arange(n) % K) * 2 + 1
    elif fault == "clients-1e12":
        k = np.arange(n) % K
        k[0] = 10**12
    num_classes = draw(st.sampled_from([None, C]))
    num_classes = {"num_classes-3.7": 3.7, "num_classes-str": str(C), "num_classes-1e12": 10**12}.get(
        fault, num_classes
    )
    mech_args = None
    if draw(st.integers(0, 3)) == 0 or fault == "clip-0":
        mech_args = dict(
            epsilon=draw(st.sampled_from([0.1, 1.0, 8.0, float("inf")])),
            delta=1e-5,
            clip=0.0 if fault == "clip-0" else draw(st.sampled_from([1.0, 30.0, 1e200])),
            trusted_aggregator=draw(st.booleans()),
            blocks=("sums", "counts", "second")
            if method in ("fed3r", "fed3r-within", "fedcgs")
            else ("sums", "counts"),
        )
    return method, params, F, y, k, num_classes, mech_args, seed, fault


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(problems())
def test_fit_returns_a_finite_head_or_one_privfed_error(problem):
    method, params, F, y, k, num_classes, mech_args, seed, fault = problem
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warnings are allowed; exceptions and silent garbage are not
            privacy = None
            if mech_args is not None:
                from mechanisms import GaussianMechanism

                privacy = GaussianMechanism(**mech_args)
            head = privfed.fit(
                method, F, y, k, num_classes=num_classes, privacy=privacy, random_state=seed, **params
            )
    except PrivfedError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg.strip(), msg  # one line
        assert "this is a bug" not in msg
        return
    assert fault == "none", f"fault {fault!r} was accepted"  # every injected fault is a user mistake
    C = int(num_classes) if num_classes is not None else int(np.max(y)) + 1
    assert head.weight.shape == (C, F.shape[1]) and head.bias.shape == (C,)
    assert np.all(np.isfinite(head.weight)) and np.all(np.isfinite(head.bias))
    if not np.any(head.weight):
        assert any("zero" in n for n in head.notes), (method, params, head.notes)
    scores = head.decision_function(F)
    assert np.all(np.isfinite(scores))
