"""The experiment scripts' flag types: each value is checked when the command line is read, before any work
starts, and a wrong one is argparse's one-line usage error naming the flag (exit 2), never a traceback
minutes into a run.

Use them as ``type=``: ``p.add_argument("--cells", type=count(1), default=40)``.  A list flag's default
may be its text (argparse converts a string default through ``type``) or the list itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path

from privfed.commands.values import parse_float_list, parse_int_list, parse_str_list
from privfed.errors import ConfigError

__all__ = ["count", "degree", "even_degree", "float_list", "int_list", "name_list", "out_path", "seed"]


def _flag_type(name: str, read: Callable[[str], object]) -> Callable[[str], object]:
    """``read`` as an argparse type: its ConfigError (or ValueError) becomes the usage error's text."""

    def convert(text: str):
        try:
            return read(text)
        except (ConfigError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def count(minimum: int = 1) -> Callable[[str], int]:
    """An integer >= ``minimum`` (repeats, runs, seeds, cells, nodes)."""

    def read(text: str) -> int:
        try:
            v = int(str(text).strip())
        except ValueError:
            raise ConfigError(f"must be an integer >= {minimum}, got {text!r}") from None
        if v < minimum:
            raise ConfigError(f"must be an integer >= {minimum}, got {v}")
        return v

    return _flag_type("count", read)


#: A seed: any integer >= 0 (numpy's generators take any size; its own error for -1 is a traceback from inside
#: its bit generator).
seed = count(0)


def int_list(minimum: int = 0, *, empty: bool = False) -> Callable[[str], list[int]]:
    """Comma-separated integers >= ``minimum`` (``''`` is the empty list where ``empty``)."""

    def read(text: str) -> list[int]:
        if empty and not str(text).strip():
            return []
        return parse_int_list(text, "entries", minimum=minimum)

    return _flag_type("int_list", read)


def float_list(
    *, positive: bool = False, allow_inf: bool = True, empty: bool = False
) -> Callable[[str], list[float]]:
    """Comma-separated numbers (NaN refused; ``positive``: each > 0)."""

    def read(text: str) -> list[float]:
        if empty and not str(text).strip():
            return []
        return parse_float_list(text, "entries", positive=positive, allow_inf=allow_inf)

    return _flag_type("float_list", read)


def name_list(known: Iterable[str], *, empty: bool = False) -> Callable[[str], list[str]]:
    """Comma-separated names, each one of ``known`` (an unknown or repeated name is refused, not skipped)."""
    allowed = tuple(known)

    def read(text: str) -> list[str]:
        if empty and not str(text).strip():
            return []
        got = parse_str_list(text, "entries")
        bad = [g for g in got if g not in allowed]
        if bad:
            raise ConfigError(f"unknown name(s) {bad}; choose from {', '.join(allowed)}")
        if len(set(got)) != len(got):
            raise ConfigError(f"a name is given twice in {text!r}")
        return got

    return _flag_type("names", read)


def _degree(text: str, complete: bool) -> int | None:
    if complete and str(text).strip() == "complete":
        return None
    try:
        k = int(str(text).strip())
    except ValueError:
        k = None
    if k is None or k < 2 or k % 2:
        also = ", or 'complete'" if complete else ""
        raise ConfigError(f"the SecAgg+ degree must be an even integer >= 2{also}; got {text!r}")
    return k


#: A SecAgg+ degree: an even integer >= 2, or ``complete`` (None: every node a neighbour of every other).
degree = _flag_type("degree", lambda text: _degree(text, True))
#: A SecAgg+ degree that must be a number (an even integer >= 2).
even_degree = _flag_type("even_degree", lambda text: _degree(text, False))


def out_path(text: str) -> str:
    """An output folder: missing (it is made) or a folder, never an existing file (the text, checked)."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("an empty path; give a folder for the results")
    path = Path(str(text)).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{str(text)!r} is a file, not a folder; give a folder for the results"
        )
    return str(text)
