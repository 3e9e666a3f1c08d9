"""Fixed-point encoding of real statistics into the ring Z_{2^64} for masked summation.

Pairwise masking (Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS 2017, Sec. 3) sums vectors in
Z_R with R = 2^64 here.  A real value x is encoded with ``f`` fractional bits
as the two's complement of round(x * 2^f) (an int64 viewed as uint64); the
ring sum of K encodings, read back as int64 and divided by 2^f, is the sum of
the rounded values as long as the true integer sum stays in
[-2^63, 2^63).  Each rounding moves a value by at most 2^-(f+1), so the
decoded sum of K clients is within K * 2^-(f+1) <= K * 2^-f of the real sum,
per coordinate, plus the float64 rounding of the decoded value (half a unit
in its last place: 2^-53 of it, which passes K * 2^-(f+1) only at large f).

Wrap-around is silent in the ring, so :func:`check_ring_bound` refuses a
statistic whose declared bound could overflow *before* anything is encoded:
with ``max_abs`` a public bound on every client's coordinates,
K * (max_abs * 2^f + 1/2) + noise_bound must stay below 2^63.

Integer statistics (counts, indicators) are encoded with f = 0 and come out
exact while their sum stays below 2^53, the float64 it is decoded to; see
:func:`integer_encoding`.
"""

from __future__ import annotations

import numpy as np

from privfed.errors import ConfigError, InputError

__all__ = [
    "EXACT_SUM",
    "MAX_FRAC_BITS",
    "RING_BITS",
    "as_stack",
    "check_frac_bits",
    "check_ring_bound",
    "decode",
    "encode",
    "integer_encoding",
    "integers_flag",
    "is_integral",
    "resolution",
]

#: Bits of the ring Z_{2^RING_BITS} in which masked values are summed.
RING_BITS = 64
#: Largest number of fractional bits accepted (leaves 10 integer bits).
MAX_FRAC_BITS = 53

_HALF_RING = 2.0**63
#: :func:`encode` rounds values below this magnitude by adding :data:`_MAGIC` (1.5 * 2^52): the sum lies in
#: [2^52, 2^53), where doubles are the integers, and its bit pattern minus the magic's is the rounded value.
_ROUND_BY_ADD = 2.0**51
_MAGIC = 1.5 * 2.0**52
_MAGIC_BITS = np.float64(_MAGIC).view(np.int64)


def as_stack(stack, name: str) -> np.ndarray:
    """The clients' statistics ``stack`` as one numpy array of reals; a masked array (its mask would be
    ignored), a ragged list (clients of different shapes) or a complex, text, object or bool array is refused
    naming ``name``."""
    from privfed._validation import check_real_dtype, refuse_masked

    refuse_masked(stack, name)
    try:
        raw = np.asarray(stack)
    except ValueError as exc:  # numpy's "inhomogeneous shape"
        raise InputError(
            f"{name}: the clients' statistics are not one (K, ...) array; give every client the same shape "
            f"({str(exc).splitlines()[0][:120]})"
        ) from None
    check_real_dtype(raw, name)  # complex, object, text or bool stacks are refused, never cast
    return raw


def check_frac_bits(frac_bits: int) -> int:
    """Return ``frac_bits`` as an int in [0, MAX_FRAC_BITS] or raise ConfigError."""
    from privfed.errors import ConfigError

    if isinstance(frac_bits, bool) or not isinstance(frac_bits, (int, np.integer)):
        raise ConfigError(f"frac_bits must be an integer number of fractional bits, got {frac_bits!r}")
    if not 0 <= int(frac_bits) <= MAX_FRAC_BITS:
        raise ConfigError(f"frac_bits must lie in [0, {MAX_FRAC_BITS}], got {frac_bits}")
    return int(frac_bits)


def resolution(frac_bits: int) -> float:
    """Grid step 2^-f of the encoding."""
    return 2.0 ** -int(frac_bits)


#: Values per chunk in :func:`is_integral` (stops at the first chunk with a fractional value).
_CHUNK = 65_536


#: float64 holds every integer of magnitude up to this exactly: an integer sum below it decodes exactly.
EXACT_SUM = 2.0**53


def integers_flag(integers) -> str | bool:
    """``integers`` as ``"auto"``, True or False: a numpy bool reads as the bool; 1, 1.0 or "yes" is refused
    (they compared equal to True, or were no flag, and meant a fixed-point sum)."""
    from privfed.errors import ConfigError

    if isinstance(integers, (bool, np.bool_)):
        return bool(integers)
    if isinstance(integers, str) and integers == "auto":
        return "auto"
    raise ConfigError(f"integers must be 'auto', True or False, got {integers!r}")


