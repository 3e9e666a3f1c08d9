"""Multi-round FedLog with local bodies as a Flower loop (the algorithm of :mod:`privfed.rounds`), with DP.

Run with ``method = "fedlog"`` and ``rounds = R > 1`` (``python -m privfed.flower --method fedlog
--rounds R``).  The server draws the initial head eta (C, d + 1) exactly as
:func:`privfed.rounds.run_rounds` does, and every round

1. broadcasts eta in ``query.round``;
2. each node (client ``partition-id`` of the run's partition, built by :mod:`privfed.rounds`' own set-up
   from its seed) trains its own body for E local epochs against eta (through the clipping the mechanism
   requires) and computes its augmented statistic (class counts and per-class feature sums, d + 1 floats a
   class); the body, its optimiser state and its data-order generator never leave the node: they are kept
   in its ``context.state`` between rounds (serialised with ``torch.save``, so a node restarted between
   rounds, as Flower's deployment engine does, carries on bit for bit);
3. the node runs the client stages of the round's release plan -- the ones ``privfed.rounds`` runs for
   every client in one process -- with the round's :class:`~privfed.rounds.RoundsDP` mechanism: bound its
   upload (``max_records`` records' worth when bodies are trained, or at client level), then
   * ``local`` noise: add the full sigma and reply with the noisy statistic;
   * ``central`` (``trusted-aggregator``): reply with the bounded statistic; the server adds the noise;
   * ``distributed`` (``secure-agg=mask``): add its share sigma^2/(K - t) and keep it; the server then runs
     the round's pairwise-masked sum (``query.keys`` ... ``query.unmask``, round ``fedlog-rounds:r``, the
     broadcast riding in the masked stage so a split head is caught by the consistency round), and the
     node's masked input is that noisy statistic;
4. the server runs the server stages: the sum (folded as replies arrive, or decoded from the masked sum),
   the central noise when it is trusted, the release's privacy events booked in its own copy of the
   mechanism (every node's identical record once; a distributed release settled with the shares that
   reached the sum), and the MAP head of Eq. 15 (:class:`privfed.rounds.release.AugmentedFedLog`).

The heads, the per-round traces' events and so the composed guarantee
(:func:`privfed.rounds.report.rounds_report`) are those of ``run_rounds`` on the same configuration: a
seeded simulation (``noise-seed``) draws each node's noise from the in-process run's one seeded stream
(:data:`privfed.rounds.run.NOISE_STREAM`: node k takes row k of round r's draw), and the server's central
noise from the same stream; a release draws every node's noise from OS entropy.  The rounds' settings
other than ``clients``, ``rounds`` and the DP keys come from the run config's ``rounds-params``.

A node with a lifetime budget (:mod:`privfed.flower.budget`) charges each round's release to it before
its statistic leaves: a plain upload at its own noise, a trusted upload at the server's declared noise, a
masked one at its share (:mod:`privfed.flower.charges`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json

import numpy as np

from mechanisms.secagg.crypto import ProtocolAbort
from privfed.errors import ConfigError
from privfed.flower.checks import rounds_config, rounds_placement
from privfed.stats import ClientStats

__all__ = [
    "C_DIGITS",
    "ROUND_NAME",
    "check_masked_round",
    "formal",
    "keep_share",
    "make_rounds_dp",
    "masked_round_input",
    "masked_round_name",
    "node_round",
    "noise_rng",
    "rounds_config",
    "server_noise_rng",
]

#: The name of a multi-round FedLog round (``query.round``); its masked sums are ``fedlog-rounds:r``.
ROUND_NAME = "fedlog-rounds"
_STATE = "privfed-fedlog-body"
_SHARE = "privfed-fedlog-share"
C_DIGITS = 10


@functools.lru_cache(maxsize=2)
def _setup(rc):
    from privfed.rounds import RoundsSetup

    return RoundsSetup(rc)


def _key(cfg) -> str:
    return hashlib.sha256(json.dumps(cfg.to_wire(), sort_keys=True, default=str).encode()).hexdigest()


def masked_round_name(r: int) -> str:
    return f"{ROUND_NAME}:{int(r)}"


def _eta_digest(eta: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(eta, dtype=np.float64).tobytes()).hexdigest()


def make_rounds_dp(rc):
    """The round's :class:`~privfed.rounds.RoundsDP` (None without DP), as ``run_rounds`` makes it."""
    from privfed.rounds import make_dp

    return make_dp(rc, rounds=rc.rounds, bodies_trained=rc.local_epochs > 0)


def formal(dp) -> bool:
    """Whether the rounds' releases carry a formal guarantee (not Theorem 3.1's bound on trained bodies)."""
    return not (dp.level == "record" and dp.record_bound == "theorem" and dp.bodies_trained)


