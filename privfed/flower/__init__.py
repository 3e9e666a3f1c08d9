"""privfed on Flower: every method as a Flower app, in simulation and across machines.

Flower carries the messages; privfed computes the statistics, the noise and
the secure-aggregation protocol.  A node (:mod:`privfed.flower.client_app`)
computes its :class:`~privfed.stats.ClientStats` with the code ``fit`` runs,
clips and noises them with OS entropy and replies; the server
(:mod:`privfed.flower.server_app`) waits for the expected nodes, folds the
replies as they arrive and builds the head with the method's ``aggregate``.
Secure aggregation runs privfed's pairwise masking as message stages
(:mod:`privfed.flower.secagg`), CKKS with a node as the key holder
(:mod:`privfed.flower.ckks`) or Flower's own SecAgg+ workflow
(:mod:`privfed.flower.flwr_secagg`); with DP the nodes add distributed noise
shares (:mod:`privfed.flower.dp`).  Multi-round FedLog runs as a Flower loop, under DP too
(:mod:`privfed.flower.fedlog`, :mod:`privfed.flower.rounds`); a node can keep a lifetime privacy
budget that every release it makes is charged to (:mod:`privfed.flower.budget`,
:mod:`privfed.flower.charges`); :mod:`privfed.flower.audit` lets
:func:`privfed.audit.audit_release` drive the app over the in-process grid
(:mod:`privfed.flower.local`).

Routes:

* ``python -m privfed.flower --method fedcof --clients 20`` (simulation);
* ``flwr run`` on the app in ``privfed/flower/app`` against a SuperLink and
  SuperNodes started with ``flower-superlink`` / ``flower-supernode``.

Needs the optional extra: ``pip install privfed[flower]``.
"""

from __future__ import annotations

import importlib

__all__ = ["FlowerConfig", "FlowerResult", "run_simulation", "serve"]

#: public name -> module; imported on first use, so ``python -m privfed.flower --help`` needs no Flower import.
_LAZY = {
    "FlowerConfig": "privfed.flower.config",
    "FlowerResult": "privfed.flower.server_app",
    "serve": "privfed.flower.server_app",
    "run_simulation": "privfed.flower.simulation",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'privfed.flower' has no attribute {name!r}")
    try:
        import flwr  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        from privfed.errors import MissingDependencyError

        raise MissingDependencyError(
            "privfed.flower needs Flower; install it with: pip install 'privfed[flower]'"
        ) from exc
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
