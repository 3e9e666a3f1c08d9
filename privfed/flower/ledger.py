"""A Flower node's ledger of the secure aggregations it took part in: in its ``context.state`` for the run,
and in the file its node config names (``secagg-ledger``) across runs.

The protocol's rules live in :class:`mechanisms.secagg.ledger.SessionLedger` (one upload per aggregation id,
one uploader set, one CKKS key holder, one key per CKKS session); this module keeps them beyond a run: the
file's ``secagg`` section (:class:`mechanisms.secagg.ledger.FileRecords`) holds the lifetime ids of the
configurations and rounds the node uploaded for, its uploader-set and key-holder pins and the CKKS
sessions it made keys for.  The file is created once per node by the operator
(``python -m mechanisms.secagg.identity --init-ledger FILE --roster ROSTER``) and refused when missing.
:mod:`privfed.flower.secagg` explains why a node deployed with a roster needs the file.
"""

from __future__ import annotations

import hashlib
import json

from flwr.app import ConfigRecord

from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.ledger import KEY_SESSION_PREFIX, FileRecords, SessionLedger
from privfed.errors import ConfigError
from privfed.results.ledger import NodeLedger

__all__ = ["LEDGER_KEY", "canonical_config", "lifetime_id", "node_ledger", "pin_num_classes"]

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


def node_ledger(context, roster=None, lifetime: bytes | None = None) -> SessionLedger:
    """This node's ledger for this run (``context.state``), chained to the ledger file its node config names
    (``secagg-ledger``): the same configuration and round is summed once per node, ever, whichever run the
    server starts, and every sum covers the uploader set of the first (``uploaders``; ``holder`` names the
    one CKKS key holder, which keeps that set for CKKS sums), so sums from two runs cannot be subtracted
    either.  The file must exist and be sound, for this ``roster`` (:class:`privfed.results.ledger.NodeLedger`:
    a missing, unreadable or corrupt file, or one of another roster, raises its one-line error)."""
    path = context.node_config.get("secagg-ledger")
    records = None
    if path:
        if roster is None:
            raise ConfigError("node_ledger needs the node's roster to open its ledger file")
        records = FileRecords(NodeLedger.open(str(path), roster.fingerprint))
    kept = records.records() if records is not None else {}

    def also(node: int) -> None:
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
    path = context.node_config.get("secagg-ledger")
    if path:
        records = FileRecords(NodeLedger.open(str(path), roster.fingerprint))
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
