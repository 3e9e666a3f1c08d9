"""The docs site builds, and every code block of the README and the docs pages runs.

Each fenced ``bash`` or ``python`` block of README.md and docs/*.md is run as
written (bash blocks with ``python`` meaning this interpreter, in a temporary
folder; python blocks as a script).  A block may carry a marker on the line
before its fence:

* ``<!-- docs-test: slow REASON -->``: run by ``pytest -m slow tests/docs/test_docs.py``
  (CI runs it: ``.ci/run``);
* ``<!-- docs-test: equivalent TEST_FILE ... -->``: needs several hosts or a
  fresh install; the named test runs its single-host equivalent (checked to exist);
* ``<!-- docs-test: skip REASON -->``: an install or the test command itself.

Output blocks (no language) are generated and checked by tests/docs/test_readme.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
_MARK = re.compile(r"<!-- docs-test: (?P<kind>slow|equivalent|skip)\b(?P<rest>[^>]*)-->\s*$")


@dataclass(frozen=True)
class CodeBlock:
    page: str
    line: int
    lang: str
    body: str
    kind: str  # "run", "slow", "equivalent", "skip"
    note: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def code_blocks(pages=PAGES) -> list[CodeBlock]:
    out = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m.group("lang") not in ("bash", "python"):
                continue
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            kind, note = (mark.group("kind"), mark.group("rest").strip()) if mark else ("run", "")
            out.append(
                CodeBlock(
                    page.relative_to(REPO).as_posix(),
                    text[: m.start()].count("\n") + 1,
                    m.group("lang"),
                    m.group("body"),
                    kind,
                    note,
                )
            )
    return out


BLOCKS = code_blocks()


def _env(cache: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "PRIVFED_CACHE": str(cache),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }


def _run(block: CodeBlock, tmp_path: Path, cache: Path) -> None:
    env = _env(cache)  # `python` in a block is this interpreter's: its bin folder comes first on PATH
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.body)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.body]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, (
        f"{block.id} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    )
    assert "Traceback" not in res.stderr, f"{block.id}:\n{res.stderr[-3000:]}"


def test_the_block_finder_sees_every_kind():
    kinds = {b.kind for b in BLOCKS}
    assert {"run", "slow", "equivalent", "skip"} <= kinds
    assert any(b.page == "README.md" and b.lang == "python" for b in BLOCKS)  # the quickstart


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run"], ids=lambda b: b.id)
def test_code_block_runs(block, tmp_path, digits_cache):
    _run(block, tmp_path, digits_cache)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "slow"], ids=lambda b: b.id)
def test_slow_code_block_runs(block, tmp_path, digits_cache):
    _run(block, tmp_path, digits_cache)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind in ("equivalent", "skip")], ids=lambda b: b.id)
def test_blocks_not_run_say_why_and_name_a_real_test(block):
    assert block.note, f"{block.id}: a docs-test marker needs its reason"
    if block.kind == "equivalent":
        tests = re.findall(r"tests/(?:\w+/)*test_\w+\.py", block.note)
        assert tests and all((REPO / t).is_file() for t in tests), block.note


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        env={**_env(tmp_path / "cache"), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, (mkdocs, res.stderr[-4000:])
    for page in PAGES[1:]:
        assert (tmp_path / "site" / (page.stem if page.stem != "index" else "") / "index.html").is_file(), (
            page
        )


def test_readme_is_a_short_page_that_links_every_docs_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert 120 <= len(text.splitlines()) <= 250
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in text or page.name == "index.md", page.name


#: The import paths users type (docs/contributing.md): every one is documented on the API page.
PUBLIC = [
    "privfed.fit",
    "privfed.LinearHead",
    "privfed.ClientStats",
    "privfed.compute_client_stats",
    "privfed.ConfigError",
    "privfed.InputError",
    "privfed.PrivfedError",
    "privfed.estimators.FederatedHeadClassifier",
    "privfed.estimators.iid_clients",
    "privfed.tradeoff.run_tradeoff",
    "privfed.tradeoff.TradeoffConfig",
    "privfed.attack.run_attacks",
    "privfed.attack.AttackConfig",
    "privfed.flower.FlowerConfig",
    "privfed.flower.FlowerResult",
    "privfed.flower.run_simulation",
    "privfed.flower.serve",
    "privfed.rounds.run_rounds",
    "privfed.rounds.RoundsConfig",
    "privfed.testing.audit",
    "privfed.data.load_dataset",
    "privfed.data.FeatureDataset",
    "privfed.federation.partition",
    "privfed.results.record.check_record",
    "privfed.results.record.make_record",
    "mechanisms.GaussianMechanism",
    "mechanisms.LaplaceCountNoise",
    "mechanisms.GeometricCountNoise",
    "mechanisms.GaussianCountNoise",
    "mechanisms.UniformCountNoiseNoDP",
    "mechanisms.secagg.PairwiseMasking",
    "mechanisms.secagg.CKKSAggregation",
    "attacks.available",
    "attacks.get",
    "attacks.evaluate",
    "attacks.scenario",
]


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_every_public_entry_point_is_on_the_api_page():
    """Each name users import is rendered by a ``::: target`` of docs/api.md (the object itself, or a module
    whose members include it)."""
    pytest.importorskip("flwr")
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    documented: set[int] = set()
    for m in re.finditer(r"^::: (?P<target>[\w.]+)\n(?P<opts>(?:    .*\n)*)", text, re.M):
        obj = _resolve(m["target"])
        members = re.search(r"members: \[(.*)\]", m["opts"])
        names = [n.strip() for n in members[1].split(",")] if members else getattr(obj, "__all__", [])
        documented.add(id(obj))
        documented.update(id(getattr(obj, n)) for n in names if hasattr(obj, n))
    missing = [p for p in PUBLIC if id(_resolve(p)) not in documented]
    assert not missing, f"docs/api.md does not render {missing}"


def test_the_package_ships_its_type_hints():
    """py.typed beside every package, and declared as package data so that an install carries it."""
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for pkg in ("privfed", "mechanisms", "attacks"):
        assert (REPO / pkg / "py.typed").is_file() and "py.typed" in data.get(pkg, []), pkg
