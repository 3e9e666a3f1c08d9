"""Node identities for secure aggregation against a deviating server: Ed25519 keys and the roster.

Bonawitz et al. (CCS 2017), active-adversary version: every node holds a
long-term signing key, and the list of the nodes' public keys (the
*roster*) comes from the operator, never from the server.  A node checks
every key advertisement, consistency signature and CKKS public context
against the roster, and takes the protocol's size K and threshold t from it:
a server that asks for another K or t, or slips in a key of its own
(a Sybil), is refused.

The roster also fixes t: at least 2 and above n_C + (K - n_C)/2, where up to
n_C nodes may collude with the server (``colluders``; Bonawitz et al.,
Sec. 6), so two different survivor lists can never both collect t
signatures from honest nodes.

Deployment: the operator runs once ::

    python -m mechanisms.secagg_identity DIR --nodes K [--threshold T] [--colluders C]

which writes ``DIR/roster.json`` (public: give it to every node) and
``DIR/node-<i>.json`` (node i's private key, mode 0600: give it to node i
only), and starts each SuperNode with
``--node-config "secagg-identity=DIR/node-<i>.json secagg-roster=DIR/roster.json ..."``.
Simulations (:func:`privfed.flower.simulation.run_simulation`, the
in-process grid) generate the roster in the app from OS entropy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from mechanisms.secagg_crypto import KeySource
from privfed.errors import ConfigError

__all__ = ["Identity", "Roster", "make_roster", "min_threshold", "signed_bytes"]

SIGNATURE_BYTES = 64


def min_threshold(num_nodes: int, colluders: int = 0) -> int:
    """Smallest t with t >= 2 and t > n_C + (K - n_C)/2 (Bonawitz et al. 2017, Sec. 6)."""
    K, c = int(num_nodes), int(colluders)
    return max(2, (K + c) // 2 + 1)


def signed_bytes(label: str, *parts: bytes | int | list[int]) -> bytes:
    """The exact bytes a signature covers: a label, then each part length-prefixed (no ambiguity)."""
    out = [b"privfed secagg v1\x00", label.encode(), b"\x00"]
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "little", signed=True)
        elif isinstance(p, list):
            p = b"".join(int(v).to_bytes(4, "little") for v in p)
        out += [len(p).to_bytes(8, "little"), bytes(p)]
    return b"".join(out)


@dataclass(frozen=True)
class Roster:
    """The operator's list of node identity public keys, with the protocol's K and t."""

    public_keys: tuple[bytes, ...]
    threshold: int
    colluders: int = 0

    def __post_init__(self) -> None:
        K = len(self.public_keys)
        if K < 2:
            raise ConfigError(f"a secure-aggregation roster needs at least 2 nodes, got {K}")
        if len(set(self.public_keys)) != K or any(len(k) != 32 for k in self.public_keys):
            raise ConfigError("the roster's public keys must be distinct 32-byte Ed25519 keys")
        if isinstance(self.colluders, bool) or not 0 <= int(self.colluders) < K:
            raise ConfigError(f"roster colluders={self.colluders!r} must lie in 0..{K - 1}")
        low = min_threshold(K, self.colluders)
        if isinstance(self.threshold, bool) or not low <= int(self.threshold) <= K:
            raise ConfigError(
                f"roster threshold t={self.threshold!r} must lie in [{low}, {K}] for K={K} nodes and "
                f"{self.colluders} colluder(s): t >= 2 and t > n_C + (K - n_C)/2, so that a server cannot "
                "collect t signatures on two different survivor lists; raise the threshold"
            )

    @property
    def size(self) -> int:
        return len(self.public_keys)

    @property
    def fingerprint(self) -> bytes:
        """SHA-256 of the roster (keys, t, n_C): every signed message names the roster it belongs to."""
        return hashlib.sha256(
            signed_bytes("roster", self.threshold, self.colluders, *self.public_keys)
        ).digest()

    def verify(self, index: int, signature: bytes, message: bytes) -> bool:
        """Whether ``signature`` on ``message`` verifies under node ``index``'s roster key."""
        if not (isinstance(index, int) and 0 <= index < self.size) or len(signature) != SIGNATURE_BYTES:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(self.public_keys[index]).verify(bytes(signature), message)
        except InvalidSignature:
            return False
        return True

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "threshold": int(self.threshold),
                "colluders": int(self.colluders),
                "public_keys": [k.hex() for k in self.public_keys],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, source: str = "roster") -> Roster:
        try:
            raw = json.loads(text)
            return cls(
                public_keys=tuple(bytes.fromhex(k) for k in raw["public_keys"]),
                threshold=int(raw["threshold"]),
                colluders=int(raw.get("colluders", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(
                f"{source} is not a privfed roster (JSON with public_keys, threshold): {exc}"
            ) from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> Roster:
        p = pathlib.Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(
                f"secagg-roster={path}: no such file; the operator writes it with "
                "python -m mechanisms.secagg_identity"
            )
        return cls.from_json(p.read_text(), f"secagg-roster={path}")


@dataclass(frozen=True)
class Identity:
    """One node's long-term signing key and its index in the roster."""

    index: int
    private_key: bytes  # raw 32-byte Ed25519 private key

    def sign(self, message: bytes) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.private_key).sign(message)

    @property
    def public_key(self) -> bytes:
        return (
            Ed25519PrivateKey.from_private_bytes(self.private_key)
            .public_key()
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )

    def check(self, roster: Roster) -> Identity:
        """This identity, if the roster lists its public key at its index (ConfigError otherwise)."""
        if not 0 <= self.index < roster.size or roster.public_keys[self.index] != self.public_key:
            raise ConfigError(
                f"this node's identity key (index {self.index}) is not in the roster; the operator "
                "must distribute the roster that lists it"
            )
        return self

    def to_json(self) -> str:
        return json.dumps({"index": int(self.index), "private_key": self.private_key.hex()})

    @classmethod
    def load(cls, path: str | os.PathLike) -> Identity:
        p = pathlib.Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"secagg-identity={path}: no such file")
        try:
            raw = json.loads(p.read_text())
            return cls(index=int(raw["index"]), private_key=bytes.fromhex(raw["private_key"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"secagg-identity={path} is not a privfed identity file: {exc}") from None


def make_roster(
    num_nodes: int, threshold: int | None = None, colluders: int = 0, seed: int | bytes | None = None
) -> tuple[Roster, list[Identity]]:
    """Fresh identities for ``num_nodes`` nodes and their roster (OS entropy; ``seed`` for tests only)."""
    keys = KeySource(seed)
    ids = []
    for i in range(int(num_nodes)):
        sk = Ed25519PrivateKey.from_private_bytes(keys(32))
        ids.append(
            Identity(
                i,
                sk.private_bytes(
                    serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
                ),
            )
        )
    t = min_threshold(num_nodes, colluders) if threshold is None else int(threshold)
    return Roster(tuple(i.public_key for i in ids), t, int(colluders)), ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mechanisms.secagg_identity",
        description="Write a secure-aggregation roster and one identity file per node.",
    )
    p.add_argument("directory")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--threshold", type=int, default=None)
    p.add_argument("--colluders", type=int, default=0)
    a = p.parse_args(argv)
    try:
        roster, ids = make_roster(a.nodes, a.threshold, a.colluders)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = pathlib.Path(a.directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "roster.json").write_text(roster.to_json())
    for ident in ids:
        path = out / f"node-{ident.index}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(ident.to_json())
    print(
        f"wrote {out / 'roster.json'} (K={roster.size}, t={roster.threshold}) and {len(ids)} identity files"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
