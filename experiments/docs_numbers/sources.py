"""Where the generated blocks read from: the repository, committed results, records, templates."""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATES = pathlib.Path(__file__).resolve().parent / "templates"
if str(ROOT) not in sys.path:  # the blocks import experiments.* and the tests' own constants
    sys.path.insert(0, str(ROOT))


def template(name: str) -> str:
    """The prose of a generated block: ``templates/NAME.md``, with ``{placeholders}`` the renderer fills."""
    return (TEMPLATES / f"{name}.md").read_text(encoding="utf-8")


def committed(*parts: str) -> dict:
    """A results file an experiment commits (its path relative to the repository root)."""
    return json.loads(ROOT.joinpath(*parts).read_text(encoding="utf-8"))


def digits_dataset():
    from privfed.data import load_dataset

    return load_dataset("digits")


def record(name: str) -> dict:
    from experiments import recorded

    return recorded.load(name)


def at(rows: list[dict], eps: float) -> dict:
    for r in rows:
        if float(r["epsilon"]) == eps:
            return r
    raise KeyError(f"no eps={eps} in the record")


def fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def sci(x: float) -> str:
    """1.2e-8 style, one decimal."""
    m, e = f"{x:.1e}".split("e")
    return f"{m}e{int(e)}"
