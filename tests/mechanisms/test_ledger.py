"""Ledger events, reports, and the noise backends (numpy and OpenDP exact samplers)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import privfed
from mechanisms import GaussianMechanism, NumpyNoise, OpenDPNoise, PrivacyLedger, ReleaseEvent, get_backend
from privfed.errors import ConfigError


def test_release_event_validation():
    with pytest.raises(ConfigError, match="unknown noise mechanism"):
        ReleaseEvent("cauchy", "sums", 1.0, 1.0)
    with pytest.raises(ConfigError, match="relation"):
        ReleaseEvent("gaussian", "sums", 1.0, 1.0, relation="user")
    with pytest.raises(ConfigError, match="must be >= 0"):
        ReleaseEvent("gaussian", "sums", -1.0, 1.0)
    with pytest.raises(ConfigError, match="sampling_rate"):
        ReleaseEvent("gaussian", "sums", 1.0, 1.0, sampling_rate=0.0)
    assert ReleaseEvent("gaussian", "sums", 2.0, 4.0).gdp_mu == 0.5
    assert not ReleaseEvent("uniform", "counts", 1.0, 0.5).private


@pytest.mark.filterwarnings("ignore:noise backend 'numpy'")
def test_every_release_is_recorded():
    rng = np.random.default_rng(0)
    F = rng.normal(size=(60, 4))
    y = np.arange(60) % 3
    k = np.arange(60) % 4
    m = GaussianMechanism(
        epsilon=1.0, delta=1e-5, clip=1.0, rounds=5, level="client", max_records=30, trusted_aggregator=True
    )
    privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=m)
    assert len(m.ledger) == 2
    for e in m.ledger.events:
        # One fit is one release: sigma is calibrated for 5, the ledger books what happened.
        assert e.relation == "client" and e.rounds == 1 and e.sampling_rate == 1.0
        assert e.sensitivity == m.sensitivity[e.block] and e.scale == m.sigma[e.block]
    assert len({e.release_id for e in m.ledger.events}) == 1
    rep = m.report()
    from mechanisms import gdp_epsilon, gdp_mu

    assert rep.rounds == 5 and rep.epsilon == pytest.approx(
        gdp_epsilon(gdp_mu(1.0, 1e-5) / math.sqrt(5), 1e-5)
    )
    assert "client level" in rep.guarantee and "1 release(s)" in rep.guarantee
    for _ in range(4):
        privfed.fit("fedncm", F, y, k, num_classes=3, num_clients=4, privacy=m)
    assert m.report().epsilon == pytest.approx(1.0, rel=1e-6)  # the five releases use the whole budget
    m.ledger.reset()
    assert m.report().guarantee == "nothing released yet"


def test_ledger_ids():
    led = PrivacyLedger()
    assert led.new_release() != led.new_release()


def test_numpy_backend_warns_once_and_is_seedable():
    NumpyNoise._warned = False
    b = NumpyNoise()
    with pytest.warns(UserWarning, match="floating-point attacks"):
        x = b.add_gaussian(np.zeros(5), 1.0, np.random.default_rng(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = b.add_gaussian(np.zeros(5), 1.0, np.random.default_rng(3))
    np.testing.assert_array_equal(x, y)
    assert isinstance(get_backend(None), NumpyNoise)
    with pytest.raises(ConfigError, match="available"):
        get_backend("nope")


def test_opendp_backend_small_arrays():
    b = OpenDPNoise(grid=2.0**-8)
    x = np.linspace(-3, 3, 4000).reshape(40, 100) + 1e-5
    out = b.add_gaussian(x, 2.0, None)
    assert out.shape == x.shape
    assert np.all(np.abs(out / b.grid - np.round(out / b.grid)) < 1e-9)  # on the grid
    noise = out - np.round(x / b.grid) * b.grid
    # Discrete Gaussian at scale 512 grid steps: variance within 1e-9 of sigma^2;
    # sample variance of 4000 values has relative sd sqrt(2/4000) = 0.022; 5 sd.
    assert abs(noise.var() / 4.0 - 1) < 5 * math.sqrt(2 / 4000)
    assert abs(noise.mean()) < 5 * 2.0 / math.sqrt(4000)
    lap = b.add_laplace(np.zeros(4000), 1.0, None)
    assert abs(lap.var() / 2.0 - 1) < 5 * math.sqrt(5 / 4000)
    geo = b.add_geometric(np.zeros(4000), 1.0, None)
    assert np.all(geo == np.round(geo))
    with pytest.raises(ConfigError, match="integer-valued"):
        b.add_geometric(np.array([0.5]), 1.0, None)
    assert b.sensitivity_slack(100) == pytest.approx(b.grid * 10)
    with pytest.raises(ConfigError, match="power of two"):
        OpenDPNoise(grid=0.3)


def test_secure_backend_end_to_end_records_rounding_slack():
    rng = np.random.default_rng(0)
    F = rng.normal(size=(40, 3))
    y = np.arange(40) % 2
    m = GaussianMechanism(epsilon=2.0, delta=1e-5, clip=1.0, backend="opendp", trusted_aggregator=True)
    head = privfed.fit("fedncm", F, y, np.arange(40) % 3, num_classes=2, num_clients=3, privacy=m)
    assert np.all(np.isfinite(head.weight))
    ev = {e.block: e for e in m.ledger.events}
    # Only the d = 3 coordinates of one class row move with one record; the slack is calibrated for.
    assert ev["sums"].sensitivity == pytest.approx(1.0 + m.backend.grid * math.sqrt(3))
    assert ev["counts"].sensitivity == pytest.approx(1.0 + m.backend.grid)
    rep = head.privacy
    assert rep.epsilon == pytest.approx(2.0, rel=1e-9)
    assert not any("floating-point" in n for n in rep.notes)


def _all_mechanisms():
    from mechanisms import (
        GaussianCountNoise,
        GeometricCountNoise,
        LaplaceCountNoise,
        UniformCountNoiseNoDP,
    )

    return [
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=2.0),
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=2.0, trusted_aggregator=True, rounds=3),
        GaussianMechanism(epsilon=1.0, delta=1e-5, clip=1.0, clip_norm="coordinate", split="joint"),
        GaussianMechanism(
            epsilon=1.0, delta=1e-5, clip=2.0, level="client", max_records=50, trusted_aggregator=True
        ),
        LaplaceCountNoise(epsilon=1.0),
        GeometricCountNoise(epsilon=1.0),
        GaussianCountNoise(epsilon=1.0, delta=1e-5),
        UniformCountNoiseNoDP(epsilon=0.5),
    ]


@pytest.mark.filterwarnings("ignore:noise backend 'numpy'")
@pytest.mark.parametrize("mech", _all_mechanisms(), ids=repr)
def test_mechanism_contract(mech):
    """Every mechanism: the hook protocol, a documented guarantee, a ledger-computed JSON report."""
    import json

    from mechanisms import PrivacyReport

    for hook in ("check", "clip", "before_upload", "after_aggregate", "report"):
        assert callable(getattr(mech, hook))
    assert hasattr(mech, "feature_transform")
    doc = (type(mech).__doc__ or "") + (__import__(type(mech).__module__, fromlist=["x"]).__doc__ or "")
    assert "eighbouring relation" in doc and "ensitivit" in doc
    rng = np.random.default_rng(0)
    F = rng.normal(size=(80, 4)) * 3
    y = np.arange(80) % 4
    k = np.arange(80) % 5
    head = privfed.fit("fedncm", F, y, k, num_classes=4, num_clients=5, privacy=mech, random_state=1)
    rep = head.privacy
    assert isinstance(rep, PrivacyReport)
    assert len(mech.ledger) == rep.num_events > 0
    json.dumps(rep.as_dict())
    if getattr(mech, "dp", True):
        assert math.isfinite(rep.epsilon) and rep.epsilon <= mech.epsilon * (1 + 1e-6)
    else:
        assert rep.guarantee.startswith("NO DP GUARANTEE") and rep.epsilon == math.inf
    assert np.all(np.isfinite(head.weight))
