"""Find result logs and what is known about the system that made them.

A group is the set of result files in one directory (one system x one benchmark). Where a directory
holds ``result_*.txt`` files, only those are its runs (as for the official tools); elsewhere any
file holding ``:::MLLOG`` lines is one. Two layouts add facts to a group:

- a flux-cluster run directory (``config.yaml`` + ``results/``): its ``results/result_*.txt`` (never
  ``results/interrupted/``), accelerators, price, peak TFLOP/s and ruleset from the config, and the
  model FLOPs per sample from the first line of ``metrics_<i>.jsonl``;
- an MLPerf submission tree ``<org>/results/<system>/<benchmark>/result_N.txt`` with
  ``<org>/systems/<system>.json``: accelerator count and model, system name, submitter.
"""

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flux_cluster.mlperf_rules import RULESETS
from flux_cluster.report.harvest import TOKEN

RESULT_NAME = re.compile(r"result_.*\.txt$")
_SKIP_DIRS = {"checkpoints", "tensorboard", "interrupted", "__pycache__", "node_modules", "state"}
_LOG_SUFFIXES = {".txt", ".log", ".out", ".err", ""}
_SNIFF_BYTES = 8 << 20
DEFAULT_RULESET = "5.1.0"
"""For logs with no run config and no 'vX.Y' in their path: the first round with flux1."""


