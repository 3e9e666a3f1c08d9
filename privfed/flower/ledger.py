"""A Flower node's ledger of the secure aggregations it took part in: in its ``context.state`` for the run,
and in the file its node config names (``secagg-ledger``) across runs.

The protocol's rules live in :class:`mechanisms.secagg.ledger.SessionLedger` (one upload per aggregation id,
one uploader set, one CKKS key holder, one key per CKKS session); this module keeps them beyond a run: the
file holds the lifetime ids of the configurations and rounds the node uploaded for, its ``uploaders=`` and
``holder=`` pins and the CKKS sessions it made keys for.  :mod:`privfed.flower.secagg` explains why a node
deployed with a roster needs the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from mechanisms.secagg.crypto import ProtocolAbort
from mechanisms.secagg.ledger import KEY_SESSION_PREFIX, SessionLedger

__all__ = ["LEDGER_KEY", "canonical_config", "lifetime_id", "node_ledger"]

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


_PIN = "uploaders="


def node_ledger(context, lifetime: bytes | None = None) -> SessionLedger:
    """This node's ledger for this run (``context.state``), chained to the file named by its node config
    ``secagg-ledger`` when there is one: the same configuration and round is summed once per node, ever,
    whichever run the server starts, and every sum covers the uploader set of the first (a line
    ``uploaders=...`` in the file; ``holder=...`` names the one CKKS key holder, which keeps that set for
    CKKS sums), so sums from two runs cannot be subtracted either."""
    path = context.node_config.get("secagg-ledger")
    p = pathlib.Path(str(path)).expanduser() if path else None

    def lines() -> list[str]:
        return p.read_text().split() if p is not None and p.exists() else []

    def append(line: str) -> None:
        with open(p, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def also(node: int) -> None:
        if lifetime.hex() in set(lines()):
            raise ProtocolAbort(
                f"node {node} aborts at stage 'masked': its ledger {p} shows it already uploaded for this "
                "configuration and round in an earlier run; a server that repeats a sum could subtract the two",
                node=node,
                stage="masked",
                deviation="second-session",
            )
        append(lifetime.hex())

    def keep(line: str) -> None:
        key = line.split("=", 1)[0] + "="
        if not any(x.startswith(key) for x in lines()):
            append(line)

    def kept(key: str) -> str | None:
        found = [x[len(key) :] for x in lines() if x.startswith(key)]
        return found[0] if found else None

    rec = context.state.get(LEDGER_KEY, {})
    used = list(rec["used"]) if "used" in rec else []
    used += [
        x for x in lines() if x.startswith(KEY_SESSION_PREFIX) and x not in used
    ]  # CKKS keys made before
    pinned = list(rec["uploaders"]) if "uploaders" in rec else None
    holder = int(rec["holder"]) if "holder" in rec else None
    if pinned is None and (text := kept(_PIN)) is not None:
        pinned = [int(v) for v in text.split(",")]
    if holder is None and (text := kept("holder=")) is not None:
        holder = int(text)
    return SessionLedger(
        used,
        also if p is not None and lifetime is not None else None,
        pinned,
        holder,
        keep if p is not None else None,
    )
