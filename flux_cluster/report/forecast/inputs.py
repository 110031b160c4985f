"""What a forecast starts from: measured steps, evaluations and convergence, read from MLPerf result
folders and flux-cluster runs (the report's harvest, scored as the summarizer scores them) and from
throughput sweeps (their points' records). Each problem is one line naming the path and what is missing."""

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from flux_cluster.errors import FluxClusterError
from flux_cluster.report.build import Options, build
from flux_cluster.report.forecast.model import Sample
from flux_cluster.report.rcp import has_rcps, reference
from flux_cluster.report.scoring import GroupResult
from flux_cluster.sweepdir import SweepState, is_sweep_folder, summary_rows

T = TypeVar("T")
P90_SIGMAS = 1.2816
"""A normal distribution's 90th percentile in standard deviations: a sweep's step-time spread is
(p90 - p50) / p50 / P90_SIGMAS."""


@dataclass
class Measured:
    """One input: a group of result logs (or one of the targets), or one point of a throughput sweep."""

    path: str
    kind: str
    """'results' (result logs: an MLPerf submission's or a flux-cluster run's) or 'sweep'."""
    sample: Sample
    global_batch: int
    model: str | None = None
    """The model trained, where the input says (a sweep's record); result logs of flux1: flux-schnell."""
    eval_s: float | None = None
    """Seconds per evaluation (eval_start to eval_stop), the mean over the runs."""
    samples_to_converge: float | None = None
    """The summarizer's samples to converge (olympic mean of the runs')."""
    convergence_ratio: float | None = None
    """samples_to_converge over the RCP mean at its batch: how this implementation converges."""
    score_minutes: float | None = None
    """The official score: the olympic minutes times the RCP factor the summarizer applies."""
    ruleset: str | None = None
    ruleset_from: str | None = None
    hyperparameters: tuple[float | None, int | None] = (None, None)
    """The runs' learning rate and warmup steps, where they agree."""
    tensor_parallelism: int | None = None
    """The runs' tensor-parallel degree, where their logs say it (6.1.0) and agree."""
    warnings: list[str] = field(default_factory=list)


def read_results(paths: list[Path], ruleset: str | None, check: bool) -> list[Measured]:
    """Each group of result logs under the paths, as the report scores it."""
    for path in paths:
        if not path.exists():
            raise FluxClusterError(f"{path}: no such file or directory")
    groups = [g for g in build(paths, Options(check=check, ruleset=ruleset)) if g.runs]
    if not groups:
        raise FluxClusterError(f"{', '.join(map(str, paths))}: no result logs (files with :::MLLOG lines)")
    return [_from_group(g) for g in groups]


def _from_group(group: GroupResult) -> Measured:
    where = group.path
    if group.fine_tuning:
        raise FluxClusterError(f"{where}: fine-tuning runs (train.mode {group.train_mode}): no MLPerf result")
    batches = {r.global_batch_size for r in group.runs}
    if len(batches) != 1 or None in batches:
        raise FluxClusterError(f"{where}: global_batch_size: expected one value over the runs, got {batches}")
    if not group.accelerators:
        raise FluxClusterError(
            f"{where}: accelerator count unknown (no systems JSON, run config or log keys)"
        )
    rates = [r.throughput_samples_per_s for r in group.runs if r.throughput_samples_per_s]
    if not rates:
        raise FluxClusterError(
            f"{where}: no block_start/block_stop with samples_count: no training throughput"
        )
    if not any(r.samples_to_converge for r in group.runs):
        raise FluxClusterError(
            f"{where}: no converged run (no eval_accuracy at or below the target): a results input gives "
            "throughput, evaluation time and convergence; for throughput alone give a throughput sweep"
        )
    batch = int(batches.pop() or 0)
    rate = statistics.fmean(rates)
    spread = statistics.pstdev(rates) / rate if len(rates) > 1 else 0.0
    evals = [r.eval_minutes * 60 / r.evals for r in group.runs if r.evals and r.eval_minutes > 0]
    measured = Measured(
        path=where,
        kind="results",
        sample=Sample(batch / group.accelerators, group.accelerators, batch / rate, spread),
        global_batch=batch,
        model="flux-schnell" if group.benchmark == "flux1" and not _is_run_dir(group) else None,
        eval_s=statistics.fmean(evals) if evals else None,
        samples_to_converge=group.samples_to_converge,
        ruleset=group.ruleset,
        ruleset_from=group.ruleset_from,
        hyperparameters=_agreed([(r.learning_rate, r.warmup_steps) for r in group.runs]) or (None, None),
        tensor_parallelism=_agreed([r.tensor_parallelism for r in group.runs]),
        warnings=list(group.warnings),
    )
    if group.olympic_minutes is not None:
        already = group.scaling_factor != 1.0  # scaling.json: the summarizer's factor is in it
        factor = (group.rcp or {}).get("factor", 1.0) if not already else 1.0
        measured.score_minutes = group.olympic_minutes * factor
    if group.samples_to_converge and has_rcps(group.ruleset, group.benchmark) and group.ruleset:
        try:
            measured.convergence_ratio = group.samples_to_converge / reference(group.ruleset, batch).mean
        except FluxClusterError as exc:
            measured.warnings.append(str(exc))
    return measured


def _agreed(values: list[T]) -> T | None:
    return values[0] if len(set(values)) == 1 else None


def _is_run_dir(group: GroupResult) -> bool:
    return group.train_mode is not None


def read_sweep(folder: Path) -> list[Measured]:
    """A throughput sweep's ok points; at least two per-GPU batch sizes (a fixed and a per-sample part)."""
    state = SweepState.load(folder)
    if state.job != "throughput":
        raise FluxClusterError(f"{folder}: a '{state.job}' sweep: give a throughput sweep (--job throughput)")
    out = []
    for point, row in zip(state.points, summary_rows(state), strict=True):
        result = point.result
        rate, world, batch = row["samples_per_s"], row["gpus"], result.get("global_batch_size")
        if row["status"] != "ok" or not rate or not world or not isinstance(batch, int) or batch < 1:
            continue
        p50, p90 = row["step_time_ms_p50"], row["step_time_ms_p90"]
        spread = (p90 - p50) / p50 / P90_SIGMAS if p50 and p90 and p90 >= p50 else 0.0
        out.append(
            Measured(
                path=str(point.run_dir or folder),
                kind="sweep",
                sample=Sample(batch / world, world, batch / rate, spread),
                global_batch=batch,
                model=result.get("model") if isinstance(result.get("model"), str) else None,
            )
        )
    sizes = sorted({m.sample.per_gpu_batch for m in out})
    if len(sizes) < 2:
        got = f"one per-GPU batch ({sizes[0]:g})" if sizes else "no point with status ok"
        raise FluxClusterError(
            f"{folder}: {got}: a forecast fits a fixed and a per-sample part of the step from at least two "
            f"(sweep --grid {'train.micro_batch_size'}=A,B,...)"
        )
    return out


def read_inputs(paths: list[Path], ruleset: str | None, check: bool) -> list[Measured]:
    """Sweeps and result logs under the paths, in the order given."""
    out: list[Measured] = []
    logs = [p for p in paths if not is_sweep_folder(p)]
    for path in paths:
        if is_sweep_folder(path):
            out += read_sweep(path)
    if logs:
        out += read_results(logs, ruleset, check)
    if not out:
        raise FluxClusterError("forecast: no inputs: give --from a throughput sweep or result folders")
    return out
