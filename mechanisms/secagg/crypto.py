"""Cryptographic building blocks of pairwise masking, shared by its node and server state machines.

Key material (:class:`KeySource`: OS entropy, or a seeded ChaCha20 stream
for reproducible tests), the mask PRG (AES-256-CTR keystream read as
uint64), HKDF-SHA256 key derivation, X25519 key handling, and
:class:`ProtocolAbort`, the error every participant raises when the
protocol stops without releasing a sum.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
import threading
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from mechanisms.secagg import shamir
from privfed.errors import PrivfedError

__all__ = [
    "GCM_NONCE_BYTES",
    "GCM_TAG_BYTES",
    "ID_BYTES",
    "INFO_CHANNEL",
    "INFO_PAIR",
    "INFO_SELF",
    "PUBLIC_KEY_BYTES",
    "SHARE_CIPHERTEXT_BYTES",
    "SHARE_PLAINTEXT_BYTES",
    "UNMASK_ANSWER_BYTES",
    "KeySource",
    "ProtocolAbort",
    "add_masks",
    "as_bytes",
    "as_int",
    "hkdf",
    "prg_buffer",
    "prg_uint64",
    "private_key",
    "pub_bytes",
    "public_key",
    "signed_bytes",
    "signed_parts",
]

PUBLIC_KEY_BYTES = 32
ID_BYTES = 4
GCM_NONCE_BYTES = 12
GCM_TAG_BYTES = 16
#: Plaintext of one encrypted share message: sender id, receiver id, share of s^SK, share of b.
SHARE_PLAINTEXT_BYTES = 2 * ID_BYTES + 2 * shamir.SHARE_BYTES
SHARE_CIPHERTEXT_BYTES = GCM_NONCE_BYTES + SHARE_PLAINTEXT_BYTES + GCM_TAG_BYTES
#: One unmasking answer: the client id it is about, a one-byte kind, the share.
UNMASK_ANSWER_BYTES = ID_BYTES + 1 + shamir.SHARE_BYTES

INFO_PAIR = b"privfed secagg pair mask"
INFO_SELF = b"privfed secagg self mask"
INFO_CHANNEL = b"privfed secagg share channel"


class ProtocolAbort(PrivfedError):
    """The protocol stopped without releasing a sum (dropouts, a malformed or deviating request).

    ``node`` is the participant that stopped (``None`` for the server),
    ``stage`` the protocol stage, ``deviation`` a short tag of what was seen
    (``"low-threshold"``, ``"inconsistent-lists"``, ``"tampered-share"``, ...).
    """

    def __init__(
        self, message: str, *, node: int | None = None, stage: str | None = None, deviation: str | None = None
    ) -> None:
        super().__init__(message)
        self.node, self.stage, self.deviation = node, stage, deviation


def as_bytes(value, what: str = "field") -> bytes:
    """``value`` if it is bytes (TypeError otherwise): ``bytes(n)`` of an int a server sent would allocate n bytes."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, got {type(value).__name__}")
    return bytes(value)


