"""What the active masking version's signatures cover, and the checks a node makes on the views and echoes
it is shown before it unmasks (see :mod:`mechanisms.secagg.masking.node` and, for the SecAgg+ graph,
:mod:`mechanisms.secagg.graph`).

An **echo** is signed by each uploader with its masked input: the digest of what it summed and the
survivors of its group it masked with.  A **view** is signed in the consistency round: the signer's
(U2, U3) of its group and the digest.  Before revealing any share a node checks that every uploader's
echo names its digest and survivors that agree with its own where the two groups meet (so that
uploader masked with it), and that t signers' views agree with its own likewise.
"""

from __future__ import annotations

from collections.abc import Callable

from mechanisms.secagg.crypto import ProtocolAbort, as_bytes, as_int
from mechanisms.secagg.identity import Roster, min_threshold, signed_bytes
from mechanisms.secagg.masking.messages import SESSION_BYTES, parse_ids, unpack_view

__all__ = [
    "agrees",
    "check_echoes",
    "check_keys_request",
    "check_uploaded",
    "check_views",
    "echo_bytes",
    "view_digest",
]


def echo_bytes(roster: Roster, session: bytes, digest: bytes, U2: list[int]) -> bytes:
    """The bytes an echo covers: the digest of what the uploader summed and the survivors it masked with."""
    return signed_bytes("echo", roster.fingerprint, session, digest, U2)


def view_digest(roster: Roster, session: bytes, U2: list[int], U3: list[int], digest: bytes) -> bytes:
    """The bytes a consistency signature covers: a view (U2, U3) of the signer's group and the digest."""
    return signed_bytes("consistency", roster.fingerprint, session, U2, U3, digest)


def agrees(
    roster: Roster, group: frozenset, my_U2: list[int], my_U3: list[int], v: int, U2: list[int], U3: list[int]
) -> bool:
    """Whether signer v's view of its group is well formed and says what the checking node's view (of its
    ``group``) says about every node both groups hold (on the complete graph: the same lists)."""
    mine = roster.graph[v] | {v}
    both = mine & group
    return (
        set(U2) <= mine
        and set(U3) <= set(U2)
        and v in U3
        and set(U2) & both == set(my_U2) & both
        and set(U3) & both == set(my_U3) & both
    )


def check_echoes(
    roster: Roster,
    group: frozenset,
    my_U2: list[int],
    U3: list[int],
    msg: dict,
    *,
    sparse: bool,
    echo: Callable[[list[int]], bytes],
    abort: Callable[[str, str], ProtocolAbort],
) -> None:
    """Every uploader v of U3 signed, with its upload, the digest the checking node summed and a survivor
    list of v's group that agrees with the node's own (``my_U2``) wherever the two groups meet.

    So v masked with this node: a server that told v fewer survivors (leaving out nodes that will reveal
    v's self-mask seed) would need no upload but v's to open it (:mod:`mechanisms.secagg.graph`).
    ``echo(U2)`` gives the bytes an echo over U2 covers; ``abort(deviation, text)`` the node's refusal.
    """
    echoes = [as_bytes(e, "an echo") for e in msg["echoes"]]
    if sparse:  # each uploader's survivor list, as it signed it (on the complete graph: this node's)
        lists = [unpack_view(as_bytes(b, "a survivor list")) for b in msg["alive_lists"]]
        if any(rest for _, rest in lists):
            raise ValueError("a survivor list carries an uploader list")
        lists = [alive for alive, _ in lists]
    else:
        lists = [my_U2] * len(U3)
    if len(echoes) != len(U3) or len(lists) != len(U3):
        raise abort("malformed", "echoes, survivor lists and uploaders of unequal lengths")
    split = [v for v, e, U2 in zip(U3, echoes, lists) if not roster.verify(v, e, echo(U2))]
    if split:
        raise abort(
            "split-broadcast",
            f"uploader(s) {split} did not sum what this node summed (their signed echo of the run "
            "config, round, broadcast and survivors differs): the server sent different broadcasts "
            "to different nodes",
        )
    mine = set(my_U2)
    other = []
    for v, U2 in zip(U3, lists):
        vgroup = roster.graph[v] | {v}
        both = vgroup & group
        if not (set(U2) <= vgroup and set(U2) & both == mine & both):
            other.append(v)
    if other:
        raise abort(
            "split-survivors",
            f"uploader(s) {other} masked with other survivors than this node saw (their signed echo "
            "names another survivor list where the groups meet): the server told nodes different "
            "survivors, so one upload could be opened without the others that cancel its masks",
        )


