"""The trade-off command's ``--rounds R`` mode: multi-round FedLog beside one-shot frozen FedLog.

``python -m privfed.tradeoff --method fedlog --rounds R`` (R > 1) runs :func:`privfed.rounds.run_rounds`
for every (epsilon, seed) of the sweep and one-shot FedLog on the same frozen features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from mechanisms.dp.ledger import format_up
from privfed.errors import ConfigError
from privfed.rounds import RoundsConfig, run_rounds

__all__ = ["CHECKPOINT_S", "attack_summary", "tradeoff_main", "tradeoff_rounds"]


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
    and one-shot frozen FedLog for every (epsilon, seed) of a :class:`privfed.tradeoff.TradeoffConfig`.

    ``records`` (a list) receives the rows as each (epsilon, seed) finishes, and ``on_record(rows)`` is
    called then, so an interrupted sweep keeps what finished."""
    if cfg.dataset != "digits":
        raise ConfigError(
            f"multi-round FedLog (--rounds > 1) trains bodies on images: it runs on the digits "
            f"default only, got --dataset {cfg.dataset!r}"
        )
    if cfg.count_noise is not None:
        raise ConfigError(
            "--count-noise does not apply to multi-round FedLog (the counts ride in the statistic)"
        )
    placement = (
        "distributed" if cfg.secure_agg != "none" else ("central" if cfg.trusted_aggregator else "local")
    )
    base = dict(
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
        clip=cfg.clip if cfg.clip is not None else 2.0,
        clip_norm=cfg.clip_norm if cfg.clip is not None else "coordinate",
        max_records=cfg.max_records,
        secure_agg=cfg.secure_agg if cfg.secure_agg in ("mask", "ckks") else "none",
        attack_pairs=TRADEOFF_ATTACK_PAIRS,
    )
    if local_epochs is not None:
        base["local_epochs"] = local_epochs
    if families:
        base["families"] = tuple(families)
    if init is not None:
        base["init"] = init
    RoundsConfig(**dict(base, epsilon=min(cfg.epsilons))).validate()  # refuse bad settings before any work
    rows = [] if records is None else records
    for eps in cfg.epsilons:
        for seed in cfg.seeds:
            # the sweep draws every noise from its seeds (a seeded simulation, as its one-shot rows)
            r = run_rounds(RoundsConfig(**base), seed=seed, noise_seed=seed, epsilon=eps, progress=progress)
            att = attack_summary(r.attacks)
            for name, acc, rep, up in (
                (
                    f"fedlog x{cfg.rounds} rounds",
                    (r.personalised_accuracy, r.common_accuracy),
                    r.privacy,
                    r.bytes["upload_total"],
                ),
                (
                    "fedlog one-shot (frozen)",
                    (r.baselines["oneshot"]["personalised"], r.baselines["oneshot"]["common"]),
                    r.baselines["oneshot"]["privacy"],
                    r.baselines["oneshot"]["upload_bytes_total"],
                ),
            ):
                rows.append(
                    {
                        "method": name,
                        "epsilon": eps,
                        "seed": seed,
                        "rounds": cfg.rounds if "rounds" in name else 1,
                        "accuracy": acc[0],
                        "common_accuracy": acc[1],
                        "epsilon_composed": rep.epsilon if rep else math.inf,
                        "epsilon_per_round": rep.per_round_epsilon if rep else math.inf,
                        "delta": cfg.delta,
                        "sigma": rep.sigma if rep else 0.0,
                        "sensitivity": rep.sensitivity if rep else 0.0,
                        "upload_bytes": up,
                        "formal": bool(rep.formal) if rep else False,
                        "simulation": bool(rep.simulation) if rep else False,
                        "guarantee": rep.guarantee if rep else "NO DP GUARANTEE: no noise",
                        "describe": rep.describe() if rep else "",
                        **(att if "rounds" in name else {k: math.nan for k in att}),
                    }
                )
            if on_record is not None:
                on_record(rows)
    return rows


