"""One MLPerf result log, streamed once, into the facts of one run.

The file is read line by line as bytes, so memory stays bounded on multi-GB logs. Only the events the
report needs are JSON-decoded; the rest (``tracked_stats`` and the like) are skipped after finding their
key. Robust to what real logs contain: ``srun --label`` prefixes, garbage and non-UTF-8 lines, duplicate
keys and the interleaved lines of several ranks. Every oddity becomes a warning on the run, never an
exception.

The run time follows MLPerf's ``result_summarizer`` to the letter: the last ``run_start`` seen before
the first ``run_stop``, and (run_stop - run_start) ms / 60,000.
"""

import contextlib
import dataclasses
import json
import math
import reprlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from flux_cluster.mlperf_rules import (
    EVAL_INTERVAL_SAMPLES,
    MAX_LINE_BYTES,
    QUALITY_TARGET,
    TOKEN,
    bounded_lines,
)
from flux_cluster.outside import MAX_COUNT, finite_number, non_negative, whole_number

KEY_MARK = b'"key": "'
MAX_PER_SYSTEM = 1_000_000
"""Upper bound for number_of_nodes and accelerators_per_node (far above any machine)."""

_POINT_KEYS = frozenset(
    {
        "submission_benchmark",
        "submission_org",
        "submission_platform",
        "submission_division",
        "global_batch_size",
        "opt_base_learning_rate",
        "opt_learning_rate_warmup_steps",
        "target_accuracy",
        "seed",
        "number_of_nodes",
        "accelerators_per_node",
        "evaluation_frequency",
        "tensor_parallelism",
    }
)
RULESET_610_KEYS = frozenset(
    {
        "lowest_numerical_precision_in_linear",
        "lowest_numerical_precision_in_attn",
        "lowest_numerical_precision_in_comm",
        "tensor_parallelism",
        "pipeline_parallelism",
        "context_parallelism",
        "expert_parallelism",
        "micro_batch_size",
        "config_filename",
    }
)
"""Keys ruleset 6.1.0 requires and no earlier flux1 ruleset knows: a log with them is a 6.1.0 log."""
_TIMELINE_KEYS = frozenset(
    {"run_start", "run_stop", "eval_accuracy", "eval_start", "eval_stop", "block_start", "block_stop"}
)
_WANTED = _POINT_KEYS | _TIMELINE_KEYS
_EXACTLY_ONE = frozenset({"run_start", "run_stop", "init_start", "init_stop"}) | _POINT_KEYS - {"seed"}


@dataclass
class EvalPoint:
    """One evaluation of a fine-tuning run."""

    step: int | None
    samples: int
    epoch: float | None
    """Epochs done (fractional: the training loop logs 1.5 half-way through the second)."""
    loss: float


@dataclass
class HfRun:
    """What an hf workload run's metrics_<i>.jsonl says beyond a fine-tuning run's (report.hf reads it):
    its settings (the header, or the summary's "hf" block), its rates and FLOPs, and the time and cost
    of its configured epochs at the measured rate. Field names are JSON schema: keep stable."""

    model: str | None = None
    task: str | None = None
    parallel: str | None = None
    precision: str | None = None
    mode: str | None = None
    micro_batch_size: int | None = None
    seq_len: int | None = None
    params: int | None = None
    trainable_params: int | None = None
    flops_per_step: float | None = None
    """Model FLOPs of one optimizer step (forward and backward, torch's FlopCounterMode, once)."""
    peak_tflops: float | None = None
    """The GPU datasheet's dense peak for the precision; None on CPU."""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    """Text tasks; None for images (samples_per_s is images/s)."""
    tflops_per_s: float | None = None
    mfu: float | None = None
    epoch_seconds: float | None = None
    estimated_total_seconds: float | None = None
    """The configured epochs at the measured rate."""
    epochs: float | None = None
    """The configured epochs."""
    estimated_gpu_hours: float | None = None
    """estimated_total_seconds on the run's GPUs (the system's, as billed)."""
    estimated_cost_usd: float | None = None


