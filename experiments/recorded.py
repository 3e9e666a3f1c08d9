"""Recorded results: what a slow experiment measured, kept in the repository.

Some README numbers take minutes or hours to measure (benchmarks, attack and
audit sweeps, the recipes).  Their scripts, given ``--record``, write what
they measured to ``experiments/results/<name>.json`` through :func:`save`,
with the command that produced it, when, and on what machine and software.
``experiments/readme_numbers.py`` renders README blocks from these files, and
``tests/docs/test_readme.py`` checks that the README says what the records hold;
rerunning the command (and ``python -m experiments.readme_numbers --write``)
is how a number changes.  Machine-dependent values (seconds, ratios of
seconds) are recorded with the machine and labelled so in the README.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import platform
import sys
from typing import Any

from privfed.commands.common import json_text, write_json

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


class MissingRecord(FileNotFoundError):
    """A README block needs a record that has not been produced."""


def _software() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("numpy", "scipy", "torch", "sklearn", "privfed"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "?"))
    return out


def machine() -> dict[str, Any]:
    """The facts that make a timing comparable: CPUs, load, platform."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        load = None
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": load}


def command(script: str, argv) -> str:
    """The command line that reproduces a record: ``script`` and its arguments, without where outputs go."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--out", "-o"):
            skip = True
            continue
        if a.startswith("--out=") or a in ("--overwrite", "--quiet"):
            continue
        kept.append(a)
    return " ".join(["python", script, *kept])


def payload(name: str, data: Any, command: str) -> dict[str, Any]:
    return {
        "name": name,
        "command": command,
        "recorded_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "software": _software(),
        "data": json.loads(json_text(data)),
    }


def save(name: str, data: Any, command: str, *, directory: pathlib.Path | None = None) -> pathlib.Path:
    """Write the record ``name`` atomically and return its path."""
    d = pathlib.Path(directory) if directory is not None else RESULTS
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    write_json(path, payload(name, data, command))
    return path


def load(name: str, *, directory: pathlib.Path | None = None) -> dict[str, Any]:
    """The record ``name`` (its ``data`` under ``"data"``); a clear error when it is absent."""
    d = pathlib.Path(directory) if directory is not None else RESULTS
    path = d / f"{name}.json"
    if not path.exists():
        raise MissingRecord(f"no recorded result {path}; produce it with the experiment's --record flag")
    rec = json.loads(path.read_text(encoding="utf-8"))
    for key in ("name", "command", "data"):
        if key not in rec:
            raise ValueError(f"{path} is not a recorded result (no {key!r})")
    return rec
