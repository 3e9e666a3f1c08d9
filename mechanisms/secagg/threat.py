"""What a server can learn from a secure sum, computed from the configuration and from the run.

Every report of a secure sum states a :class:`ThreatModel` built here from numbers, never typed text:
the roster's K, threshold t and SecAgg+ degree k (each node's *group* is itself and its neighbours,
n = k + 1 share holders; n = K on the complete graph), the nodes whose inputs the run summed, and,
under differential privacy, a function giving the epsilon of a sum that carries a given number of
noise shares.  Three quantities answer "what can the server learn":

**Colluders tolerated** (:func:`colluders_tolerated`).  Active-adversary masking (signed views, the
consistency round; :mod:`mechanisms.secagg.graph` has the argument): a deviating server with c
colluding nodes never holds t shares of both seeds of an honest node while 2t > n + c, so the
version tolerates c = 2t - n - 1 colluders (and, with c + 1, a server that splits survivor views
between the honest members of a group may unmask one of them: ``tests/adversarial``).  The
honest-but-curious version (no signatures) tolerates t - 1 colluders against a server that follows
the protocol, and none against one that deviates.  CKKS tolerates none: the key holder, a node the
server names, decrypts every input if it colludes.

**The smallest set of honest inputs a decodable sum covers** (:func:`smallest_honest_sum`).  Every
honest node v whose input enters a sum the server decodes had at least t members of its group among
the uploaders it signed, at most c of them colluders, and every honest one of them is joined to v by
a pair mask the server cannot remove: the sum covers at least t - c honest inputs.  That is exact on
the complete graph, and exact with c = 2t - n - 1 colluders on a SecAgg+ graph (the server drops the
nodes around an arc of n + 1 - t honest nodes and c colluders).  Without colluders a server that
follows the protocol decodes the sum over every uploader, or, when the survivors' graph falls apart,
the sum of each part (:func:`survivor_parts`): the run's smallest part is what it learned.

**Per-class coordinates.**  Those counts are of the inputs to the whole vector: a coordinate of a
per-class statistic (a class's count or feature sum) sums only the nodes holding that class, so a class
one node alone holds is that node's statistic in any decodable sum; the text says so, and that only DP
protects a class few nodes hold.

**The epsilon of the least-noised decodable sum.**  Each node adds a share of the noise, so a sum
over m honest inputs carries m shares (colluders know theirs): the epsilon of m shares, for this
run's smallest part, for the smallest sum a deviating server can decode alone (t), and with the
colluders tolerated (t - c).

:data:`DEFAULT_COLLUDERS` is the number of colluders the default thresholds tolerate at least:
:func:`default_threshold` is the smallest t with 2t > n + 1, which tolerates one colluding node when
n is even and two when n is odd (every degree k is even, so every SecAgg+ group is odd).

The module is pure: numbers in, numbers and sentences out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mechanisms.dp.calibration import check_count
from mechanisms.secagg.graph import group_size
from privfed.errors import ConfigError

__all__ = [
    "DEFAULT_COLLUDERS",
    "ThreatModel",
    "ckks_threat",
    "colluders_tolerated",
    "default_threshold",
    "defaults_table",
    "masking_threat",
    "min_threshold",
    "smallest_honest_sum",
    "sum_threshold",
    "survivor_parts",
    "threshold_rule",
]

#: Colluding nodes every default threshold tolerates (at least).
DEFAULT_COLLUDERS = 1


def min_threshold(group_size: int, colluders: int = 0) -> int:
    """Smallest t with t >= 2 and 2t > n + c (Bonawitz et al. 2017, Sec. 6; per SecAgg+ group: n = k + 1)."""
    n, c = int(group_size), int(colluders)
    return max(2, (n + c) // 2 + 1)


def default_threshold(group_size: int) -> int:
    """The default t of a group of n share holders: the smallest that tolerates :data:`DEFAULT_COLLUDERS`."""
    return min_threshold(group_size, DEFAULT_COLLUDERS)


def sum_threshold(num_nodes: int, threshold: int | None, degree: int | None) -> int:
    """A masked sum's t: ``threshold`` when one is configured, else :func:`default_threshold` of the group its
    graph gives each node (all K nodes on the complete graph, ``degree=None``; k + 1 on a SecAgg+ graph).

    The one place the default is computed: the operator's roster, the Flower configuration's report and
    the server's opening of a sum all call it, so they cannot disagree."""
    if threshold is not None:
        return int(threshold)
    return default_threshold(group_size(num_nodes, degree))


