"""Measure the package's shape against the floors of the README's package map (issue 28).

Prints the import circles between top-level packages/modules of flux_cluster, the imports that go
up a floor, circles between sibling modules inside a package, and the modules and functions over the
size limits. Exits 1 when a goal is missed (any circle, more than 3 arrows up, an unplaced unit,
a module over 600 lines or a function over 100). Standard library only (ast), so it runs anywhere:

    python tools/import_graph.py            # the report
    python tools/import_graph.py --arrows   # also every arrow between units, with its floors

The floors are read from the "floors" layers contract in pyproject.toml, which import-linter holds in
CI (tests/unit/test_architecture.py); this script shows the numbers behind it.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flux_cluster",)

CONTRACT_ID = "floors"
MAX_UP_ARROWS = 3
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100

Edge = tuple[str, str]


def read_floors(pyproject: Path) -> dict[str, int]:
    """Unit -> floor (0 is the bottom), from the layers contract in pyproject.toml: one source of truth.

    The package itself (its __init__: the version) sits with the foundations, on floor 0."""
    contracts = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c.get("id") == CONTRACT_ID)
    floors = {"": 0}
    for height, layer in enumerate(reversed(layers)):
        for name in re.split(r"[:|]", layer):
            floors[name.strip().strip("()")] = height
    return floors


def find_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the packages."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The nearest known module at or above a dotted name (`pkg.mod.func` -> `pkg.mod`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """Internal modules this module imports (anywhere in the file, as grimp counts them), with lines."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import func` imports mod.
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.append((target, node.lineno))
    return found


def unit_of(module: str) -> str:
    """The floor unit: the package's direct child (`flux_cluster.launch.plan` -> `launch`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def strongly_connected(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); returns only the components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def oversized(modules: dict[str, Path]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES, longest first."""
    big_modules: list[tuple[str, int]] = []
    big_functions: list[tuple[str, int]] = []
    for module, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            big_modules.append((module, lines))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    big_functions.append((f"{module}.{node.name} (line {node.lineno})", length))
    return (sorted(big_modules, key=lambda x: -x[1]), sorted(big_functions, key=lambda x: -x[1]))


def label(unit: str) -> str:
    return f"{PACKAGES[0]}.{unit}" if unit else PACKAGES[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrows", action="store_true", help="print every arrow between units")
    args = parser.parse_args(argv)

    floors = read_floors(ROOT / "pyproject.toml")
    modules = find_modules(ROOT, PACKAGES)
    module_edges: dict[str, set[str]] = defaultdict(set)
    unit_edges: dict[str, set[str]] = defaultdict(set)
    evidence: dict[Edge, list[str]] = defaultdict(list)
    for module, path in modules.items():
        for target, line in imports_of(module, path, modules):
            module_edges[module].add(target)
            a, b = unit_of(module), unit_of(target)
            if a != b:
                unit_edges[a].add(b)
                where = f"{path.relative_to(ROOT)}:{line} -> {target}"
                if where not in evidence[(a, b)]:
                    evidence[(a, b)].append(where)
    units = {unit_of(m) for m in modules}
    arrows = sorted((a, b) for a in unit_edges for b in unit_edges[a])
    unplaced = sorted(u for u in units if u not in floors)
    print(f"{len(modules)} modules in {len(units)} units, {len(arrows)} arrows between units")

    if args.arrows:
        print("\nArrows (importer floor -> imported floor):")
        for a, b in arrows:
            print(f"  {label(a)} ({floors.get(a, '?')}) -> {label(b)} ({floors.get(b, '?')})")

    circles = strongly_connected(units, unit_edges)
    print(f"\nCircles between units: {len(circles)}")
    for circle in circles:
        print("  " + " <-> ".join(label(u) for u in circle))
        # The arrows that close the circle: those that do not go down a floor.
        for a, b in arrows:
            if a in circle and b in circle and floors.get(a, -1) <= floors.get(b, -1):
                for where in evidence[(a, b)]:
                    print(f"      {where}")

    # Circles between sibling modules inside one package (what import-linter's acyclic_siblings sees).
    inner: list[list[str]] = []
    # The package's own children are the units above: only deeper packages here.
    for package in sorted({m.rpartition(".")[0] for m in modules} - {"", *PACKAGES}):
        children = {m for m in modules if m.rpartition(".")[0] == package}
        child_edges: dict[str, set[str]] = defaultdict(set)
        for module in modules:
            for target in module_edges.get(module, ()):
                a = _child_of(package, module)
                b = _child_of(package, target)
                if a and b and a != b and a in children and b in children:
                    child_edges[a].add(b)
        inner += strongly_connected(children, child_edges)
    print(f"\nCircles between sibling modules inside a package: {len(inner)}")
    for circle in inner:
        print("  " + " <-> ".join(circle))

    up = [(a, b) for a, b in arrows if a in floors and b in floors and floors[a] < floors[b]]
    print(f"\nImports up a floor: {len(up)} (goal <= {MAX_UP_ARROWS})")
    for a, b in up:
        print(f"  {label(a)} (floor {floors[a]}) -> {label(b)} (floor {floors[b]})")
        for where in evidence[(a, b)]:
            print(f"      {where}")

    if unplaced:
        print(f"\nUnits on no floor (add them to the floors contract and the README's map): {len(unplaced)}")
        for unit in unplaced:
            print(f"  {label(unit)}")

    big_modules, big_functions = oversized(modules)
    print(f"\nModules over {MAX_MODULE_LINES} lines: {len(big_modules)}")
    for name, lines in big_modules:
        print(f"  {name}: {lines}")
    print(f"Functions over {MAX_FUNCTION_LINES} lines: {len(big_functions)}")
    for name, lines in big_functions:
        print(f"  {name}: {lines}")

    missed = circles or inner or len(up) > MAX_UP_ARROWS or unplaced or big_modules or big_functions
    return 1 if missed else 0


def _child_of(package: str, module: str) -> str | None:
    """The child of `package` that `module` is or sits in (None if outside it)."""
    prefix = package + "."
    if not module.startswith(prefix):
        return None
    return prefix + module[len(prefix) :].split(".")[0]


if __name__ == "__main__":
    sys.exit(main())
