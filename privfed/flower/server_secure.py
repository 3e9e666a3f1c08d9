"""The server of a secure run on Flower: setup, the secure sums the method runs, the head.

:func:`serve_secure` sends ``query.setup`` (each node's shape, whether it is a
CKKS key holder, and under DP its record of its noise share; under pairwise
masking it carries the first sum's keys request too), then runs every
secure sum the method needs (:func:`privfed.flower.protocol.secure_rounds`)
with pairwise masking (:mod:`privfed.flower.secagg`), CKKS
(:mod:`privfed.flower.ckks`) or Flower's own SecAgg+
(:mod:`privfed.flower.flwr_secagg`): one ``sums`` round for a sum-only
method; FedCOF's two rounds with the server of
:mod:`privfed.methods.fedcof_protocol` (the code ``FedCOF.secure_aggregate``
runs in one process), the round-2 broadcast sent with the masked stage and
signed back by every node.  The server only ever holds masked uploads,
encrypted shares, seed shares and sums.
"""

from __future__ import annotations

import dataclasses
import json
import math

from flwr.app import ConfigRecord, RecordDict

from mechanisms.dp.accounting import ledger_epsilon
from mechanisms.secagg.bounds import DEFAULTS, PublicBounds
from mechanisms.secagg.ckks.scheme import CKKSParams
from mechanisms.secagg.threat import ckks_threat, masking_threat, min_threshold
from privfed.errors import ConfigError
from privfed.flower.ckks import ckks_sum_over_messages
from privfed.flower.dp import BACKEND_KEY, agreed_backend
from privfed.flower.fold import node_errors
from privfed.flower.protocol import refusal_bits, secure_rounds, split_sum_vector, sum_vector_length
from privfed.flower.secagg import Opening, masked_sum_over_messages
from privfed.flower.transport import exchange
from privfed.flower.wire import arrays_record
from privfed.methods.fedcof_protocol import FedCOFServer
from privfed.methods.fedcof_protocol import threat_model as fedcof_threat
from privfed.release.stages import rounding_note

__all__ = ["THREAT_FLWR", "declared_colluders", "flwr_threat", "run_threat", "scaled_epsilon", "serve_secure"]


#: What Flower's own SecAgg+ does not protect against (reported with its runs).
THREAT_FLWR = (
    "NOT SECURE AGAINST A DEVIATING SERVER (for comparison with Flower's implementation only). A server that "
    "lists a node as both alive and dropped in the unmask request gets both its self-mask seed shares and its "
    "pair-mask key shares from every node (Flower's node checks only how many nodes are active) and recovers "
    "that node's input exactly, with no search, while the released sum still looks right; a server that "
    "reports a node's upload lost gets its pair-mask keys, and the self-mask left is numpy MT19937 seeded by a "
    "32-bit fold of the seed (a 2^32 search). Against an honest-but-curious server: it sees public keys, "
    "encrypted shares, masked quantised uploads over Z_2^32 and the shares that unmask the sum over uploaders; "
    "t or more colluding nodes can unmask a node; no key authentication. The neighbour graph (complete, or "
    "k + 1 shares a node with a degree k; drawn by the server) and the stochastic rounding come from non-cryptographic generators (Python's random, numpy's global "
    "generator). Use --secure-agg mask."
    " Even honestly run, the sum's per-class coordinates (a class's count and feature sum) cover only the "
    "nodes that hold the class: a class one node alone holds is that node's statistic, read exactly without DP."
)


def flwr_threat(cfg) -> str:
    """The threat model a run of Flower's SecAgg+ prints: its graph and threshold, computed from the run's
    configuration, then what holds of Flower's implementation (:data:`THREAT_FLWR`)."""
    K, t = int(cfg.clients), int(cfg.secagg_threshold)
    graph = (
        "every node shares with every other"
        if cfg.degree is None
        else f"each node shares with {int(cfg.degree)} others"
    )
    first, rest = THREAT_FLWR.split(". ", 1)  # the warning stays first
    return (
        f"{first}. Flower's SecAgg+ over K = {K} nodes, {graph}, threshold t = {t}: a sum needs t of the shares "
        f"of every node it unmasks, and {t} colluding nodes can unmask a node's input. {rest}"
    )


