"""A node's lifetime ledger file: what it has answered for, kept across runs, and refused when it is not sound.

One JSON file per node, written only by :class:`NodeLedger`::

    {
      "format": "privfed node ledger",
      "version": 1,
      "roster": "<hex SHA-256 fingerprint of the roster the node runs with>",
      "sections": {"<kind>": {"version": <int>, "records": {...}}, ...},
      "sha256": "<hex SHA-256 of the canonical JSON of everything above>"
    }

* **Typed, versioned sections.**  Each module that keeps lifetime records owns one section, named by its
  kind (``"secagg"``: the aggregations a node uploaded for, its uploader set, its CKKS key holder; other
  kinds, e.g. a node's lifetime privacy budget, are added the same way).  A section carries its own
  version; :meth:`NodeLedger.read` refuses a section written by a newer version of its module, and every
  update leaves the other sections as they were.
* **Bound to the roster.**  The file names the fingerprint of the roster it was created for; opening it
  with another roster is refused (a new roster means new identities and a new ledger).  The sections of
  :data:`DATA_KINDS` follow the node's data instead (what it released of its data without DP): when the
  roster changes (a site joins or leaves), the operator binds the same file to the new roster
  (:meth:`NodeLedger.rebind`, run by ``--init-ledger`` on the existing file), which keeps those sections
  and drops the rest, so a new roster never resets what the node's data has answered for.
* **Integrity.**  The ``sha256`` field covers the rest of the file: a truncated or hand-edited file is
  refused.  (It detects damage, not an attacker who can write the node's disk: such an attacker owns the
  node.)
* **Atomic.**  Every update runs under an exclusive lock of a sibling ``.lock`` file, reads and checks the
  file, applies the change, and writes a temporary sibling, fsyncs it and renames it into place
  (:func:`privfed.results.files.atomic_write`): a crash leaves the old file or the new one.
* **Created by an explicit step.**  :meth:`NodeLedger.create` (the operator's
  ``python -m mechanisms.secagg.identity --init-ledger FILE --roster ROSTER``) refuses an existing file;
  :meth:`NodeLedger.open` refuses a missing, unreadable or corrupt one with a one-line
  :class:`LedgerError` -- never a fresh, empty ledger, which would let a server repeat what the node
  already answered.

Public API: :class:`NodeLedger` (``create``, ``open``, ``convert``, ``rebind``, ``read``, ``update``, ``kinds``),
:class:`LedgerError`, :data:`DATA_KINDS`, :func:`backups` and :func:`free_backup` (the copies a conversion or a
rebinding keeps beside the file: ``<name>.old``, ``<name>.old.1``, ..., never overwritten).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from privfed._files import read_regular_text
from privfed.errors import ConfigError, InputError
from privfed.results.files import atomic_write

__all__ = ["DATA_KINDS", "FORMAT", "SECAGG_CREATE", "UNBOUND_ROSTER", "VERSION", "LedgerError", "NodeLedger"]

FORMAT = "privfed node ledger"
VERSION = 1


class LedgerError(ConfigError):
    """A node's ledger file is missing, unreadable, corrupt, of another roster, or already exists."""


def _copies(path: Path) -> list[tuple[int, Path]]:
    """(number, path) of every copy of ``path`` beside it (``<name>.old`` is 0, ``<name>.old.N`` is N), in order."""
    pattern = re.compile(re.escape(path.name) + r"\.old(?:\.([0-9]+))?")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    found = [(int(m.group(1) or 0), path.with_name(n)) for n in names if (m := pattern.fullmatch(n))]
    return sorted(found)


def backups(path: Path) -> list[Path]:
    """The copies of the ledger file ``path`` kept beside it (``<name>.old``, ``<name>.old.1``, ...), oldest first,
    whichever of them an operator removed."""
    return [p for _, p in _copies(path)]


def free_backup(path: Path) -> Path:
    """The name the next copy of ``path`` is kept under, past every copy there: a copy is never overwritten."""
    found = _copies(path)
    return path.with_name(path.name + (f".old.{found[-1][0] + 1}" if found else ".old"))


