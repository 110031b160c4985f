"""Evaluations for the report: ``flux-cluster evaluate``'s results/eval_<k>.json in a run directory, or
its --output file (default eval.json) elsewhere, each with its grid PNG beside it.

The contract (schema 1, kind 'flux-cluster-eval'): inference latency of the base and the fine-tuned
model ({"p50_s", "p90_s", "p99_s", "mean_s", "images_per_s", "peak_memory_gb", "samples"}), their CLIP
scores, their validation losses, the settings, whether the figures mean anything ("meaningful": false on
a tiny random-init pipeline) and the name of the sample grid. The files come from an untrusted folder:
each is read bounded (discover's reader), every value that is not what the contract says is one warning
naming the file and the key and is left out, and a grid is embedded only if it is a PNG under
MAX_GRID_BYTES beside the JSON, named as evaluate names it (<json stem>_grid.png).
"""

import base64
import json
import re
import reprlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_args

from flux_cluster.config.training import BasePrecision
from flux_cluster.evaluate import KIND, grid_name
from flux_cluster.outside import non_negative, whole_number
from flux_cluster.report.discover import _natural, _read_small, _reason

SCHEMA = 1
EVALUATIONS_ONLY = "evaluate"
"""The benchmark of a report group of evaluations alone (no runs): flux-cluster evaluate outside a run."""
EVAL_NAME = re.compile(r"eval_[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.json")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_GRID_BYTES = 8 << 20
"""A grid of a few 512 px images is well under a megabyte; a larger file is not put into the page."""
MAX_EVAL_FILES = 100
MAX_TEXT = 500
LATENCY_KEYS = ("p50_s", "p90_s", "p99_s", "mean_s", "images_per_s")
"""Always numbers; peak_memory_gb too where it was measured (null on a CPU, as evaluate writes it)."""
SETTING_KEYS = ("steps", "guidance", "resolution", "runs", "warmup", "prompts", "seed")
WEIGHTS_KINDS = ("lora", "transformer")
BASE_PRECISIONS = get_args(BasePrecision)


@dataclass
class Latency:
    """Seconds per image (percentiles over the timed generations), images/s and peak memory."""

    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    mean_s: float | None = None
    images_per_s: float | None = None
    peak_memory_gb: float | None = None
    samples: int | None = None


@dataclass
class EvalResult:
    """One eval_<k>.json as the report read it. Field names are the report's JSON schema: keep stable."""

    file: str
    created: str | None = None
    system: str | None = None
    device: str | None = None
    model: str | None = None
    target: str | None = None
    weights: str | None = None
    weights_kind: str | None = None
    meaningful: bool = False
    """False unless the file says true: a figure of unknown standing is not presented as a measurement."""
    meaningful_reason: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    base_precision: str | None = "bf16"
    """The base the 'base' columns measured: a LoRA run's quantized base (fp8, nf4), else (absent) bf16;
    None when the file names an unknown one."""
    base: Latency | None = None
    tuned: Latency | None = None
    clip_base: float | None = None
    clip_tuned: float | None = None
    clip_model: str | None = None
    val_loss_base: float | None = None
    val_loss_tuned: float | None = None
    grid: str | None = None
    """The grid PNG's path, when it passed the checks."""
    grid_data_uri: str | None = field(default=None, repr=False)
    """The grid as a data: URI for the HTML page (left out of JSON)."""

    @property
    def name(self) -> str:
        return Path(self.file).name

    @property
    def latency(self) -> Latency | None:
        """The fine-tuned model's latency where it was measured, else the base model's."""
        return self.tuned or self.base

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document.pop("grid_data_uri")
        return document


def eval_files(results: Path, warnings: list[str]) -> list[Path]:
    """The eval_<k>.json files of a run's results/ folder, in natural order, at most MAX_EVAL_FILES."""
    try:
        names = [n for n in (p.name for p in results.iterdir()) if EVAL_NAME.fullmatch(n)]
    except OSError:
        return []
    files = sorted((results / n for n in names if (results / n).is_file()), key=_natural)
    if len(files) > MAX_EVAL_FILES:
        warnings.append(f"{results}: {len(files)} eval_*.json files; the first {MAX_EVAL_FILES} read")
    return files[:MAX_EVAL_FILES]


def read_evals(results: Path, warnings: list[str]) -> list[EvalResult]:
    """Every readable evaluation in results/; each problem is one line on warnings."""
    out = []
    for path in eval_files(results, warnings):
        result = read_eval(path, warnings)
        if result is not None:
            out.append(result)
    return out


