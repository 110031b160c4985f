"""A fine-tuning run's metrics_<i>.jsonl, streamed once, into the figures its log does not give.

The training loop writes a header line (model FLOPs per sample, world size), a line per step, a line per
evaluation ({"step", "samples", "eval_loss", "epoch", "train_seconds"}), the run's time at each progress
line ({"clock": {"train_seconds"}}) and, when the run ends, a summary line ({"summary": {...}}). A run
killed early has no summary: its figures then come from the evaluation and step lines, else from the log.

Throughput has one definition in the report: images (samples) per second over the measured training steps
alone, evaluation and each attempt's first step (compile, warm-up) excluded: the summary's images_per_s.
It becomes the run's throughput_samples_per_s, so every card, table, plot and format shows that figure;
only a run without a summary falls back to its log's training blocks (evaluation excluded). A summary
without it (a run whose only step was the untimed first one: null and its throughput_note; NaN before the
note) has no throughput in the report either: the note instead, never a figure made from the log.

The summary covers the whole run: a run stopped and resumed carries its training time in its checkpoints,
so its summary's train_seconds and images/s count every attempt (summary.attempts), while its result log
(run_start to run_stop) has the last attempt only (the earlier ones' are in results/interrupted/). A
resumed run's minutes, which the report's GPU-hours and cost come from, are therefore its summary's
train_seconds. They include the time an attempt killed without a checkpoint spent past its last one (up to
its last progress line; summary.lost_seconds): paid for, then redone.

The file comes from an untrusted folder: it is read in bounded chunks (harvest's reader, lines over
MAX_LINE_BYTES skipped), and every oddity is one warning line naming the file, never an exception.
"""

import json
import math
import reprlib
from pathlib import Path
from typing import Any

from flux_cluster.mlperf_rules import MAX_LINE_BYTES, bounded_lines
from flux_cluster.report.harvest import (
    EvalPoint,
    FineTuningRun,
    RunResult,
    finite_number,
    non_negative,
    whole_number,
)
from flux_cluster.rundir import best_dir, metrics_file, repeat_of

_NUMBERS = (
    "images_per_s", "step_time_ms", "train_seconds", "lost_seconds", "epochs", "best_eval_loss",
    "final_eval_loss", "peak_memory_gb", "parameter_gb",
)  # fmt: skip
_COUNTS = ("steps", "samples", "best_step", "world_size")
_UNMEASURED = ("images_per_s", "step_time_ms")
MAX_OPTIMIZER_CHARS = 200
NOT_MEASURED = "not measured"
"""A summary's throughput_note when it has none (one from before the note, or one without images/s)."""
MAX_CURVE_POINTS = 100_000
"""Evaluations kept per run (a real run has hundreds): a crafted file cannot fill memory with them."""


def read_fine_tuning(log: Path, run: RunResult) -> FineTuningRun:
    """The fine-tuning figures of the run whose log is results/result_<i>.txt; warnings go on run."""
    run_dir, exp = log.parent.parent, repeat_of(log)  # the report reads these for run folders only
    metrics, best = metrics_file(run_dir, exp), best_dir(run_dir, exp)
    result = FineTuningRun(best_weights=str(best) if best.is_dir() else None)
    summary: dict[str, Any] = {}
    curve: dict[int, EvalPoint] = {}
    last_step: dict[str, Any] = {}
    if metrics.is_file():  # not a FIFO: a read would block
        result.metrics_file = str(metrics)
        try:
            summary = _scan(metrics, run, curve, last_step, result)
        except OSError as exc:
            run.warnings.append(f"{metrics}: unreadable ({exc.strerror or exc})")
    else:
        run.warnings.append(f"{metrics}: missing, so the figures come from the log alone")
    if result.metrics_file and not summary:
        run.warnings.append(f"{metrics}: no summary line (interrupted run?): figures from its other lines")
    _take_summary(summary, result, run, metrics)
    _whole_run_minutes(summary, result, run, metrics)
    _fall_back(result, run, curve, last_step)
    if result.images_per_s is not None:  # one throughput for the run, in every format and plot
        run.throughput_samples_per_s = result.images_per_s
    elif result.summary:  # the summary says none was measured: no figure of the log's either
        run.throughput_samples_per_s = None
    return result


