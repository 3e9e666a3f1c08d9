"""The end-to-end auditor driving the Flower app: a release runner for :func:`privfed.audit.audit_release`.

:func:`flower_release` returns ``run(data, seed) -> dict``: it gives every
client of ``data`` (``features``, ``labels``, ``clients``, ``num_classes``,
``num_clients``, as :func:`privfed.audit.neighbour_battery` builds them) its
own node holding a feature file of its rows (``features=PATH``, the natural
split a deployment uses), runs the real ClientApp and the server's
:func:`~privfed.flower.server_app.serve` over an in-process grid
(:class:`~privfed.flower.local.LocalGrid`: the same message handlers, node
contexts and server fold as under Flower, without the runtime's start-up),
and returns everything the server or the user receives:

``arrays``  each node's upload (local noise), or the noisy aggregate (a
            trusted aggregator), or the decoded secure sums (masking / CKKS);
``meta``    the head's shape, every reply's array shapes, the bytes on the
            wire per stage (up and down), the byte model, the notes, the
            summed nodes and dropouts;
``report``  the privacy report.

A :class:`privfed.errors.PrivfedError` (a refused run, an aborted protocol)
is an output too (:func:`privfed.audit.audit_release` records it).  ``seed``
becomes the run's ``noise-seed``: every draw is a reproducible simulation,
which is what an audit needs (and its report says so).
"""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Callable

import numpy as np

from privfed.flower.config import FlowerConfig
from privfed.flower.local import LocalGrid

__all__ = ["flower_release"]


class _NodeFiles:
    """One feature file per client of a dataset, written once per dataset (draws reuse them)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="privfed-flower-audit-")
        self._written: dict[int, tuple[dict, dict[int, dict]]] = {}

    def nodes(self, data: dict) -> dict[int, dict]:
        key = id(data)
        if key in self._written and self._written[key][0] is data:
            return self._written[key][1]
        F = np.asarray(data["features"], dtype=np.float64)
        y = np.asarray(data["labels"], dtype=np.int64)
        k = np.asarray(data["clients"], dtype=np.int64)
        K = int(data["num_clients"])
        base = pathlib.Path(self._dir.name) / f"d{len(self._written)}"
        base.mkdir()
        nodes = {}
        for c in range(K):
            rows = k == c
            path = base / f"client{c}.npz"
            np.savez(path, features=F[rows], labels=y[rows])
            nodes[1000 + c] = {"features": str(path)}
        self._written[key] = (data, nodes)  # keeps `data` alive, so its id is not reused
        return nodes


def flower_release(
    method: str,
    *,
    epsilon: float,
    clip: float,
    delta: float = 1e-5,
    level: str = "record",
    max_records: int | None = None,
    trusted_aggregator: bool = False,
    secure: str = "none",
    dropout_tolerance: int = 0,
    wire: str = "float64",
    app=None,
    faults: dict[int, str] | None = None,
    method_params: dict | None = None,
) -> Callable[[dict, int], dict]:
    """A release through the Flower app, for :func:`privfed.audit.audit_release` (module docstring).

    ``app`` replaces the ClientApp (any callable ``(Message, Context) ->
    Message``: a tampered node for tests that the auditor catches it);
    ``faults`` maps a client index to a ``fail-at`` spec (a dropout drill).
    """
    from privfed.flower.client_app import make_client_app
    from privfed.flower.server_app import serve

    files = _NodeFiles()
    client_app = (
        app
        if app is not None
        else make_client_app(None if faults is None else {int(c): s for c, s in faults.items()})
    )

    def run(data: dict, seed: int) -> dict:
        nodes = files.nodes(data)
        if faults:
            for c, node_cfg in enumerate(nodes.values()):
                node_cfg["partition-id"] = c  # how make_client_app(faults) finds the node
        cfg = FlowerConfig(
            method=method,
            method_params=dict(method_params or {}),
            clients=len(nodes),
            epsilon=epsilon,
            delta=delta,
            clip=clip,
            level=level,
            max_records=max_records,
            trusted_aggregator=trusted_aggregator,
            secure=secure,
            dropout_tolerance=dropout_tolerance,
            wire=wire,
            num_classes=int(data["num_classes"]),
            noise_seed=None if seed is None else int(seed),
            timeout=30.0,
            connect_timeout=5.0,
        )
        res = serve(LocalGrid(nodes, client_app), cfg, keep_view=True)
        return _server_view(res, cfg)

    return run


def _server_view(res, cfg: FlowerConfig) -> dict:
    head, rep = res.head, res.head.privacy
    uploads = [v for stage, _node, v in _plain_uploads(res.received)]
    sigma = dict(getattr(rep, "sigma", None) or {})
    if cfg.secure != "none" or (rep is not None and rep.placement == "central"):
        arrays = [np.asarray(a, dtype=np.float64) for a in res.sums]
        # central: the noisy aggregate's blocks in statistic order; secure sums: which is which is not stated
        names = (
            [f for f in ("counts", "sums", "second", "class_second") if f in sigma]
            if cfg.secure == "none"
            else [None] * len(arrays)
        )
    else:
        arrays = [np.asarray(a, dtype=np.float64) for up in uploads for a in up.values()]
        names = [k for up in uploads for k in up]  # every node adds the full sigma to its own upload
    noise = tuple((i, float(sigma[b])) for i, b in enumerate(names) if b in sigma and i < len(arrays))
    wire = res.report["wire"]
    shapes = tuple(tuple((k, tuple(np.shape(a))) for k, a in sorted(up.items())) for up in uploads)
    stages = tuple(
        sorted(
            (name, st["answered"], st["bytes_up_total"], st["bytes_down_total"])
            for name, st in wire["stages"].items()
        )
    )
    model = tuple(sorted((str(k), str(v)) for k, v in (head.upload_bytes or {}).items()))
    secure = head.secure_aggregation or {}
    meta = (
        tuple(head.weight.shape),
        shapes,
        stages,
        model,
        tuple(head.notes),
        ("summed", secure.get("summed_nodes"), tuple(secure.get("dropped", ()))),
    )
    return {"arrays": arrays, "meta": meta, "report": rep, "noise": noise}


def _plain_uploads(received: list) -> list:
    """The statistics each node sent in a plain run, in node order (``keep_view`` records them)."""
    ups = [r for r in received if len(r) == 3 and r[0] == "query"]
    return sorted(ups, key=lambda r: r[1])


def halved_noise_nodes():
    """A context in which every node's mechanism adds half the noise it records: a deliberately false report.

    For showing that the auditor catches a broken release (the tests and ``experiments/bench_flower.py``
    use it); never for a run whose report anyone reads.
    """
    from unittest import mock

    from mechanisms import GaussianMechanism

    class HalvedNoise(GaussianMechanism):
        def _add_noise(self, arr, block, sigma, rng):
            return super()._add_noise(arr, block, sigma / 2, rng)

    make = FlowerConfig.make_privacy

    def halved(self):
        mech = make(self)
        if mech is not None:
            mech.__class__ = HalvedNoise
        return mech

    return mock.patch.object(FlowerConfig, "make_privacy", halved)
