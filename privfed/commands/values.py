"""Typed values of the commands' flags and config files alike: lists, numbers, strings, booleans, seeds."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

from privfed.errors import ConfigError

__all__ = [
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


def parse_seeds(value: Any, flag: str = "--seeds") -> tuple[int, ...]:
    """'5' or 5 -> (0..4); '3,7' or [3, 7] -> (3, 7); '7,' -> (7,); clear errors otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} must be a count or a list of integers, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
        return tuple(range(value))
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{flag} must not be empty")
        return tuple(as_int(v, flag, minimum=0) for v in value)
    if not isinstance(value, str):
        raise ConfigError(f"{flag} must be a count or a list of integers, got {value!r}")
    if "," not in value:
        return tuple(range(parse_int_list(value, flag, minimum=1)[0]))
    text = value.strip()
    if text.endswith(",") and text.count(",") == 1:  # a list of one seed: '7,'
        text = text[:-1]
    seeds = tuple(parse_int_list(text, flag, minimum=0))
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{flag} lists a seed twice: {value!r}")
    return seeds
