"""What every privfed command shares: parsing, typed values, result folders, signals, errors.

Result folders (:class:`OutputDir`) are written atomically: each file goes to
a hidden temporary name and is renamed into place, a run that fails before
writing anything leaves no folder, and ``--overwrite`` leaves the folder
holding only the new run (files a previous privfed run wrote are removed; a
folder holding anything else is refused).  SIGTERM is handled like Ctrl-C
(:func:`interruptible`), so ``kill``, ``timeout`` and batch schedulers keep
the runs that finished.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import json
import math
import os
import platform
import signal
import sys
import time
import threading
from time import monotonic as time_monotonic
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from privfed.errors import ConfigError, PrivfedError

__all__ = [
    "HelpFormatter",
    "OutputDir",
    "Parser",
    "SECURE_AGG_KINDS",
    "Terminated",
    "add_common_arguments",
    "as_bool",
    "as_float",
    "as_int",
    "as_str",
    "check_out_path",
    "check_secure_agg",
    "cli_entry",
    "default_out_name",
    "heartbeat",
    "interruptible",
    "json_text",
    "parse_float_list",
    "keep_finished",
    "periodic_checkpoint",
    "placement_word",
    "parse_int_list",
    "parse_seeds",
    "parse_str_list",
    "prepare_out_dir",
    "signals_deferred",
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


def parse_seeds(value: Any, flag: str = "--seeds") -> tuple[int, ...]:
    """'5' or 5 -> (0..4); '3,7' or [3, 7] -> (3, 7); clear errors otherwise."""
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
    return tuple(parse_int_list(value, flag, minimum=0))


# ---------------------------------------------------------------- result folders
#: Names privfed writes into a result folder (besides ``grid_*.png``).
OUTPUT_NAMES = ("results.csv", "results.json", "results.partial.csv", "results.partial.json", "config.json",
                "tradeoff.png", "manifest.json")
MANIFEST = "manifest.json"


def _slug(text: str) -> str:
    out = "".join(c if (c.isalnum() or c in ".") else "-" for c in str(text))
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:60]


def default_out_name(prefix: str, *parts: str) -> Path:
    """``results/<prefix>-<what ran>-<time>``: a fresh folder whose name says what ran."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    what = "-".join(s for s in (_slug(p) for p in parts if p) if s)
    base = f"{prefix}-{what}-{stamp}" if what else f"{prefix}-{stamp}"
    path = Path("results") / base
    i = 1
    while path.exists():
        path = Path("results") / f"{base}-{i}"
        i += 1
    return path


def _is_privfed_tmp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".privfed-tmp")


def _privfed_files(path: Path) -> tuple[set[str], list[str]]:
    """Split a folder's entries into (files a previous privfed run wrote, everything else)."""
    listed: set[str] = set()
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (ValueError, OSError):
        data = None
    if isinstance(data, dict) and data.get("tool") == "privfed" and isinstance(data.get("files"), list):
        listed = {str(f) for f in data["files"]} | {MANIFEST}
    legacy = False  # a privfed run written before manifests existed: its results.json / config.json say so
    for marker in ("results.json", "results.partial.json", "config.json"):
        try:
            data = json.loads((path / marker).read_text())
        except (ValueError, OSError):
            continue
        if isinstance(data, dict) and "config" in data and "versions" in data or \
                isinstance(data, dict) and "attack" in data and "versions" in data:
            legacy = True
    ours, foreign = set(), []
    for entry in sorted(path.iterdir()):
        n = entry.name
        known = n in OUTPUT_NAMES or (n.startswith("grid_") and n.endswith(".png"))
        if entry.is_file() and not entry.is_symlink() and (n in listed or _is_privfed_tmp(n) or (legacy and known)):
            ours.add(n)
        else:
            foreign.append(n)
    return ours, foreign


def check_out_path(out: str | Path, *, overwrite: bool, flag: str = "--out") -> tuple[Path, set[str]]:
    """Validate an output folder before any work: returns (path, files of a previous run to replace).

    Refused with one line: a path that is a file, a path under a file, an
    existing non-empty folder without ``overwrite``, and (with ``overwrite``)
    a folder holding anything privfed did not write.
    """
    path = Path(out)
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{flag} {str(path)!r}: {str(parent)!r} is a file, so no folder can be made "
                              "under it; choose another path")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a file, not a folder; choose a folder path (--overwrite "
                          "replaces a previous run's folder, never a file)")
    if not path.exists() or not any(path.iterdir()):
        return path, set()
    if not overwrite:
        raise ConfigError(
            f"{flag} {str(path)!r} already exists and is not empty; choose a new folder or pass --overwrite")
    ours, foreign = _privfed_files(path)
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise ConfigError(f"{flag} {str(path)!r} holds files privfed did not write ({shown}); --overwrite only "
                          "replaces a previous privfed run: choose another folder or move them")
    return path, ours


