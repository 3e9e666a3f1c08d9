"""Multi-round methods on Flower: the loop, with the per-round statistics supplied by the method.

A multi-round method (FedLog with local bodies trained between rounds is the
first) registers what a node computes in round r from the server's
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

__all__ = ["ROUND_STATISTICS", "register_round_statistics", "run_rounds"]

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
