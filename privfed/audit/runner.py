"""The black-box release auditor: runs a public release path on neighbours and compares what comes out.

:func:`audit_release` takes a callable that runs a release the way a user does and returns what the
server or the user receives (see :mod:`privfed.audit.paths`), and a list of neighbour pairs.  For
each pair it runs the release on both datasets and checks, in order:

1. **deterministic differences**: everything that is not noise (errors, warnings, shapes, bytes,
   notes and every number in them, the report's text) is split into atoms; an atom constant over
   every draw of both sides whose presence differs fails at once (a raw count in a note, a warning
   on one side only, an error on one side only).  An exception that is not a
   :class:`privfed.errors.PrivfedError` fails too (no bare exception for accepted input);
2. **fresh noise**: two runs without a seed must release different values unless the report says
   the run is a simulation, and a run replayed from its seed that repeats its values must say so;
3. **noise scale**: where the run states the noise each released array carries (the ledger's
   sigma), the spread across draws must not be significantly below it (one-sided chi-square);
4. **statistical bound**: a linear test on the released values (and on random metadata) is learnt
   on held-out draws, its threshold chosen there, and a Clopper-Pearson lower bound from fresh draws
   is compared with the report's composed claim (mu when the report is in Gaussian DP, else eps).
"""

from __future__ import annotations

import math
import re
import warnings as _warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm as _norm

from mechanisms.dp.calibration import check_real
from privfed.audit.estimators import audit_scores, noise_scale_test, upper_triangle
from privfed.audit.neighbours import Neighbours
from privfed.errors import ConfigError

__all__ = [
    "MIN_META_DRAWS",
    "ReleaseAudit",
    "audit_release",
    "deterministic_differences",
    "output_atoms",
    "run_once",
]

#: Fewest draws per side from which an atom is called deterministic (constant in every draw).  An
#: atom of probability p on both sides looks constant-present on one and constant-absent on the other
#: with probability 2 p^n (1 - p)^n <= 2 * 4^-n: 5e-10 at n = 16.
MIN_META_DRAWS = 16

#: Verdicts that fail.
FAILING = ("deterministic difference", "bare exception", "noise not fresh", "noise below the reported scale")

_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _text_atoms(kind: str, text) -> set:
    """A text as atoms: its wording with numbers masked, and each number with its position."""
    text = str(text)
    masked = _NUM.sub("#", text)
    out = {(kind, masked)}
    for i, num in enumerate(_NUM.findall(text)):
        out.add((kind + " number", masked, i, num))
    return out


@dataclass(frozen=True)
class ReleaseAudit:
    """The audit of one neighbour pair.

    ``verdict`` is ``"refused"`` (both sides refused with the same error: nothing released),
    ``"no claim"`` (the report claims no protection), one of :data:`FAILING`
    (``"deterministic difference"``, ``"bare exception"``, ``"noise not fresh"``, ``"noise below
    the reported scale"``), ``"metadata only"`` (no difference found and no statistical test asked
    for), or ``"statistical"`` (with lower bounds compared to the claim).
    """

    pair: str
    verdict: str
    reason: str
    claimed_eps: float = math.nan
    claimed_mu: float = math.nan
    eps_lb: float = 0.0
    mu_lb: float = 0.0
    draws: int = 0

    @property
    def flagged(self) -> bool:
        if self.verdict in FAILING:
            return True
        if self.verdict != "statistical":
            return False
        if math.isfinite(self.claimed_mu):
            return self.mu_lb > self.claimed_mu
        return self.eps_lb > self.claimed_eps


def run_once(run: Callable[[dict, int | None], dict], data: dict, seed: int | None) -> dict:
    """Run one release; errors and warnings are part of what the user receives."""
    from privfed.errors import PrivfedError

    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        try:
            out = dict(run(data, seed))
            out["error"] = None
        except PrivfedError as exc:
            out = {"arrays": [], "meta": (), "report": None, "error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:  # noqa: BLE001 - a bare exception is an output, and a failure
            out = {
                "arrays": [],
                "meta": (),
                "report": None,
                "error": f"BARE {type(exc).__name__}: {exc}",
                "bare": True,
            }
    out["warnings"] = tuple(
        sorted({str(w.message) for w in caught if "noise backend 'numpy'" not in str(w.message)})
    )
    return out


def output_atoms(out: dict) -> set:
    """What a user sees of one run, as atoms (every number in a text is an atom of its own)."""
    atoms = set() if out["error"] is None else _text_atoms("error", out["error"])
    atoms.add(("error", out["error"] is None))
    atoms |= {("shape", i, tuple(np.shape(a))) for i, a in enumerate(out["arrays"])}
    atoms.add(("arrays", len(out["arrays"])))
    for i, m in enumerate(out.get("meta", ())):
        items = m if isinstance(m, tuple) and not all(isinstance(x, (int, np.integer)) for x in m) else (m,)
        for x in items:
            if isinstance(x, str):
                atoms |= _text_atoms(f"meta {i}", x)
            else:
                atoms.add(("meta", i, x))
    rep = out.get("report")
    if rep is not None:
        atoms |= _text_atoms("guarantee", rep.guarantee)
        atoms |= {
            ("epsilon", rep.epsilon),
            ("delta", rep.delta),
            ("placement", getattr(rep, "placement", None)),
        }
        for n in rep.notes:
            atoms |= _text_atoms("report note", n)
    for w in out["warnings"]:
        atoms |= _text_atoms("warning", w)
    return atoms


def _flat(out: dict) -> np.ndarray:
    return (
        np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in out["arrays"]])
        if out["arrays"]
        else np.zeros(0)
    )


