"""What a Flower node charges to its lifetime budget for each kind of release, and the ids of its secure sums.

:mod:`privfed.flower.budget` keeps the budget; this module is the ClientApp's side of it: a node with a
budget refuses a release without DP noise (:func:`require_dp`), charges a plain upload its own noise or
the trusted server's declared noise on the sum (:func:`charge_plain`), charges its noise share in a
secure sum at the fewest shares the sum can carry (:func:`charge_share`) and, on masking, settles it to
its part of the uploaders once t signatures confirm them, at the unmask stage (:func:`settle_share`); :func:`session_ids` names each of its
secure releases by run, so that a budgeted node can take part in more than one.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

from privfed.errors import ConfigError, PrivfedError
from privfed.flower.budget import CREATE, BudgetRefusal, NodeBudget, node_budget
from privfed.flower.dp import node_backend

__all__ = [
    "PENDING_KEY",
    "UNBUDGETED",
    "ask_budgets",
    "budget_reply",
    "charge_plain",
    "charge_share",
    "check_pending",
    "no_dp_refusal",
    "released_statistics",
    "refuse_registered",
    "require_dp",
    "run_of",
    "session_ids",
    "settle_share",
    "share_factor",
    "statistic_id",
]


#: ``context.state`` record of a masked release charged at the fewest shares, awaiting its survivors.
PENDING_KEY = "privfed-budget-pending"
#: The node-config key with which a deployed node's operator lets it make DP releases without a budget.
UNBUDGETED = "allow-unbudgeted-dp"


def run_of(config: dict) -> str:
    """The run a release belongs to: the server's nonce in the run config (the same for every message of a run)."""
    return str(config.get("run-nonce", ""))


def require_dp(context, cfg, what: str, stage: str) -> NodeBudget | None:
    """This node's budget (None without one); a node with a budget refuses a release without DP noise, and
    refuses now if its ledger cannot be read.  A deployed node (its node config names a roster) without a
    budget refuses a DP release, unless its operator allows it explicitly (``allow-unbudgeted-dp=true``):
    without a budget nothing bounds what its releases reveal together, and the server names every round."""
    budget = node_budget(context)
    if budget is None:
        if cfg.private and "secagg-roster" in context.node_config and not _allows(context, UNBUDGETED):
            raise BudgetRefusal(
                f"node {context.node_id} refuses {what}: it is deployed (its node config names secagg-roster) "
                "and keeps no lifetime privacy budget, so nothing bounds what its DP releases reveal over runs "
                "(the server names every round); its operator sets dp-budget-epsilon, dp-budget-delta and "
                f"dp-budget-ledger (made once with {CREATE}), or {UNBUDGETED}=true to release without one",
                node=context.node_id,
                stage=stage,
                deviation="no-budget",
            )
        return None
    if not cfg.private:
        raise budget.refuse(
            what,
            "it keeps a lifetime privacy budget (node config dp-budget-*), and a release without DP noise "
            "(epsilon = inf) carries no guarantee the budget can charge; run with a finite epsilon",
            stage,
            "no-dp",
        )
    if cfg.noise_seed is not None and not _allows(context, "allow-seeded-noise"):
        raise budget.refuse(
            what,
            f"the run config sets noise-seed={cfg.noise_seed}, and noise drawn from a seed the server knows is noise "
            "it can subtract: no release its budget could charge; seeded noise is for simulations (node config "
            "allow-seeded-noise=true)",
            stage,
            "seeded-noise",
        )
    budget.ready()
    return budget


def no_dp_refusal(context, what: str, stage: str) -> PrivfedError | None:
    """The refusal of a release that cannot carry DP noise (Flower's SecAgg+) by a node with a budget, or None."""
    try:
        budget = node_budget(context)
    except PrivfedError as exc:  # a node config with part of a budget: refused as it is
        return exc
    if budget is None:
        return None
    return budget.refuse(
        what,
        "it keeps a lifetime privacy budget, and this release carries no DP noise it could charge",
        stage,
        "no-dp",
    )


