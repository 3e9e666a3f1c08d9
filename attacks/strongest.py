"""The strongest attack in the suite for one view: every attack on the same challenge, the maximum named.

A protection claim holds only against the strongest attacker with the
stated knowledge, so tables report, next to each individual attack, the
best one for that view and its name (:func:`strongest`).  Every attack of a
suite is run on the *same* challenge (the same released cells to invert,
the same members and non-members to trace); an attack the view cannot
serve (e.g. the two-stage inversion without second moments) is listed as
not applicable.

The maximum over a suite is chosen on the scored targets, so it is biased
upwards by the selection (the maximum of a few noisy estimates): it errs on
the attacker's side, which is the safe side for a privacy claim.

The inversion suite's ``joint`` members (:mod:`attacks.inversion.joint`) differ in how
far the joint latent optimisation may move from the bank images: ``joint``
(learning rate 0.02) stays near them, ``joint-fit`` (0.1) fits the released
mean more tightly; which one wins depends on n (measured: ``joint-fit`` at
n = 2, ``joint`` at n = 4).  ``joint-wide`` searches wider (96 starts, 8
candidates per cell) and optimises every candidate at both learning rates,
keeping per cell the one with the lowest feature residual: a larger search
alone does not help (at n = 8, 256 starts and 16 candidates identified fewer
records than 24 and 4: a lower residual is not a closer image).

For inversion the report also scores ``per-cell``: per released cell, the
reconstructions of the suite member whose mean feature best matches the
release (what a server running every attack would keep; chosen without the
truth), and the strongest is the maximum over the members and it.

Headline metrics: inversion, identification (ties broken by delta-PSNR),
with the best delta-PSNR attack named too; tracing, AUC, with the best
TPR at 1% FPR named too.  The tracing suite plays the paired membership
game of :func:`attacks.view.membership_targets` (each holdout non-member
tested on its member counterpart's rows) and includes the classifier trained
on public simulations (``learned``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attacks.knowledge import check_truth
from mechanisms.dp.calibration import check_count
from privfed._validation.seeds import as_generator
from privfed.errors import ConfigError, InputError

__all__ = ["HEADLINE", "PER_CELL", "SUITES", "per_cell_best", "strongest", "strongest_flat"]

#: name -> (attack, parameters), in the order the tables list them.
SUITES: dict[str, dict[str, tuple[str, dict]]] = {
    "inversion": {
        "pixel": ("inversion", {"backend": "pixel"}),
        "learned": ("inversion", {"backend": "learned"}),
        "set": ("inversion", {"backend": "set"}),
        "joint": ("inversion", {"backend": "joint"}),
        "joint-fit": ("inversion", {"backend": "joint", "joint_lr": 0.1}),
        "two-stage": ("inversion", {"backend": "learned", "source": "second"}),
        # last, so that the members above keep their random streams
        "joint-wide": (
            "inversion",
            {"backend": "joint", "joint_restarts": 96, "joint_candidates": 8, "joint_lrs": (0.02, 0.1)},
        ),
    },
    "tracing": {
        "inner": ("tracing", {"test": "inner"}),
        "lrt": ("tracing", {"test": "lrt"}),
        "lrt-aggregate": ("tracing", {"test": "lrt", "reference": "aggregate"}),
        "lrt+support": ("tracing", {"test": "lrt+support"}),
        "lrt+support-aggregate": ("tracing", {"test": "lrt+support", "reference": "aggregate"}),
        "learned": ("tracing", {"test": "learned"}),
    },
}

#: kind -> (the metric that names the strongest attack, the second metric whose best is named too).
HEADLINE = {"inversion": ("identification", "delta_psnr"), "tracing": ("auc", "tpr@0.01")}
_HEADLINE = HEADLINE


def _challenge(kind: str, view, truth, rng: np.random.Generator, common: dict) -> dict:
    if kind == "inversion":
        from attacks.inversion.attack import challenge_cells

        if view.stats.owners is not None:
            return {}
        return {
            "cells": challenge_cells(view, truth, rng, check_count(common.get("max_cells", 40), "max_cells"))
        }
    from attacks.view import membership_targets

    t, lab, ids, partners = membership_targets(view, truth, common.get("max_targets", 400), rng, "tracing")
    return {"targets": t, "target_labels": lab, "target_ids": ids, "partners": partners}


def strongest(
    kind: str,
    view,
    truth,
    rng: np.random.Generator | int = 0,
    *,
    suite: dict | None = None,
    challenge: dict | None = None,
    progress: Callable[[str, bool], None] | None = None,
    **common: Any,
) -> dict:
    """Run every attack of ``SUITES[kind]`` (or ``suite``) on one challenge; name the strongest.

    Parameters
    ----------
    kind : {"inversion", "tracing"}
    view, truth : ServerView, GroundTruth
    rng : Generator or int
        Draws the challenge and (independent streams) each attack's randomness.
    suite : mapping name -> (attack, params), optional
        Replaces the default suite.
    challenge : dict, optional
        The challenge to attack (``cells`` for inversion; ``targets``,
        ``target_labels``, ``target_ids``, ``partners`` for tracing), e.g. the
        one an individual attack was scored on, so the report sits next to it
        on the same targets; drawn from ``rng`` otherwise.
    progress : callable, optional
        ``progress(name, finished)`` before (``False``) and after (``True``)
        each attack of the suite, for progress bars.
    **common
        Parameters passed to every attack of the suite that accepts them
        (e.g. ``max_cells``, ``train_steps``); a suite member's own
        parameters (its backend, its test) take precedence.

    Returns
    -------
    dict
        ``strongest`` (name), ``headline`` (metric), ``value``,
        ``strongest_by`` (the second headline metric's best name),
        ``attacks`` (name -> metrics, or ``{"not_applicable": reason}``),
        ``knowledge`` (name -> what that attacker used).
    """
    import attacks

    if kind not in _HEADLINE:
        raise ConfigError(f"no attack suite for {kind!r}; choose from {sorted(_HEADLINE)}")
    rng = as_generator(rng, "rng")  # the check evaluate makes: 1.5, '7' and -1 are one line each
    check_truth(truth, view)
    suite = dict(SUITES[kind] if suite is None else suite)
    if not suite:
        raise ConfigError("the attack suite is empty")
    for name, entry in suite.items():  # each member is (attack name, its parameters)
        if not (
            isinstance(entry, (tuple, list))
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], dict)
        ):
            raise ConfigError(f"suite member {name!r} must be (attack name, {{parameters}}), got {entry!r}")
    if challenge is not None and not isinstance(challenge, dict):
        raise ConfigError(
            f"challenge must be a dict of the attacks' run arguments, got {type(challenge).__name__}"
        )
    if progress is not None and not callable(progress):
        raise ConfigError(f"progress must be a callable progress(name, done), got {type(progress).__name__}")
    accepted = set().union(*(attacks.get_class(a).defaults for a, _ in suite.values()))
    unknown = set(common) - accepted
    if unknown:  # a misspelt parameter was silently ignored by every attack
        raise ConfigError(
            f"the {kind} suite got unknown parameter(s) {sorted(unknown)}; its attacks accept: "
            + ", ".join(sorted(accepted))
        )
    r_chal, *r_att = rng.spawn(1 + len(suite))
    if challenge is None:
        challenge = _challenge(kind, view, truth, r_chal, common)
    results, knowledge, raw = {}, {}, {}
    for (name, (attack, params)), r in zip(suite.items(), r_att):
        # common parameters (sizes, budgets) go to every attack that takes them; the suite's own win
        att = attacks.get(
            attack,
            **{**{k: v for k, v in common.items() if k in attacks.get_class(attack).defaults}, **params},
        )
        knowledge[name] = getattr(att, "knowledge", repr(att))
        if progress is not None:
            progress(name, False)
        try:
            att.check(view)
            ch = challenge if params.get("source", "mean") == "mean" else {}
            res = att.run(view, r, **ch)
            results[name] = att.score(res, truth)
            if kind == "inversion" and params.get("source", "mean") == "mean":
                raw[name] = (att, res)
        except InputError as exc:
            results[name] = {"not_applicable": str(exc)}
        if progress is not None:
            progress(name, True)
    if len(raw) > 1:
        scorer = next(iter(raw.values()))[0]
        results[PER_CELL] = scorer.score(per_cell_best([res for _, res in raw.values()]), truth)
        knowledge[PER_CELL] = (
            "per released cell, the reconstructions of the suite member ("
            + ", ".join(raw)
            + ") whose mean feature best matches the release (cosine): measurable by the "
            "server, no private record read"
        )
    ok = {k: v for k, v in results.items() if "not_applicable" not in v}
    first, second = _HEADLINE[kind]
    lacking = sorted(k for k, v in ok.items() if first not in v)
    if lacking:  # a labels attack in a tracing suite: nothing to rank it by
        raise ConfigError(
            f"suite member(s) {lacking} report no {first!r}, the {kind} suite's headline metric"
        )
    if not ok:
        raise InputError(
            f"no attack of the {kind} suite applies to this view: "
            + "; ".join(f"{k}: {v['not_applicable']}" for k, v in results.items())
        )
    best = max(ok, key=lambda k: (ok[k][first], ok[k].get(second, -np.inf)))
    best2 = max(ok, key=lambda k: ok[k].get(second, -np.inf))
    return {
        "kind": kind,
        "strongest": best,
        "headline": first,
        "value": ok[best][first],
        "strongest_by": {first: best, second: best2},
        "attacks": results,
        "knowledge": knowledge,
    }


#: Name of the derived inversion attacker that picks, per released cell, the suite member that fits best.
PER_CELL = "per-cell"


def per_cell_best(results: list):
    """Per released cell, the reconstructions of the result whose mean feature best matches the cell's target.

    ``results``: :class:`attacks.inversion.attack.InversionResult` of attacks on the
    same cells (source ``mean``).  The criterion, 1 - cos(mean of the
    reconstructions' features, released mean), is what the server can
    measure: no private record is read.  Returns one InversionResult.
    """
    import dataclasses

    chosen = []
    first = results[0]
    keys = [np.asarray(r.rows, np.int64) * 1_000_003 + np.asarray(r.classes, np.int64) for r in results]
    for key in np.unique(keys[0]):
        best, best_res = None, np.inf
        for j, r in enumerate(results):
            idx = np.flatnonzero(keys[j] == key)
            if idx.size == 0:
                continue
            f = r.recon_features[idx].mean(0)
            t = r.targets[idx[0]]
            res = 1.0 - float(f @ t) / max(float(np.linalg.norm(f) * np.linalg.norm(t)), 1e-24)
            if res < best_res:
                best, best_res = (j, idx), res
        chosen.append(best)
    fields = {}
    for f in dataclasses.fields(first):
        v = getattr(first, f.name)
        if isinstance(v, np.ndarray):
            fields[f.name] = np.concatenate([getattr(results[j], f.name)[idx] for j, idx in chosen])
    return dataclasses.replace(first, **fields, attacker="per released cell, the best-fitting suite member")


def strongest_flat(kind: str, view, truth, rng: np.random.Generator | int = 0, **kw: Any) -> dict:
    """:func:`strongest` as one flat row for tables.

    ``strongest_attack`` (name), every metric of the strongest attack
    (unprefixed, so a table column reads the same as for one attack), and
    ``<name>:<metric>`` for the headline metrics of every attack in the suite.
    """
    rep = strongest(kind, view, truth, rng, **kw)
    first, second = _HEADLINE[kind]
    row = {"strongest_attack": rep["strongest"], f"strongest_by_{second}": rep["strongest_by"][second]}
    row.update({k: v for k, v in rep["attacks"][rep["strongest"]].items() if not isinstance(v, (dict, list))})
    for name, m in rep["attacks"].items():
        for metric in (first, second):
            row[f"{name}:{metric}"] = m.get(metric, float("nan"))
    return row
