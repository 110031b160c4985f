"""The hf workload's runs in the report (issue 30, seed 002): their settings, rates, FLOPs, time per epoch
and the time and cost of their configured epochs, and the seed's comparisons (FP32 vs AMP, full vs LoRA,
DP vs DDP, one micro-batch size against another).

An hf run's folder is a fine-tuning run's (report.finetune reads what they share: images/s, step time,
losses, peak memory); its metrics_<i>.jsonl adds a header (``"workload": "hf"``, the model, task, parallel,
precision, mode, micro-batch size, parameters, FLOPs per step, the GPU's peak), step lines with
samples/s, tokens/s, TFLOP/s and MFU, and a summary's ``"hf"`` block with the run's rates, time per epoch
and the estimated total time of its configured epochs. Cost is the report's: that time on the system's
GPUs at its price per GPU-hour.

Two runs are compared when their settings differ in exactly one of COMPARED_KEYS and in nothing else
(model, task, sequence length, the GPUs held): each such pair side by side, B/A ratios, the baseline (fp32,
full fine-tuning, DataParallel, the smaller micro-batch) as A.

The file comes from an untrusted folder: read in bounded lines (mlperf_rules.bounded_lines); each figure
that is not what the contract says is one warning line naming the file and the key, never an exception
(report.finetune already warns of lines too long or not JSON).
"""

import contextlib
import json
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

from flux_cluster.config.hf import HfTask
from flux_cluster.config.training import HfParallel, HfPrecision
from flux_cluster.mlperf_rules import bounded_lines
from flux_cluster.outside import non_negative, whole_number
from flux_cluster.report.finetune import read_fine_tuning
from flux_cluster.report.harvest import HfRun, RunResult
from flux_cluster.report.scoring import GroupResult
from flux_cluster.rundir import RESULTS_DIR, metrics_file, repeat_of

MAX_NAME_CHARS = 200
_CHOICES: dict[str, tuple[str, ...]] = {
    "task": get_args(HfTask),
    "parallel": get_args(HfParallel),
    "precision": get_args(HfPrecision),
    "mode": ("finetune", "lora"),
}
_TEXTS = ("model", *_CHOICES)
_COUNTS = ("micro_batch_size", "seq_len", "params", "trainable_params")
_NUMBERS = (
    "flops_per_step", "peak_tflops", "samples_per_s", "tokens_per_s", "tflops_per_s", "mfu", "epoch_seconds",
    "estimated_total_seconds", "epochs",
)  # fmt: skip
_KEYS = frozenset((*_TEXTS, *_COUNTS, *_NUMBERS))
_RATES = ("samples_per_s", "tokens_per_s", "tflops_per_s", "mfu")
"""What a run without a summary takes from its last step line."""

COMPARED_KEYS = {
    "train.parallel": "parallel",
    "train.precision": "precision",
    "train.mode": "mode",
    "train.micro_batch_size": "micro_batch_size",
}
"""The sweep keys seed 002 compares (config key -> HfRun field)."""
BASELINE_ORDER: dict[str, tuple[str, ...]] = {
    "parallel": ("dp", "ddp", "fsdp"),
    "precision": ("fp32", "amp-bf16", "amp-fp16"),
    "mode": ("finetune", "lora"),
}
"""A pair's A side comes first here (micro-batch sizes: the smaller)."""
_SHOWN = {"dp": "DP", "ddp": "DDP", "fsdp": "FSDP", "fp32": "FP32", "amp-bf16": "AMP-BF16",
          "amp-fp16": "AMP-FP16", "finetune": "full", "lora": "LoRA"}  # fmt: skip


def is_hf(run: RunResult) -> bool:
    return run.fine_tuning is not None and run.fine_tuning.hf is not None


# Reading -----------------------------------------------------------------------------------------------


def read_hf(log: Path, run: RunResult) -> HfRun:
    """The hf figures of the run whose log is results/result_<i>.txt; warnings go on run."""
    path = metrics_file(log.parent.parent, repeat_of(log))
    header: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    last_step: dict[str, Any] = {}
    if path.is_file():  # report.finetune said it when it is not, or unreadable
        with contextlib.suppress(OSError):
            header, summary, last_step = _scan(path)
    block = summary.get("hf")
    if "hf" in summary and not isinstance(block, dict):
        run.warnings.append(f"{path}: summary.hf: got {reprlib.repr(block)}, expected an object")
    block = block if isinstance(block, dict) else {}
    result = HfRun()
    for where, record in (("summary.hf", block), ("header", header)):  # the summary wins
        _take(record, result, run, f"{path}: {where}")
    if not block:  # an interrupted run: its last step line's rates
        _take({k: last_step[k] for k in _RATES if k in last_step}, result, run, f"{path}: last step line")
    return result


