"""What a secure-aggregation node has already answered for: aggregation ids, its uploader set, its key holder.

:class:`SessionLedger` refuses a second masked (or encrypted) upload for one
aggregation id, a sum over another uploader set than the first this node
signed, and another CKKS key holder than the first it encrypted for: a
server holding two sums that differ by one node subtracts them.
:class:`mechanisms.secagg.masking.node.MaskingNode` consults it at the masked and
consistency stages, the Flower CKKS node at encryption and decryption; a
Flower node keeps it in ``context.state`` and in its ledger file
(:func:`privfed.flower.secagg.node_ledger`).

The ledger file (:class:`privfed.results.ledger.NodeLedger`) holds these records as its ``secagg``
section (:data:`SECTION`): ``aggregations`` (hex lifetime ids of the configurations and rounds the node
uploaded for), ``uploaders`` (its pinned uploader set), ``holder`` (its CKKS key holder) and
``key_sessions`` (the CKKS sessions it made keys for).  :class:`FileRecords` reads and updates them, one
locked, atomic update at a time; :func:`init_ledger_file` creates a node's file (converting one of the
older one-record-a-line format).
"""

from __future__ import annotations

import json
import os
import pathlib
import string
from collections.abc import Callable

from mechanisms.secagg.crypto import ProtocolAbort
from privfed._files import read_regular_text
from privfed.errors import InputError
from privfed.results.ledger import LedgerError, NodeLedger, backups

__all__ = ["KEY_SESSION_PREFIX", "SECTION", "FileRecords", "SessionLedger", "init_ledger_file"]

#: Prefix of a CKKS session id this node made keys for, in ``used``.
KEY_SESSION_PREFIX = "keys:"
#: The kind of the ledger file's section this module keeps, and its version.
SECTION, SECTION_VERSION = "secagg", 1


def _empty() -> dict:
    return {"aggregations": [], "key_sessions": []}


def _from_lines(lines: list[str]) -> dict:
    """The records of a ledger file in the older format (one record a line)."""
    out = _empty()
    for line in lines:
        if line.startswith("uploaders="):
            out.setdefault("uploaders", [int(v) for v in line[len("uploaders=") :].split(",") if v])
        elif line.startswith("holder="):
            out.setdefault("holder", int(line[len("holder=") :]))
        elif line.startswith(KEY_SESSION_PREFIX):
            out["key_sessions"].append(line[len(KEY_SESSION_PREFIX) :])
        elif len(line) == 64 and all(ch in string.hexdigits for ch in line):  # a SHA-256 aggregation id
            out["aggregations"].append(line.lower())
        else:
            raise ValueError(f"an unknown record {line[:20]!r}")
    return out