#: Seconds between checkpoints of the finished (epsilon, seed) pairs to results.partial.* during a sweep.
CHECKPOINT_S = 30.0

#: Member / holdout pairs the trade-off command attacks in every multi-round run.
TRADEOFF_ATTACK_PAIRS = 200


def attack_summary(attacks: dict | None) -> dict:
    """The headline numbers of :mod:`attacks.rounds` for a table: the strongest sequence attack and one round.

    With noise: the differencing attack replayed with fresh noise (independent trials); without: the
    tracing likelihood ratio over the rounds' changes.  ``attack_auc_bound`` is Phi(mu_total / sqrt 2)
    (NaN without DP).
    """
    keys = (
        "attack",
        "attack_auc_sequence",
        "attack_auc_first_round",
        "attack_tpr_1pct_sequence",
        "attack_auc_bound",
        "attack_pairs",
    )
    if not attacks:
        return {k: math.nan for k in keys}
    if attacks.get("differencing_replay"):
        name, res = "differencing (replay)", attacks["differencing_replay"]
        seq = res["sequence"]
    else:
        name, res = "tracing", attacks["tracing"]
        seq = res.get("increments", res["sequence"])
    return {
        "attack": name,
        "attack_auc_sequence": seq["auc"],
        "attack_auc_first_round": res["first_round"]["auc"],
        "attack_tpr_1pct_sequence": seq["tpr_at_1pct_fpr"],
        "attack_auc_bound": attacks.get("auc_bound", math.nan) if attacks.get("bound_formal") else math.nan,
        "attack_pairs": attacks["pairs"],
    }


def _summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    out = []
    for (method, eps), rs in groups.items():
        acc = np.array([r["accuracy"] for r in rs])
        out.append(
            {
                "method": method,
                "epsilon": eps,
                "epsilon_composed": rs[0]["epsilon_composed"],
                "epsilon_per_round": rs[0]["epsilon_per_round"],
                "accuracy_mean": float(acc.mean()),
                "accuracy_sd": float(acc.std()),
                "common_mean": float(np.mean([r["common_accuracy"] for r in rs])),
                "seeds": len(rs),
                "upload_bytes": rs[0]["upload_bytes"],
                "guarantee": rs[0]["guarantee"],
                "simulation": bool(rs[0].get("simulation", False)),
                "attack_auc": float(np.mean([r.get("attack_auc_sequence", math.nan) for r in rs])),
                "attack_auc_bound": rs[0].get("attack_auc_bound", math.nan),
                "describe": rs[0]["describe"],
            }
        )
    return out


