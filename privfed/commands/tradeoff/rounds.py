"""The trade-off command's ``--rounds R`` mode: multi-round FedLog beside one-shot frozen FedLog.

``python -m privfed.tradeoff --method fedlog --rounds R`` (R > 1) runs :func:`privfed.rounds.run_rounds`
for every (epsilon, seed) of the sweep, which also gives one-shot FedLog on the same frozen features.
Its rows have the one-shot sweep's columns (:mod:`privfed.commands.tradeoff.table`), so the table, the
record and the plot are the one-shot run's: ``accuracy`` is the common-test accuracy (every client's
body with the global head, on the held-out test set), the non-private accuracy sits beside it (the same
run without noise), ``upload_bytes`` is what one client sends over all its rounds; the personalised
accuracy and the attack on the sequence of releases are extra columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from privfed.commands.common import placement_word
from privfed.errors import ConfigError

__all__ = ["TRADEOFF_ATTACK_PAIRS", "attack_summary", "clip_of", "rounds_settings", "tradeoff_rounds"]

#: Member / holdout pairs the trade-off command attacks in every multi-round run.
TRADEOFF_ATTACK_PAIRS = 200

#: privfed.rounds' noise placement -> the trade-off's --placement key
_PLACEMENT = {"local": "local", "distributed": "secure-sum", "central": "trusted"}


def _base(cfg, key: str | None) -> dict[str, Any]:
    """privfed.rounds' settings for the placement ``key`` (None: the one --secure-agg / --trusted-aggregator pick)."""
    if cfg.dataset != "digits":
        raise ConfigError(
            f"multi-round FedLog (--rounds > 1) trains bodies on images: it runs on the digits "
            f"default only, got --dataset {cfg.dataset!r}"
        )
    if cfg.count_noise is not None:
        raise ConfigError(
            "--count-noise does not apply to multi-round FedLog (the counts ride in the statistic)"
        )
    secure = key == "secure-sum" or (key is None and cfg.secure_agg != "none")
    placement = (
        "distributed" if secure else ("central" if key == "trusted" or cfg.trusted_aggregator else "local")
    )
    return dict(
        clients=cfg.clients,
        rounds=cfg.rounds,
        partition=cfg.partition,
        alpha=cfg.alpha,
        baselines=("oneshot",),
        delta=cfg.delta,
        level=cfg.level,
        placement=placement,
        calibration="paper" if cfg.calibration == "classic" else "total",
        record_bound="theorem" if cfg.calibration == "classic" else "auto",
        **clip_of(cfg),
        max_records=cfg.max_records,
        secure_agg=(cfg.secure_agg if cfg.secure_agg in ("mask", "ckks") else "mask") if secure else "none",
        attack_pairs=TRADEOFF_ATTACK_PAIRS,
    )


def clip_of(cfg) -> dict[str, Any]:
    """The clip bound and norm multi-round FedLog runs with: ``--clip`` and ``--clip-norm``, or privfed.rounds'
    default of 2 per coordinate (what the run record states, since it is what ran)."""
    if cfg.clip is None:
        return {"clip": 2.0, "clip_norm": "coordinate"}
    return {"clip": float(cfg.clip), "clip_norm": cfg.clip_norm}


def _row(
    cfg, base: dict, name_rounds: int, eps: float, seed: int, acc: dict, rep, upload_total: float
) -> dict:
    """One row in the one-shot sweep's columns."""
    # what ran, read from the run's report (never copied from the request)
    private = rep is not None and bool(rep.is_private)
    sigma = float(getattr(rep, "sigma", math.nan)) if rep is not None else 0.0
    place = placement_word(
        getattr(rep, "placement", None),
        {"local": "local", "distributed": "secure sum", "central": "trusted aggregator"}[base["placement"]],
    )
    row: dict[str, Any] = {
        "method": "fedlog",
        "rounds": name_rounds,
        "placement": place if math.isfinite(eps) else "none",
        "protocol": base["secure_agg"],
        "mechanism": "gaussian" if rep is not None else "none",
        "level": rep.level if rep is not None else "none",
        "epsilon": eps,
        "epsilon_reported": float(rep.epsilon) if private else math.inf,
        "delta": cfg.delta if math.isfinite(eps) else 0.0,
        "calibration": ("classic" if cfg.calibration == "classic" else "analytic")
        if math.isfinite(eps)
        else "-",
        "private": bool(private),
        "protects": "all released statistics",
        "seed": seed,
        "accuracy": float(acc["common"]),
        "personalised_accuracy": float(acc["personalised"]),
        "sigma": sigma,
        "sigma_counts": sigma,
        "noise": f"sigma {sigma:.4g} on the statistic" if rep is not None else "none",
        "clip": base["clip"] if math.isfinite(eps) else None,
        "count_noise": None,
        "secure_agg": base["secure_agg"],
        "upload_bytes": float(upload_total) / max(int(cfg.clients), 1),
        "guarantee": rep.guarantee if rep is not None else "no protection (eps=inf)",
        "pairs_dropped": math.nan,
        "repairs": "",
        "repair_kinds": "",
        "notes": "",
    }
    if rep is not None:  # the composition in full: per-round epsilon, whether the noise was seeded
        row["epsilon_per_round"] = float(getattr(rep, "per_round_epsilon", math.nan))
        row["simulation"] = bool(getattr(rep, "simulation", False))
        if hasattr(rep, "describe"):
            row["describe"] = rep.describe()
    return row


