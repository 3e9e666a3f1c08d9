"""CKKS homomorphic encryption (TenSEAL) for secure summation: parameters, keys, encoding, the bound.

CKKS (Cheon, Kim, Kim, Song, "Homomorphic Encryption for Arithmetic of
Approximate Numbers", ASIACRYPT 2017) encrypts a vector of N/2 reals scaled
by Delta = 2^scale_bits; ciphertexts add slot-wise.  Three parties, each a
state machine of its own module:

* the **key holder** (:mod:`mechanisms.secagg.ckks.holder`) makes a fresh key pair
  for every aggregation, gives out a signed *public* context (public key
  only: no secret, relinearisation or Galois keys), adds the signed
  contributions itself and decrypts only that sum, once;
* each **node** (:mod:`mechanisms.secagg.ckks.node`) checks the context's signature
  and encrypts its statistic under the public key, packed into
  ceil(D / (N/2)) ciphertexts of N/2 = 4096 slots (N = 8192);
* the **server** (:mod:`mechanisms.secagg.ckks.server`) relays ciphertexts it
  cannot read (a public context only: decryption there raises).

:func:`mechanisms.secagg.ckks.ckks_sum` runs them in one process,
:mod:`privfed.flower.ckks` over Flower.

Bound (checked on TenSEAL 0.3.18): additions do not rescale, so the sum
decrypts at the top level with modulus q = prod of the data primes (all but
the last, special prime): 60 + 40 + 40 = 140 bits for [60, 40, 40, 60].
|value| * 2^scale_bits must stay below q / 2 or the sum wraps silently
(2^98 decrypts, 2^100 wraps at scale 2^40).  :func:`mechanisms.secagg.ckks.ckks_sum` refuses when
K * max|x| could reach 2^(log2 q - scale_bits - 2) (one bit of margin).

Decryption releases m + e with a small error e that depends on the secret
key; an aggregator that sees exact decryptions can recover the key (Li and
Micciancio, "On the Security of Homomorphic Encryption on Approximate
Numbers", EUROCRYPT 2021).  The key holder therefore rounds the decrypted
sum to a declared grid of 2^-precision_bits (to whole numbers for integer
statistics) before releasing it and never reuses keys.  The default grid
(2^-20 at scale 2^40) sits far above the decryption error (about 1e-8
sqrt(K) per slot), so the rounded value reveals essentially nothing about e,
as long as the sums are small: the float64 encoding adds an error of about
2^-54 of the largest value in a ciphertext to every slot, so
:func:`mechanisms.secagg.ckks.ckks_sum` refuses a sum bound above which that
error would reach the grid (|sum| < 2^28 at 2^-20; 2^48 for whole numbers).

TenSEAL holds the GIL: in one process the nodes encrypt sequentially; a
deployment (or a large simulation) runs them in separate processes, each
deserialising the public context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from privfed._validation import is_integer
from privfed.errors import ConfigError, MissingDependencyError

__all__ = [
    "tenseal_module",
    "CKKSParams",
    "add_ciphertexts",
    "ckks_encrypt",
    "decrypt_rounded",
    "new_context",
    "public_bytes",
]


def _tenseal():
    try:
        import tenseal as ts
    except ImportError:  # pragma: no cover - depends on the install
        raise MissingDependencyError(
            "CKKS secure aggregation needs TenSEAL; install it with: pip install 'privfed[he]'"
        ) from None
    return ts


def tenseal_module():
    """The ``tenseal`` module (MissingDependencyError naming the extra when it is not installed)."""
    return _tenseal()


#: Bits by which the release grid must exceed the CKKS decryption error.
GRID_MARGIN_BITS = 3


@dataclass(frozen=True)
class CKKSParams:
    """CKKS parameters.

    Attributes
    ----------
    poly_modulus_degree : int
        N (a power of two); N/2 slots per ciphertext.
    coeff_mod_bit_sizes : tuple of int
        Bit sizes of the modulus primes; the last one is the special prime.
    scale_bits : int
        log2 of the encoding scale Delta.
    precision_bits : int
        The key holder rounds real-valued sums to multiples of 2^-precision_bits.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 40, 60)
    scale_bits: int = 40
    precision_bits: int = 20

    def __post_init__(self) -> None:
        N = self.poly_modulus_degree
        if not is_integer(N) or N < 1024 or N & (N - 1):
            raise ConfigError(f"poly_modulus_degree must be a power of two >= 1024, got {N!r}")
        object.__setattr__(self, "poly_modulus_degree", int(N))
        # a list, tuple or 1-D array of ints: 60 or "60,40" is no list of sizes
        raw = self.coeff_mod_bit_sizes
        listed = isinstance(raw, (list, tuple)) or (isinstance(raw, np.ndarray) and raw.ndim == 1)
        raw = tuple(raw.tolist() if isinstance(raw, np.ndarray) else raw) if listed else raw
        if (
            not isinstance(raw, tuple)
            or len(raw) < 2
            or not all(is_integer(b) and 20 <= b <= 60 for b in raw)
        ):
            raise ConfigError(
                f"coeff_mod_bit_sizes must be a list of >= 2 primes of 20..60 bits, got {raw!r}"
            )
        sizes = tuple(int(b) for b in raw)
        object.__setattr__(self, "coeff_mod_bit_sizes", sizes)
        for name in ("scale_bits", "precision_bits"):
            if not is_integer(getattr(self, name)):  # 2.5 bits were 2 bits
                raise ConfigError(f"{name} must be an integer number of bits, got {getattr(self, name)!r}")
            object.__setattr__(self, name, int(getattr(self, name)))
        if not 10 <= int(self.scale_bits) < sum(sizes[:-1]):
            raise ConfigError(f"scale_bits must lie in [10, {sum(sizes[:-1])}), got {self.scale_bits}")
        top = self.max_precision_bits(1)
        if not 0 <= int(self.precision_bits) <= top:
            raise ConfigError(
                f"precision_bits must lie in [0, {top}] so the release grid stays {GRID_MARGIN_BITS} bits above the "
                f"decryption error (about N sqrt(K) 2^-scale_bits), got {self.precision_bits}"
            )

    def max_precision_bits(self, num_clients: int) -> int:
        """Finest release grid whose step exceeds the decryption error of a sum of K ciphertexts by a margin.

        The error of a decrypted sum of K fresh encryptions is at most about N sqrt(K) 2^-scale_bits
        (measured: 2^-24.8 for N = 8192, K = 20, scale 2^40); a grid finer than that would release
        key-dependent error bits (Li-Micciancio).
        """
        err_bits = math.log2(self.poly_modulus_degree) + 0.5 * math.log2(max(int(num_clients), 1))
        return int(math.floor(int(self.scale_bits) - err_bits - GRID_MARGIN_BITS))

    @property
    def slots(self) -> int:
        """Values packed into one ciphertext (N/2)."""
        return self.poly_modulus_degree // 2

    @property
    def bound_bits(self) -> int:
        """The aggregate must satisfy |sum| < 2^bound_bits (log2 q - scale_bits - 2)."""
        return sum(self.coeff_mod_bit_sizes[:-1]) - int(self.scale_bits) - 2

    def num_ciphertexts(self, size: int) -> int:
        """Ciphertexts needed to pack ``size`` values."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:  # -5 packed into 0
            raise ConfigError(f"size must be an integer >= 0 (values to pack), got size={size!r}")
        return -(-int(size) // self.slots)

    def as_dict(self) -> dict[str, Any]:
        return {
            "poly_modulus_degree": self.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes),
            "scale": f"2^{self.scale_bits}",
            "slots": self.slots,
            "release_grid": f"2^-{self.precision_bits}",
            "bound": f"|sum| < 2^{self.bound_bits}",
        }


def new_context(params: CKKSParams):
    """A fresh TenSEAL CKKS context (fresh secret key) for ``params``."""
    ts = _tenseal()
    try:
        ctx = ts.context(
            ts.SCHEME_TYPE.CKKS,
            poly_modulus_degree=params.poly_modulus_degree,
            coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
        )
    except ValueError as exc:  # SEAL's own limits (N <= 32768, the 128-bit security bound on the moduli)
        raise ConfigError(
            f"CKKS parameters poly_modulus_degree={params.poly_modulus_degree}, coeff_mod_bit_sizes="
            f"{list(params.coeff_mod_bit_sizes)} are refused by SEAL ({exc}); use the defaults, CKKSParams()"
        ) from None
    ctx.global_scale = 2.0**params.scale_bits
    return ctx


def public_bytes(ctx) -> bytes:
    """``ctx`` serialized with the public key only (no secret, relinearisation or Galois keys)."""
    return ctx.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )


def ckks_encrypt(public_context: Any, values: np.ndarray, slots: int) -> list[bytes]:
    """Encrypt a flat vector under a (public) TenSEAL context, ``slots`` values per ciphertext."""
    ts = _tenseal()
    v = np.asarray(values, dtype=np.float64).ravel()
    return [
        ts.ckks_vector(public_context, v[i : i + slots].tolist()).serialize() for i in range(0, v.size, slots)
    ]


def add_ciphertexts(ctx, uploads: list[list[bytes]]) -> list:
    """Slot-wise sum of every upload's ciphertext list (same length each), as TenSEAL vectors under ``ctx``."""
    ts = _tenseal()
    acc: list = []
    for cts in uploads:
        vecs = [ts.ckks_vector_from(ctx, c) for c in cts]
        if not acc:
            acc = vecs
        else:
            for j, v in enumerate(vecs):
                acc[j] += v
    return acc


def decrypt_rounded(vectors: list, size: int, params: CKKSParams, *, integral: bool) -> np.ndarray:
    """Decrypt ``vectors`` (under a secret context), keep ``size`` values, round to the release grid.

    Whole numbers when ``integral``, else multiples of 2^-precision_bits (see the module docstring).
    """
    parts = [np.asarray(v.decrypt(), dtype=np.float64) for v in vectors]
    out = np.concatenate(parts)[:size] if parts else np.zeros(0)
    if integral:
        return np.rint(out)
    grid = 2.0**params.precision_bits
    return np.rint(out * grid) / grid