def _plot_tradeoff(summary: list[dict], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, method in enumerate(sorted({s["method"] for s in summary})):
        pts = sorted(
            (s["epsilon_composed"], s["accuracy_mean"], s["accuracy_sd"])
            for s in summary
            if s["method"] == method and math.isfinite(s["epsilon_composed"])
        )
        inf = [
            s["accuracy_mean"] for s in summary if s["method"] == method and not math.isfinite(s["epsilon"])
        ]
        if pts:
            x, y, e = (np.array(v) for v in zip(*pts))
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, color=f"C{i}", label=method)
        for v in inf:
            ax.axhline(v, color=f"C{i}", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon composed over every release of the run (dotted: no noise)")
    ax.set_ylabel("personalised accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def rounds_settings(local_epochs: int | None, families: Sequence[str] | None, init: str | None) -> dict:
    """The multi-round settings a run used (defaults filled in), as results.json's config records them."""
    d = RoundsConfig()
    return {
        "local_epochs": d.local_epochs if local_epochs is None else int(local_epochs),
        "families": list(d.families if not families else families),
        "init": d.init if init is None else init,
    }


def tradeoff_main(cfg, args, argv=()) -> int:
    """``python -m privfed.tradeoff --method fedlog --rounds R`` with R > 1: write, plot and print.

    Written through :class:`privfed.commands.common.OutputDir` like every command: SIGTERM / Ctrl-C keep the (epsilon,
    seed) pairs that finished in ``results.partial.*``, checkpointed every ``CHECKPOINT_S`` seconds.
    """
    from privfed.commands.common import OutputDir, as_int, keep_finished, periodic_checkpoint, versions

    families = (
        None
        if getattr(args, "families", None) is None
        else [f.strip() for f in args.families.split(",") if f.strip()]
    )
    epochs = getattr(args, "local_epochs", None)
    epochs = None if epochs is None else as_int(epochs, "--local-epochs", minimum=1)
    init = getattr(args, "init", None)
    command = " ".join(["python -m privfed.tradeoff", *argv])
    # every setting that changes a result, so that --config results.json re-runs this run
    config = {**asdict(cfg), **rounds_settings(epochs, families, init)}
    out = OutputDir(
        args.out,
        "tradeoff",
        overwrite=args.overwrite,
        name_parts=("fedlog", f"rounds{cfg.rounds}"),
        command=command,
    )
    done: list[dict] = []
    partial = ("results.partial.csv", "results.partial.json")

    def write_partial(rows: list[dict]) -> None:
        keys = [k for k in rows[0] if k != "describe"]
        out.write_csv(partial[0], rows, keys)
        out.write_json(
            partial[1],
            {
                "config": config,
                "versions": versions(),
                "records": rows,
                "complete": False,
                "command": command,
            },
        )
        out.checkpoint()

    try:
        rows = tradeoff_rounds(
            cfg,
            local_epochs=epochs,
            families=families,
            init=init,
            progress=not args.quiet,
            records=done,
            on_record=periodic_checkpoint(write_partial, CHECKPOINT_S),
        )
        summary = _summarise(rows)
        keys = [k for k in rows[0] if k != "describe"]
        out.write_csv("results.csv", rows, keys)
        out.write_json(
            "results.json",
            {
                "config": config,
                "versions": versions(),
                "records": rows,
                "summary": summary,
                "command": command,
            },
        )
        if cfg.plot:
            fig = _plot_tradeoff(
                summary,
                f"digits: {cfg.clients} clients, {cfg.partition}, FedLog with local "
                f"bodies over {cfg.rounds} rounds vs one-shot frozen, {cfg.level} level",
            )
            out.save_figure("tradeoff.png", fig, dpi=130)
            import matplotlib.pyplot as plt

            plt.close(fig)
        out.finish(command, complete=True, drop=partial)
    except BaseException:
        keep_finished(out, done, write_partial, command, "python -m privfed.tradeoff")
        raise
    head = (
        f"{'method':<28} {'eps':>7} {'composed':>9} {'per round':>9} {'accuracy':>15} {'upload':>10} "
        f"{'attack AUC':>10} {'AUC bound':>9}"
    )
    print(head)
    for s in summary:
        print(
            f"{s['method']:<28} {s['epsilon']:>7.3g} {format_up(s['epsilon_composed']):>9} "
            f"{format_up(s['epsilon_per_round']):>9} "
            f"{s['accuracy_mean']:>8.4f} ± {s['accuracy_sd']:.3f} {s['upload_bytes'] / 1e3:>8.1f}kB "
            f"{s['attack_auc']:>10.3f} {s['attack_auc_bound']:>9.3f}"
        )
    if any(s.get("simulation") for s in summary):
        print(
            "seeded simulation: every run's noise was drawn from its --seeds value (replayable), not a release; "
            "epsilons are printed rounded up"
        )
    print(
        f"attack AUC: membership attack on all {cfg.rounds} releases of the multi-round run "
        f"({TRADEOFF_ATTACK_PAIRS} member / holdout pairs; attacks.rounds); AUC bound: Phi(mu_total / sqrt 2) of "
        "the composed guarantee (nan: no formal bound)"
    )
    for s in summary:
        if s["describe"]:
            print(f"{s['method']} at eps {s['epsilon']:g}:\n{s['describe']}")
    print(f"wrote {out.published}/: {', '.join(out.files())}")
    return 0
