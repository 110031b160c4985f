"""Group scores exactly as MLPerf's ``result_summarizer`` computes them, plus cost and throughput.

The summarizer (mlperf_logging 4.1.68, ``_compute_strong_score_standalone``): a run is dropped when
its log fails the compliance checker or lacks run_start/run_stop. More than one dropped run (flux1
allows one) gives no score. Otherwise the scores are sorted and the best is dropped, and the worst too
unless a failed run already took its place; the rest are averaged, then multiplied by the group's
``scaling.json`` factor. No countable score left (too few runs) gives no score. Samples to converge
follow its RCP checker: per run the converged samples (unconverged counts as infinite), more than one
unconverged gives none, else the mean without the lowest and highest, given at least 3 runs.

Fine-tuning runs (a run directory whose train.mode is 'lora' or 'finetune') are no MLPerf result: never
checked, never scored. GPU-hours and cost come from the olympic average as measured (before the
scaling.json factor: what the runs took) when there is one, else from the measured run times
(run_stop - run_start), so every group with a run time, accelerators and a price
has a cost. A fine-tuning group also gets the means over its runs of images/s, step time and best and
final validation loss (from each run's metrics file, see ``finetune``), and its peak memory.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from flux_cluster.report.discover import GroupSource
from flux_cluster.report.evaluation import EvalResult
from flux_cluster.report.harvest import RunResult, to_json
from flux_cluster.report.rcp import has_rcps, submission_mean, verdict, verdict_text
from flux_cluster.training.flops import FLUX_SCHNELL, training_flops_per_sample

MAX_DROPPED = 1
"""Failed runs flux1's olympic score tolerates (result_summarizer: 4 for unet3d, 1 otherwise)."""
REQUIRED_RUNS = 10
"""Result files a flux1 submission needs (mlperf_logging.benchmark_meta)."""
FINE_TUNING_MODES = ("finetune", "lora")
"""train.mode values that make a run no MLPerf result (its log says division open)."""
FLUX_SCHNELL_FLOPS_PER_SAMPLE = training_flops_per_sample(FLUX_SCHNELL)
"""Model FLOPs per flux1 training sample (20.4 TFLOP: 256 image + 256 text tokens)."""


@dataclass
class GroupResult:
    """One directory's runs, scored together. Field names are the report's JSON schema: keep stable."""

    path: str
    benchmark: str | None
    system: str | None
    submitter: str | None
    accelerator_model: str | None
    accelerators: int | None
    ruleset: str | None
    runs: list[RunResult]
    ruleset_from: str | None = None
    """Where ruleset came from: '--ruleset', 'run config', 'logs', 'path' or 'assumed' (nothing said)."""
    system_name: str | None = None
    """A submission's systems JSON system_name (the official summarizer's name for the row)."""
    olympic_minutes: float | None = None
    """The olympic average times scaling_factor (scaling.json, the RCP factor), as the summarizer."""
    mean_minutes: float | None = None
    min_minutes: float | None = None
    max_minutes: float | None = None
    run_count: int = 0
    scored_runs: int = 0
    required_runs: int = REQUIRED_RUNS
    samples_to_converge: float | None = None
    scaling_factor: float = 1.0
    gpu_hours: float | None = None
    """Accelerator-hours of one run at the measured (unscaled) olympic average, else the mean measured
    run time: what the runs took, never the RCP-scaled score."""
    price_per_gpu_hour: float | None = None
    cost_usd: float | None = None
    throughput_samples_per_s: float | None = None
    throughput_per_accelerator: float | None = None
    mfu: float | None = None
    train_mode: str | None = None
    """'pretrain', 'finetune' or 'lora' for a flux-cluster run directory; None for other logs."""
    minutes_basis: str | None = None
    """What gpu_hours and cost_usd are for: 'olympic' (one run at the olympic score) or 'measured' (one
    run at the mean measured run time, for groups without an olympic score)."""
    total_gpu_hours: float | None = None
    """Every run with a measured time, together."""
    total_cost_usd: float | None = None
    images_per_s: float | None = None
    """Fine-tuning groups only, from here on: the mean over runs (peak memory: the most). images_per_s and
    images_per_s_per_accelerator are throughput_samples_per_s and throughput_per_accelerator under the
    names of fine-tuning (one image a sample): one figure, the measured training steps alone."""
    images_per_s_per_accelerator: float | None = None
    step_time_ms: float | None = None
    throughput_note: str | None = None
    """Why a fine-tuning group has no images/s: its runs' summaries say none was measured."""
    best_eval_loss: float | None = None
    final_eval_loss: float | None = None
    peak_memory_gb: float | None = None
    evals: list[EvalResult] = field(default_factory=list)
    """The run directory's flux-cluster evaluate results (results/eval_<k>.json)."""
    inference_p50_s: float | None = None
    """From here on, means over evals: the fine-tuned model's latency per image where measured, else
    the base model's; CLIP scores and validation losses of both."""
    inference_p99_s: float | None = None
    inference_images_per_s: float | None = None
    inference_usd_per_1k_images: float | None = None
    """What 1,000 images cost at the inference rate on one accelerator at the group's price."""
    clip_score_base: float | None = None
    clip_score_tuned: float | None = None
    val_loss_base: float | None = None
    val_loss_tuned: float | None = None
    evals_meaningful: bool | None = None
    """False when any of its evaluations says its figures mean nothing (a tiny random-init model)."""
    rcp: dict[str, Any] | None = None
    """What mlperf_logging's RCP checker says of the runs at their global batch (report.rcp.verdict):
    verdict, the normalization factor, the RCP it compared with; None where the benchmark has no RCPs."""
    warnings: list[str] = field(default_factory=list)

    @property
    def fine_tuning(self) -> bool:
        return self.train_mode in FINE_TUNING_MODES

    @property
    def rcp_verdict(self) -> str | None:
        """The RCP verdict in one cell ('pass', 'pass x1.021', 'fail', ...)."""
        return verdict_text(self.rcp)

    def to_json(self) -> dict[str, Any]:
        document = {k: v for k, v in self.__dict__.items() if k != "runs"}
        document["runs"] = [to_json(run) for run in self.runs]
        document["evals"] = [e.to_json() for e in self.evals]
        return document