def deterministic_differences(atoms: list[list[set]]) -> list[str]:
    """Atoms constant on both sides (in every draw or in none) whose presence differs between them."""
    n0, n1 = len(atoms[0]), len(atoms[1])
    seen = set().union(*atoms[0], *atoms[1])
    count = [{a: sum(a in d for d in atoms[side]) for a in seen} for side in (0, 1)]
    return sorted(
        str(a)
        for a in seen
        if (count[0][a] == n0 and count[1][a] == 0) or (count[0][a] == 0 and count[1][a] == n1)
    )


def _random_atoms(atoms: list[list[set]]) -> list:
    """Atoms that vary between draws and recur (in at least 2 draws, not in all): tested statistically.

    A number that takes a new value every draw (a noisy count printed in a note) is noise; as an
    indicator it would be present in one draw only and carry no test, so it is left out.
    """
    draws = atoms[0] + atoms[1]
    seen = set().union(*draws)
    count = {a: sum(a in d for d in draws) for a in seen}
    return sorted((a for a, c in count.items() if 2 <= c < len(draws)), key=str)


def _features(outs: list[dict], length: int, random_atoms: list) -> np.ndarray:
    """One row per draw: released values (zero-padded to ``length``), their count, random-atom indicators."""
    rows = np.zeros((len(outs), length + 1 + len(random_atoms)))
    for i, o in enumerate(outs):
        v = _flat(o)[:length]
        rows[i, : v.size] = v
        rows[i, length] = _flat(o).size
        if random_atoms:
            have = output_atoms(o)
            rows[i, length + 1 :] = [a in have for a in random_atoms]
    return rows


def _noise_values(a) -> np.ndarray:
    """The coordinates of a released array that carry independent noise (one triangle of a symmetric matrix)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim >= 2 and a.shape[-1] == a.shape[-2] and np.allclose(a, np.swapaxes(a, -1, -2)):
        return upper_triangle(a).ravel()
    return a.ravel()


def _scale_failures(meta: list[list[dict]], alpha: float) -> list[str]:
    """Arrays whose spread across draws is significantly below the noise the run says they carry."""
    stated = {}
    for side in meta:
        for o in side:
            for i, s in o.get("noise", ()) or ():
                if s is not None and s > 0 and math.isfinite(s):
                    stated.setdefault(i, set()).add(float(s))
    out = []
    for i, scales in sorted(stated.items()):
        claimed = min(scales)
        samples = []
        for side in meta:
            rows = [
                _noise_values(o["arrays"][i]) for o in side if o["error"] is None and i < len(o["arrays"])
            ]
            if len(rows) >= 2 and len({r.size for r in rows}) == 1:
                samples.append(np.stack(rows))
        test = noise_scale_test(samples, claimed, alpha=alpha / max(len(stated), 1))
        if test["below"]:
            out.append(
                f"array {i}: noise std {test['std']:.4g} (upper bound {test['sigma_ub']:.4g}, "
                f"{test['dof']} dof) below the stated {claimed:.4g}"
            )
    return out


def _freshness(run, data: dict, seeded_out: dict, seed: int) -> str | None:
    """Why the release's randomness is not what its report says, or None."""
    rep = seeded_out.get("report")
    if not _private(rep) or seeded_out["error"] is not None or not seeded_out["arrays"]:
        return None
    a, b = run_once(run, data, None), run_once(run, data, None)
    if a["error"] is None and b["error"] is None and a["arrays"] and np.array_equal(_flat(a), _flat(b)):
        rep_a = a.get("report")
        if rep_a is not None and not getattr(rep_a, "simulation", False):
            return "two runs without a seed released identical values (the noise is not fresh entropy)"
    again = run_once(run, data, seed)
    if again["error"] is None and np.array_equal(_flat(again), _flat(seeded_out)):
        if not getattr(rep, "simulation", False):
            return (
                "a run replayed from its seed released identical values but its report does not say it is "
                "a simulation"
            )
    return None


