"""Secure summation with CKKS homomorphic encryption (TenSEAL).

CKKS (Cheon, Kim, Kim, Song, "Homomorphic Encryption for Arithmetic of
Approximate Numbers", ASIACRYPT 2017) encrypts a vector of N/2 reals scaled
by Delta = 2^scale_bits; ciphertexts add slot-wise.  Three parties:

* the **key holder** makes a fresh key pair for every aggregation, gives out
  a *public* context (public key only: no secret, relinearisation or Galois
  keys), and decrypts only the aggregate;
* each **client** encrypts its statistic under the public key, packed into
  ceil(D / (N/2)) ciphertexts of N/2 = 4096 slots (N = 8192);
* the **aggregator** holds only the public context (decryption there raises),
  adds the clients' ciphertexts and forwards the sum to the key holder.

Bound (checked on TenSEAL 0.3.18): additions do not rescale, so the sum
decrypts at the top level with modulus q = prod of the data primes (all but
the last, special prime): 60 + 40 + 40 = 140 bits for [60, 40, 40, 60].
|value| * 2^scale_bits must stay below q / 2 or the sum wraps silently
(2^98 decrypts, 2^100 wraps at scale 2^40).  :func:`ckks_sum` refuses when
K * max|x| could reach 2^(log2 q - scale_bits - 2) (one bit of margin).

Decryption releases m + e with a small error e that depends on the secret
key; an aggregator that sees exact decryptions can recover the key (Li and
Micciancio, "On the Security of Homomorphic Encryption on Approximate
Numbers", EUROCRYPT 2021).  The key holder therefore rounds the decrypted
sum to a declared grid of 2^-precision_bits (to whole numbers for integer
statistics) before releasing it and never reuses keys.  The default grid
(2^-20 at scale 2^40) sits far above the decryption error (about 1e-8
sqrt(K) per slot), so the rounded value reveals essentially nothing about e.

TenSEAL holds the GIL: this module encrypts sequentially; a deployment (or
a large simulation) runs clients in separate processes, each deserialising
the public context.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mechanisms import fixed_point
from privfed.errors import ConfigError, InputError, MissingDependencyError

__all__ = [
    "tenseal_module",
    "AggregatorView",
    "CKKSAggregator",
    "CKKSKeyHolder",
    "CKKSParams",
    "CKKSSumResult",
    "ckks_encrypt",
    "ckks_sum",
    "add_ciphertexts",
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
_GRID_MARGIN_BITS = 3


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
        if not isinstance(N, int) or N < 1024 or N & (N - 1):
            raise ConfigError(f"poly_modulus_degree must be a power of two >= 1024, got {N!r}")
        sizes = tuple(int(b) for b in self.coeff_mod_bit_sizes)
        if len(sizes) < 2 or any(not 20 <= b <= 60 for b in sizes):
            raise ConfigError(
                f"coeff_mod_bit_sizes must be >= 2 primes of 20..60 bits, got {self.coeff_mod_bit_sizes}"
            )
        object.__setattr__(self, "coeff_mod_bit_sizes", sizes)
        if not 10 <= int(self.scale_bits) < sum(sizes[:-1]):
            raise ConfigError(f"scale_bits must lie in [10, {sum(sizes[:-1])}), got {self.scale_bits}")
        top = self.max_precision_bits(1)
        if not 0 <= int(self.precision_bits) <= top:
            raise ConfigError(
                f"precision_bits must lie in [0, {top}] so the release grid stays {_GRID_MARGIN_BITS} bits above the "
                f"decryption error (about N sqrt(K) 2^-scale_bits), got {self.precision_bits}"
            )

    def max_precision_bits(self, num_clients: int) -> int:
        """Finest release grid whose step exceeds the decryption error of a sum of K ciphertexts by a margin.

        The error of a decrypted sum of K fresh encryptions is at most about N sqrt(K) 2^-scale_bits
        (measured: 2^-24.8 for N = 8192, K = 20, scale 2^40); a grid finer than that would release
        key-dependent error bits (Li-Micciancio).
        """
        err_bits = math.log2(self.poly_modulus_degree) + 0.5 * math.log2(max(int(num_clients), 1))
        return int(math.floor(int(self.scale_bits) - err_bits - _GRID_MARGIN_BITS))

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
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
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


class CKKSKeyHolder:
    """Owns the secret key of one aggregation; releases only rounded aggregates."""

    def __init__(self, params: CKKSParams = CKKSParams()) -> None:
        ts = _tenseal()
        self.params = params
        self._ctx = ts.context(
            ts.SCHEME_TYPE.CKKS,
            poly_modulus_degree=params.poly_modulus_degree,
            coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
        )
        self._ctx.global_scale = 2.0**params.scale_bits
        self._used = False

    def public_context(self) -> bytes:
        """Serialized context with the public key only (what clients and the aggregator get)."""
        return self._ctx.serialize(
            save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
        )

    def decrypt_sum(self, ciphertexts: list[bytes], size: int, *, integral: bool) -> np.ndarray:
        """Decrypt the aggregate once and round it to the release grid.

        Rounds to whole numbers when ``integral``, else to multiples of
        2^-precision_bits.  A key holder decrypts one aggregate per key.
        """
        if self._used:
            raise ConfigError(
                "this key holder already released an aggregate; use fresh keys for every aggregation"
            )
        self._used = True
        ts = _tenseal()
        parts = [
            np.asarray(ts.ckks_vector_from(self._ctx, ct).decrypt(), dtype=np.float64) for ct in ciphertexts
        ]
        out = np.concatenate(parts)[:size] if parts else np.zeros(0)
        if integral:
            return np.rint(out)
        grid = 2.0**self.params.precision_bits
        return np.rint(out * grid) / grid


class CKKSAggregator:
    """Adds ciphertexts under a public context; it cannot decrypt."""

    def __init__(self, public_context: bytes) -> None:
        ts = _tenseal()
        self.context = ts.context_from(public_context)
        if self.context.is_private():
            raise ConfigError("the aggregator must get a public context (no secret key)")

    def add(self, uploads: list[list[bytes]]) -> list[bytes]:
        """Slot-wise sum of every client's ciphertext list (same length each)."""
        ts = _tenseal()
        if not uploads:
            raise InputError("no ciphertexts to aggregate")
        n = len(uploads[0])
        if any(len(u) != n for u in uploads):
            raise InputError("every client must upload the same number of ciphertexts")
        out = []
        for j in range(n):
            acc = ts.ckks_vector_from(self.context, uploads[0][j])
            for u in uploads[1:]:
                acc += ts.ckks_vector_from(self.context, u[j])
            out.append(acc.serialize())
        return out


