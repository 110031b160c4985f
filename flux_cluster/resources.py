"""Locate the data the package ships: Jinja templates and the built-in system configs.

In a wheel they sit in ``flux_cluster/_data`` (hatch force-include); in a source checkout or an
editable install they are read from the repository's top-level ``slurm/templates`` and ``configs``.
"""

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_ROOT = _PACKAGE_DIR.parent


def _find(installed: str, in_repo: str) -> Path:
    for candidate in (_PACKAGE_DIR / "_data" / installed, _REPO_ROOT / in_repo):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"flux-cluster data folder {installed!r} is missing from the installation")


def templates_dir() -> Path:
    return _find("templates", "slurm/templates")


def systems_dir() -> Path:
    return _find("configs/systems", "configs/systems")


def benchmarks_dir() -> Path:
    return _find("configs/benchmarks", "configs/benchmarks")
