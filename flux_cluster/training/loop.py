"""The training loop, top to bottom: set-up, resume, train in blocks between evaluations, stop at the
quality target (flux1) or after the epochs (fine-tuning, keeping the best weights), checkpoint on signals.
``python -m flux_cluster.train`` calls ``train`` on every rank.

One step: every rank takes micro-batches from its Energon loader (CFG dropout applied there), samples
latents and noise from its own generator, and regresses the rectified-flow velocity; gradients are
averaged by FSDP across all ranks, clipped to norm 1.0, and AdamW steps with linear warmup. Every
``eval_every_steps`` the MLPerf validation loss is computed over all of val; at or below the target
the run stops with status success. A fine-tuning workload evaluates at the end of every epoch (and every
``eval_every_steps`` if set), keeps the weights with the lowest validation loss as diffusers-loadable
``results/best_<i>/``, and ends after ``epochs`` with a checkpoint to resume from.
"""

import json
import math
import resource
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mlperf_logging.mllog import constants as c
from torch.distributed.tensor import DTensor

from data_prep.loader import train_loader, val_loader
from flux_cluster.config.schema import SystemConfig
from flux_cluster.dist import DistInfo, init_distributed
from flux_cluster.errors import FluxClusterError
from flux_cluster.jobs import NOT_CONVERGED_EXIT_CODE
from flux_cluster.jobs.signals import StopRequest, die_with_parent, finish_interrupted, under_torchrun
from flux_cluster.launch.rundir import lock_repeat
from flux_cluster.training.attention import attention_backend, probe_backend
from flux_cluster.training.checkpoint import Checkpointer, CheckpointError, from_rank0, step_of
from flux_cluster.training.flops import training_flops_per_sample
from flux_cluster.training.memory import CheckpointingChoice, resolve_checkpointing
from flux_cluster.training.mlperf_log import GRADIENT_CLIP_NORM, MlperfLog, RunFacts
from flux_cluster.training.model import (
    add_lora,
    build_model,
    load_lora_init,
    lora_metadata,
    lora_state_dict,
    predict_velocity,
    save_lora,
)
from flux_cluster.training.optimizers import build_optimizer
from flux_cluster.training.parallelize import make_mesh, parallelize
from flux_cluster.training.peak import GemmPeak, measure_gemm_peak
from flux_cluster.training.rectified_flow import interpolate, sample_latents, validation_loss
from flux_cluster.training.workload import ModelArgs, TrainingPlan


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
        base = (
            Path(self.plan.train.checkpoint_dir)
            if self.plan.train.checkpoint_dir
            else self.run_dir / "checkpoints"
        )
        return base / f"exp_{self.exp_index}"

    @property
    def metrics_file(self) -> Path:
        return self.run_dir / "results" / f"metrics_{self.exp_index}.jsonl"

    @property
    def tuning(self) -> bool:
        """Fine-tuning (train.mode lora or finetune): keeps the best weights (results/best_<i>/) and ends
        with a summary of the figures the fine-tuning benchmarks report."""
        return self.plan.train.mode != "pretrain"


@dataclass(frozen=True)
class RunClock:
    """How long a run has trained, over all its attempts: each checkpoint carries it, so a resumed run's
    time, throughput, GPU-hours and cost cover the whole run (up to the checkpoint it resumed from)."""

    train_seconds: float = 0.0
    """Wall time of the training loop (from run_start), evaluations, checkpoints and lost_seconds
    included: what GPU-hours and cost come from."""
    timed_seconds: float = 0.0
    """Time of the training steps alone (no evaluation): what images/s and the step time come from."""
    timed_steps: int = 0
    """The optimizer steps timed_seconds covers."""
    lost_seconds: float = 0.0
    """Training time after an attempt's last checkpoint, up to its last metrics record, when it ended
    without checkpointing (killed, node lost): paid for and redone, so in train_seconds, not in throughput."""
    peak_memory_gb: float = 0.0
    """The highest peak memory of any rank in any attempt."""

    def __add__(self, other: "RunClock") -> "RunClock":
        return RunClock(
            self.train_seconds + other.train_seconds,
            self.timed_seconds + other.timed_seconds,
            self.timed_steps + other.timed_steps,
            self.lost_seconds + other.lost_seconds,
            max(self.peak_memory_gb, other.peak_memory_gb),
        )

    def after_loss(self, metrics_file: Path) -> "RunClock":
        """This clock, from the checkpoint resumed from, plus the time the attempts recorded in
        metrics_file spent past it: each progress line and evaluation records the run's time so far, on
        the same timeline as the clock a checkpoint carries."""
        recorded = self.train_seconds
        if metrics_file.is_file():
            with metrics_file.open("rb") as lines:
                for line in lines:
                    if b'"train_seconds"' not in line:  # most lines are steps: no JSON parse for them
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:  # the last line of an attempt killed mid-write
                        continue
                    seconds = (record.get("clock") or record).get("train_seconds")
                    if isinstance(seconds, int | float) and math.isfinite(seconds):
                        recorded = max(recorded, seconds)
        lost = recorded - self.train_seconds
        return RunClock(
            recorded, self.timed_seconds, self.timed_steps, self.lost_seconds + lost, self.peak_memory_gb
        )