def _scan(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    header: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    last_step: dict[str, Any] = {}
    for line in bounded_lines(path):
        if isinstance(line, int):
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("summary"), dict):
            summary = record["summary"]
        elif "step" in record:
            if "eval_loss" not in record:
                last_step = record
        elif "world_size" in record and not header:
            header = record
    return header, summary, last_step


def _take(record: dict[str, Any], result: HfRun, run: RunResult, where: str) -> None:
    """Each figure of record that is what the contract says and not yet set; a warning per other one
    (null is no warning: the contract allows it for figures a CPU cannot give)."""
    for key, value in record.items():
        if value is None or key not in _KEYS or getattr(result, key) is not None:
            continue
        if key in _CHOICES:
            good = value if value in _CHOICES[key] else None
            expected = "one of " + ", ".join(_CHOICES[key])
        elif key in _TEXTS:
            good = value if isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS else None
            expected = f"a text of up to {MAX_NAME_CHARS} characters"
        elif key in _COUNTS:
            good, expected = whole_number(value), "a whole number >= 0"
        else:
            good, expected = non_negative(value), "a finite number >= 0"
        if good is None:
            run.warnings.append(f"{where}.{key}: got {reprlib.repr(value)}, expected {expected}")
        else:
            setattr(result, key, good)


def hf_figures(group: GroupResult) -> None:
    """The estimated GPU-hours and cost of each hf run's configured epochs on the group's GPUs."""
    for run in group.runs:
        hf = run.fine_tuning.hf if run.fine_tuning else None
        if hf is None or hf.estimated_total_seconds is None or not group.accelerators:
            continue
        hf.estimated_gpu_hours = hf.estimated_total_seconds * group.accelerators / 3600
        if group.price_per_gpu_hour is not None:
            hf.estimated_cost_usd = hf.estimated_gpu_hours * group.price_per_gpu_hour


# Rows and comparisons ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HfRow:
    """One hf run as the report's tables show it."""

    name: str
    """The run directory's name (and result_<i> where it has several)."""
    group: GroupResult
    run: RunResult

    @property
    def hf(self) -> HfRun:
        assert self.run.fine_tuning is not None and self.run.fine_tuning.hf is not None
        return self.run.fine_tuning.hf

    def settings(self) -> dict[str, Any]:
        """What must be equal, but for one compared key, for two runs to be compared: not the world size,
        which DataParallel's one process per node makes differ from DDP's on the same GPUs."""
        hf = self.hf
        return {
            "model": hf.model,
            "task": hf.task,
            "seq_len": hf.seq_len,
            "gpus": self.group.accelerators,
            **{field: getattr(hf, field) for field in COMPARED_KEYS.values()},
        }


def hf_rows(groups: list[GroupResult]) -> list[HfRow]:
    rows = []
    for group in groups:
        runs = [run for run in group.runs if is_hf(run)]
        path = Path(group.path)
        folder = path.parent.name if path.name == RESULTS_DIR else path.name
        for run in runs:
            name = folder if len(runs) == 1 else f"{folder}/{Path(run.file).stem}"
            rows.append(HfRow(name, group, run))
    return rows


T = TypeVar("T")


def one_change_pairs(
    items: Sequence[T], settings: Callable[[T], dict[str, Any]], keys: dict[str, str]
) -> list[tuple[str, T, T]]:
    """(config key, A, B) for every two items whose settings differ in exactly one of keys (config key ->
    settings name) and in nothing else; A is the baseline (BASELINE_ORDER; the smaller number)."""
    buckets: dict[str, list[tuple[T, dict[str, Any]]]] = {}
    for item in items:  # only items equal in every other setting can pair: pairs within a bucket alone
        values = settings(item)
        rest = {name: value for name, value in values.items() if name not in keys.values()}
        buckets.setdefault(repr(sorted(rest.items(), key=lambda kv: kv[0])), []).append((item, values))
    found = []
    for bucket in buckets.values():
        for i, (a, x) in enumerate(bucket):
            for b, y in bucket[i + 1 :]:
                differ = [name for name in keys.values() if x.get(name) != y.get(name)]
                if len(differ) != 1:
                    continue
                name = differ[0]
                key = next(k for k, v in keys.items() if v == name)
                first, second = (a, b) if _rank(key, x[name]) <= _rank(key, y[name]) else (b, a)
                found.append((key, first, second))
    return found


