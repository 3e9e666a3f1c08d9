"""The ClientApp: a node computes, protects and sends its own statistics.

Message types it answers (all ``query``; the server sends the run's
:class:`~privfed.flower.config.FlowerConfig` in the message):

``query``            plain release: the node's clipped (and noised) statistics
``query.setup``      secure runs: the public shape (d, C) and that the node has data; under
                     pairwise masking also the first sum's keys request (answered in the same reply)
``query.keys`` ``query.shares`` ``query.masked`` ``query.consistency`` ``query.unmask``
                     the pairwise-masking stages (:mod:`privfed.flower.secagg`, active-adversary
                     version: the node's identity and roster come from its node config,
                     ``secagg-identity`` and ``secagg-roster``; ``secagg-ledger=FILE`` keeps the
                     aggregations it uploaded for across runs)
``query.ckks_keys`` ``query.ckks_encrypt`` ``query.ckks_decrypt``
                     CKKS with this node or another as key holder (:mod:`privfed.flower.ckks`)
``query.round``      one round of a multi-round method (:mod:`privfed.flower.rounds`;
                     multi-round FedLog: :mod:`privfed.flower.fedlog`, under DP too)
``query.budget``     what this node spent of its lifetime privacy budget, in the run and in
                     total, and what it has left (:mod:`privfed.flower.budget`)
``train``            Flower's SecAgg+ stages (``secaggplus_mod``), whose collect stage
                     asks for the node's pre-scaled statistics (:mod:`privfed.flower.flwr_secagg`)

A bad configuration or a node without data is answered with an ``error``
record naming the problem, which the server turns into one clear error.

A node whose node config sets a lifetime budget (``dp-budget-epsilon``, ``dp-budget-delta``,
``dp-budget-ledger``) charges every DP release to it before any value of its data leaves, and
refuses a release that would exceed it, or that carries no DP noise (:mod:`privfed.flower.charges`);
a node deployed with a roster and no budget refuses DP releases unless ``allow-unbudgeted-dp=true``.
Its DP noise comes from the backend its operator sets (``noise-backend=opendp|numpy``; a deployed
node's default is OpenDP when installed, :func:`privfed.flower.dp.node_backend`), named in its replies.

A node whose node config names a roster (``secagg-roster``: deployed for secure
aggregation against a deviating server) refuses every release the server
could read (``query``, a plain ``query.round``, Flower's SecAgg+) unless its operator
adds ``allow-plain-release=true``; in-process simulations allow them.  A round of
multi-round FedLog under ``secure-agg=mask`` is no such release: the node keeps its
(noisy) statistic for the round's masked sum and replies with its release's
parameters only.

Fault injection for drills and tests: node config ``fail-at=STAGE`` makes
the node fail that stage, the first time it reaches it (it answers with a Flower error),
``fail-at=STAGE:exit`` makes the ClientApp process exit without answering
(a crash), where STAGE is ``query``, ``setup``, ``keys``, ``shares``,
``masked``, ``consistency`` or ``unmask``.  A masked run's first keys request
rides the setup, so there ``fail-at=keys`` fires while the node answers the
setup (the run record lists it as silent at keys, having sent no keys), and
``fail-at=keys:exit`` exits during the setup: the node never takes part.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from mechanisms.secagg.crypto import ProtocolAbort
from privfed.errors import PrivfedError
from privfed.flower.charges import (
    budget_reply,
    charge_plain,
    charge_share,
    check_pending,
    no_dp_refusal,
    refuse_registered,
    require_dp,
    session_ids,
    settle_share,
)
from privfed.flower.ckks import ckks_limit, holder_decrypt_step, holder_keys_step, node_encrypt_step
from privfed.flower.config import FlowerConfig, request_config
from privfed.flower.dp import BACKEND_KEY, node_backend
from privfed.flower.kept import KeptClientApp
from privfed.flower.node import load_node_data, node_rng, node_statistics, secure_release
from privfed.flower.protocol import check_round, node_vector
from privfed.flower.provision import SimulatedRoster
from privfed.flower.roster_checks import check_masking_config, check_noise_share
from privfed.flower.rounds import ROUND_STATISTICS, node_round_statistics
from privfed.flower.secagg import (
    KEYS_REFUSAL,
    LEDGER_KEY,
    encode_for_ring,
    node_identity,
    node_ledger,
    node_step,
    ring_limit,
)
from privfed.flower.values import misspelt_node_key, node_int
from privfed.flower.wire import round_index, stats_record

__all__ = ["app", "make_client_app"]


def _answer_keys(keys: Message, out: RecordDict) -> None:
    """Put the reply to a keys request that rode another message into that message's reply ``out``: its key
    advertisement, or its refusal as :data:`KEYS_REFUSAL`; a node told to fail at keys sends neither."""
    if not keys.has_error():
        for k, v in keys.content.items():
            out[KEYS_REFUSAL if k == "error" else k] = v


def _fault(stage: str, msg: Message, context: Context, faults: dict | None) -> Message | None:
    """The failure reply if this node is told to fail this stage (once), or the refusal of a misspelt node key."""
    node_config = context.node_config
    if (misspelt := misspelt_node_key(node_config)) is not None:
        return _error(msg, misspelt)
    spec = node_config.get("fail-at")
    if faults and "partition-id" in node_config:
        try:
            spec = faults.get(node_int(node_config, "partition-id"), spec)
        except PrivfedError:
            pass  # a malformed partition-id is refused, with one line, by the stage's own data loading
    if not spec or _FIRED in context.state:
        return None
    where, _, how = str(spec).partition(":")
    if where != stage:
        return None
    if how == "exit":
        os._exit(17)  # a crash: no reply at all
    context.state[_FIRED] = ConfigRecord({"stage": stage})
    return Message(Error(code=0, reason=f"node told to fail at stage {stage!r} (fail-at)"), reply_to=msg)


_FIRED = "privfed-fault-fired"


def _error(msg: Message, exc: Exception) -> Message:
    return Message(
        RecordDict({"error": ConfigRecord({"message": str(exc), "kind": type(exc).__name__})}), reply_to=msg
    )


def _plain_refused(msg: Message, context: Context, what: str) -> Message | None:
    """The refusal of a release the server could read, by a node deployed for secure aggregation.

    A node whose node config names a roster (``secagg-roster``) takes part in secure sums only: a server
    asking it for its statistics in the clear (a plain ``query`` or ``query.round``) or through Flower's
    SecAgg+ (which a deviating server unmasks) gets this refusal, unless the node's operator allows plain
    releases with ``allow-plain-release=true`` (simulations, where the operator is the server, do).
    """
    conf = context.node_config
    if "secagg-roster" not in conf or str(conf.get("allow-plain-release", "")).lower() == "true":
        return None
    return _error(
        msg,
        ProtocolAbort(
            f"node {context.node_id} refuses {what}: it is deployed for secure aggregation (its node config names "
            "secagg-roster), and the server would read its statistics; run with --secure-agg mask or ckks, or let this "
            "node release in the clear with --node-config 'allow-plain-release=true'",
            stage=what,
            deviation="plain-release",
        ),
    )


def _malformed(msg: Message, context: Context, stage: str, exc: Exception) -> Message:
    """A clean refusal of a request whose fields have the wrong type or are missing (never a traceback)."""
    return _error(
        msg,
        ProtocolAbort(
            f"node {context.node_id} aborts at stage {stage!r}: malformed request "
            f"({type(exc).__name__}: {exc})",
            stage=stage,
            deviation="malformed",
        ),
    )


def _round(msg: Message) -> str:
    return str(msg.content["round"]["round"])


def _broadcast(msg: Message) -> dict | None:
    b = msg.content["broadcast"] if "broadcast" in msg.content else None
    return None if b is None else {k: b[k].numpy() for k in b.keys()}


def _secure_vector(
    msg: Message, cfg: FlowerConfig, context: Context, node: int, stage: str, roster, limit, ckks=False
):
    """The vector this node contributes to the secure sum named in the message's ``round``
    (:func:`privfed.flower.protocol.node_vector`: FedCOF's rounds are its node's; the roster's K and public
    bounds bound a broadcast's K_c and N_c; ``limit`` is the largest value the transport encodes), under DP
    charged to the node's budget first (at the fewest shares the sum can carry)."""
    stats, events = secure_release(cfg, context, dict(msg.content["config"]), stage, roster)
    if cfg.private:
        what = f"a secure {cfg.method} sum ({cfg.secure}, distributed noise)"
        config = dict(msg.content["config"])
        charge_share(context, cfg, config, events, roster=roster, what=what, stage=stage, ckks=ckks)
    return node_vector(
        stats,
        cfg.make_method(),
        _round(msg),
        _broadcast(msg),
        node=node,
        stage=stage,
        num_nodes=roster.size,
        bounds=roster.bounds,
        exact=not cfg.private,
        limit=limit,
    )


def _masked_input(
    msg: Message, cfg: FlowerConfig, config: dict, context: Context, node: int, stage: str, roster
):
    """This node's input to a masked sum: a multi-round FedLog round's statistic, or the method's vector."""
    if cfg.rounds > 1:
        from privfed.flower.fedlog import masked_round_input

        return masked_round_input(
            context, cfg, config, _round(msg), _broadcast(msg), node=node, stage=stage, roster=roster
        )
    return _secure_vector(msg, cfg, context, node, stage, roster, ring_limit(cfg.frac_bits, roster.size))


def make_client_app(
    faults: dict[int, str] | None = None, provision: SimulatedRoster | None = None
) -> KeptClientApp:
    """A ClientApp; ``faults`` maps partition-id -> ``fail-at`` spec (simulation drills); ``provision``
    gives simulated nodes their secure-aggregation identities (deployments read them from the node config)."""
    app = KeptClientApp(make_client_app, (faults, provision))

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        if (failed := _fault("query", msg, context, faults)) is not None:
            return failed
        if (refused := _plain_refused(msg, context, "a plain release")) is not None:
            return refused
        try:
            cfg = request_config(msg.content)
            require_dp(context, cfg, f"a plain {cfg.method} release", "query")
            data = load_node_data(context.node_config, cfg)
            backend = node_backend(context.node_config, cfg)
            stats, events = node_statistics(
                data, cfg, node_rng(cfg, context.node_id, "noise"), backend=backend
            )
            what = f"a plain {cfg.method} release ({'trusted server' if not events else 'local noise'})"
            charge_plain(context, cfg, dict(msg.content["config"]), stats, events, what=what)
        except PrivfedError as exc:
            return _error(msg, exc)
        meta = ConfigRecord(
            {
                "d": int(stats.dim),
                "C": int(stats.num_classes),
                "events": json.dumps(events),
                "partition-id": -1 if data.partition_id is None else int(data.partition_id),
                **({BACKEND_KEY: backend} if events else {}),  # where the noise it added came from
            }
        )
        compact = cfg.wire == "compact"
        record = stats_record(
            stats, held_only=compact and not cfg.private, dtype=np.float32 if compact else np.float64
        )
        return Message(RecordDict({"stats": record, "meta": meta}), reply_to=msg)

    @app.query("round")
    def round_(msg: Message, context: Context) -> Message:
        if (failed := _fault("round", msg, context, faults)) is not None:
            return failed
        try:
            cfg = request_config(msg.content)
            info = msg.content["round"]
            name = str(info["name"])
        except PrivfedError as exc:
            return _error(msg, exc)
        except (KeyError, TypeError) as exc:
            return _malformed(msg, context, "round", exc)
        # A masked multi-round FedLog round is no plain release: the node keeps its (noisy) statistic for the
        # round's masked sum and replies with its release's declared parameters only.
        masked = name == "fedlog-rounds" and cfg.rounds > 1 and cfg.secure == "mask"
        if (
            not masked
            and (refused := _plain_refused(msg, context, "a plain multi-round release")) is not None
        ):
            return refused
        try:
            b = msg.content["broadcast"]
            broadcast = {k: b[k].numpy() for k in b.keys()}
            if name == "fedlog-rounds":
                from privfed.flower.fedlog import node_round

                meta = {}
                if masked:  # the roster's declared colluders: the server's report counts the others' shares
                    identity, roster = node_identity(context.node_config, context.node_id, provision)
                    meta["colluders"] = int(roster.colluders)
                config = dict(msg.content["config"])
                stats, events = node_round(context, cfg, config, broadcast, round_index(info))
                # a masked round's statistic goes into the masked sum only (node_round keeps it there)
                if masked and stats is not None:
                    raise ProtocolAbort(
                        f"node {context.node_id} refuses to send a masked round's statistic in the clear",
                        node=context.node_id,
                        stage="round",
                        deviation="plain-release",
                    )
                if events:  # where the noise it added came from
                    meta[BACKEND_KEY] = node_backend(context.node_config, cfg)
                out = RecordDict({"meta": ConfigRecord({"events": json.dumps(events), **meta})})
                if stats is not None:
                    out["stats"] = stats_record(stats)
                if masked and "secagg" in msg.content:  # the round's masked sum's keys request, beside it
                    _answer_keys(stage_handlers["keys"](msg, context, identity, roster), out)
                return Message(out, reply_to=msg)
            refuse_registered(context, cfg, name, ROUND_STATISTICS)  # no privacy claim, no budget: no noise
            stats = node_round_statistics(name, context, cfg, broadcast, round_index(info))
        except PrivfedError as exc:
            return _error(msg, exc)
        except (KeyError, TypeError) as exc:
            return _malformed(msg, context, "round", exc)
        return Message(RecordDict({"stats": stats_record(stats)}), reply_to=msg)

    @app.query("setup")
    def setup(msg: Message, context: Context) -> Message:
        if (failed := _fault("setup", msg, context, faults)) is not None:
            return failed
        try:
            cfg = request_config(msg.content)
            identity = roster = None
            if cfg.secure in ("mask", "ckks"):  # the identity, roster and ledger file are checked first
                identity, roster = node_identity(context.node_config, context.node_id, provision)
                node_ledger(context, roster)
            stats, events = secure_release(cfg, context, dict(msg.content["config"]), "setup", roster)
        except PrivfedError as exc:
            return _error(msg, exc)
        meta = ConfigRecord(
            {
                "d": int(stats.dim),
                "C": int(stats.num_classes),
                "events": json.dumps(events),
                "key-holder": str(context.node_config.get("key-holder", "")).lower() == "true",
                **({BACKEND_KEY: node_backend(context.node_config, cfg)} if events else {}),
                **(
                    {}
                    if roster is None
                    else {"bounds": json.dumps(roster.bounds.as_dict()), "colluders": int(roster.colluders)}
                ),
            }
        )
        out = RecordDict({"meta": meta})
        if cfg.secure == "mask" and "secagg" in msg.content:  # the first masked sum's keys request, beside it
            _answer_keys(stage_handlers["keys"](msg, context, identity, roster), out)
        return Message(out, reply_to=msg)

    def masking_stage(stage: str):
        def handler(msg: Message, context: Context, identity=None, roster=None) -> Message:
            if (failed := _fault(stage, msg, context, faults)) is not None:
                return failed
            try:
                if roster is None:
                    identity, roster = node_identity(context.node_config, context.node_id, provision)
                kw = {}
                if stage == "masked":
                    cfg = request_config(msg.content)
                    check_masking_config(cfg, roster, identity.index, stage)
                    config = dict(msg.content["config"])
                    if cfg.rounds > 1:
                        from privfed.flower.fedlog import check_masked_round

                        check_masked_round(
                            cfg, _round(msg), _broadcast(msg), node=identity.index, stage=stage
                        )
                    else:
                        check_round(
                            cfg.make_method(), _round(msg), _broadcast(msg), node=identity.index, stage=stage
                        )
                    agg, digest, lifetime = session_ids(context, cfg, config, _round(msg), _broadcast(msg))
                    kw = dict(
                        aggregation=agg,
                        context_digest=digest,
                        ring_input=lambda: encode_for_ring(
                            _masked_input(msg, cfg, config, context, identity.index, stage, roster),
                            cfg.frac_bits,
                            roster.size,
                        ),
                        lifetime=lifetime,
                    )
                check_pending(context, stage)  # a pending charge: its ledger readable before signing
                reply = node_step(msg.content, context, identity, roster, stage=stage, **kw)
                # a pending charge, once t signatures confirmed the uploaders: to the shares they carry
                settle_share(context, stage, roster, identity.index, msg.content)
            except PrivfedError as exc:  # a refusal (a ProtocolAbort too) reaches the server as its message
                return _error(msg, exc)
            except (KeyError, TypeError, OverflowError) as exc:  # a request without its config or round
                return _malformed(msg, context, stage, exc)
            return Message(reply, reply_to=msg)

        handler.__name__ = f"secagg_{stage}"
        return handler

    stage_handlers = {
        stage: masking_stage(stage) for stage in ("keys", "shares", "masked", "consistency", "unmask")
    }
    for stage, handler in stage_handlers.items():
        app.query(stage)(handler)

    @app.query("ckks_keys")
    def ckks_keys(msg: Message, context: Context) -> Message:
        if (failed := _fault("ckks_keys", msg, context, faults)) is not None:
            return failed
        try:
            identity, roster = node_identity(context.node_config, context.node_id, provision)
            ledger = node_ledger(context, roster)
            try:
                reply = holder_keys_step(msg.content, context.state, identity, roster, ledger=ledger)
            finally:
                context.state[LEDGER_KEY] = ConfigRecord(ledger.record())
        except PrivfedError as exc:
            return _error(msg, exc)
        except (KeyError, TypeError, OverflowError) as exc:
            return _malformed(msg, context, "ckks_keys", exc)
        return Message(reply, reply_to=msg)

    @app.query("ckks_encrypt")
    def ckks_encrypt(msg: Message, context: Context) -> Message:
        if (failed := _fault("ckks_encrypt", msg, context, faults)) is not None:
            return failed
        try:
            cfg = request_config(msg.content)
            identity, roster = node_identity(context.node_config, context.node_id, provision)
            check_noise_share(cfg, roster, identity.index, "ckks_encrypt")
            check_round(
                cfg.make_method(), _round(msg), _broadcast(msg), node=identity.index, stage="ckks_encrypt"
            )
            config = dict(msg.content["config"])
            agg, digest, lifetime = session_ids(context, cfg, config, _round(msg), _broadcast(msg))
            ledger = node_ledger(context, roster, lifetime)
            try:  # the vector is computed only once the request checked out and the id is claimed
                reply = node_encrypt_step(
                    msg.content,
                    context.state,
                    identity,
                    roster,
                    values=lambda: _secure_vector(
                        msg,
                        cfg,
                        context,
                        identity.index,
                        "ckks_encrypt",
                        roster,
                        ckks_limit(roster.size),
                        ckks=True,
                    ),
                    ledger=ledger,
                    digest=digest,
                    aggregation=agg,
                )
            finally:
                context.state[LEDGER_KEY] = ConfigRecord(ledger.record())
        except PrivfedError as exc:
            return _error(msg, exc)
        except (KeyError, TypeError, OverflowError) as exc:
            return _malformed(msg, context, "ckks_encrypt", exc)
        return Message(reply, reply_to=msg)

    @app.query("ckks_decrypt")
    def ckks_decrypt(msg: Message, context: Context) -> Message:
        if (failed := _fault("ckks_decrypt", msg, context, faults)) is not None:
            return failed
        try:
            identity, roster = node_identity(context.node_config, context.node_id, provision)
            ledger = node_ledger(context, roster)
            try:
                reply = holder_decrypt_step(msg.content, context.state, identity, roster, ledger=ledger)
            finally:
                context.state[LEDGER_KEY] = ConfigRecord(ledger.record())
        except PrivfedError as exc:
            return _error(msg, exc)
        except (KeyError, TypeError, OverflowError) as exc:
            return _malformed(msg, context, "ckks_decrypt", exc)
        return Message(reply, reply_to=msg)

    @app.query("budget")
    def budget(msg: Message, context: Context) -> Message:
        """What this node spent of its lifetime budget (in the run the config names, and in total), what it
        has left; nothing else: the numbers its releases' declared parameters fix."""
        try:
            reply = budget_reply(context, dict(msg.content["config"]))
        except PrivfedError as exc:
            return _error(msg, exc)
        except (KeyError, TypeError) as exc:
            return _malformed(msg, context, "budget", exc)
        return Message(RecordDict({"budget": ConfigRecord(reply)}), reply_to=msg)

    from flwr.client.mod import secaggplus_mod

    def refuse_secaggplus(msg: Message, context: Context, call_next) -> Message:
        """Before any SecAgg+ stage: a node deployed with a roster takes no part in it (see _plain_refused)."""
        refused = _plain_refused(msg, context, "Flower's SecAgg+ (a deviating server unmasks it)")
        if refused is None and (why := no_dp_refusal(context, "Flower's SecAgg+", "train")) is not None:
            refused = _error(msg, why)
        if refused is None:
            return call_next(msg, context)
        # Flower's SecAgg+ workflow reads a reply's content as its own records: refuse with a Flower error.
        return Message(Error(code=0, reason=str(refused.content["error"]["message"])), reply_to=msg)

    @app.train(mods=[refuse_secaggplus, secaggplus_mod])
    def flwr_secaggplus(msg: Message, context: Context) -> Message:
        """Flower's SecAgg+ collect stage (``secure-agg=flwr-secaggplus``): the node's pre-scaled statistics."""
        from privfed.flower.flwr_secagg import node_train_reply

        return node_train_reply(msg, context)

    return app.seal()


#: The ClientApp ``flwr run`` and ``flower-supernode`` load (``privfed.flower.client_app:app``).
app = make_client_app()