def check_views(
    roster: Roster,
    group: frozenset,
    mine: tuple[list[int], list[int]],
    t: int,
    msg: dict,
    *,
    node: int,
    digest: Callable[[list[int], list[int]], bytes],
    abort: Callable[[str, str], ProtocolAbort],
) -> None:
    """At least t uploaders signed views of their groups that agree with this node's view ``mine`` = (U2, U3)
    wherever the groups meet (:func:`agrees`), each signature over ``digest(U2, U3)``; otherwise
    ``abort(deviation, text)``.  On the complete graph the server sends no views: each signer's must be
    this node's own."""
    U3 = mine[1]
    signers = parse_ids(msg["signers"], "signer", node, "unmask")
    sigs = [as_bytes(s, "a signature") for s in msg["sigs"]]
    if len(sigs) != len(signers) or not set(signers) <= set(U3):
        raise abort("malformed", "consistency signatures from nodes outside U3")
    raw = msg.get("views")  # each signer's view of its own group (sent on a SecAgg+ graph)
    views = [mine] * len(signers) if raw is None else [unpack_view(as_bytes(b, "a view")) for b in raw]
    if len(views) != len(signers):
        raise abort("malformed", "consistency views and signers of unequal lengths")
    bad = [
        v
        for v, s, view in zip(signers, sigs, views)
        if not (agrees(roster, group, *mine, v, *view) and roster.verify(v, s, digest(*view)))
    ]
    if bad:
        raise abort(
            "inconsistent-lists",
            f"node(s) {bad} signed other survivor lists or another broadcast than this "
            "node saw (or a forged signature): the server showed different views",
        )
    if len(signers) < t:
        raise abort("short-list", f"only {len(signers)} consistency signatures, below the threshold t={t}")


def check_uploaded(
    U3: list[int],
    U2: list[int],
    *,
    node: int,
    group: frozenset,
    t: int,
    abort: Callable[[str, str], ProtocolAbort],
) -> None:
    """The uploader list U3 a node is shown: survivors of the masked stage (its U2), the node itself among
    them (it uploaded), and at least t of its group; otherwise ``abort(deviation, text)``."""
    if not set(U3) <= set(U2):
        raise abort(
            "unknown-node", f"uploaders {sorted(set(U3) - set(U2))} are not survivors of the masked stage"
        )
    if node not in U3:
        raise abort("drop-claim", "the server lists this node as dropped, but it uploaded")
    if len(set(U3) & group) < t:
        raise abort(
            "short-list",
            f"refuses to unmask: only {len(set(U3) & group)} of its group uploaded, "
            f"below the threshold t={t}; the sum is not released",
        )


def check_keys_request(
    msg: dict,
    session: bytes,
    *,
    K: int,
    t: int,
    roster: Roster | None,
    abort: Callable[[str, str], ProtocolAbort],
) -> None:
    """The first request of a session: the graph (active version: the roster's, checked first, since another
    graph also means another t), K and t as the node is configured, t not below the roster's minimum, and a
    session id of the protocol's length; otherwise ``abort(deviation, text)``."""
    K_, t_ = as_int(msg["K"], "K"), as_int(msg["t"], "t")
    degree = None if msg.get("degree") is None else as_int(msg["degree"], "degree")
    if roster is not None and degree != roster.degree:
        raise abort(
            "wrong-graph",
            f"the server runs degree {degree or 'complete'} but this node's roster graph is "
            f"{roster.degree or 'complete'}; the graph is the operator's, never the server's",
        )
    if K_ != K or t_ != t:
        raise abort(
            "wrong-parameters",
            f"the server asks for K={K_}, t={t_} but this node is configured with K={K}, "
            f"t={t} (a lower threshold lets a server unmask one node)",
        )
    if roster is not None:
        low = min_threshold(roster.group_size, roster.colluders)
        if t_ < low:  # the roster checks this too; refuse whatever the roster says
            raise abort("low-threshold", f"threshold t={t_} below {low}")
    if len(session) != SESSION_BYTES:
        raise abort("malformed", f"session id of {len(session)} bytes, expected {SESSION_BYTES}")