@dataclass
class Progress:
    """What a checkpoint restores besides weights: where the run is and what it has seen."""

    step: int = 0
    samples: int = 0
    evals: list[tuple[int, float]] | None = None
    """(samples, validation loss) of every evaluation so far."""
    attempt: int = 0
    """How many times this repeat was started (0: the first)."""
    best: tuple[int, float] | None = None
    """Fine-tuning: (step, validation loss) of the weights saved as best so far."""
    clock: RunClock = field(default_factory=RunClock)
    """The earlier attempts' training time, as of the checkpoint resumed from."""


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
        if train_samples < gbs:
            raise SystemExit(
                f"error: the train split has {train_samples} samples, fewer than one global batch ({gbs}): "
                f"set train.global_batch_size to at most {train_samples} (a multiple of micro-batch x ranks, "
                f"{cfg.micro_batch_size * plan.world_size})"
            )
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


def train(ctx: JobContext) -> int:
    """Run one repeat on this rank; returns the process exit code. The attention kernel choice holds for
    the whole run: forward, backward and activation recomputation."""
    if under_torchrun():  # torchrun starts ranks in their own sessions: killing its group would miss them
        die_with_parent()
    info = init_distributed(ctx.system.dist_backend)
    with attention_backend(ctx.plan.train.attention_backend, info.device):
        return _train(ctx, info)


