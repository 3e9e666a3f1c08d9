"""The layout is the architecture: imports flow down the layers that docs/contributing.md draws.

Every import in ``privfed``, ``mechanisms`` and ``attacks`` -- at module level or inside a function -- is
read from the source and checked against the layer table below: a module may import its own layer
and the layers beneath it, never one above.  Beside it: no import circle between modules, no private
name imported from another module, no family of modules named by a prefix at the top of a package,
and no module over the size one job needs.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("privfed", "mechanisms", "attacks")

#: Lowest first.  A unit is a package or module; the first (longest) prefix that matches names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # 0: privfed's core -- errors, notes, statistics, the methods and their contract, data, results
    (
        "privfed",  # the package itself: lazy names only
        "privfed.errors",
        "privfed.notes",
        "privfed.optional",
        "privfed._registry",
        "privfed._validation",
        "privfed._files",
        "privfed._linalg",
        "privfed.stats",
        "privfed.head",
        "privfed.scaling",
        "privfed.methods",
        "privfed.data",
        "privfed.federation",
        "privfed.results",
    ),
    # 1: differential privacy, then secure aggregation (which uses it)
    ("mechanisms.dp",),
    ("mechanisms.secagg", "mechanisms"),
    # 2: the release as data: plan, stages, trace, the in-process path
    ("privfed.release",),
    # 3: what runs a release for a user, and what a curious server does with one
    ("privfed.api", "privfed.estimators", "attacks"),
    # 4: multi-round FedLog (its releases, and the attacks observing them)
    ("privfed.rounds",),
    # 5: the consumers of every path: the black-box audit, the Flower apps, privfed.testing
    ("privfed.audit", "privfed.flower", "privfed.testing"),
    # 6: the commands and the entry points users type
    ("privfed.commands", "privfed.tradeoff", "privfed.attack", "privfed.flower.__main__"),
)


def _layer_of(module: str) -> int:
    best, layer = "", None
    for i, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best, layer = unit, i
    assert layer is not None, f"{module} is in no layer of tests/architecture/test_layers.py"
    return layer


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, int, bool, list[str]]]:
    """(module imported, line, at module level, names taken from it) for every import of a file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, node.lineno, id(node) in top, []))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [a.name for a in node.names]
            for name in names:  # `from pkg import submodule` imports the submodule
                if f"{node.module}.{name}" in MODULES:
                    found.append((f"{node.module}.{name}", node.lineno, id(node) in top, []))
            found.append((node.module, node.lineno, id(node) in top, names))
    return [f for f in found if f[0].split(".")[0] in PACKAGES]


def test_every_import_flows_down_the_layers():
    upward = []
    for module, path in MODULES.items():
        mine = _layer_of(module)
        for target, line, _, _ in _imports(path):
            if _layer_of(target) > mine:
                upward.append(
                    f"{path.relative_to(ROOT)}:{line} ({module}, layer {mine}) imports {target} "
                    f"(layer {_layer_of(target)})"
                )
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_the_layer_table_can_fail():
    # the check above would see an upward import: the core importing a mechanism, mechanisms the release
    assert _layer_of("mechanisms.dp.gaussian.mechanism") > _layer_of("privfed.stats.fold")
    assert _layer_of("privfed.release.plan") > _layer_of("mechanisms.secagg.masking.node")
    assert _layer_of("privfed.commands.tradeoff.sweep") > _layer_of("attacks.inversion.attack")
    assert _layer_of("mechanisms.secagg.noise") > _layer_of("mechanisms.dp.calibration")


def test_no_import_circle_between_modules():
    graph = defaultdict(set)
    for module, path in MODULES.items():
        for target, _, _, _ in _imports(path):
            # the module a name comes from: the longest known prefix
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    # Tarjan's strongly connected components
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10_000)
    for v in list(MODULES):
        if v not in index:
            visit(v)
    assert not sccs, f"import circles: {sccs}"


def test_no_private_name_is_imported_from_another_module():
    found = []
    for path in MODULES.values():
        for target, line, _, names in _imports(path):
            for name in names:
                if name.startswith("_") and not name.startswith("__") and f"{target}.{name}" not in MODULES:
                    found.append(f"{path.relative_to(ROOT)}:{line} takes {name} from {target}")
    assert not found, "\n".join(found)


def test_no_family_of_modules_named_by_a_prefix_at_the_top_of_a_package():
    for pkg in PACKAGES:
        names = [p.stem.lstrip("_") for p in (ROOT / pkg).glob("*.py") if p.stem != "__init__"]
        prefixes = defaultdict(list)
        for name in names:
            prefixes[name.split("_")[0]].append(name)
        families = {p: n for p, n in prefixes.items() if len(n) >= 3}
        assert not families, f"{pkg}/: modules named by a shared prefix belong in a package: {families}"


def test_privfed_keeps_few_modules_beside_its_packages():
    modules = [p.name for p in (ROOT / "privfed").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 15, sorted(modules)


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_module_is_over_the_size_one_job_needs(pkg):
    big = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / pkg).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 510
    }
    assert not big, big


def test_every_package_says_what_it_holds():
    silent = [
        str(init.relative_to(ROOT))
        for pkg in PACKAGES
        for init in (ROOT / pkg).rglob("__init__.py")
        if not ast.get_docstring(ast.parse(init.read_text()))
    ]
    assert not silent, silent


def test_the_contributor_map_names_every_package():
    page = (ROOT / "docs" / "contributing.md").read_text()
    packages = sorted(
        ".".join(init.parent.relative_to(ROOT).parts)
        for pkg in PACKAGES
        for init in (ROOT / pkg).rglob("__init__.py")
    )
    missing = [p for p in packages if not re.search(rf"`{re.escape(p)}[`/.]", page)]
    assert not missing, f"docs/contributing.md does not name: {missing}"
