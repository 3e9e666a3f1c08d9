"""Property-based checks of ``privfed.fit`` (hypothesis), against an oracle of what must happen.

``privfed.fit``, alone or with a :class:`mechanisms.GaussianMechanism`, is driven with generated
features (any scale from 1e-300 to 1e300, constant or all-zero columns, one-hot), labels, client
ids, class counts, method parameters and privacy settings.  Each example is one of:

* **valid** (no fault injected): it must return a finite head of shape (C, d), whose weight is
  all zero only when its notes say so.  A ``PrivfedError`` fails the test unless the oracle below,
  computed independently of the library, says the maths has no answer for these data;
* **degenerate** (valid inputs without an answer): the oracle names the one refusal allowed:
  features outside float64's exact range for a method that depends on their scale (no privacy),
  FedCGS on exact counts with too few records for its divisor, a covariance that is zero or, without
  shrinkage, singular (an eigenvalue test with a margin: borderline cases may go either way);
* **invalid** (one fault injected: NaN, bad labels or ids, a bad parameter, a clip of 0 or beyond
  1e100, a private release without its public sizes, a method the mechanism cannot noise): it must
  raise exactly one ``PrivfedError`` of one line.

Never another exception, never a silent zero or non-finite head.  Examples are derandomised and the
database is off, so the suite is deterministic.
"""

from __future__ import annotations

import re
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
#: At most one fault per example, so that most examples are valid and must reach a fitted head.
FAULTS = ["none"] * 16 + [
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
    "clip-1e200",
    "private-without-sizes",
]
#: Methods whose predictions do not depend on a common scale of the features (rescaled when needed).
INVARIANT = {"fedncm", "fedcgs"}
#: Where float64 statistics are exact for every generated shape (n <= 24, d <= 5): privfed.scaling's band
#: is [1.6e-145, 1.3e151 / (n sqrt(d))]; every generated peak is inside [1e-21, 1e22] or outside [1e-140, 1e140].
SAFE = (1e-140, 1e140)


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
    private_faults = ("clip-0", "clip-1e200", "private-without-sizes")
    if method != "fedcof-oracle" and (draw(st.integers(0, 3)) == 0 or fault in private_faults):
        mech_args = dict(
            epsilon=draw(st.sampled_from([0.1, 1.0, 8.0, float("inf")])),
            delta=1e-5,
            clip={"clip-0": 0.0, "clip-1e200": 1e200}.get(fault, draw(st.sampled_from([1.0, 30.0, 1e50]))),
            trusted_aggregator=draw(st.booleans()),
            blocks=("sums", "counts", "second")
            if method in ("fed3r", "fed3r-within", "fedcgs")
            else ("sums", "counts"),
        )
        if fault == "clip-1e200" and mech_args["epsilon"] == float("inf"):
            mech_args["epsilon"] = 1.0  # without noise any clip is allowed
        if fault != "private-without-sizes" and num_classes is None:
            num_classes = C  # a private release's public sizes
    elif fault in private_faults:
        fault = "none"  # fedcof-oracle has no private release to break
    num_clients = None if mech_args is None or k is None or fault == "private-without-sizes" else K
    if fault == "private-without-sizes":
        num_classes = None
    return dict(
        method=method,
        params=params,
        F=F,
        y=y,
        k=k,
        num_classes=num_classes,
        num_clients=num_clients,
        mech_args=mech_args,
        seed=seed,
        fault=fault,
        kind=kind,
    )


# ---------------------------------------------------------------- the oracle
def _fedcgs_outcome(F: np.ndarray, y: np.ndarray, params: dict, kind: str) -> str | None:
    """The refusal FedCGS must (or may) give on exact counts, from the covariance computed here."""
    cov, a = params.get("covariance", "total"), params.get("shrinkage", 1e-4)
    n, d = F.shape
    classes = np.unique(y)
    if n - (1 if cov == "total" else classes.size) <= 0:
        return "must:needs more samples than"
    peak = np.abs(F).max()
    X = F / peak if peak > 0 else F  # the method is scale-invariant: work at unit scale
    if cov == "total":
        Z = X - X.mean(axis=0)
    else:
        Z = X - np.stack([X[y == c].mean(axis=0) for c in classes])[np.searchsorted(classes, y)]
    w = np.linalg.eigvalsh(Z.T @ Z)
    if kind in ("constant", "zero") or not w.max() > 0:
        return "must:covariance is zero"  # zero in exact arithmetic, whatever the rounding leaves
    if a == 0 and w.min() <= 1e-12 * w.max():
        return "must:covariance is singular.*set shrinkage > 0"
    if a == 0 and w.min() <= 1e-6 * w.max():
        return "may:covariance is singular.*set shrinkage > 0"  # ill-conditioned: either answer is sound
    return None