def integer_encoding(flat: np.ndarray, integers, noise_std: float, max_abs: float, name: str) -> bool:
    """Whether the (K, n) stack ``flat`` is summed as integers (f = 0, exact).

    ``integers`` (:func:`integers_flag`): ``True`` (refused unless every value is whole and K (max|x| + 40
    noise_std) <= 2^53, the largest sum the float64 result holds exactly), ``"auto"`` (the same test, and no
    noise added), ``False``.  ``max_abs`` is the largest |x| of the stack."""
    integers = integers_flag(integers)
    if integers is False:
        return False
    whole = is_integral(flat)
    fits = flat.shape[0] * (max_abs + 40.0 * noise_std) <= EXACT_SUM  # noise shares within 40 sigma
    if integers is True and not whole:
        raise InputError(f"{name} was declared integer but holds fractional values; pass integers='auto'")
    if integers is True and not fits:
        raise InputError(
            f"{name}: {flat.shape[0]} clients x max|x| = {max_abs:.4g} can sum past 2^53, where float64 holds "
            "no exact integers (the sum would be rounded); pass integers='auto' for a fixed-point sum, or "
            "scale the counts down"
        )
    return whole and fits and (integers is True or noise_std == 0)


def is_integral(values: np.ndarray) -> bool:
    """Whether every value is a whole number of magnitude below 2^53 (exactly representable)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    for start in range(0, v.size, _CHUNK):
        c = v[start : start + _CHUNK]
        if not (np.all(np.isfinite(c)) and np.all(np.abs(c) < 2.0**53) and np.all(c == np.round(c))):
            return False
    return True


def check_ring_bound(
    max_abs: float, num_clients: int, frac_bits: int, *, noise_bound: float = 0.0, name: str = "statistic"
) -> float:
    """Refuse a sum that could leave the int64 range of the ring; return the bound in grid units.

    Parameters
    ----------
    max_abs : float
        Public bound on |x| for every coordinate of every client's input.
    num_clients : int
        K, the number of inputs summed.
    frac_bits : int
        Fractional bits f of the encoding.
    noise_bound : float, optional
        Bound (in grid units) on |sum of noise shares| per coordinate.
    name : str
        What is being summed (for the error message).

    Returns
    -------
    float
        The bound K * (max_abs * 2^f + 1/2) + noise_bound on |encoded sum|.

    Raises
    ------
    InputError
        If the bound reaches 2^63 (the sum could wrap around silently).
    ConfigError
        If ``num_clients`` is not an integer >= 1 or ``noise_bound`` is not a finite number >= 0.
    """
    from mechanisms.dp.calibration import as_real, check_count, check_nonnegative

    try:  # "1" or None raised numpy's isfinite TypeError
        max_abs = as_real(max_abs)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: max_abs must be a number (a bound on |x|), got {max_abs!r}") from None
    if not np.isfinite(max_abs):
        raise InputError(f"{name} contains NaN/inf values; secure aggregation needs finite statistics")
    if max_abs < 0:
        raise InputError(
            f"{name}: max_abs and noise_bound are bounds on |x| (>= 0), got {max_abs}, {noise_bound}"
        )
    # A whole count of inputs >= 1 and a bound on the noise >= 0 (NaN compares false): ConfigErrors naming
    # them.
    num_clients = check_count(num_clients, "num_clients")
    noise_bound = check_nonnegative(noise_bound, "noise_bound")
    frac_bits = check_frac_bits(frac_bits)
    bound = num_clients * (float(max_abs) * 2.0**frac_bits + 0.5) + float(noise_bound)
    if not bound < _HALF_RING:
        values, noise = num_clients * float(max_abs), float(noise_bound) * 2.0**-frac_bits  # in units of x
        need = np.log2(max(values + noise, 1e-300))
        fit = min(int(np.floor(62 - need)), MAX_FRAC_BITS) if np.isfinite(need) else -1
        size = f"2^{np.log2(bound):.1f}" if np.isfinite(bound) else "beyond float64"
        smaller = (
            "lower noise_std"
            if noise > values
            else "clip or rescale the features so the statistic is smaller"
        )
        fix = (
            f"lower frac_bits (at most {fit} fit) or {smaller}"
            if fit >= 0
            else f"even whole numbers (frac_bits=0) do not fit: {smaller}"
        )
        raise InputError(
            f"{name} could overflow the 2^{RING_BITS} ring: {num_clients} clients x max|x| = {max_abs:.4g} "
            f"at frac_bits={frac_bits} gives |sum| up to {size} >= 2^63; {fix}"
        )
    return bound


def encode(values: np.ndarray, frac_bits: int) -> np.ndarray:
    """Encode reals as uint64 ring elements: two's complement of round(x * 2^f).

    The caller must have checked the range with :func:`check_ring_bound`;
    values whose encoding leaves int64 raise :class:`InputError`.
    """
    # Chunk by chunk in the output itself (no temporary): scaled into the chunk's bytes read as float64,
    # range-checked (min and max propagate NaN), rounded and read back as int64.  Scaled values below
    # 2^51 in magnitude are rounded by adding 1.5 * 2^52, whose binade has a spacing of 1 (the same
    # round-half-to-even as np.rint), and read back as the integer offset of its bit pattern: no slow
    # float-to-integer conversion.
    raw = np.asarray(values)
    if raw.dtype.kind not in "biuf":  # complex, text or objects are no reals to encode (booleans are 0 and 1)
        raise InputError(f"fixed-point encoding takes real numbers, got dtype {raw.dtype}")
    v = raw.astype(np.float64, copy=False).reshape(-1)
    out = np.empty(v.size, dtype=np.int64)
    scale = 2.0 ** check_frac_bits(frac_bits)  # -1 halved every value and rounded small ones to 0
    for start in range(0, v.size, _CHUNK):
        dst = out[start : start + _CHUNK]
        c = dst.view(np.float64)
        np.multiply(v[start : start + _CHUNK], scale, out=c)
        if -_ROUND_BY_ADD < c.min() and c.max() < _ROUND_BY_ADD:
            c += _MAGIC
            dst -= _MAGIC_BITS
            continue
        np.rint(c, out=c)
        if not (-_HALF_RING < c.min() and c.max() < _HALF_RING):
            raise InputError(
                f"a value of magnitude {np.abs(c).max() / scale:.4g} does not fit the 64-bit ring at "
                f"frac_bits={frac_bits}; lower frac_bits or clip the features"
            )
        dst[...] = c.copy()  # the float64 values, read back as int64 (a chunk-sized copy: they share bytes)
    return out.reshape(np.shape(values)).view(np.uint64)


def decode(ring_values: np.ndarray, frac_bits: int) -> np.ndarray:
    """Read ring elements as signed int64 and scale back by 2^-f (float64).

    ``ring_values`` are 64-bit ring words: an integer array (uint64, int64, ...), or floats holding whole
    numbers in [-2^63, 2^64); a fractional, NaN, inf or non-numeric value is refused (InputError), never
    truncated or cast.
    """
    frac_bits = check_frac_bits(frac_bits)
    return _ring_words(ring_values).view(np.int64).astype(np.float64) * 2.0**-frac_bits


def _ring_words(ring_values) -> np.ndarray:
    """``ring_values`` as a contiguous uint64 array (two's complement for negative integers)."""
    try:
        raw = np.asarray(ring_values)
    except (ValueError, TypeError, OverflowError):
        raw = np.asarray(ring_values, dtype=object)
    if raw.dtype.kind in "iu":
        return np.ascontiguousarray(raw, dtype=np.uint64)
    if raw.dtype.kind != "f":
        raise InputError(
            f"ring_values must be 64-bit ring words (an integer array such as uint64), got dtype {raw.dtype}"
        )
    ok = np.isfinite(raw) & (raw == np.round(raw)) & (raw >= -_HALF_RING) & (raw < 2 * _HALF_RING)
    if not ok.all():
        bad = raw.reshape(-1)[~ok.reshape(-1)]
        raise InputError(
            f"ring_values must be whole numbers in [-2^63, 2^64) (64-bit ring words), got {bad[:3].tolist()}; "
            "pass the uint64 words the ring sum returned, not decoded or rounded reals"
        )
    # at least one dimension, as np.ascontiguousarray gives integer words
    raw = np.ascontiguousarray(raw)
    out = np.empty(raw.shape, dtype=np.uint64)
    neg = raw < 0
    out[neg] = raw[neg].astype(np.int64).view(np.uint64)
    out[~neg] = raw[~neg].astype(np.uint64)
    return out