@dataclass
class AggregatorView:
    """What the aggregator received and output: ciphertexts, the public context, the released sum."""

    public_context: bytes
    ciphertexts: dict[int, list[bytes]] = field(default_factory=dict)
    aggregate: list[bytes] = field(default_factory=list)
    result: np.ndarray | None = None

    def arrays(self):
        """Every numeric array in the view (only the released sum)."""
        if self.result is not None:
            yield self.result


@dataclass
class CKKSSumResult:
    """Output of :func:`ckks_sum`."""

    total: np.ndarray
    view: AggregatorView
    integral: bool
    num_ciphertexts: int
    upload_bytes: dict[int, int]
    download_bytes: int
    aggregate_bytes: int
    seconds: dict[str, float]


def ckks_sum(
    stack: np.ndarray,
    *,
    params: CKKSParams = CKKSParams(),
    integers: str | bool = "auto",
    noise_std: float = 0.0,
    add_noise: Callable[[np.ndarray, float, np.random.Generator], np.ndarray] | None = None,
    rng: np.random.Generator | None = None,
    value_bound: float | None = None,
    name: str = "statistic",
) -> CKKSSumResult:
    """Sum the rows of ``stack`` through CKKS with a separate key holder (see the module docstring).

    Parameters
    ----------
    stack : array, shape (K, ...)
    params : CKKSParams
    integers : {"auto", True, False}
        Integer statistics are rounded to whole numbers on release (exact
        counts); ``"auto"`` detects whole-number stacks without noise.
    noise_std : float
        Standard deviation of each client's Gaussian noise share (0: none).
    add_noise : callable, optional
        ``add_noise(row, std, rng) -> noisy row`` draws a client's share (a
        noise backend's ``add_gaussian``); default: numpy normal draws.
    rng : numpy.random.Generator, optional
        Draws the noise shares.
    value_bound : float, optional
        Public bound on |x| per coordinate (defaults to the stack's largest).
    name : str
        What is being summed (error messages).

    Raises
    ------
    InputError
        If K * bound could exceed the CKKS bound 2^bound_bits.
    """
    t_start = time.perf_counter()
    rng = rng if rng is not None else np.random.default_rng()
    X = np.asarray(stack, dtype=np.float64)
    if X.ndim < 1 or X.shape[0] < 2:
        raise InputError(
            f"{name}: secure aggregation needs a (K, ...) stack with K >= 2 clients, got {X.shape}"
        )
    K, shape = X.shape[0], X.shape[1:]
    flat = X.reshape(K, -1)
    if not np.all(np.isfinite(flat)):
        raise InputError(f"{name} contains NaN/inf values; secure aggregation needs finite statistics")
    if not (np.isfinite(noise_std) and noise_std >= 0):
        raise ConfigError(f"noise_std must be finite and >= 0, got {noise_std}")
    if integers not in ("auto", True, False):
        raise ConfigError(f"integers must be 'auto', True or False, got {integers!r}")
    integral = integers is True or (integers == "auto" and noise_std == 0 and fixed_point.is_integral(flat))
    max_abs = float(np.abs(flat).max()) if value_bound is None else float(value_bound)
    if value_bound is not None and flat.size and float(np.abs(flat).max()) > max_abs:
        over = np.flatnonzero(np.abs(flat).max(axis=1) > max_abs)
        raise InputError(
            f"{name}: client(s) {over[:5].tolist()} hold values outside the agreed bound |x| <= {max_abs:g}; "
            "they refuse to encrypt them"
        )
    if not integral and params.precision_bits > params.max_precision_bits(K):
        err_bits = int(params.scale_bits) - math.log2(params.poly_modulus_degree) - 0.5 * math.log2(K)
        raise ConfigError(
            f"{name}: with K={K} clients the decryption error reaches about 2^-{err_bits:.1f}; "
            f"precision_bits={params.precision_bits} would release key-dependent error bits; use "
            f"precision_bits <= {params.max_precision_bits(K)} or a larger scale_bits"
        )
    bound = K * (max_abs + 40.0 * noise_std)
    if not bound < 2.0**params.bound_bits:
        raise InputError(
            f"{name} could exceed the CKKS bound: {K} clients x max|x| = {max_abs:.4g} gives |sum| up to "
            f"2^{np.log2(bound):.1f} >= 2^{params.bound_bits} (coeff_mod_bit_sizes={list(params.coeff_mod_bit_sizes)}, "
            f"scale 2^{params.scale_bits}); the sum would wrap silently. Lower scale_bits, add a modulus prime, "
            "or clip the features"
        )
    holder = CKKSKeyHolder(params)  # fresh keys for this aggregation
    pub = holder.public_context()
    t0 = time.perf_counter()
    ts = _tenseal()
    client_ctx = ts.context_from(pub)
    view = AggregatorView(public_context=pub)
    up = {}
    for k in range(K):
        row = flat[k]
        if noise_std > 0:
            row = (
                add_noise(row, noise_std, rng)
                if add_noise is not None
                else row + rng.normal(0.0, noise_std, row.shape)
            )
        cts = ckks_encrypt(client_ctx, row, params.slots)
        view.ciphertexts[k] = cts
        up[k] = sum(len(c) for c in cts)
    t1 = time.perf_counter()
    aggregator = CKKSAggregator(pub)
    view.aggregate = aggregator.add([view.ciphertexts[k] for k in range(K)])
    t2 = time.perf_counter()
    total = holder.decrypt_sum(view.aggregate, flat.shape[1], integral=integral).reshape(shape)
    view.result = total
    t3 = time.perf_counter()
    return CKKSSumResult(
        total=total,
        view=view,
        integral=integral,
        num_ciphertexts=params.num_ciphertexts(flat.shape[1]),
        upload_bytes=up,
        download_bytes=len(pub),
        aggregate_bytes=sum(len(c) for c in view.aggregate),
        seconds={
            "keygen": t0 - t_start,
            "encrypt": t1 - t0,
            "sum": t2 - t1,
            "decrypt": t3 - t2,
            "total": t3 - t_start,
        },
    )