def olympic_average(scores: list[float], dropped: int, max_dropped: int = MAX_DROPPED) -> float | None:
    """result_summarizer's _compute_olympic_average, on a copy."""
    ordered = sorted(scores)
    countable = ordered[max_dropped : len(ordered) - (max_dropped - dropped)]
    return sum(countable) * 1.0 / len(countable) if countable else None


def olympic_samples(runs: list[RunResult], max_dropped: int = MAX_DROPPED) -> float | None:
    """The summarizer's samples_to_converge (via rcp_checker.get_submission_epochs): none when the
    runs' batch sizes differ or one is missing."""
    if len({r.global_batch_size for r in runs}) != 1 or runs[0].global_batch_size is None:
        return None
    return submission_mean([r.rcp_samples for r in runs], max_dropped)


def score_group(
    source: GroupSource,
    runs: list[RunResult],
    checked: bool,
    price: float | None = None,
    peak_tflops: float | None = None,
    evals: list[EvalResult] | None = None,
) -> GroupResult:
    """Score one group's runs. ``checked``: compliance ran, so a failed check drops the run."""
    accelerators = source.accelerators or _agreed(r.accelerators_from_log for r in runs)
    group = GroupResult(
        path=str(source.path),
        benchmark=_agreed(r.benchmark for r in runs),
        system=source.system or _agreed(r.platform for r in runs),
        submitter=source.submitter or _agreed(r.submitter for r in runs),
        accelerator_model=source.accelerator_model,
        accelerators=accelerators,
        ruleset=source.ruleset,
        ruleset_from=source.ruleset_from,
        system_name=source.system_name,
        runs=runs,
        run_count=len(runs),
        scaling_factor=source.scaling_factor,
        price_per_gpu_hour=price if price is not None else source.price_per_gpu_hour,
        train_mode=source.train_mode,
        warnings=list(source.warnings),
    )
    peak = peak_tflops if peak_tflops is not None else source.peak_tflops
    for run, log in zip(runs, source.files, strict=True):
        run.accelerators = accelerators
        flops = source.flops_per_sample.get(log)
        if flops is None and not source.run_dir and run.benchmark == "flux1":
            flops = FLUX_SCHNELL_FLOPS_PER_SAMPLE
        _per_accelerator(run, flops, peak)
        if group.fine_tuning:
            run.scored = False
        elif checked:
            run.scored = run.compliance == "passed" and run.minutes is not None
        else:
            run.scored = run.status == "success" and run.minutes is not None

    scores = [run.minutes for run in runs if run.scored and run.minutes is not None]
    average: float | None = None
    measured = [run.minutes for run in runs if run.minutes is not None]
    dropped = len(runs) - len(scores)
    timed = measured if group.fine_tuning else scores  # no run of a fine-tuning group is scored
    if timed:
        group.mean_minutes = statistics.fmean(timed)
        group.min_minutes, group.max_minutes = min(timed), max(timed)
    group.scored_runs = len(scores)
    if group.fine_tuning:
        group.warnings.append(
            f"fine-tuning (train.mode {group.train_mode}): no MLPerf result, so not checked and not scored; "
            "GPU-hours and cost from the measured run times"
        )
    elif dropped > MAX_DROPPED:
        group.warnings.append(f"{dropped} runs failed: more than {MAX_DROPPED} allowed, so no olympic score")
    else:
        average = olympic_average(scores, dropped)
        if average is None:
            group.warnings.append(f"{len(scores)} scored run(s): too few for an olympic score")
        else:
            group.olympic_minutes = average * group.scaling_factor
    if group.benchmark == "flux1" and len(runs) < REQUIRED_RUNS and not group.fine_tuning:
        group.warnings.append(f"{len(runs)} of the {REQUIRED_RUNS} runs a flux1 submission needs")
    if len({r.global_batch_size for r in runs if r.global_batch_size}) > 1:
        group.warnings.append("runs use different global batch sizes")
    group.samples_to_converge = olympic_samples(runs)
    group.rcp = rcp_verdict(group)

    per_run = average if group.olympic_minutes is not None else None  # measured, not RCP-scaled
    if per_run is not None:
        group.minutes_basis = "olympic"
    elif measured:
        group.minutes_basis, per_run = "measured", statistics.fmean(measured)
    if accelerators and per_run is not None:
        group.gpu_hours = per_run * accelerators / 60
        group.total_gpu_hours = sum(measured) * accelerators / 60
        if group.price_per_gpu_hour is not None:
            group.cost_usd = group.gpu_hours * group.price_per_gpu_hour
            group.total_cost_usd = group.total_gpu_hours * group.price_per_gpu_hour
    elif not accelerators:
        group.warnings.append("accelerator count unknown: no GPU-hours, cost or per-accelerator figures")
    with_throughput = [r for r in runs if r.throughput_samples_per_s]
    group.throughput_samples_per_s = _mean([r.throughput_samples_per_s for r in with_throughput])
    if group.throughput_samples_per_s is not None:
        if accelerators:
            group.throughput_per_accelerator = group.throughput_samples_per_s / accelerators
        group.mfu = _mean([r.mfu for r in with_throughput])
    if group.fine_tuning:
        _fine_tuning_figures(group)
    if evals:
        eval_figures(group, evals)
    return group


