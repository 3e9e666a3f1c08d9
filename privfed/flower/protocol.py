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
    "refusal_bits",
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


def refusal_bits() -> int:
    """What a node's refusals can reveal of its data, in bits, ever (per version of its data).

    The checks that read a node's data take no value the server may vary (K, t, the graph, frac-bits and
    the public bounds are the roster's; num-classes is pinned in the node's ledger at its first run; the
    FedCOF broadcast is checked against public values only, and a round-2 spread beyond the encodable
    range is clipped and counted in the sum, never refused), so asking again gets the same answer: one
    bit for whether the node's data loads (finite features, labels below num-classes, records at all
    without DP), one per statistic the node can be asked to encode for each of the two encodings (the
    2^64 ring at the roster's frac-bits, the CKKS bound): every sum-only method's vector and FedCOF's
    round 1 with and without its noise-aware values, and one for its single DP release (the aggregation
    id under DP is the round alone, claimed before the input is computed).
    """
    from privfed import methods as _methods

    sum_only = [m for m in _methods.available() if not _methods.get(m).per_client]
    kinds = len(sum_only) + 2  # + FedCOF's round 1, plain and noise-aware
    return 1 + 2 * kinds + 1


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
    bounds=None,
    exact: bool | None = None,
    limit: float | None = None,
) -> np.ndarray:
    """This node's input to the secure sum ``round_name`` (flat), or a :class:`ProtocolAbort` naming it.

    A node answers only the rounds its method runs (a server asking a FedCOF node for a plain
    ``sums`` vector, or a sum-only method's node for a FedCOF round, is refused), a broadcast only in
    FedCOF's round 2 (:func:`check_round`), and refuses a broadcast that fails
    :meth:`FedCOFNode.check_broadcast`, whose rules read the broadcast and public values only:
    ``bounds`` (the roster's :class:`mechanisms.secagg.bounds.PublicBounds`) with ``num_nodes`` (the
    roster's K) bound K_c by K times the means per node, N_c by K times the records per node and by K_c
    times them, and the ratio of the class weights by the roster's weight ratio, never values the server
    sends; ``exact`` says the run's counts carry no DP noise; ``limit`` is the largest
    round-2 value the transport encodes (values beyond are clipped and counted, never refused).
    """
    check_round(method, round_name, broadcast, node=node, stage=stage)
    if round_name == "sums":
        return sum_vector(stats, method)
    K = num_nodes
    fed = FedCOFNode.from_stats(
        stats,
        method,
        max_means=None if K is None or bounds is None else bounds.max_means(K),
        max_count=None if K is None or bounds is None else bounds.max_count(K),
        exact=exact,
        limit=limit,
        max_records=None if bounds is None else bounds.max_records,
        max_ratio=None if bounds is None else bounds.weight_ratio,
    )
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
