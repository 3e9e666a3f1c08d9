"""Multi-round FedLog with local bodies (Yu et al., Algorithm 1), on the digits default.

The one-shot ``fedlog`` method fits the MAP head of Eq. 15 once, on frozen
features.  The paper's algorithm is multi-round:

1. the server initialises the head eta (C, m) at random, m = d + 1 (the
   augmented feature phi = [1, f] with the constant first);
2. every round each client trains its own *body* f_k (any architecture, never
   uploaded; its optimiser state stays on the client too) for E local epochs
   with cross-entropy against the fixed head, logits eta phi;
3. each client computes the sufficient statistic of its current features,
   S_k = sum_i phi_i (x) e_{y_i} (per-class sums of phi: the class counts
   ride in the constant coordinate), clipped as the mechanism requires, and
   uploads it (m C floats) with its count n_k (1 float);
4. the server solves the MAP head of Eq. 15 with the same solver as the
   one-shot method (:class:`privfed.methods.fedlog.FedLog`) and sends it back.

Accuracy is the paper's personalised evaluation (the mean over clients of
body_k + head on the client's own test split, distributed like its training
data) and the same bodies on the common test set.

Bodies (``FAMILIES``) share the feature width d = 64: ``cnn`` (the digits
backbone's architecture), ``cnn-narrow`` (half the channels) and ``mlp`` (on
raw pixels).  They start from scratch or from a network trained on the
*public* split only (the attacker-knowledge split of
:mod:`privfed.data.digits`; for ``cnn`` that is the digits backbone itself).

Differential privacy over rounds
--------------------------------
Every round releases a new statistic, so R rounds are R releases.  Each is one run of the release
plan ``privfed.fit`` runs (:class:`privfed.release.ReleasePlan`, FedLog's augmented statistic under
one :class:`mechanisms.GaussianMechanism`), leaving its :class:`privfed.release.ReleaseTrace`
(``RoundsResult.traces``); the guarantee is composed from the traces' events
(:mod:`privfed.fedlog_report`).  Noise is
added to the augmented statistic (counts and sums together, one sigma: the
Gaussian mechanism on phi (x) e_y of Theorem 3.1), centrally (a trusted
server noises the sum), distributed (each client adds N(0, sigma^2/(K - t)) and
secure aggregation reveals only the sum) or locally (each client noises its
own upload with the full sigma).  ``calibration="total"`` (default)
calibrates sigma so that the R releases *together* are (eps, delta)-DP:
mu_round = mu(eps, delta) / sqrt(R), exact in GDP
(:func:`mechanisms.accounting.calibrate_round_mu`).  ``calibration="paper"``
reproduces the paper: the classic sigma of Theorem 3.1 for eps, the same eps
every round, no composition; the report then states both that per-round eps
and what the R releases compose to (GDP exactly, PLD as a cross-check), from
the ledger of the releases the run made.

The sensitivity needs care.  Theorem 3.1's bound Delta = sqrt(1 + (m - 1) b^2)
(one record adds one phi (x) e_y) holds when the features come from a body
that does not depend on the private records (frozen bodies).  A body trained
on the client's records depends on every one of them, so adding one record
can move *every* feature of its client: the release is then bounded only by
the size of the client's whole upload.  ``record_bound="upload"`` (the
default whenever bodies are trained) bounds each client's upload to
``max_records`` records' worth (n_max; larger clients are scaled down) and
calibrates for the diameter 2 n_max Delta, a valid record-level guarantee
under adaptive composition.  ``record_bound="theorem"`` uses Delta itself;
with trained bodies the report says that no formal guarantee holds.  At
client level the sensitivity is n_max Delta (add or remove one client).

Secure aggregation
------------------
Each round's release can run through privfed's secure aggregation
(:class:`RoundRelease`, ``secure_agg``): pairwise masking
(:class:`mechanisms.secagg.PairwiseMasking`: fresh X25519 keys from the OS
CSPRNG every round, fixed point in Z_2^64, Shamir-shared seeds for dropouts)
or CKKS (:class:`mechanisms.secagg.CKKSAggregation`).  ``placement=
"distributed"`` needs one (masking by default): every client adds its share
N(0, sigma^2/(K - t)) before masking, and the release is charged the noise
its sum really carries (U present shares: U sigma^2/(K - t)); ``dropouts``
simulates clients leaving each round; a trusted server (``placement="central"``) or clients noising
their own uploads (``"local"``) sum in clear.  The protocol's view of every round (masked ring
elements only) is kept in ``RoundsResult.server_views``.

Per-round API (for running the protocol in another loop, e.g. Flower)
--------------------------------------------------------------------
:func:`initial_head` (the server's seeded random head), :func:`client_update`
(one client's round: train its body against the broadcast head, return its
(C, m) statistic), :func:`client_statistic` (the statistic alone) and
:func:`server_step` (the MAP head and the array to broadcast from the
released sum).  :class:`RoundRelease` turns the clients' statistics into one
release (the plan's stages: bound, noise, secure sum, head) and keeps its trace.

Modules: :mod:`privfed.fedlog_training` (the protocol), :mod:`privfed.fedlog_baselines`,
:mod:`privfed.fedlog_run` (:func:`run_rounds`), :mod:`privfed.fedlog_release` and
:mod:`privfed.fedlog_report` (the release and its guarantee); this module holds the trade-off
command and re-exports the rest.

Training, partition and initial heads are seeded and bit-reproducible on
CPU (deterministic algorithms, one thread).  The noise of every release (and
the secure sum's dropouts and noise shares) comes from fresh OS entropy
unless ``noise_seed`` is given; a run with a ``noise_seed`` is a reproducible
*seeded simulation*, not a secret release, and its guarantee, ``describe()``,
table, CSV and JSON say so.  ``max_records`` is given by the caller or is the
public default :data:`DEFAULT_MAX_RECORDS`, never read from the data.
Masking keys are fresh OS entropy, but the masks cancel exactly, so the
released sums do not depend on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from mechanisms.ledger import format_up
from privfed.errors import ConfigError
from privfed.fedlog_bodies import FAMILIES, FEATURE_DIM, make_body
from privfed.fedlog_config import DEFAULT_MAX_RECORDS, RoundsConfig, RoundsResult
from privfed.fedlog_release import RoundRelease, RoundsDP, RoundsPrivacyReport, noise_generator
from privfed.fedlog_run import make_dp, run_rounds
from privfed.fedlog_training import (
    RoundsClient,
    RoundsSetup,
    assign_families,
    client_statistic,
    client_update,
    head_eta,
    init_body,
    initial_head,
    personal_test_split,
    server_step,
    train_body,
)

__all__ = [
    "CHECKPOINT_S",
    "DEFAULT_MAX_RECORDS",
    "FAMILIES",
    "FEATURE_DIM",
    "RoundRelease",
    "RoundsClient",
    "RoundsConfig",
    "RoundsDP",
    "RoundsPrivacyReport",
    "RoundsResult",
    "RoundsSetup",
    "assign_families",
    "attack_summary",
    "client_statistic",
    "client_update",
    "head_eta",
    "init_body",
    "initial_head",
    "make_body",
    "make_dp",
    "noise_generator",
    "personal_test_split",
    "run_rounds",
    "server_step",
    "tradeoff_main",
    "tradeoff_rounds",
    "train_body",
]


# ---------------------------------------------------------------- trade-off command
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

    Written through :class:`privfed._cli.OutputDir` like every command: SIGTERM / Ctrl-C keep the (epsilon,
    seed) pairs that finished in ``results.partial.*``, checkpointed every ``CHECKPOINT_S`` seconds.
    """
    from privfed._cli import OutputDir, as_int, keep_finished, periodic_checkpoint, versions

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