def _claims(rep) -> tuple[float, float]:
    """(eps, mu) the report claims: mu where the report is in Gaussian DP (exact), else NaN."""
    claimed_eps = float(rep.epsilon)
    mu = getattr(rep, "mu_total", None)
    if mu is not None and math.isfinite(mu):
        return claimed_eps, float(mu)
    if str(getattr(rep, "accountant", "")).startswith("gdp"):
        from mechanisms.dp.calibration import gdp_mu

        return claimed_eps, float(gdp_mu(claimed_eps, rep.delta))
    return claimed_eps, math.nan


def _private(rep) -> bool:
    if rep is None:
        return False
    flag = getattr(rep, "is_private", None)
    if flag is not None:
        return bool(flag)
    return bool(getattr(rep, "formal", False)) and math.isfinite(rep.epsilon)


def audit_release(
    run: Callable[[dict, int | None], dict],
    pairs: Sequence[Neighbours],
    *,
    draws: int = 600,
    heldout: int = 300,
    meta_draws: int = MIN_META_DRAWS,
    alpha: float = 0.05,
    seed: int = 0,
    fresh: bool = True,
    scale_alpha: float = 1e-6,
) -> list[ReleaseAudit]:
    """Black-box audit of a release path on every neighbour pair (module docstring).

    Parameters
    ----------
    run : callable ``(dataset kwargs, seed) -> dict``
        Runs the release as a user does.  ``dataset kwargs`` are the keyword
        arguments of :func:`privfed.fit` that describe the data; ``seed`` (an int)
        drives the run's randomness, and ``None`` runs it as a user who gives no
        seed.  It returns a dict with ``arrays`` (every numeric array the server
        or the user receives), ``meta`` (a tuple of hashable metadata: shapes,
        bytes, notes; a tuple of strings is taken item by item), ``report``
        (the privacy report, or ``None``) and optionally ``noise`` (pairs
        ``(array index, std)``: the noise standard deviation the run's ledger
        says that array carries).  An exception it raises is an output too, and
        so are the warnings it emits.
    pairs : sequence of Neighbours
    draws, heldout : int
        Fresh draws per side for the bound, and held-out draws per side to learn
        the test direction and threshold; ``draws=0`` skips the statistical test.
    meta_draws : int
        Draws per side compared for deterministic differences and the noise
        scale; at least :data:`MIN_META_DRAWS`.
    alpha : float
        Failure probability of each lower bound.
    fresh : bool
        Check that unseeded runs draw fresh noise and seeded ones are labelled.
    scale_alpha : float
        Level of the one-sided noise-scale test (false alarm probability per pair).
    """
    # heldout is read only by the statistical test (draws > 0)
    checks = (("draws", draws, 0), ("heldout", heldout, 2 if draws else 0), ("meta_draws", meta_draws, 1))
    for name, value, least in checks:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            # one held-out draw a side has no spread: every output would read as a deterministic difference
            raise ConfigError(f"audit_release: {name} must be an int >= {least}, got {name}={value!r}")
    if not 0 < check_real(scale_alpha, "scale_alpha") < 0.5:
        raise ConfigError(f"audit_release: scale_alpha must lie in (0, 0.5), got scale_alpha={scale_alpha!r}")
    pairs = list(pairs)
    if not all(all(hasattr(p, a) for a in ("name", "d0", "d1")) for p in pairs):
        raise ConfigError(
            "audit_release: pairs must be Neighbours (privfed.audit.neighbour_battery makes them)"
        )
    meta_draws = max(int(meta_draws), MIN_META_DRAWS)
    results = []
    for p_i, pair in enumerate(pairs):
        base = seed * 1_000_003 + p_i * 100_003
        meta = [
            [run_once(run, pair.d0 if side == 0 else pair.d1, base + i) for i in range(meta_draws)]
            for side in (0, 1)
        ]
        bare = sorted({o["error"] for side in meta for o in side if o.get("bare")})
        if bare:
            results.append(ReleaseAudit(pair.name, "bare exception", "; ".join(bare)[:800]))
            continue
        atoms = [[output_atoms(o) for o in meta[side]] for side in (0, 1)]
        only = deterministic_differences(atoms)
        errs = [{o["error"] for o in meta[side]} for side in (0, 1)]
        if only:
            results.append(
                ReleaseAudit(
                    pair.name,
                    "deterministic difference",
                    f"constant over {meta_draws} draws of each side and different: {'; '.join(only)}"[:800],
                )
            )
            continue
        if None not in errs[0] and errs[0] == errs[1]:
            results.append(ReleaseAudit(pair.name, "refused", min(e for e in errs[0] if e)[:300]))
            continue
        reps = [o["report"] for side in (1, 0) for o in meta[side] if o["error"] is None]
        rep = reps[0] if reps else None
        low = _scale_failures(meta, scale_alpha) if _private(rep) else []
        if low:
            results.append(ReleaseAudit(pair.name, "noise below the reported scale", "; ".join(low)[:800]))
            continue
        stale = _freshness(run, pair.d0, meta[0][0], base) if fresh and _private(rep) else None
        if stale:
            results.append(ReleaseAudit(pair.name, "noise not fresh", stale))
            continue
        if draws == 0:
            results.append(
                ReleaseAudit(
                    pair.name,
                    "metadata only",
                    "no deterministic difference in "
                    f"{meta_draws} draws per side; no statistical test asked for",
                    # what the report states: inf where it states no protection
                    claimed_eps=_claims(rep)[0] if _private(rep) else (math.nan if rep is None else math.inf),
                )
            )
            continue
        if not _private(rep):
            results.append(ReleaseAudit(pair.name, "no claim", "" if rep is None else rep.guarantee[:300]))
            continue
        claimed_eps, claimed_mu = _claims(rep)
        random_atoms = _random_atoms(atoms)
        length = max(_flat(o).size for side in (0, 1) for o in meta[side])

        def sample(side, n, off, pair=pair, base=base, length=length, random_atoms=random_atoms):
            data = pair.d0 if side == 0 else pair.d1
            return _features([run_once(run, data, base + off + i) for i in range(n)], length, random_atoms)

        H0, H1 = sample(0, heldout, 10_000), sample(1, heldout, 10_000)
        m0, m1 = H0.mean(axis=0), H1.mean(axis=0)
        v0, v1 = H0.var(axis=0), H1.var(axis=0)
        exact = (v0 == 0) & (v1 == 0) & (m0 != m1)
        if exact.any():
            j = int(np.flatnonzero(exact)[0])
            what = (
                f"released value {j}"
                if j < length
                else (
                    "the number of released values"
                    if j == length
                    else f"metadata {random_atoms[j - length - 1]}"
                )
            )
            results.append(
                ReleaseAudit(
                    pair.name,
                    "deterministic difference",
                    f"{int(exact.sum())} output(s) constant over {heldout} draws of each side and different "
                    f"(first: {what}, {m0[j]:.6g} vs {m1[j]:.6g})",
                    claimed_eps=claimed_eps,
                    claimed_mu=claimed_mu,
                    eps_lb=math.inf,
                    mu_lb=math.inf,
                    draws=heldout,
                )
            )
            continue
        var = np.maximum((v0 + v1) / 2, 1e-300)
        diff = m1 - m0
        tstat = np.abs(diff) / np.sqrt(2 * var / heldout)
        keep = tstat > 4.0
        if not keep.any():
            keep = tstat >= np.sort(tstat)[-min(3, tstat.size)]
        w = np.where(keep, diff / var, 0.0)
        s0h, s1h = (H0 - m0) @ w, (H1 - m0) @ w
        cands = np.quantile(np.concatenate([s0h, s1h]), np.linspace(0.02, 0.98, 49))
        fpr = np.clip((s0h[None, :] > cands[:, None]).mean(axis=1), 1.0 / heldout, 1 - 1.0 / heldout)
        fnr = np.clip((s1h[None, :] <= cands[:, None]).mean(axis=1), 1.0 / heldout, 1 - 1.0 / heldout)
        if math.isfinite(claimed_mu):
            crit = _norm.ppf(1 - fpr) - _norm.ppf(fnr)
        else:
            crit = np.maximum(np.log((1 - fpr) / fnr), np.log((1 - fnr) / fpr))
        thr = float(cands[int(np.argmax(crit))])
        T0, T1 = sample(0, draws, 50_000), sample(1, draws, 50_000)
        res = audit_scores(
            (T0 - m0) @ w,
            (T1 - m0) @ w,
            delta=float(rep.delta),
            thresholds=[thr],
            alpha=alpha,
            claimed_mu=claimed_mu if math.isfinite(claimed_mu) else None,
            claimed_eps=None if math.isfinite(claimed_mu) else claimed_eps,
        )
        results.append(
            ReleaseAudit(
                pair.name,
                "statistical",
                f"threshold {thr:.4g} chosen on {heldout} held-out draws per side"
                + (
                    f"; {len(random_atoms)} random metadata atom(s) tested with the values"
                    if random_atoms
                    else ""
                ),
                claimed_eps=claimed_eps,
                claimed_mu=claimed_mu,
                eps_lb=res.eps_lb,
                mu_lb=res.mu_lb,
                draws=draws,
            )
        )
    return results
