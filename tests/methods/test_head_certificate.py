"""The finiteness proof FedNCM's and FedLog's servers hand to LinearHead instead of re-reading the weight.

A head is checked finite when it is made; a server whose construction bounds every weight passes
``weight_proved_finite`` and the (C, d) scan is skipped.  These tests pin that the proof is sound (it
is never given for a weight holding a NaN or inf, over inputs of every magnitude and with NaN and inf
rows), complete on finite inputs for ``normalise_rows`` (any finite matrix is proved), and that the
head still refuses a non-finite bias, or a weight nobody proved.
"""

from __future__ import annotations

import numpy as np
import pytest

import privfed
from privfed._linalg import normalise_rows
from privfed.head import LinearHead
from privfed.methods.base import Method
from privfed.stats import ClientStats


def _wild(rng, C=40, d=9, specials=True):
    """Rows of random magnitude 10^[-320, 308], some zero, some (optionally) holding NaN or +-inf."""
    W = rng.standard_normal((C, d)) * 10.0 ** rng.uniform(-320, 308, size=(C, 1))
    W[rng.random(C) < 0.1] = 0.0
    if specials:
        for value in (np.nan, np.inf, -np.inf):
            rows = rng.choice(C, size=2, replace=False)
            W[rows, rng.integers(d)] = value
    return W


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("eps", [0.0, 1e-200])
def test_the_proof_is_sound_and_changes_no_bit(seed, eps):
    rng = np.random.default_rng(seed)
    W = _wild(rng, specials=seed % 2 == 0)
    b = rng.standard_normal(W.shape[0])
    with np.errstate(all="ignore"):
        (out, ob), proved = normalise_rows(W, b, eps=eps, certify=True)
        plain_out, plain_b = normalise_rows(W, b, eps=eps)
    np.testing.assert_array_equal(out, plain_out)  # certify only reports; the result is the same bits
    np.testing.assert_array_equal(ob, plain_b)
    has_special = not np.isfinite(W).all()
    if proved:
        assert np.isfinite(out).all()
    # complete on finite input: every finite matrix is proved; a NaN or inf row is never vouched for
    assert proved == (not has_special)


def test_a_row_of_nan_or_inf_is_never_proved():
    for value in (np.nan, np.inf, -np.inf):
        W = np.ones((3, 4))
        W[1, 2] = value
        with np.errstate(all="ignore"):
            out, proved = normalise_rows(W, certify=True)
        assert not proved


def test_head_checks_what_nobody_proved_and_always_the_bias():
    W = np.ones((2, 3))
    W[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match="non-finite head"):
        LinearHead(W, np.zeros(2), method="fedncm", made_by_method=True)
    with pytest.raises(FloatingPointError, match="non-finite head"):
        # only the literal True skips the scan
        LinearHead(W, np.zeros(2), method="fedncm", made_by_method=True, weight_proved_finite=1)
    with pytest.raises(FloatingPointError, match="non-finite head"):
        LinearHead(
            np.ones((2, 3)),
            np.array([0.0, np.inf]),
            method="fedncm",
            made_by_method=True,
            weight_proved_finite=True,
        )
    head = LinearHead(np.ones((2, 3)), np.zeros(2), weight_proved_finite=True)
    assert "weight_proved_finite" not in vars(head)  # init-only: not stored, not pickled, not in asdict


def _stats(rng, C, d, scale):
    K = 3
    counts = rng.integers(0, 5, size=(K, C)).astype(float)
    counts[:, 0] = 0.0  # an absent class: a zero row
    sums = rng.standard_normal((K, C, d)) * scale * counts[..., None]
    return ClientStats(counts=counts, sums=sums)


# FedNCM has no feature scale; FedLog at scale 1e300 with feature_scale 1 overflows and is refused (below)
_CASES = [("fedncm", s, 1.0) for s in (1.0, 1e-150, 1e150, 1e300)] + [
    ("fedlog", s, f) for s in (1.0, 1e-150, 1e150, 1e300) for f in (1.0, "auto") if (s, f) != (1e300, 1.0)
]


@pytest.mark.parametrize("method, scale, feature_scale", _CASES)
def test_every_head_a_server_vouched_for_is_finite(method, scale, feature_scale, monkeypatch):
    claims = []
    original = Method._head

    def recording(self, weight, bias, notes=(), *, weight_proved_finite=False, **extras):
        claims.append((weight_proved_finite, np.isfinite(np.asarray(weight, dtype=float)).all()))
        return original(self, weight, bias, notes, weight_proved_finite=weight_proved_finite, **extras)

    monkeypatch.setattr(Method, "_head", recording)
    params = {} if method == "fedncm" else {"feature_scale": feature_scale}
    stats = _stats(np.random.default_rng(7), C=6, d=5, scale=scale)
    privfed.methods.get(method, **params).aggregate(stats)
    assert claims, "the server made no head"
    for proved, finite in claims:
        assert finite or not proved
    if method == "fedncm" or scale == 1.0:
        assert claims[-1][0], "an ordinary statistic should be proved finite without a rescan"


def test_fedlog_names_the_fix_when_its_statistic_overflows():
    stats = _stats(np.random.default_rng(7), C=6, d=5, scale=1e300)
    with pytest.raises(privfed.InputError, match="feature_scale='auto'"):
        privfed.methods.get("fedlog").aggregate(stats)
    head = privfed.methods.get("fedlog", feature_scale="auto").aggregate(stats)
    assert np.isfinite(head.weight).all()


@pytest.mark.parametrize("method", ["fedncm", "fedlog"])
@pytest.mark.parametrize("stat", ["counts", "sums"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_hand_made_statistics_holding_nan_or_inf_are_refused_not_zeroed(method, stat, value):
    """Uploads are checked as they are folded; a ClientStats made by hand reaches the server directly.  A
    NaN row used to be normalised to a zero row without a word; now it is refused, naming the class."""
    counts, sums = np.ones((2, 3)), np.ones((2, 3, 4))
    (counts if stat == "counts" else sums)[0, 1, ...] = value
    with pytest.raises(privfed.InputError, match=f"class {stat} hold NaN or inf \\(class 1 first\\)"):
        privfed.methods.get(method).aggregate(ClientStats(counts=counts, sums=sums))