def refuse_registered(context, cfg, name: str, registered) -> None:
    """Raise the refusal of a round of ``name``, a method in ``registered`` (the registry of
    :func:`privfed.flower.rounds.register_round_statistics`), by a node that would release it under a
    privacy claim.  privfed adds no noise to such a statistic and knows nothing of any its function adds: a
    run with a finite epsilon would claim a guarantee nothing gives, and a node keeping a budget has nothing
    to charge.  A name not registered is left to the registry's own error."""
    if name not in registered:  # no such method: the registry's own error names the registered ones
        return
    what = f"the round statistics of the registered method {name!r}"
    if cfg.private:
        raise ConfigError(
            f"node {context.node_id} refuses {what}: privfed adds no DP noise to a registered method's "
            f"statistics and cannot account for it, so the run's epsilon={cfg.epsilon:g} would be a guarantee "
            "nothing gives; run it with eps inf (no privacy claimed)"
        )
    if (refusal := no_dp_refusal(context, what, "round")) is not None:
        raise refusal


def _allows(context, key: str) -> bool:
    return str(context.node_config.get(key, "")).lower() == "true"


def statistic_id(context, cfg, round_name: str) -> bytes:
    """The lifetime id of a release without DP: the statistic this node computes in ``round_name``, named by
    what determines it and nothing the server may vary beside it.

    That is the statistics the method reads (its ``requires``: a sum-only method's one vector, FedCOF's
    rounds), the round, and the node's data: its own feature file (by content: a new version of the data is
    a new statistic), or the data set and split a simulated node's partition comes from.  Left out: the
    method's name and parameters, clip, level, threshold, frac-bits, the protocol and the timeouts.  A
    parameter that would change what the node computes (FedCOF's means per client) is left out too, so
    a node answers for one statistic of each kind once, ever: a server that varies a parameter only it uses
    (FedCOF's gamma) to start a fresh aggregation cannot ask again (each of FedCOF's round-2 sums under
    other weights would add an equation on the class spreads).
    """
    import hashlib
    import json

    what = {
        "statistics": sorted(cfg.make_method().requires),
        "round": round_name,
        "data": _data_of(context, cfg),
    }
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(b"privfed lifetime statistic without DP\x00" + text.encode()).digest()


def _data_of(context, cfg, *, classes: bool = True):
    """The node's data as its lifetime ids name it: its own feature file by content, or the data set and
    split a simulated node's partition comes from (with num-classes unless ``classes`` is false)."""
    import pathlib

    from privfed.errors import PrivfedError
    from privfed.flower.records import data_fingerprint

    conf = context.node_config
    if conf.get("features"):
        path = pathlib.Path(str(conf["features"])).expanduser()
        try:
            return "records " + data_fingerprint(str(path))
        except (OSError, PrivfedError):
            return f"file {path}"  # unreadable: the release is refused when the node loads it
    return {
        "dataset": cfg.dataset,
        "partition": [cfg.partition, cfg.alpha, cfg.partition_seed, conf.get("partition-id")],
        "num-partitions": conf.get("num-partitions"),
        **({"num-classes": cfg.num_classes} if classes else {}),
    }


def released_statistics(context, cfg, round_name: str) -> dict[str, str]:
    """The statistics of the node's data a secure sum ``round_name`` without DP carries, each keyed (hex) by
    the data and the statistic alone -- not the round, the method, num-classes or anything else the server
    chooses -- so that the same counts summed by fedncm under one roster and by FedCOF's round 1 under
    another have the same key (:func:`privfed.flower.ledger.claim_statistics`)."""
    import hashlib
    import json

    from privfed.flower.protocol import stat_fields
    from privfed.methods.fedcof_protocol import ROUNDS

    method = cfg.make_method()
    if round_name == "sums":
        names = stat_fields(method)
    elif round_name == ROUNDS[0]:
        names = ["counts", "sums", "presence"] + (
            ["inverse counts"] if method.params["noise_var"] > 0 else []
        )
    elif round_name == ROUNDS[1]:
        # the spread around server-chosen means mu_c holds the counts (mu_c's square times n_c) and the class
        # sums (mu_c times s_c) too: alone it releases what round 1 does
        names = ["counts", "sums", "presence", "FedCOF round-2 spread"]
    else:
        names = [f"round {round_name} of {','.join(sorted(method.requires))}"]
    data = json.dumps(_data_of(context, cfg, classes=False), sort_keys=True, default=str)
    out = {}
    for name in names:
        h = hashlib.sha256(b"privfed data statistic without DP\x00" + data.encode() + b"\x00" + name.encode())
        out[h.hexdigest()] = name
    return out


