"""What a node holds and computes: its data, its statistics, its noise.

A node's data is either

* its share of the embedded ``digits`` data set, given by Flower's node
  config ``partition-id`` / ``num-partitions`` and split with
  :func:`privfed.federation.partition` exactly as ``fit`` users split it
  (``partition(labels, num_partitions, scheme, alpha=..., rng=seed).apply``),
  so a Flower run and ``privfed.fit`` see the same clients; or
* a feature file of its own (node config ``features=PATH``, a ``.npz`` with
  ``features`` and ``labels``, see :mod:`privfed.data.npzfile`): a natural
  split, one file per site.

Statistics are computed by :func:`privfed.release.pipeline.client_statistics`, the
code ``fit`` runs, on this node's rows only (one client, ``K = 1``), then
bounded and noised by the privacy mechanism's ``before_upload`` with
randomness from the operating system unless the run is a seeded simulation.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass

import numpy as np

from privfed.errors import ConfigError, InputError
from privfed.flower.config import FlowerConfig
from privfed.flower.values import node_int
from privfed.release.pipeline import client_statistics
from privfed.stats import ClientStats

__all__ = [
    "STATS_KEY",
    "NodeData",
    "load_node_data",
    "node_rng",
    "node_statistics",
    "secure_release",
]

#: ``context.state`` records of a node's cached secure-sum statistics (with its noise share) and their key.
STATS_KEY = "privfed-stats"
_STATS_CONFIG = "privfed-stats-config"


@dataclass(frozen=True, eq=False)
class NodeData:
    """One node's training features and labels, and where they came from."""

    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    source: str
    partition_id: int | None = None


@functools.lru_cache(maxsize=4)
def _digits_partition(num_partitions: int, scheme: str, alpha: float, seed: int):
    from privfed.data import load_dataset
    from privfed.federation import partition

    ds = load_dataset("digits")
    part = partition(ds.train_labels, num_partitions, scheme, alpha=alpha, rng=seed)
    F, y, k = part.apply(ds.train_features, ds.train_labels)
    return F, y, k, ds.num_classes


def load_node_data(node_config: dict, cfg: FlowerConfig) -> NodeData:
    """The data of the node described by Flower's ``node_config`` (see the module docstring)."""
    path = node_config.get("features")
    if path:
        return _node_file(str(path), cfg)
    if cfg.dataset.startswith("synthetic:"):
        return _synthetic(node_config, cfg)
    if "partition-id" not in node_config or "num-partitions" not in node_config:
        raise ConfigError(
            "this node has no data: give it node config 'features=PATH' (a .npz feature file) or "
            "'partition-id=i num-partitions=n' for its share of the embedded digits data set"
        )
    if cfg.dataset != "digits":
        raise ConfigError(
            f"dataset={cfg.dataset!r} cannot be partitioned on the nodes; give every node its own "
            "file with node config 'features=PATH'"
        )
    pid = node_int(node_config, "partition-id")
    n = node_int(node_config, "num-partitions", minimum=1)
    if not 0 <= pid < n:
        raise ConfigError(f"partition-id={pid} must lie in 0..num-partitions-1={n - 1}")
    if n != cfg.clients:  # the server would sum clients of n partitions and describe a split into clients
        raise ConfigError(
            f"this node holds digits partition {pid} of num-partitions={n}, but the run config says clients="
            f"{cfg.clients}: the run would use {min(n, cfg.clients)} of the {n} partitions and describe a split "
            f"into {cfg.clients}; set clients={n}, or restart the nodes with num-partitions={cfg.clients}"
        )
    F, y, k, C = _digits_partition(n, cfg.partition, float(cfg.alpha), int(cfg.partition_seed))
    if cfg.num_classes is not None and cfg.num_classes != C:
        raise ConfigError(f"num-classes={cfg.num_classes} but the digits data set has {C} classes")
    rows = k == pid
    return NodeData(F[rows], y[rows], int(C), f"digits partition {pid} of {n}", pid)


