"""Find result logs and what is known about the system that made them.

A group is the set of result files in one directory (one system x one benchmark). Where a directory
holds ``result_*.txt`` files, only those are its runs (as for the official tools); elsewhere any
file holding ``:::MLLOG`` lines is one. Two layouts add facts to a group:

- a flux-cluster run directory (``config.yaml`` + ``results/``): its ``results/result_*.txt`` (never
  ``results/interrupted/``), accelerators, price, peak TFLOP/s and ruleset from the config, and the
  model FLOPs per sample from the first line of ``metrics_<i>.jsonl``;
- an MLPerf submission tree ``<org>/results/<system>/<benchmark>/result_N.txt`` with
  ``<org>/systems/<system>.json``: accelerator count and model, system name, submitter.

``flux-cluster evaluate`` results outside a run's results/ (its ``--output``, default ``eval.json``, for
a LoRA file or a pipeline alone; or the eval_<k>.json of a run directory without result logs) are found
too, by their kind, and returned apart (find_inputs): the report groups them by the system they record.
"""

import json
import os
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from flux_cluster.config.hf import HF_BENCHMARK
from flux_cluster.config.loader import ConfigLoader
from flux_cluster.config.training import TrainMode
from flux_cluster.evaluate import KIND as EVAL_KIND
from flux_cluster.mlperf_rules import RULESETS, TOKEN
from flux_cluster.outside import finite_number
from flux_cluster.report.harvest import per_system
from flux_cluster.rundir import (
    CHECKPOINTS_DIR,
    INTERRUPTED_DIR,
    RESULT_PREFIX,
    RESULTS_DIR,
    STATE_DIR,
    TENSORBOARD_DIR,
    config_file,
    metrics_file,
    repeat_of,
    results_dir,
)