def as_int(value, what: str = "field") -> int:
    """``value`` if it is an integer, not a bool (TypeError otherwise: int() would take 2.7, "3" or True)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r:.40}")
    return int(value)


class KeySource:
    """Cryptographic random bytes for key material.

    ``seed=None`` (the default) reads the operating system's CSPRNG.  A seed
    gives a ChaCha20 keystream keyed by SHA-256(seed): reproducible runs for
    tests only; never deploy with a seed.
    """

    def __init__(self, seed: int | bytes | None = None) -> None:
        self.seeded = seed is not None
        if seed is None:
            self._enc = None
        else:
            raw = seed if isinstance(seed, bytes) else int(seed).to_bytes(16, "little", signed=False)
            key = hashlib.sha256(b"privfed key source" + raw).digest()
            self._enc = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor()

    def __call__(self, n: int) -> bytes:
        if self._enc is None:
            return os.urandom(n)
        return self._enc.update(b"\x00" * n)

    def field_element(self) -> int:
        """A uniform 32-byte integer below :data:`shamir.PRIME` (rejection sampling)."""
        return self.field_elements(1)[0]

    def field_elements(self, n: int) -> list[int]:
        """``n`` uniform integers below :data:`shamir.PRIME` (rejection sampling), their bytes drawn at once: the
        same values, from the same stream, as ``n`` calls of :meth:`field_element`."""
        return [int.from_bytes(c, "little") for c in shamir.field_elements(n, self)]

    def ahead(self, n: int) -> Callable[[int], bytes]:
        """A byte source reading this one's stream in the same order, its next ``n`` bytes drawn at once (a
        stage's coefficients and nonces in one call to the OS instead of one each); past them it reads this
        source again."""
        pool = memoryview(self(n))

        def read(k: int) -> bytes:
            nonlocal pool
            head, pool = pool[:k], pool[k:]
            return bytes(head) if len(head) == k else bytes(head) + self(k - len(head))

        return read


def prg_uint64(key: bytes, n: int, buffer: bytearray | None = None) -> np.ndarray:
    """n pseudorandom uint64 from the AES-256-CTR keystream under ``key`` (32 bytes), zero IV.

    Each key is used for one expansion only (fresh per pair and run).  With
    ``buffer`` (from :func:`prg_buffer`) the keystream is written there and
    the returned array is a view of it, valid until the next call.
    """
    if n == 0:
        return np.zeros(0, np.uint64)
    enc = _keystream(key)
    buf = prg_buffer(n) if buffer is None else buffer
    enc.update_into(_zeros(8 * n), buf)
    return np.frombuffer(buf, dtype=np.uint64, count=n)


def prg_buffer(n: int) -> bytearray:
    """A reusable output buffer for :func:`prg_uint64` of ``n`` values (one AES block of slack)."""
    return bytearray(8 * n + 16)


_ZEROS = bytes(0)


def _zeros(nbytes: int) -> memoryview:
    """A shared read-only buffer of ``nbytes`` zero bytes (the CTR plaintext)."""
    global _ZEROS
    if len(_ZEROS) < nbytes:
        _ZEROS = bytes(nbytes)
    return memoryview(_ZEROS)[:nbytes]


#: Values per keystream block in :func:`add_masks` (512 KiB of scratch whatever the vector length: the
#: block and the vector's part stay in a core's L2 cache; a 51,200-value vector is one block, so each
#: key costs one keystream call and one addition).
MASK_BLOCK = 65_536
#: Cipher contexts held at once by :func:`add_masks`.
KEY_GROUP = 256

#: The one CTR mode object every keystream starts from: the zero IV (each key is expanded once, fresh
#: per pair and run), built once instead of once per key.
_ZERO_IV_CTR = modes.CTR(b"\x00" * 16)


_SCRATCH = threading.local()


def _scratch(n: int) -> bytearray:
    """This thread's keystream scratch of at least ``n`` values (kept: a run masks one vector per node, and
    allocating a zeroed block each time costs as much as a few additions)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < 8 * n + 16:
        buf = _SCRATCH.buf = prg_buffer(n)
    return buf


def _keystream(key: bytes):
    """An AES-256-CTR encryptor under ``key`` from the zero IV (its ``update_into`` writes the keystream)."""
    return Cipher(algorithms.AES(key), _ZERO_IV_CTR).encryptor()


def add_masks(y: np.ndarray, keys: list[bytes], signs: list[bool]) -> None:
    """In place, y += PRG(key) where the sign is True and y -= PRG(key) where False (mod 2^64).

    PRG(key) is :func:`prg_uint64`'s keystream (AES-256-CTR, zero IV), produced
    block by block from one cipher context per key (CTR continues across
    blocks), so the scratch buffer stays small for long vectors.  ``y`` is a
    contiguous uint64 vector.
    """
    n = y.size
    if n == 0 or not keys:
        return
    block = min(n, MASK_BLOCK)
    buf = _scratch(block)
    stream = np.frombuffer(buf, dtype=np.uint64, count=block)
    zeros = _zeros(8 * block)
    for g in range(0, len(keys), KEY_GROUP):
        contexts = [
            (_keystream(k).update_into, np.add if plus else np.subtract)
            for k, plus in zip(keys[g : g + KEY_GROUP], signs[g : g + KEY_GROUP])
        ]
        for start in range(0, n, block):
            part = y[start : start + block]
            m = part.size
            plain, mask = (zeros, stream) if m == block else (zeros[: 8 * m], stream[:m])
            for update, op in contexts:
                update(plain, buf)
                op(part, mask, out=part)