@dataclass
class FineTuningRun:
    """What a fine-tuning run's metrics_<i>.jsonl adds to its log. Field names are JSON schema: keep stable.

    From the file's summary line when it has one (the training loop writes it last); each figure it lacks
    or gives wrong comes from the file's evaluation and step lines or the log, or stays None."""

    metrics_file: str | None = None
    summary: bool = False
    """The metrics file ends with its summary line (an interrupted run's does not)."""
    images_per_s: float | None = None
    step_time_ms: float | None = None
    throughput_note: str | None = None
    """Why the summary has no images/s and step time (its throughput_note: no step was timed); the report
    then shows this, never a figure of its own from the log."""
    train_seconds: float | None = None
    lost_seconds: float | None = None
    """Of train_seconds: time killed attempts spent past their last checkpoint (redone after the resume)."""
    epochs: float | None = None
    steps: int | None = None
    samples: int | None = None
    best_eval_loss: float | None = None
    best_step: int | None = None
    final_eval_loss: float | None = None
    peak_memory_gb: float | None = None
    world_size: int | None = None
    optimizer: str | None = None
    base_precision: str | None = None
    """LoRA runs: how the frozen base was stored (train.base_precision: bf16, fp8 or nf4)."""
    parameter_gb: float | None = None
    """One rank's parameter memory once sharded (the frozen base's precision shows here)."""
    best_weights: str | None = None
    """results/best_<i>/, where the run saved its best weights."""
    curve: list[EvalPoint] = field(default_factory=list)
    """The validation loss at every evaluation, by samples."""
    hf: HfRun | None = None
    """hf workload runs only (train.benchmark hf)."""


@dataclass
class RunResult:
    """One result log. The field names are the report's JSON schema: keep them stable."""

    file: str
    status: str = "incomplete"
    """'success' or 'aborted' (run_stop's status), or 'incomplete' (no run_start or no run_stop)."""
    minutes: float | None = None
    """(run_stop - run_start) / 60,000 ms: the MLPerf score of this run."""
    samples_to_converge: int | None = None
    """samples_count of the first eval that met the target."""
    final_eval_loss: float | None = None
    target: float = QUALITY_TARGET
    benchmark: str | None = None
    submitter: str | None = None
    platform: str | None = None
    global_batch_size: int | None = None
    learning_rate: float | None = None
    warmup_steps: int | None = None
    tensor_parallelism: int | None = None
    """The run's tensor-parallel degree, where its log says it (6.1.0 requires it; earlier rulesets'
    logs do not carry it)."""
    seed: int | None = None
    evals: int = 0
    eval_minutes: float = 0.0
    """Time spent between eval_start and eval_stop."""
    throughput_samples_per_s: float | None = None
    """Samples trained per second inside block_start/block_stop intervals (evaluation excluded); for a
    fine-tuning run with a metrics summary, its images/s (measured steps alone: evaluation and each
    attempt's first step excluded), the one figure every format shows (see report.finetune)."""
    throughput_per_accelerator: float | None = None
    mfu: float | None = None
    """Model FLOPs utilisation against the accelerator's bf16 peak, when both are known."""
    accelerators: int | None = None
    compliance: str = "not checked"
    """'passed', 'failed' or 'not checked' (the official mlperf_logging.compliance_checker)."""
    compliance_messages: list[str] = field(default_factory=list)
    scored: bool = False
    """Whether the run counts toward its group's olympic score (the summarizer's rule)."""
    warnings: list[str] = field(default_factory=list)
    eval_curve: list[tuple[int, float]] = field(default_factory=list)
    """(samples_count, eval loss) of every evaluation, by samples_count."""
    fine_tuning: FineTuningRun | None = None
    """Fine-tuning runs only (train.mode lora or finetune)."""
    accelerators_from_log: int | None = field(default=None, repr=False)
    eval_epochs: dict[int, float] = field(default_factory=dict, repr=False)
    """samples_count -> epoch_num of the evaluations that log one (fine-tuning logs do)."""
    rcp_samples: float | None = field(default=None, repr=False)
    """What MLPerf's RCP checker takes: the last eval's samples_count before the last run_stop, if
    that run_stop says success (the group's samples to converge is built from these)."""
    longest_line: int = field(default=0, repr=False)
    logged_ruleset: str | None = field(default=None, repr=False)
    """The ruleset the log's keys show: 6.1.0 (every disclosure key it requires), 6.0.0 (an
    evaluation_frequency other than 5.1.0's fixed 262,144), else None (5.1.0 and 6.0.0 logs read the same)."""
    missing_610_keys: list[str] = field(default_factory=list, repr=False)
    """Some of 6.1.0's disclosure keys but not these: no 6.1.0 log (its checker fails it), a 6.0 round's."""