def session_ids(context, cfg, config: dict, round_name: str, broadcast) -> tuple[bytes, bytes, bytes]:
    """(aggregation id, context digest, lifetime id) of a secure sum this node is asked to join.

    Without DP the lifetime id (the ledger file's, across runs) names the statistic the node releases
    (:func:`statistic_id`): each once, ever, whatever else the run config says; it carries the statistics of
    the node's data the sum holds (:func:`released_statistics`), which the ledger refuses to sum again under
    another roster.  Without a budget a DP node
    keeps one release per round for life (the ids name the round alone).  A node with a budget charges every
    release instead, so its ids name the run too: each run is a new release with fresh noise, charged, and
    within a run the aggregation id still admits one upload.  The context digest, which every node signs,
    is the same for all.
    """
    from privfed.flower.secagg import aggregation_digests, lifetime_id

    agg, digest = aggregation_digests(config, round_name, broadcast, cfg.private)
    lifetime = lifetime_id(config, round_name, cfg.private)
    if not cfg.private:
        from privfed.flower.ledger import ReleaseLifetime

        statistics = released_statistics(context, cfg, round_name)
        lifetime = ReleaseLifetime(statistic_id(context, cfg, round_name), statistics)
    if cfg.private and node_budget(context) is not None:
        named = f"{round_name}\x00release of run {run_of(config)}"
        agg = aggregation_digests(config, named, None, False)[0]
        lifetime = lifetime_id(config, named, False)
    return agg, digest, lifetime


def share_factor(cfg, roster, present: int) -> float:
    """How much larger than declared the mu of a distributed release is when ``present`` shares reached its
    sum: sqrt((K - t_drop) / (present - n_C)), n_C the roster's declared colluders (their shares do not count)."""
    honest = int(present) - int(roster.colluders)
    if honest < 1:
        return math.inf
    return math.sqrt((int(cfg.clients) - int(cfg.dropout_tolerance)) / honest)


def charge_share(
    context, cfg, config: dict, events, *, roster, what: str, stage: str, ckks: bool = False
) -> None:
    """Charge this node's noise share in a secure sum (no-op without a budget), before its input is computed.

    Masking releases a sum over at least t survivors (the roster's threshold), CKKS over at least
    ``roster.sum_threshold`` contributions: the charge assumes that many shares, less the declared
    colluders'.  A masking node settles it at the unmask stage (:func:`settle_share`).
    """
    budget = node_budget(context)
    if budget is None:
        return
    from flwr.app import ConfigRecord

    least = roster.sum_threshold if ckks else roster.threshold
    release = os.urandom(12).hex()
    budget.charge(
        release=release,
        run=run_of(config),
        what=what,
        events=list(events),
        stage=stage,
        factor=share_factor(cfg, roster, least),
        simulation=cfg.noise_seed is not None,
        noise=node_backend(context.node_config, cfg) or "",
    )
    if not ckks:
        context.state[PENDING_KEY] = ConfigRecord(
            {"release": release, "K": int(cfg.clients), "tolerance": int(cfg.dropout_tolerance)}
        )


def settle_share(context, stage: str, roster, node: int, content) -> None:
    """After a masking stage succeeded: bind a pending masked charge to its session (``masked``), then at
    ``unmask`` settle it to the shares of this node's part of the uploaders (the uploaders it signed for that
    are connected to it in the roster's graph: what one decodable sum can cover), less the declared
    colluders.

    Only the unmask request proves anything about the sum: the node has then checked that at least t
    members of its group signed the very uploader list it signed (and that every listed uploader signed an
    echo with its masked input), so the server can decode no sum over another list.  The list a
    consistency request names is the server's word alone; a node told there that more nodes uploaded than
    did would settle below what its release cost.  A charge whose session never reached a checked unmask
    request keeps its fewest-shares charge (t less the declared colluders: at least that many shares are in
    any sum the server can decode)."""
    if PENDING_KEY not in context.state:
        return
    from flwr.app import ConfigRecord

    from privfed.flower.secagg import STATE_KEY

    pending = dict(context.state[PENDING_KEY])
    session = bytes(context.state[STATE_KEY]["session"]) if STATE_KEY in context.state else b""
    if stage == "masked" and "session" not in pending:
        context.state[PENDING_KEY] = ConfigRecord({**pending, "session": session})
        return
    if stage != "unmask" or bytes(pending.get("session", b"-")) != session:
        return
    from privfed.flower.masking_wire import from_records

    survivors = {int(v) for v in from_records(content)["uploaded"]}
    part, todo = {int(node)}, [int(node)]
    while todo:
        u = todo.pop()
        for v in roster.graph[u]:
            if v in survivors and v not in part:
                part.add(v)
                todo.append(v)
    honest = len(part) - int(roster.colluders)
    factor = math.inf if honest < 1 else math.sqrt((int(pending["K"]) - int(pending["tolerance"])) / honest)
    budget = node_budget(context)
    if budget is not None:
        budget.settle(str(pending["release"]), factor)
    del context.state[PENDING_KEY]


