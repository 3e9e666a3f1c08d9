"""The CKKS sum run by the protocol's node, key-holder and server objects gives what the one-function version gave."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tenseal")

from mechanisms import ckks as old  # noqa: E402
from mechanisms import ckks_run as new  # noqa: E402

GRID = 2.0**-20


@pytest.mark.parametrize("noise_std", [0.0, 0.5])
def test_old_and_new_sums_agree_on_the_release_grid(noise_std):
    X = np.random.default_rng(3).normal(size=(5, 4100))  # two ciphertexts per client
    a = old.ckks_sum(X, noise_std=noise_std, rng=np.random.default_rng(9))
    b = new.ckks_sum(X, noise_std=noise_std, rng=np.random.default_rng(9))
    # the same noise draws (same rng, same order); fresh keys each, so the decryption errors differ
    for r in (a, b):
        assert np.array_equal(np.rint(r.total / GRID) * GRID, r.total)  # on the grid
    assert np.abs(a.total - b.total).max() <= GRID  # at most one grid step apart
    assert np.mean(a.total != b.total) < 0.05  # and mostly equal
    assert a.integral == b.integral is False
    assert a.num_ciphertexts == b.num_ciphertexts == 2
    # serialized keys and ciphertexts vary by a few bytes between key pairs (compression of random polynomials)
    assert abs(a.download_bytes - b.download_bytes) < 0.01 * a.download_bytes
    assert sorted(a.upload_bytes) == sorted(b.upload_bytes)
    assert abs(
        np.mean(list(a.upload_bytes.values())) - np.mean(list(b.upload_bytes.values()))
    ) < 0.01 * np.mean(list(a.upload_bytes.values()))
    assert set(a.seconds) == set(b.seconds)


def test_old_and_new_integer_sums_are_exact_and_equal():
    counts = np.random.default_rng(4).integers(0, 10_000, size=(6, 10)).astype(np.float64)
    a, b = old.ckks_sum(counts), new.ckks_sum(counts)
    assert a.integral and b.integral
    assert np.array_equal(a.total, b.total)
    assert np.array_equal(b.total, counts.sum(axis=0))
