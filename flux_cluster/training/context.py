"""What one repeat of a training job is (JobContext, from the job script) and when it evaluates and stops
(Schedule, in optimizer steps)."""

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from flux_cluster import rundir
from flux_cluster.config.batch_fit import fit_batch
from flux_cluster.config.schema import SystemConfig
from flux_cluster.config.workload import JOB_CHOSEN, TrainingPlan, fit_to_split
from flux_cluster.errors import FluxClusterError


@dataclass(frozen=True)
class JobContext:
    """One repeat of the job, as the job script describes it (run dir, repeat index, seed, log path)."""

    system: SystemConfig
    plan: TrainingPlan
    run_dir: Path
    data_dir: Path
    exp_index: int
    seed: int
    result_log: Path
    cache_cleared: bool
    config_filename: str

    @property
    def checkpoint_dir(self) -> Path:
        base = rundir.checkpoints_dir(self.run_dir, self.plan.train.checkpoint_dir)
        return rundir.repeat_checkpoints_dir(base, self.exp_index)

    @property
    def metrics_file(self) -> Path:
        return rundir.metrics_file(self.run_dir, self.exp_index)

    @property
    def tuning(self) -> bool:
        """Fine-tuning (train.mode lora or finetune): keeps the best weights (results/best_<i>/) and ends
        with a summary of the figures the fine-tuning benchmarks report."""
        return self.plan.train.mode != "pretrain"


def fit_batch_at_start(ctx: JobContext, train_samples: int | None) -> JobContext:
    """The job's side of config/workload.fit_to_split, for a train split only the job reads (a cluster's
    path, the hf workload's loaded data): a batch the split cannot hold is fitted as submit fits it where
    it is the system's default (plan.batch_default), else one line (FluxClusterError) naming values that
    work. The job logs a fit with MlperfLog.batch_fit."""
    chosen = None if ctx.plan.batch_default else JOB_CHOSEN
    system, plan = fit_to_split(ctx.system, ctx.plan, train_samples, chosen)
    return dataclasses.replace(ctx, system=system, plan=plan)


@dataclass(frozen=True)
class Schedule:
    """When to evaluate and when to stop, in optimizer steps."""

    eval_every_steps: int | None
    steps_per_epoch: int | None
    """Fine-tuning: steps in one pass over the train split (an evaluation ends each epoch)."""
    max_steps: int
    target: float | None

    @classmethod
    def of(cls, plan: TrainingPlan, train_samples: int | None) -> "Schedule":
        cfg, gbs = plan.train, plan.global_batch_size
        if not plan.fine_tuning:
            assert cfg.max_samples is not None and cfg.eval_every_steps is not None
            return cls(cfg.eval_every_steps, None, math.ceil(cfg.max_samples / gbs), cfg.target)
        if not train_samples:
            raise SystemExit("error: the dataset has no train samples (.nv-meta/.info.json); encode it again")
        try:  # the job fitted a default batch already (fit_batch_at_start): a chosen one is one line
            fit_batch(train_samples, plan.world_size, gbs, cfg.micro_batch_size, chosen=JOB_CHOSEN)
        except FluxClusterError as exc:
            raise SystemExit(f"error: {exc}") from None
        per_epoch = train_samples // gbs
        return cls(cfg.eval_every_steps, per_epoch, per_epoch * plan.epochs, cfg.target)

    def evaluates_after(self, step: int) -> bool:
        return any(step % n == 0 for n in (self.eval_every_steps, self.steps_per_epoch) if n)

    def block_steps(self, step: int) -> int:
        """Steps of the training block starting after ``step``: up to the next evaluation (flux1: always
        eval_every_steps, as MLPerf logs it; fine-tuning: at most to the end of the epoch)."""
        if self.steps_per_epoch is None:
            assert self.eval_every_steps is not None
            return self.eval_every_steps
        ends = [n - step % n for n in (self.eval_every_steps, self.steps_per_epoch) if n]
        return min(ends)

    def epoch(self, step: int) -> float | None:
        return step / self.steps_per_epoch if self.steps_per_epoch else None


def eval_policy(schedule: Schedule) -> str:
    parts = [f"every {schedule.eval_every_steps} steps"] if schedule.eval_every_steps else []
    if schedule.steps_per_epoch:
        parts.append(f"every epoch ({schedule.steps_per_epoch} steps), {schedule.max_steps} steps in all")
    return "eval " + " and ".join(parts)