def _node_file(path: str, cfg: FlowerConfig) -> NodeData:
    """A node's own ``.npz`` (``features`` (n, d), ``labels`` (n,)): every row is a training record.

    Unlike a whole data set's feature file, a site's file may lack classes, so
    C comes from the run config (``num-classes``), the same on every node.
    """
    import pathlib

    from privfed.data.npzfile import checked_features, checked_ints, read_npz

    where = f"node feature file {path!r}"
    file = pathlib.Path(path).expanduser()
    try:
        st = file.stat()
        arrays = _read_cached(str(file), st.st_mtime_ns, st.st_size)
    except OSError:
        arrays = read_npz(file)  # a missing / unreadable file: read_npz names it
    for required in ("features", "labels"):
        if required not in arrays:
            raise InputError(
                f"{where} has no {required!r} array (it has {sorted(arrays)}); "
                "save it with numpy.savez(path, features=..., labels=...)"
            )
    raw = arrays["features"]
    if cfg.private and raw.ndim == 2 and raw.shape[0] == 0 and raw.shape[1] > 0 and raw.dtype.kind in "biuf":
        # Under DP a site without records still uploads (noised zeros): see node_statistics.
        F = np.zeros((0, raw.shape[1]))
    else:
        F = checked_features(raw, "features", where)
    y = checked_ints(arrays["labels"], "labels", F.shape[0], "features", where)
    if cfg.num_classes is None:
        raise ConfigError(f"nodes with their own feature files need num-classes in the run config ({where})")
    if y.size and (y.min() < 0 or y.max() >= cfg.num_classes):
        raise InputError(
            f"{where} has labels outside 0..{cfg.num_classes - 1} (num-classes={cfg.num_classes})"
        )
    return NodeData(F, y, int(cfg.num_classes), f"file:{path}")


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int, size: int) -> dict:
    """A node's feature file, read once while it is unchanged (the stages of a run reread it)."""
    import pathlib

    from privfed.data.npzfile import read_npz

    arrays = read_npz(pathlib.Path(path))
    for a in arrays.values():
        a.setflags(write=False)
    return arrays


def _synthetic(node_config: dict, cfg: FlowerConfig) -> NodeData:
    """``synthetic:D:N``: N Gaussian samples of dimension D on this node (benchmarks at scale).

    Class c has mean e_{c mod D} * 3; drawn from the partition id and
    the run-config key ``seeds``, so a run is reproducible and every node differs.
    """
    from privfed.flower.config import synthetic_spec

    dim, n = synthetic_spec(cfg.dataset)
    C = 10 if cfg.num_classes is None else int(cfg.num_classes)
    pid = node_int(node_config, "partition-id", default=0)
    rng = np.random.default_rng([int(cfg.partition_seed), pid, 0x5F])
    y = rng.integers(0, C, n)
    F = rng.normal(size=(n, dim))
    F[np.arange(n), y % dim] += 3.0
    return NodeData(F, y, C, f"synthetic {dim}-d, {n} samples, partition {pid}", pid)


def node_rng(cfg: FlowerConfig, node_id: int, purpose: str) -> np.random.Generator:
    """Randomness of one node: OS entropy, or derived from ``noise-seed`` in a seeded simulation."""
    if cfg.noise_seed is None:
        return np.random.default_rng(np.random.SeedSequence(int.from_bytes(os.urandom(32), "little")))
    digest = hashlib.sha256(f"{cfg.noise_seed}:{node_id}:{purpose}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def node_statistics(
    data: NodeData,
    cfg: FlowerConfig,
    rng: np.random.Generator,
    *,
    secure: bool = False,
    backend: str | None = None,
) -> tuple[ClientStats, list[dict]]:
    """This node's upload: clipped statistics with its noise, and the release events it recorded.

    Returns the statistics (``K = 1``) and the privacy ledger's events as
    plain dicts (empty without DP), which the server checks and records.
    Without secure aggregation the node adds the full noise of its own
    release (local placement; nothing with a trusted aggregator); under
    secure aggregation it adds its share sigma^2 / (K - t) of the noise on
    the sum (:func:`privfed.flower.dp.node_share`).

    Under DP a node without records still takes part and uploads noised
    zeros, as every client of ``fit`` does: whether it holds data must not
    show in anything the server receives.  Without DP it is refused.

    ``backend`` is the noise backend the node's operator chose (:func:`privfed.flower.dp.node_backend`;
    None: the mechanism's default, numpy).
    """
    method = cfg.make_method()
    privacy = cfg.make_privacy()
    if privacy is not None and backend is not None and backend != privacy.backend.name:
        privacy.set_backend(backend)
    n = data.features.shape[0]
    if n == 0 and privacy is None:
        raise InputError(
            f"this node ({data.source}) holds no sample; give it data or leave it out of the run"
        )
    zeros = np.zeros(n, dtype=np.int64)
    stats = client_statistics(
        method,
        data.features,
        data.labels,
        zeros,
        num_classes=data.num_classes,
        num_clients=1,
        rng=rng,
        privacy=privacy,
        secure_agg=True if secure else None,
    )
    events: list[dict] = []
    if privacy is not None and secure:
        from privfed.flower.dp import node_share

        return node_share(privacy, stats, method, cfg.clients, rng, cfg.secure)
    if privacy is not None:
        stats = privacy.before_upload(stats, method, rng)
        events = [_event_dict(e) for e in privacy.ledger.events]
    return stats, events


