"""The package's shape: the import-linter contracts in pyproject.toml (the README's package map) hold,
and tools/import_graph.py, which measures the same floors, finds circles and arrows up a floor."""

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from conftest import REPO


def _import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "tools" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), f"{lint} is missing: run 'bash tools/dev.sh setup' (pyproject's test extra has it)"
    result = subprocess.run(
        [str(lint), "--no-cache", "--no-logo"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_graph_finds_circles_and_arrows_up(tmp_path: Path) -> None:
    graph = _import_graph()
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "from pkg.high import thing\n",  # up a floor, and a circle with high
        "pkg/high/__init__.py": "from . import part\n",
        "pkg/high/part.py": "def f():\n    from ..low import x\n",  # inside a function still counts
        "pkg/alone.py": "import os\nimport pkg.low.missing_name\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = graph.find_modules(tmp_path, ["pkg"])
    assert sorted(modules) == ["pkg", "pkg.alone", "pkg.high", "pkg.high.part", "pkg.low"]

    imports = {m: sorted({t for t, _ in graph.imports_of(m, p, modules)}) for m, p in modules.items()}
    assert imports == {
        "pkg": [],
        "pkg.alone": ["pkg.low"],
        "pkg.high": ["pkg.high.part"],
        "pkg.high.part": ["pkg.low"],
        "pkg.low": ["pkg.high"],
    }
    edges = {"low": {"high"}, "high": {"low"}, "alone": {"low"}}
    assert graph.strongly_connected(["alone", "high", "low"], edges) == [["high", "low"]]


def test_import_graph_reads_the_floors_import_linter_holds() -> None:
    floors = _import_graph().read_floors(REPO / "pyproject.toml")
    assert floors["cli"] > floors["api"] > floors["launch"] == floors["report"] > floors["jobs"]
    assert floors["jobs"] > floors["training"] > floors["runtime"] > floors["config"] > floors["errors"] == 0


def test_every_test_module_has_its_own_name() -> None:
    """pytest imports test files by their base name (no packages under tests/): two of one name stop the
    whole suite at collection ('import file mismatch'), which `dev.sh unit` alone would not show."""
    from collections import Counter

    names = Counter(path.name for path in (REPO / "tests").rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