def _train(ctx: JobContext, info: DistInfo) -> int:
    cfg, plan = ctx.plan.train, ctx.plan
    # Only SIGUSR1 asks for a requeue. (The loader's workers ignore these signals: data_prep.loader.)
    stop = StopRequest(on_sigterm=True).install()
    rank0 = info.rank == 0
    lock = _lock_repeat(ctx, info)  # held until this process exits
    checkpoints = Checkpointer(
        ctx.checkpoint_dir, cfg.keep_checkpoints, info.rank, info.world_size, frozen_base=cfg.mode == "lora"
    )
    resume_from, skipped = checkpoints.choose()
    for line in skipped:
        _say(rank0, line)
    if rank0:  # a restart, with or without a checkpoint, starts a new result log
        _set_aside_interrupted_log(ctx.result_log)
    mllog = MlperfLog(ctx.result_log, enabled=rank0, echo=False)
    train_samples = _split_size(ctx.data_dir, "train")
    schedule = Schedule.of(plan, train_samples)
    mllog.header(_run_facts(ctx, train_samples), ctx.system.mlperf.ruleset, ctx.cache_cleared)
    if schedule.target is not None:
        mllog.event("target_accuracy", value=schedule.target)  # no constant for it

    # ---- model, sharding, optimizer, data
    trainer = build_trainer(plan, info, ctx.seed, ctx.system.gpu_memory_gb)
    checkpointing_facts: dict[str, Any] = {"configured": cfg.activation_checkpointing}
    if (choice := trainer.auto_choice) is not None:
        _say(rank0, choice.describe())
        if not math.isnan(choice.estimate_gb):
            checkpointing_facts |= {"estimated_peak_gb": round(choice.estimate_gb, 1)}
    # not an MLPerf key: the mode in use, and what 'auto' estimated
    mllog.event("activation_checkpointing", value=trainer.checkpointing, metadata=checkpointing_facts)
    model, params, optimizer, scheduler = trainer.model, trainer.params, trainer.optimizer, trainer.scheduler
    dtype, warmup = trainer.dtype, plan.warmup_steps
    loader = plan_loader(plan, ctx.data_dir, info, ctx.seed)
    generator = step_generator(info, ctx.seed)

    progress = Progress(evals=[])
    if resume_from is not None:
        try:
            shared, mine = checkpoints.load(resume_from, model, optimizer)
        except CheckpointError as exc:
            raise SystemExit(f"error: {exc}") from None
        scheduler.load_state_dict(shared["scheduler"])
        best = shared.get("best")
        # Checkpoints from before the clock have none. One reader of the metrics file, for every rank.
        clock = RunClock(**shared.get("clock", {})).after_loss(ctx.metrics_file) if rank0 else None
        progress = Progress(
            shared["step"],
            shared["samples"],
            [tuple(e) for e in shared["evals"]],
            shared["attempt"] + 1,
            (int(best[0]), float(best[1])) if best else None,
            from_rank0(clock),
        )
        generator.set_state(mine["generator"])
        torch.set_rng_state(mine["torch_rng"])
        loader.restore_state_rank(mine["loader"])
        mllog.event("resumed_from_checkpoint", value=progress.samples, metadata={"step": progress.step})
        _say(rank0, f"resumed from {resume_from} at step {progress.step} ({progress.samples:,} samples)")

    model_args = ModelArgs.of(model.config)  # a pretrained checkpoint's own shape, not the preset's
    image_tokens, text_tokens = token_counts(ctx.data_dir, model_args, plan.train.model)
    facts = measure_facts(
        ctx.system, plan, info, dtype, model_args, image_tokens, text_tokens, ctx.config_filename
    )
    meter = _Meter(ctx, info, facts.flops_per_sample, facts.peak.tflops, facts.kernel, progress.clock)
    tensorboard = _tensorboard(ctx) if rank0 and cfg.tensorboard else None
    _say(
        rank0,
        f"{plan.train.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"{len(params)} trainable tensors), {info.world_size} ranks "
        f"({plan.dp_replicate} x {plan.dp_shard} HSDP), global batch {plan.global_batch_size} = "
        f"{cfg.micro_batch_size} x {info.world_size} x {plan.grad_accum_steps}, "
        f"{cfg.optimizer} lr {plan.learning_rate:g}, warmup {warmup}, {_eval_policy(schedule)}",
    )
    mllog.end(c.INIT_STOP)
    mllog.start(c.RUN_START)
    meter.start()  # this attempt's training time runs from run_start, as the log's run time

    # ---- train, in blocks between evaluations
    batches = iter(loader)
    stop_poll = _StopPoll(stop, cfg.checkpoint_every_minutes * 60 if rank0 else 0)
    saved_period = 0
    model.train()
    finished = "success" if plan.fine_tuning else "aborted"  # what reaching max_steps means
    status = None if progress.step < schedule.max_steps else finished  # resumed after the last step
    in_block = False
    tuning = ctx.tuning
    while status is None:
        if not in_block:  # also right after a resume in the middle of a block
            block_samples = schedule.block_steps(progress.step) * plan.global_batch_size
            mllog.start(c.BLOCK_START, metadata={"samples_count": block_samples, "step": progress.step})
            in_block = True
        loss, grad_norm, data_wait = train_step(trainer, batches, generator, plan, info)
        scheduler.step()
        progress.step += 1
        progress.samples += plan.global_batch_size
        # Fine-tuning: a progress line before every evaluation too (an epoch can be shorter than
        # log_every_steps), so each epoch's throughput, time and cost are shown.
        line = tuning and schedule.evaluates_after(progress.step)
        meter.record(progress, loss, grad_norm, data_wait, scheduler.get_last_lr()[0], tensorboard, line)

        if schedule.evaluates_after(progress.step):
            mllog.end(c.BLOCK_STOP, metadata={"samples_count": block_samples, "step": progress.step})
            in_block = False
            meter.pause()
            epoch = schedule.epoch(progress.step)
            eval_loss = _evaluate(model, ctx, info, dtype, mllog, progress, epoch)
            better = progress.best is None or eval_loss < progress.best[1]
            if tuning and math.isfinite(eval_loss) and better:
                progress.best = (progress.step, eval_loss)
                _save_weights(
                    model, ctx, info, f"best_{ctx.exp_index}", f"best (validation loss {eval_loss:.4f})"
                )
            meter.record_eval(progress, eval_loss, epoch, tensorboard)
            if schedule.target is not None and eval_loss <= schedule.target:
                status = "success"
        if status is None and progress.step >= schedule.max_steps:
            status = finished
        agreed = stop_poll.poll() if status is None else _Agreed(False, False, 0)
        if agreed.requested:
            meter.flush()
            stop_poll.close()
            _save(checkpoints, progress, meter.clock(), model, optimizer, scheduler, generator, loader)
            mllog.run_stop(success=False, samples=progress.samples)
            mllog.close()
            _say(
                rank0, f"stopped by a signal at step {progress.step}: checkpointed to {checkpoints.latest()}"
            )
            return finish_interrupted(info.rank, requeue=agreed.requeue)
        every_steps = cfg.checkpoint_every_steps
        if status is None and (
            (every_steps and progress.step % every_steps == 0) or agreed.period > saved_period
        ):
            saved_period = agreed.period
            _save(checkpoints, progress, meter.clock(), model, optimizer, scheduler, generator, loader)

    # ---- finish
    meter.flush()
    stop_poll.close()
    mllog.run_stop(success=status == "success", samples=progress.samples)
    mllog.close()
    if tuning:  # the last state, to resume from or train further (the best weights are saved already)
        latest = checkpoints.latest()
        if latest is None or step_of(latest) != progress.step:
            _save(checkpoints, progress, meter.clock(), model, optimizer, scheduler, generator, loader)
        meter.summary(progress, schedule, cfg.optimizer, tensorboard)
    del lock
    if tensorboard is not None:
        tensorboard.close()
    last = progress.evals[-1][1] if progress.evals else float("nan")
    _say(rank0, f"run_stop {status}: validation loss {last:.4f} after {progress.samples:,} samples")
    dist.destroy_process_group()
    return NOT_CONVERGED_EXIT_CODE if status == "aborted" and cfg.mode == "pretrain" else 0


