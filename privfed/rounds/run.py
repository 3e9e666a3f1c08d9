"""Run multi-round FedLog on the digits default: :func:`run_rounds` (and its noise, :func:`make_dp`)."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import fields, replace

import numpy as np

from privfed.data.digits import deterministic_torch
from privfed.errors import ConfigError
from privfed.rounds.baselines import fedavg_baseline, local_baseline
from privfed.rounds.bodies import FEATURE_DIM
from privfed.rounds.config import DEFAULT_MAX_RECORDS, RoundsConfig, RoundsResult
from privfed.rounds.release import RoundRelease, RoundsDP, noise_generator
from privfed.rounds.training import RoundsSetup, run_fedlog

__all__ = ["NOISE_STREAM", "make_dp", "run_rounds"]

#: The stream of :func:`noise_generator` every release of a seeded run draws its noise from, in order: each
#: round the clients' noise (K rows of (C, d + 1) under local or distributed noise) or the server's (central).
#: A seeded Flower run draws the same stream (:mod:`privfed.flower.fedlog`), so its heads are these.
NOISE_STREAM = 0x0153


def make_dp(cfg: RoundsConfig, *, rounds: int, bodies_trained: bool) -> RoundsDP | None:
    """The run's noise, with its randomness declared: seeded from ``cfg.noise_seed``, or OS entropy."""
    if math.isinf(cfg.epsilon):
        return None
    dp = RoundsDP(
        epsilon=cfg.epsilon,
        delta=cfg.delta,
        clip=cfg.clip,
        clip_norm=cfg.clip_norm,
        rounds=rounds,
        level=cfg.level,
        placement=cfg.placement,
        calibration=cfg.calibration,
        record_bound=cfg.record_bound,
        max_records=cfg.max_records if cfg.max_records is not None else DEFAULT_MAX_RECORDS,
        dim=FEATURE_DIM,
        bodies_trained=bodies_trained,
        tolerate=cfg.tolerate,
    )
    if cfg.max_records is None and dp.record_bound != "theorem":
        dp.extra_notes.append(
            f"max_records is the public default {DEFAULT_MAX_RECORDS} (not read from the data; "
            "pass max_records to choose it)"
        )
    dp.declare_randomness(seeded=cfg.noise_seed is not None, noise_seed=cfg.noise_seed)
    return dp


def round_release(cfg: RoundsConfig, dp: RoundsDP | None) -> RoundRelease:
    """The release every round of a run uses: its mechanism, its protection, its dropouts."""
    return RoundRelease(
        dp,
        cfg.secure_kind,
        num_clients=cfg.clients,
        dropouts=cfg.dropouts,
        dropout_phase=cfg.dropout_phase,
        nu=cfg.nu,
    )


