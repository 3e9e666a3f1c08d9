"""What a Flower node checks of a run config against its roster before it takes part in a secure sum.

The roster is the operator's: its K sizes each node's noise share, its graph is the SecAgg+ graph and
its bounds fix the fixed-point precision.  A run config that says otherwise is a server's lie, refused
before the node computes anything.
"""

from __future__ import annotations

from mechanisms.secagg.crypto import ProtocolAbort

__all__ = ["check_frac_bits", "check_graph", "check_masking_config", "check_noise_share"]


def check_noise_share(cfg, roster, node: int, stage: str) -> None:
    """Refuse a DP configuration whose K is not the roster's: the node's noise share sigma^2 / (K - tolerance)
    is computed from the configuration, so a server claiming more nodes would make every share too small."""
    if cfg.private and int(cfg.clients) != roster.size:
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: the run config says clients={cfg.clients} but its roster has "
            f"K={roster.size}; its noise share sigma^2/(K - tolerance) would be sized for another number of nodes "
            "(the sum would carry less noise than the reported epsilon needs)",
            node=node,
            stage=stage,
            deviation="wrong-parameters",
        )


def check_graph(cfg, roster, node: int, stage: str) -> None:
    """Refuse a run config whose SecAgg+ degree is not the roster's: the graph is the operator's."""
    if cfg.degree != roster.degree:
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: the run config says degree={cfg.degree} but its roster's "
            f"graph is {'complete' if roster.degree is None else f'{roster.degree}-regular'}; the operator "
            "draws the graph with the roster, so run with the roster's degree",
            node=node,
            stage=stage,
            deviation="wrong-graph",
        )


def check_frac_bits(cfg, roster, node: int, stage: str) -> None:
    """Refuse a run config whose frac-bits are not the roster's: a server varying them would turn the node's
    ring-overflow rule into a dial on its data."""
    if cfg.frac_bits != roster.bounds.frac_bits:
        raise ProtocolAbort(
            f"node {node} aborts at stage {stage!r}: the run config says frac-bits={cfg.frac_bits} but its "
            f"roster fixes frac-bits={roster.bounds.frac_bits}; the operator sets them with the roster",
            node=node,
            stage=stage,
            deviation="wrong-parameters",
        )


def check_masking_config(cfg, roster, node: int, stage: str) -> None:
    """Every check a masking node makes of the run config against its roster (K, graph, frac-bits)."""
    check_noise_share(cfg, roster, node, stage)
    check_graph(cfg, roster, node, stage)
    check_frac_bits(cfg, roster, node, stage)