@dataclass
class Trainer:
    """The model as it trains: sharded, compiled, with its optimizer and learning-rate schedule."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    dtype: torch.dtype
    checkpointing: str = "full"
    """The activation checkpointing mode in use ('auto' resolved)."""
    auto_choice: CheckpointingChoice | None = None
    """How 'auto' chose it (None for a configured mode)."""


def build_trainer(
    plan: TrainingPlan, info: DistInfo, seed: int, gpu_memory_gb: float | None = None
) -> Trainer:
    """The model (random init, or pretrained with LoRA adapters), sharded by FSDP2 with checkpointing and
    compile per block, its optimizer and linear warmup. The same on every rank: seeded before init.
    ``gpu_memory_gb`` (the system's) is what checkpointing 'auto' fits into."""
    cfg = plan.train
    dtype = getattr(torch, cfg.param_dtype)
    checkpointing, choice = resolve_checkpointing(plan, gpu_memory_gb)
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = build_model(plan.model_args, cfg.pretrained_path if cfg.mode != "pretrain" else None)
    if cfg.mode == "lora":
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
        if cfg.lora_init:
            try:
                load_lora_init(model, Path(cfg.lora_init), cfg.lora_rank, cfg.lora_targets)
            except FluxClusterError as exc:
                raise SystemExit(f"error: {exc}") from None
    mesh = make_mesh(info.device, plan.dp_replicate, plan.dp_shard)
    parallelize(
        model,
        mesh,
        info.device,
        param_dtype=dtype,
        activation_checkpointing=checkpointing,
        compile_blocks=cfg.compile,
        precision=cfg.precision,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(cfg.optimizer, params, plan.learning_rate, info.device)
    warmup = plan.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
    )
    return Trainer(model, params, optimizer, scheduler, dtype, checkpointing, choice)


def plan_loader(plan: TrainingPlan, data_dir: Path, info: DistInfo, seed: int) -> Any:
    """This rank's Energon loader of the train split, as the plan sets it (micro-batch, workers, CFG)."""
    cfg = plan.train
    return train_loader(
        data_dir,
        batch_size=cfg.micro_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        seed=seed,
        num_workers=cfg.loader_workers,
        cfg_dropout=cfg.cfg_dropout,
    )


def step_generator(info: DistInfo, seed: int) -> torch.Generator:
    """Each rank draws its own latents, noise and times (a distinct seed per data-parallel rank)."""
    return torch.Generator(info.device).manual_seed(seed * 100_003 + info.rank)


@dataclass(frozen=True)
class MeasuredFacts:
    """What throughput figures are computed from: FLOPs per sample, the attention kernel, the GEMM peak."""

    flops_per_sample: float
    kernel: str
    peak: GemmPeak
    """The measured dense-matmul TFLOP/s of this device."""


def measure_facts(
    system: SystemConfig,
    plan: TrainingPlan,
    info: DistInfo,
    dtype: torch.dtype,
    model_args: ModelArgs,
    image_tokens: int,
    text_tokens: int,
    config_filename: str,
) -> MeasuredFacts:
    """Probe the attention kernel at the run's shapes (a bad train.attention_backend is one line) and
    measure the GEMM peak; rank 0 says both."""
    cfg = plan.train
    try:
        kernel = probe_backend(
            cfg.attention_backend,
            info.device,
            dtype,
            model_args.num_attention_heads,
            model_args.attention_head_dim,
            image_tokens + text_tokens,
        )
    except RuntimeError as exc:
        raise SystemExit(f"{config_filename}: {exc}") from None
    peak = measure_gemm_peak(info.device, dtype)
    _say(
        info.rank == 0,
        f"attention kernel: {kernel} (train.attention_backend {cfg.attention_backend}); measured "
        f"{peak.dtype} GEMM peak {peak.tflops:.3g} TFLOP/s at {'x'.join(map(str, peak.shape))} "
        f"(datasheet: {system.peak_bf16_tflops:g})",
    )
    flops = training_flops_per_sample(model_args.shape(), image_tokens, text_tokens)
    return MeasuredFacts(flops, kernel, peak)


def train_step(
    trainer: Trainer,
    batches: Any,
    generator: torch.Generator,
    plan: TrainingPlan,
    info: DistInfo,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One optimizer step over grad_accum_steps micro-batches; returns (mean loss, gradient norm, seconds
    spent waiting for the loader)."""
    model, optimizer = trainer.model, trainer.optimizer
    accumulate = plan.grad_accum_steps
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=info.device)
    data_wait = 0.0
    for micro in range(accumulate):
        waited = time.perf_counter()
        batch = next(batches)
        data_wait += time.perf_counter() - waited
        model.set_requires_gradient_sync(micro == accumulate - 1)  # type: ignore[operator]
        mean = batch.mean.to(info.device, non_blocking=True)
        logvar = batch.logvar.to(info.device, non_blocking=True)
        eps = torch.randn(mean.shape, generator=generator, device=info.device)
        noise = torch.randn(mean.shape, generator=generator, device=info.device)
        t = torch.rand(mean.shape[0], generator=generator, device=info.device)
        x_t, target = interpolate(sample_latents(mean, logvar, eps), noise, t)
        prediction = predict_velocity(
            model,
            x_t,
            t,
            batch.t5.to(info.device, non_blocking=True),
            batch.clip.to(info.device, non_blocking=True),
            trainer.dtype,
            plan.train.guidance_scale,
        )
        loss = F.mse_loss(prediction.float(), target)
        (loss / accumulate).backward()
        total += loss.detach() / accumulate
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.params, GRADIENT_CLIP_NORM)
    optimizer.step()
    return total, grad_norm, data_wait


def _evaluate(
    model: torch.nn.Module,
    ctx: JobContext,
    info: DistInfo,
    dtype: torch.dtype,
    mllog: MlperfLog,
    progress: Progress,
    epoch: float | None = None,
) -> float:
    """The MLPerf validation loss over all of val, logged as eval_accuracy."""
    meta = {"samples_count": progress.samples, "step": progress.step}
    mllog.start(c.EVAL_START, metadata=meta)
    model.eval()
    batches = val_loader(
        ctx.data_dir,
        batch_size=ctx.plan.train.eval_batch_size or ctx.plan.train.micro_batch_size,
        rank=info.rank,
        world_size=info.world_size,
    )
    loss, _ = validation_loss(
        lambda x_t, t, t5, clip: predict_velocity(
            model, x_t, t, t5, clip, dtype, ctx.plan.train.guidance_scale
        ),
        batches,
        info.device,
        spare=lambda: next(iter(val_loader(ctx.data_dir, batch_size=1, rank=0, world_size=1))),
    )
    model.train()
    mllog.eval_accuracy(loss, progress.samples, epoch)
    mllog.end(c.EVAL_STOP, metadata=meta)
    assert progress.evals is not None
    progress.evals.append((progress.samples, loss))
    return loss


def _save(
    checkpoints: Checkpointer,
    progress: Progress,
    clock: RunClock,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
    loader: Any,
) -> None:
    shared = {
        "samples": progress.samples,
        "evals": progress.evals,
        "attempt": progress.attempt,
        "best": progress.best,
        "clock": asdict(clock),
        "scheduler": scheduler.state_dict(),
    }
    mine = {
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "loader": loader.save_state_rank(),
    }
    checkpoints.save(progress.step, model, optimizer, shared, mine)


def _save_weights(model: torch.nn.Module, ctx: JobContext, info: DistInfo, name: str, what: str) -> None:
    """Fine-tuning output in results/<name>: the LoRA adapter (diffusers format), or the full transformer
    (save_pretrained). A collective: every rank calls it; rank 0 writes, then renames into place."""
    out = ctx.run_dir / "results" / name
    partial = out.with_name(out.name + ".partial")
    if ctx.plan.train.mode == "lora":
        state = lora_state_dict(model)
        if info.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            path = save_lora(state, lora_metadata(model), partial)
            _commit(partial, out)
            _say(True, f"{what}: LoRA adapter {out / path.name}")
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank == 0:
        plain = build_model(ModelArgs.of(model.config))
        plain.load_state_dict(full)
        shutil.rmtree(partial, ignore_errors=True)
        plain.save_pretrained(partial)
        _commit(partial, out)
        _say(True, f"{what}: transformer {out}")


def _commit(partial: Path, final: Path) -> None:
    """partial replaces final; the old final is removed only after, so a crash never leaves neither."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _lock_repeat(ctx: JobContext, info: DistInfo) -> IO[str] | None:
    """Rank 0 locks this repeat of the run, so an attempt whose ranks outlived their launcher and a new
    one never write it at once; all ranks stop (one line, exit 1) when another attempt holds it."""
    lock, refused = None, None
    if info.rank == 0:
        try:
            lock = lock_repeat(ctx.run_dir, ctx.exp_index)
        except FluxClusterError as exc:
            refused = str(exc)
    verdict = [refused]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise SystemExit(f"error: {verdict[0]}" if info.rank == 0 else 1)
    return lock


def _set_aside_interrupted_log(result_log: Path) -> None:
    """Every attempt starts a new result log (one run_start each); an earlier attempt's log moves aside."""
    if not result_log.exists():
        return
    folder = result_log.parent / "interrupted"
    folder.mkdir(exist_ok=True)
    attempt = len(list(folder.glob(f"{result_log.stem}.attempt*.txt")))
    result_log.rename(folder / f"{result_log.stem}.attempt{attempt}.txt")


def _run_facts(ctx: JobContext, train_samples: int | None) -> RunFacts:
    from flux_cluster.mlperf_rules import closed_division_deviations
    from flux_cluster.training.workload import load_workload

    cfg, system, mlperf = ctx.plan.train, ctx.system, ctx.plan.mlperf
    precision = "bfloat16" if cfg.param_dtype == "bfloat16" else "fp32"
    eval_samples = _split_size(ctx.data_dir, "val")
    deviations = []
    if mlperf is not None:
        train_samples = train_samples or mlperf.train_samples
        eval_samples = eval_samples or mlperf.eval_samples
        deviations = closed_division_deviations(
            cfg.model_dump(),
            mlperf.model_dump(),
            load_workload(cfg.benchmark)[0].batch_presets.keys(),
            train_samples,
            eval_samples,
        )
    return RunFacts(
        submission_org=system.mlperf.submission_org,
        submission_platform=system.name,
        global_batch_size=ctx.plan.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        learning_rate=ctx.plan.learning_rate,
        warmup_steps=ctx.plan.warmup_steps,
        train_samples=train_samples or 0,
        eval_samples=eval_samples or 0,
        config_filename=ctx.config_filename,
        division="closed" if cfg.mode == "pretrain" else "open",
        gradient_accumulation_steps=ctx.plan.grad_accum_steps,
        precision_linear="fp8" if cfg.precision == "fp8" else precision,
        precision_attn=precision,
        precision_comm=precision,
        seed=ctx.seed,
        eval_every_steps=cfg.eval_every_steps,
        deviations=tuple(deviations),
        optimizer=cfg.optimizer,
        benchmark="flux1" if mlperf is not None else cfg.benchmark,
    )


def _split_size(root: Path, split: str) -> int | None:
    """Samples in a split, from Energon's metadata (.nv-meta/.info.json)."""
    try:
        counts = json.loads((root / ".nv-meta" / ".info.json").read_text())["shard_counts"]
    except (OSError, ValueError, KeyError):
        return None
    return sum(n for name, n in counts.items() if name.startswith(f"{split}/")) or None


def token_counts(data_dir: Path, args: ModelArgs, model_name: str) -> tuple[int, int]:
    """(image tokens, text tokens) of this dataset, from one val sample, checked against the model."""
    batch = next(iter(val_loader(data_dir, batch_size=1, rank=0, world_size=1)))
    if batch.t5.shape[-1] != args.joint_attention_dim or batch.clip.shape[-1] != args.pooled_projection_dim:
        raise SystemExit(
            f"{data_dir}: T5 width {batch.t5.shape[-1]} and CLIP width {batch.clip.shape[-1]} do not fit "
            f"model {model_name!r} (joint_attention_dim {args.joint_attention_dim}, "
            f"pooled_projection_dim {args.pooled_projection_dim}); choose another train.model or dataset"
        )
    height, width = batch.mean.shape[-2:]
    return (height // 2) * (width // 2), batch.t5.shape[1]


class _Agreed(NamedTuple):
    requested: bool
    """A stop was asked on some rank (a signal)."""
    requeue: bool
    """SIGUSR1 asked for it: the job script requeues the job."""
    period: int
    """Whole train.checkpoint_every_minutes periods since training started, by rank 0's clock."""


class _StopPoll:
    """Whether any rank was signalled, and whether a timed checkpoint is due, agreed by all ranks without
    syncing the GPU: the flags go through a host-side gloo group, and each poll reads the all-reduce the
    previous poll started (one step late), so the CPU keeps queueing GPU work ahead instead of waiting
    for it every step. Only rank 0's clock counts (every_s 0 elsewhere): ranks' clocks differ, and a
    checkpoint is collective."""

    def __init__(self, stop: StopRequest, every_s: float) -> None:
        self.stop = stop
        self.every_s = every_s
        self.start = time.monotonic()
        self.group = dist.new_group(backend="gloo")
        self.flags = torch.zeros(3, dtype=torch.int64)
        self.pending: Any = None

    def poll(self) -> _Agreed:
        """What any rank asked for, as of the previous poll."""
        agreed = _Agreed(False, False, 0)
        if self.pending is not None:
            self.pending.wait()
            agreed = _Agreed(bool(self.flags[0]), bool(self.flags[1]), int(self.flags[2]))
        period = int((time.monotonic() - self.start) // self.every_s) if self.every_s else 0
        self.flags = torch.tensor([int(self.stop.requested), int(self.stop.requeue), period])
        self.pending = dist.all_reduce(self.flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return agreed

    def close(self) -> None:
        if self.pending is not None:
            self.pending.wait()
        dist.destroy_process_group(self.group)


def _eval_policy(schedule: Schedule) -> str:
    parts = [f"every {schedule.eval_every_steps} steps"] if schedule.eval_every_steps else []
    if schedule.steps_per_epoch:
        parts.append(f"every epoch ({schedule.steps_per_epoch} steps), {schedule.max_steps} steps in all")
    return "eval " + " and ".join(parts)


def _say(enabled: bool, message: str) -> None:
    if enabled:
        print(f"[train] {message}", flush=True)


def _tensorboard(ctx: JobContext) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(ctx.run_dir / "tensorboard" / f"exp_{ctx.exp_index}"))


class _Meter:
    """Progress lines every log_every_steps (rank 0), TensorBoard scalars and the metrics file; the run's
    clock (training time, timed steps), carried over from the attempts before a resume."""

    def __init__(
        self,
        ctx: JobContext,
        info: DistInfo,
        flops_per_sample: float,
        measured_peak_tflops: float,
        attention_kernel: str,
        carried: RunClock,
    ) -> None:
        self.ctx, self.info, self.flops_per_sample = ctx, info, flops_per_sample
        self.peak_tflops = ctx.system.peak_bf16_tflops
        self.measured_peak_tflops = measured_peak_tflops
        self.carried = carried
        """The earlier attempts' clock, from the checkpoint resumed from."""
        self.started = self.window_start = time.perf_counter()
        self.window_paused_s = 0.0
        """Time inside the window spent evaluating: not training throughput."""
        self.timed_s, self.timed_steps = 0.0, 0
        """Training time and steps of the closed windows: the run's throughput."""
        self.window_steps = 0
        self.window_data_wait = 0.0
        self.window_loss = torch.zeros((), dtype=torch.float64, device=info.device)
        self.warmed_up = False
        """An attempt's first step (compilation, allocator and kernel warm-up) is not throughput."""
        self.pending: list[tuple[int, int, torch.Tensor, torch.Tensor, float, float]] = []
        self.last_grad_norm = math.nan
        if info.rank == 0:
            ctx.metrics_file.parent.mkdir(parents=True, exist_ok=True)
            _end_partial_line(ctx.metrics_file)
        # First record of each attempt: what 'flux-cluster report' needs for MFU.
        self._write(
            {
                "flops_per_sample": flops_per_sample,
                "world_size": info.world_size,
                "peak_tflops": self.peak_tflops,
                "measured_peak_tflops": measured_peak_tflops,
                "attention_kernel": attention_kernel,
            }
        )

    def _write(self, record: dict[str, Any]) -> None:
        if self.info.rank == 0:
            with self.ctx.metrics_file.open("a") as out:
                out.write(json.dumps(record) + "\n")

    def start(self) -> None:
        """At run_start: this attempt's clock and its first throughput window start now."""
        self.started = self.window_start = time.perf_counter()

    def train_seconds(self) -> float:
        """The whole run's training time so far, earlier attempts included."""
        return self.carried.train_seconds + time.perf_counter() - self.started

    def clock(self) -> RunClock:
        """The whole run's clock now (what a checkpoint carries), the open throughput window included. A
        collective (the peak memory of every rank): every rank calls it."""
        window = self._window_seconds() if self.window_steps else 0.0
        # on the device: NCCL reduces CUDA tensors only
        memory = torch.tensor(
            [_peak_memory_gb(self.info.device)], dtype=torch.float64, device=self.info.device
        )
        dist.all_reduce(memory, op=dist.ReduceOp.MAX)
        return self.carried + RunClock(
            time.perf_counter() - self.started,
            self.timed_s + window,
            self.timed_steps + self.window_steps,
            peak_memory_gb=memory.item(),
        )

    def cost(self, seconds: float) -> tuple[float, float | None]:
        """(GPU-hours, USD) of training for seconds on every rank; USD None without the system's price."""
        gpu_hours = seconds / 3600 * self.info.world_size
        price = self.ctx.system.price_per_gpu_hour
        return gpu_hours, gpu_hours * price if price else None

    def _time_and_cost(self, seconds: float) -> tuple[str, list[tuple[str, float]]]:
        """The run's time, GPU-hours and cost so far, as progress-line text and TensorBoard scalars."""
        gpu_hours, usd = self.cost(seconds)
        text = f"{seconds:,.1f} s, {gpu_hours:.3g} GPU-h" + (f", ${usd:,.2f}" if usd is not None else "")
        scalars = [("time/train_seconds", seconds), ("time/gpu_hours", gpu_hours)]
        return text, scalars + ([("time/cost_usd", usd)] if usd is not None else [])

    def record(
        self,
        progress: Progress,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        data_wait: float,
        lr: float,
        tb: Any,
        line: bool = False,
    ) -> None:
        """One step; a progress line every log_every_steps, and when line is set. The first step of an
        attempt is recorded but not timed: the throughput window starts after it."""
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()  # may be Partial; at most a collective, no host sync
        # Kept on the device until the next progress line: reading them now would wait for the GPU.
        self.pending.append(
            (progress.step, progress.samples, loss.detach(), grad_norm.detach(), lr, data_wait)
        )
        if not self.warmed_up:
            self.warmed_up = True
            self._window_seconds()  # waits for the step's GPU work
            self._new_window()
            return
        self.window_steps += 1
        self.window_loss += loss.double()
        self.window_data_wait += data_wait
        if progress.step % self.ctx.plan.train.log_every_steps and not line:
            return
        self.flush()
        grad_norm = self.last_grad_norm
        mean_loss = self.window_loss.clone()
        dist.all_reduce(mean_loss)
        mean_loss = mean_loss.item() / self.window_steps / self.info.world_size
        elapsed = self._window_seconds()
        step_time = elapsed / self.window_steps
        samples_per_s = self.ctx.plan.global_batch_size / step_time
        tflops = self.flops_per_sample * samples_per_s / self.info.world_size / 1e12
        mfu = tflops / self.peak_tflops if self.peak_tflops else math.nan
        mfu_measured = tflops / self.measured_peak_tflops if self.measured_peak_tflops else math.nan
        data_wait_ms = self.window_data_wait / self.window_steps * 1000
        memory = _peak_memory_gb(self.info.device)
        seconds = self.train_seconds()
        so_far, time_scalars = self._time_and_cost(seconds)
        self._write({"clock": {"train_seconds": seconds}})  # how far a killed attempt got (after_loss)
        if self.info.rank == 0:
            unit = "images/s" if self.ctx.tuning else "samples/s"  # a fine-tuning sample is one image
            print(
                f"step {progress.step:>6} | samples {progress.samples:>11,} | loss {mean_loss:.4f} | "
                f"{samples_per_s:8.1f} {unit} | step {step_time * 1000:7.1f} ms | "
                f"data wait {data_wait_ms:6.1f} ms | {tflops:7.2f} TFLOP/s/GPU | MFU {mfu:6.1%} "
                f"({mfu_measured:.1%} of measured peak) | lr {lr:.3g} | peak mem {memory:.2f} GB | {so_far}",
                flush=True,
            )
        if tb is not None:
            for name, value in (
                ("train/loss", mean_loss),
                ("train/samples_per_s", samples_per_s),
                ("train/step_time_ms", step_time * 1000),
                ("train/tflops_per_gpu", tflops),
                ("train/mfu", mfu),
                ("train/mfu_measured_peak", mfu_measured),
                ("train/data_wait_ms", data_wait_ms),
                ("train/lr", lr),
                ("train/grad_norm", grad_norm),
                ("train/peak_memory_gb", memory),
                *time_scalars,
            ):
                tb.add_scalar(name, value, progress.samples)
        self.timed_s += elapsed
        self.timed_steps += self.window_steps
        self._new_window()

    def _new_window(self) -> None:
        self.window_start, self.window_steps, self.window_data_wait = time.perf_counter(), 0, 0.0
        self.window_paused_s = 0.0
        self.window_loss.zero_()

    def flush(self) -> None:
        """Write the per-step records kept since the last flush (one device sync for all of them)."""
        if not self.pending:
            return
        losses = torch.stack([p[2] for p in self.pending]).tolist()
        norms = torch.stack([p[3].float() for p in self.pending]).tolist()
        self.last_grad_norm = norms[-1]
        for (step, samples, _, _, lr, data_wait), loss, norm in zip(self.pending, losses, norms, strict=True):
            self._write(
                {
                    "step": step,
                    "samples": samples,
                    "loss": loss,
                    "grad_norm": norm,
                    "lr": lr,
                    "data_wait_s": data_wait,
                }
            )
        self.pending.clear()

    def _window_seconds(self) -> float:
        """Training seconds in the current window, the GPU's work included."""
        if self.info.device.type == "cuda":
            torch.cuda.synchronize(self.info.device)
        return time.perf_counter() - self.window_start - self.window_paused_s

    def pause(self) -> None:
        """Before an evaluation: what follows until record_eval is not training time."""
        if self.info.device.type == "cuda":
            torch.cuda.synchronize(self.info.device)
        self.paused_at = time.perf_counter()

    def record_eval(self, progress: Progress, loss: float, epoch: float | None, tb: Any) -> None:
        self.window_paused_s += time.perf_counter() - self.paused_at
        self.flush()
        seconds = self.train_seconds()
        record: dict[str, Any] = {
            "step": progress.step,
            "samples": progress.samples,
            "eval_loss": loss,
            "train_seconds": seconds,
        }
        shown = ""
        if epoch is not None:
            record["epoch"] = round(epoch, 4)
            shown = f" | epoch {epoch:g}"
        self._write(record)
        if self.info.rank == 0:
            print(
                f"eval  {progress.step:>6} | samples {progress.samples:>11,}{shown} | "
                f"validation loss {loss:.4f} | {seconds:,.1f} s",
                flush=True,
            )
        if tb is not None:
            tb.add_scalar("eval/loss", loss, progress.samples)
            if epoch is not None and epoch.is_integer():  # the per-epoch curve, by epoch
                tb.add_scalar("eval/loss_per_epoch", loss, int(epoch))
            tb.flush()

    def summary(self, progress: Progress, schedule: "Schedule", optimizer: str, tb: Any) -> None:
        """Fine-tuning: the figures the fine-tuning benchmarks report, as the metrics file's last record,
        TensorBoard's summary/ scalars and one line. Whole-run figures: a resumed run's earlier attempts
        count (their clock came with the checkpoint). Throughput counts training steps only (no
        evaluation, no set-up)."""
        clock = self.clock()
        gbs = self.ctx.plan.global_batch_size
        images_per_s = clock.timed_steps * gbs / clock.timed_seconds if clock.timed_seconds else math.nan
        step_ms = clock.timed_seconds / clock.timed_steps * 1000 if clock.timed_steps else math.nan
        evals = progress.evals or []
        best_step, best_loss = progress.best or (0, math.nan)
        wall_s = clock.train_seconds
        gpu_hours, usd = self.cost(wall_s)
        price = self.ctx.system.price_per_gpu_hour
        summary = {
            "images_per_s": images_per_s,
            "step_time_ms": step_ms,
            "timed_steps": clock.timed_steps,  # what those two are measured over, every attempt's
            "train_seconds": wall_s,
            "lost_seconds": clock.lost_seconds,  # of train_seconds: past a killed attempt's last checkpoint
            "gpu_hours": gpu_hours,
            "price_per_gpu_hour": price or None,
            "cost_usd": usd,
            "attempts": progress.attempt + 1,
            "epochs": round(schedule.epoch(progress.step) or 0, 4),
            "steps": progress.step,
            "samples": progress.samples,
            "best_eval_loss": best_loss,
            "best_step": best_step,
            "final_eval_loss": evals[-1][1] if evals else math.nan,
            "peak_memory_gb": clock.peak_memory_gb,  # every rank's, every attempt's
            "world_size": self.info.world_size,
            "optimizer": optimizer,
        }
        self._write({"summary": summary})
        cost = f", ${usd:,.2f} at ${price:g}/GPU-hour" if usd is not None else ""
        attempts = f" ({progress.attempt + 1} attempts)" if progress.attempt else ""
        if clock.lost_seconds:
            attempts = f" ({progress.attempt + 1} attempts, {clock.lost_seconds:,.1f} s of them redone)"
        line = (
            f"fine-tuned {summary['epochs']:g} epochs in {wall_s:,.1f} s{attempts}: {images_per_s:,.1f} "
            f"images/s, step {step_ms:,.1f} ms, best validation loss {best_loss:.4f} (step {best_step}), "
            f"final {summary['final_eval_loss']:.4f}, peak memory {summary['peak_memory_gb']:.2f} GB, "
            f"{gpu_hours:.4g} GPU-hours{cost}"
        )
        _say(self.info.rank == 0, line)
        if tb is not None:
            for name, value in summary.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    tb.add_scalar(f"summary/{name}", value, progress.samples)
            tb.add_text("summary", line, progress.samples)
            tb.flush()


def _end_partial_line(path: Path) -> None:
    """An attempt killed mid-write left a partial last line: end it, so the next record is a line."""
    if not path.is_file():
        return
    with path.open("rb+") as file:
        if file.seek(0, 2) == 0:
            return
        file.seek(-1, 2)
        if file.read(1) != b"\n":
            file.write(b"\n")


def _peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB: process peak RSS