def _rank(key: str, value: Any) -> tuple[int, float, str]:
    order = BASELINE_ORDER.get(COMPARED_KEYS.get(key, key), ())
    if value in order:
        return (order.index(value), 0.0, "")
    try:
        return (len(order), float(value), "")
    except (TypeError, ValueError):
        return (len(order) + 1, 0.0, str(value))


def shown(key: str, value: Any) -> str:
    """A compared key's value as the seed names it (FP32, AMP-BF16, full, LoRA, DP, DDP; mbs 16)."""
    if COMPARED_KEYS.get(key) == "micro_batch_size":
        return f"mbs {value}"
    return _SHOWN.get(value, str(value)) if isinstance(value, str) else str(value)


COMPARED_FIGURES: list[tuple[str, Callable[[HfRow], Any]]] = [
    ("samples/s", lambda r: r.hf.samples_per_s or r.run.throughput_samples_per_s),
    ("tokens/s", lambda r: r.hf.tokens_per_s),
    ("step ms", lambda r: r.run.fine_tuning.step_time_ms if r.run.fine_tuning else None),
    ("TFLOP/s/GPU", lambda r: r.hf.tflops_per_s),
    ("MFU", lambda r: r.hf.mfu),
    ("peak memory GB", lambda r: r.run.fine_tuning.peak_memory_gb if r.run.fine_tuning else None),
    ("trainable params", lambda r: r.hf.trainable_params),
    ("epoch seconds", lambda r: r.hf.epoch_seconds),
    ("estimated total seconds", lambda r: r.hf.estimated_total_seconds),
    ("estimated GPU-hours", lambda r: r.hf.estimated_gpu_hours),
    ("estimated cost USD", lambda r: r.hf.estimated_cost_usd),
]


def compared_metrics(a: T, b: T, figures: Sequence[tuple[str, Callable[[T], Any]]]) -> list[dict[str, Any]]:
    """Each figure of A and B and B/A (None where either is unknown or A is 0), as report.compare's."""
    metrics = []
    for name, value in figures:
        x, y = value(a), value(b)
        ratio = y / x if isinstance(x, int | float) and isinstance(y, int | float) and x else None
        metrics.append({"name": name, "a": x, "b": y, "ratio": ratio})
    return metrics


def comparisons(rows: list[HfRow]) -> list[dict[str, Any]]:
    """Seed 002's comparison tables: every two hf runs that differ in one compared setting alone, in the
    shape of report.compare's pairs (a_name, b_name, a_path, b_path, metrics) plus the key, its two
    values and a title such as 'FP32 vs AMP-BF16'."""
    pairs = []
    for key, a, b in one_change_pairs(rows, HfRow.settings, COMPARED_KEYS):
        field = COMPARED_KEYS[key]
        x, y = getattr(a.hf, field), getattr(b.hf, field)
        pairs.append(
            {
                "key": key,
                "title": f"{shown(key, x)} vs {shown(key, y)}",
                "a_value": x,
                "b_value": y,
                "a_name": f"{shown(key, x)}: {a.name}",
                "b_name": f"{shown(key, y)}: {b.name}",
                "a_path": a.run.file,
                "b_path": b.run.file,
                "metrics": compared_metrics(a, b, COMPARED_FIGURES),
            }
        )
    return pairs


def hf_document(groups: list[GroupResult]) -> dict[str, Any] | None:
    """The JSON report's "hf" section: the comparisons (each run's figures are in its group's runs, under
    fine_tuning.hf); None without hf runs."""
    rows = hf_rows(groups)
    if not rows:
        return None
    return {"runs": [{"name": r.name, "file": r.run.file} for r in rows], "comparisons": comparisons(rows)}


# Tables ------------------------------------------------------------------------------------------------


def flops_text(value: float | None) -> str | None:
    """A FLOP count with its SI prefix (1.23 GFLOP): tiny models and 7B ones read alike."""
    if value is None:
        return None
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}FLOP"
    return f"{value:.3g} FLOP"


def duration_text(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:,.2f} h"


def _tuned(name: str) -> Callable[["HfRow"], Any]:
    return lambda row: getattr(row.run.fine_tuning, name) if row.run.fine_tuning else None


