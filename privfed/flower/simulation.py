"""Run a privfed Flower app on Flower's simulation engine, in this process.

:func:`run_simulation` starts Flower's simulation runtime (Ray) with
``clients`` virtual SuperNodes, each holding ``partition-id`` /
``num-partitions`` of the embedded data set (and, for ``secure=mask``,
the identity of roster index ``partition-id`` in a roster made here from OS
entropy: the simulated operator), runs the ServerApp of
:mod:`privfed.flower.server_app` in this process and returns its
:class:`~privfed.flower.server_app.FlowerResult`.
"""

from __future__ import annotations

import logging
import os
import tempfile

from mechanisms.secagg.bounds import PublicBounds
from privfed.errors import ConfigError, PrivfedError
from privfed.flower.client_app import make_client_app
from privfed.flower.config import FlowerConfig
from privfed.flower.provision import SimulatedRoster
from privfed.flower.server_app import FlowerResult, make_server_app

__all__ = ["run_simulation"]


def run_simulation(
    cfg: FlowerConfig | list[FlowerConfig],
    *,
    num_supernodes: int | None = None,
    faults: dict[int, str] | None = None,
    keep_view: bool = False,
    num_cpus: int = 1,
    verbose: bool = False,
) -> FlowerResult:
    """Simulate ``cfg.clients`` nodes (or ``num_supernodes``) and return the server's result.

    Parameters
    ----------
    cfg : FlowerConfig or list of FlowerConfig
        A list runs one aggregation after the other in the same simulation
        (one start-up) and returns a list with, per config, its result or the
        :class:`~privfed.errors.PrivfedError` it raised.
    num_supernodes : int, optional
        Virtual nodes to start (default ``cfg.clients``); fewer than
        ``cfg.clients`` exercises the server's connect timeout.
    faults : dict, optional
        partition-id -> ``fail-at`` spec (see :mod:`privfed.flower.client_app`).
    keep_view : bool
        Keep everything the server received (for audits and tests).
    num_cpus : int
        CPUs Ray may use (one ClientApp at a time per CPU).
    """
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from flwr.simulation import run_simulation as _flwr_run_simulation

    cfgs = cfg if isinstance(cfg, list) else [cfg]
    results: list = []
    server = make_server_app(cfg, keep_view=keep_view, results=results)
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    # The simulated operator's roster and identity files live in a directory of their own for the
    # simulation (the ClientApp, sent with every message, carries its path only), removed at the end.
    with tempfile.TemporaryDirectory(prefix="privfed-roster-") as folder:
        client = make_client_app(faults, provision=_roster(cfgs, num_supernodes, folder))
        _flwr_run_simulation(
            server_app=server,
            client_app=client,
            num_supernodes=int(
                num_supernodes if num_supernodes is not None else max(c.clients for c in cfgs)
            ),
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": int(num_cpus), "num_gpus": 0, "include_dashboard": False},
            },
            verbose_logging=verbose,
        )
    if len(results) != len(cfgs):
        raise PrivfedError("the simulation ended without a result from the server; see the log above")
    return results if isinstance(cfg, list) else results[0]


def _roster(
    cfgs: list[FlowerConfig], num_supernodes: int | None, folder: str | None = None
) -> SimulatedRoster | None:
    """The simulated operator's roster (written to ``folder``): one per simulation, so every masked config
    must share K, t and the SecAgg+ degree (the graph is drawn here, from OS entropy, with the roster)."""
    masked = [c for c in cfgs if c.secure in ("mask", "ckks")]
    if not masked:
        return None
    ktk = {
        (c.clients, c.secagg_threshold, c.degree, c.frac_bits if c.secure == "mask" else None) for c in masked
    }
    fixed = {k[3] for k in ktk if k[3] is not None}
    ktk = {k[:3] + (max(fixed) if fixed else None,) for k in ktk}
    if len(ktk) > 1 or len(fixed) > 1:
        raise ConfigError(
            "one simulation has one roster: the masked configurations ask for (K, t, degree, frac-bits) in "
            f"{sorted(ktk, key=str)}; run them in separate simulations"
        )
    ((K, t, degree, f),) = ktk
    return SimulatedRoster(
        K, t, degree=degree, bounds=None if f is None else PublicBounds(frac_bits=f), directory=folder
    )
