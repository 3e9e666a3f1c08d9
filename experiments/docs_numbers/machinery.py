"""Finding, comparing and rewriting the marked blocks of README.md and docs/*.md."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from experiments.docs_numbers.sources import ROOT

README = ROOT / "README.md"


DOCS = ROOT / "docs"


def doc_files() -> list[pathlib.Path]:
    """The README and every page of the docs site: where the generated blocks live."""
    return [README, *sorted(DOCS.glob("*.md"))]


_OPEN = re.compile(r"<!-- readme-numbers:(?P<name>[\w-]+)(?P<attrs>[^>]*?)-->\n")


_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")


@dataclasses.dataclass
class Found:
    name: str
    tol: float
    start: int  # offset of the block's text (after the opening marker)
    end: int  # offset of the closing marker
    text: str


def find_blocks(readme: str) -> dict[str, Found]:
    """The marked blocks of ``readme`` by name."""
    out: dict[str, Found] = {}
    for m in _OPEN.finditer(readme):
        name = m.group("name")
        close = f"<!-- /readme-numbers:{name} -->"
        end = readme.find(close, m.end())
        if end < 0:
            raise ValueError(f"README block {name!r} has no closing marker {close!r}")
        attrs = dict(kv.split("=", 1) for kv in m.group("attrs").split() if "=" in kv)
        out[name] = Found(name, float(attrs.get("tol", 0)), m.end(), end, readme[m.end() : end])
    return out


def _mask(text: str, volatile) -> str:
    for pattern in volatile:
        text = re.sub(pattern, "<machine>", text)
    return text


def numbers(text: str) -> list[str]:
    """Every number in ``text`` as printed (thousands separators kept)."""
    return _NUMBER.findall(text)


def compare(name: str, readme_text: str, new_text: str, tol: float = 0.0, volatile=()) -> list[str]:
    """Differences between a README block and its regenerated text (empty when they agree)."""
    old, new = _mask(readme_text, volatile), _mask(new_text, volatile)
    a, b = numbers(old), numbers(new)
    problems = []
    if len(a) != len(b):
        problems.append(f"{name}: the README block has {len(a)} numbers, the regenerated one {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        try:
            dx = abs(float(x.replace(",", "")) - float(y.replace(",", "")))
        except ValueError:  # pragma: no cover - the regex only matches numbers
            dx = float("inf")
        if not dx <= tol:
            problems.append(
                f"{name}: number {i + 1} is {x} in the README, {y} regenerated (tolerance {tol:g})"
            )
    if not problems and re.sub(_NUMBER, "#", old) != re.sub(_NUMBER, "#", new):
        import difflib

        diff = [
            line
            for line in difflib.unified_diff(
                old.splitlines(), new.splitlines(), "README", "regenerated", n=0, lineterm=""
            )
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        problems.append(
            f"{name}: the text around the numbers differs from the regenerated text: " + " | ".join(diff[:6])
        )
    return problems


def keep_volatile(old: str, new: str, volatile) -> str:
    """``new`` with its machine-dependent spans replaced by the README's, where both have them."""
    for pattern in volatile:
        olds = re.findall(pattern, old)
        if olds and len(olds) == len(re.findall(pattern, new)):
            it = iter(olds)
            new = re.sub(pattern, lambda m: next(it), new)  # noqa: B023 - called here, within the loop
    return new
