"""Feature inversion from shared class sums on digits: n = 1 leaks, n = 16 / DP / secure sums do not.

The public class-mean image is the baseline every reconstruction must
beat: on digits it alone scores ~14 dB PSNR (attacks.md).  One-sided
"no better than the baseline" checks allow 3 standard errors:

* delta-PSNR: the mean over scored images of PSNR(recon) - PSNR(prior),
  with its standard error from the per-image differences;
* identification: with g released cells, each holding n images and one
  reconstruction, a chance-level reconstruction hits one of its cell's images
  with probability p = n / P_c (P_c ~ 90 private images per class), so the
  per-image rate has standard error sqrt(g p (1 - p)) / (n g).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attacks
from attacks.view import GroundTruth, PublicData, class_groups
from privfed.errors import ConfigError, InputError


def _view(d, method, n, groups, seed=1, **kw):
    cl = class_groups(d["yp"], n, np.random.default_rng(seed), max_groups=groups)
    return attacks.scenario(
        method, d["Fp"], d["yp"], cl, images=d["imp"], public=d["public"], backbone=d["backbone"], **kw
    )


def _chance_margin(m: dict, n: int, groups: int) -> float:
    """Chance identification plus 3 standard errors (module docstring)."""
    p = min(1.0, n * m["chance_identification"])
    return m["chance_identification"] + 3 * math.sqrt(groups * p * (1 - p)) / (n * groups)


def _no_better_than_prior(m: dict, n: int, groups: int) -> None:
    assert m["delta_psnr"] <= 3 * m["delta_psnr_se"], m
    assert m["identification"] <= _chance_margin(m, n, groups), m


def test_single_sample_means_are_inverted(digits):
    view, truth = _view(digits, "fedncm", 1, 30)
    m = attacks.evaluate("inversion", view, truth, rng=0)
    # chance is ~1/90; P(Binomial(30, 0.011) >= 15) < 1e-20, so 0.5 is "well above chance"
    assert m["identification"] >= 0.5, m  # measured 0.8
    assert m["delta_psnr"] > max(1.0, 3 * m["delta_psnr_se"]), m  # measured +3.8 +- 0.4 dB
    assert m["feature_cosine_target"] > 0.99


def test_means_of_sixteen_are_no_better_than_the_prior(digits):
    view, truth = _view(digits, "fedcof", 16, 20)
    _no_better_than_prior(attacks.evaluate("inversion", view, truth, rng=0), 16, 20)  # measured -2.1 dB


@pytest.mark.filterwarnings("ignore:noise backend:UserWarning")
@pytest.mark.parametrize("backend", ["pixel", "decoder"])
def test_strong_dp_defeats_inversion_of_single_samples(digits, backend):
    from mechanisms import GaussianMechanism

    clip = float(np.median(np.linalg.norm(digits["public"].features, axis=1)))
    mech = GaussianMechanism(epsilon=0.1, delta=1e-5, clip=clip)
    view, truth = _view(digits, "fedncm", 1, 30, privacy=mech, rng=2)
    # the noise-aware decoder falls back to the class prior (measured -0.1 to -1.4 dB at eps <= 10)
    _no_better_than_prior(attacks.evaluate("inversion", view, truth, rng=0, backend=backend), 1, 30)


def test_secure_aggregation_leaves_only_the_class_total(digits):
    view, truth = _view(digits, "fedncm", 1, None, secure_agg=True)
    assert view.stats.num_clients == 1
    m = attacks.evaluate("inversion", view, truth, rng=0)
    assert m["reconstructions"] == 10  # one per class: the all-client class mean
    # every private image of a class is in its cell, so identification is 1 / P_c by construction;
    # the PSNR check carries the claim
    assert m["delta_psnr"] <= 3 * m["delta_psnr_se"], m  # measured -1.6 dB
    assert m["identification"] <= m["chance_identification"] + 1e-12


def test_second_moment_beats_the_mean_alone_at_n2(digits):
    view, truth = _view(digits, "fedcgs", 2, 24)
    mean_only = attacks.evaluate("inversion", view, truth, rng=0, source="mean")
    two_stage = attacks.evaluate("inversion", view, truth, rng=0, source="second")
    # 48 images each: the difference of two proportions has SE <= sqrt(2 * 0.25 / 48) = 0.10
    se = math.sqrt(sum(p * (1 - p) / 48 for p in (mean_only["identification"], two_stage["identification"])))
    assert two_stage["identification"] > mean_only["identification"] + 3 * se, (mean_only, two_stage)
    assert two_stage["delta_psnr"] > mean_only["delta_psnr"]  # measured 0.68 vs 0.22, +2.9 vs -0.1 dB


def test_decoder_backend_inverts_single_samples(digits):
    view, truth = _view(digits, "fedncm", 1, 30)
    m = attacks.evaluate("inversion", view, truth, rng=0, backend="decoder", decoder_epochs=300)
    assert m["delta_psnr"] > 3 * m["delta_psnr_se"], m  # measured +1.8 dB
    assert m["identification"] > _chance_margin(m, 1, 30)


def test_deep_image_prior_smoke(digits):
    view, truth = _view(digits, "fedncm", 1, 2)
    res = attacks.get("inversion", backend="dip", dip_steps=5, max_cells=2).run(
        view, np.random.default_rng(0)
    )
    assert res.images.shape == (2, 8, 8) and np.all((res.images >= 0) & (res.images <= 1))
    assert np.isfinite(res.recon_features).all()


@pytest.mark.slow
def test_deep_image_prior_identifies_above_chance(digits):
    view, truth = _view(digits, "fedncm", 1, 10)
    m = attacks.evaluate("inversion", view, truth, rng=0, backend="dip", dip_steps=1000)
    assert m["identification"] > _chance_margin(m, 1, 10)  # measured 0.3 (the prior is weak at 8x8)


def test_inversion_is_deterministic(digits):
    view, truth = _view(digits, "fedncm", 1, 6)
    a = attacks.evaluate("inversion", view, truth, rng=3, steps=50)
    b = attacks.evaluate("inversion", view, truth, rng=3, steps=50)
    assert a == b


def test_inversion_refuses_bad_settings(digits):
    with pytest.raises(ConfigError, match="unknown inversion backend"):
        attacks.get("inversion", backend="gan")
    with pytest.raises(ConfigError, match="steps must be a positive int"):
        attacks.get("inversion", steps=0)
    view, truth = _view(digits, "fedncm", 1, 4)
    res = attacks.get("inversion", steps=5).run(view, np.random.default_rng(0))
    no_images = GroundTruth(features=truth.features, labels=truth.labels, clients=truth.clients)
    with pytest.raises(InputError, match="GroundTruth.images"):
        attacks.get("inversion").score(res, no_images)
    with pytest.raises(InputError, match="public images"):
        attacks.evaluate(
            "inversion",
            view.with_(public=PublicData(labels=view.public.labels, features=view.public.features)),
            truth,
        )


# ----------------------------------------------------------------------------- the committed inversion results
def _inversion_results():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return root, json.loads((root / "docs" / "attacks-inversion.json").read_text())


def test_inversion_results_json_names_the_maximum_and_its_command():
    from attacks.strongest import PER_CELL, SUITES

    _, res = _inversion_results()
    suite = (*SUITES["inversion"], PER_CELL)
    assert res["config"]["command"].startswith("PYTHONPATH=. python experiments/attacks_inversion.py ")
    settings = {(r["setting"], r["n"]) for r in res["rows"]}
    assert {("clean", n) for n in (1, 2, 4, 8, 16)} | {
        ("dp eps=10", 1),
        ("dp eps=1", 1),
        ("mean + G", 4),
    } <= settings
    for r in res["rows"]:
        ident = {
            a: r[f"{a}:identification"] for a in suite if r[f"{a}:identification"] == r[f"{a}:identification"]
        }
        # the strongest is the suite's maximum identification (ties broken by delta-PSNR), and its row is its own
        top = max(ident.values())
        assert r["identification"] == ident[r["strongest"]] == top, r
        tied = [a for a in ident if ident[a] == top]
        assert r["delta_psnr"] == max(r[f"{a}:delta_psnr"] for a in tied), r
        assert 0.0 <= r["baseline_identification"] <= 1.0 and r["delta_psnr_se"] > 0


def test_readme_inversion_table_is_the_committed_results():
    import importlib.util

    root, res = _inversion_results()
    spec = importlib.util.spec_from_file_location(
        "attacks_inversion", root / "experiments" / "attacks_inversion.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.readme_table(res["rows"])
    assert len(table) == 2 + len(res["rows"])
    readme = (root / "docs" / "attacks.md").read_text()
    if "docs/attacks-inversion.json" not in readme:
        pytest.skip("docs/attacks.md's inversion table does not cite docs/attacks-inversion.json")
    missing = [line for line in table[2:] if line not in readme]
    assert not missing, missing


@pytest.mark.filterwarnings("ignore:noise backend:UserWarning")
@pytest.mark.parametrize(
    "backend, params",
    [("pixel", {"steps": 15}), ("dip", {"dip_steps": 8}), ("decoder", {"decoder_epochs": 15})],
)
def test_optimising_backends_are_bit_identical_on_one_and_two_threads(digits, backend, params):
    """pixel, dip and decoder run on one seeded torch thread: the caller's thread count changes nothing."""
    import torch

    view, _ = _view(digits, "fedncm", 2, 3)
    att = attacks.get("inversion", backend=backend, max_cells=3, **params)
    old = torch.get_num_threads()
    out = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out[threads] = att.run(view, np.random.default_rng(5))
            assert torch.get_num_threads() == threads  # the caller's setting is restored
    finally:
        torch.set_num_threads(old)
    a, b = out[1], out[2]
    assert a.images.tobytes() == b.images.tobytes()
    assert a.recon_features.tobytes() == b.recon_features.tobytes()
    # and the images are the optimiser's output, not the start: the run did something
    assert not np.array_equal(a.images, a.baseline)