def check_pending(context, stage: str) -> None:
    """Before a masking stage that follows an upload (``consistency``, ``unmask``): a node with a pending
    masked charge refuses to sign or to reveal shares unless its budget ledger can be read (it could not
    settle, nor show what it spent: it fails closed)."""
    if stage not in ("consistency", "unmask") or PENDING_KEY not in context.state:
        return
    budget = node_budget(context)
    if budget is not None:
        budget.ready()


def charge_plain(
    context, cfg, config: dict, stats, events, *, what: str, stage: str = "query", privacy=None, method=None
) -> None:
    """Charge a plain upload: the node's own noise (``events``), or for a trusted server the central
    release it declares (the event the server's noise on the sum books, from ``privacy``: the run's
    mechanism, by default ``cfg.make_privacy()``)."""
    budget = node_budget(context)
    if budget is None:
        return
    noise = (node_backend(context.node_config, cfg) or "") if events else "trusted server"
    if not events:  # a trusted aggregator adds the noise: charge what it declares, if the operator trusts it
        if not _allows(context, "dp-trust-server"):
            raise budget.refuse(
                what,
                "the run asks for its statistics in the clear, for a server trusted to add the noise, and its "
                "operator has not said it trusts the server (node config dp-trust-server=true): the budget "
                "cannot charge noise the node does not add or see",
                stage,
                "untrusted-server",
            )
        import numpy as np

        privacy = cfg.make_privacy() if privacy is None else privacy
        method = cfg.make_method() if method is None else method
        privacy.check(method, None)
        before = len(privacy.ledger.events)
        # the noise drawn here is discarded: only the event the mechanism books for the sum is read
        privacy.after_aggregate(stats, method, np.random.default_rng())
        events = [asdict(e) for e in privacy.ledger.events[before:]]
    budget.charge(
        release=os.urandom(12).hex(),
        run=run_of(config),
        what=what,
        events=list(events),
        stage=stage,
        simulation=cfg.noise_seed is not None,
        noise=noise,
    )


# ------------------------------------------------------------------------------------------- the report
def budget_reply(context, config: dict) -> dict:
    """A node's answer to ``query.budget``: its budget, what it spent in the run ``config`` names and in
    total, and what it has left -- numbers fixed by the releases' declared parameters, never by its data."""
    if not isinstance(config, dict):
        raise TypeError("query.budget carries the run config")
    budget = node_budget(context)
    if budget is None:
        return {"budgeted": False}
    return budget.status(run_of(config))


def ask_budgets(grid, cfg, nodes: list[int], config_rec, stages: dict) -> dict:
    """The server's ``query.budget`` after a DP run: every node's answer, and the weakest node's.

    A node that keeps no budget says so; one that cannot answer (its ledger unreadable) is listed with its
    reason: the run's release has happened either way, so nothing is raised.
    """
    from flwr.app import RecordDict

    from privfed.flower.transport import exchange

    answers: dict[str, dict] = {}

    def on_reply(node, content):
        if "error" in content:
            answers[str(node)] = {"error": str(content["error"]["message"])}
        else:
            answers[str(node)] = dict(content["budget"])

    contents = {n: RecordDict({"config": config_rec}) for n in nodes}
    ex = stages["budget"] = exchange(grid, contents, "query.budget", cfg.timeout, on_reply, group_id="budget")
    for n, why in ex.failed.items():
        answers[str(n)] = {"error": why}
    kept = {n: a for n, a in answers.items() if a.get("budgeted")}
    out: dict = {"nodes": dict(sorted(answers.items())), "weakest": None}
    if kept:
        n, a = min(kept.items(), key=lambda item: float(item[1]["remaining_epsilon"]))
        out["weakest"] = {
            "node": n,
            "remaining_epsilon": float(a["remaining_epsilon"]),
            "delta": float(a["delta"]),
            "spent_epsilon": float(a["spent_epsilon"]),
            "epsilon": float(a["epsilon"]),
        }
    unbudgeted = sorted(n for n, a in answers.items() if a.get("budgeted") is False)
    if unbudgeted:
        out["note"] = (
            f"{len(unbudgeted)} node(s) keep no lifetime budget (node config dp-budget-*): nothing bounds what "
            "they release over runs but one DP release per round each"
        )
    return out