class _Intervals:
    """Pairs start/stop events; a second start while one is open (another rank's copy) is ignored."""

    def __init__(self) -> None:
        self.open_at: float | None = None
        self.open_samples: int | None = None
        self.closed: list[tuple[float, int | None]] = []  # (duration ms, samples_count)
        self.unmatched = 0

    def start(self, time_ms: float, samples: int | None) -> None:
        if self.open_at is None:
            self.open_at, self.open_samples = time_ms, samples
        else:
            self.unmatched += 1

    def stop(self, time_ms: float, samples: int | None) -> None:
        if self.open_at is None:
            self.unmatched += 1
            return
        self.closed.append((time_ms - self.open_at, samples if samples is not None else self.open_samples))
        self.open_at = None


@dataclass
class _Scan:
    run_start: float | None = None
    run_stop: float | None = None
    stop_status: str | None = None
    points: dict[str, Any] = field(default_factory=dict)
    evals: dict[int, float] = field(default_factory=dict)  # samples_count -> loss, first one wins
    epochs: dict[int, float] = field(default_factory=dict)  # samples_count -> epoch_num
    evals_without_samples: int = 0
    blocks: _Intervals = field(default_factory=_Intervals)
    eval_intervals: _Intervals = field(default_factory=_Intervals)
    counts: Counter[str] = field(default_factory=Counter)
    last_eval_samples: Any = None
    rcp_status: str | None = None
    rcp_samples: Any = None
    longest_line: int = 0
    long_lines: int = 0
    mllog_lines: int = 0
    malformed: int = 0
    non_utf8: int = 0

    def add(self, key: str, time_ms: float, value: Any, metadata: dict[str, Any]) -> None:
        samples = _count(metadata.get("samples_count"))
        if key == "run_stop":  # the RCP checker: the last run_stop decides, with the last eval before it
            self.rcp_status, self.rcp_samples = str(metadata.get("status", "")), self.last_eval_samples
        if key == "run_start" or key == "run_stop":
            if self.run_start is None or self.run_stop is None:  # result_summarizer's loop
                if key == "run_start":
                    self.run_start = time_ms
                else:
                    self.run_stop, self.stop_status = time_ms, str(metadata.get("status", ""))
        elif key == "eval_accuracy":
            self.last_eval_samples = metadata.get("samples_count")
            if samples is None:
                self.evals_without_samples += 1
            elif finite_number(value) and samples not in self.evals:
                self.evals[samples] = float(value)
                epoch = non_negative(metadata.get("epoch_num"))
                if epoch is not None:
                    self.epochs[samples] = epoch
        elif key == "block_start":
            self.blocks.start(time_ms, samples)
        elif key == "block_stop":
            self.blocks.stop(time_ms, samples)
        elif key == "eval_start":
            self.eval_intervals.start(time_ms, samples)
        elif key == "eval_stop":
            self.eval_intervals.stop(time_ms, samples)
        else:
            self.points.setdefault(key, value)


def per_system(key: str, value: Any) -> tuple[int | None, str | None]:
    """A number_of_nodes or accelerators_per_node (a submission's systems JSON writes "4"): (the count,
    None), or (None, the problem in one line naming the key, the value and what was expected)."""
    number = value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    count = whole_number(number, 1, MAX_PER_SYSTEM)
    if count is not None:
        return count, None
    got = "missing" if value is None else f"got {reprlib.repr(value)}"
    return None, f"{key}: {got}, expected a whole number from 1 to {MAX_PER_SYSTEM:,}"


