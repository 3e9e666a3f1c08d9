"""Distributed Gaussian noise under secure aggregation on Flower: a node's share, the server's report.

``privfed.fit`` with ``privacy=GaussianMechanism(...)`` and a secure-sum
protocol has every one of the K clients add N(0, sigma^2 / (K - t)) to its
statistics before masking or encryption (t the mechanism's
``dropout_tolerance``), so that the K - t shares the protocol tolerates
carry sigma^2 between them; the report is computed from the shares that
actually entered the sum (:meth:`GaussianMechanism.report` settles each
distributed release with the number of uploaders).

On Flower the two halves live in different processes:

* a node (:func:`node_share`) bounds its statistics (client level), adds its
  share with its own randomness (OS entropy, or ``noise-seed`` in a seeded
  simulation) and returns the release events its mechanism recorded;
* the server (:class:`SecureNoiseReport`) checks that every node recorded the
  same release, records it once in its own mechanism's ledger, and once the
  secure sums are known, settles it with the number of nodes whose input was
  summed, less the colluders the nodes' roster declares (their shares protect
  nothing against the server they collude with) -- the same ledger, hence the
  same report, as ``fit`` with the same mechanism, protocol and dropout pattern.

Both halves call the mechanism's own code for the two halves of the release
it makes in ``fit``: :meth:`GaussianMechanism.node_release` (bound, add the
share, book the release) on the node and :meth:`GaussianMechanism.book_distributed`
on the server (its settlement is the one ``report`` makes for ``fit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from privfed.errors import ConfigError
from privfed.stats import ClientStats

__all__ = [
    "BACKEND_KEY",
    "SecureNoiseReport",
    "agreed_backend",
    "node_backend",
    "node_share",
    "opendp_installed",
]

#: The node-config key with which a node's operator chooses where its noise comes from.
BACKEND_KEY = "noise-backend"
_BACKENDS = ("opendp", "numpy")


def opendp_installed() -> bool:
    """Whether OpenDP (the ``secure-noise`` extra, in ``all``) can be imported here."""
    import importlib.util

    return importlib.util.find_spec("opendp") is not None


def node_backend(node_config: dict, cfg) -> str | None:
    """The noise backend this node draws its DP noise from (None without DP): its operator's choice.

    ``noise-backend=opendp`` (exact discrete-Gaussian samplers from the OS CSPRNG on a 2^-10 grid,
    :class:`mechanisms.dp.backends.OpenDPNoise`) or ``noise-backend=numpy`` (float64 noise, open to
    floating-point attacks on the released values).  Unset, a deployed node -- one with a roster
    (``secagg-roster``) or a lifetime budget (``dp-budget-*``) -- draws from OpenDP when it is installed,
    any other node from numpy.  A seeded simulation (``noise-seed``) draws from numpy whatever is set: its
    noise is the seed's (OpenDP cannot replay a seed), and the run says it is a simulation.
    """
    if not cfg.private:
        return None
    chosen = node_config.get(BACKEND_KEY)
    if chosen is not None:
        chosen = str(chosen).strip().lower()
        if chosen not in _BACKENDS:
            raise ConfigError(
                f"node config {BACKEND_KEY}={node_config.get(BACKEND_KEY)!r} is not a noise backend; set "
                f"{BACKEND_KEY}=opendp (exact samplers, for releases) or {BACKEND_KEY}=numpy"
            )
    if cfg.noise_seed is not None:
        return "numpy"
    if chosen == "opendp" and not opendp_installed():
        raise ConfigError(
            f"node config {BACKEND_KEY}=opendp needs the opendp package on this node: install privfed[secure-noise]"
        )
    if chosen is not None:
        return chosen
    deployed = "secagg-roster" in node_config or any(k.startswith("dp-budget-") for k in node_config)
    return "opendp" if deployed and opendp_installed() else "numpy"


def agreed_backend(by_node: dict[int, str]) -> str | None:
    """The one noise backend the nodes that drew noise name (None if none did); ConfigError if they differ.

    The nodes' releases must be one release for the server to book (the same events), and a rounding
    backend's slack changes them: every node's operator sets the same ``noise-backend``.
    """
    names = {str(v) for v in by_node.values()}
    if len(names) > 1:
        raise ConfigError(
            "the nodes draw their noise from different backends ("
            + ", ".join(f"node {n}: {b}" for n, b in sorted(by_node.items())[:6])
            + f"); one release needs one: every node's operator sets the same node config {BACKEND_KEY}"
        )
    return next(iter(names), None)


@dataclass
class _Run:
    """What :meth:`GaussianMechanism._settle_secure` reads of a secure-sum run: one record per sum."""

    calls: list[dict] = field(default_factory=list)


class _SecureProtocol:
    """Stands for the Flower secure-sum protocol in the mechanism's checks and settlement.

    ``noise`` is ``None``: the mechanism's own noise is split across the nodes
    (a protocol carrying its own noise would be refused by ``check``).
    """

    noise = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.last_run: _Run | None = None


def node_share(
    privacy, stats: ClientStats, method, num_clients: int, rng: np.random.Generator, protocol: str
) -> tuple[ClientStats, list[dict]]:
    """A node's statistics with its noise share sigma^2 / (K - t), and the release events recorded.

    ``privacy`` has clipped the records already (``client_statistics``); at
    client level the node's contribution is first bounded to ``max_records``
    records' worth, as ``before_upload`` does for every client in ``fit``.
    """
    privacy.check(method, _SecureProtocol(protocol))
    out = privacy.node_release(stats, num_clients, rng)
    return out, [_event_dict(e) for e in privacy.ledger.events]


def _event_dict(event) -> dict:
    from dataclasses import asdict

    return dict(asdict(event))


class SecureNoiseReport:
    """The server's side: record the nodes' distributed release once, settle it with the uploaders.

    Usage::

        rep = SecureNoiseReport(privacy, method, "mask", num_clients=K)
        rep.record(events_by_node)          # after setup: every node's events
        ...                                 # the secure sums
        rep.settle([len(r.uploaded) for r in sums])
        privacy.report()                    # fit's report for the same run
    """

    def __init__(self, privacy, method, protocol: str, *, num_clients: int) -> None:
        self.privacy = privacy
        self.protocol = _SecureProtocol(protocol)
        privacy.check(method, self.protocol)
        self.num_clients = int(num_clients)
        self._rid: int | None = None

    def record(self, events: dict[int, list[dict]]) -> None:
        strip = [[{k: v for k, v in e.items() if k != "release_id"} for e in ev] for ev in events.values()]
        if not strip or not strip[0]:
            raise ConfigError("no node reported its noise share; a DP secure run needs every node's release")
        if any(s != strip[0] for s in strip):
            raise ConfigError(
                "the nodes report different privacy releases; every node must run the same mechanism"
            )
        self.privacy.book_distributed(strip[0], self.num_clients, self.protocol)
        self._rid = len(self.privacy.ledger.events)

    def settle(
        self, uploaded_per_sum: list[int], parts_per_sum: list[list[int]] | None = None, *, colluders: int = 0
    ) -> None:
        """The secure sums ran: ``uploaded_per_sum[i]`` nodes' inputs (and noise shares) are in sum i, which
        the server decodes in parts of ``parts_per_sum[i]`` nodes (a split SecAgg+ graph; default one part).

        ``colluders`` is the number of colluding nodes the nodes' roster declares: a colluder knows its own
        share and subtracts it, so against the server it colludes with each sum (and each part) carries the
        shares of its other members only -- what every budgeted node charges (:mod:`privfed.flower.charges`).
        """
        if self._rid is None:
            raise ConfigError("settle() before record(): no distributed release to settle")
        c = int(colluders)
        parts = parts_per_sum or [[int(u)] for u in uploaded_per_sum]
        self.protocol.last_run = _Run(
            [
                {
                    "uploaded": max(int(u) - c, 0),
                    "parts": [max(int(x) - c, 0) for x in p],
                    "smallest_part": max(min(int(x) for x in p) - c, 0),
                }
                for u, p in zip(uploaded_per_sum, parts)
            ]
        )