def expected(p: dict) -> str | None:
    """``None``: a head; ``"must:PATTERN"``: exactly that refusal; ``"may:PATTERN"``: a head or that refusal."""
    fault, method, F = p["fault"], p["method"], p["F"]
    if fault != "none":
        return "must:"  # any one PrivfedError
    private = p["mech_args"] is not None
    if private and p["params"].get("means_per_client", 1) > 1:  # an invalid combination, documented
        return "must:means_per_client=2 cuts each class"
    invariant = method in INVARIANT or (method == "fedlog" and p["params"].get("feature_scale") == "auto")
    peak = float(np.abs(F).max())
    if not private and not invariant and peak > 0 and not SAFE[0] <= peak <= SAFE[1]:
        return "must:for float64 statistics"
    exact = not private or p["mech_args"]["epsilon"] == float("inf")
    if method == "fedcgs" and exact:
        if private:  # no noise, but the records are clipped first
            from mechanisms import clip_l2

            F = clip_l2(F, p["mech_args"]["clip"])
        return _fedcgs_outcome(F, np.asarray(p["y"]), p["params"], p["kind"])
    return None


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(problems())
def test_fit_returns_a_head_for_valid_input_and_one_privfed_error_otherwise(p):
    want = expected(p)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warnings are allowed; exceptions and silent garbage are not
            privacy = None
            if p["mech_args"] is not None:
                from mechanisms import GaussianMechanism

                privacy = GaussianMechanism(**p["mech_args"])
            head = privfed.fit(
                p["method"],
                p["F"],
                p["y"],
                p["k"],
                num_classes=p["num_classes"],
                num_clients=p["num_clients"],
                privacy=privacy,
                random_state=p["seed"],
                **p["params"],
            )
    except PrivfedError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg.strip(), msg  # one line
        assert "this is a bug" not in msg
        assert want is not None, (
            f"a valid input was refused: {msg} ({p['method']}, {p['params']}, {p['kind']})"
        )
        assert re.search(want.split(":", 1)[1], msg), (want, msg)
        return
    assert want is None or want.startswith("may:"), f"{p['fault']!r}: expected a refusal ({want}), got a head"
    F, y = p["F"], p["y"]
    C = int(p["num_classes"]) if p["num_classes"] is not None else int(np.max(y)) + 1
    assert head.weight.shape == (C, F.shape[1]) and head.bias.shape == (C,)
    assert np.all(np.isfinite(head.weight)) and np.all(np.isfinite(head.bias))
    if not np.any(head.weight):
        assert any("zero" in n for n in head.notes), (p["method"], p["params"], head.notes)
    scores = head.decision_function(F)
    assert np.all(np.isfinite(scores))


def test_the_oracle_can_require_a_head_and_a_refusal():
    """The oracle is not vacuous: plain data must fit, a single FedCGS record must be refused."""
    rng = np.random.default_rng(0)
    base = dict(
        method="fedcgs", params={}, y=np.arange(12) % 3, k=None, mech_args=None, fault="none", kind="plain"
    )
    assert expected({**base, "F": rng.normal(size=(12, 3))}) is None
    one = {**base, "F": np.ones((1, 2)), "y": np.array([0])}
    assert expected(one) == "must:needs more samples than"
    far = {**base, "method": "fed3r", "F": rng.normal(size=(12, 3)) * 1e160}
    assert expected(far) == "must:for float64 statistics"
    assert expected({**far, "method": "fedncm"}) is None
