"""What a secure sum carries for each method on Flower, and how the server reads the sum.

Sum-only methods (``per_client = False``) securely sum one vector, round
``sums``: every statistic the method requires, flattened in
:data:`privfed.stats.STAT_FIELDS` order.  FedCOF runs its two-round protocol
(FedCOF paper, App. I.2), rounds ``fedcof-1`` and ``fedcof-2``: the node and
server of :mod:`privfed.methods.fedcof_protocol`, the same code
:meth:`privfed.methods.fedcof.FedCOF.secure_aggregate` runs in one process.
:func:`node_vector` is the node's side of every round (a round the method
does not run, or a broadcast the node refuses, aborts it);
:func:`secure_rounds` names the rounds the server runs.
"""

from __future__ import annotations

import numpy as np

from mechanisms.secagg.crypto import ProtocolAbort
from privfed.errors import ConfigError, InputError
from privfed.methods.fedcof_protocol import ROUNDS as FEDCOF_ROUNDS
from privfed.methods.fedcof_protocol import BroadcastRefused, FedCOFNode
from privfed.stats import STAT_FIELDS, ClientStats

__all__ = [
    "check_round",
    "node_vector",
    "secure_rounds",
    "split_sum_vector",
    "stat_fields",
    "stat_shape",
    "sum_vector",
    "sum_vector_length",
]


def stat_fields(method) -> list[str]:
    return [f for f in STAT_FIELDS if f in method.requires]


def stat_shape(name: str, C: int, d: int) -> tuple[int, ...]:
    return {"counts": (C,), "sums": (C, d), "second": (d, d), "class_second": (C, d, d)}[name]


def sum_vector(stats: ClientStats, method) -> np.ndarray:
    """A node's statistics (rows summed) as one flat vector, in STAT_FIELDS order."""
    return np.concatenate([getattr(stats, f).sum(axis=0).ravel() for f in stat_fields(method)])


def sum_vector_length(method, C: int, d: int) -> int:
    return int(sum(np.prod(stat_shape(f, C, d)) for f in stat_fields(method)))


def split_sum_vector(vec: np.ndarray, method, C: int, d: int) -> ClientStats:
    """The summed vector back as a ClientStats with K = 1."""
    out, i = {}, 0
    for f in stat_fields(method):
        shape = stat_shape(f, C, d)
        n = int(np.prod(shape))
        out[f] = vec[i : i + n].reshape((1,) + shape)
        i += n
    if i != vec.size:
        raise InputError(f"a summed vector of length {vec.size} does not match C={C}, d={d}")
    return ClientStats(**out)


def secure_rounds(method) -> tuple[str, ...]:
    """The secure sums ``method`` runs, in order: ``("sums",)`` or its protocol's rounds."""
    if not method.per_client:
        return ("sums",)
    if method.secure_protocol == "fedcof-two-round":
        return FEDCOF_ROUNDS
    raise ConfigError(
        f"method {method.name!r} needs every node's statistics and has no secure protocol; "
        "use a sum-only method or fedcof under secure aggregation"
    )


def check_round(method, round_name: str, broadcast: dict | None, *, node: int, stage: str) -> None:
    """Refuse (:class:`ProtocolAbort`) a secure round ``method`` does not run, or a broadcast where the round
    takes none (or none where it needs one): checks on the request alone, made before the node claims the
    aggregation id and computes its input."""

    def abort(deviation: str, text: str) -> ProtocolAbort:
        return ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: {text}", node=node, stage=stage, deviation=deviation
        )

    rounds = secure_rounds(method)
    if round_name not in rounds:
        raise abort(
            "unknown-round",
            f"the server asks for secure round {round_name!r}, but method {method.name!r} runs {list(rounds)}",
        )
    if round_name == "sums":
        if broadcast is not None:
            raise abort("unexpected-broadcast", "a plain secure sum takes no broadcast")
    elif round_name == FEDCOF_ROUNDS[0]:
        if broadcast is not None:
            raise abort("unexpected-broadcast", "FedCOF's round 1 takes no broadcast")
    elif broadcast is None:
        raise abort("malformed", "FedCOF's round 2 needs the broadcast N_c, mu_c, K_c of round 1")


def node_vector(
    stats: ClientStats,
    method,
    round_name: str,
    broadcast: dict | None,
    *,
    node: int,
    stage: str,
    num_nodes: int | None = None,
) -> np.ndarray:
    """This node's input to the secure sum ``round_name`` (flat), or a :class:`ProtocolAbort` naming it.

    A node answers only the rounds its method runs (a server asking a FedCOF node for a plain
    ``sums`` vector, or a sum-only method's node for a FedCOF round, is refused), a broadcast only in
    FedCOF's round 2 (:func:`check_round`), and refuses a broadcast that fails
    :meth:`FedCOFNode.check_broadcast`.  ``num_nodes`` (the roster's K, which the server cannot change)
    bounds every K_c of the broadcast by K times the method's means per node.
    """
    check_round(method, round_name, broadcast, node=node, stage=stage)
    if round_name == "sums":
        return sum_vector(stats, method)
    per_node = int(method.params.get("means_per_client") or 1)
    fed = FedCOFNode.from_stats(stats, method, max_means=None if num_nodes is None else num_nodes * per_node)
    if round_name == FEDCOF_ROUNDS[0]:
        return fed.round1()
    try:
        return fed.round2(broadcast).ravel()
    except BroadcastRefused as exc:
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: it refuses FedCOF's round-2 broadcast: {exc}",
            node=node,
            stage=stage,
            deviation=exc.deviation,
        ) from None
