"""The sweep: seeds x methods x placements x budgets, statistics once per (seed, method, placement)."""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from privfed import methods as _methods
from privfed import scaling
from privfed.commands.common import heartbeat
from privfed.commands.tradeoff.attack_columns import attack_context, run_attacks
from privfed.commands.tradeoff.config import PLACEMENT_LABEL, TradeoffConfig, check_config
from privfed.commands.tradeoff.labels import (
    calibration_label,
    noise_label,
    placement_label,
    repair_facts,
    repairs_text,
)
from privfed.commands.tradeoff.plan import (
    blas_threads,
    data_rules,
    default_clip,
    placement_variants,
    seed_for,
    sweep_cost_note,
)
from privfed.errors import ConfigError, InputError
from privfed.release.pipeline import client_statistics, server_head
from privfed.results.record import UNPROTECTED_ROW

__all__ = ["run_tradeoff"]


def run_tradeoff(
    cfg: TradeoffConfig,
    *,
    progress: bool = True,
    records: list[dict[str, Any]] | None = None,
    on_record: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """Run the sweep; returns ``{"records": [...], "dataset": {...}, "timing": {...}}``.

    Records are appended to ``records`` (a new list by default) as each run
    finishes, so a caller keeps what was done if the sweep is interrupted;
    ``on_record(records)`` is called after each (e.g. to checkpoint them).
    """
    from tqdm.auto import tqdm

    from privfed.data import load_dataset
    from privfed.federation import partition as make_partition
    from privfed.release.settings import make_privacy, make_secure_agg, vacuous_delta

    cfg = check_config(cfg)  # a config built in Python passes the flags' checks (the command's already did)
    if cfg.rounds > 1:  # one-shot releases only: calibrated for R rounds, one would be run and labelled R
        raise ConfigError(
            f"run_tradeoff runs one-shot releases; rounds={cfg.rounds} is multi-round FedLog, which "
            "privfed.commands.tradeoff.rounds.tradeoff_rounds runs (what python -m privfed.tradeoff --method "
            "fedlog --rounds R does): call it with this config, or set rounds=1"
        )
    t0 = time.perf_counter()
    ds = load_dataset(cfg.dataset, backbone=cfg.backbone, download=cfg.download, progress=progress)
    t_data = time.perf_counter() - t0
    now = (ds.meta or {}).get("sha256")
    if cfg.dataset_sha256 is not None and now is not None and now != cfg.dataset_sha256:
        raise InputError(
            f"dataset {cfg.dataset!r}: the file's data changed since the recorded run (the SHA-256 of its arrays "
            f"is {now[:16]}..., the record says {cfg.dataset_sha256[:16]}...), so the replay would not reproduce "
            "it; restore the file, or run on the new data without --config"
        )
    classes = np.unique(np.asarray(ds.train_labels))
    if classes.size < 2:
        raise InputError(
            f"dataset {cfg.dataset!r} has a single class in its training labels: every head predicts it and "
            "accuracy is 1 whatever the privacy; use data with >= 2 classes"
        )
    if np.unique(np.asarray(ds.test_labels)).size < 2:  # the training data may be fine: the test split is not
        raise InputError(
            f"dataset {cfg.dataset!r} has a single class in its test labels, so accuracy would measure that "
            "class alone; give every class more samples (20% of each is held out) or test arrays with >= 2 classes"
        )
    if cfg.partition == "natural" and ds.train_clients is not None and ds.train_clients.size:
        # the clients that hold training rows (an id with none adds nothing to a sum)
        _check_natural_clients(cfg, int(np.unique(np.asarray(ds.train_clients)).size))
    finite = [e for e in cfg.epsilons if math.isfinite(e)]
    clip = default_clip(cfg, ds) if finite and cfg.count_noise is None else cfg.clip
    cfg = replace(cfg, clip=clip)
    variants = placement_variants(cfg)
    skipped: dict[tuple[str, str], str] = {}
    # Pre-flight: refuse an incompatible method / protection pair before any work (when several
    # placements are compared, one that does not apply to a method is left out with a note).
    for mname in cfg.methods:
        method = _methods.get(mname, **cfg.method_params.get(mname, {}))
        errors = []
        for key, v in variants:
            try:
                secure = make_secure_agg(v.secure_agg)
                if (
                    secure is not None
                    and method.per_client
                    and type(method).secure_aggregate is _methods.Method.secure_aggregate
                ):
                    raise ConfigError(
                        f"method {mname!r} needs every client's statistics and has no secure "
                        "protocol; drop it from --method or use --secure-agg none"
                    )
                if key == "trusted" and method.per_client and finite:
                    raise ConfigError(
                        f"method {mname!r} needs every client's statistics, so a trusted aggregator "
                        "cannot add its noise to the sum; use --placement local"
                    )
                privacy = None
                for eps in finite[:1]:
                    privacy = make_privacy(v, method, eps, clip, secure_agg=secure)
                _check_sizes(method, ds, cfg.clients, privacy, secure, v.secure_agg)
            except ConfigError as exc:
                errors.append(exc)
                skipped[(mname, key)] = str(exc)
        if len(errors) == len(variants):
            raise errors[0]
    attack_ctx = attack_context(cfg, ds) if cfg.attacks else None
    records = [] if records is None else records
    kept = {m: [v.secure_agg != "none" for k, v in variants if (m, k) not in skipped] for m in cfg.methods}
    n_var = {m: len(s) for m, s in kept.items()}
    n_inf = sum(not math.isfinite(e) for e in cfg.epsilons)
    total = len(cfg.seeds) * sum(n * len(finite) + n_inf for n in n_var.values())
    # the sums under secure aggregation: every budget of a secure placement, and eps = inf's one row where
    # the method's first placement (the one that row runs under) is secure
    secure_runs = len(cfg.seeds) * sum(
        len(finite) * sum(s) + n_inf * (s[:1] == [True]) for s in kept.values()
    )
    note = sweep_cost_note(
        total,
        n=int(ds.train_features.shape[0]),
        d=int(ds.dim),
        k=cfg.clients,
        c=int(ds.num_classes),
        attacks=len(cfg.attacks),
        passes=len(cfg.seeds) * sum(n_var.values()),  # the statistics: once per seed, method and placement
        secure_runs=secure_runs,
        secure_kind=cfg.secure_agg if cfg.secure_agg != "none" else "mask",
    )
    if note:  # a large sweep says so before it starts
        print(f"note: {note}", file=sys.stderr)
    bar = tqdm(total=total, desc="tradeoff", unit="run", disable=not progress, file=sys.stderr, delay=2)
    caught: set[str] = {
        f"placement {PLACEMENT_LABEL[k]!r} left out for method {m!r}: {why}"
        for (m, k), why in skipped.items()
    }
    client = cfg.level == "client"  # the unit a release protects: a record, or a whole client
    units = cfg.clients if client else int(ds.train_features.shape[0])
    vacuous = vacuous_delta(cfg.delta, units, "clients" if client else "training records")
    if finite and cfg.count_noise in (None, "gaussian") and vacuous:
        print(f"note: {vacuous}", file=sys.stderr)
        caught.add(vacuous)
    with warnings.catch_warnings(record=True) as wlist, blas_threads(ds.dim), heartbeat(bar):
        warnings.simplefilter("always")
        _sweep(
            cfg,
            ds,
            clip,
            records,
            bar,
            make_privacy,
            make_secure_agg,
            make_partition,
            attack_ctx,
            variants=variants,
            skipped=skipped,
            on_record=on_record,
        )
    caught.update(str(w.message) for w in wlist)
    if attack_ctx is not None:
        caught.update(attack_ctx["skipped"])
    bar.close()
    if cfg.placements:  # the record names the placements that ran (one left out for every method did not)
        ran = tuple(k for k, _ in variants if any((m, k) not in skipped for m in cfg.methods))
        cfg = replace(cfg, placements=ran)
    return {
        "config": cfg,
        "warnings": sorted(caught),
        "records": records,
        "dataset": {
            "name": ds.name,
            "num_train": int(ds.train_features.shape[0]),
            "num_test": int(ds.test_features.shape[0]),
            "dim": int(ds.train_features.shape[1]),
            "num_classes": ds.num_classes,
            "meta": ds.meta,
            "data_rules": data_rules(cfg, ds, make_partition),
        },
        "timing": {"data_s": t_data, "total_s": time.perf_counter() - t0},
    }


def _check_sizes(method, ds, clients: int, privacy, secure, kind: str) -> None:
    """Refuse, before any statistic is computed, a run whose largest arrays cannot fit (naming the size,
    the limit and the option that lowers it): the release's d x d and (K, C, d + 1) arrays, and masking's
    neighbour sets."""
    from privfed.release.plan import ReleasePlan
    from privfed.release.stages import check_release_memory

    dense = (privacy is not None or secure is not None) and not ReleasePlan(method, privacy, secure).streamed
    check_release_memory(method, int(ds.dim), int(ds.num_classes), int(clients), dense_uploads=dense)
    if kind == "mask":
        from mechanisms.secagg.masking import check_masking_size

        check_masking_size(int(clients), getattr(secure, "neighbours", None), f"--clients {clients:,}")


def _sweep(
    cfg,
    ds,
    clip,
    records,
    bar,
    make_privacy,
    make_secure_agg,
    make_partition,
    attack_ctx=None,
    *,
    variants=None,
    skipped=None,
    on_record=None,
) -> None:
    """The seeds x methods x placements x budgets loop; statistics computed once per (seed, method, placement)."""
    variants = placement_variants(cfg) if variants is None else variants
    skipped = skipped or {}
    for seed in cfg.seeds:
        natural = ds.train_clients if cfg.partition == "natural" else None
        part = make_partition(
            ds.train_labels, cfg.clients, cfg.partition, alpha=cfg.alpha, rng=seed, natural=natural
        )
        F, y, k = part.apply(ds.train_features, ds.train_labels)
        K = int(part.num_clients)  # public: the configured partition's size, never counted from the ids
        for mname in cfg.methods:
            method = _methods.get(mname, **cfg.method_params.get(mname, {}))
            common = dict(num_classes=ds.num_classes, num_clients=K)
            Fs, scale_info = scaling.prepare(method, F, labels=y)  # exact in float64, or one clear error
            stats0 = client_statistics(method, Fs, y, k, rng=seed_for(seed, mname, "stats"), **common)
            head0 = scaling.finish(
                server_head(method, stats0, num_clients=K, rng=seed_for(seed, mname, "server")), scale_info
            )
            acc0 = head0.score(ds.test_features, ds.test_labels)
            inf_done = False
            for key, v in variants:
                if (mname, key) in skipped:
                    continue
                clipped = None
                for eps in cfg.epsilons:
                    if not math.isfinite(eps):
                        if inf_done:  # no noise: one row, whatever the placement
                            continue
                        inf_done = True
                    rec: dict[str, Any] = dict(
                        method=mname,
                        placement="none",
                        protocol=v.secure_agg,
                        level=cfg.level,
                        epsilon=eps,
                        delta=0.0,
                        seed=seed,
                        nonprivate_accuracy=acc0,
                        calibration="-",
                        rounds=cfg.rounds,
                        # what was added: the eps = inf row adds no count noise, whatever the sweep's law
                        count_noise=cfg.count_noise if math.isfinite(eps) else None,
                        secure_agg=v.secure_agg,
                        clip=clip,
                    )
                    secure = make_secure_agg(v.secure_agg)
                    privacy = None
                    if not math.isfinite(eps):
                        head = (
                            head0
                            if secure is None
                            else server_head(
                                method,
                                stats0,
                                num_clients=K,
                                rng=seed_for(seed, mname, "secure"),
                                secure_agg=secure,
                            )
                        )
                        rec.update(
                            UNPROTECTED_ROW,  # no noise ran: no neighbouring relation is protected
                            accuracy=head.score(ds.test_features, ds.test_labels),
                            clip=None,
                            guarantee="no protection (eps=inf)",
                            noise="none",
                        )
                    else:
                        privacy = make_privacy(v, method, eps, clip, secure_agg=secure)
                        if clipped is None:
                            scaling.prepare(
                                method, F, privacy
                            )  # a range the clip cannot bring back: one error
                            clipped = client_statistics(
                                method,
                                F,
                                y,
                                k,
                                rng=seed_for(seed, mname, "stats"),
                                privacy=privacy,
                                secure_agg=secure,
                                **common,
                            )
                        head = server_head(
                            method,
                            clipped,
                            num_clients=K,
                            rng=seed_for(seed, mname, eps, "noise"),
                            privacy=privacy,
                            secure_agg=secure,
                        )
                        rep = head.privacy
                        # A finite guarantee on what it covers (count noise: the counts only, said in
                        # ``protects`` and in the guarantee text); the uniform heuristic reports no epsilon.
                        # ``private``: the report's own flag, true only when every statistic is covered.
                        bounded = math.isfinite(rep.epsilon)  # an epsilon for what it covers
                        private = bool(rep.is_private)  # every released statistic covered
                        rec.update(
                            mechanism=rep.mechanism,
                            accuracy=head.score(ds.test_features, ds.test_labels),
                            # count noise leaves the sums without noise: their sigma is 0, not unknown
                            sigma=rep.sigma.get("sums", 0.0 if v.count_noise else float("nan")),
                            sigma_counts=rep.sigma.get("counts", float("nan")),
                            guarantee=rep.guarantee,
                            epsilon_reported=rep.epsilon if bounded else math.inf,
                            placement=placement_label(key, method, rep),
                            delta=float(rep.delta) if bounded else float("nan"),
                            calibration=calibration_label(v, rep),
                            noise=noise_label(v, rep, eps),
                            private=private,
                            protects=getattr(rep, "protects", "all released statistics"),
                        )
                    # what ran, read from the release (never copied from the request): the protocol from
                    # the secure-aggregation report, the level and privacy flag from the privacy report
                    ran = getattr(head.secure_aggregation, "protocol", None) or "none"
                    rec.update(protocol=ran, secure_agg=ran)
                    if privacy is not None:
                        rec["level"] = head.privacy.level
                    upload = head.upload_bytes.get("per_client")
                    if head.secure_aggregation is not None:
                        upload = getattr(head.secure_aggregation, "bytes_per_client", upload)
                    rec["upload_bytes"] = upload
                    pairs, kinds = repair_facts(
                        [*head.notes, *getattr(privacy and head.privacy, "notes", ())]
                    )
                    rec["pairs_dropped"] = float("nan") if pairs is None else pairs
                    rec["repairs"] = repairs_text(pairs, kinds)
                    rec["repair_kinds"] = "; ".join(kinds)
                    rec["notes"] = "; ".join(head.notes)
                    if attack_ctx is not None:
                        run_attacks(cfg, ds, attack_ctx, rec, mname, part.clients, seed, eps, privacy, secure)
                    records.append(rec)
                    bar.update(1)
                    if on_record is not None:
                        on_record(records)


def _check_natural_clients(cfg, clients: int) -> None:
    """A natural split's clients come from the data file, known only once it is read: a secure sum over
    fewer than 2 that hold data is refused here, before any run (as --clients 1 is when the flags are read)."""
    if clients >= 2:
        return
    if cfg.secure_agg != "none":
        raise ConfigError(
            f"--secure-agg {cfg.secure_agg} needs 2 or more clients (a sum of one input is that input), but the "
            f"data's clients column gives rows to {clients} for --partition natural; give the file 2 or more clients, "
            "or drop --secure-agg"
        )
    if "secure-sum" in cfg.placements:
        raise ConfigError(
            f"the secure-sum placement needs 2 or more clients (a sum of one input is that input), but the data's "
            f"clients column gives rows to {clients} for --partition natural; pass --placement local,trusted, or give "
            "the file 2 or more clients"
        )
