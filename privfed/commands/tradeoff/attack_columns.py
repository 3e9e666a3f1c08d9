"""The attack columns of a sweep: which attacks run on each release, and the metric each one reports."""

from __future__ import annotations

from typing import Any

import numpy as np

from privfed.commands.tradeoff.config import TradeoffConfig
from privfed.commands.tradeoff.plan import seed_for
from privfed.errors import ConfigError

__all__ = ["ATTACK_HEADLINE", "STRONGEST_ATTACKS", "attack_context", "run_attacks"]

#: The metric of each attack drawn in the plot's attack panel (the CSV has them all).
ATTACK_HEADLINE = {
    "tracing": "auc",
    "singleton": "exposed_fraction",
    "inversion": "delta_psnr",
    "labels": "presence_auc",
    "subspace": "auc",
    "unmixing": "matched_cosine",
    "differencing": "exact_fraction",
}


#: Attacks whose column reports the strongest attack of the suite, named.
STRONGEST_ATTACKS = ("tracing",)


def attack_context(cfg: TradeoffConfig, ds) -> dict[str, Any]:
    """What the attacks need: the backbone, the public split (attacker's knowledge) and the private images."""
    import attacks

    for name in cfg.attacks:
        attacks.get_class(name)  # ConfigError listing the available ones
    if ds.name != "digits":
        raise ConfigError(
            "--attack needs the digits default (its backbone and public split are the attacker's "
            f"knowledge); dataset {ds.name!r} has none"
        )
    from attacks.view import PublicData
    from privfed.data.digits import digits_splits, extract_features, get_backbone

    splits = digits_splits(0)
    backbone = get_backbone(seed=0)
    public = PublicData(
        labels=splits.public_labels,
        features=extract_features(backbone, splits.public_images),
        images=splits.public_images,
    )
    return {"backbone": backbone, "public": public, "images": splits.private_images, "skipped": set()}


def run_attacks(cfg, ds, ctx, rec, mname, clients, seed, eps, privacy, secure) -> None:
    """Add ``attack_<name>_<metric>`` columns to ``rec`` (NaN where the attack cannot see what it needs).

    Tracing reports the strongest test of its suite (:data:`attacks.strongest.SUITES`) on one challenge:
    its metrics under the usual keys, its name in ``attack_tracing_strongest`` and every test of the suite
    as ``attack_tracing_<test>:<metric>``.
    """
    import attacks
    from privfed.errors import InputError

    for name in cfg.attacks:
        try:
            metrics = attacks.evaluate_federation(
                name,
                mname,
                ds.train_features,
                ds.train_labels,
                clients,
                rng=seed_for(seed, mname, eps, name),
                images=ctx["images"],
                holdout_features=ds.test_features,
                holdout_labels=ds.test_labels,
                privacy=privacy,
                secure_agg=secure,
                backbone=ctx["backbone"],
                public=ctx["public"],
                num_classes=ds.num_classes,
                strongest=name in STRONGEST_ATTACKS,
                **cfg.method_params.get(mname, {}),
            )
        except InputError as exc:
            ctx["skipped"].add(f"attack {name!r} skipped for method {mname!r}: {exc}")
            metrics = {ATTACK_HEADLINE.get(name, "value"): float("nan")}
        for key, value in metrics.items():
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                rec[f"attack_{name}_{key}"] = float(value)
        if name in STRONGEST_ATTACKS:
            rec[f"attack_{name}_strongest"] = str(metrics.get("strongest_attack", "-"))
