"""StatisticSensitivity refuses bounds and settings that would calibrate the wrong noise."""

from __future__ import annotations

import pytest

from privfed.errors import ConfigError


@pytest.mark.parametrize(
    "kw, text",
    [
        # before: {'second': 0.0}, a second moment calibrated with no noise
        ({"clip_l2": 1e-200}, r"clip_l2=1e-200 gives the 'second' block a sensitivity of 0.0 in float64"),
        ({"clip_l2": 1e200}, r"clip_l2=1e\+200 gives the 'second' block a sensitivity of inf"),
        # before: accepted and ignored
        ({"clip_l2": 1.0, "max_records": 5}, "max_records=5 bounds nothing at record level"),
    ],
)
def test_a_sensitivity_refuses_what_would_calibrate_the_wrong_noise(kw, text):
    from mechanisms.dp.sensitivity import StatisticSensitivity

    with pytest.raises(ConfigError, match=text):
        StatisticSensitivity(**kw).per_block(("sums", "counts", "second"))
    assert StatisticSensitivity(clip_l2=1e-100).per_block(("second",))["second"] > 0


def test_the_mechanism_without_noise_still_takes_any_clip():
    """The check is the sensitivity's own: a mechanism at epsilon = inf (no noise) takes any clip, as before."""
    import math

    from mechanisms import GaussianMechanism

    for clip in (1e-200, 1e200):
        GaussianMechanism(epsilon=math.inf, delta=1e-5, clip=clip, blocks=("sums", "counts", "second"))
