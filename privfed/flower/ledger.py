"""A Flower node's ledger of the secure aggregations it took part in: in its ``context.state`` for the run,
and in the file its node config names (``secagg-ledger``) across runs.

The protocol's rules live in :class:`mechanisms.secagg.ledger.SessionLedger` (one upload per aggregation id,
one uploader set, one CKKS key holder, one key per CKKS session); this module keeps them beyond a run: the
file's ``secagg`` section (:class:`mechanisms.secagg.ledger.FileRecords`) holds the lifetime ids of the
configurations and rounds the node uploaded for, its uploader-set and key-holder pins and the CKKS
sessions it made keys for.  The file is created once per node by the operator
(``python -m mechanisms.secagg.identity --init-ledger FILE --roster ROSTER``) and refused when missing.
:mod:`privfed.flower.secagg` explains why a node deployed with a roster needs the file.

Those records are the roster's: a new roster (a site joins or leaves) starts them again.  What the node's
data released without DP is not: the file's ``no-dp-releases`` section (:data:`RELEASES`, one of
:data:`privfed.results.ledger.DATA_KINDS`) names each statistic of its data it summed without DP (its
feature file by content, and the statistic: counts, class sums, ...) and the roster it was summed under,
and the operator's ``--init-ledger`` on the same file for a new roster keeps that section.  A node then
refuses to sum a statistic of the same data without DP under another roster (:func:`claim_statistics`):
the two federations' sums, over different sets of sites, would subtract to the statistics of the sites
that joined or left.
"""

from __future__ import annotations

import hashlib
import json

from flwr.app import ConfigRecord

from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.ledger import KEY_SESSION_PREFIX, FileRecords, SessionLedger
from privfed.errors import ConfigError
from privfed.results.ledger import NodeLedger

__all__ = [
    "LEDGER_KEY",
    "RELEASES",
    "ReleaseLifetime",
    "canonical_config",
    "claim_statistics",
    "lifetime_id",
    "node_ledger",
    "pin_num_classes",
]

#: The node's record of the aggregation ids it uploaded a masked input for (one each, ever).
LEDGER_KEY = "privfed-secagg-ledger"
#: Run-config keys that do not change what is summed (left out of the aggregation id).
_TRANSPORT_KEYS = ("run-nonce", "timeout", "connect_timeout", "output")


def canonical_config(config: dict) -> str:
    """The run config as the ids name it: JSON with sorted keys, transport settings and the server's nonce
    left out."""
    return json.dumps(
        {k: v for k, v in sorted(config.items()) if k not in _TRANSPORT_KEYS}, sort_keys=True, default=str
    )


def lifetime_id(config: dict, round_name: str, private: bool = False) -> bytes:
    """The id a node's lifetime ledger (``secagg-ledger``) keeps: the run config (less transport keys) and round;
    under DP the round alone (any configuration is another release of the node's noisy statistics, and a server
    chooses the configuration)."""
    base = "dp-release" if private else canonical_config(config)
    return hashlib.sha256(
        b"privfed lifetime aggregation\x00" + base.encode() + b"\x00" + round_name.encode()
    ).digest()


#: The ledger file's section of the statistics a node's data released without DP (bound to the data).
RELEASES = "no-dp-releases"


class ReleaseLifetime(bytes):
    """The lifetime id of a release without DP (bytes), with the statistics of the node's data it releases:
    ``statistics`` maps a hex key (the data and one statistic) to the statistic's name."""

    statistics: dict[str, str]

    def __new__(cls, lifetime: bytes, statistics: dict[str, str]) -> ReleaseLifetime:
        out = super().__new__(cls, lifetime)
        out.statistics = dict(statistics)
        return out


def claim_statistics(ledger: NodeLedger, statistics: dict[str, str], roster: bytes, node: int) -> None:
    """Record that this node sums ``statistics`` of its data without DP under the roster ``roster``
    (fingerprint), refusing -- before any value of its data leaves -- a statistic its data released under
    another roster: sums of two federations over different sets of sites subtract to the statistics of the
    sites that joined or left.  Under one roster the uploader-set pin keeps every sum over one set."""
    mine = bytes(roster).hex()

    def change(rec: dict) -> dict:
        held = dict(rec.get("statistics", {}))
        for key, name in sorted(statistics.items(), key=lambda kv: kv[1]):
            if held.get(key, mine) != mine:
                raise ProtocolAbort(
                    f"node {node} aborts at stage 'masked': its ledger {ledger.path} shows its data's {name} were "
                    f"summed without DP under another roster ({held[key][:16]}...), and a federation's sum over "
                    "another set of sites minus that one would be its statistics; its operator runs it with DP "
                    "(a finite epsilon) or with new data",
                    node=node,
                    stage="masked",
                    deviation="other-roster-release",
                )
        held.update(dict.fromkeys(statistics, mine))
        return {**rec, "statistics": held}

    ledger.update(RELEASES, change)