_count = whole_number  # a samples_count


def _decode(payload: bytes, scan: _Scan) -> dict[str, Any] | None:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        scan.non_utf8 += 1
        text = payload.decode("latin-1")  # what the official parser reads
    try:
        event = json.loads(text.strip())  # str.strip, as the official parser (form feeds and all)
        time_ms = float(event["time_ms"])
        event["metadata"] = event.get("metadata") or {}
        if not isinstance(event["key"], str) or not isinstance(event["metadata"], dict):
            raise TypeError
        if not math.isfinite(time_ms):
            raise ValueError
        event["time_ms"] = time_ms
        return event
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # 1e400 ms, [[[[...
        scan.malformed += 1
        return None


def scan_file(path: Path) -> _Scan:
    scan = _Scan()
    for line in bounded_lines(path):
        if isinstance(line, int):  # too long to hold: never an MLLOG line we read
            scan.long_lines += 1
            scan.longest_line = max(scan.longest_line, line)
            continue
        if len(line) > scan.longest_line:
            scan.longest_line = len(line)
        at = line.rfind(TOKEN)  # the official parser keeps what follows the last token
        if at < 0:
            if not line.isascii():
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    scan.non_utf8 += 1
            continue
        scan.mllog_lines += 1
        payload = line[at + len(TOKEN) :]
        mark = payload.find(KEY_MARK)
        if mark >= 0 and payload.find(KEY_MARK, mark + 1) >= 0:
            mark = -1  # a nested "key" too: decode the whole line
        if mark >= 0:
            end = payload.find(b'"', mark + len(KEY_MARK))
            key = payload[mark + len(KEY_MARK) : end].decode("latin-1")
            scan.counts[key] += 1
            if key not in _WANTED:
                continue
        event = _decode(payload, scan)
        if event is None:
            continue
        if mark < 0:  # unusual spacing: the key was not found by the fast path
            scan.counts[event["key"]] += 1
            if event["key"] not in _WANTED:
                continue
        scan.add(event["key"], event["time_ms"], event.get("value"), event["metadata"])
    return scan


def _block_samples(blocks: list[tuple[float, int | None]]) -> list[int] | None:
    """Samples trained in each block. NVIDIA logs the block's size; a strictly increasing series is
    cumulative (another convention) and is differenced."""
    counts = [samples for _, samples in blocks]
    if not counts or any(c is None or c <= 0 for c in counts):
        return None
    sizes = [c for c in counts if c is not None]
    if len(sizes) > 1 and all(b > a for a, b in pairwise(sizes)):
        return [sizes[0]] + [b - a for a, b in pairwise(sizes)]
    return sizes


def _number(value: Any, kind: type) -> Any:
    if not finite_number(value) or (kind is int and abs(value) > MAX_COUNT):
        return None
    return kind(value)


def harvest_run(path: Path, default_target: float = QUALITY_TARGET, name: str | None = None) -> RunResult:
    """The facts of one result log; problems become warnings, never exceptions (except I/O)."""
    result = RunResult(file=name or str(path))
    if path.stat().st_size == 0:
        result.warnings.append("empty file")
        return result
    scan = scan_file(path)
    _fill(result, scan, default_target)
    return result


