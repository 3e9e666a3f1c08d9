"""What the active masking version's signatures cover, and the checks a node makes on the views and echoes
it is shown before it unmasks (see :mod:`mechanisms.secagg.masking.node` and, for the SecAgg+ graph,
:mod:`mechanisms.secagg.graph`).

An **echo** is signed by each uploader with its masked input: the digest of what it summed and the
survivors of its group it masked with.  A **view** is signed in the consistency round: the signer's
(U2, U3) of its group and the digest.  Before revealing any share a node checks that every uploader's
echo names its digest and survivors that agree with its own where the two groups meet (so that
uploader masked with it), and that t signers' views agree with its own likewise.

**Which signatures a node verifies** (:func:`check_unmask`; on the roster's k-regular graph, 2k a session
with the k key advertisements of the shares stage).  The argument (:mod:`mechanisms.secagg.graph`) needs
t signatures on views agreeing with the node's, and, for every uploader whose self-mask seed share the
node reveals, that uploader's signature on a survivor list and digest that agree with its own (so it
masked with the node and summed the same broadcast).  Three checks that added nothing to that are gone:
the node's own signatures (it made them: compared byte for byte, Ed25519 being deterministic), the
consistency signatures past the t-th (a forged one there vouches for nothing t genuine ones did not; one
before them is verified and aborts), and the echo of a signer whose consistency view it verified (that
view is the signer's signature on the same survivor list and digest, checked to agree).  A lying server
for each: ``tests/adversarial/test_verify_budget.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from mechanisms.secagg.crypto import ProtocolAbort, as_bytes, as_int, signed_bytes
from mechanisms.secagg.identity import Roster, min_threshold
from mechanisms.secagg.masking.messages import SESSION_BYTES, parse_ids, unpack_view

__all__ = [
    "agrees",
    "check_keys_request",
    "check_unmask",
    "check_uploaded",
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


def check_unmask(
    roster: Roster,
    group: frozenset,
    mine: tuple[list[int], list[int]],
    t: int,
    msg: dict,
    *,
    node: int,
    sparse: bool,
    own: tuple[bytes, bytes],
    echo: Callable[[list[int]], bytes],
    digest: Callable[[list[int], list[int]], bytes],
    abort: Callable[[str, str], ProtocolAbort],
) -> int:
    """The checks before a node reveals any share; returns the signatures it verified.

    **Views.**  At least t uploaders of the node's group signed views (U2, U3) of their groups that agree
    with this node's view ``mine`` wherever the groups meet (:func:`agrees`), each signature over
    ``digest(U2, U3)``.  Every listed view is checked for agreement (a disagreeing one aborts); signatures
    are verified in the order listed until t agree, this node's own counted by comparing it with the one
    it made (``own[0]``: Ed25519 signatures are deterministic).  A signature past the t-th is not
    verified: the decision needs t, and a forged one past them vouches only for what t genuine
    signatures already showed.  On the complete graph the server sends no views: each signer's must be
    this node's own.

    **Echoes.**  Every uploader v of U3 signed, with its upload, the digest this node summed and a
    survivor list of v's group (``alive_lists``; on the complete graph this node's) that agrees with the
    node's own wherever the two groups meet: so v masked with this node.  A server that told v fewer
    survivors (leaving out nodes that will reveal v's self-mask seed) would need no upload but v's to open
    it (:mod:`mechanisms.secagg.graph`).  An echo is verified for every uploader but two kinds: this node
    (its own echo, ``own[1]``, compared, with the survivor list sent for it) and a signer whose view was
    verified above: that view is its signature on its survivor list and the digest, already found to
    agree with this node's, so it stands for the echo (and the list sent for it is not used).  So a node
    verifies one signature per other uploader of its group, at most k.

    ``echo(U2)`` gives the bytes an echo over U2 covers; ``abort(deviation, text)`` the node's refusal.
    """
    U2, U3 = mine
    my2, my3, groups = set(U2), set(U3), roster.groups

    def agreeing(v: int, U2v: list[int], U3v: list[int]) -> bool:  # agrees(), this node's sets made once
        both = groups[v] & group
        s2, s3 = set(U2v), set(U3v)
        return (
            s2 <= groups[v] and s3 <= s2 and v in s3 and s2 & both == my2 & both and s3 & both == my3 & both
        )

    signers = parse_ids(msg["signers"], "signer", node, "unmask")
    sigs = [as_bytes(s, "a signature") for s in msg["sigs"]]
    if len(sigs) != len(signers) or not set(signers) <= set(U3):
        raise abort("malformed", "consistency signatures from nodes outside U3")
    raw = msg.get("views")  # each signer's view of its own group (sent on a SecAgg+ graph)
    views = [mine] * len(signers) if raw is None else [unpack_view(as_bytes(b, "a view")) for b in raw]
    if len(views) != len(signers):
        raise abort("malformed", "consistency views and signers of unequal lengths")
    bad = [v for v, view in zip(signers, views) if not agreeing(v, *view)]
    vouched: dict[int, list[int]] = {}  # signer -> the survivor list its verified view names
    count = checked = 0
    for v, s, view in zip(signers, sigs, views):
        if bad or count >= t:
            break
        if v == node:
            ok = s == own[0]
        else:
            checked += 1
            ok = roster.verify(v, s, digest(*view))
            vouched[v] = view[0]
        if not ok:
            bad.append(v)
        count += 1
    if bad:
        raise abort(
            "inconsistent-lists",
            f"node(s) {bad} signed other survivor lists or another broadcast than this "
            "node saw (or a forged signature): the server showed different views",
        )
    if count < t:
        raise abort("short-list", f"only {len(signers)} consistency signatures, below the threshold t={t}")

    echoes = [as_bytes(e, "an echo") for e in msg["echoes"]]
    if sparse:  # each uploader's survivor list, as it signed it (on the complete graph: this node's)
        lists = [unpack_view(as_bytes(b, "a survivor list")) for b in msg["alive_lists"]]
        if any(rest for _, rest in lists):
            raise ValueError("a survivor list carries an uploader list")
        lists = [alive for alive, _ in lists]
    else:
        lists = [U2] * len(U3)
    if len(echoes) != len(U3) or len(lists) != len(U3):
        raise abort("malformed", "echoes, survivor lists and uploaders of unequal lengths")
    split = []
    for i, (v, e, alive) in enumerate(zip(U3, echoes, lists)):
        if v == node:
            ok = alive == U2 and e == own[1]
        elif v in vouched:  # its verified view signs its survivors and the digest: they stand for its echo
            lists[i], ok = vouched[v], True
        else:
            checked += 1
            ok = roster.verify(v, e, echo(alive))
        if not ok:
            split.append(v)
    if split:
        raise abort(
            "split-broadcast",
            f"uploader(s) {split} did not sum what this node summed (their signed echo of the run "
            "config, round, broadcast and survivors differs): the server sent different broadcasts "
            "to different nodes",
        )
    other = []
    for v, alive in zip(U3, lists):
        both, s2 = groups[v] & group, set(alive)
        if not (s2 <= groups[v] and s2 & both == my2 & both):
            other.append(v)
    if other:
        raise abort(
            "split-survivors",
            f"uploader(s) {other} masked with other survivors than this node saw (their signed echo "
            "names another survivor list where the groups meet): the server told nodes different "
            "survivors, so one upload could be opened without the others that cancel its masks",
        )
    return checked


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