class OutputDir:
    """A result folder written atomically, holding only the files of one run.

    Nothing is created until the first file is written, so a run that fails
    before producing anything leaves no folder behind.  Every file is written
    to a hidden temporary name and renamed into place (``os.replace``), so a
    reader never sees a half-written result.  With ``overwrite``, the files of
    the previous run are removed once this run has written its own
    (:meth:`finish`), never before: a run that fails early leaves the old
    results as they were.  ``manifest.json`` lists the files of the run.
    """

    def __init__(self, out: str | Path | None, prefix: str, *, overwrite: bool = False,
                 name_parts: Sequence[str] = ()) -> None:
        if out is None:
            self.path = default_out_name(prefix, *name_parts)
            self._old: set[str] = set()
        else:
            self.path, self._old = check_out_path(out, overwrite=overwrite)
        self._existed = self.path.exists()
        self.written: list[str] = []

    def _atomic(self, name: str, write: Callable[[Path], None]) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / name
        tmp = self.path / f".{name}.{os.getpid()}.privfed-tmp"
        try:
            write(tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if name not in self.written:
            self.written.append(name)
        return final

    def write_text(self, name: str, text: str) -> Path:
        """Write ``text`` to ``name`` atomically."""
        return self._atomic(name, lambda p: p.write_text(text))

    def write_json(self, name: str, payload: Any) -> Path:
        """Write ``payload`` as JSON (inf/NaN as strings) atomically."""
        return self.write_text(name, json_text(payload))

    def write_csv(self, name: str, rows: Sequence[dict[str, Any]], fieldnames: Sequence[str]) -> Path:
        """Write ``rows`` as a CSV with the columns ``fieldnames`` atomically."""
        def write(p: Path) -> None:
            with p.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(fieldnames))
                w.writeheader()
                for r in rows:
                    w.writerow({k: r.get(k, "") for k in fieldnames})

        return self._atomic(name, write)

    def save_figure(self, name: str, fig: Any, **kwargs: Any) -> Path:
        """Save a matplotlib figure atomically (format from the name's suffix)."""
        fmt = name.rsplit(".", 1)[-1]
        return self._atomic(name, lambda p: fig.savefig(p, format=fmt, **kwargs))

    def finish(self, command: str, *, complete: bool, drop: Sequence[str] = ()) -> None:
        """Remove ``drop`` and the previous run's files not rewritten, then write the manifest."""
        for name in ({*drop} | (self._old - set(self.written))) - {MANIFEST}:
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
            if name in self.written:
                self.written.remove(name)
        self._old = set()
        self.write_json(MANIFEST, {"tool": "privfed", "command": command, "complete": complete,
                                   "files": [n for n in self.written if n != MANIFEST]})

    def abandon(self) -> None:
        """A run that wrote nothing: remove the folder if this run would have created it."""
        if not self._existed and self.path.is_dir():
            for e in self.path.iterdir():
                if _is_privfed_tmp(e.name):
                    with contextlib.suppress(FileNotFoundError):
                        e.unlink()
            with contextlib.suppress(OSError):
                self.path.rmdir()

    def files(self) -> list[str]:
        """What this run wrote, in order (the manifest last)."""
        return [n for n in self.written if n != MANIFEST] + ([MANIFEST] if MANIFEST in self.written else [])