def _event_dict(event) -> dict:
    from dataclasses import asdict

    return {k: v for k, v in asdict(event).items()}


def secure_release(cfg: FlowerConfig, context, config: dict, stage: str, roster=None):
    """This node's statistics (with its noise share under DP) and its release events, cached per run config.

    ``config`` is the run config as the node received it, ``stage`` the stage asking (for refusals).  A
    node deployed with a roster refuses a server-chosen ``noise-seed`` (the server would know the share)
    unless its node config allows seeded noise.  The share is drawn once per configuration and run (the
    server's nonce is left out of the key: a server cannot make a node draw, or reuse, a share by changing
    it) and enters one masked sum per aggregation id (the node's
    :class:`~mechanisms.secagg.masking.node.SessionLedger` refuses a second).  A node with its own feature
    file checks its labels against ``num-classes``, a value the server chooses: with ``roster`` it answers
    for one num-classes, ever (:func:`privfed.flower.ledger.pin_num_classes`), so the check is no dial.
    """
    import json

    from flwr.app import ConfigRecord

    from mechanisms.secagg.crypto import ProtocolAbort
    from privfed.flower.charges import require_dp
    from privfed.flower.ledger import pin_num_classes
    from privfed.flower.wire import stats_from_record, stats_record

    conf = context.node_config
    if roster is not None and conf.get("features"):
        pin_num_classes(context, roster, cfg.num_classes)
    if (
        cfg.private
        and cfg.noise_seed is not None
        and "secagg-roster" in conf
        and str(conf.get("allow-seeded-noise", "")).lower() != "true"
    ):
        raise ProtocolAbort(
            f"node {context.node_id} aborts at stage {stage!r}: the run config sets noise-seed={cfg.noise_seed}, "
            "and a noise share drawn from a seed the server knows is one it can subtract (no DP left); seeded "
            "noise is for simulations (node config allow-seeded-noise=true)",
            node=context.node_id,
            stage=stage,
            deviation="seeded-noise",
        )
    # A node with a lifetime budget charges each run's release, so it draws a fresh share per run (nonce kept).
    budgeted = require_dp(context, cfg, f"a secure {cfg.method} sum", "setup") is not None
    raw = {k: v for k, v in config.items() if k != "run-nonce" or budgeted}
    key = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()
    if STATS_KEY in context.state and context.state[_STATS_CONFIG]["config"] == key:
        return (
            stats_from_record(context.state[STATS_KEY], "this node's cached statistics"),
            json.loads(str(context.state[_STATS_CONFIG]["events"])),
        )
    from privfed.flower.dp import node_backend

    data = load_node_data(conf, cfg)
    backend = node_backend(conf, cfg)
    stats, events = node_statistics(
        data, cfg, node_rng(cfg, context.node_id, "noise"), secure=True, backend=backend
    )
    context.state[STATS_KEY] = stats_record(stats)
    context.state[_STATS_CONFIG] = ConfigRecord({"config": key, "events": json.dumps(events)})
    return stats, events