def run_rounds(cfg: RoundsConfig | None = None, *, progress: bool = False, **overrides) -> RoundsResult:
    """Run multi-round FedLog (and only the baselines named in ``cfg.baselines``) on the digits default.

    Baselines are opt-in (``baselines=("oneshot", "local", "fedavg")`` runs all three): each is a run
    of its own, timed apart from FedLog in ``timing`` (``fedlog_s``, ``oneshot_s``, ``local_s``,
    ``fedavg_s``).

    Parameters
    ----------
    cfg : RoundsConfig, optional
        Settings; keyword ``overrides`` replace single fields.
    progress : bool
        Show a tqdm bar over rounds (FedLog, FedAvg) and clients (local-only).

    Returns
    -------
    RoundsResult
    """
    if cfg is not None and not isinstance(cfg, RoundsConfig):
        raise ConfigError(
            f"run_rounds takes a RoundsConfig (or keyword settings), got a {type(cfg).__name__}"
        )
    unknown = sorted(set(overrides) - {f.name for f in fields(RoundsConfig)})
    if unknown:
        raise ConfigError(f"run_rounds: unknown setting(s) {unknown}; RoundsConfig has no such field")
    cfg = replace(cfg or RoundsConfig(), **overrides).validate()
    t0, c0 = time.perf_counter(), time.process_time()
    from tqdm.auto import tqdm

    notes: list[str] = []
    with deterministic_torch(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="noise backend 'numpy'")
        setup = RoundsSetup(cfg)
        families = setup.families
        noise_rng = noise_generator(cfg.noise_seed, NOISE_STREAM)
        if not math.isinf(cfg.epsilon):
            notes.append(
                f"noise drawn from a generator seeded with noise_seed={cfg.noise_seed}: a seeded "
                "simulation, not a secret release"
                if cfg.noise_seed is not None
                else "noise drawn from fresh OS entropy every run"
            )
        dp = make_dp(cfg, rounds=cfg.rounds, bodies_trained=cfg.local_epochs > 0)
        steps = cfg.rounds
        if "fedavg" in cfg.baselines:
            steps += cfg.rounds
        if "local" in cfg.baselines:
            steps += cfg.clients
        if "oneshot" in cfg.baselines:
            steps += 1
        bar = tqdm(total=steps, desc="fedlog rounds", unit="step", disable=not progress, leave=False)
        t1 = time.perf_counter()
        release = round_release(cfg, dp)
        observer = None
        if cfg.attack_pairs:
            from privfed.rounds.observer import RoundsObserver

            observer = RoundsObserver(setup, cfg, dp, release)
        main = run_fedlog(
            cfg,
            setup,
            families,
            rounds=cfg.rounds,
            epochs=cfg.local_epochs,
            dp=dp,
            noise_rng=noise_rng,
            bar=bar,
            release=release,
            observer=observer,
        )
        timing = {"fedlog_s": time.perf_counter() - t1}
        attacks = None
        if observer is not None:
            t1 = time.perf_counter()
            attacks = observer.evaluate(np.random.default_rng([cfg.seed, 0xA77C]))
            timing["attacks_s"] = time.perf_counter() - t1
        m = FEATURE_DIM + 1
        # what was sent, as each round's trace records it (every client sends every class under DP)
        sent = [int(t.stage("report").values["bytes"]["total"]) for t in release.traces]
        per_client = sent[-1] // cfg.clients
        bytes_ = {
            "upload_per_client_round": per_client,
            "upload_per_round": sent[-1],
            "upload_total": sum(sent),
            "download_per_round": 4 * m * setup.C * cfg.clients,
        }
        secure = release.report()
        if secure is not None:
            # what a client really uploads per round under the protocol (keys, shares, masked ring elements)
            bytes_["secure_upload_per_client_round"] = secure["upload_bytes_per_client_round"]
            bytes_["secure_upload_total"] = secure["upload_bytes_per_client_round"] * cfg.clients * cfg.rounds
        baselines: dict[str, dict] = {}
        if "oneshot" in cfg.baselines:
            t1 = time.perf_counter()
            ocfg = replace(cfg, init="public")
            odp = make_dp(ocfg, rounds=1, bodies_trained=False)
            one = run_fedlog(
                ocfg,
                setup,
                families,
                rounds=1,
                epochs=0,
                dp=odp,
                noise_rng=noise_generator(cfg.noise_seed, 0x0E5),
                bar=bar,
                label="one-shot",
                release=round_release(ocfg, odp),  # the same protection as FedLog's rounds
            )
            # one round of the same release: under secure aggregation, what the protocol sends
            one_round = bytes_.get("secure_upload_per_client_round", per_client) * cfg.clients
            baselines["oneshot"] = {
                "personalised": one["personalised"],
                "common": one["common"],
                "upload_bytes_per_round": one_round,
                "upload_bytes_total": one_round,
                "privacy": None if odp is None else odp.report(),
            }
            timing["oneshot_s"] = time.perf_counter() - t1
            if odp is not None:
                notes.append(
                    "the one-shot baseline is a release of its own of the same records, with its own "
                    f"({odp.report().epsilon:.4g}, {cfg.delta:g})-DP (baselines['oneshot']['privacy']); the run's "
                    "guarantee is FedLog's rounds': a deployment that made both releases would spend both budgets"
                )
        if "local" in cfg.baselines:
            t1 = time.perf_counter()
            baselines["local"] = local_baseline(cfg, setup, families, bar=bar)
            timing["local_s"] = time.perf_counter() - t1
        if "fedavg" in cfg.baselines:
            t1 = time.perf_counter()
            baselines["fedavg"] = fedavg_baseline(cfg, setup, bar=bar)
            if len(set(families)) > 1:
                notes.append(
                    f"FedAvg needs one architecture: it ran with family {cfg.fedavg_family!r} on every "
                    "client (FedLog's clients are heterogeneous)"
                )
            if dp is not None:
                notes.append("FedAvg and local-only baselines are not private (no noise)")
            timing["fedavg_s"] = time.perf_counter() - t1
        bar.close()
    timing["total_s"] = time.perf_counter() - t0
    timing["cpu_s"] = (
        time.process_time() - c0
    )  # CPU time of this process (one torch thread): load-independent
    return RoundsResult(
        config=cfg,
        history=main["history"],
        personalised_accuracy=main["personalised"],
        common_accuracy=main["common"],
        head=main["head"],
        families=families,
        bytes=bytes_,
        privacy=None if dp is None else dp.report(),
        baselines=baselines,
        timing=timing,
        notes=notes,
        secure_aggregation=secure,
        server_views=release.views,
        traces=release.traces,
        attacks=attacks,
    )
