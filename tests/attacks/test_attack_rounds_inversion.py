"""Feature inversion against the multi-round FedLog release (experiments/attacks_rounds_inversion.py).

The script attacks the per-client uploads it recomputes through the frozen
public body; these tests check that those uploads are the run's release
(their sum is every round's released statistic) and equal an independent
computation (the digits features of the same records summed per client and
class), and that the committed record's readings are what the docs say.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.attacks_rounds_inversion import SUITE_ORDER, rounds_release, views

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(digits):
    return rounds_release(digits, clients=20, rounds=2, seed=0)


def test_recomputed_uploads_are_the_multi_round_release(release, digits):
    assert release["rounds"] == 2 and release["rounds_identical"]
    assert release["max_rel_error"] <= 1e-9
    # independently: the digits features of each client's records summed per class (float32 features)
    owners, y, F = release["owners"], digits["yp"], digits["Fp"]
    K, C = release["counts"].shape
    for k in range(K):
        for c in range(C):
            sel = (owners == k) & (y == c)
            assert release["counts"][k, c] == sel.sum()
            np.testing.assert_allclose(
                release["sums"][k, c], F[sel].astype(np.float64).sum(0), rtol=1e-5, atol=1e-5
            )
    assert release["max_rel_error_vs_features"] <= 1e-5


def test_views_are_the_uploads_and_their_secure_sum(release, digits):
    got = {name: view for name, view, _ in views(digits, release)}
    assert set(got) == {"uploads", "secure sum"}
    up, sec = got["uploads"], got["secure sum"]
    assert up.per_client and not sec.per_client and sec.secure_agg
    np.testing.assert_array_equal(up.stats.sums, release["sums"])
    np.testing.assert_allclose(sec.stats.sums[0], release["sums"].sum(0), rtol=1e-12)
    assert up.backbone is digits["backbone"] and up.public is digits["public"]


def test_recorded_rounds_inversion_names_the_suite_maximum_with_chance():
    rec = json.loads((ROOT / "docs" / "attacks-rounds-inversion.json").read_text())
    for c in rec["config"]["checks"]:
        assert c["rounds_identical"] and c["max_rel_error"] <= 1e-9 and c["max_rel_error_vs_features"] <= 1e-5
        assert c["run"]["local_epochs"] == 0 and c["run"]["families"] == ["cnn"]
    settings = {(r["setting"], r["clients"]) for r in rec["rows"]}
    assert {s for s, _ in settings} == {"uploads", "secure sum"}
    for r in rec["rows"]:
        ids = {k: r[f"{k}:identification"] for k in SUITE_ORDER}
        ok = [v for v in ids.values() if not math.isnan(v)]
        assert r["identification"] == max(ok) and ids[r["strongest"]] == r["identification"], r
        assert 0 < r["chance_identification"] < 1 and r["identification_se"] >= 0
    docs = (ROOT / "docs" / "attacks.md").read_text()
    for r in rec["rows"]:
        assert f"the strongest attack in privfed ({r['strongest']}) reaches" in docs
        assert (
            f"{r['identification']:.3f} (SE {r['identification_se']:.3f}; chance {r['chance_identification']:.3f}"
            in docs
        )