def _fill(result: RunResult, scan: _Scan, default_target: float) -> None:
    points, warn = scan.points, result.warnings.append
    if scan.mllog_lines == 0:
        warn("no :::MLLOG lines")
    if scan.malformed:
        warn(f"{scan.malformed} malformed :::MLLOG line(s) skipped")
    if scan.non_utf8:
        warn(f"{scan.non_utf8} non-UTF-8 line(s)")
    if scan.long_lines:
        warn(
            f"{scan.long_lines} line(s) over {MAX_LINE_BYTES >> 10} KiB skipped "
            f"(the longest {scan.longest_line:,} bytes)"
        )
    duplicated = sorted(k for k in _EXACTLY_ONE if scan.counts[k] > 1)
    if duplicated:
        warn(
            "duplicate keys (several ranks logging?): "
            + ", ".join(f"{k} x{scan.counts[k]}" for k in duplicated)
        )
    if scan.evals_without_samples:
        warn(f"{scan.evals_without_samples} eval_accuracy line(s) without samples_count")

    result.longest_line = scan.longest_line
    frequency = _number(points.get("evaluation_frequency"), int)
    disclosed = {k for k in RULESET_610_KEYS if scan.counts[k]}
    if disclosed == RULESET_610_KEYS:
        result.logged_ruleset = "6.1.0"
    elif frequency is not None and frequency != EVAL_INTERVAL_SAMPLES:
        result.logged_ruleset = "6.0.0"
    elif disclosed:  # a 6.0 round's implementation logging some of them before 6.1.0 required them all
        result.missing_610_keys = sorted(RULESET_610_KEYS - disclosed)
    if scan.rcp_status == "success" and scan.rcp_samples is not None:
        result.rcp_samples = scan.rcp_samples if finite_number(scan.rcp_samples) else math.inf
    result.benchmark = _text(points.get("submission_benchmark"))
    result.submitter = _text(points.get("submission_org"))
    result.platform = _text(points.get("submission_platform"))
    result.global_batch_size = _number(points.get("global_batch_size"), int)
    result.learning_rate = _number(points.get("opt_base_learning_rate"), float)
    result.warmup_steps = _number(points.get("opt_learning_rate_warmup_steps"), int)
    result.tensor_parallelism = _number(points.get("tensor_parallelism"), int)
    result.seed = _number(points.get("seed"), int)
    target = _number(points.get("target_accuracy"), float)
    result.target = target if target is not None else default_target
    counts = [per_system(k, points[k]) for k in ("number_of_nodes", "accelerators_per_node") if k in points]
    result.warnings += [problem for _, problem in counts if problem]
    if len(counts) == 2 and counts[0][0] and counts[1][0]:
        result.accelerators_from_log = counts[0][0] * counts[1][0]

    if scan.run_start is None:
        warn("no run_start")
    elif scan.run_stop is None:
        warn("no run_stop: the log is truncated or the run is still going")
    else:
        result.minutes = (scan.run_stop - scan.run_start) / 60 / 1000
        result.status = "success" if scan.stop_status == "success" else "aborted"

    result.eval_curve = sorted(scan.evals.items())
    result.eval_epochs = scan.epochs
    result.evals = len(result.eval_curve)
    if result.eval_curve:
        result.final_eval_loss = result.eval_curve[-1][1]
        met = [samples for samples, loss in result.eval_curve if loss <= result.target]
        result.samples_to_converge = met[0] if met else None
    # A fine-tuning log (division open, no target_accuracy) succeeds by finishing its epochs.
    no_target = "target_accuracy" not in points and points.get("submission_division") == "open"
    if result.status == "success" and result.samples_to_converge is None and not no_target:
        warn(f"run_stop says success but no eval reached the target {result.target}")
    result.eval_minutes = sum(ms for ms, _ in scan.eval_intervals.closed) / 60_000

    blocks = scan.blocks.closed
    sizes = _block_samples(blocks)
    seconds = sum(ms for ms, _ in blocks) / 1000
    if sizes and seconds > 0:
        result.throughput_samples_per_s = sum(sizes) / seconds
    elif blocks:
        warn("block_start/block_stop without samples_count: no throughput")
    unpaired = scan.blocks.unmatched + scan.eval_intervals.unmatched
    if unpaired:
        warn(f"{unpaired} unpaired block/eval start or stop line(s)")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def to_json(result: RunResult) -> dict[str, Any]:
    document = dict(result.__dict__)
    private_fields = ("accelerators_from_log", "eval_epochs", "rcp_samples", "longest_line", "logged_ruleset")
    for private in (*private_fields, "missing_610_keys"):
        document.pop(private)
    document["eval_curve"] = [list(point) for point in result.eval_curve]
    if result.fine_tuning is not None:
        document["fine_tuning"] = dataclasses.asdict(result.fine_tuning)
    return document