@dataclass
class GroupSource:
    """One directory's result files and what is known about the system behind them."""

    path: Path
    files: list[Path]
    system: str | None = None
    submitter: str | None = None
    accelerator_model: str | None = None
    accelerators: int | None = None
    price_per_gpu_hour: float | None = None
    peak_tflops: float | None = None
    ruleset: str | None = None
    scaling_factor: float = 1.0
    run_dir: bool = False
    """A flux-cluster run directory (its model need not be the benchmark's flux-schnell)."""
    flops_per_sample: dict[Path, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def find_groups(roots: list[Path]) -> list[GroupSource]:
    """Every group under the given files or directories, each once, in path order."""
    by_dir: dict[Path, GroupSource] = {}
    for root in roots:
        root = root.absolute()
        if root.is_file():
            _add(by_dir, root.parent, [root])
            continue
        for directory, files in _walk(root):
            _add(by_dir, directory, files)
    groups = sorted(by_dir.values(), key=lambda g: str(g.path))
    for group in groups:
        group.files.sort(key=_natural)
        _describe(group)
    return groups


def _add(by_dir: dict[Path, GroupSource], directory: Path, files: list[Path]) -> None:
    group = by_dir.setdefault(directory, GroupSource(path=directory, files=[]))
    group.files.extend(f for f in files if f not in group.files)


def _walk(root: Path) -> list[tuple[Path, list[Path]]]:
    found = []
    seen: set[str] = set()
    for directory, dirs, names in os.walk(root, followlinks=True):
        here = Path(directory)
        real = os.path.realpath(here)
        if real in seen:  # a symlink loop, or a tree linked twice
            dirs[:] = []
            continue
        seen.add(real)
        if (here / "config.yaml").is_file() and (here / "results").is_dir():
            dirs[:] = []  # a run directory: only its results/result_*.txt
            results = here / "results"
            logs = [results / n for n in os.listdir(results) if RESULT_NAME.match(n)]
            if logs:
                found.append((results, [p for p in logs if p.is_file()]))
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        named = [here / n for n in sorted(names) if RESULT_NAME.match(n) and (here / n).is_file()]
        logs = named or [here / n for n in sorted(names) if _is_result_log(here / n)]
        if logs:
            found.append((here, logs))
    return found


def _is_result_log(path: Path) -> bool:
    if path.suffix not in _LOG_SUFFIXES or path.name.startswith(".") or not path.is_file():
        return False  # not is_file: FIFOs and devices would block the read
    try:
        with path.open("rb") as handle:
            return TOKEN in handle.read(_SNIFF_BYTES)
    except OSError:
        return False


def _natural(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _describe(group: GroupSource) -> None:
    run_dir = group.path.parent
    if group.path.name == "results" and (run_dir / "config.yaml").is_file():
        _from_run_config(group, run_dir)
    else:
        _from_submission_tree(group)
    scaling = group.path / "scaling.json"
    if scaling.is_file():
        document = _read_json(scaling, group)
        factor = document.get("scaling_factor") if isinstance(document, dict) else None
        if isinstance(factor, int | float) and not isinstance(factor, bool) and math.isfinite(factor):
            group.scaling_factor = float(factor)  # applied as the summarizer does, whatever its value
        elif document is not None:
            group.warnings.append(f"{scaling}: no numeric scaling_factor; ignored")
    if group.ruleset is None:
        match = re.search(r"v(\d+)\.(\d+)", str(group.path))
        candidate = f"{match.group(1)}.{match.group(2)}.0" if match else None
        group.ruleset = candidate if candidate in RULESETS else None


def _from_run_config(group: GroupSource, run_dir: Path) -> None:
    group.run_dir = True
    try:
        document = yaml.safe_load((run_dir / "config.yaml").read_text())
        system = document["system"]
        group.system = str(system["name"])
        group.accelerators = _positive(system["nodes"], int) * _positive(system["gpus_per_node"], int)
        group.accelerator_model = str(system.get("gpu_model") or "") or None
        group.price_per_gpu_hour = _positive(system.get("price_per_gpu_hour"), float, strict=False)
        group.peak_tflops = _positive(system.get("peak_bf16_tflops"), float, strict=False)
        mlperf = system.get("mlperf") or {}
        ruleset = str(mlperf.get("ruleset") or "") or None
        if ruleset is not None and ruleset not in RULESETS:
            group.warnings.append(
                f"{run_dir / 'config.yaml'}: mlperf.ruleset {ruleset!r} is not one of {RULESETS}"
            )
            ruleset = None
        group.ruleset = ruleset
        group.submitter = str(mlperf.get("submission_org") or "") or None
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        group.warnings.append(f"{run_dir / 'config.yaml'}: unreadable run config ({type(exc).__name__})")
        return
    for log in group.files:
        index = log.stem.removeprefix("result_")
        flops = _first_record(group.path / f"metrics_{index}.jsonl").get("flops_per_sample")
        if _positive(flops, float, strict=False):
            group.flops_per_sample[log] = float(flops)


def _from_submission_tree(group: GroupSource) -> None:
    # <org>/results/<system>/<benchmark>/ -> <org>/systems/<system>.json
    parts = group.path.parts
    if len(parts) < 4 or parts[-3] != "results":
        return
    description = Path(*parts[:-3]) / "systems" / f"{parts[-2]}.json"
    group.system = parts[-2]
    if not description.is_file():
        return
    document = _read_json(description, group)
    if not isinstance(document, dict):
        return
    group.submitter = _str_or_none(document.get("submitter"))
    group.accelerator_model = _str_or_none(document.get("accelerator_model_name"))
    try:
        nodes, per_node = (
            _positive(float(document[k]), int) for k in ("number_of_nodes", "accelerators_per_node")
        )
        group.accelerators = nodes * per_node
    except (KeyError, TypeError, ValueError, OverflowError):
        group.warnings.append(f"{description}: no number_of_nodes x accelerators_per_node")


def _read_json(path: Path, group: GroupSource) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        group.warnings.append(f"{path}: not readable JSON ({type(exc).__name__})")
        return None


def _first_record(path: Path) -> dict[str, Any]:
    try:
        with path.open() as handle:
            record = json.loads(handle.readline())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _positive(value: Any, kind: type, strict: bool = True) -> Any:
    """value as kind if it is a finite number > 0; else ValueError, or None when not strict."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return kind(value)
    if strict:
        raise ValueError(f"not a positive number: {value!r}")
    return None


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