def colluders_tolerated(group_size: int, threshold: int, *, active: bool = True) -> int:
    """Colluding nodes a threshold tolerates: 2t - n - 1 (active version), t - 1 (honest-but-curious).

    Active: the largest c with 2t > n + c, so that no split of survivor views gives a deviating server t
    shares of both seeds of an honest node.  Honest-but-curious: a server that follows the protocol holds
    the self-mask seed of uploaders only, and c < t colluders' shares do not rebuild a mask key.
    """
    n, t = check_count(group_size, "group_size"), check_count(threshold, "threshold")
    if t > n:
        raise ConfigError(f"threshold={t} exceeds the group of {n} share holders: no masked sum runs with it")
    if not active:
        return max(t - 1, 0)
    return max(min(2 * t - n - 1, t - 1, n - 1), 0)


def smallest_honest_sum(group_size: int, threshold: int, colluders: int = 0, *, active: bool = True) -> int:
    """Fewest honest inputs any sum the server decodes covers, with ``colluders`` nodes colluding.

    t - c while c is tolerated (exact on the complete graph, and at c = 2t - n - 1 on a SecAgg+ graph; a
    lower bound otherwise); 1 beyond (one node's input may be unmasked).
    """
    t, c = check_count(threshold, "threshold"), check_count(colluders, "colluders", low=0)
    # no majority: a deviating server alone can unmask a node
    if active and 2 * t <= check_count(group_size, "group_size"):
        return 1
    if c > colluders_tolerated(group_size, threshold, active=active):
        return 1
    return max(t - c, 1)


def survivor_parts(graph: Sequence[Iterable[int]], uploaded: Iterable[int]) -> list[tuple[int, ...]]:
    """The parts the uploaders' graph falls into: each part's sum is decodable alone, smallest first.

    ``graph[u]`` holds u's neighbours (everyone on the complete graph): a pair mask joins two uploaders
    that are neighbours, so only a whole part's masks cancel.
    """
    left = set(int(u) for u in uploaded)
    outside = sorted(u for u in left if not 0 <= u < len(graph))
    if outside:  # a node with no row in the graph raised an IndexError (or -1 read the last row)
        raise ConfigError(f"uploaded names node(s) outside 0..{len(graph) - 1}: {outside[:5]}")
    parts = []
    while left:
        start = min(left)
        part, todo = {start}, [start]
        while todo:
            u = todo.pop()
            for v in graph[u]:
                v = int(v)
                if v in left and v not in part:
                    part.add(v)
                    todo.append(v)
        left -= part
        parts.append(tuple(sorted(part)))
    return sorted(parts, key=lambda p: (len(p), p))


def threshold_rule() -> str:
    """The default-threshold rule in words, for ``--help`` texts and error messages."""
    return (
        "t = max(2, floor((n + 1)/2) + 1) with n = K (or k + 1 with a SecAgg+ degree k): the smallest "
        f"threshold that tolerates {DEFAULT_COLLUDERS} colluding node (2 when n is odd; tolerated: 2t - n - 1)"
    )