def scaled_epsilon(privacy, spans):
    """``present -> (m -> epsilon)``: the epsilon of ``privacy``'s settled releases were each sum to carry m
    noise shares; ``spans`` lists (first event, end, shares the settled sum carries) for each sum, None: one
    sum over every event."""
    if privacy is None:
        return None
    privacy.report()  # settles each release with the shares of its least-noised part
    events = list(privacy.ledger.events)

    def at(present: int):
        if present < 1:
            return None
        found = spans if spans is not None else [(0, len(events), present)]

        def eps(m: int) -> float:
            scaled = list(events)
            for a, b, carried in found:
                for i in range(a, b):
                    scaled[i] = dataclasses.replace(events[i], scale=events[i].scale * math.sqrt(m / carried))
            return ledger_epsilon(scaled, privacy.delta, privacy.accountant)[0]

        return eps

    return at


def run_threat(cfg, runs, epsilon_of=None, colluders: int | None = None):
    """The computed threat model of a Flower run's secure sums (:mod:`mechanisms.secagg.threat`), None for
    Flower's SecAgg+: its worst sum (the smallest part a split graph leaves, or the fewest uploaders under
    CKKS), and ``epsilon_of(m)``, the release's epsilon were that sum's part to carry m noise shares.
    ``colluders``: the colluding nodes the nodes' roster declares (their shares are not counted)."""
    if cfg.secure == "mask":
        worst = min(runs, key=lambda r: r.smallest_part)
        inv = {n: u for u, n in worst.roster_index.items()}
        c = int(colluders or 0)
        return masking_threat(
            cfg.clients,
            cfg.secagg_threshold,
            cfg.degree,
            declared_colluders=colluders,
            graph=worst.graph,
            uploaded=[inv[n] for n in worst.uploaded],
            epsilon_of=None if epsilon_of is None else epsilon_of(worst.smallest_part - c),
            refusal_bits=refusal_bits(),
        )
    if cfg.secure == "ckks":
        worst = min(runs, key=lambda r: len(r.uploaded))
        return ckks_threat(
            cfg.clients,
            max(cfg.secagg_threshold, min_threshold(cfg.clients)),
            uploaded=worst.uploaded,
            epsilon_of=None if epsilon_of is None else epsilon_of(len(worst.uploaded)),
            refusal_bits=refusal_bits(),
        )
    return None


def declared_colluders(by_node: dict[int, int]) -> int | None:
    """The colluders the nodes' roster declares, as their setup (or round) replies name it (None: no roster
    named any, e.g. Flower's SecAgg+); ConfigError when the nodes disagree (rosters of different operators)."""
    if len(set(by_node.values())) > 1:
        raise ConfigError(
            "the nodes' rosters disagree on the declared colluders ("
            + ", ".join(f"node {n}: {c}" for n, c in sorted(by_node.items())[:5])
            + "); every node must run with the operator's one roster"
        )
    return next(iter(by_node.values()), None)


