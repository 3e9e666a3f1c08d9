"""Multi-round FedLog with local bodies as a Flower loop (the algorithm of :mod:`privfed.rounds`).

Run with ``method = "fedlog"`` and ``rounds = R > 1`` (``python -m
privfed.flower --method fedlog --rounds R``).  The server draws the initial
head eta (C, d + 1) exactly as :func:`privfed.rounds.run_rounds`
does, and every round

1. broadcasts eta in ``query.round`` (:func:`privfed.flower.rounds.run_rounds`);
2. each node (client ``partition-id`` of the run's partition, built by
   :mod:`privfed.rounds`' own set-up from its seed) trains its own
   body for E local epochs against eta and replies with its augmented
   statistic (class counts and per-class feature sums, d + 1 floats a class);
   the body, its optimiser state and its data-order generator never leave
   the node: they are kept in its ``context.state`` between rounds
   (serialised with ``torch.save``, so a node restarted between rounds, as
   Flower's deployment engine does, carries on bit for bit);
3. the server folds the replies into their sum and solves the MAP head of
   Eq. 15 with :class:`privfed.methods.fedlog.FedLog`, the solver
   ``run_rounds`` uses.

The node and server code reuse ``privfed.rounds``' body set-up,
training step and feature extraction, under its deterministic torch
settings, so the heads of every round equal ``run_rounds``' for the same
seed and partition.  The rounds' settings other than ``clients`` and
``rounds`` (``local_epochs``, ``batch_size``, ``lr``, ``families``,
``init``, ``partition``, ``classes_per_client``, ``alpha``, ``seed``) come
from the run config's ``rounds-params`` (a JSON object of
:class:`privfed.rounds.RoundsConfig` fields).  DP noise over rounds
is not offered on Flower yet (the run is refused); ``privfed.rounds``
simulates its placements in one process.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math

import numpy as np

from privfed.errors import ConfigError
from privfed.flower.checks import rounds_config
from privfed.stats import ClientStats

__all__ = ["ROUND_NAME", "rounds_config", "serve_fedlog_rounds"]

#: The name the per-round statistic is registered under (:mod:`privfed.flower.rounds`).
ROUND_NAME = "fedlog-rounds"
_STATE = "privfed-fedlog-body"


@functools.lru_cache(maxsize=2)
def _setup(rc):
    from privfed.rounds import RoundsSetup

    return RoundsSetup(rc)


def _key(cfg) -> str:
    return hashlib.sha256(json.dumps(cfg.to_wire(), sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------------------------------ node
def node_round(context, cfg, broadcast: dict, round_index: int) -> ClientStats:
    """One round on one node: restore its body, train E epochs against eta, reply with its statistic."""
    import torch
    from flwr.app import ConfigRecord

    from privfed.data.digits import deterministic_torch
    from privfed.rounds import RoundsClient, init_body, train_body
    from privfed.rounds.bodies import FEATURE_DIM, client_features

    rc = rounds_config(cfg)
    if "partition-id" not in context.node_config:
        raise ConfigError(
            "multi-round FedLog needs node config 'partition-id=i num-partitions=n' (the node's "
            "client of the digits partition the rounds use)"
        )
    k = int(context.node_config["partition-id"])
    if not 0 <= k < rc.clients:
        raise ConfigError(f"partition-id={k} must lie in 0..clients-1={rc.clients - 1}")
    eta = np.asarray(broadcast["eta"], dtype=np.float64)
    setup = _setup(rc)
    C, m = setup.C, FEATURE_DIM + 1
    if eta.shape != (C, m):
        raise ConfigError(f"broadcast head has shape {eta.shape}, expected {(C, m)}")
    key = _key(cfg)
    with deterministic_torch():
        x, y, xt, yt = setup.client_data(k)
        client = RoundsClient(
            k, x, y, xt, yt, init_body(setup.families[k], rc.init, rc.seed, k), rc.lr, rc.seed
        )
        if round_index > 0:
            if _STATE not in context.state:
                raise ConfigError(
                    f"node {k} has no body from round {round_index - 1} (it restarted without its "
                    "state or missed a round); multi-round FedLog cannot continue on it"
                )
            st = context.state[_STATE]
            if str(st["run"]) != key or int(st["round"]) != round_index - 1:
                raise ConfigError(
                    f"node {k} holds the body of round {int(st['round'])} of another run or round; "
                    f"expected round {round_index - 1} of this run"
                )
            saved = torch.load(io.BytesIO(bytes(st["blob"])), weights_only=True)
            client.body.load_state_dict(saved["body"])
            client.opt.load_state_dict(saved["opt"])
            client.gen.set_state(saved["gen"])
        if rc.local_epochs == 0:
            for p in client.body.parameters():
                p.requires_grad_(False)
        if rc.local_epochs > 0:
            train_body(client, torch.from_numpy(eta.astype(np.float32)), rc.local_epochs, rc.batch_size, None)
        Fk = client_features(client.body, client.x, None)
        yk = client.y.numpy()
        buf = io.BytesIO()
        torch.save(
            {"body": client.body.state_dict(), "opt": client.opt.state_dict(), "gen": client.gen.get_state()},
            buf,
        )
    context.state[_STATE] = ConfigRecord({"blob": buf.getvalue(), "round": int(round_index), "run": key})
    counts = np.bincount(yk, minlength=C).astype(np.float64)
    sums = np.zeros((C, m - 1))
    for cls in np.unique(yk):
        sums[cls] = Fk[yk == cls].sum(axis=0)
    return ClientStats(counts=counts[None], sums=sums[None])


# ------------------------------------------------------------------------------------------ server
def serve_fedlog_rounds(grid, cfg, nodes: list[int]):
    """The server's loop; returns (last head, per-round heads' eta, per-round exchanges, the rounds config)."""
    from privfed.flower.rounds import run_rounds
    from privfed.methods.fedlog import FedLog
    from privfed.rounds import FEATURE_DIM, head_eta

    rc = rounds_config(cfg)
    method = FedLog(nu=rc.nu)
    C, m = 10, FEATURE_DIM + 1
    scale = rc.head_init_scale if rc.head_init_scale is not None else 1.0 / math.sqrt(m)
    eta0 = np.random.default_rng([rc.seed, 0x4EAD]).uniform(-scale, scale, size=(C, m))
    heads: list = []

    def step(r, total):
        head = method.aggregate(total)
        heads.append(head)
        return {"eta": head_eta(head)} if r + 1 < rc.rounds else None

    stages = run_rounds(
        grid, cfg, nodes, name=ROUND_NAME, first={"eta": eta0}, step=step, max_rounds=rc.rounds
    )
    return heads, stages, rc


def _register() -> None:
    from privfed.flower.rounds import register_round_statistics

    register_round_statistics(ROUND_NAME, context=True)(node_round)


_register()