def noise_rng(cfg, rc, partition: int, round_index: int, node_id: int, size: int) -> np.random.Generator:
    """This node's noise generator for round ``round_index``: OS entropy, or in a seeded simulation the
    in-process run's stream advanced past the draws of earlier rounds and earlier clients (``size`` values
    a client a round)."""
    if cfg.noise_seed is None:
        from privfed.flower.node import node_rng

        return node_rng(cfg, node_id, "noise")
    from privfed.rounds import noise_generator
    from privfed.rounds.run import NOISE_STREAM

    gen = noise_generator(cfg.noise_seed, NOISE_STREAM)
    skip = (round_index * rc.clients + partition) * size
    while skip > 0:  # the same variates as one draw of the whole (K, C, d + 1) array, in chunks
        n = min(skip, 1 << 20)
        gen.standard_normal(n)
        skip -= n
    return gen


def server_noise_rng(cfg) -> np.random.Generator:
    """The server's generator for central noise: the seeded stream of ``run_rounds``, or OS entropy."""
    if cfg.noise_seed is None:
        import os

        return np.random.default_rng(int.from_bytes(os.urandom(32), "little"))
    from privfed.rounds import noise_generator
    from privfed.rounds.run import NOISE_STREAM

    return noise_generator(cfg.noise_seed, NOISE_STREAM)


# ------------------------------------------------------------------------------------------ node
def _train(context, cfg, rc, k: int, eta: np.ndarray, round_index: int, clip_fn) -> np.ndarray:
    """Restore the node's body, train E epochs against eta, keep the body: its statistic (C, d + 1)."""
    import torch
    from flwr.app import ConfigRecord

    from privfed.data.digits import deterministic_torch
    from privfed.rounds import RoundsClient, client_statistic, init_body, train_body

    setup = _setup(rc)
    key = _key(cfg)
    with deterministic_torch():
        x, y, xt, yt = setup.client_data(k)
        client = RoundsClient(
            k, x, y, xt, yt, init_body(setup.families[k], rc.init, rc.seed, k), rc.lr, rc.seed
        )
        if round_index > 0:
            if _STATE not in context.state:
                raise ConfigError(
                    f"node {context.node_id} (partition {k}) has no body from round {round_index - 1} (it "
                    "restarted without its state or missed a round); multi-round FedLog cannot continue on it"
                )
            st = context.state[_STATE]
            if str(st["run"]) != key or int(st["round"]) != round_index - 1:
                raise ConfigError(
                    f"node {context.node_id} (partition {k}) holds the body of round {int(st['round'])} of "
                    f"another run or round; expected round {round_index - 1} of this run"
                )
            saved = torch.load(io.BytesIO(bytes(st["blob"])), weights_only=True)
            client.body.load_state_dict(saved["body"])
            client.opt.load_state_dict(saved["opt"])
            client.gen.set_state(saved["gen"])
        if rc.local_epochs == 0:
            for p in client.body.parameters():
                p.requires_grad_(False)
        if rc.local_epochs > 0:
            train_body(
                client, torch.from_numpy(eta.astype(np.float32)), rc.local_epochs, rc.batch_size, clip_fn
            )
        A = client_statistic(client.body, client.x, client.y, num_classes=setup.C, clip_fn=clip_fn)
        buf = io.BytesIO()
        torch.save(
            {"body": client.body.state_dict(), "opt": client.opt.state_dict(), "gen": client.gen.get_state()},
            buf,
        )
    context.state[_STATE] = ConfigRecord({"blob": buf.getvalue(), "round": int(round_index), "run": key})
    return A


def _stats(A: np.ndarray) -> ClientStats:
    return ClientStats(counts=A[None, :, 0].copy(), sums=A[None, :, 1:].copy())


