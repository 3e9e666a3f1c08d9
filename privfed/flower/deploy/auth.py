"""Flower SuperNode keys bound to the nodes' secure-aggregation roster identities.

Flower 1.41 authenticates SuperNodes with ECDSA keys: a SuperLink started with
``--enable-supernode-auth`` (which needs TLS) serves only SuperNodes whose public key was registered
on its Control API (``flwr supernode register KEY.pub``); a SuperNode started with
``--auth-supernode-private-key KEY`` signs a fresh timestamp with it on every Fleet API call, and
the SuperLink maps the key to the node's id.  privfed's nodes already hold a roster identity (an
Ed25519 key listed in the operator's roster, :mod:`mechanisms.secagg.identity`).  This module ties
the two together:

**The binding.** Node ``i`` makes its Flower key on its own machine and signs the key's public half
with its roster identity::

    signature = Ed25519_sign(identity_i, signed_bytes("flower-node-key", roster fingerprint, i, SPKI DER))

(``python -m privfed.flower.deploy.auth node-key DIR --identity node-i.json --roster roster.json``
writes ``DIR/flower-key`` (OpenSSH, mode 0600: the SuperNode's ``--auth-supernode-private-key``),
``DIR/flower-key.pub`` and ``DIR/flower-key.binding.json``, the public binding it sends to the
operator.)

**Checks.** The operator registers a Flower key only through ``python -m privfed.flower.deploy.auth
verify --roster roster.json --out DIR BINDING...``: it refuses a binding whose signature does not
verify under the roster key at its index, that names another roster, that is not an EC key on P-256,
P-384 or P-521 (what Flower's registration reads), or a second key for one index, and a list that leaves
out a node the list already in DIR holds; it writes ``DIR/node-<i>.pub`` (what ``flwr
supernode register`` takes) and ``DIR/node-keys.json``, the verified list.  The deployed ServerApp
(:mod:`privfed.flower.deploy.server`) reads that list on the SuperLink machine and sends messages
only to nodes whose Flower key -- the key the SuperLink authenticated the node's requests with -- is
in it: every node id the server uses belongs to exactly one roster index.

**Why it holds.** A node id reaches the server only if the SuperLink authenticated it, which takes
the Flower private key of a registered public key; the server uses it only if that public key
carries a signature by a roster identity for this roster (Ed25519 is existentially unforgeable, so
only the holder of identity ``i`` -- the node, or the operator who made it -- can produce one); the
list holds one key per index and the SuperLink one node per key.  So the nodes a run uses are
roster members, one Flower node each, whoever else reached the SuperLink.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mechanisms.secagg.crypto import signed_bytes
from mechanisms.secagg.identity import Identity, Roster
from privfed._files import read_regular_text
from privfed.errors import ConfigError, PrivfedError
from privfed.flower.deploy.certs import write_file

__all__ = [
    "BINDING_LABEL",
    "KeyBinding",
    "NodeKeys",
    "main",
    "make_flower_key",
    "spki_der",
    "verify_bindings",
    "write_node_key",
]

#: The label every binding signature covers (domain separation from the protocol's other signatures).
BINDING_LABEL = "flower-node-key"
#: The curves of the keys Flower's node authentication takes: OpenSSH (``flwr supernode register``) reads P-256,
#: P-384 and P-521 only.
NIST_CURVES = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
KEY_FILE, PUB_FILE, BINDING_FILE, LIST_FILE = (
    "flower-key",
    "flower-key.pub",
    "flower-key.binding.json",
    "node-keys.json",
)


def spki_der(public_key: bytes | ec.EllipticCurvePublicKey, source: str = "public key") -> bytes:
    """The canonical bytes of a Flower public key: DER SubjectPublicKeyInfo of a NIST-curve EC key.

    Accepts a key object, PEM (what Flower's SuperLink stores and reports), an OpenSSH line
    (what ``flwr supernode register`` reads) or DER.
    """
    key = public_key
    if isinstance(public_key, (bytes, bytearray, str)):
        raw = public_key.encode() if isinstance(public_key, str) else bytes(public_key)
        try:
            if raw.lstrip().startswith(b"-----BEGIN"):
                key = serialization.load_pem_public_key(raw)
            elif raw.lstrip().startswith(b"ecdsa-"):
                key = serialization.load_ssh_public_key(raw.strip())
            else:
                key = serialization.load_der_public_key(raw)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ConfigError(f"{source} is not a PEM, OpenSSH or DER public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, NIST_CURVES):
        raise ConfigError(
            f"{source} is not an EC key on P-256, P-384 or P-521, which Flower's node authentication needs; "
            "make the node's key with python -m privfed.flower.deploy.auth node-key"
        )
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def make_flower_key() -> ec.EllipticCurvePrivateKey:
    """A fresh SuperNode key from OS entropy: ECDSA P-384, the curve Flower generates its own keys on."""
    return ec.generate_private_key(ec.SECP384R1())


def _message(fingerprint: bytes, index: int, der: bytes) -> bytes:
    return signed_bytes(BINDING_LABEL, bytes(fingerprint), int(index), bytes(der))


@dataclass(frozen=True)
class KeyBinding:
    """Roster identity ``index`` vouches for the Flower public key ``public_key`` (DER SPKI) in roster ``roster``."""

    index: int
    roster: bytes  # the roster's fingerprint
    public_key: bytes
    signature: bytes

    @classmethod
    def sign(cls, identity: Identity, roster: Roster, public_key) -> KeyBinding:
        """The binding of ``public_key`` by ``identity`` (which must be in ``roster`` at its index)."""
        identity.check(roster)
        der = spki_der(public_key)
        return cls(
            identity.index,
            roster.fingerprint,
            der,
            identity.sign(_message(roster.fingerprint, identity.index, der)),
        )

    def verify(self, roster: Roster, source: str = "binding") -> KeyBinding:
        """This binding if it belongs to ``roster`` and its signature verifies (ConfigError naming ``source`` otherwise)."""
        if self.roster != roster.fingerprint:
            raise ConfigError(
                f"{source} was signed for another roster (fingerprint {self.roster.hex()[:16]}..., this roster's is "
                f"{roster.fingerprint.hex()[:16]}...); the node must sign its Flower key again with the roster in use"
            )
        if (
            isinstance(self.index, bool)
            or not isinstance(self.index, int)
            or not 0 <= self.index < roster.size
        ):
            raise ConfigError(
                f"{source} names roster index {self.index!r}; the roster has nodes 0..{roster.size - 1}"
            )
        spki_der(self.public_key, source)  # a NIST-curve EC key, as Flower requires
        if not roster.verify(
            self.index, bytes(self.signature), _message(self.roster, self.index, self.public_key)
        ):
            raise ConfigError(
                f"{source}: the signature does not verify under roster node {self.index}'s identity key; "
                "this Flower key was not signed by that node -- do not register it"
            )
        return self

    @property
    def public_pem(self) -> bytes:
        return serialization.load_der_public_key(self.public_key).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def public_openssh(self) -> bytes:
        """The key as ``flwr supernode register`` reads it (one OpenSSH line)."""
        return serialization.load_der_public_key(self.public_key).public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )

    def to_dict(self) -> dict:
        return {
            "version": 1,
            "index": int(self.index),
            "roster": self.roster.hex(),
            "flower_public_key": self.public_pem.decode(),
            "signature": self.signature.hex(),
        }

    @classmethod
    def from_dict(cls, raw, source: str = "binding") -> KeyBinding:
        try:
            if raw.get("version") != 1:
                raise ValueError(f"unknown version {raw.get('version')!r}")
            index = raw["index"]
            if isinstance(index, bool) or not isinstance(index, int):
                raise ValueError(f"index must be an integer, got {index!r}")
            return cls(
                index,
                bytes.fromhex(raw["roster"]),
                spki_der(str(raw["flower_public_key"]).encode(), source),
                bytes.fromhex(raw["signature"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(
                f"{source} is not a privfed key binding (JSON with index, roster, flower_public_key, signature): {exc}"
            ) from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> KeyBinding:
        text = read_regular_text(
            Path(path).expanduser(), f"binding {path}", "pass a node's flower-key.binding.json"
        )
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"binding {path} is not JSON: {exc}") from None
        return cls.from_dict(raw, f"binding {path}")


def verify_bindings(roster: Roster, bindings: Iterable[tuple[str, KeyBinding]]) -> list[KeyBinding]:
    """Every binding verified against ``roster``, at most one per index and per key (ConfigError otherwise)."""
    out: list[KeyBinding] = []
    by_index: dict[int, str] = {}
    by_key: dict[bytes, str] = {}
    for source, b in bindings:
        b.verify(roster, source)
        if b.index in by_index:
            raise ConfigError(
                f"{source} and {by_index[b.index]} both bind a Flower key to roster node {b.index}; one node, "
                "one Flower key: keep the one the node uses now and unregister the other"
            )
        if b.public_key in by_key:
            raise ConfigError(
                f"{source} and {by_key[b.public_key]} bind the same Flower key to two roster nodes"
            )
        by_index[b.index], by_key[b.public_key] = source, source
        out.append(b)
    if not out:
        raise ConfigError("no binding given: pass each node's flower-key.binding.json")
    return sorted(out, key=lambda b: b.index)


@dataclass(frozen=True)
class NodeKeys:
    """The operator's verified list: the roster and one bound Flower key per registered node."""

    roster: Roster
    bindings: tuple[KeyBinding, ...]

    def __post_init__(self) -> None:
        verify_bindings(self.roster, [(f"node-keys entry {i}", b) for i, b in enumerate(self.bindings)])

    @cached_property
    def _by_key(self) -> dict[bytes, int]:
        return {b.public_key: b.index for b in self.bindings}

    def index_of(self, public_key) -> int | None:
        """The roster index a Flower public key (PEM, OpenSSH or DER) is bound to, or None."""
        try:
            return self._by_key.get(spki_der(public_key))
        except ConfigError:
            return None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "roster": json.loads(self.roster.to_json()),
                "bindings": [b.to_dict() for b in self.bindings],
            },
            indent=1,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> NodeKeys:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(
                f"node-keys={path}: no such file on the SuperLink machine; the operator writes it with "
                "python -m privfed.flower.deploy.auth verify"
            )
        try:
            raw = json.loads(p.read_text())
            if raw.get("version") != 1:
                raise ValueError(f"unknown version {raw.get('version')!r}")
            roster = Roster.from_json(json.dumps(raw["roster"]), f"node-keys={path} (its roster)")
            bindings = tuple(
                KeyBinding.from_dict(b, f"node-keys={path} entry {i}") for i, b in enumerate(raw["bindings"])
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(
                f"node-keys={path} is not a privfed node-key list (write it with python -m privfed.flower.deploy.auth "
                f"verify): {exc}"
            ) from None
        return cls(roster, bindings)


def write_node_key(directory: str | os.PathLike, identity: Identity, roster: Roster) -> dict[str, Path]:
    """On node ``identity.index``: a fresh Flower key, its public half and its binding, in ``directory``."""
    identity.check(roster)
    out = _folder(directory, "DIR")
    if (out / KEY_FILE).exists():
        raise ConfigError(
            f"{out / KEY_FILE} already exists: a node keeps one Flower key (the operator registered it); "
            "give another directory to make a new one, then have the operator register it and unregister the old"
        )
    key = make_flower_key()
    binding = KeyBinding.sign(identity, roster, key.public_key())
    out.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return {
        KEY_FILE: write_file(out / KEY_FILE, pem, private=True),
        PUB_FILE: write_file(out / PUB_FILE, binding.public_openssh + b"\n", private=False),
        BINDING_FILE: write_file(
            out / BINDING_FILE, json.dumps(binding.to_dict(), indent=1).encode(), private=False
        ),
    }


def _verify_and_write(roster_path: str, binding_paths: Sequence[str], out_dir: str) -> NodeKeys:
    out = _folder(out_dir, "--out")
    roster = Roster.load(roster_path)
    bindings = verify_bindings(roster, [(f"binding {p}", KeyBinding.load(p)) for p in binding_paths])
    keys = NodeKeys(roster, tuple(bindings))
    pubs = {f"node-{b.index}.pub": b.public_openssh + b"\n" for b in bindings}  # every key rendered first
    listing = keys.to_json().encode()
    _check_earlier_list(out, roster, {b.index for b in bindings})
    out.mkdir(parents=True, exist_ok=True)
    for name, data in pubs.items():
        write_file(out / name, data, private=False)
    write_file(out / LIST_FILE, listing, private=False)
    return keys


def _check_earlier_list(out: Path, roster: Roster, indices: set[int]) -> None:
    """A list already in ``out`` is the whole federation's: a new one for another roster, or one that leaves out
    a node it holds, is refused (it silently dropped them, and their ``node-<i>.pub`` stayed to be registered)."""
    if not (out / LIST_FILE).exists():
        return
    try:
        earlier = NodeKeys.load(out / LIST_FILE)
    except ConfigError:
        earlier = None
    if earlier is None or earlier.roster.fingerprint != roster.fingerprint:
        raise ConfigError(
            f"--out {out} holds a {LIST_FILE} of another roster (or one that cannot be read); give this roster's "
            "list a new --out"
        )
    left_out = sorted({b.index for b in earlier.bindings} - indices)
    if left_out:
        raise ConfigError(
            f"--out {out} holds the list of roster nodes {sorted(b.index for b in earlier.bindings)}, and this one "
            f"leaves out node(s) {left_out}: verify every node's binding in one call (the list is the whole "
            "federation), or give a new --out"
        )


def _folder(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a folder to write into; an empty one is refused (it would mean the working folder)."""
    if not str(path).strip():
        raise ConfigError(f"{flag} is empty: name the folder to write into")
    return Path(path).expanduser()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m privfed.flower.deploy.auth",
        description="Bind Flower SuperNode keys to roster identities (see docs/flower.md).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    nk = sub.add_parser(
        "node-key", help="on a node: make its Flower key and sign it with its roster identity"
    )
    nk.add_argument(
        "directory", help="where flower-key, flower-key.pub and flower-key.binding.json are written"
    )
    nk.add_argument("--identity", required=True, help="the node's identity file (node-<i>.json)")
    nk.add_argument("--roster", required=True, help="the operator's roster.json")
    ver = sub.add_parser(
        "verify", help="operator: check the nodes' bindings, write the keys to register and node-keys.json"
    )
    ver.add_argument("bindings", nargs="+", help="each node's flower-key.binding.json")
    ver.add_argument("--roster", required=True, help="the roster.json the nodes' identities are in")
    ver.add_argument("--out", required=True, help="where node-<i>.pub and node-keys.json are written")
    a = p.parse_args(argv)
    try:
        if a.command == "node-key":
            roster = Roster.load(a.roster)
            ident = Identity.load(a.identity)
            written = write_node_key(a.directory, ident, roster)
            print(
                f"wrote {written[KEY_FILE]} (mode 0600: start the SuperNode with --auth-supernode-private-key "
                f"{shlex.quote(str(written[KEY_FILE]))}), {written[PUB_FILE]} and {written[BINDING_FILE]} (send this one to the "
                f"operator); roster node {ident.index}"
            )
        else:
            keys = _verify_and_write(a.roster, a.bindings, a.out)
            out = Path(a.out).expanduser()
            print(
                f"verified {len(keys.bindings)} binding(s) against the roster (nodes "
                f"{', '.join(str(b.index) for b in keys.bindings)}); register each with "
                f"flwr supernode register {shlex.quote(str(out))}/node-<i>.pub <superlink>, and run the app with "
                f"node-keys={shlex.quote(str(out / LIST_FILE))} on the SuperLink machine"
            )
    except PrivfedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder that cannot be made or read
        print(
            f"error: {exc.filename}: {exc.strerror or exc}; give a folder this user can write",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
