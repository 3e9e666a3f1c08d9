"""Records whose squared norm overflows float64 are clipped like any other, never zeroed or left alone.

||f||^2 overflows for ||f|| > 1.3e154, so ``np.linalg.norm`` returns inf and c / inf = 0 would zero
the record (a mutant that did so passed every earlier test).  Here the clipped rows are compared with
the clip computed in exact decimal arithmetic, in the mechanism and through ``fit``; and the audit's
overflow neighbour pair is audited with draws, so that a record left unclipped is caught from the
release's outputs.
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest

import privfed
from mechanisms import GaussianMechanism, clip_l2
from privfed.audit import audit_release, edge_battery, fit_release


def _exact_clip(row: np.ndarray, c: float) -> np.ndarray:
    """row * min(1, c / ||row||) with the norm in 60-digit decimal arithmetic (no overflow, no rounding)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        norm = sum((decimal.Decimal(float(x)) ** 2 for x in row), decimal.Decimal(0)).sqrt()
        if norm <= decimal.Decimal(c):
            return row.copy()
        return np.array([float(decimal.Decimal(float(x)) * decimal.Decimal(c) / norm) for x in row])


HUGE_ROWS = np.array(
    [
        [1e155, 0.0, 0.0],  # just past the overflow of the square
        [-3e200, 4e200, 0.0],  # a 3-4-5 triangle far out
        [1e308, 1e308, -1e308],  # near the largest float: the sum of squares and even ||f|| overflow
        [5e-324, 1e300, 2.0],  # one huge entry among tiny ones
        [1.7e154, 1.7e154, 1.7e154],  # each square finite, their sum not
        [1.7e308, 1.7e308, 0.0],  # ||f|| itself past the largest float (c / inf zeroed this row)
        [1.7e308, -1.7e308, 1.7e308],
    ]
)


@pytest.mark.parametrize("c", [1.0, 3.0, 1e-3, 1e100])
def test_overflowing_rows_are_clipped_to_norm_c_in_their_own_direction(c):
    rows = np.vstack([HUGE_ROWS, [[0.1, 0.2, 0.3]], [[0.0, 0.0, 0.0]]])
    out = clip_l2(rows, c)
    for got, row in zip(out, rows):
        want = _exact_clip(row, c)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    big = out[: len(HUGE_ROWS)]
    norms = np.array([math.hypot(*r) for r in big])
    np.testing.assert_allclose(norms, c, rtol=1e-12)  # none zeroed, none left outside the ball


def test_the_mechanism_and_fit_clip_an_overflowing_record_into_the_class_sum():
    """With no noise (eps = inf, the clip still applies) the class sum holds the record clipped to c."""
    rng = np.random.default_rng(3)
    F = rng.normal(size=(12, 3)) * 0.1
    y = np.arange(12) % 2
    F[0] = [-3e200, 4e200, 0.0]  # class 0
    mech = GaussianMechanism(epsilon=math.inf, delta=1e-5, clip=2.0, trusted_aggregator=True)
    np.testing.assert_allclose(mech.clip(F)[0], [-1.2, 1.6, 0.0], rtol=1e-12)
    head = privfed.fit("fedncm", F, y, privacy=mech, num_classes=2, num_clients=1)
    s0 = sum(_exact_clip(F[i], 2.0) for i in range(12) if y[i] == 0)
    np.testing.assert_allclose(head.weight[0], s0 / np.linalg.norm(s0), rtol=1e-9)


def test_the_audit_of_the_overflow_pair_draws_and_passes():
    """The audit's overflow neighbour pair with a statistical test (it ran with no draws before)."""
    (pair,) = [p for p in edge_battery() if "overflows" in p.name]
    run = fit_release(
        "fedncm", lambda: GaussianMechanism(epsilon=2.0, delta=1e-5, clip=3.0, trusted_aggregator=True)
    )
    res = audit_release(run, [pair], draws=200, heldout=100)[0]
    assert res.verdict == "statistical" and res.draws == 200, res
    assert not res.flagged, res


def test_rows_clipping_cannot_bound_are_refused_under_either_norm():
    """clip_l2 returned an inf row (and a numpy warning) where its output promises norm <= c; the coordinate
    clip took inf features into a release (as the bound); a refused release still booked its placement."""
    import warnings

    from mechanisms import GaussianMechanism
    from mechanisms.dp.clipping import clip_l2
    from privfed.errors import InputError

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for row in ([np.inf, 0.0], [np.nan, 1.0]):
            with pytest.raises(InputError, match="NaN/inf values, which clipping cannot bound"):
                clip_l2(np.array([row]), 1.0)
        np.testing.assert_allclose(clip_l2(np.array([[1e200, 1e200]]), 1.0), [[2**-0.5, 2**-0.5]], rtol=1e-15)
    for norm in ("l2", "coordinate"):
        m = GaussianMechanism(epsilon=1, delta=1e-5, clip=1, clip_norm=norm, dim=4)
        with pytest.raises(InputError, match="features contains 3 NaN/inf values"):
            m.release(np.array([[np.inf, 0, 0, 0]] * 3), [0, 1, 2], rng=np.random.default_rng(0))
        assert m._placements == [] and len(m.ledger) == 0


@pytest.mark.parametrize("clip", [1e-320, 1e-200, 9e-101])
def test_a_clip_whose_noise_would_be_subnormal_is_refused(clip):
    """At clip = 1e-320 sigma was a subnormal 5e-320 and the stated epsilon (1.0000227) missed the asked 1: a
    clip below 1e-100 is refused with DP on, as one above 1e100 is; with no noise any clip is taken."""
    with pytest.raises(privfed.ConfigError, match="below 1e-100"):
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=clip)
    assert GaussianMechanism(epsilon=math.inf, delta=1e-5, clip=clip).clip_bound == clip
    assert GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1e-100).clip_bound == 1e-100