def _scan(
    path: Path,
    run: RunResult,
    curve: dict[int, EvalPoint],
    last_step: dict[str, Any],
    result: FineTuningRun,
) -> dict[str, Any]:
    """Fill curve and last_step from the file; its last summary, or {}."""
    summary: dict[str, Any] = {}
    long_lines = not_objects = bad_losses = past_cap = 0
    for line in bounded_lines(path):
        if isinstance(line, int):
            long_lines += 1
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict):
            not_objects += 1
            continue
        if isinstance(record.get("summary"), dict):
            summary = record["summary"]  # the training loop writes it last; a resumed run's last wins
        elif "eval_loss" in record:
            samples, loss = whole_number(record.get("samples")), record["eval_loss"]
            if samples is None or not finite_number(loss):
                bad_losses += 1
            elif len(curve) >= MAX_CURVE_POINTS:
                past_cap += 1
            elif samples not in curve:  # first wins, as in the log
                step, epoch = whole_number(record.get("step")), non_negative(record.get("epoch"))
                curve[samples] = EvalPoint(step, samples, epoch, float(loss))
        elif "step" in record:
            last_step.clear()
            last_step.update(record)
        elif "world_size" in record and result.world_size is None:  # the header
            result.world_size = whole_number(record["world_size"], 1)
    if long_lines:
        run.warnings.append(f"{path}: {long_lines} line(s) over {MAX_LINE_BYTES >> 10} KiB skipped")
    if not_objects:
        run.warnings.append(f"{path}: {not_objects} line(s) that are no JSON object skipped")
    if bad_losses:
        run.warnings.append(
            f"{path}: {bad_losses} evaluation(s) with a loss that is not a finite number skipped"
        )
    if past_cap:
        run.warnings.append(f"{path}: {past_cap} evaluation(s) past the first {MAX_CURVE_POINTS:,} skipped")
    return summary


def _take_summary(summary: dict[str, Any], result: FineTuningRun, run: RunResult, path: Path) -> None:
    """Each summary figure that is what the contract says; one warning per one that is not."""
    result.summary = bool(summary)
    for key in (*_NUMBERS, *_COUNTS, "optimizer", "base_precision", "throughput_note"):
        value = summary.get(key)
        if value is None or (key in _UNMEASURED and isinstance(value, float) and math.isnan(value)):
            continue  # null: not measured (NaN: how the meter wrote that before its note)
        if key in _NUMBERS:
            good = non_negative(value)
            expected = "a finite number >= 0"
        elif key in _COUNTS:
            good, expected = whole_number(value), "a whole number >= 0"
        else:
            good = value if isinstance(value, str) and 0 < len(value) <= MAX_OPTIMIZER_CHARS else None
            expected = "a text"
        if good is None:
            run.warnings.append(f"{path}: summary.{key}: got {reprlib.repr(value)}, expected {expected}")
        else:
            setattr(result, key, good)
    if summary and result.images_per_s is None:
        result.step_time_ms = None
        result.throughput_note = result.throughput_note or NOT_MEASURED


def _whole_run_minutes(summary: dict[str, Any], result: FineTuningRun, run: RunResult, path: Path) -> None:
    """A resumed run's minutes: its summary's train_seconds, every attempt's (its log has the last one's)."""
    attempts = whole_number(summary.get("attempts"), 1)
    if "attempts" in summary and attempts is None:
        got = reprlib.repr(summary["attempts"])
        run.warnings.append(f"{path}: summary.attempts: got {got}, expected a whole number >= 1")
    elif attempts is not None and attempts > 1 and result.train_seconds is not None:
        run.minutes = result.train_seconds / 60


def _fall_back(
    result: FineTuningRun, run: RunResult, curve: dict[int, EvalPoint], last_step: dict[str, Any]
) -> None:
    """What the summary did not give: from the evaluation and step lines, else from the log."""
    if not curve:  # no evaluation lines: the log's eval_accuracy events
        curve = {s: EvalPoint(None, s, run.eval_epochs.get(s), loss) for s, loss in run.eval_curve}
    result.curve = [curve[s] for s in sorted(curve)]
    points = result.curve
    if points:
        best = min(points, key=lambda p: p.loss)
        if result.best_eval_loss is None:
            result.best_eval_loss, result.best_step = best.loss, best.step
        if result.final_eval_loss is None:
            result.final_eval_loss = points[-1].loss
        epochs = [p.epoch for p in points if p.epoch is not None]
        if result.epochs is None and epochs:
            result.epochs = max(epochs)
    if result.steps is None:
        result.steps = whole_number(last_step.get("step")) or (points[-1].step if points else None)
    if result.samples is None:
        result.samples = whole_number(last_step.get("samples")) or (points[-1].samples if points else None)
    if result.world_size is None:
        result.world_size = run.accelerators_from_log
    if result.summary:  # its throughput or its note: nothing made up from the log
        return
    if result.images_per_s is None:
        result.images_per_s = run.throughput_samples_per_s  # the log's training blocks, evals excluded
    if result.step_time_ms is None and result.images_per_s and result.steps and result.samples:
        result.step_time_ms = result.samples / result.steps / result.images_per_s * 1000