def node_round(context, cfg, config: dict, broadcast: dict, round_index: int):
    """One round on one node: ``(stats, events)``, stats None when the round's sum is masked.

    Trains against the broadcast head and runs the client stages of the round's release (module
    docstring); a node with a lifetime budget charges a plain or trusted release before returning it, and
    keeps a masked one (:func:`keep_share`) for the masked stage, which charges it.
    """
    from privfed.flower.charges import charge_plain, require_dp
    from privfed.flower.values import node_int
    from privfed.rounds.bodies import FEATURE_DIM
    from privfed.rounds.release import AugmentedFedLog

    rc = rounds_config(cfg)
    if "partition-id" not in context.node_config:
        raise ConfigError(
            "multi-round FedLog needs node config 'partition-id=i num-partitions=n' (the node's "
            "client of the digits partition the rounds use)"
        )
    k = node_int(context.node_config, "partition-id")
    if not 0 <= k < rc.clients:
        raise ConfigError(f"partition-id={k} must lie in 0..clients-1={rc.clients - 1}")
    C, m = C_DIGITS, FEATURE_DIM + 1
    eta = np.asarray(broadcast.get("eta"), dtype=np.float64) if "eta" in broadcast else None
    if eta is None or eta.shape != (C, m) or not np.all(np.isfinite(eta)):
        raise ConfigError(f"the broadcast head must be a finite ({C}, {m}) array 'eta'")
    place = rounds_placement(cfg)
    what = f"round {round_index} of multi-round FedLog ({place} noise)"
    budget = require_dp(context, cfg, what, "round")
    dp = make_rounds_dp(rc)
    if dp is not None and place != "central":  # the node draws the noise: from its operator's backend
        from privfed.flower.dp import node_backend

        dp.use_backend(node_backend(context.node_config, cfg), num_classes=C)
    if budget is not None and not formal(dp):
        raise budget.refuse(
            what,
            "its bodies are trained on the records and Theorem 3.1's bound gives no formal guarantee, which a "
            "lifetime budget cannot charge; run with rounds-params record_bound='upload'",
            "round",
            "no-formal-guarantee",
        )
    conf = context.node_config
    if (
        place == "distributed"
        and cfg.noise_seed is not None
        and "secagg-roster" in conf
        and str(conf.get("allow-seeded-noise", "")).lower() != "true"
    ):
        raise ProtocolAbort(
            f"node {context.node_id} aborts at stage 'round': the run config sets noise-seed={cfg.noise_seed}, and "
            "a noise share drawn from a seed the server knows is one it can subtract; seeded noise is for "
            "simulations (node config allow-seeded-noise=true)",
            node=context.node_id,
            stage="round",
            deviation="seeded-noise",
        )
    A = _train(context, cfg, rc, k, eta, round_index, None if dp is None else dp.clip_tensor)
    if dp is None:
        if cfg.secure == "mask":
            keep_share(context, cfg, config, round_index, eta, A, [])
            return None, []
        return _stats(A), []
    from dataclasses import asdict

    mech, method = dp.mechanism, AugmentedFedLog(nu=rc.nu)
    gen = noise_rng(cfg, rc, k, round_index, context.node_id, C * m)
    if place == "distributed":
        from privfed.flower.dp import node_share

        out, events = node_share(mech, _stats(A), method, rc.clients, gen, "mask")
        keep_share(
            context,
            cfg,
            config,
            round_index,
            eta,
            np.concatenate([out.counts[0][:, None], out.sums[0]], axis=1),
            events,
        )
        return None, events
    mech.check(method, None)
    out = mech.before_upload(_stats(A), method, gen)  # bound; local: add the full sigma
    events = [asdict(e) for e in mech.ledger.events]
    charge_plain(context, cfg, config, out, events, what=what, stage="round", privacy=mech, method=method)
    return out, events


def keep_share(context, cfg, config: dict, round_index: int, eta: np.ndarray, A: np.ndarray, events) -> None:
    """Keep this round's (noisy) statistic for the masked stage of the round's secure sum."""
    from flwr.app import ConfigRecord

    context.state[_SHARE] = ConfigRecord(
        {
            "run": str(config.get("run-nonce", "")) + _key(cfg),
            "round": int(round_index),
            "eta": _eta_digest(eta),
            "A": np.ascontiguousarray(A, dtype=np.float64).tobytes(),
            "shape": list(A.shape),
            "events": json.dumps(events),
        }
    )


def check_masked_round(cfg, round_name: str, broadcast, *, node: int, stage: str) -> int:
    """The round index a masked stage names (ProtocolAbort for a round or broadcast multi-round FedLog does
    not run): checks on the request alone, before the node claims the aggregation id."""

    def abort(deviation: str, text: str) -> ProtocolAbort:
        return ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: {text}", node=node, stage=stage, deviation=deviation
        )

    prefix = ROUND_NAME + ":"
    tail = round_name[len(prefix) :] if round_name.startswith(prefix) else ""
    if not (tail.isdigit() and str(int(tail)) == tail and int(tail) < cfg.rounds):
        raise abort(
            "unknown-round",
            f"the server asks for secure round {round_name!r}, but multi-round FedLog runs "
            f"{prefix}0 .. {prefix}{cfg.rounds - 1}",
        )
    if broadcast is None or set(broadcast) != {"eta"}:
        raise abort(
            "malformed", "a round's masked sum carries the round's broadcast head 'eta' and nothing else"
        )
    return int(tail)


def masked_round_input(context, cfg, config: dict, round_name: str, broadcast, *, node, stage, roster):
    """This node's input to round r's masked sum: the statistic it computed for that round against the same
    head, charged to its budget (at the fewest shares the sum can carry) before it is returned."""
    from privfed.flower.charges import charge_share

    r = check_masked_round(cfg, round_name, broadcast, node=node, stage=stage)
    kept = context.state[_SHARE] if _SHARE in context.state else None
    if (
        kept is None
        or str(kept["run"]) != str(config.get("run-nonce", "")) + _key(cfg)
        or int(kept["round"]) != r
    ):
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: it computed no statistic for round {r} of this run "
            "(query.round comes first)",
            node=node,
            stage=stage,
            deviation="out-of-order",
        )
    if str(kept["eta"]) != _eta_digest(np.asarray(broadcast["eta"], dtype=np.float64)):
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: the head in the masked stage is not the head it trained "
            f"against in round {r}",
            node=node,
            stage=stage,
            deviation="split-broadcast",
        )
    A = np.frombuffer(bytes(kept["A"]), dtype=np.float64).reshape([int(v) for v in kept["shape"]])
    if cfg.private:
        charge_share(
            context,
            cfg,
            config,
            json.loads(str(kept["events"])),
            roster=roster,
            what=f"round {r} of multi-round FedLog (distributed noise)",
            stage=stage,
        )
    del context.state[_SHARE]
    return A.ravel()