def init_ledger_file(path: str | os.PathLike, fingerprint: bytes) -> str:
    """Create a node's ledger file for the roster ``fingerprint``: "created"; "converted" when ``path``
    held a ledger of the older line format; "rebound" when it held a sound ledger of another roster (a site
    joined or left): what the node's data released without DP is kept
    (:meth:`privfed.results.ledger.NodeLedger.rebind`).  Either way the old file is kept beside it as
    ``<path>.old`` (``<path>.old.N`` past any copy there: a copy is never overwritten), and ``path`` names a
    whole file at every step.  A ledger of this roster already is refused, and so is a missing file with copies
    beside it.  A symlink is followed: the file it names is the one converted or rebound, as a node writes it."""
    given = pathlib.Path(path).expanduser()
    if given.is_symlink() and not given.exists():  # a ledger is never made through a link to nothing
        raise LedgerError(
            f"--init-ledger {given}: it is a symbolic link to {os.readlink(given)}, which does not exist; name "
            "the ledger's own path (or fix the link)"
        )
    p = pathlib.Path(os.path.realpath(given))
    kept = backups(p)
    if kept and not p.exists():
        # a copy is no restore point (it misses what the node wrote after it), and a fresh ledger forgets all
        raise LedgerError(
            f"--init-ledger {p}: the file is missing, but copies of an earlier ledger are beside it "
            f"({', '.join(k.name for k in kept)}); a node's ledger is never made afresh over a lost one (a fresh "
            "one forgets what the node answered for, a copy what it wrote after the copy): restore the file "
            "itself from a backup, or start this node under a new roster after moving the copies away"
        )
    if not p.exists():
        NodeLedger.create(p, fingerprint, sections={SECTION: (SECTION_VERSION, _empty())})
        return "created"
    try:  # a FIFO or a device is refused, never read (it would block)
        text = read_regular_text(p, f"--init-ledger {p}", "pass the path of the node's ledger file")
    except InputError as exc:
        raise LedgerError(str(exc)) from None
    except OSError as exc:
        raise LedgerError(f"--init-ledger {p}: the file exists and cannot be read ({exc})") from None
    if not text.strip():
        # an empty file is no ledger of the older format: a ledger truncated to nothing (a full disk, a
        # bad copy) must not come back as a fresh one that forgets what the node released
        raise LedgerError(
            f"--init-ledger {p}: the file exists and is empty; if it was this node's ledger, restore it from "
            "a backup; if the node never took part in a run, delete it and run again"
        )
    try:
        json.loads(text)
        is_json = True
    except ValueError:
        is_json = False
    if is_json:  # a ledger: bound to the new roster, keeping what the node's data released without DP
        led, old = NodeLedger.rebind(p, fingerprint)
        # the roster's own sections went with the old roster; written only if a node has not written it since
        led.update(SECTION, lambda rec: None if rec else _empty(), version=SECTION_VERSION)
        copy = backups(p)[-1].name
        return f"rebound (from roster {old[:16]}...; what its data released without DP is kept, the old file is {copy})"
    try:  # not JSON: the older format, one record a line
        records = _from_lines(text.split())
    except ValueError as exc:
        raise LedgerError(f"--init-ledger {p}: the file exists and is not a ledger ({exc})") from None
    _, copy = NodeLedger.convert(
        p, fingerprint, text.encode("utf-8"), sections={SECTION: (SECTION_VERSION, records)}
    )
    return f"converted the older ledger (the old file is {copy.name})"


class FileRecords:
    """The ``secagg`` section of a node's ledger file, as :class:`SessionLedger` uses it."""

    def __init__(self, ledger: NodeLedger) -> None:
        self.ledger = ledger

    def records(self) -> dict:
        return {**_empty(), **self.ledger.read(SECTION, SECTION_VERSION)}

    def claim(self, lifetime: bytes, node: int) -> None:
        """Add a lifetime id, refusing one already there (check and write in one locked update)."""
        key = bytes(lifetime).hex()

        def change(rec: dict) -> dict:
            rec = {**_empty(), **rec}
            if key in rec["aggregations"]:
                raise ProtocolAbort(
                    f"node {node} aborts at stage 'masked': its ledger {self.ledger.path} shows it already uploaded "
                    "for this configuration and round in an earlier run; a server that repeats a sum could "
                    "subtract the two",
                    node=node,
                    stage="masked",
                    deviation="second-session",
                )
            rec["aggregations"].append(key)
            return rec

        self.ledger.update(SECTION, change, version=SECTION_VERSION)

    def keep(self, line: str) -> None:
        """Keep a pin (``uploaders=0,1,2``, ``holder=3``: the first only) or a CKKS key session (``keys:...``)."""

        def change(rec: dict) -> dict | None:
            rec = {**_empty(), **rec}
            if line.startswith(KEY_SESSION_PREFIX):
                hexid = line[len(KEY_SESSION_PREFIX) :]
                if hexid in rec["key_sessions"]:
                    return None
                rec["key_sessions"].append(hexid)
                return rec
            key, _, value = line.partition("=")
            if key in rec:
                return None
            rec[key] = [int(v) for v in value.split(",") if v] if key == "uploaders" else int(value)
            return rec

        self.ledger.update(SECTION, change, version=SECTION_VERSION)