def read_eval(path: Path, warnings: list[str]) -> EvalResult | None:
    """One eval_<k>.json; None (with a warning) when it is no such file at all."""
    try:
        document = json.loads(_read_small(path))
    except (OSError, ValueError, RecursionError) as exc:
        warnings.append(f"{path}: not readable JSON ({_reason(exc)}); skipped")
        return None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        warnings.append(f"{path}: kind: expected {KIND!r} (a flux-cluster evaluate result); skipped")
        return None
    if document.get("schema") != SCHEMA:
        got = reprlib.repr(document.get("schema"))
        warnings.append(f"{path}: schema: got {got}, expected {SCHEMA}; skipped")
        return None
    reader = _Reader(path, warnings)
    result = EvalResult(file=str(path))
    for key in ("created", "system", "device", "model", "target", "weights", "meaningful_reason"):
        setattr(result, key, reader.text(document, key))
    kind = reader.text(document, "weights_kind")
    if kind is not None and kind not in WEIGHTS_KINDS:
        reader.bad("weights_kind", kind, f"one of {WEIGHTS_KINDS} or null")
        kind = None
    result.weights_kind = kind
    precision = document.get("base_precision", "bf16")  # evaluate writes it for a quantized base only
    result.base_precision = precision if precision in BASE_PRECISIONS else None
    if result.base_precision is None:
        reader.bad("base_precision", precision, f"one of {BASE_PRECISIONS} or absent (bf16)")
    meaningful = document.get("meaningful")
    if isinstance(meaningful, bool):
        result.meaningful = meaningful
    else:
        reader.bad("meaningful", meaningful, "true or false (taken as false)")
    settings = reader.section(document, "settings", required=True) or {}
    for key in SETTING_KEYS:
        if key in settings:
            value = settings[key]
            good = value if isinstance(value, str) and len(value) <= MAX_TEXT else non_negative(value)
            if good is None:
                reader.bad(f"settings.{key}", value, "a number >= 0 or a short text")
            else:
                result.settings[key] = int(good) if whole_number(good) is not None else good
    latency = reader.section(document, "latency", required=True) or {}
    result.base = reader.latency(latency, "latency.base", required=True)
    result.tuned = reader.latency(latency, "latency.tuned")
    clip = reader.section(document, "clip_score", required=True) or {}
    result.clip_base = reader.number(clip, "clip_score.base", required=True)
    result.clip_tuned = reader.number(clip, "clip_score.tuned")
    result.clip_model = reader.text(clip, "clip_model", "clip_score.clip_model")
    losses = reader.section(document, "val_loss") or {}
    result.val_loss_base = reader.number(losses, "val_loss.base")
    result.val_loss_tuned = reader.number(losses, "val_loss.tuned")
    _grid(result, path, document.get("grid"), reader)
    if not result.meaningful:
        why = f": {result.meaningful_reason}" if result.meaningful_reason else ""
        warnings.append(f"{path.name}: figures NOT MEANINGFUL{why}")
    return result


class _Reader:
    """Typed reads of one file's values; each bad value is one warning naming the file and the key."""

    def __init__(self, path: Path, warnings: list[str]) -> None:
        self.path, self.warnings = path, warnings

    def bad(self, key: str, value: Any, expected: str) -> None:
        self.warnings.append(f"{self.path}: {key}: got {reprlib.repr(value)}, expected {expected}")

    def text(self, document: dict[str, Any], key: str, label: str | None = None) -> str | None:
        value = document.get(key)
        if value is None or (isinstance(value, str) and len(value) <= MAX_TEXT):
            return value or None
        self.bad(label or key, value, f"a text of at most {MAX_TEXT} characters or null")
        return None

    def section(self, document: dict[str, Any], label: str, required: bool = False) -> dict[str, Any] | None:
        value = document.get(label.rsplit(".", 1)[-1])
        if isinstance(value, dict):
            return value
        if value is not None or required:
            self.bad(label, value, "an object" if required else "an object or null")
        return None

    def number(self, document: dict[str, Any], label: str, required: bool = False) -> float | None:
        key = label.rsplit(".", 1)[-1]
        value = document.get(key)
        if value is None and not required:
            return None
        good = non_negative(value)
        if good is None:
            self.bad(label, value, "a finite number >= 0")
        return good

    def latency(self, document: dict[str, Any], label: str, required: bool = False) -> Latency | None:
        section = self.section(document, label, required)
        if section is None:
            return None
        latency = Latency(**{k: self.number(section, f"{label}.{k}", True) for k in LATENCY_KEYS})
        latency.peak_memory_gb = self.number(section, f"{label}.peak_memory_gb")
        samples = section.get("samples")
        latency.samples = whole_number(samples, 1)
        if latency.samples is None:
            self.bad(f"{label}.samples", samples, "a whole number >= 1")
        return latency


def _grid(result: EvalResult, path: Path, name: Any, reader: _Reader) -> None:
    if name is None:
        return
    expected = grid_name(path.name)  # a name, never a path: the one evaluate gives it, beside the JSON
    if name != expected:
        reader.bad("grid", name, f"null or {expected} (the grid beside the JSON)")
        return
    grid = path.with_name(name)
    try:
        if not grid.is_file():  # not a FIFO or a folder: a read would block or fail
            raise FileNotFoundError
        with grid.open("rb") as handle:
            data = handle.read(MAX_GRID_BYTES + 1)
    except OSError:
        reader.warnings.append(f"{path}: grid: {name} is missing or unreadable; not shown")
        return
    if len(data) > MAX_GRID_BYTES:
        reader.warnings.append(f"{path}: grid: {name} is over {MAX_GRID_BYTES >> 20} MiB; not shown")
    elif not data.startswith(PNG_MAGIC) or data[12:16] != b"IHDR":
        reader.warnings.append(f"{path}: grid: {name} is not a PNG image; not shown")
    else:
        result.grid = str(grid)
        result.grid_data_uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
