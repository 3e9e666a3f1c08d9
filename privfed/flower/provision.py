"""The simulated operator: a roster and its identities made in the server's process, for simulations only.

A deployment gives each node its identity and roster files in its node config (the operator's
``python -m mechanisms.secagg.identity``).  A simulation makes them here, from OS entropy
(:class:`SimulatedRoster`): the operator and the server are one process.  In an in-process grid the
nodes get them inline in their node configs (:func:`simulated_identities`); on Flower's simulation
runtime the ClientApp carries the roster to every virtual node, and, given a ``directory``, it carries
only that directory's path: the roster and one identity file per node are written there once (mode
0600, as the operator's command writes them), so the app sent with every message stays small (a
thousand nodes' identities are 170 KB, otherwise pickled with each of them).
"""

from __future__ import annotations

import os
import pathlib

from mechanisms.secagg.bounds import PublicBounds
from mechanisms.secagg.identity import Identity, Roster, make_roster
from mechanisms.secagg.threat import sum_threshold
from privfed.flower.kept import parsed

__all__ = ["SimulatedRoster", "simulated_identities"]


class SimulatedRoster:
    """Identities for a simulation: a roster made in this process, node i = partition-id i (or node id).

    Only for simulations, where the operator and the server are one process; a deployment gives each node
    its files (node config).  The simulated operator declares no colluders (so CKKS runs too) and takes the
    default threshold, which tolerates at least one (:func:`mechanisms.secagg.threat.default_threshold`).
    With ``directory`` the roster and identities are written there (``roster.json``, ``node-<i>.json``) and
    read back by the nodes; the caller removes the directory after the simulation.
    """

    def __init__(
        self,
        num_nodes: int,
        threshold: int | None = None,
        node_ids: list[int] | None = None,
        degree: int | None = None,
        bounds: PublicBounds | None = None,
        directory: str | os.PathLike | None = None,
    ) -> None:
        threshold = sum_threshold(num_nodes, threshold, degree)
        roster, ids = make_roster(num_nodes, threshold, 0, degree=degree, bounds=bounds)
        self.size = len(ids)
        self.index = None if node_ids is None else {int(n): i for i, n in enumerate(sorted(node_ids))}
        self.directory = None if directory is None else str(directory)
        self.roster_json = roster.to_json()
        self.identities = [i.to_json() for i in ids]
        if self.directory is not None:
            self.write(self.directory)

    def write(self, directory: str | os.PathLike) -> None:
        """Write the roster and one identity file per node into ``directory`` (files readable by this user
        only, as the operator's command writes them)."""
        out = pathlib.Path(directory)
        (out / "roster.json").write_text(self.roster_json)
        for i, text in enumerate(self.identities):
            fd = os.open(out / f"node-{i}.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> SimulatedRoster:
        """The roster :meth:`write` left in ``directory``, read by the nodes (node i = partition-id i)."""
        folder = pathlib.Path(directory)
        self = cls.__new__(cls)
        self.directory, self.index = str(folder), None
        self.size = len(list(folder.glob("node-*.json")))
        return self

    def __getstate__(self) -> dict:
        """Pickled (with the ClientApp, for every message) without the texts when they are in files."""
        state = dict(self.__dict__)
        if self.directory is not None:
            state.pop("roster_json", None)  # absent in a copy that was itself unpickled
            state.pop("identities", None)
        return state

    def for_node(self, node_config: dict, node_id: int) -> tuple[Identity, Roster] | None:
        if self.index is not None:
            i = self.index.get(int(node_id))
        else:
            from privfed.flower.values import node_int

            i = node_int(node_config, "partition-id") if "partition-id" in node_config else None
        if i is None or not 0 <= int(i) < self.size:
            return None
        if self.directory is not None:
            folder = pathlib.Path(self.directory)
            return parsed(str(folder / f"node-{int(i)}.json"), Identity), parsed(
                str(folder / "roster.json"), Roster
            )
        return parsed(self.identities[int(i)], Identity), parsed(self.roster_json, Roster)


def simulated_identities(
    node_configs: dict[int, dict],
    threshold: int | None = None,
    degree: int | None = None,
    bounds: PublicBounds | None = None,
) -> dict[int, dict]:
    """Node configs with a fresh simulated roster added (``secagg-identity`` / ``secagg-roster`` inline;
    with ``degree`` its SecAgg+ graph; with ``bounds`` its public bounds, e.g. another frac-bits).

    Nodes that already have both keys keep them.  For in-process simulations only, where the operator is
    the server: the nodes also allow plain releases (``allow-plain-release``), seeded noise
    (``allow-seeded-noise``) and a ledger that lives in the run only (``allow-ephemeral-ledger``), which a
    deployed node with a roster refuses, DP releases without a lifetime budget (``allow-unbudgeted-dp``),
    and draw numpy's noise (``noise-backend``) where a deployed node draws OpenDP's.
    """
    if all("secagg-identity" in c and "secagg-roster" in c for c in node_configs.values()):
        return dict(node_configs)
    sim = SimulatedRoster(
        len(node_configs), threshold, node_ids=list(node_configs), degree=degree, bounds=bounds
    )
    out = {}
    for n, c in node_configs.items():
        out[n] = {
            "allow-plain-release": True,
            "allow-seeded-noise": True,
            "allow-ephemeral-ledger": True,
            "noise-backend": "numpy",
            "allow-unbudgeted-dp": True,
            **c,
            "secagg-identity": sim.identities[sim.index[int(n)]],
            "secagg-roster": sim.roster_json,
        }
    return out
