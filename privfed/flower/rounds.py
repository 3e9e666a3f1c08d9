"""Multi-round methods on Flower: multi-round FedLog's server loop, and a generic loop for others.

:func:`serve_fedlog_rounds` is the server of multi-round FedLog (the node side and the plan it splits
are in :mod:`privfed.flower.fedlog`): every round a ``query.round`` with the head, then the round's sum
(the replies folded as they arrive, or the round's pairwise-masked sum), the server's stages of the
release (central noise, the privacy events booked once in its own copy of the mechanism, a distributed
release settled with the shares that reached the sum) and the MAP head; the rounds' events compose into
the report ``privfed.rounds`` prints.

Another multi-round method registers what a node computes in round r from the server's
broadcast::

    from privfed.flower.rounds import register_round_statistics

    @register_round_statistics("fedlog-rounds")
    def node_round(data, cfg, broadcast, round_index) -> ClientStats: ...

and the server drives the rounds with :func:`run_rounds`, which sends
``query.round`` with the broadcast (an ArrayRecord), folds the replies as
they arrive (sum-only: a running total) and hands the total to the
method's ``step(round_index, total) -> next broadcast or None`` (``None``
ends the loop).  Every wait has the run's timeout; a node error is one
ConfigError naming the node.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from privfed.errors import ConfigError
from privfed.flower.config import FlowerConfig
from privfed.flower.transport import Exchange, exchange
from privfed.flower.wire import arrays_record, stats_from_record
from privfed.stats import ClientStats

__all__ = ["ROUND_STATISTICS", "register_round_statistics", "run_rounds", "serve_fedlog_rounds"]

#: name -> node-side ``fn(data, cfg, broadcast: dict[str, ndarray], round_index) -> ClientStats``.
ROUND_STATISTICS: dict[str, Callable] = {}
#: names whose function takes the node's Flower ``Context`` instead of its loaded data (it keeps state
#: between rounds in ``context.state`` and reads its own data, e.g. multi-round FedLog's images).
_WANTS_CONTEXT: set[str] = set()


def register_round_statistics(name: str, *, context: bool = False):
    """Decorator: register a node's per-round statistics under ``name`` (the run's ``method``).

    With ``context=True`` the function is called as ``fn(context, cfg,
    broadcast, round_index)`` with the node's Flower Context (its node config
    and persistent state) instead of its loaded feature data.
    """

    def deco(fn):
        ROUND_STATISTICS[name] = fn
        if context:
            _WANTS_CONTEXT.add(name)
        else:
            _WANTS_CONTEXT.discard(name)
        return fn

    return deco


def node_round_statistics(name: str, context, cfg, broadcast, round_index) -> ClientStats:
    """The registered per-round statistics (ConfigError listing the registered names otherwise)."""
    if name not in ROUND_STATISTICS:
        raise ConfigError(
            f"no per-round statistics registered for {name!r}; registered: {sorted(ROUND_STATISTICS)}"
        )
    if name in _WANTS_CONTEXT:
        return ROUND_STATISTICS[name](context, cfg, broadcast, round_index)
    from privfed.flower.node import load_node_data

    data = load_node_data(context.node_config, cfg)
    return ROUND_STATISTICS[name](data, cfg, broadcast, round_index)


def run_rounds(
    grid,
    cfg: FlowerConfig,
    nodes: list[int],
    *,
    name: str,
    first: dict[str, np.ndarray],
    step: Callable[[int, ClientStats], dict[str, np.ndarray] | None],
    max_rounds: int,
) -> list[Exchange]:
    """Broadcast, collect and fold ``max_rounds`` rounds at most (see the module docstring)."""
    from privfed.flower.fold import NodeFold, node_errors

    broadcast, stages = first, []
    config_rec = ConfigRecord(cfg.to_wire())
    for r in range(max_rounds):
        fold = NodeFold(cfg.make_method())
        errors: dict[int, str] = {}

        def on_reply(node, content, fold=fold, errors=errors):
            if "error" in content:
                errors[node] = str(content["error"]["message"])
                return
            fold.add(f"node {node}", stats_from_record(content["stats"], f"node {node}"))

        contents = {
            n: RecordDict(
                {
                    "config": config_rec,
                    "round": ConfigRecord({"name": name, "index": r}),
                    "broadcast": arrays_record(broadcast),
                }
            )
            for n in nodes
        }
        ex = exchange(grid, contents, "query.round", cfg.timeout, on_reply, group_id=f"round-{r}")
        stages.append(ex)
        node_errors(errors, ex.failed, f"round {r}")
        if len(ex.answered) < cfg.min_replies:
            raise ConfigError(
                f"round {r}: only {len(ex.answered)} of {len(nodes)} nodes answered within {cfg.timeout:g} s"
            )
        broadcast = step(r, fold.result())
        if broadcast is None:
            break
    return stages


# ------------------------------------------------------------------------------------------ multi-round FedLog
def serve_fedlog_rounds(
    grid, cfg: FlowerConfig, nodes: list[int], config_rec, stages: dict, keep_view=False, received=None
):
    """Multi-round FedLog's server (module docstring): ``(heads, dp, report entries)``.

    ``dp`` is the run's :class:`~privfed.rounds.RoundsDP` (None without DP) whose traces hold every
    round's events; ``stages`` (name -> Exchange) and ``received`` (with ``keep_view``) are filled in.
    """
    import json
    from dataclasses import asdict

    from privfed.flower.checks import rounds_placement
    from privfed.flower.dp import BACKEND_KEY, agreed_backend
    from privfed.flower.fedlog import (
        C_DIGITS,
        ROUND_NAME,
        make_rounds_dp,
        masked_round_name,
        rounds_config,
        server_noise_rng,
    )
    from privfed.flower.fold import NodeFold, node_errors
    from privfed.flower.secagg import Opening
    from privfed.flower.server_secure import declared_colluders
    from privfed.rounds import FEATURE_DIM, head_eta, initial_head
    from privfed.rounds.release import AugmentedFedLog, augmented, distributed_note
    from privfed.rounds.report import EventTrace

    rc = rounds_config(cfg)
    dp = make_rounds_dp(rc)
    place = rounds_placement(cfg)
    masked = cfg.secure == "mask"
    method = AugmentedFedLog(nu=rc.nu)
    mech = None if dp is None else dp.mechanism
    if mech is not None and not masked:
        mech.check(method, None)
    C, m = C_DIGITS, FEATURE_DIM + 1
    eta = initial_head(C, rc.seed, dim=FEATURE_DIM, scale=rc.head_init_scale)
    central_rng = server_noise_rng(cfg) if place == "central" else None
    randomness = "seeded" if cfg.noise_seed is not None else "os-entropy"
    received = [] if received is None else received
    heads, sums, runs, epsilon, summed, spans = [], [], [], [], [], []
    colluders: dict[int, int] = {}
    backends: dict[int, str] = {}
    for r in range(rc.rounds):
        fold = NodeFold(method)
        errors: dict[int, str] = {}
        events: dict[int, list[dict]] = {}
        # A masked round's key advertisements travel with the round's message (a round trip fewer, as the
        # setup carries a one-shot run's first sum's): each node answers the round, then the keys request.
        opening = Opening.make(cfg.clients, cfg.threshold, cfg.degree, "query.round") if masked else None

        def on_reply(node, content, fold=fold, errors=errors, events=events, r=r, opening=opening):
            if opening is not None and "meta" in content:
                opening.take(node, content)
            if "error" in content:
                errors[node] = str(content["error"]["message"])
                return
            events[node] = json.loads(str(content["meta"]["events"])) if "meta" in content else []
            if "meta" in content and "colluders" in content["meta"]:
                colluders[node] = int(content["meta"]["colluders"])
            if "meta" in content and BACKEND_KEY in content["meta"]:
                backends[node] = str(content["meta"][BACKEND_KEY])
            if "stats" in content:
                stats = stats_from_record(content["stats"], f"node {node}")
                if keep_view:
                    received.append((f"round-{r}", node, {k: v.copy() for k, v in stats.arrays().items()}))
                fold.add(f"node {node}", stats)

        contents = {
            n: RecordDict(
                {
                    "config": config_rec,
                    "round": ConfigRecord({"name": ROUND_NAME, "index": r}),
                    "broadcast": arrays_record({"eta": eta}),
                    **({} if opening is None else opening.request()),
                }
            )
            for n in nodes
        }
        ex = stages[f"round-{r}"] = exchange(
            grid, contents, "query.round", cfg.timeout, on_reply, group_id=f"round-{r}"
        )
        node_errors(errors, ex.failed, f"round {r}")
        if len(ex.answered) < cfg.min_replies:
            raise ConfigError(
                f"round {r}: only {len(ex.answered)} of {len(nodes)} nodes answered within {cfg.timeout:g} s"
            )
        booked = 0 if mech is None else len(mech.ledger.events)
        declared = declared_colluders(colluders) or 0
        name = agreed_backend(backends)
        if dp is not None and name is not None and name != dp.backend.name:  # the nodes drew the noise
            dp.use_backend(name, num_classes=C)
        if masked:
            from privfed.flower.dp import SecureNoiseReport
            from privfed.flower.secagg import masked_sum_over_messages

            report = None
            if mech is not None:
                report = SecureNoiseReport(mech, method, "mask", num_clients=cfg.clients)
                report.record(events)
            payload = {
                "config": config_rec,
                "round": ConfigRecord({"round": masked_round_name(r)}),
                "broadcast": arrays_record({"eta": eta}),
            }
            res = masked_sum_over_messages(
                grid,
                sorted(ex.answered),
                length=C * m,
                frac_bits=cfg.frac_bits,
                threshold=cfg.threshold,
                timeout=cfg.timeout,
                masked_payload=lambda node, payload=payload: dict(payload),
                round_name=masked_round_name(r),
                keep_view=keep_view,
                num_nodes=cfg.clients,
                degree=cfg.degree,
                opening=opening,
            )
            for k, v in res.stages.items():
                stages[f"round-{r}:{k}"] = v
            received.extend(res.view)
            runs.append(res)
            if report is not None:  # the shares of the roster's declared colluders are not counted
                report.settle(
                    [len(res.uploaded)],
                    [[len(p) for p in res.parts] or [len(res.uploaded)]],
                    colluders=declared,
                )
                mech.report()  # settles the release with the noise shares of its least-noised part
                spans.append((booked, len(mech.ledger.events), res.smallest_part - declared))
                dp.secure_notes[:] = [
                    distributed_note(dp, "mask", cfg.clients, [x.smallest_part - declared for x in runs])
                ]
            total = np.asarray(res.total, dtype=np.float64).reshape(C, m)
            summed.append(len(res.uploaded))
        else:
            stats = fold.result()
            if mech is not None:
                if place == "local":
                    from privfed.flower.server_plain import record_client_releases

                    record_client_releases(mech, events)
                else:
                    stats = mech.after_aggregate(stats, method, central_rng)
            total = augmented(stats)[0]
            summed.append(len(ex.answered))
        if dp is not None:
            dp.traces.append(EventTrace(tuple(asdict(e) for e in mech.ledger.events[booked:]), randomness))
            epsilon.append(dp.composed_epsilon())
        head = method.aggregate(ClientStats(counts=total[None, :, 0].copy(), sums=total[None, :, 1:].copy()))
        heads.append(head)
        sums.append(total)
        eta = head_eta(head)
    extra = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(rc).items()},
        "placement": place,
        "summed": summed,
        "epsilon": epsilon,
        "head_norm": [float(np.linalg.norm(head_eta(h))) for h in heads],
        "noise_backends": {str(n): b for n, b in sorted(backends.items())},
    }
    if masked:
        from privfed.flower.server_secure import run_threat, scaled_epsilon

        # the worst round: the smallest part of a survivor graph, under the rounds' composed epsilon were every
        # round's sum that small
        threat = run_threat(cfg, runs, scaled_epsilon(mech, spans), colluders=declared_colluders(colluders))
        heads[-1].secure_aggregation = {
            "protocol": "mask",
            "secure_variant": "one masked sum a round",
            "rounds": [x.record() for x in runs],
            "summed_nodes": min(summed),
            "dropped": sorted({n for x in runs for n in x.dropped_before_upload}),
            "threat_model": threat.text(),
            "threat": threat.as_dict(),
        }
    return heads, dp, extra, sums
