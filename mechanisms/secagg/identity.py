"""Node identities for secure aggregation against a deviating server: Ed25519 keys and the roster.

Bonawitz et al. (CCS 2017), active-adversary version: every node holds a long-term signing key, and the list
of the nodes' public keys (the *roster*) comes from the operator, never from the server.  A node checks
every key advertisement, consistency signature and CKKS public context against the roster, and takes the
protocol's size K and threshold t from it: a server that asks for another K or t, or slips in a key of its
own (a Sybil), is refused.

The roster also fixes t: at least 2 and above n_C + (K - n_C)/2, where up to n_C nodes may collude with the
server (``colluders``; Bonawitz et al., Sec. 6), so two different survivor lists can never both collect t
signatures from honest nodes.  The default declares one colluder and takes the smallest threshold that
tolerates it (:func:`mechanisms.secagg.threat.default_threshold`); a roster whose threshold tolerates no
colluder is made only when the operator declares ``colluders=0`` (``--colluders 0``), and a roster file
written before rosters recorded that choice (version 1 or 2) is refused when its threshold tolerates none.
The roster also carries the public bounds a node checks the server's messages against
(:mod:`mechanisms.secagg.bounds`).

SecAgg+ (Bell et al., CCS 2020): with ``degree=k`` the roster also carries the graph, a uniform ring order
of the nodes drawn here from OS entropy (:mod:`mechanisms.secagg.graph`), so the server cannot choose it;
each node masks with and shares among its k neighbours only, and t is then a threshold of every group of
k + 1 (itself and its neighbours): at least 2, 2t > k + 1 + n_C and t <= k + 1 (the argument is in
:mod:`mechanisms.secagg.masking.node`).  A roster without a degree is the complete graph (k + 1 = K), and
its fingerprint is what it always was.

Deployment: the operator runs once ::

    python -m mechanisms.secagg.identity DIR --nodes K [--threshold T] [--colluders C] [--degree k]
        [--max-records N] [--means-per-node M] [--frac-bits F]

which writes ``DIR/roster.json`` (public: give it to every node) and
``DIR/node-<i>.json`` (node i's private key, mode 0600: give it to node i
only); on each node, once, ::

    python -m mechanisms.secagg.identity --init-ledger FILE --roster DIR/roster.json

creates its ledger file bound to the roster's fingerprint (:mod:`privfed.results.ledger`); then it starts
each SuperNode with
``--node-config 'secagg-identity="DIR/node-<i>.json" secagg-roster="DIR/roster.json" secagg-ledger="FILE" ...'``
(Flower reads the values as TOML: text in double quotes, absolute paths)
(the ledger file, kept on the node across runs, is required, and a missing one is refused: see
:mod:`privfed.flower.secagg`).
Simulations (:func:`privfed.flower.simulation.run_simulation`, the
in-process grid) generate the roster in the app from OS entropy.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from functools import cached_property

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from mechanisms.secagg.bounds import DEFAULTS, PublicBounds
from mechanisms.secagg.crypto import KeySource, signed_bytes
from mechanisms.secagg.graph import check_degree, draw_ring, group_size, ring_neighbours
from mechanisms.secagg.threat import (
    DEFAULT_COLLUDERS,
    colluders_tolerated,
    default_threshold,
    min_threshold,
    threshold_rule,
)
from privfed._files import interruptible, path_of, signals_held
from privfed._validation import check_memory, is_integer, read_regular_text
from privfed.errors import ConfigError, InputError, PrivfedError

__all__ = [
    "ROSTER_VERSION",
    "Identity",
    "Roster",
    "make_roster",
    "min_threshold",
]

SIGNATURE_BYTES = 64
#: The roster file format: 3 records the declared colluders as the operator's choice, and the public bounds.
ROSTER_VERSION = 3


@dataclass(frozen=True)
class Roster:
    """The operator's list of node identity public keys, with the protocol's K and t.

    ``degree`` and ``ring`` (both or neither): the SecAgg+ graph, k-regular Harary on the ring order ``ring``
    (see :mod:`mechanisms.secagg.graph`); without them the complete graph.
    """

    public_keys: tuple[bytes, ...]
    threshold: int
    colluders: int = 0
    degree: int | None = None
    ring: tuple[int, ...] | None = None
    bounds: PublicBounds = DEFAULTS

    def __post_init__(self) -> None:
        if not isinstance(self.bounds, PublicBounds):
            raise ConfigError(f"a roster's bounds must be PublicBounds, got {type(self.bounds).__name__}")
        K = len(self.public_keys)
        if K < 2:
            raise ConfigError(f"a secure-aggregation roster needs at least 2 nodes, got {K}")
        if len(set(self.public_keys)) != K or any(len(k) != 32 for k in self.public_keys):
            raise ConfigError("the roster's public keys must be distinct 32-byte Ed25519 keys")
        if isinstance(self.colluders, bool) or not 0 <= int(self.colluders) < K:
            raise ConfigError(f"roster colluders={self.colluders!r} must lie in 0..{K - 1}")
        if (self.degree is None) != (self.ring is None):
            raise ConfigError(
                "a roster's SecAgg+ graph needs both its degree and its ring order (make it with "
                "make_roster(..., degree=k)); give both or neither (complete graph)"
            )
        if self.degree is not None:
            check_degree(self.degree, K, "roster degree")
            if sorted(self.ring) != list(range(K)) or any(isinstance(v, bool) for v in self.ring):
                raise ConfigError(f"the roster's ring must order the nodes 0..{K - 1}, each once")
        n = self.group_size
        low = min_threshold(n, self.colluders)
        if isinstance(self.threshold, bool) or not low <= int(self.threshold) <= n:
            if self.degree is None:
                raise ConfigError(
                    f"roster threshold t={self.threshold!r} must lie in [{low}, {K}] for K={K} nodes and "
                    f"{self.colluders} colluder(s): t >= 2 and t > n_C + (K - n_C)/2, so that a server "
                    "cannot collect t signatures on two different survivor lists; "
                    + ("raise the threshold" if int(self.threshold) < low else "lower the threshold")
                )
            raise ConfigError(
                f"roster threshold t={self.threshold!r} must lie in [{low}, {n}] for degree k={self.degree} "
                f"(groups of k + 1 = {n}) and {self.colluders} colluder(s): t >= 2 and 2t > k + 1 + n_C, so "
                "that a server never collects t shares of both seeds of a node in its group, and t <= k + 1"
                + ("; raise the degree" if low > n else "; choose t in that range")
            )

    @property
    def size(self) -> int:
        return len(self.public_keys)

    @property
    def group_size(self) -> int:
        """Share holders of each node: itself and its neighbours (K on the complete graph, else k + 1)."""
        return group_size(self.size, self.degree)

    @cached_property
    def graph(self) -> list[frozenset[int]]:
        """Every node's neighbours (all others on the complete graph)."""
        if self.degree is None:
            return [frozenset(range(self.size)) - {u} for u in range(self.size)]
        return ring_neighbours(self.ring, self.degree)

    @cached_property
    def groups(self) -> list[frozenset[int]]:
        """Every node's group: itself and its neighbours (its share holders)."""
        return [nbrs | {u} for u, nbrs in enumerate(self.graph)]

    @property
    def tolerated(self) -> int:
        """Colluders the threshold tolerates (2t - n - 1, :func:`mechanisms.secagg.threat.colluders_tolerated`)."""
        return colluders_tolerated(self.group_size, self.threshold)

    @property
    def sum_threshold(self) -> int:
        """Fewest inputs a protocol that sums all nodes at once (CKKS) may release: a majority of K."""
        return max(int(self.threshold), min_threshold(self.size, self.colluders))

    @cached_property
    def fingerprint(self) -> bytes:
        """SHA-256 of the roster (keys, t, n_C, the graph, the public bounds): every signed message names the
        roster it belongs to.  Rosters with default bounds keep the fingerprint they had before bounds."""
        if self.degree is None:  # the complete graph: the fingerprint of rosters made before graphs
            parts = signed_bytes("roster", self.threshold, self.colluders, *self.public_keys)
        else:
            parts = signed_bytes(
                "roster-graph",
                self.threshold,
                self.colluders,
                int(self.degree),
                list(self.ring),
                *self.public_keys,
            )
        b = self.bounds
        if PublicBounds(b.max_records, b.means_per_node, b.frac_bits) != DEFAULTS:
            parts += signed_bytes("roster-bounds", b.max_records, b.means_per_node, b.frac_bits)
        if b.weight_ratio != DEFAULTS.weight_ratio:  # rosters made before the ratio keep their fingerprint
            parts += signed_bytes("roster-weight-ratio", b.weight_ratio)
        return hashlib.sha256(parts).digest()

    def __getstate__(self) -> dict:
        """Pickled without its parsed keys (they are not picklable, and are parsed again on use)."""
        return {k: v for k, v in self.__dict__.items() if k != "_verifiers"}

    @cached_property
    def _verifiers(self) -> dict[int, Ed25519PublicKey]:
        """Parsed public keys, each parsed on its first use (a roster of K nodes is read by nodes that check
        only their k neighbours' signatures)."""
        return {}

    def verify(self, index: int, signature: bytes, message: bytes) -> bool:
        """Whether ``signature`` on ``message`` verifies under node ``index``'s roster key."""
        if not (isinstance(index, int) and 0 <= index < self.size) or len(signature) != SIGNATURE_BYTES:
            return False
        key = self._verifiers.get(index)
        if key is None:
            key = self._verifiers[index] = Ed25519PublicKey.from_public_bytes(self.public_keys[index])
        try:
            key.verify(bytes(signature), message)
        except InvalidSignature:
            return False
        return True

    def to_json(self) -> str:
        out = {
            "version": ROSTER_VERSION,
            "threshold": int(self.threshold),
            "colluders": int(self.colluders),
            "public_keys": [k.hex() for k in self.public_keys],
            "bounds": self.bounds.as_dict(),
        }
        if self.degree is not None:
            out.update(degree=int(self.degree), ring=[int(v) for v in self.ring])
        return json.dumps(out, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "roster") -> Roster:
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or type(raw.get("version", 1)) is not int:
                raise ValueError("not a JSON object with an integer version")
            if raw.get("version", 1) > ROSTER_VERSION:  # its layout or meaning may have changed
                raise ConfigError(
                    f"{source} is a version {raw['version']} roster; this privfed reads up to version "
                    f"{ROSTER_VERSION}: install the privfed that wrote it"
                )
            degree, ring = raw.get("degree"), raw.get("ring")
            threshold, colluders = raw["threshold"], raw.get("colluders", 0)

            whole = is_integer  # a JSON integer: not a bool, not a float that int() would truncate
            if not (whole(threshold) and whole(colluders)):
                raise ValueError(
                    f"threshold and colluders must be integers, got {threshold!r}, {colluders!r}"
                )
            if (degree is not None and not whole(degree)) or not (
                ring is None or (isinstance(ring, list) and all(whole(v) for v in ring))
            ):
                raise ValueError("degree must be an integer and ring a list of node indices")
            roster = cls(
                public_keys=tuple(bytes.fromhex(k) for k in raw["public_keys"]),
                threshold=threshold,
                colluders=colluders,
                degree=degree,
                ring=None if ring is None else tuple(ring),
                bounds=PublicBounds.from_dict(raw.get("bounds"), source),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            why = f"it has no {exc.args[0]!r} field" if isinstance(exc, KeyError) else str(exc)
            if isinstance(exc, KeyError) and isinstance(raw, dict) and {"index", "private_key"} <= raw.keys():
                why += ": it is a node's identity file (node-<i>.json); the roster is roster.json beside it"
            raise ConfigError(
                f"{source} is not a privfed roster (JSON with public_keys, threshold): {why}"
            ) from None
        if raw.get("version", 1) < ROSTER_VERSION and roster.tolerated == 0:
            raise ConfigError(
                f"{source} was written before rosters recorded their colluders, and its threshold "
                f"t={roster.threshold} tolerates no colluding node (a node colluding with the server can unmask "
                "a neighbour); write a new roster with python -m mechanisms.secagg.identity (default: "
                f"{threshold_rule()}), or --colluders 0 to accept that"
            )
        return roster

    @classmethod
    def load(cls, path: str | os.PathLike) -> Roster:
        p = path_of(path, "secagg-roster", "pass the roster file the operator wrote")
        if not p.exists():
            raise ConfigError(
                f"secagg-roster={path}: no such file; the operator writes it with "
                "python -m mechanisms.secagg.identity"
            )
        text = read_regular_text(p, f"secagg-roster={path}", "pass the roster file the operator wrote")
        return cls.from_json(text, f"secagg-roster={path}")


@dataclass(frozen=True)
class Identity:
    """One node's long-term signing key and its index in the roster."""

    index: int
    private_key: bytes  # raw 32-byte Ed25519 private key

    def __post_init__(self) -> None:  # an index of 1.7 or true was node 1; a short key failed only at use
        i, key = self.index, self.private_key
        if not is_integer(i) or i < 0:  # numpy integers too
            raise ConfigError(f"an identity's index must be an integer >= 0, got {i!r}")
        if not isinstance(key, (bytes, bytearray, memoryview)) or len(bytes(key)) != 32:  # never shown
            raise ConfigError("an identity's private_key must be 32 bytes (a raw Ed25519 private key)")
        for name, value in (("index", int(i)), ("private_key", bytes(key))):
            object.__setattr__(self, name, value)

    def __getstate__(self) -> dict:
        """Pickled without its parsed key (not picklable; parsed again on use)."""
        return {k: v for k, v in self.__dict__.items() if k != "_key"}

    @cached_property
    def _key(self) -> Ed25519PrivateKey:
        """The parsed signing key, parsed once (parsing costs as much as a signature)."""
        return Ed25519PrivateKey.from_private_bytes(self.private_key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    @cached_property
    def public_key(self) -> bytes:
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

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
        if not (p := path_of(path, "secagg-identity", "pass the node's identity file")).exists():
            raise ConfigError(f"secagg-identity={path}: no such file")
        raw = read_regular_text(p, f"secagg-identity={path}", "pass the node's identity file")
        try:
            raw = json.loads(raw)
            return cls(index=raw["index"], private_key=bytes.fromhex(raw["private_key"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"secagg-identity={path} is not a privfed identity file: {exc}") from None


def make_roster(
    num_nodes: int,
    threshold: int | None = None,
    colluders: int | None = None,
    seed: int | bytes | None = None,
    degree: int | None = None,
    bounds: PublicBounds | None = None,
) -> tuple[Roster, list[Identity]]:
    """Fresh identities for ``num_nodes`` nodes and their roster (OS entropy; ``seed`` for tests only).

    ``colluders`` (default :data:`~mechanisms.secagg.threat.DEFAULT_COLLUDERS`) is the number of nodes the
    operator declares may collude with the server: the threshold must tolerate them.  The default threshold
    is the larger of :func:`~mechanisms.secagg.threat.default_threshold` (which tolerates at least one
    colluder) and the smallest that tolerates the declared ones.  ``degree=k`` draws a SecAgg+ graph (a
    uniform ring order, from the same key source) into the roster; thresholds are then per group of k + 1.
    """
    colluders = DEFAULT_COLLUDERS if colluders is None else colluders
    if not (is_integer(num_nodes) and num_nodes >= 1):  # 2.7 was cut to 2 nodes, a negative count read as 0
        raise ConfigError(f"a roster needs a whole number of nodes >= 1, got {num_nodes!r}")
    if not (is_integer(colluders) and (threshold is None or is_integer(threshold))):  # "3" or 1.5: no count
        raise ConfigError(f"threshold and colluders must be whole numbers, got {threshold!r}, {colluders!r}")
    if degree is not None:
        check_degree(degree, int(num_nodes))
    # about 700 bytes a node in memory (its identity and roster key): refused before any key is drawn
    try:  # a setting, refused as one
        check_memory(
            1_000 * int(num_nodes), f"a roster of {int(num_nodes):,} nodes", "pass fewer nodes (--nodes)"
        )
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    keys = KeySource(seed)
    raw = (serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    ids = [
        Identity(i, Ed25519PrivateKey.from_private_bytes(keys(32)).private_bytes(*raw))
        for i in range(int(num_nodes))
    ]
    ring = None if degree is None else tuple(draw_ring(int(num_nodes), keys))
    n = int(num_nodes) if degree is None else min(int(num_nodes), int(degree) + 1)
    t = max(default_threshold(n), min_threshold(n, colluders)) if threshold is None else int(threshold)
    return (
        Roster(
            tuple(i.public_key for i in ids),
            t,
            int(colluders),
            degree,
            ring,
            DEFAULTS if bounds is None else bounds,
        ),
        ids,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mechanisms.secagg.identity",
        description="Write a secure-aggregation roster and one identity file per node; or, on a node, create "
        "its ledger file (--init-ledger FILE --roster ROSTER).",
    )
    p.add_argument("directory", nargs="?")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument(
        "--threshold", type=int, default=None, help=f"Shamir threshold t (default: {threshold_rule()})"
    )
    p.add_argument(
        "--colluders",
        type=int,
        default=None,
        help=f"nodes that may collude with the server (default {DEFAULT_COLLUDERS}); 0 accepts a threshold "
        "that tolerates none (CKKS needs 0: its key holder decrypts every input)",
    )
    p.add_argument(
        "--degree",
        type=int,
        default=None,
        help="SecAgg+ degree k (even): a random k-regular graph drawn into the roster; default complete",
    )
    p.add_argument(
        "--max-records", type=int, default=DEFAULTS.max_records, help="public bound: records a node holds"
    )
    p.add_argument(
        "--means-per-node",
        type=int,
        default=DEFAULTS.means_per_node,
        help="public bound: FedCOF means per node",
    )
    p.add_argument(
        "--frac-bits", type=int, default=DEFAULTS.frac_bits, help="fixed-point fractional bits of masked sums"
    )
    p.add_argument(
        "--max-weight-ratio",
        type=int,
        default=DEFAULTS.weight_ratio,
        help="public bound: FedCOF's largest round-2 class weight over its smallest",
    )
    p.add_argument("--init-ledger", metavar="FILE", default=None, help="on a node: create its ledger file")
    p.add_argument("--roster", metavar="ROSTER", default=None, help="with --init-ledger: the roster file")
    a = p.parse_args(argv)
    from mechanisms.secagg.roster_files import ROSTER_FILE, holds_roster, write_roster_folder

    # SIGTERM (kill, a scheduler) or SIGHUP is handled as Ctrl-C (privfed's Terminated): nothing half-written
    # is kept
    held, roster = contextlib.ExitStack(), None
    held.enter_context(interruptible())
    try:
        if a.init_ledger is not None:
            if a.directory is not None or a.nodes is not None:
                raise ConfigError(
                    "--init-ledger runs on a node: drop DIR and --nodes (or drop --init-ledger)"
                )
            if a.roster is None:
                raise ConfigError(
                    "--init-ledger FILE needs --roster ROSTER (the roster.json the node runs with)"
                )
            from mechanisms.secagg.ledger import init_ledger_file  # the node's ledger, bound to the roster

            roster = Roster.load(a.roster)
            what = init_ledger_file(a.init_ledger, roster.fingerprint)
            print(f"{what} {a.init_ledger} (bound to the roster {roster.fingerprint.hex()[:16]}...)")
            return 0
        if a.directory is None or a.nodes is None:
            raise ConfigError(
                "give DIR and --nodes K to write a roster (or --init-ledger FILE --roster ROSTER)"
            )
        bounds = PublicBounds(a.max_records, a.means_per_node, a.frac_bits, a.max_weight_ratio)
        roster, ids = make_roster(a.nodes, a.threshold, a.colluders, degree=a.degree, bounds=bounds)
        out = write_roster_folder(a.directory, roster.to_json(), [(i.index, i.to_json()) for i in ids])
    except PrivfedError as exc:  # a ConfigError, or an InputError (a roster that is a folder, not UTF-8)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # what it was writing is removed (write_roster_folder)
        # a second signal while it looks and says so is held (and dropped: the first is the exit's)
        with signals_held(reraise=False), contextlib.suppress(OSError):  # OSError: a closed terminal
            whole = (
                a.init_ledger is None and roster is not None and holds_roster(a.directory, roster.to_json())
            )
            print(
                f"interrupted after the roster was written: {a.directory} holds it whole"
                if whole
                else "interrupted" + ("" if a.init_ledger else "; nothing of this roster was kept"),
                file=sys.stderr,
            )
        return 128 + getattr(exc, "signum", signal.SIGINT)
    finally:
        held.close()
    print(
        f"wrote {out / ROSTER_FILE} (K={roster.size}, t={roster.threshold}, "
        f"graph={'complete' if roster.degree is None else f'{roster.degree}-regular'}, colluders declared "
        f"{roster.colluders}, tolerated {roster.tolerated}) and {len(ids)} identity files; on node i, once: "
        f"python -m mechanisms.secagg.identity --init-ledger FILE --roster {(out / ROSTER_FILE).resolve()}; then "
        f'start it with --node-config \'secagg-identity="{out.resolve()}/node-i.json" '
        f'secagg-roster="{(out / ROSTER_FILE).resolve()}" secagg-ledger="FILE"\' (FILE on the node, an '
        "absolute path, kept across runs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
