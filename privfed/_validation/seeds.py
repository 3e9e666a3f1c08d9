"""Seeds and random generators: one rule for every seed the library takes, and one for the numpy Generators
its simulations draw from.

Seeds are integers in 0..2**64 - 1, the range every random source of the library accepts
(:func:`check_seed`); a call that draws simulation randomness takes a :class:`numpy.random.Generator`
(:func:`check_generator`), or builds one from a seed (:func:`as_generator`).
"""

from __future__ import annotations

import numpy as np

from privfed.errors import ConfigError

__all__ = ["MAX_SEED", "as_generator", "check_generator", "check_seed", "sklearn_seed"]

#: Largest seed accepted: every random source of the library (numpy, scikit-learn, torch) takes 0..2**64 - 1.
MAX_SEED = 2**64 - 1


def check_seed(value, name: str = "seed") -> int:
    """``value`` as an int seed in ``0..2**64 - 1``, or a :class:`ConfigError` naming ``name`` and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{name} must be an integer seed in 0..2**64 - 1, got {value!r}")
    return int(value)


def sklearn_seed(seed: int):
    """A scikit-learn ``random_state`` for a seed of :func:`check_seed` (an int below 2**32 as it is)."""
    seed = check_seed(seed)
    if seed < 2**32:
        return seed
    return np.random.RandomState([seed & 0xFFFFFFFF, seed >> 32])  # the seed's two 32-bit words


def as_generator(value, name: str = "random_state") -> np.random.Generator:
    """A numpy Generator from None / a non-negative int seed / a Generator.

    ``None`` gives seed 0, so an unseeded call is still reproducible.
    """
    if isinstance(value, np.random.Generator):
        return value
    if value is None:
        return np.random.default_rng(0)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value <= MAX_SEED:
        return np.random.default_rng(int(value))
    raise ConfigError(
        f"{name} must be None, an integer seed in 0..2**64 - 1 or a numpy Generator, got {value!r}"
    )


def check_generator(rng, name: str = "rng", *, optional: bool = False) -> np.random.Generator | None:
    """``rng`` itself if it is a numpy Generator (or None, when ``optional``), else a :class:`ConfigError`
    naming ``name`` and how to make one: a seed or a legacy ``RandomState`` would draw other numbers, or
    none, where a Generator's are expected."""
    if isinstance(rng, np.random.Generator) or (optional and rng is None):
        return rng
    raise ConfigError(
        f"{name} must be a numpy.random.Generator{' or None' if optional else ''} "
        f"(np.random.default_rng(seed)), got {type(rng).__name__}"
    )
