"""The auditor's own test: broken releases it must flag, each beside the real release it breaks.

Each variant is mis-calibrated or leaky.

Run by ``python -m experiments.audit_sweep --broken`` (:func:`experiments.audit_sweep.run_broken`).
"""

from __future__ import annotations

import numpy as np

from mechanisms import GaussianMechanism
from privfed.audit import audit_release, fit_release, neighbour_battery


# Mis-calibrated or leaky releases the auditor must flag (issue 23), each beside the real release it breaks.
class ScaledNoise08(GaussianMechanism):
    """Broken: adds 0.8 of the noise it claims (true mu = 1.25 x the claim)."""

    def _add_noise(self, arr, block, sigma, rng):
        return super()._add_noise(arr, block, 0.8 * sigma, rng)


class HalvedNoise(GaussianMechanism):
    """Broken: adds half the noise it claims."""

    def _add_noise(self, arr, block, sigma, rng):
        return super()._add_noise(arr, block, sigma / 2, rng)


class CountInNote(GaussianMechanism):
    """Broken: its report carries the raw number of records (a note computed before the noise)."""

    raw = None

    def after_aggregate(self, total, method, rng):
        self.raw = int(total.counts.sum())
        return super().after_aggregate(total, method, rng)

    def report(self):
        import dataclasses

        rep = super().report()
        return dataclasses.replace(rep, notes=(*rep.notes, f"aggregate of {self.raw} records"))


class ClipAfterSum(GaussianMechanism):
    """Broken: records are not clipped; each class sum is clipped to n_c c after the sum."""

    def clip(self, features):
        super().clip(features)
        return np.asarray(features, dtype=np.float64)

    def after_aggregate(self, total, method, rng):
        n = total.counts[..., None]
        norms = np.linalg.norm(total.sums, axis=-1, keepdims=True)
        bound = np.maximum(n, 0) * self.clip_bound
        sums = total.sums * np.minimum(1.0, bound / np.where(norms > 0, norms, 1.0))
        return super().after_aggregate(total.with_arrays(sums=sums), method, rng)


def seed_zero_without_a_seed():
    """A context in which privfed.fit draws from seed 0 when no seed is given, and reports fresh entropy."""
    import types
    from unittest import mock

    import privfed.api

    fake = types.ModuleType("numpy_seed0")
    fake.__dict__.update(np.__dict__)
    fake.random = types.ModuleType("numpy_seed0.random")
    fake.random.__dict__.update(np.random.__dict__)
    fake.random.default_rng = lambda seed=None: np.random.default_rng(0 if seed is None else seed)
    return mock.patch.object(privfed.api, "np", fake)


def broken_catalogue(eps: float = 1.0, clip: float = 3.0):
    """(variant, broken?, how to audit it) of every release the auditor's own test runs."""
    import contextlib

    from privfed.audit import audit_gaussian_blocks, rounds_release

    canary = [neighbour_battery("record")[1]]
    base = dict(epsilon=eps, delta=1e-5, clip=clip)
    blocks3 = dict(base, blocks=("sums", "counts", "second"), split="equal")

    def fit(cls, **kw):
        return fit_release("fedncm", lambda: cls(**dict(base, **kw)))

    def release(run, draws=0, heldout=100, ctx=contextlib.nullcontext):
        def go(seed):
            with ctx():
                r = audit_release(run, canary, draws=draws, heldout=heldout, seed=seed)[0]
            return {
                "verdict": r.verdict,
                "flagged": bool(r.flagged),
                "eps_lb": r.eps_lb,
                "mu_lb": r.mu_lb,
                "claimed_eps": r.claimed_eps,
                "claimed_mu": r.claimed_mu,
                "draws": r.draws,
                "reason": r.reason[:300],
            }

        return go

    def blocks(cls):
        def go(seed):
            res = audit_gaussian_blocks(lambda: cls(**blocks3), rng=np.random.default_rng(seed))
            worst = max(res.values(), key=lambda r: r.mu_lb / r.claimed_mu)
            return {
                "verdict": "statistical (per block)",
                "flagged": any(r.refutes for r in res.values()),
                "mu_lb": worst.mu_lb,
                "claimed_mu": worst.claimed_mu,
                "draws": worst.draws,
                "eps_lb": None,
                "claimed_eps": None,
                "reason": "audit_gaussian_blocks, draws from the power formula",
            }

        return go

    def rounds(halve):
        run = rounds_release(epsilon=eps, clip=clip, rounds=3)
        if not halve:
            return release(run, draws=200)

        def ctx():
            from unittest import mock

            from mechanisms.dp.backends import NumpyNoise

            inner = NumpyNoise.add_gaussian
            return mock.patch.object(
                NumpyNoise, "add_gaussian", lambda self, x, s, rng: inner(self, x, s / 2, rng)
            )

        return release(run, ctx=ctx)

    central = dict(trusted_aggregator=True)
    return [
        ("gaussian blocks, real (3 blocks, equal split)", False, blocks(GaussianMechanism)),
        ("gaussian blocks, noise x 0.8", True, blocks(ScaledNoise08)),
        ("fit fedncm local, real", False, release(fit(GaussianMechanism), draws=200)),
        ("fit fedncm local, noise x 0.5", True, release(fit(HalvedNoise))),
        (
            "fit fedncm local, seed 0 when no seed is given",
            True,
            release(fit(GaussianMechanism), ctx=seed_zero_without_a_seed),
        ),
        ("fit fedncm central, real", False, release(fit(GaussianMechanism, **central), draws=200)),
        ("fit fedncm central, raw count in a note", True, release(fit(CountInNote, **central))),
        (
            "fit fedncm central, clipping after the sum",
            True,
            release(fit(ClipAfterSum, **central), draws=200),
        ),
        ("rounds (3 releases, central), real", False, rounds(False)),
        ("rounds (3 releases, central), noise x 0.5", True, rounds(True)),
    ]
