"""Typed values of the commands' flags and config files alike: lists, numbers, strings, booleans, seeds."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

from privfed._validation import overflows_float64
from privfed._validation.seeds import MAX_SEED
from privfed.errors import ConfigError

__all__ = [
    "MAX_SEED_COUNT",
    "as_bool",
    "choose",
    "as_float",
    "as_int",
    "as_str",
    "parse_float_list",
    "parse_int_list",
    "parse_seeds",
    "parse_str_list",
]


def parse_str_list(text: str, name: str) -> list[str]:
    """'a,b, c' -> ['a', 'b', 'c']; empty items are an error naming the flag."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise ConfigError(f"{name}: malformed list {text!r}; use comma-separated values like 'a,b,c'")
    return items


def parse_float_list(text: str, name: str, *, positive: bool = False, allow_inf: bool = True) -> list[float]:
    """'0.1,1,inf' -> [0.1, 1.0, inf] with clear errors."""
    out = []
    for item in parse_str_list(text, name):
        try:
            v = float(item)
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not a number (in {text!r})") from None
        if math.isnan(v):
            raise ConfigError(f"{name}: NaN is not allowed")
        if overflows_float64(item):
            raise ConfigError(
                f"{name}: {item.strip()!r} overflows a float64 (the largest is about 1.8e308)"
                + ("; write inf if you mean infinity" if allow_inf and v > 0 else "")
            )
        if math.isinf(v) and (v < 0 or not allow_inf):
            raise ConfigError(f"{name}: {item!r} is not allowed here")
        if positive and v <= 0:
            raise ConfigError(f"{name} must be > 0, got {item}")
        out.append(v)
    return out


def parse_int_list(text: str, name: str, *, minimum: int = 0) -> list[int]:
    out = []
    for item in parse_str_list(text, name):
        try:
            v = int(item)
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not an integer (in {text!r})") from None
        if v < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {v}")
        out.append(v)
    return out


# ---------------------------------------------------------------- typed values (flags and config files alike)
def as_int(value: Any, flag: str, *, minimum: int | None = None) -> int:
    """An integer from a flag's text or a config value; 2.5, 'x' and true are refused, naming ``flag``."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise ConfigError(f"{flag} must be an integer, got {value!r}")
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(f"{flag} must be an integer, got {value!r}") from None
    if not isinstance(value, int):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{flag} must be >= {minimum}, got {value}")
    return value


def as_float(value: Any, flag: str) -> float:
    """A number (inf allowed) from a flag's text or a config value; 'abc', NaN and true are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{flag} must be a number, got {value!r}")
    try:
        v = float(value)
    except ValueError:
        raise ConfigError(f"{flag} must be a number, got {value!r}") from None
    except OverflowError:  # an integer beyond float64 (a config file's 10**400)
        raise ConfigError(f"{flag}: {value} overflows a float64 (the largest is about 1.8e308)") from None
    if math.isnan(v):
        raise ConfigError(f"{flag} must be a number, got NaN")
    return v


def as_str(value: Any, flag: str) -> str:
    """A string setting (a config file's number or list is refused, naming ``flag``)."""
    if not isinstance(value, str):
        raise ConfigError(f"{flag} must be a string, got {value!r}")
    return value


def as_bool(value: Any, flag: str) -> bool:
    """A true/false setting from a config file."""
    if not isinstance(value, bool):
        raise ConfigError(f"{flag} must be true or false, got {value!r}")
    return value


def choose(value: Any, choices: Sequence[str], flag: str, *, what: str = "value") -> str:
    """``value`` as one of ``choices``, in any case; an unknown one is refused with a "did you mean".

    ``choose("FedLog", METHOD_NAMES, "--method")`` is ``"fedlog"``; ``choose("fedcfo", ...)`` raises
    ``--method: unknown method 'fedcfo'; did you mean fedcof? (choose from ...)``.
    """
    text = as_str(value, flag).strip()
    low = {c.lower(): c for c in choices}
    if text.lower() in low:
        return low[text.lower()]
    near = difflib.get_close_matches(text.lower(), list(low), n=1, cutoff=0.6)
    hint = f"; did you mean {low[near[0]]}?" if near else ""
    raise ConfigError(f"{flag}: unknown {what} {text!r}{hint} (choose from {', '.join(choices)})")


#: The most seeds a count may ask for (a sweep of more runs is never meant; a list names larger seeds).
MAX_SEED_COUNT = 1_000_000


def _seed_count(n: int, flag: str) -> tuple[int, ...]:
    if n < 1:
        raise ConfigError(f"{flag} must be >= 1, got {n}")
    if n > MAX_SEED_COUNT:
        raise ConfigError(
            f"{flag} {n}: a count of more than {MAX_SEED_COUNT:,} seeds (one run each) is refused; pass a "
            "smaller count, or a list of the seeds you mean (e.g. 3,7)"
        )
    return tuple(range(n))


def _seed(v: int, flag: str) -> int:
    if not 0 <= v <= MAX_SEED:
        raise ConfigError(f"{flag}: every seed must lie in 0..2**64 - 1, got {v}")
    return v


def parse_seeds(value: Any, flag: str = "--seeds") -> tuple[int, ...]:
    """'5' or 5 -> (0..4); '3,7' or [3, 7] -> (3, 7); '7,' -> (7,); clear errors otherwise (every seed in
    0..2**64 - 1, at most :data:`MAX_SEED_COUNT` of them by count), checked before any work."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} must be a count or a list of integers, got {value!r}")
    if isinstance(value, int):
        return _seed_count(value, flag)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{flag} must not be empty")
        seeds = tuple(_seed(as_int(v, flag, minimum=0), flag) for v in value)
    elif not isinstance(value, str):
        raise ConfigError(f"{flag} must be a count or a list of integers, got {value!r}")
    elif "," not in value:
        return _seed_count(parse_int_list(value, flag, minimum=1)[0], flag)
    else:
        text = value.strip()
        if text.endswith(",") and text.count(",") == 1:  # a list of one seed: '7,'
            text = text[:-1]
        seeds = tuple(_seed(v, flag) for v in parse_int_list(text, flag, minimum=0))
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{flag} lists a seed twice: {value!r}")
    return seeds