def _keep_copy(src: Path, dst: Path, setting: str) -> None:
    """Keep the file ``src`` as ``dst`` (which must not exist): a hard link (atomic; the caller then renames a new
    file over ``src``), or, on a file system without them, a whole copy made with an exclusive create."""
    try:
        os.link(src, dst)
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise LedgerError(
                f"{setting}={src}: cannot keep its copy {dst.name} ({exc.strerror or exc})"
            ) from None
    try:
        with open(dst, "xb") as out:
            out.write(src.read_bytes())
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise LedgerError(
            f"{setting}={src}: cannot keep its copy {dst.name} ({exc.strerror or exc})"
        ) from None


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


#: Sections bound to the node's data, not to a roster: :meth:`NodeLedger.rebind` carries them to a new roster
#: (``no-dp-releases``: the statistics of its data a node released without DP, :mod:`privfed.flower.ledger`).
DATA_KINDS = ("no-dp-releases",)

#: What a ledger bound to the node's data alone (its lifetime privacy budget, :mod:`privfed.flower.budget`)
#: names in place of a roster's fingerprint: no roster change may rebind or reset it.
UNBOUND_ROSTER = hashlib.sha256(
    b"privfed node privacy budget: bound to the node's data, not to a roster"
).digest()

#: How the operator creates a secure-aggregation node's ledger (named in every error).
SECAGG_CREATE = "python -m mechanisms.secagg.identity --init-ledger FILE --roster ROSTER"


