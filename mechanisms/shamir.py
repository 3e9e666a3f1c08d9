"""Shamir secret sharing over the prime field GF(2^256 - 189).

Shamir, "How to share a secret", CACM 1979: a secret s is the constant term
of a random polynomial P of degree t - 1 over GF(p); share i is (i, P(i)).
Any t shares give s by Lagrange interpolation at 0,
s = sum_j y_j prod_{m != j} x_m / (x_m - x_j) (mod p); fewer than t shares
are independent of s.  Secure aggregation (Bonawitz et al. 2017, Sec. 4)
shares each client's self-mask seed and mask-agreement private key this way.

p = 2^256 - 189 is the largest prime below 2^256, so every 32-byte secret
below it (X25519 private keys, 256-bit seeds; rejection-sample the
negligible 189 values above) is one field element.  Arithmetic is plain
Python integers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from privfed.errors import InputError

__all__ = ["PRIME", "SHARE_BYTES", "combine", "lagrange_at_zero", "split"]

#: The field modulus (prime).
PRIME = 2**256 - 189
#: Bytes of one serialised share value.
SHARE_BYTES = 32


def split(
    secret: int, xs: Sequence[int], threshold: int, random_bytes: Callable[[int], bytes]
) -> dict[int, int]:
    """Share ``secret`` at the points ``xs`` so that any ``threshold`` of them recover it.

    Parameters
    ----------
    secret : int
        In [0, PRIME).
    xs : sequence of int
        Distinct non-zero evaluation points (one per share holder).
    threshold : int
        t: the number of shares needed; 1 <= t <= len(xs).
    random_bytes : callable
        ``random_bytes(n)`` returns n cryptographically random bytes (the
        polynomial's coefficients).

    Returns
    -------
    dict
        x -> P(x).
    """
    if not 0 <= secret < PRIME:
        raise InputError("secret must lie in [0, PRIME); rejection-sample 32-byte secrets")
    if not 1 <= threshold <= len(xs):
        raise InputError(
            f"threshold must lie in [1, {len(xs)}] (the number of share holders), got {threshold}"
        )
    if len(set(xs)) != len(xs) or any(x % PRIME == 0 for x in xs):
        raise InputError("share points must be distinct and non-zero modulo PRIME")
    coeffs = [secret]
    while len(coeffs) < threshold:
        c = int.from_bytes(random_bytes(SHARE_BYTES), "little")
        if c < PRIME:
            coeffs.append(c)
    table = _powers(tuple(int(x) for x in xs), threshold)
    return {x: sum(c * p for c, p in zip(coeffs, pw)) % PRIME for x, pw in table.items()}


@functools.lru_cache(maxsize=64)
def _powers(xs: tuple[int, ...], degree: int) -> dict[int, tuple[int, ...]]:
    """x -> (x^0, ..., x^(degree-1)) mod PRIME, shared by every polynomial evaluated at ``xs``."""
    out = {}
    for x in xs:
        pw, acc = [], 1
        for _ in range(degree):
            pw.append(acc)
            acc = acc * x % PRIME
        out[x] = tuple(pw)
    return out


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Coefficients lambda_j with P(0) = sum_j lambda_j P(x_j) for deg P < len(xs)."""
    xs = [int(x) % PRIME for x in xs]
    if len(set(xs)) != len(xs):
        raise InputError("share points must be distinct")
    lam = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % PRIME
                den = den * (xm - xj) % PRIME
        lam.append(num * pow(den, PRIME - 2, PRIME) % PRIME)
    return lam


def combine(shares: dict[int, int], threshold: int, coefficients: list[int] | None = None) -> int:
    """Recover the secret from at least ``threshold`` shares (x -> y); uses the first ``threshold``.

    ``coefficients`` may pass precomputed :func:`lagrange_at_zero` values for
    the first ``threshold`` points (in iteration order).
    """
    if len(shares) < threshold:
        raise InputError(f"need {threshold} shares to recover a secret, got {len(shares)}")
    items = list(shares.items())[:threshold]
    lam = coefficients if coefficients is not None else lagrange_at_zero([x for x, _ in items])
    return sum(l * y for l, (_, y) in zip(lam, items)) % PRIME