def rcp_verdict(group: GroupResult) -> dict[str, Any] | None:
    """What the RCP checker says of the group's runs (None: fine-tuning, or no RCPs for the benchmark)."""
    if group.fine_tuning or not has_rcps(group.ruleset, group.benchmark):
        return None
    assert group.ruleset is not None and group.benchmark is not None
    batch = _agreed(r.global_batch_size for r in group.runs)
    finite = [
        r.rcp_samples if r.rcp_samples is not None and math.isfinite(r.rcp_samples) else None
        for r in group.runs
    ]
    return verdict(group.ruleset, group.benchmark, batch, finite)


def _mean(values: list[float | None]) -> float | None:
    """The mean of the known values; None when there are none or they overflow (a crafted 1e308)."""
    found = [v for v in values if v is not None]
    try:
        return statistics.fmean(found) if found else None
    except OverflowError:
        return None


def eval_figures(group: GroupResult, evals: list[EvalResult]) -> None:
    group.evals = evals
    latencies = [e.latency for e in evals]
    group.inference_p50_s = _mean([x.p50_s for x in latencies if x])
    group.inference_p99_s = _mean([x.p99_s for x in latencies if x])
    group.inference_images_per_s = _mean([x.images_per_s for x in latencies if x])
    price = group.price_per_gpu_hour
    if group.inference_images_per_s and price is not None:
        group.inference_usd_per_1k_images = 1000 / group.inference_images_per_s / 3600 * price
    group.clip_score_base = _mean([e.clip_base for e in evals])
    group.clip_score_tuned = _mean([e.clip_tuned for e in evals])
    group.val_loss_base = _mean([e.val_loss_base for e in evals])
    group.val_loss_tuned = _mean([e.val_loss_tuned for e in evals])
    group.evals_meaningful = all(e.meaningful for e in evals)


def _fine_tuning_figures(group: GroupResult) -> None:
    runs = [r.fine_tuning for r in group.runs if r.fine_tuning is not None]

    def values(name: str) -> list[float]:
        return [v for v in (getattr(r, name) for r in runs) if v is not None]

    for name in ("step_time_ms", "best_eval_loss", "final_eval_loss"):
        setattr(group, name, _mean(list(values(name))))
    memory = values("peak_memory_gb")
    group.peak_memory_gb = max(memory) if memory else None
    # the group's one throughput (finetune: the summary's measured steps), under its fine-tuning names too
    group.images_per_s = group.throughput_samples_per_s
    group.images_per_s_per_accelerator = group.throughput_per_accelerator
    notes = {r.throughput_note for r in runs if r.throughput_note}
    if group.images_per_s is None and notes:
        group.throughput_note = " / ".join(sorted(notes))


def _per_accelerator(run: RunResult, flops_per_sample: float | None, peak_tflops: float | None) -> None:
    if not run.throughput_samples_per_s or not run.accelerators:
        return
    run.throughput_per_accelerator = run.throughput_samples_per_s / run.accelerators
    if flops_per_sample and peak_tflops:
        run.mfu = run.throughput_per_accelerator * flops_per_sample / (peak_tflops * 1e12)


def _agreed(values: Any) -> Any:
    """The one value all runs agree on, else None."""
    distinct = {v for v in values if v is not None}
    return distinct.pop() if len(distinct) == 1 else None