@dataclass(frozen=True)
class ThreatModel:
    """What the server of one secure-sum configuration (and run) can learn; see the module docstring.

    ``epsilon`` maps a case (``"this_run"``, ``"server_alone"``, ``"with_colluders"``) to the epsilon of
    the least-noised sum the server can decode in it (absent without DP).
    """

    protocol: str
    version: str
    num_nodes: int
    threshold: int
    degree: int | None
    group_size: int
    colluders_tolerated: int
    smallest_sum_alone: int
    smallest_sum_colluding: int
    declared_colluders: int | None = None
    uploaded: int | None = None
    parts: tuple[int, ...] | None = None
    epsilon: dict[str, float] = field(default_factory=dict)
    shares: dict[str, int] = field(default_factory=dict)
    refusal_bits: int | None = None
    key_material: str = "operating-system CSPRNG"

    @property
    def smallest_part(self) -> int | None:
        """The fewest inputs of a sum this run let the server decode (None before the run)."""
        return None if not self.parts else min(self.parts)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["parts"] = None if self.parts is None else list(self.parts)
        out["smallest_part"] = self.smallest_part
        out["text"] = self.text()
        return out

    # -- the sentences -----------------------------------------------------------------------------
    def _where(self) -> str:
        if self.degree is None:
            return f"K={self.num_nodes}, t={self.threshold}, complete graph"
        return (
            f"K={self.num_nodes}, t={self.threshold}, SecAgg+ degree k={self.degree}: groups of "
            f"{self.group_size}"
        )

    def _eps(self, case: str) -> str:
        if case not in self.epsilon:
            return ""
        e = self.epsilon[case]
        shares = self.shares.get(case)
        value = f"{e:.4g}" if math.isfinite(e) else "inf"
        return f" (epsilon {value}" + (f", {shares} noise share(s))" if shares is not None else ")")

    def _run(self) -> str:
        if self.uploaded is None or not self.parts:
            return ""
        if len(self.parts) == 1:
            text = f"This run summed {self.uploaded} of {self.num_nodes} nodes' inputs in one part"
        else:
            sizes = ", ".join(str(p) for p in sorted(self.parts))
            text = (
                f"This run summed {self.uploaded} of {self.num_nodes} nodes' inputs, but their graph falls "
                f"into {len(self.parts)} parts of {sizes} nodes: the server decodes each part's sum alone, "
                f"the smallest over {self.smallest_part} inputs"
            )
        if self.declared_colluders and "this_run" in self.shares:
            text += (
                f" (the roster's {self.declared_colluders} declared colluder(s)' noise shares not counted)"
            )
        return text + self._eps("this_run") + ". "

    def _coordinates(self) -> str:
        """What the counts of inputs above do not say: a per-class coordinate sums only the class's holders."""
        m = self.smallest_sum_alone
        text = (
            f"These counts are of the inputs to the whole vector, not to each coordinate: a per-class statistic's "
            f"coordinates (a class's count, feature sum, second moment) sum only the nodes that hold the class, so "
            f"a class held by fewer than {m} nodes is covered by fewer than {m} inputs, and a class one node alone "
            "holds is that node's statistic, read exactly without DP; only DP protects a class few nodes hold"
        )
        if self.epsilon:
            text += (
                " (in this run every node adds its noise share to every class's coordinates, held or not, so each "
                "class carries the noise the epsilon above counts)"
            )
        return text + ". "

    def text(self) -> str:
        """The threat model as sentences, every number from the fields above."""
        where = self._where()
        tol = self.colluders_tolerated
        if self.protocol == "ckks":
            head = (
                f"CKKS with a node as key holder ({where.split(', complete')[0]}; sums of at least "
                f"{self.threshold} signed contributions). Colluders tolerated: 0 (a key holder colluding "
                "with the server decrypts every input; nodes refuse CKKS when their roster declares "
                "colluders). Smallest set of honest inputs a sum the key holder decrypts covers: "
                f"{self.smallest_sum_alone}{self._eps('server_alone')}. "
            )
        elif self.version == "honest-but-curious":
            head = (
                f"Pairwise masking, honest-but-curious version ({where}): a server that follows the protocol "
                f"learns the sum over the uploaders and who dropped; colluders tolerated: {tol} (t - 1: fewer "
                "than t colluders' shares rebuild no mask key). Smallest set of honest inputs a decodable sum "
                f"covers: {self.smallest_sum_alone}{self._eps('server_alone')}, {self.smallest_sum_colluding} "
                f"with {tol} colluder(s){self._eps('with_colluders')}. A server that deviates (different "
                "uploader lists for different nodes) can unmask any node: the active version (signed keys "
                "from a roster, the consistency round) is the one that holds against it. "
            )
        else:
            more = tol + 1
            head = (
                f"Pairwise masking, active-adversary version ({where}). Colluders tolerated: {tol} "
                f"(2t > n + c: whatever survivor views the server shows, it never holds t shares of both seeds "
                f"of an honest node while at most {tol} node(s) collude with it"
                + (
                    f"; with the declared {self.declared_colluders} colluder(s) of the roster"
                    if self.declared_colluders is not None
                    else ""
                )
                + f"; with {more}, a node's input may be unmasked). Smallest set of honest inputs any sum "
                f"the server can decode covers: {self.smallest_sum_alone}{self._eps('server_alone')} with no "
                f"node colluding (t, at least), {self.smallest_sum_colluding}{self._eps('with_colluders')} with "
                f"{tol} colluder(s) (n + 1 - t). "
            )
        refusals = (
            ""
            if self.refusal_bits is None
            else (
                "A node's checks that read its data take nothing the server may vary but what the roster "
                f"fixes, so repeated questions get the same answers: its refusals reveal at most "
                f"{self.refusal_bits} bit(s) of its data, ever (per version of the data). "
            )
        )
        return (
            head
            + self._run()
            + self._coordinates()
            + refusals
            + "The server also learns who dropped. Not prevented: a wrong sum (no integrity); dropping honest "
            "nodes so that the sum covers a subset of its choosing (within the bounds above"
            + ("" if self.protocol == "ckks" else "; the graph is in the roster, so the server may aim")
            + "); each run under another configuration releases its own sum "
            "(without DP nothing bounds what several sums reveal together). Secure aggregation is not "
            f"differential privacy. Key material: {self.key_material}." + self._trust()
        )

    def _trust(self) -> str:
        """What the active version trusts beyond the server: the roster's dealer and each node's ledger file."""
        if self.version != "active":
            return ""
        return (
            " Trusted: the roster's operator, who generates every node's identity key (a trusted dealer: whoever "
            "holds those keys can sign as any node), and each node's storage: restoring a node's ledger file from "
            "a backup rolls back the sums it answered for and the privacy it charged since that backup."
        )