def hkdf(secret: bytes, info: bytes) -> bytes:
    """32 bytes of HKDF-SHA256 (RFC 5869) of ``secret`` under ``info`` (no salt).

    The extract step is HMAC-SHA256 under the all-zero salt, a fixed key: its inner and outer SHA-256
    states after the padded key (RFC 2104: H(K xor opad || H(K xor ipad || m))) are made once and copied
    for each secret; the expand step is the one block T(1) = HMAC(PRK, info || 0x01).  The same bytes as
    ``cryptography``'s ``HKDF`` (tested), without building a KDF or HMAC object per key: a run derives two
    keys per pair.
    """
    inner = _EXTRACT_INNER.copy()
    inner.update(secret)
    outer = _EXTRACT_OUTER.copy()
    outer.update(inner.digest())
    return hmac.digest(outer.digest(), bytes(info) + b"\x01", "sha256")


#: HKDF's default salt for SHA-256: HashLen zero bytes (RFC 5869, section 2.2), padded to SHA-256's
#: 64-byte block as HMAC pads its key.
_ZERO_SALT_BLOCK = bytes(64)
#: SHA-256 after the salt's inner and outer HMAC pads: the extract step's states before any secret
#: (copied, never updated).
_EXTRACT_INNER = hashlib.sha256(bytes(b ^ 0x36 for b in _ZERO_SALT_BLOCK))
_EXTRACT_OUTER = hashlib.sha256(bytes(b ^ 0x5C for b in _ZERO_SALT_BLOCK))


def pub_bytes(key: X25519PublicKey) -> bytes:
    """The raw 32-byte encoding of an X25519 public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_key(k: int) -> X25519PrivateKey:
    """The X25519 private key whose raw bytes are ``k`` (little endian)."""
    return X25519PrivateKey.from_private_bytes(k.to_bytes(32, "little"))


def public_key(raw: bytes) -> X25519PublicKey:
    """An X25519 public key from its 32 raw bytes (parsed once per key: each is agreed with by every neighbour).

    Public keys are public, so the parsed objects of the most recent :data:`PUBLIC_KEY_CACHE` distinct
    keys are kept (a run in one process parses each advertised key once, not once per neighbour).
    """
    return _parsed_public_key(bytes(raw))


#: Distinct public keys whose parsed objects :func:`public_key` keeps (two per node of a 2,000-node run).
PUBLIC_KEY_CACHE = 4096


@functools.lru_cache(maxsize=PUBLIC_KEY_CACHE)
def _parsed_public_key(raw: bytes) -> X25519PublicKey:
    return X25519PublicKey.from_public_bytes(raw)


def signed_bytes(label: str, *parts: bytes | int | list[int]) -> bytes:
    """The exact bytes a signature covers: a label, then each part length-prefixed (no ambiguity).

    Each part is encoded on its own, so ``signed_bytes(label, *a) + signed_parts(*b)`` equals
    ``signed_bytes(label, *a, *b)``: a caller that signs or checks many messages sharing their first parts
    encodes those once (:func:`signed_parts`)."""
    return b"privfed secagg v1\x00" + label.encode() + b"\x00" + signed_parts(*parts)


def signed_parts(*parts: bytes | int | list[int]) -> bytes:
    """The parts of :func:`signed_bytes` after its label: an int as 8 bytes (signed), a list of ids as 4
    bytes each (OverflowError outside 0..2^32 - 1), bytes as they are; each prefixed by its length."""
    out = []
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "little", signed=True)
        elif isinstance(p, list):
            try:
                p = struct.pack(f"<{len(p)}I", *p)
            except struct.error as exc:  # a negative, huge or non-integer id
                raise OverflowError(f"an id list that is not 4-byte ids ({exc})") from None
        out += [len(p).to_bytes(8, "little"), bytes(p)]
    return b"".join(out)