class NodeLedger:
    """One node's ledger file (see the module docstring); ``setting`` names it in errors and ``create`` says
    how its operator makes a new one."""

    def __init__(
        self,
        path: str | os.PathLike,
        roster: bytes,
        *,
        setting: str = "secagg-ledger",
        create: str = SECAGG_CREATE,
    ) -> None:
        # The file a symlink names: written through (a rename over the link would leave the target, which a
        # restored link finds unspent) and locked by its own name (two nodes reaching it by a link and by its
        # path share one lock).
        self.path = Path(os.path.realpath(Path(path).expanduser()))
        self.roster = bytes(roster).hex()
        self.setting = setting
        self.create_hint = create

    # -- creation ------------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        roster: bytes,
        *,
        sections: dict[str, tuple[int, dict]] | None = None,
        setting: str = "secagg-ledger",
        create: str = SECAGG_CREATE,
    ) -> NodeLedger:
        """A new ledger file for the roster with fingerprint ``roster`` (LedgerError if the file exists).

        ``sections`` maps a kind to (its version, its records), e.g. to carry records over from an older file.
        """
        led = cls(path, roster, setting=setting, create=create)
        folder = led.path.parent  # said plainly here: the lock's failure would read as a ledger to restore
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            why = "does not exist; create it first" if not folder.is_dir() else "is not writable by this user"
            raise LedgerError(f"{setting}={led.path}: cannot create the file: the folder {folder} {why}")
        exists = LedgerError(
            f"{setting}={led.path}: it is a folder; name the ledger file to create inside it"
            if led.path.is_dir()
            else f"{setting}={led.path}: the file exists; a node's ledger is created once (it holds what the node "
            "answered for: keep it, or move it away deliberately)"
        )
        if led.path.exists() or led.path.is_symlink():  # refused before its lock file is made beside it
            raise exists
        with led._locked():
            if led.path.exists():  # made by another process meanwhile
                raise exists
            led._write(led._new_body(sections))
        return led

    @classmethod
    def convert(
        cls,
        path: str | os.PathLike,
        roster: bytes,
        was: bytes,
        *,
        sections: dict[str, tuple[int, dict]],
        setting: str = "secagg-ledger",
        create: str = SECAGG_CREATE,
    ) -> tuple[NodeLedger, Path]:
        """Replace the file at ``path``, whose bytes were ``was`` (a ledger of an older format its caller read),
        with a new ledger holding ``sections``, under the file's lock.  The old file is kept first, as the next
        free copy (:func:`free_backup`), then the new ledger is renamed over it: ``path`` names a whole file at
        every step.  Returns the ledger and the copy.  LedgerError if the file changed since it was read."""
        led = cls(path, roster, setting=setting, create=create)
        with led._locked():
            try:
                now = led.path.read_bytes()
            except OSError as exc:
                raise led._error(f"it cannot be read ({exc.strerror or exc})") from None
            if now != bytes(was):
                raise LedgerError(
                    f"{setting}={led.path}: the file changed while it was converted (another --init-ledger, or "
                    "the node itself); run again"
                )
            backup = free_backup(led.path)
            _keep_copy(led.path, backup, setting)
            led._write(led._new_body(sections))
        return led, backup

    def _new_body(self, sections: dict[str, tuple[int, dict]] | None) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "roster": self.roster,
            "sections": {
                str(k): {"version": int(v), "records": dict(r)} for k, (v, r) in (sections or {}).items()
            },
        }

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        roster: bytes,
        *,
        setting: str = "secagg-ledger",
        create: str = SECAGG_CREATE,
    ) -> NodeLedger:
        """The ledger file at ``path``, checked now (LedgerError: missing, unreadable, corrupt, other roster)."""
        led = cls(path, roster, setting=setting, create=create)
        led._load()
        return led

    @classmethod
    def rebind(
        cls,
        path: str | os.PathLike,
        roster: bytes,
        *,
        setting: str = "secagg-ledger",
        create: str = SECAGG_CREATE,
    ) -> tuple[NodeLedger, str]:
        """Bind the sound ledger file at ``path``, made for another roster, to ``roster``: the sections of
        :data:`DATA_KINDS` are kept, the roster's own sections dropped (the old file is kept beside it as
        ``<path>.old``).  Returns the ledger and the old roster's fingerprint (hex).  LedgerError: the file is
        missing, unsound, or already bound to ``roster``."""
        led = cls(path, roster, setting=setting, create=create)
        with led._locked():
            body = led._load(check_roster=False)
            old = str(body.get("roster"))
            if old == UNBOUND_ROSTER.hex():
                raise LedgerError(
                    f"{setting}={led.path}: it is a node's privacy-budget ledger, bound to the node's data and to "
                    f"no roster (sections: {', '.join(sorted(body['sections'])) or 'none'}); rebinding it would "
                    "drop what the node spent, so it is refused: a secure-aggregation ledger is a separate file"
                )
            if led.roster == UNBOUND_ROSTER.hex():
                raise LedgerError(
                    f"{setting}={led.path}: a privacy-budget ledger is bound to no roster and is never rebound"
                )
            if old == led.roster:
                raise LedgerError(
                    f"{setting}={led.path}: the file exists and is bound to this roster already; a node's ledger "
                    "is created once (it holds what the node answered for: keep it)"
                )
            former = [str(r) for r in body.get("former_rosters", [])] + [old]
            for kind in DATA_KINDS:  # the rosters the data's kept records name (files rebound before too)
                for value in _strings((body["sections"].get(kind) or {}).get("records", {})):
                    if len(value) == len(led.roster) and value not in former:
                        former.append(value)
            if led.roster in former:
                # its own records (the uploader-set pin above all) were dropped when the file left it: bound
                # back, the server could sum the same data under it again over another set of sites
                raise LedgerError(
                    f"{setting}={led.path}: the file was bound to this roster before ({led.roster[:16]}...) and "
                    "no longer holds what the node answered under it; a returning site joins under a new roster "
                    "(python -m mechanisms.secagg.identity makes one with fresh keys)"
                )
            kept = {k: v for k, v in body["sections"].items() if k in DATA_KINDS}
            backup = free_backup(led.path)
            atomic_write(backup, lambda p: p.write_bytes(led.path.read_bytes()))
            led._write(dict(body, roster=led.roster, sections=kept, former_rosters=former))
        return led, old

    # -- reading and updating -------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        """The kinds of section the file holds."""
        return sorted(self._load()["sections"])

    def read(self, kind: str, version: int = 1) -> dict:
        """A copy of section ``kind``'s records ({} if absent); refused if written by a newer version."""
        return self._section(self._load(), kind, version)

    def update(self, kind: str, change: Callable[[dict], dict | None], *, version: int = 1) -> dict:
        """Apply ``change(records) -> new records`` to section ``kind`` atomically, under the file's lock.

        ``change`` sees the records as they are on disk now (another process may have written since this
        object last read them) and may raise to refuse (the file is then left as it was); returning None
        leaves the section unchanged.  Returns the records as written.  Other sections are kept as they are.
        """
        with self._locked():
            body = self._load()
            records = self._section(body, kind, version)
            new = change(records)
            if new is None:
                return records
            body["sections"][kind] = {"version": int(version), "records": dict(new)}
            self._write(body)
            return dict(new)

    # -- the file ------------------------------------------------------------------------------------
    def _section(self, body: dict, kind: str, version: int) -> dict:
        sec = body["sections"].get(kind)
        if sec is None:
            return {}
        if not isinstance(sec, dict) or not isinstance(sec.get("records"), dict):
            raise self._error(f"its section {kind!r} is malformed")
        held = sec.get("version", 0)
        # "x", "1" or 1.5: a version privfed never writes
        if isinstance(held, bool) or not isinstance(held, int):
            raise self._error(f"its section {kind!r} is malformed")
        if held > int(version):
            raise self._error(
                f"its section {kind!r} was written by a newer privfed (version {sec.get('version')}, this one "
                f"reads {version}); run the node with that version"
            )
        return json.loads(json.dumps(sec["records"]))

    def _error(self, why: str) -> LedgerError:
        return LedgerError(
            f"{self.setting}={self.path}: {why}; the node refuses to run without a sound ledger (restore the file "
            f"from a backup, or create a new node's with {self.create_hint})"
        )

    def _load(self, *, check_roster: bool = True) -> dict:
        try:
            if not self.path.exists():
                raise FileNotFoundError
            text = read_regular_text(self.path, "it", "the ledger must be a regular file")
            if (links := os.stat(self.path).st_nlink) > 1:  # a write renames a new file over one name only
                raise self._error(
                    f"it has {links} hard links: an update would reach this name only and leave the others "
                    "stale (a name restored later would find the old records); keep one name (a symlink is "
                    "followed)"
                )
        except InputError as exc:  # a FIFO, a device, a socket, a folder, not UTF-8: named, never waited on
            raise self._error(f"it cannot be read ({str(exc).removeprefix('it ')})") from None
        except FileNotFoundError:
            raise self._error("no such file (a new node creates it once, explicitly)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise self._error(f"it cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
        try:
            raw = json.loads(text)
        except ValueError:
            raise self._error("it is not JSON (damaged, truncated, or a ledger of an older format)") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise self._error("it is not a privfed node ledger")
        if raw.get("version") != VERSION:
            raise self._error(
                f"it is a ledger of format version {raw.get('version')!r}, this privfed reads {VERSION}"
            )
        body = {k: v for k, v in raw.items() if k != "sha256"}
        if raw.get("sha256") != _digest(body):
            raise self._error("its SHA-256 does not match its contents (damaged or edited)")
        if not isinstance(body.get("sections"), dict):
            raise self._error("it has no sections")
        unbound = UNBOUND_ROSTER.hex()
        if (
            check_roster
            and body.get("roster") != self.roster
            and unbound in (body.get("roster"), self.roster)
        ):
            budget = body.get("roster") == unbound  # the file is a budget ledger, opened as a secagg one
            theirs = "privacy-budget" if budget else "secure-aggregation"
            mine = "secure-aggregation" if budget else "privacy-budget"
            raise LedgerError(
                f"{self.setting}={self.path}: it is a node's {theirs} ledger (sections: "
                f"{', '.join(sorted(body['sections'])) or 'none'}), not a {mine} ledger; the two are separate "
                f"files: keep this one as it is and name another file for {self.setting} (its operator creates "
                f"one with {self.create_hint})"
            )
        if check_roster and body.get("roster") != self.roster:
            raise self._error(
                f"it was created for another roster ({str(body.get('roster'))[:16]}..., this node runs "
                f"{self.roster[:16]}...; if the roster changed, bind the file to the new one with --init-ledger "
                "FILE --roster ROSTER, which keeps what the node's data released without DP)"
            )
        return body

    def _write(self, body: dict) -> None:
        out = dict(body, sha256=_digest(body))
        atomic_write(self.path, lambda p: p.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n"))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._error(f"its lock file cannot be opened ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"NodeLedger({str(self.path)!r}, roster={self.roster[:16]}...)"


def _strings(value) -> list[str]:
    """Every string held in ``value`` (dict values, list items), depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