class SessionLedger:
    """The aggregation ids a node has uploaded a masked input for, and the uploaders its sums covered.

    One upload per id, ever: a node's noise share and input go into one
    masked sum per aggregation; a server asking again (to subtract two sums,
    or replaying an old run) is refused.  ``used`` is the persisted list
    (hex ids; ``keys:`` then a hex session id for a CKKS session this node
    made keys for, one key per session).

    One uploader set per node: the first uploader list the node signs
    (``uploaders``) is the only one it signs again.  A server that gets two
    sums over different sets (say with and without a victim) subtracts them
    and holds the victim's input; it needs only two aggregation ids, e.g.
    two run configs that sum the same statistic, so the id alone cannot stop
    it.  Equal sets give equal sums of whatever the node summed: nothing new.
    """

    def __init__(
        self,
        used: list[str] | None = None,
        also: Callable[[int], None] | None = None,
        uploaders: list[int] | None = None,
        holder: int | None = None,
        keep: Callable[[str], None] | None = None,
    ) -> None:
        self.used = list(used or [])
        self.also = also  # a second claim (a ledger kept beyond this run), called after this one's check
        self.uploaders = None if uploaders is None else sorted(int(v) for v in uploaders)
        self.holder = None if holder is None else int(holder)  # the CKKS key holder this node encrypts for
        self.keep = (
            keep  # keeps a pin ("uploaders=0,1,2", "holder=3") or a key session ("keys:...") beyond this run
        )

    def claim(self, aggregation: bytes, node: int) -> None:
        key = bytes(aggregation).hex()
        if key in self.used:
            raise ProtocolAbort(
                f"node {node} aborts at stage 'masked': it refuses a second masked session for aggregation "
                f"{key[:16]}: it already uploaded its masked input (and noise share) for it once; a server that "
                "repeats a sum could subtract the two",
                node=node,
                stage="masked",
                deviation="second-session",
            )
        if self.also is not None:
            self.also(node)
        self.used.append(key)

    def has_key_session(self, session: bytes) -> bool:
        """Whether this node (as CKKS key holder) already made keys for ``session``."""
        return KEY_SESSION_PREFIX + bytes(session).hex() in self.used

    def claim_key_session(self, session: bytes) -> None:
        """Note that this node made CKKS keys for ``session`` (one key per session id, ever): in this
        ledger and, when it is kept beyond the run (``keep``), there too, so a server that starts another
        run cannot have the holder make a second key for the session."""
        line = KEY_SESSION_PREFIX + bytes(session).hex()
        self.used.append(line)
        if self.keep is not None:
            self.keep(line)

    def pin(self, uploaders: list[int], node: int, stage: str) -> None:
        """Accept ``uploaders`` as the set this node's sum covers: the first set, or the same set again."""
        got = sorted(int(v) for v in uploaders)
        if self.uploaders is not None and got != self.uploaders:
            raise ProtocolAbort(
                f"node {node} aborts at stage {stage!r}: the server asks it to be summed with uploaders {got}, but "
                f"its earlier sum covered {self.uploaders}; the difference of two sums over different sets is "
                "one node's input (or the sum of a few), so no share is revealed",
                node=node,
                stage=stage,
                deviation="other-uploaders",
            )
        if self.uploaders is None:
            if self.keep is not None:
                self.keep("uploaders=" + ",".join(str(v) for v in got))
            self.uploaders = got

    def bind_holder(self, holder: int, node: int, stage: str) -> None:
        """Accept ``holder`` as the CKKS key holder this node encrypts for: the first, or the same again.

        A node never sees whose ciphertexts a CKKS sum adds; its key holder does, and pins that set.  One
        key holder per node keeps every CKKS sum of this node behind that one pin.
        """
        if self.holder is not None and int(holder) != self.holder:
            raise ProtocolAbort(
                f"node {node} aborts at stage {stage!r}: the server names key holder {holder}, but this node "
                f"encrypted for key holder {self.holder} before; that holder refuses a sum over another set, "
                "another holder would not know it",
                node=node,
                stage=stage,
                deviation="other-key-holder",
            )
        if self.holder is None:
            if self.keep is not None:
                self.keep(f"holder={int(holder)}")
            self.holder = int(holder)

    def record(self) -> dict:
        """The ledger as flat values (for a Flower ConfigRecord)."""
        out: dict = {"used": list(self.used)}
        if self.uploaders is not None:
            out["uploaders"] = list(self.uploaders)
        if self.holder is not None:
            out["holder"] = self.holder
        return out