def _epsilons(
    epsilon_of: Callable[[int], float] | None, shares: dict[str, int]
) -> tuple[dict[str, float], dict[str, int]]:
    if epsilon_of is None:
        return {}, {}
    cache: dict[int, float] = {}
    out = {}
    for case, m in shares.items():
        if m not in cache:
            cache[m] = float(epsilon_of(int(m)))
        out[case] = cache[m]
    return out, dict(shares)


def masking_threat(
    num_nodes: int,
    threshold: int,
    degree: int | None = None,
    *,
    active: bool = True,
    declared_colluders: int | None = None,
    graph: Sequence[Iterable[int]] | None = None,
    uploaded: Iterable[int] | None = None,
    epsilon_of: Callable[[int], float] | None = None,
    refusal_bits: int | None = None,
    key_material: str = "operating-system CSPRNG",
) -> ThreatModel:
    """The threat model of pairwise masking with K nodes, threshold t and SecAgg+ degree k (None: complete).

    ``graph`` (every node's neighbours) and ``uploaded`` (the nodes whose inputs were summed) describe a
    run: its parts (:func:`survivor_parts`); ``epsilon_of(m)`` is the epsilon of a sum carrying m noise
    shares (None without DP).  ``declared_colluders`` (the roster's n_C) are left out of this run's shares:
    the run's epsilon holds against the server together with them, as the nodes charge it.
    """
    K, t = check_count(num_nodes, "num_nodes", low=2), check_count(threshold, "threshold")
    if degree is not None and check_count(degree, "degree", low=2) < K - 1 and degree % 2:
        raise ConfigError(
            f"degree={degree} must be an even integer >= 2 (a SecAgg+ graph), or None (complete)"
        )
    colluders = check_count(declared_colluders or 0, "declared_colluders", low=0)
    n = K if degree is None or int(degree) >= K - 1 else int(degree) + 1
    if not min_threshold(n) <= t <= n:  # what no roster or masked sum runs has no threat model to state
        raise ConfigError(
            f"threshold={t} is outside [{min_threshold(n)}, {n}] for groups of {n} share holders (more than "
            "half of a group, at most all of it): no masked sum runs with it"
        )
    up_ids = None if uploaded is None else sorted(set(int(u) for u in uploaded))
    if up_ids and not 0 <= up_ids[0] <= up_ids[-1] < K:
        raise ConfigError(
            f"uploaded names node(s) outside 0..{K - 1}: {[u for u in up_ids if not 0 <= u < K][:5]}"
        )
    tol = colluders_tolerated(n, t, active=active)
    alone = smallest_honest_sum(n, t, 0, active=active)
    colluding = smallest_honest_sum(n, t, tol, active=active)
    parts = None
    up = None
    if uploaded is not None:
        up_set = sorted(set(int(u) for u in uploaded))
        up = len(up_set)
        g = graph if graph is not None else [frozenset(range(K)) - {u} for u in range(K)]
        parts = tuple(len(p) for p in survivor_parts(g, up_set))
    shares = {"server_alone": alone, "with_colluders": colluding}
    if parts:  # the roster's declared colluders know their own shares: this run's sum counts the others'
        shares = {"this_run": max(min(parts) - colluders, 0), **shares}
    eps, shares = _epsilons(epsilon_of, shares)
    return ThreatModel(
        protocol="mask",
        version="active" if active else "honest-but-curious",
        num_nodes=K,
        threshold=t,
        degree=None if degree is None else int(degree),
        group_size=n,
        colluders_tolerated=tol,
        smallest_sum_alone=alone,
        smallest_sum_colluding=colluding,
        declared_colluders=declared_colluders,
        uploaded=up,
        parts=parts,
        epsilon=eps,
        shares=shares,
        refusal_bits=refusal_bits,
        key_material=key_material,
    )