HF_TITLE = "Hugging Face fine-tuning (hf), side by side"
HF_NOTE = (
    "Each hf run (train.benchmark hf): samples/s (images/s for images) and tokens/s of the whole run over "
    "its measured steps, step time, model FLOPs per optimizer step (torch's FlopCounterMode, once), "
    "TFLOP/s per GPU and MFU against its dense peak for the precision (none on CPU), peak memory, time per "
    "epoch, and the estimated total time of the configured epochs at the measured rate; est. GPU-h and "
    "est. USD: that time on the system's GPUs at its price per GPU-hour"
)
HF_COMPARISON_TITLE = "Comparisons: one setting changed"
HF_COMPARISON_NOTE = (
    "Every two hf runs whose settings differ in exactly one of train.parallel, train.precision, train.mode "
    "and train.micro_batch_size (model, task, sequence length and GPUs equal), side by side: A the baseline "
    "(DP, FP32, full fine-tuning, the smaller micro-batch), B/A the ratio"
)
HF_COLUMN_SPECS: list[tuple[Any, ...]] = [  # header, value, format, in the terminal, may wrap
    ("run", lambda r: r.name),
    ("model", lambda r: r.hf.model, "{}", True, True),
    ("task", lambda r: r.hf.task, "{}", False),
    ("parallel", lambda r: r.hf.parallel),
    ("precision", lambda r: r.hf.precision),
    ("mode", lambda r: r.hf.mode),
    ("GPUs", lambda r: r.group.accelerators),
    ("world size", _tuned("world_size"), "{}", False),
    ("mbs", lambda r: r.hf.micro_batch_size),
    ("seq len", lambda r: r.hf.seq_len, "{}", False),
    ("trainable params", lambda r: r.hf.trainable_params, "{:,}", False),
    ("samples/s", lambda r: r.hf.samples_per_s or r.run.throughput_samples_per_s, "{:,.1f}"),
    ("tokens/s", lambda r: r.hf.tokens_per_s, "{:,.0f}"),
    ("step ms", _tuned("step_time_ms"), "{:,.1f}"),
    ("FLOPs/step", lambda r: flops_text(r.hf.flops_per_step)),
    ("TFLOP/s/GPU", lambda r: r.hf.tflops_per_s, "{:.3g}"),
    ("MFU", lambda r: r.hf.mfu, "{:.1%}"),
    ("peak GB", _tuned("peak_memory_gb"), "{:,.2f}"),
    ("epoch", lambda r: duration_text(r.hf.epoch_seconds)),
    ("est. total", lambda r: duration_text(r.hf.estimated_total_seconds)),
    ("epochs", lambda r: r.hf.epochs, "{:g}", False),
    ("est. GPU-h", lambda r: r.hf.estimated_gpu_hours, "{:.3g}"),
    ("est. USD", lambda r: r.hf.estimated_cost_usd, "{:,.2f}"),
    ("USD this run", lambda r: r.group.cost_usd if r.group.run_count == 1 else None, "{:,.2f}", False),
]  # fmt: skip


HF_MEASURED = frozenset(
    ("samples/s", "step ms", "TFLOP/s/GPU", "epoch", "est. total", "est. GPU-h", "est. USD")
)
"""The hf table's figures a run without a timed step has none of: 'not measured' (its summary's note)."""


HF_CSV_FIELDS = [
    f"hf_{name}" for name in (*_TEXTS, *_COUNTS, *_NUMBERS, "estimated_gpu_hours", "estimated_cost_usd")
]
"""The CSV's hf columns (a group's: its runs' settings where they agree, the mean of their figures)."""


def hf_group_values(group: GroupResult) -> dict[str, Any]:
    """The group's hf_* CSV cells: each setting its hf runs agree on, the mean of each figure."""
    runs = [run.fine_tuning.hf for run in group.runs if run.fine_tuning and run.fine_tuning.hf]
    cells: dict[str, Any] = {}
    for field in HF_CSV_FIELDS:
        values = [v for v in (getattr(hf, field[3:]) for hf in runs) if v is not None]
        if field[3:] in _TEXTS or field[3:] in _COUNTS:
            cells[field] = values[0] if values and len(set(values)) == 1 else None
        else:
            cells[field] = sum(values) / len(values) if values else None
    return cells


def sweep_point_figures(log: Path, run: RunResult) -> dict[str, float]:
    """An hf run's figures under a sweep's names (runs_summary.csv): its metrics summary's samples/s (the
    measured steps alone), step time, TFLOP/s, MFU and peak memory; those it lacks are left out."""
    tuned, hf = read_fine_tuning(log, run), read_hf(log, run)
    figures = {
        "samples_per_s": tuned.images_per_s,
        "step_time_ms_p50": tuned.step_time_ms,
        "tflops_per_gpu": hf.tflops_per_s,
        "mfu": hf.mfu,
        "peak_memory_gb": tuned.peak_memory_gb,
    }
    return {name: value for name, value in figures.items() if value is not None}
