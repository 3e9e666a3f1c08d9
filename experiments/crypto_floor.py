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

:func:`tree_cpu` reads the CPU seconds of this process and its descendants (``/proc``), for runtimes that
run nodes in worker processes (Flower's simulation).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np

__all__ = ["OPS", "counting", "floor_seconds", "spread", "tree_cpu", "unit_seconds"]

#: The operations of the floor, in the order they are reported.
OPS = ("sign", "verify", "x25519", "x25519_load", "prg_values")


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
    from mechanisms.secagg.identity import Identity, Roster
    from mechanisms.secagg.masking import node as node_mod
    from mechanisms.secagg.masking import server as server_mod

    counts = dict.fromkeys((*OPS, "prg"), 0)
    sign, verify = Identity.sign, Roster.verify
    saved = [
        (m, name, getattr(m, name)) for m in (node_mod, server_mod) for name in ("private_key", "add_masks")
    ]

    def counted_sign(self, message):
        counts["sign"] += 1
        return sign(self, message)

    def counted_verify(self, index, signature, message):
        counts["verify"] += 1
        return verify(self, index, signature, message)

    def wrap(module):
        load, masks = module.private_key, module.add_masks

        def private_key(k):
            counts["x25519_load"] += 1
            return _Key(load(k), counts)

        def add_masks(y, keys, signs):
            counts["prg"] += len(keys)
            counts["prg_values"] += len(keys) * int(np.asarray(y).size)
            return masks(y, keys, signs)

        module.private_key, module.add_masks = private_key, add_masks

    Identity.sign, Roster.verify = counted_sign, counted_verify
    for m in (node_mod, server_mod):
        wrap(m)
    try:
        yield counts
    finally:
        Identity.sign, Roster.verify = sign, verify
        for m, name, value in saved:
            setattr(m, name, value)


def unit_seconds(repeats: int = 500, values: int = 51_200) -> dict[str, float]:
    """CPU seconds of one of each operation of :data:`OPS` (``prg_values``: per value), with ``cryptography``
    as the protocol calls it; each the median over five batches of ``repeats`` calls in all (the PRG over expansions of ``values``, each
    a fresh key's AES-256-CTR keystream made block by block in a cache-sized buffer)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from mechanisms.secagg.crypto import MASK_BLOCK

    def per_call(
        fn, n: int, batches: int = 5
    ) -> float:  # the median of a few batches: robust to a busy machine
        times = []
        for _ in range(batches):
            c = time.process_time()
            for _ in range(max(1, n // batches)):
                fn()
            times.append((time.process_time() - c) / max(1, n // batches))
        return statistics.median(times)

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
        "sign": per_call(lambda: sk.sign(message), repeats),
        "verify": per_call(lambda: pk.verify(sig, message), repeats),
        "x25519": per_call(lambda: a.exchange(b), repeats),
        "x25519_load": per_call(lambda: X25519PrivateKey.from_private_bytes(raw), repeats),
        "prg_values": per_call(keystream, n_prg) / values,
    }


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
