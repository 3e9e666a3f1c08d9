"""What every privfed command shares: parsers, result folders, run records, one-line errors.

Typed values live in :mod:`privfed.commands.values` and signal handling in :mod:`privfed.commands.signals`;
both are re-exported here.

Result folders (:class:`OutputDir`) are written as one unit by
:mod:`privfed.results.writer`: a staging folder beside ``--out`` renamed into
place when the run ends, a manifest with every file's SHA-256 written last,
a lock refusing a second run on the same folder, and ``--overwrite`` swapping
the previous run out only once the new one is complete.  SIGTERM is handled
like Ctrl-C (:func:`interruptible`), so ``kill``, ``timeout`` and batch
schedulers keep the runs that finished.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import json
import math
import platform
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from privfed.commands.signals import (
    Terminated,
    heartbeat,
    interruptible,
    keep_finished,
    periodic_checkpoint,
    signals_deferred,
)
from privfed.commands.values import (
    as_bool,
    as_float,
    as_int,
    as_str,
    parse_float_list,
    parse_int_list,
    parse_seeds,
    parse_str_list,
)
from privfed.errors import ConfigError, PrivfedError
from privfed.results.writer import ResultFolder, atomic_write, check_out_path

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


# ---------------------------------------------------------------- result folders
# One writer for every command: privfed.results.writer (staging folder, manifest with hashes, lock, swap).


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


class OutputDir(ResultFolder):
    """A command's result folder: :class:`privfed.results.writer.ResultFolder` with the commands' defaults.

    ``out=None`` is a fresh ``results/<prefix>-<what ran>-<time>``.  Files go
    to a staging folder beside ``out``; :meth:`finish` writes the manifest
    last and moves the run into place in one step (swapping out a previous
    run with ``overwrite``); :meth:`abandon` removes a run that wrote
    nothing.  The folder is locked against a second run from construction
    to :meth:`finish` / :meth:`abandon`.
    """

    def __init__(
        self,
        out: str | Path | None,
        prefix: str,
        *,
        overwrite: bool = False,
        name_parts: Sequence[str] = (),
        command: str = "",
    ) -> None:
        path = default_out_name(prefix, *name_parts) if out is None else out
        super().__init__(path, overwrite=overwrite, command=command or " ".join(sys.argv))

    def write_text(self, name: str, text: str) -> Path:
        """Write ``text`` to ``name`` atomically."""
        return self.write(name, lambda p: p.write_text(text))

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

        return self.write(name, write)

    def save_figure(self, name: str, fig: Any, **kwargs: Any) -> Path:
        """Save a matplotlib figure atomically (format from the name's suffix)."""
        fmt = name.rsplit(".", 1)[-1]
        return self.write(name, lambda p: fig.savefig(p, format=fmt, **kwargs))

    def finish(self, command: str, *, complete: bool, drop: Sequence[str] = ()) -> Path:
        """Drop ``drop``, write the manifest last and move the run into place; returns where it went."""
        self.command = command
        self.remove(drop)
        return self.publish(complete=complete)

    def abandon(self) -> None:
        """A run that wrote nothing: no folder is left (a previous run in ``out`` stays as it was)."""
        self.discard()


def prepare_out_dir(out: str | None, prefix: str, *, overwrite: bool = False) -> Path:
    """The output folder (created): a new timestamped one under results/ by default.

    An existing non-empty folder is refused unless ``overwrite`` (then it may
    hold only a previous privfed run): a previous run is never mixed in silently.
    """
    path = default_out_name(prefix) if out is None else check_out_path(out, overwrite=overwrite)[0]
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- parsers
class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (a ConfigError naming the flag) instead of usage + exit."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(f"{message} (see --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help (unless the help names it); the epilog kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text.lower()
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def add_common_arguments(p: argparse.ArgumentParser, *, prefix: str, seeds_default: str) -> None:
    """The options every privfed command shares, with the same names, meanings and defaults."""
    a = p.add_argument
    a(
        "--secure-agg",
        metavar="{none,mask,ckks}",
        nargs="?",
        const="mask",
        help="secure aggregation: none, mask (pairwise masking) or ckks (TenSEAL); the server then sees only "
        "the sum of the uploads; a bare --secure-agg means mask (default: none)",
    )
    a(
        "--seeds",
        metavar="N|LIST",
        help=f"number of seeds (0..N-1) or a list like 3,7 (default: {seeds_default})",
    )
    a(
        "--out",
        metavar="DIR",
        help=f"output folder, new or empty (default: a fresh results/{prefix}-<what ran>-<time>)",
    )
    a(
        "--overwrite",
        action="store_true",
        help="--out may be a previous privfed run's folder: its files are "
        "replaced so the folder holds only this run (a folder holding other files is refused)",
    )
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
    for word, keys in (
        ("secure sum", ("secure", "distributed")),
        ("trusted aggregator", ("trusted", "server", "central")),
        ("local", ("local", "client")),
    ):
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
    for pkg in (
        "privfed",
        "numpy",
        "scipy",
        "scikit-learn",
        "torch",
        "torchvision",
        "dp-accounting",
        "opacus",
        "opendp",
        "tenseal",
        "cryptography",
    ):
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
    """Write ``payload`` as JSON to ``path`` atomically (temporary name, fsync, then rename)."""
    text = json_text(payload)
    atomic_write(Path(path), lambda p: p.write_text(text))


#: import name -> what to install, for optional dependencies the commands may need.
_PIP_NAMES = {
    "skimage": "scikit-image",
    "tenseal": "tenseal",
    "matplotlib": "matplotlib",
    "opendp": "opendp",
    "torchvision": "torchvision",
    "opacus": "opacus",
    "torch": "torch",
    "flwr": "flwr[simulation]",
}


def cli_entry(
    prog: str, body: Callable[[Sequence[str] | None], int]
) -> Callable[[Sequence[str] | None], int]:
    """Wrap a CLI body: user mistakes print one line on stderr and exit 2, no traceback.

    Ctrl-C exits 130 and SIGTERM 143 (128 + the signal number), after the
    body has written what finished.
    """

    def main(argv: Sequence[str] | None = None) -> int:
        try:
            with interruptible():
                from privfed.stats import dense_view_limit

                dense_view_limit()  # a malformed $PRIVFED_DENSE_VIEW_LIMIT: one line at once, not mid-run
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
            print(
                f"{prog}: error: this run needs the optional package {_PIP_NAMES[top]!r}, which is not "
                f"installed: pip install {_PIP_NAMES[top]}{extra}",
                file=sys.stderr,
            )
            return 2
        except Terminated:
            print(f"{prog}: terminated (SIGTERM)", file=sys.stderr)
            return 143
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130

    return main