def ledger_path(node_config) -> str | None:
    """The ledger file the node config names (``secagg-ledger``), None where it names none.  A value that names
    no file (empty, a number, a bool: e.g. ``secagg-ledger="$LEDGER"`` with the variable unset) is refused, never
    read as no ledger: that would run the node without the file that makes its sums once-ever."""
    if "secagg-ledger" not in node_config:
        return None
    value = node_config["secagg-ledger"]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"secagg-ledger={value!r} names no file: set it to the node's ledger file (made once with python -m "
            "mechanisms.secagg.identity --init-ledger FILE --roster ROSTER), or drop it and set "
            "allow-ephemeral-ledger=true for a test deployment"
        )
    return value


def node_ledger(context, roster=None, lifetime: bytes | None = None) -> SessionLedger:
    """This node's ledger for this run (``context.state``), chained to the ledger file its node config names
    (``secagg-ledger``): the same configuration and round is summed once per node, ever, whichever run the
    server starts, and every sum covers the uploader set of the first (``uploaders``; ``holder`` names the
    one CKKS key holder, which keeps that set for CKKS sums), so sums from two runs cannot be subtracted
    either.  The file must exist and be sound, for this ``roster`` (:class:`privfed.results.ledger.NodeLedger`:
    a missing, unreadable or corrupt file, or one of another roster, raises its one-line error)."""
    path = ledger_path(context.node_config)
    records = None
    if path is not None:
        if roster is None:
            raise ConfigError("node_ledger needs the node's roster to open its ledger file")
        records = FileRecords(NodeLedger.open(str(path), roster.fingerprint))
    kept = records.records() if records is not None else {}

    def also(node: int) -> None:
        if isinstance(lifetime, ReleaseLifetime):  # without DP: the data's statistics, under this roster only
            claim_statistics(records.ledger, lifetime.statistics, roster.fingerprint, node)
        records.claim(lifetime, node)

    rec = context.state.get(LEDGER_KEY, {})
    used = list(rec["used"]) if "used" in rec else []
    used += [
        KEY_SESSION_PREFIX + h for h in kept.get("key_sessions", []) if KEY_SESSION_PREFIX + h not in used
    ]
    pinned = list(rec["uploaders"]) if "uploaders" in rec else kept.get("uploaders")
    holder = int(rec["holder"]) if "holder" in rec else kept.get("holder")
    return SessionLedger(
        used,
        also if records is not None and lifetime is not None else None,
        pinned,
        holder,
        records.keep if records is not None else None,
    )


#: The node's num-classes pin in ``context.state`` (a node without a ledger file: this run only).
CLASSES_KEY = "privfed-secagg-classes"


def pin_num_classes(context, roster, num_classes: int | None) -> None:
    """Answer for one ``num-classes``, ever: the first a node with its own feature file was run with.

    Such a node checks its labels against num-classes, a value the server chooses; a server varying it
    would learn the node's largest label, a bit at a time.  Pinned in the ledger file (or, without one, in
    this run's state), every later run must name the same number, a check on what the server sent alone.
    """
    want = None if num_classes is None else int(num_classes)
    path = ledger_path(context.node_config)
    if path is not None:
        records = FileRecords(NodeLedger.open(path, roster.fingerprint))
        if want is not None:
            records.keep(f"num_classes={want}")
        pinned = records.records().get("num_classes")
    else:
        if CLASSES_KEY not in context.state and want is not None:
            context.state[CLASSES_KEY] = ConfigRecord({"num_classes": want})
        pinned = int(context.state[CLASSES_KEY]["num_classes"]) if CLASSES_KEY in context.state else None
    if pinned is not None and want != pinned:
        raise ProtocolAbort(
            f"node {context.node_id} refuses num-classes={want}: it answers for num-classes={pinned}, the number "
            "its first run named (its labels are checked against it, and a number the server varies would read "
            "them)",
            node=context.node_id,
            stage="setup",
            deviation="other-num-classes",
        )