def prepare_out_dir(out: str | None, prefix: str, *, overwrite: bool = False) -> Path:
    """The output folder (created): a new timestamped one under results/ by default.

    An existing non-empty folder is refused unless ``overwrite`` (then it may
    hold only a previous privfed run): a previous run is never mixed in silently.
    """
    path = default_out_name(prefix) if out is None else check_out_path(out, overwrite=overwrite)[0]
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- signals
class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, batch schedulers), handled like Ctrl-C."""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` (a KeyboardInterrupt) while the block runs.

    Only in the main thread (where Python delivers signals); the previous
    handler is restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT / SIGTERM while the block runs (writing what finished); raise them afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum, frame):
        got.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise Terminated() if got[0] == signal.SIGTERM else KeyboardInterrupt()


def periodic_checkpoint(write_partial: Callable[[list], None], every: float) -> Callable[[list], None]:
    """A callback for a long sweep: every ``every`` seconds, what finished goes to disk.

    Signals wait while the partial files are written, so a killed sweep keeps them.
    """
    last = time.monotonic()

    def checkpoint(records: list) -> None:
        nonlocal last
        if time.monotonic() - last >= every:
            with signals_deferred():
                write_partial(records)
            last = time.monotonic()

    return checkpoint


def keep_finished(out: "OutputDir", done: list, write_partial: Callable[[list], None], command: str,
                  prog: str) -> None:
    """After an interrupt or a failure: what finished goes to results.partial.*, or no folder is left.

    A second Ctrl-C / SIGTERM waits until what finished is on disk.
    """
    with signals_deferred():
        if done:
            write_partial(done)
            out.finish(command, complete=False)
            print(f"{prog}: the sweep stopped after {len(done)} run(s); they are in "
                  f"{out.path}/results.partial.csv and results.partial.json", file=sys.stderr)
        else:
            out.abandon()


@contextlib.contextmanager
def heartbeat(bar: Any, *, after: float = 2.0, every: float = 1.0) -> Iterator[None]:
    """Redraw a progress bar every ``every`` seconds once ``after`` seconds have passed.

    A single run that takes minutes (a model inversion) then still shows its
    elapsed time instead of a frozen or absent bar.
    """
    if getattr(bar, "disable", True):
        yield
        return
    stop = threading.Event()
    t0 = time_monotonic()

    def beat() -> None:
        while not stop.wait(every):
            if time_monotonic() - t0 >= after:
                with contextlib.suppress(Exception):
                    bar.refresh()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# ---------------------------------------------------------------- parsers
class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (a ConfigError naming the flag) instead of usage + exit."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(f"{message} (see --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help (unless the help names it); the epilog kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default is None or action.default is False \
                or action.default == argparse.SUPPRESS or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def add_common_arguments(p: argparse.ArgumentParser, *, prefix: str, seeds_default: str) -> None:
    """The options every privfed command shares, with the same names, meanings and defaults."""
    a = p.add_argument
    a("--secure-agg", metavar="{none,mask,ckks}", nargs="?", const="mask",
      help="secure aggregation: none, mask (pairwise masking) or ckks (TenSEAL); the server then sees only "
           "the sum of the uploads; a bare --secure-agg means mask (default: none)")
    a("--seeds", metavar="N|LIST", help=f"number of seeds (0..N-1) or a list like 3,7 (default: {seeds_default})")
    a("--out", metavar="DIR", help=f"output folder, new or empty (default: a fresh results/{prefix}-<what ran>-<time>)")
    a("--overwrite", action="store_true", help="--out may be a previous privfed run's folder: its files are "
      "replaced so the folder holds only this run (a folder holding other files is refused)")
    a("--quiet", action="store_true", help="no progress bar")


SECURE_AGG_KINDS = ("none", "mask", "ckks")

#: The words every output uses for where the noise is added.
PLACEMENT_WORDS = ("local", "secure sum", "trusted aggregator")


def placement_word(stated: Any, fallback: str) -> str:
    """A report's placement in the outputs' words ("local", "secure sum", "trusted aggregator").

    ``fallback`` (derived from the run's settings) is used when the report states none.
    """
    if not isinstance(stated, str) or not stated.strip():
        return fallback
    low = stated.lower().replace("_", " ").replace("-", " ")
    for word, keys in (("secure sum", ("secure", "distributed")), ("trusted aggregator", ("trusted", "server", "central")),
                       ("local", ("local", "client"))):
        if low.startswith(word) or any(low.startswith(k) for k in keys):
            return word
    return stated


def check_secure_agg(value: Any) -> str:
    """'none', 'mask' or 'ckks' (the same rule for the flag and a config file)."""
    v = as_str(value, "--secure-agg")
    if v not in SECURE_AGG_KINDS:
        raise ConfigError(f"--secure-agg must be none, mask or ckks, got {v!r}")
    return v


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


def json_text(payload: Any) -> str:
    """JSON text of ``payload`` (numpy values converted; inf/NaN written as strings)."""
    return json.dumps(_finite_or_str(json.loads(json.dumps(payload, default=_json_default))), indent=2) + "\n"


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temporary name, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.privfed-tmp")
    try:
        tmp.write_text(json_text(payload))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


#: import name -> what to install, for optional dependencies the commands may need.
_PIP_NAMES = {"skimage": "scikit-image", "tenseal": "tenseal", "matplotlib": "matplotlib", "opendp": "opendp",
              "torchvision": "torchvision", "opacus": "opacus", "torch": "torch", "flwr": "flwr[simulation]"}


def cli_entry(prog: str, body: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a CLI body: user mistakes print one line on stderr and exit 2, no traceback.

    Ctrl-C exits 130 and SIGTERM 143 (128 + the signal number), after the
    body has written what finished.
    """

    def main(argv: Sequence[str] | None = None) -> int:
        try:
            with interruptible():
                return body(argv)
        except PrivfedError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        except FileNotFoundError as exc:
            print(f"{prog}: error: file not found: {exc.filename or exc}", file=sys.stderr)
            return 2
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if top not in _PIP_NAMES:
                raise
            from privfed.optional import EXTRAS

            extra = f' (or the extra: pip install "privfed[{EXTRAS[top]}]")' if top in EXTRAS else ""
            print(f"{prog}: error: this run needs the optional package {_PIP_NAMES[top]!r}, which is not "
                  f"installed: pip install {_PIP_NAMES[top]}{extra}", file=sys.stderr)
            return 2
        except Terminated:
            print(f"{prog}: terminated (SIGTERM)", file=sys.stderr)
            return 143
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130

    return main
