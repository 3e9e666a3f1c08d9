"""Helpers shared by the command-line entry points (lists, errors, outputs)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from privfed.errors import ConfigError, PrivfedError

__all__ = [
    "cli_entry",
    "parse_float_list",
    "parse_int_list",
    "parse_str_list",
    "prepare_out_dir",
    "versions",
    "write_json",
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


def prepare_out_dir(out: str | None, prefix: str, *, overwrite: bool = False) -> Path:
    """The output folder: a new timestamped one under results/ by default.

    An existing non-empty folder is refused unless ``overwrite``: a previous
    run is never overwritten silently.
    """
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path("results") / f"{prefix}-{stamp}"
        i = 1
        while path.exists():
            path = Path("results") / f"{prefix}-{stamp}-{i}"
            i += 1
    else:
        path = Path(out)
        if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
            raise ConfigError(
                f"--out {str(path)!r} already exists and is not empty; choose a new folder or pass --overwrite"
            )
    path.mkdir(parents=True, exist_ok=True)
    return path


def versions() -> dict[str, str]:
    """Versions of Python and of the packages that determine results."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("privfed", "numpy", "scipy", "scikit-learn", "torch", "torchvision", "dp-accounting",
                "opacus", "opendp", "tenseal", "cryptography"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def _json_default(o: Any):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "as_dict"):
        return o.as_dict()
    return str(o)


def _finite_or_str(o: Any):
    """JSON has no inf/NaN: write them as strings 'inf' / 'nan'."""
    if isinstance(o, float) and not math.isfinite(o):
        return "inf" if o > 0 else ("-inf" if o < 0 else "nan")
    if isinstance(o, dict):
        return {k: _finite_or_str(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite_or_str(v) for v in o]
    return o


def write_json(path: Path, payload: Any) -> None:
    text = json.dumps(_finite_or_str(json.loads(json.dumps(payload, default=_json_default))), indent=2)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def cli_entry(prog: str, body: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a CLI body: user mistakes print one line on stderr and exit 2, no traceback."""

    def main(argv: Sequence[str] | None = None) -> int:
        try:
            return body(argv)
        except PrivfedError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        except FileNotFoundError as exc:
            print(f"{prog}: error: file not found: {exc.filename or exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130

    return main