def serve_secure(grid, cfg, method, nodes, config_rec, stages, keep_view, received, noise_report=None):
    """Run the secure sums of one aggregation; returns (head, nodes summed, report entries, the decoded sums).

    ``stages`` (name -> Exchange) and ``received`` (the server's view when ``keep_view``) are filled in.
    """
    errors: dict[int, str] = {}
    shapes: dict[int, tuple[int, int]] = {}
    holders: dict[int, bool] = {}
    events: dict[int, list[dict]] = {}
    bounds: dict[int, str] = {}
    colluders: dict[int, int] = {}
    backends: dict[int, str] = {}

    # A masked sum's key advertisements travel with the setup (a round trip fewer): each node answers the
    # setup, then the first sum's keys request beside it (Opening; its refusal there is the keys stage's).
    opening = Opening.make(cfg.clients, cfg.threshold, cfg.degree) if cfg.secure == "mask" else None

    def on_setup(node, content):
        if opening is not None and "meta" in content:
            opening.take(node, content)
        if "error" in content:
            errors[node] = str(content["error"]["message"])
            return
        shapes[node] = (int(content["meta"]["C"]), int(content["meta"]["d"]))
        holders[node] = bool(content["meta"].get("key-holder", False))
        events[node] = json.loads(str(content["meta"].get("events", "[]")))
        bounds[node] = str(content["meta"].get("bounds", ""))
        if "colluders" in content["meta"]:
            colluders[node] = int(content["meta"]["colluders"])
        if BACKEND_KEY in content["meta"]:
            backends[node] = str(content["meta"][BACKEND_KEY])

    contents = {
        n: RecordDict({"config": config_rec, **({} if opening is None else opening.request())}) for n in nodes
    }
    ex = stages["setup"] = exchange(grid, contents, "query.setup", cfg.timeout, on_setup, group_id="setup")
    node_errors(errors, ex.failed, "setup")
    if len(set(shapes.values())) > 1:
        raise ConfigError(
            "the nodes disagree on the shape of their statistics (C, d): "
            + ", ".join(f"node {n}: {s}" for n, s in sorted(shapes.items())[:5])
            + "; every node must use the same backbone (d) and num-classes (C)"
        )
    participants = sorted(shapes)
    if len(participants) < 2:
        late = (
            f"; {len(ex.silent)} of {len(nodes)} nodes did not answer query.setup within {cfg.timeout:g} s "
            f"(silent: {ex.silent[:5]}): raise timeout"
            if ex.silent
            else ""
        )
        raise ConfigError(
            f"secure aggregation needs at least 2 nodes with data, got {len(participants)}{late}"
        )
    C, d = next(iter(shapes.values()))
    if len(set(bounds.values())) > 1:
        raise ConfigError(
            "the nodes' rosters disagree on the public bounds (records per node, means per node, frac-bits); "
            "every node must run with the operator's one roster"
        )
    public = PublicBounds.from_dict(json.loads(b)) if (b := next(iter(bounds.values()), "")) else DEFAULTS
    declared = declared_colluders(colluders)
    if noise_report is not None:
        if (name := agreed_backend(backends)) is not None:  # the nodes drew the shares: the report says how
            noise_report.privacy.set_backend(name, dim=d, num_classes=C)
        noise_report.record(events)

    opened = [opening]
    ckks_params = CKKSParams()  # every CKKS sum below runs with it, and its rounding note reads its grid

    def run(round_name, length, payload, among=None):
        among = participants if among is None else among
        if cfg.secure == "flwr-secaggplus-insecure":
            from privfed.flower.flwr_secagg import flwr_secaggplus_sum

            res = flwr_secaggplus_sum(grid, cfg, among, length=length, C=C, d=d, threshold=cfg.threshold)
        elif cfg.secure == "ckks":
            holder = next((n for n in among if holders.get(n)), among[0])
            res = ckks_sum_over_messages(
                grid,
                among,
                key_holder=holder,
                length=length,
                params=ckks_params,
                timeout=cfg.timeout,
                payload=payload,
                round_name=round_name,
                keep_view=keep_view,
                num_nodes=cfg.clients,
            )
        else:
            first, opened[0] = opened[0], None  # the setup carried the first sum's key advertisements
            res = masked_sum_over_messages(
                grid,
                among,
                opening=first,
                length=length,
                frac_bits=cfg.frac_bits,
                threshold=cfg.threshold,
                timeout=cfg.timeout,
                masked_payload=payload,
                round_name=round_name,
                keep_view=keep_view,
                num_nodes=cfg.clients,
                degree=cfg.degree,
            )
        for k, v in res.stages.items():
            stages[f"{round_name}:{k}"] = v
        received.extend(res.view)
        return res

    def payload(round_name, broadcast=None):
        def f(node):
            out = {"config": config_rec, "round": ConfigRecord({"round": round_name})}
            if broadcast is not None:
                out["broadcast"] = arrays_record(broadcast)
            return out

        return f

    rounds = secure_rounds(method)
    if rounds == ("sums",):
        res = run("sums", sum_vector_length(method, C, d), payload("sums"))
        head = method.aggregate(split_sum_vector(res.total, method, C, d))
        runs = [res]
        variant = "sums"
    else:  # FedCOF's two rounds (App. I.2): the protocol's server folds round 1 and decodes the head
        server = FedCOFServer(method, C, d)
        first, second = rounds
        r1 = run(first, server.lengths[first], payload(first))
        broadcast = server.fold_round1(r1.total)
        # Round 2 runs among the nodes whose round-1 inputs were summed: N_c, mu_c, K_c describe them.
        r2 = run(second, server.lengths[second], payload(second, broadcast), among=sorted(r1.uploaded))
        if set(r2.uploaded) != set(r1.uploaded):
            raise ConfigError(
                "FedCOF's second secure round lost node(s) "
                f"{sorted(set(r1.uploaded) - set(r2.uploaded))} before they uploaded; the spread would "
                "cover fewer nodes than the means, so no head is released; rerun"
            )
        head = server.head(r2.total)
        runs = [r1, r2]
        variant = "two-round protocol (App. I.2)"
    K = len(runs[-1].uploaded)
    if cfg.secure == "flwr-secaggplus-insecure":  # the nodes clipped their records to the public bound
        from mechanisms.dp.clipping import Clipping

        head.feature_transform = Clipping(float(cfg.clip), "l2")
    if noise_report is not None:
        noise_report.settle(
            [len(r.uploaded) for r in runs],
            [[len(p) for p in getattr(r, "parts", [])] or [len(r.uploaded)] for r in runs],
            colluders=declared or 0,
        )
    head.upload_bytes = {"K": K, "measured": "on the wire, every stage (see wire)"}
    head.secure_aggregation = {
        "protocol": cfg.secure,
        "secure_variant": variant,
        "rounds": [r.record() for r in runs],
        "summed_nodes": K,
        "dropped": sorted({n for r in runs for n in r.dropped_before_upload}),
    }
    threat = run_threat(
        cfg,
        runs,
        scaled_epsilon(None if noise_report is None else noise_report.privacy, None),
        colluders=declared,
    )
    if threat is None:
        head.secure_aggregation["threat_model"] = flwr_threat(cfg)
    else:
        head.secure_aggregation["threat_model"] = threat.text()
        head.secure_aggregation["threat"] = threat.as_dict()
        if threat.parts and len(threat.parts) > 1:
            head.notes.append(
                f"secure aggregation: the uploaders' graph split into parts of "
                f"{', '.join(map(str, sorted(threat.parts)))} nodes; the server decodes each part's sum alone"
            )
    if declared and noise_report is not None:
        head.notes.append(
            f"the nodes' roster declares {declared} colluding node(s): a colluder knows its own noise share, so "
            f"epsilon counts the shares of the other summed nodes only ({K - declared} of {K}), as each node "
            "charges its budget"
        )
    if variant != "sums":  # the bounds the nodes check, as their setup replies named them (their roster's)
        head.secure_aggregation["protocol_threat_model"] = fedcof_threat(
            public.max_means(cfg.clients),
            public.max_count(cfg.clients),
            exact=not cfg.private,
            max_ratio=public.fedcof_tilt(),
        )
    # rounding that swamps the statistics is said, as in-process sums say it: masking's fixed point, CKKS's grid
    if cfg.secure in ("mask", "ckks"):
        for i, r in enumerate(runs, start=1):
            call = (
                {"frac_bits": cfg.frac_bits, "uploaded": len(r.uploaded)}
                if cfg.secure == "mask"
                else {"release_bits": ckks_params.precision_bits}
            )
            head.notes.extend(rounding_note(r.total, call, i))
    if any(r.dropped_before_upload for r in runs):
        head.notes.append(
            f"secure aggregation: {len(head.secure_aggregation['dropped'])} node(s) dropped before uploading; "
            f"the head is built from the {K} nodes whose inputs were summed"
        )
    report = {
        "C": C,
        "d": d,
        "participants": len(participants),
        "replied": K,
        "noise_backends": {str(n): b for n, b in sorted(backends.items())},
    }
    return head, K, report, [r.total for r in runs]
