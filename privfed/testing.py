"""Audit a privacy budget in your own tests: ``privfed.testing.audit(release_fn, epsilon=..., delta=...)``.

:func:`audit` runs a release function on worst-case neighbouring datasets
(:func:`privfed.audit.neighbour_battery`, or yours) through the black-box auditor
(:func:`privfed.audit.audit_release`) and raises ``AssertionError`` when anything refutes the
claim: a deterministic difference between neighbours (an error, a warning, a shape, a number in a
note), a bare exception, noise that is not fresh, noise below the scale the ledger states, a
report stating more than the claimed epsilon, or an empirical lower bound eps_lb above the claim.
It returns the per-pair results when nothing does.  An audit can refute a claim, never certify it.

Example (a pytest test in your project)::

    import privfed
    from mechanisms import GaussianMechanism
    from privfed.testing import audit, fit_release

    def test_my_release_keeps_its_budget():
        # What the server receives from privfed.fit (the noisy uploads or sums), audited at eps = 1:
        audit(fit_release("fedncm", lambda: GaussianMechanism(epsilon=1.0, delta=1e-5, clip=3.0)),
              epsilon=1.0, delta=1e-5)

    def test_my_own_pipeline():
        # Any function of (dataset kwargs, seed): here the fitted head (post-processing of the release).
        def release(data, seed):
            mech = GaussianMechanism(epsilon=1.0, delta=1e-5, clip=3.0)
            return privfed.fit("fedncm", **data, privacy=mech, random_state=seed)
        audit(release, epsilon=1.0, delta=1e-5)

``release_fn(data, seed)`` receives ``data``, the keyword arguments of :func:`privfed.fit` that
describe a dataset (``features``, ``labels``, ``clients``, ``num_classes``, ``num_clients``), and
``seed`` (an int, or ``None`` for a run without a seed: it must then draw fresh noise).  It returns
a :class:`privfed.LinearHead` (audited on its weights and bias, notes and report), a numpy array,
or the dict of :func:`privfed.audit.audit_release` (``arrays``, ``meta``, ``report``, ``noise``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mechanisms.dp.calibration import as_real
from privfed.audit import Neighbours, ReleaseAudit, audit_release, fit_release, neighbour_battery
from privfed.errors import ConfigError

__all__ = ["audit", "fit_release"]


@dataclass(frozen=True)
class _Claim:
    """The caller's claim, standing in for a report when the release returns none."""

    epsilon: float
    delta: float
    simulation: bool
    guarantee: str = "claimed by the caller"
    notes: tuple = ()
    placement: str = "unknown"
    accountant: str = "claimed"
    is_private: bool = True


def _as_output(value, claim: _Claim) -> dict:
    if isinstance(value, dict) and "arrays" in value:
        out = dict(value)
        out.setdefault("meta", ())
        if out.get("report") is None:
            out["report"] = claim
        return out
    if hasattr(value, "weight") and hasattr(value, "bias"):  # a LinearHead
        rep = getattr(value, "privacy", None)
        up = getattr(value, "upload_bytes", None) or {}
        meta = (
            np.shape(value.weight),
            tuple(sorted((str(k), v) for k, v in up.items())),
            tuple(getattr(value, "notes", ())),
        )
        return {
            "arrays": [np.asarray(value.weight), np.asarray(value.bias)],
            "meta": meta,
            "report": claim if rep is None else rep,
        }
    return {"arrays": [np.asarray(value, dtype=np.float64)], "meta": (), "report": claim}


def audit(
    release_fn: Callable[[dict, int | None], object],
    *,
    epsilon: float,
    delta: float,
    neighbours: Sequence[Neighbours] | None = None,
    level: str = "record",
    draws: int = 600,
    heldout: int = 300,
    statistical: str = "first",
    seed: int = 0,
    alpha: float = 0.05,
) -> list[ReleaseAudit]:
    """Assert that ``release_fn`` keeps an (``epsilon``, ``delta``) claim on worst-case neighbours.

    Parameters
    ----------
    release_fn : callable ``(data, seed) -> LinearHead | array | dict``
        The release under test (module docstring).
    epsilon, delta : float
        The claim.  A privfed report stating a larger epsilon fails too.
    neighbours : sequence of Neighbours, optional
        Pairs of datasets; default :func:`privfed.audit.neighbour_battery` at ``level``.
    draws, heldout : int
        Draws per side for the lower bound and for choosing its test (held out).
    statistical : {"first", "all", "none"}
        Pairs that get the statistical bound (every pair gets the deterministic, freshness and
        noise-scale checks): the first (default, keeps a test fast), all, or none.
    seed : int
        Seed of the audit's own draws (the audit is reproducible; ``release_fn`` also runs unseeded).

    Returns
    -------
    list of ReleaseAudit
        One per pair, when nothing refutes the claim.

    Raises
    ------
    AssertionError
        Naming every pair, verdict and bound that refutes the claim.
    """
    try:
        epsilon, delta = as_real(epsilon), as_real(delta)
    except (TypeError, ValueError):
        epsilon = delta = math.nan
    if not (epsilon > 0) or not (0 <= delta < 1):
        raise ConfigError(f"need epsilon > 0 and delta in [0, 1), got epsilon={epsilon!r}, delta={delta!r}")
    if neighbours is None and level not in ("record", "client"):
        raise ConfigError(f"level must be 'record' or 'client', got {level!r}")
    if statistical not in ("first", "all", "none"):
        raise ConfigError(f"statistical must be 'first', 'all' or 'none', got {statistical!r}")
    pairs = list(neighbour_battery(level) if neighbours is None else neighbours)
    if not pairs:
        raise ConfigError("neighbours is empty: pass at least one Neighbours pair")

    def run(data: dict, s) -> dict:
        claim = _Claim(float(epsilon), float(delta), simulation=s is not None)
        return _as_output(release_fn(data, s), claim)

    results: list[ReleaseAudit] = []
    for i, pair in enumerate(pairs):
        n = draws if statistical == "all" or (statistical == "first" and i == 0) else 0
        results += audit_release(run, [pair], draws=n, heldout=heldout, alpha=alpha, seed=seed + i)
    failures = []
    for r in results:
        if r.flagged:
            failures.append(f"{r.pair}: {r.verdict}: {r.reason}")
        if r.verdict == "no claim" and r.reason:  # a report saying it gives no DP guarantee (none: no report)
            failures.append(f"{r.pair}: the release's report states no DP guarantee ({r.reason})")
        if r.verdict == "statistical" and r.eps_lb > epsilon:
            failures.append(f"{r.pair}: empirical epsilon lower bound {r.eps_lb:.4g} > claimed {epsilon:g}")
        # every pair whose release reported (not only those given the statistical test)
        if r.claimed_eps > epsilon * (1 + 1e-12):
            failures.append(
                f"{r.pair}: the release's report states epsilon {r.claimed_eps:.6g} > claimed {epsilon:g}"
            )
    if failures:
        raise AssertionError(
            f"privacy audit refutes the claim ({epsilon:g}, {delta:g}):\n  " + "\n  ".join(failures)
        )
    return results
