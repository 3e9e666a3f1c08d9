"""The cryptographic floor of the active masking protocol: its public-key work and PRG, counted where the
protocol's code calls them and timed alone with ``cryptography``.

:func:`counting` wraps the call sites of :mod:`mechanisms.secagg.masking.node` and
:mod:`mechanisms.secagg.masking.server` for the duration of a run and counts, per process:

* ``sign`` / ``verify``: Ed25519 signatures made and checked (:meth:`Identity.sign`, :meth:`Roster.verify`);
* ``x25519``: X25519 agreements (each ``exchange`` of a private key the node or server loaded);
* ``x25519_load``: X25519 private keys loaded (a key pair drawn by a node, a key the server rebuilt from
  shares), each costing a scalar multiplication;
* ``prg_values``: values of mask keystream expanded (AES-256-CTR, :func:`add_masks`), and ``prg`` the
  expansions.

:func:`unit_seconds` times each operation alone, the way the protocol calls it (parsed keys, messages
of the length the protocol signs, keystream into a reusable buffer), and :func:`floor_seconds` adds
count x unit time to the CPU seconds of a plain run of the same statistics: the least a run of the
protocol can cost, since a node can neither skip a signature or agreement its argument needs nor mask
without the keystream.

**The protocol work** (:func:`work_seconds`): the floor plus the rest of the cryptography and ring
arithmetic a masked sum does, counted at the same call sites and timed alone by :func:`work_unit_seconds`:

* ``aead``: AES-256-GCM share messages sealed and opened (a cipher object and one 72-byte message each);
* ``kdf``: HKDF-SHA256 derivations (a key from every agreement, the self-mask key from its seed);
* ``shamir_split``: a node's Shamir sharing of its two secrets among its group;
* ``shamir_recover``: a secret rebuilt at the server (its Lagrange coefficients and the combination);
* ``ring_values``: mask values added into (or subtracted from) a vector, mod 2^64;
* ``encode_values``: values put into the ring (fixed point), which a plain run never does.

The server's adding of each upload into its total is not counted: the plain run folds each upload too.

Masked over this work leaves what the implementation adds beside all of it: Python and the message handling.

:func:`tree_cpu` reads the CPU seconds of this process and its descendants (``/proc``), for runtimes that
run nodes in worker processes (Flower's simulation).
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time

import numpy as np

__all__ = [
    "OPS",
    "WORK_OPS",
    "counting",
    "floor_seconds",
    "spread",
    "tree_cpu",
    "unit_seconds",
    "work_seconds",
    "work_unit_seconds",
]

#: The operations of the floor, in the order they are reported.
OPS = ("sign", "verify", "x25519", "x25519_load", "prg_values")
#: The rest of the protocol's work, beside the floor (see the module docstring).
WORK_OPS = ("aead", "kdf", "shamir_split", "shamir_recover", "ring_values", "encode_values")


class _AEAD:
    """AES-GCM that counts the messages it seals and opens (``_AEAD(AESGCM, counts)(key)``, as the class)."""

    __slots__ = ("_aead", "_counts")

    def __init__(self, cls, counts: dict) -> None:
        self._aead, self._counts = cls, counts

    def __call__(self, key: bytes) -> _AEAD:
        return _AEAD(self._aead(key), self._counts)

    def encrypt(self, *a) -> bytes:
        self._counts["aead"] += 1
        return self._aead.encrypt(*a)

    def decrypt(self, *a) -> bytes:
        self._counts["aead"] += 1
        return self._aead.decrypt(*a)


class _Key:
    """An X25519 private key that counts its agreements."""

    def __init__(self, key, counts: dict) -> None:
        self._key, self._counts = key, counts

    def exchange(self, peer) -> bytes:
        self._counts["x25519"] += 1
        return self._key.exchange(peer)

    def public_key(self):
        return self._key.public_key()


@contextlib.contextmanager
def counting():
    """Count the protocol's cryptographic operations in this process while the block runs; yields the
    counts (a dict, filled as the run goes)."""
    from mechanisms.secagg import fixed_point, shamir
    from mechanisms.secagg.identity import Identity, Roster
    from mechanisms.secagg.masking import node as node_mod
    from mechanisms.secagg.masking import server as server_mod

    counts = dict.fromkeys((*OPS, "prg", *WORK_OPS), 0)
    sign, verify = Identity.sign, Roster.verify
    saved = [
        (m, name, getattr(m, name))
        for m in (node_mod, server_mod)
        for name in ("private_key", "add_masks", "hkdf")
    ]
    # functions of shared modules, counted there: the unit timings call the originals (``__wrapped__``)
    shared = ((shamir, "split_many"), (shamir, "combine"), (fixed_point, "encode"))
    saved += [(node_mod, "AESGCM", node_mod.AESGCM), *((m, name, getattr(m, name)) for m, name in shared)]
    split_many, combine, encode = shamir.split_many, shamir.combine, fixed_point.encode

    @functools.wraps(encode)
    def counted_encode(values, *a, **k):
        counts["encode_values"] += int(np.size(values))
        return encode(values, *a, **k)

    @functools.wraps(split_many)
    def counted_split(*a, **k):
        counts["shamir_split"] += 1
        return split_many(*a, **k)

    @functools.wraps(combine)
    def counted_combine(*a, **k):
        counts["shamir_recover"] += 1
        return combine(*a, **k)

    def counted_sign(self, message):
        counts["sign"] += 1
        return sign(self, message)

    def counted_verify(self, index, signature, message):
        counts["verify"] += 1
        return verify(self, index, signature, message)

    def wrap(module):
        load, masks, kdf = module.private_key, module.add_masks, module.hkdf

        def private_key(k):
            counts["x25519_load"] += 1
            return _Key(load(k), counts)

        def add_masks(y, keys, signs):
            n = int(np.asarray(y).size)
            counts["prg"] += len(keys)
            counts["prg_values"] += len(keys) * n
            # each mask's values are added into the vector as it is expanded
            counts["ring_values"] += len(keys) * n
            return masks(y, keys, signs)

        def hkdf(secret, info):
            counts["kdf"] += 1
            return kdf(secret, info)

        module.private_key, module.add_masks, module.hkdf = private_key, add_masks, hkdf

    try:
        Identity.sign, Roster.verify = counted_sign, counted_verify
        for m in (node_mod, server_mod):
            wrap(m)
        node_mod.AESGCM = _AEAD(node_mod.AESGCM, counts)
        shamir.split_many, shamir.combine, fixed_point.encode = counted_split, counted_combine, counted_encode
        yield counts
    finally:
        Identity.sign, Roster.verify = sign, verify
        for m, name, value in saved:
            setattr(m, name, value)


def _per_call(fn, n: int, batches: int = 5) -> float:
    """CPU seconds of one call of ``fn``: the median of ``batches`` batches of ``n`` calls in all (robust to a
    busy machine)."""
    times = []
    for _ in range(batches):
        c = time.process_time()
        for _ in range(max(1, n // batches)):
            fn()
        times.append((time.process_time() - c) / max(1, n // batches))
    return statistics.median(times)


def unit_seconds(repeats: int = 500, values: int = 51_200) -> dict[str, float]:
    """CPU seconds of one of each operation of :data:`OPS` (``prg_values``: per value), with ``cryptography``
    as the protocol calls it; each the median over five batches of ``repeats`` calls in all (the PRG over expansions of ``values``, each
    a fresh key's AES-256-CTR keystream made block by block in a cache-sized buffer)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from mechanisms.secagg.crypto import MASK_BLOCK

    sk = Ed25519PrivateKey.generate()
    message = os.urandom(180)  # a consistency view of a group of 21 is about this long
    sig = sk.sign(message)
    pk = sk.public_key()
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    raw = os.urandom(32)
    # the keystream of one mask, block by block into one cache-sized buffer (as the masking loop makes it)
    block = min(values, MASK_BLOCK)
    zeros, buf = bytes(8 * block), bytearray(8 * block + 16)

    def keystream() -> None:
        update = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor().update_into
        for start in range(0, values, block):
            m = min(block, values - start)
            update(zeros if m == block else zeros[: 8 * m], buf)

    n_prg = max(10, repeats // 10)
    return {
        "sign": _per_call(lambda: sk.sign(message), repeats),
        "verify": _per_call(lambda: pk.verify(sig, message), repeats),
        "x25519": _per_call(lambda: a.exchange(b), repeats),
        "x25519_load": _per_call(lambda: X25519PrivateKey.from_private_bytes(raw), repeats),
        "prg_values": _per_call(keystream, n_prg) / values,
    }


def work_unit_seconds(
    repeats: int = 500, values: int = 51_200, threshold: int = 12, group: int = 21
) -> dict[str, float]:
    """CPU seconds of one of each operation of :data:`WORK_OPS` (``ring_values`` and ``encode_values``: per
    value), as the protocol calls it: a share message of 72 bytes sealed and opened under a fresh key, HKDF of
    a 32-byte secret, two secrets shared at ``group`` points with threshold ``threshold``, a secret rebuilt
    from ``threshold`` shares at fresh points, a mask of ``values`` added into a vector, ``values`` encoded
    into the ring; each the median over five batches, as :func:`unit_seconds`."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from mechanisms.secagg import fixed_point, shamir
    from mechanisms.secagg.crypto import MASK_BLOCK, KeySource, hkdf

    # the functions themselves, also while counting() counts their calls
    split_many, combine, encode = (
        getattr(f, "__wrapped__", f) for f in (shamir.split_many, shamir.combine, fixed_point.encode)
    )
    keys = KeySource(None)

    key, nonce, aad, plain = os.urandom(32), os.urandom(12), os.urandom(16), os.urandom(72)
    sealed = AESGCM(key).encrypt(nonce, plain, aad)
    secrets = [int.from_bytes(os.urandom(31), "little") for _ in range(2)]
    points = list(range(1, group + 1))
    shares = split_many(secrets, points, threshold, os.urandom)[0]
    starts = iter(range(10**9))

    def recover() -> None:
        # fresh points each call, as each uploader's holders differ: the coefficients are made each time
        at = 1 + next(starts) % 1000
        xs = {at + i: shares[points[i % len(points)]] for i in range(threshold)}
        combine(xs, threshold, shamir.lagrange_at_zero(list(xs)))

    block = min(values, MASK_BLOCK)
    y, mask = np.zeros(values, dtype=np.uint64), np.ones(block, dtype=np.uint64)

    def ring() -> None:
        for a in range(0, values, block):
            part = y[a : a + block]
            np.add(part, mask[: part.size], out=part)

    x = np.random.default_rng(0).normal(size=values)
    n_vec = max(10, repeats // 10)
    return {
        "aead": (
            _per_call(lambda: AESGCM(key).encrypt(nonce, plain, aad), repeats)
            + _per_call(lambda: AESGCM(key).decrypt(nonce, sealed, aad), repeats)
        )
        / 2,
        "kdf": _per_call(lambda: hkdf(key, aad + aad), repeats),
        # a stage's coefficients read from one draw, as the node reads them (KeySource.ahead)
        "shamir_split": _per_call(
            lambda: split_many(
                secrets, points, threshold, keys.ahead(2 * (threshold - 1) * shamir.SHARE_BYTES)
            ),
            repeats,
        ),
        "shamir_recover": _per_call(recover, repeats),
        "ring_values": _per_call(ring, n_vec) / values,
        "encode_values": _per_call(lambda: encode(x, 32), n_vec) / values,
    }


def work_seconds(floor: float, counts: dict, units: dict) -> tuple[float, dict[str, float]]:
    """The protocol work: ``floor`` plus count x unit seconds of every operation of :data:`WORK_OPS`;
    and each term."""
    terms = {op: counts.get(op, 0) * units[op] for op in WORK_OPS}
    return floor + sum(terms.values()), terms


def floor_seconds(plain: float, counts: dict, units: dict) -> tuple[float, dict[str, float]]:
    """The floor: ``plain`` CPU seconds plus count x unit seconds of every operation; and each term."""
    terms = {op: counts.get(op, 0) * units[op] for op in OPS}
    return plain + sum(terms.values()), terms


def spread(values: list[float]) -> dict[str, float]:
    """The median, least and largest of ``values``, and (largest - least) / median."""
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / med if med else float("nan"),
    }


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds (user + system) used so far by process ``root`` (default this one) and its live
    descendants, read from ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        f = raw[raw.rfind(")") + 2 :].split()
        procs[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    kids: dict[int, list[int]] = {}
    for p, (parent, _) in procs.items():
        kids.setdefault(parent, []).append(p)
    total, stack = 0.0, [os.getpid() if root is None else root]
    while stack:
        p = stack.pop()
        if p in procs:
            total += procs[p][1]
        stack += kids.get(p, [])
    return total