def ckks_threat(
    num_nodes: int,
    sum_threshold: int,
    *,
    uploaded: Iterable[int] | None = None,
    epsilon_of: Callable[[int], float] | None = None,
    refusal_bits: int | None = None,
) -> ThreatModel:
    """The threat model of CKKS with a node as key holder decrypting sums of at least ``sum_threshold``."""
    K, t = int(num_nodes), int(sum_threshold)
    if not 1 <= t <= K:
        raise ConfigError(
            f"sum_threshold={t} is outside [1, {K}]: the key holder decrypts sums of 1 to K nodes"
        )
    up = None if uploaded is None else len(set(int(u) for u in uploaded))
    if up is not None and up > K:
        raise ConfigError(f"uploaded names {up} nodes, more than the {K} of the federation")
    shares = {"server_alone": t}
    if up is not None:
        shares = {"this_run": up, **shares}
    eps, shares = _epsilons(epsilon_of, shares)
    return ThreatModel(
        protocol="ckks",
        version="active",
        num_nodes=K,
        threshold=t,
        degree=None,
        group_size=K,
        colluders_tolerated=0,
        smallest_sum_alone=t,
        smallest_sum_colluding=t,
        uploaded=up,
        parts=None if up is None else (up,),
        epsilon=eps,
        shares=shares,
        refusal_bits=refusal_bits,
    )


def defaults_table(nodes: Sequence[int], degrees: Sequence[int | None]) -> list[dict[str, int | None]]:
    """Per (K, degree): the default threshold, the colluders it tolerates, and the smallest honest sums."""
    rows = []
    for K in nodes:
        for k in degrees:
            if k is not None and not 2 <= k < K - 1:
                continue
            n = K if k is None else k + 1
            t = default_threshold(n)
            tol = colluders_tolerated(n, t)
            rows.append(
                {
                    "K": K,
                    "degree": k,
                    "group": n,
                    "threshold": t,
                    "tolerated": tol,
                    "alone": smallest_honest_sum(n, t, 0),
                    "colluding": smallest_honest_sum(n, t, tol),
                    "dropouts_per_group": n - t,
                }
            )
    return rows