RESULT_NAME = re.compile(re.escape(RESULT_PREFIX) + r".*\.txt")
_SKIP_DIRS = {CHECKPOINTS_DIR, TENSORBOARD_DIR, INTERRUPTED_DIR, "__pycache__", "node_modules", STATE_DIR}
_LOG_SUFFIXES = {".txt", ".log", ".out", ".err", ""}
_SNIFF_BYTES = 8 << 20
MAX_SIDE_FILE_BYTES = 1 << 20
"""config.yaml, systems/*.json, scaling.json and a metrics line are a few KB; larger ones are not read."""
EVAL_SNIFF_BYTES = 64 << 10
"""An evaluate result names its kind in its first lines."""
DEFAULT_RULESET = "5.1.0"
"""For logs nothing else names a ruleset for (see report.build): the first round with flux1, with a
warning asking for --ruleset."""


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
    """The run config's mlperf.ruleset (a flux-cluster run directory's); see path_ruleset."""
    path_ruleset: str | None = None
    """From a 'vX.Y' in the path (v5.1 -> 5.1.0), when it names a known ruleset."""
    ruleset_from: str | None = None
    """Where the ruleset used came from (report.build.choose_ruleset): '--ruleset', 'run config',
    'logs', 'path' or 'assumed'."""
    system_name: str | None = None
    """A submission's systems/<system>.json system_name: the official summarizer's name for the row."""
    scaling_factor: float = 1.0
    run_dir: bool = False
    """A flux-cluster run directory (its model need not be the benchmark's flux-schnell)."""
    train_mode: str | None = None
    """A run directory's train.mode: 'pretrain' (the benchmark), or 'finetune'/'lora' (no MLPerf result)."""
    workload: str | None = None
    """'hf' for a run directory of the hf workload (train.benchmark hf; report.hf reads its metrics)."""
    flops_per_sample: dict[Path, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def find_inputs(roots: list[Path]) -> tuple[list[GroupSource], list[Path]]:
    """Every group under the given files or directories, each once, in path order; and the evaluate
    results found outside a run's results/ (each once, in path order)."""
    by_dir: dict[Path, GroupSource] = {}
    evals: dict[str, Path] = {}
    for root in roots:
        root = root.absolute()
        if root.is_file():
            if is_eval_result(root):
                evals.setdefault(os.path.realpath(root), root)
            else:
                _add(by_dir, root.parent, [root])
            continue
        for directory, files in _walk(root, evals):
            _add(by_dir, directory, files)
    groups = sorted(by_dir.values(), key=lambda g: str(g.path))
    for group in groups:
        group.files.sort(key=_natural)
        _describe(group)
    return groups, sorted(evals.values(), key=lambda p: (str(p.parent), _natural(p)))


def _add(by_dir: dict[Path, GroupSource], directory: Path, files: list[Path]) -> None:
    group = by_dir.setdefault(directory, GroupSource(path=directory, files=[]))
    group.files.extend(f for f in files if f not in group.files)


def _walk(root: Path, evals: dict[str, Path]) -> list[tuple[Path, list[Path]]]:
    """(directory, result logs) under root; the evaluate results outside a run's scored results/ are
    added to evals (by real path)."""
    found = []
    seen: set[str] = set()
    for directory, dirs, names in os.walk(root, followlinks=True):
        here = Path(directory)
        real = os.path.realpath(here)
        if real in seen:  # a symlink loop, or a tree linked twice
            dirs[:] = []
            continue
        seen.add(real)
        if config_file(here).is_file() and results_dir(here).is_dir():
            dirs[:] = []  # a run directory: only its results/result_*.txt
            results = results_dir(here)
            listed = sorted(os.listdir(results))
            logs = [results / n for n in listed if RESULT_NAME.fullmatch(n)]
            if logs:
                found.append((results, [p for p in logs if p.is_file()]))
            else:  # no result logs (e.g. deleted): its evaluations on their own
                _add_evals(evals, [results / n for n in listed])
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        named = [here / n for n in sorted(names) if RESULT_NAME.fullmatch(n) and (here / n).is_file()]
        logs = named or [here / n for n in sorted(names) if _is_result_log(here / n)]
        if logs:
            found.append((here, logs))
        if not (logs and here.name == RESULTS_DIR and config_file(here.parent).is_file()):
            _add_evals(evals, [here / n for n in sorted(names)])  # (else a run's: read with its group)
    return found


def _add_evals(evals: dict[str, Path], paths: list[Path]) -> None:
    for path in paths:
        if is_eval_result(path):
            evals.setdefault(os.path.realpath(path), path)


def is_eval_result(path: Path) -> bool:
    """A flux-cluster evaluate result: a .json file that says so near its start (read bounded; never a
    FIFO's). Whether the rest is what the contract says is the reader's business (report.evaluation)."""
    if path.suffix != ".json" or path.name.startswith(".") or not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return f'"{EVAL_KIND}"'.encode() in handle.read(EVAL_SNIFF_BYTES)
    except OSError:
        return False


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
    if group.path.name == RESULTS_DIR and config_file(run_dir).is_file():
        _from_run_config(group, run_dir)
    else:
        _from_submission_tree(group)
    scaling = group.path / "scaling.json"
    if scaling.is_file():
        document = _read_json(scaling, group)
        factor = document.get("scaling_factor") if isinstance(document, dict) else None
        if finite_number(factor):
            group.scaling_factor = float(factor)  # applied as the summarizer does, whatever its value
        elif document is not None:
            group.warnings.append(f"{scaling}: no numeric scaling_factor; ignored")
    match = re.search(r"v(\d+)\.(\d+)", str(group.path))
    candidate = f"{match.group(1)}.{match.group(2)}.0" if match else None
    group.path_ruleset = candidate if candidate in RULESETS else None


def _from_run_config(group: GroupSource, run_dir: Path) -> None:
    group.run_dir = True
    path = config_file(run_dir)
    try:
        # the config loader bounds what aliases expand to (a few bytes of them can make gigabytes)
        document = yaml.load(_read_small(path), Loader=ConfigLoader)
    except (OSError, ValueError, yaml.YAMLError, RecursionError) as exc:
        group.warnings.append(f"{path}: unreadable run config ({_reason(exc)})")
        return
    system = document.get("system") if isinstance(document, dict) else None
    if not isinstance(system, dict) or not isinstance(system.get("name"), str):
        group.warnings.append(f"{path}: system.name: missing, expected a flux-cluster run config")
        return
    group.system = system["name"]
    counts = [per_system(f"system.{k}", system.get(k)) for k in ("nodes", "gpus_per_node")]
    group.warnings += [f"{path}: {problem}" for _, problem in counts if problem]
    if counts[0][0] and counts[1][0]:
        group.accelerators = counts[0][0] * counts[1][0]
    group.accelerator_model = _str_or_none(system.get("gpu_model"))
    group.price_per_gpu_hour = _positive(system.get("price_per_gpu_hour"))
    group.peak_tflops = _positive(system.get("peak_bf16_tflops"))
    mlperf = system.get("mlperf") if isinstance(system.get("mlperf"), dict) else {}
    ruleset = mlperf.get("ruleset") or None
    if ruleset is not None and ruleset not in RULESETS:
        group.warnings.append(f"{path}: mlperf.ruleset {reprlib.repr(ruleset)} is not one of {RULESETS}")
        ruleset = None
    group.ruleset = ruleset
    group.submitter = _str_or_none(mlperf.get("submission_org"))
    train = system.get("train") if isinstance(system.get("train"), dict) else {}
    mode = train.get("mode")
    group.train_mode = mode if mode in get_args(TrainMode) else None
    if train.get("benchmark") == HF_BENCHMARK:  # fine-tuning whatever its mode says: hf never pretrains
        group.workload = HF_BENCHMARK
        group.train_mode = mode if mode in ("finetune", "lora") else "finetune"
    for log in group.files:
        flops = _first_record(metrics_file(run_dir, repeat_of(log))).get("flops_per_sample")
        if _positive(flops):
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
    group.system_name = _str_or_none(document.get("system_name"))
    group.accelerator_model = _str_or_none(document.get("accelerator_model_name"))
    counts = [per_system(k, document.get(k)) for k in ("number_of_nodes", "accelerators_per_node")]
    group.warnings += [f"{description}: {problem}" for _, problem in counts if problem]
    if counts[0][0] and counts[1][0]:
        group.accelerators = counts[0][0] * counts[1][0]


class _TooLarge(ValueError):
    pass


def _read_small(path: Path, line: bool = False) -> str:
    """A side file's text (or its first line), refused past MAX_SIDE_FILE_BYTES; never a FIFO's."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a file")
    with path.open("rb") as handle:
        data = handle.readline(MAX_SIDE_FILE_BYTES + 1) if line else handle.read(MAX_SIDE_FILE_BYTES + 1)
    if len(data) > MAX_SIDE_FILE_BYTES:
        raise _TooLarge(f"over {MAX_SIDE_FILE_BYTES >> 20} MiB")
    return data.decode("utf-8", errors="replace")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _TooLarge):
        return str(exc)
    problem = getattr(exc, "problem", None)  # a YAML error's own words, without the file's text
    return f"{type(exc).__name__}: {problem}" if isinstance(problem, str) else type(exc).__name__


def _read_json(path: Path, group: GroupSource) -> Any:
    try:
        return json.loads(_read_small(path))
    except (OSError, ValueError, RecursionError) as exc:
        group.warnings.append(f"{path}: not readable JSON ({_reason(exc)})")
        return None


def _first_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(_read_small(path, line=True))
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _positive(value: Any) -> float | None:
    """value as a float if it is a finite number > 0, else None."""
    return float(value) if finite_number(value) and value > 0 else None


def _str_or_none(value: Any) -> str | None:
    """A text field: a string, or a number written as one; anything else (a list, say) is not one."""
    if isinstance(value, str):
        return value or None
    return str(value) if finite_number(value) else None
