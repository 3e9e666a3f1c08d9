"""Choosing a mechanism's noise backend after it is made (a Flower node's operator, a server's report).

``GaussianMechanism.set_backend`` recalibrates for the backend: OpenDP rounds every statistic to its grid,
so the sensitivity gains the rounding slack over the coordinates one neighbour can move and sigma grows
to keep mu.  Checked against the numbers computed here from the definitions: the slack is
grid * sqrt(m) for m moving coordinates (one class row at record level; every row of a bounded upload).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("opendp")

from mechanisms import GaussianMechanism  # noqa: E402
from privfed.errors import ConfigError  # noqa: E402
from privfed.stats import ClientStats  # noqa: E402

GRID = 2.0**-10
D, C = 6, 3


def _mech(**kw):
    return GaussianMechanism(**{"epsilon": 1.0, "delta": 1e-5, "clip": 2.0, **kw})


def test_set_backend_equals_making_the_mechanism_with_it():
    made = _mech(backend="opendp", dim=D)
    chosen = _mech(dim=D)
    numpy_sigma = chosen.sigma
    chosen.set_backend("opendp")
    assert chosen.backend.name == "opendp"
    assert chosen.sigma == made.sigma and chosen.sensitivity == made.sensitivity
    # record level: one record moves one class row (d sums) and one count
    assert chosen.sensitivity["sums"] == pytest.approx(2.0 + GRID * math.sqrt(D), rel=1e-15)
    assert chosen.sensitivity["counts"] == pytest.approx(1.0 + GRID, rel=1e-15)
    for b in ("sums", "counts"):  # the same mu per block: sigma grows with the sensitivity
        assert chosen.sensitivity[b] / chosen.sigma[b] == pytest.approx(2**-0.5 * chosen.mu, rel=1e-12)
        assert chosen.sigma[b] > numpy_sigma[b]
    chosen.set_backend("numpy")
    assert chosen.sigma == numpy_sigma


def test_a_bounded_upload_counts_every_class_row_in_the_rounding_slack():
    """record_bound='upload' (bodies trained on the records): one record can move the whole upload."""
    m = _mech(record_bound="upload", max_records=5, dim=D)
    m.set_backend("opendp", num_classes=C)
    base = 2 * 5  # the diameter of an upload bounded to 5 records: 2 n_max per record's sensitivity
    assert m.sensitivity["sums"] == pytest.approx(base * 2.0 + GRID * math.sqrt(C * D), rel=1e-15)
    assert m.sensitivity["counts"] == pytest.approx(base * 1.0 + GRID * math.sqrt(C), rel=1e-15)


def test_a_discrete_gaussian_share_narrower_than_four_grid_steps_is_refused():
    stats = ClientStats(counts=np.ones((1, C)), sums=np.ones((1, C, D)))

    class Mask:
        noise = None

    wide = _mech(epsilon=1.0, backend="opendp")
    wide.check(type("M", (), {"name": "fedncm", "requires": ("counts", "sums")})(), Mask())
    out = wide.node_release(stats, 10, np.random.default_rng(0))
    q = out.sums / GRID
    assert np.array_equal(q, np.rint(q))  # OpenDP's values: on the grid
    narrow = _mech(epsilon=1e4, backend="opendp")  # sigma of a count about 6e-4: under one grid step
    narrow.check(type("M", (), {"name": "fedncm", "requires": ("counts", "sums")})(), Mask())
    with pytest.raises(ConfigError, match="spans .* steps of the backend's grid .* below 4"):
        narrow.node_release(stats, 10, np.random.default_rng(0))


def test_rounds_dp_drawn_from_opendp_keeps_its_mu_per_release():
    from privfed.rounds import RoundsConfig
    from privfed.rounds.run import make_dp

    rc = RoundsConfig(epsilon=4.0, clip=2.0, rounds=3, local_epochs=1, max_records=50).validate()
    dp = make_dp(rc, rounds=3, bodies_trained=True)
    mu, sens = dp.mu_per_release, dp.sensitivity
    dp.use_backend("opendp", num_classes=10)
    assert dp.backend.name == "opendp" and dp.mu_per_release == pytest.approx(mu, rel=1e-12)
    assert dp.sensitivity > sens


def test_opendp_draws_its_full_noise_at_any_scale_the_grid_holds():
    """OpenDP's int is 32 bits: draws saturated at +-2**31 grid steps, so at the default grid a sigma of 1e7 gave
    a standard deviation of 2e6 while the report stated 1e7 (the printed guarantee was false).  Draws are now
    64-bit; the standard deviation of 20,000 draws is within 5% of sigma (10 standard errors: 1/sqrt(2n) = 0.5%)."""
    import numpy as np

    from mechanisms.dp.backends import OpenDPNoise
    from privfed.errors import ConfigError

    backend = OpenDPNoise()
    for sigma in (1e3, 1e7, 1e11):
        assert abs(backend.add_gaussian(np.zeros(20_000), sigma).std() / sigma - 1) < 0.05, sigma
    laplace = backend.add_laplace(np.zeros(20_000), 1e7)
    assert abs(laplace.std() / (np.sqrt(2) * 1e7) - 1) < 0.05
    assert np.abs(backend.add_geometric(np.zeros(200), 1e-12)).max() > 2.0**31  # beyond the old saturation
    for bad, words in (
        (lambda: backend.add_gaussian(np.array([np.nan, 1.0]), 1.0), "NaN/inf"),
        (lambda: backend.add_geometric(np.zeros(2), 0.0), "epsilon > 0"),
        (lambda: backend.add_gaussian(np.zeros(2), -1.0), "sigma must be finite and >= 0"),
        (lambda: backend.add_gaussian(np.zeros(2), 1e20), "too large for grid"),
    ):
        with pytest.raises(ConfigError, match=words):
            bad()