def tradeoff_rounds(
    cfg,
    *,
    local_epochs: int | None = None,
    families: Sequence[str] | None = None,
    init: str | None = None,
    progress: bool = True,
    records: list | None = None,
    on_record=None,
) -> list[dict]:
    """Rows of ``python -m privfed.tradeoff --method fedlog --rounds R`` (R > 1): multi-round FedLog
    and one-shot frozen FedLog for every (epsilon, seed) of a :class:`privfed.tradeoff.TradeoffConfig`,
    in the one-shot sweep's columns.

    The non-private accuracy of a seed is its run without noise (eps = inf): run once per seed, first
    (and kept as rows when ``inf`` is one of the budgets).  ``records`` (a list) receives the rows as each
    (epsilon, seed) finishes, and ``on_record(rows)`` is called then, so an interrupted sweep keeps what
    finished."""
    import privfed.rounds as _rounds

    bases = [_base(cfg, key) for key in (cfg.placements or (None,))]
    for base in bases:
        if local_epochs is not None:
            base["local_epochs"] = local_epochs
        if families:
            base["families"] = tuple(families)
        if init is not None:
            base["init"] = init
        _rounds.RoundsConfig(**dict(base, epsilon=min(cfg.epsilons))).validate()  # refuse bad settings first
    rows = [] if records is None else records
    finite = [e for e in cfg.epsilons if math.isfinite(e)]
    keep_clean = any(not math.isfinite(e) for e in cfg.epsilons)

    def run(base: dict, eps: float, seed: int) -> list[dict]:
        # the sweep draws every noise from its seeds (a seeded simulation, as its one-shot rows)
        r = _rounds.run_rounds(
            _rounds.RoundsConfig(**base), seed=seed, noise_seed=seed, epsilon=eps, progress=progress
        )
        one = r.baselines["oneshot"]
        pair = [
            _row(
                cfg,
                base,
                cfg.rounds,
                eps,
                seed,
                {"common": r.common_accuracy, "personalised": r.personalised_accuracy},
                r.privacy,
                r.bytes.get("secure_upload_total", r.bytes["upload_total"]),  # what the protocol sent
            ),
            _row(cfg, base, 1, eps, seed, one, one["privacy"], one["upload_bytes_total"]),
        ]
        pair[0].update(attack_summary(r.attacks))
        return pair

    for seed in cfg.seeds:
        clean_rows = run(bases[0], math.inf, seed)  # the non-private accuracy beside every row of this seed
        clean = {row["rounds"]: row["accuracy"] for row in clean_rows}
        batches = ([clean_rows] if keep_clean else []) + [(base, eps) for base in bases for eps in finite]
        for item in batches:
            pair = item if isinstance(item, list) else run(item[0], item[1], seed)
            for row in pair:
                row["nonprivate_accuracy"] = clean[row["rounds"]]
            rows.extend(pair)
            if on_record is not None:
                on_record(rows)
    return rows


def attack_summary(attacks: dict | None) -> dict:
    """The headline numbers of :mod:`attacks.rounds` for a row: the strongest sequence attack and one round.

    With noise: the differencing attack replayed with fresh noise (independent trials); without: the
    tracing likelihood ratio over the rounds' changes.  ``attack_auc_bound`` is Phi(mu_total / sqrt 2)
    (NaN without DP).
    """
    keys = (
        "attack_sequence_auc",
        "attack_first_round_auc",
        "attack_tpr_1pct_sequence",
        "attack_auc_bound",
        "attack_pairs",
    )
    if not attacks:
        return {k: math.nan for k in keys} | {"attack": "-"}
    if attacks.get("differencing_replay"):
        name, res = "differencing (replay)", attacks["differencing_replay"]
        seq = res["sequence"]
    else:
        name, res = "tracing", attacks["tracing"]
        seq = res.get("increments", res["sequence"])
    return {
        "attack": name,
        "attack_sequence_auc": seq["auc"],
        "attack_first_round_auc": res["first_round"]["auc"],
        "attack_tpr_1pct_sequence": seq["tpr_at_1pct_fpr"],
        "attack_auc_bound": attacks.get("auc_bound", math.nan) if attacks.get("bound_formal") else math.nan,
        "attack_pairs": attacks["pairs"],
    }


def rounds_settings(local_epochs: int | None, families: Sequence[str] | None, init: str | None) -> dict:
    """The multi-round settings a run used (defaults filled in), as results.json's config records them."""
    from privfed.rounds import RoundsConfig

    d = RoundsConfig()
    return {
        "local_epochs": d.local_epochs if local_epochs is None else int(local_epochs),
        "families": list(d.families if not families else families),
        "init": d.init if init is None else init,
    }
