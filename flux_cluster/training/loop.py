"""The training loop, top to bottom: set-up, resume, train in blocks between evaluations, stop at the
quality target (flux1) or after the epochs (fine-tuning, keeping the best weights), checkpoint on signals.
``python -m flux_cluster.jobs.train`` calls ``train`` on every rank.

One step: every rank takes micro-batches from its Energon loader (CFG dropout applied there), samples
latents and noise from its own generator, and regresses the rectified-flow velocity; gradients are
averaged by FSDP across all ranks, clipped to norm 1.0, and AdamW steps with linear warmup. Every
``eval_every_steps`` the MLPerf validation loss is computed over all of val; at or below the target
the run stops with status success. A fine-tuning workload evaluates at the end of every epoch (and every
``eval_every_steps`` if set), keeps the weights with the lowest validation loss as diffusers-loadable
``results/best_<i>/``, and ends after ``epochs`` with a checkpoint to resume from.

What the loop uses lives beside it: the job and its schedule (context.py), the model, data and measured
facts (trainer.py), the meter and clocks (metrics.py), the state kept across attempts (resume.py), and
the agreed stop (stop_poll.py).
"""

import gc
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mlperf_logging.mllog import constants as c

from flux_cluster.config.workload import ModelArgs, TrainingPlan
from flux_cluster.data.loader import val_loader
from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import best_weights_name
from flux_cluster.runtime.dist import DistInfo, init_distributed, refusal
from flux_cluster.runtime.exit_codes import NOT_CONVERGED_EXIT_CODE
from flux_cluster.runtime.signals import StopRequest, die_with_parent, finish_interrupted, under_torchrun
from flux_cluster.training.attention import attention_backend
from flux_cluster.training.checkpoint import Checkpointer, step_of
from flux_cluster.training.context import JobContext, Schedule, eval_policy, fit_batch_at_start
from flux_cluster.training.kontext import control_tokens, velocity_predictor
from flux_cluster.training.meter import Meter, RunEnd
from flux_cluster.training.metrics import Progress, Totals, open_tensorboard, say
from flux_cluster.training.mlperf_log import GRADIENT_CLIP_NORM, MlperfLog
from flux_cluster.training.model import predict_velocity
from flux_cluster.training.quantized_base import logical_parameter_count, summary_facts
from flux_cluster.training.rectified_flow import interpolate, sample_latents, validation_loss
from flux_cluster.training.resume import (
    lock_repeat_or_exit,
    restore,
    save_state,
    save_weights,
    set_aside_interrupted_log,
)
from flux_cluster.training.stop_poll import Agreed, StopPoll
from flux_cluster.training.trainer import (
    Trainer,
    build_trainer,
    measure_facts,
    plan_loader,
    run_facts,
    split_size,
    step_generator,
    token_counts,
)


def train(ctx: JobContext) -> int:
    """Run one repeat on this rank; returns the process exit code. The attention kernel choice holds for
    the whole run: forward, backward and activation recomputation."""
    if under_torchrun():  # torchrun starts ranks in their own sessions: killing its group would miss them
        die_with_parent()
    info = init_distributed(ctx.system.dist_backend)
    with attention_backend(ctx.plan.train.attention_backend, info.device):
        return _train(ctx, info)


@dataclass
class _Run:
    """One attempt, set up: what the loop trains, logs, meters and checkpoints."""

    ctx: JobContext
    info: DistInfo
    schedule: Schedule
    mllog: MlperfLog
    checkpoints: Checkpointer
    trainer: Trainer
    loader: Any
    generator: torch.Generator
    progress: Progress
    meter: Meter
    tensorboard: Any

    def save(self) -> None:
        """A checkpoint of the whole state. A collective (the meter's clock): every rank calls it."""
        t = self.trainer
        with self.meter.window.paused():  # the save's time is not training throughput
            clock = self.meter.clock()
            save_state(
                self.checkpoints,
                self.progress,
                clock,
                t.model,
                t.optimizer,
                t.scheduler,
                self.generator,
                self.loader,
            )


def _train(ctx: JobContext, info: DistInfo) -> int:
    # Only SIGUSR1 asks for a requeue. (The loader's workers ignore these signals: flux_cluster.data.loader.)
    stop = StopRequest(on_sigterm=True).install()
    lock = lock_repeat_or_exit(ctx, info)  # held until this process exits
    run = _set_up(ctx, info)
    ctx = run.ctx  # its batch fitted to the train split where that was the system's default
    run.mllog.end(c.INIT_STOP)
    run.mllog.start(c.RUN_START)
    run.meter.start()  # this attempt's training time runs from run_start, as the log's run time

    gc_paused = pause_gc_on_cpu(info.device)
    try:
        status = _train_blocks(run, stop, gc_paused)
    finally:
        if gc_paused:
            gc.unfreeze()
            gc.enable()
    if isinstance(status, int):  # a signal stopped it, checkpointed: the exit code
        return status

    # ---- finish
    progress = run.progress
    run.mllog.run_stop(success=status == "success", samples=progress.samples)
    run.mllog.close()
    if ctx.tuning:  # the last state, to resume from or train further (the best weights are saved already)
        latest = run.checkpoints.latest()
        if latest is None or step_of(latest) != progress.step:
            run.save()
        evals = [loss for _, loss in progress.evals or []]
        epoch = run.schedule.epoch(progress.step) or 0.0
        facts = summary_facts(run.trainer.base, run.trainer.parameter_bytes)
        end = RunEnd(
            progress.step, progress.samples, epoch, evals, progress.best, ctx.plan.train.optimizer, facts
        )
        run.meter.summary(end)
    del lock
    if run.tensorboard is not None:
        run.tensorboard.close()
    last = f"validation loss {progress.evals[-1][1]:.4f}" if progress.evals else "no validation loss"
    say(info.rank == 0, f"run_stop {status}: {last} after {progress.samples:,} samples")
    dist.destroy_process_group()
    return NOT_CONVERGED_EXIT_CODE if status == "aborted" and ctx.plan.train.mode == "pretrain" else 0


def _set_up(ctx: JobContext, info: DistInfo) -> _Run:
    """Everything before run_start: the batch fitted to the train split (a default one), the checkpoint
    to resume from, the MLPerf log's header, the model, its data and generator, the state resumed, the
    meter."""
    train_samples = split_size(ctx.data_dir, "train")
    try:  # every rank meets the same refusal: rank 0 says it, the others end quietly
        ctx = fit_batch_at_start(ctx, train_samples)
    except FluxClusterError as exc:
        raise refusal(info.rank, f"error: {exc}") from None
    cfg, plan = ctx.plan.train, ctx.plan
    rank0 = info.rank == 0
    checkpoints = Checkpointer(
        ctx.checkpoint_dir, cfg.keep_checkpoints, info.rank, info.world_size, frozen_base=cfg.mode == "lora"
    )
    resume_from, skipped = checkpoints.choose()
    for line in skipped:
        say(rank0, line)
    if rank0:  # a restart, with or without a checkpoint, starts a new result log
        set_aside_interrupted_log(ctx.result_log)
    mllog = MlperfLog(ctx.result_log, enabled=rank0, echo=False)
    try:
        schedule = Schedule.of(plan, train_samples)
    except SystemExit as exc:  # its one line, from rank 0 alone
        raise refusal(info.rank, exc.code) from None
    mllog.header(run_facts(ctx, train_samples), ctx.system.mlperf.ruleset, ctx.cache_cleared)
    if schedule.target is not None:
        mllog.event("target_accuracy", value=schedule.target)  # no constant for it

    # ---- model, sharding, optimizer, data
    trainer = build_trainer(plan, info, ctx.seed, ctx.system.gpu_memory_gb, ctx.data_dir)
    _log_checkpointing(trainer, cfg.activation_checkpointing, mllog, rank0)
    _log_micro_batch(plan, mllog, rank0)
    loader = plan_loader(plan, ctx.data_dir, info, ctx.seed)
    generator = step_generator(info, ctx.seed)
    progress = Progress(evals=[])
    if resume_from is not None:
        progress = restore(checkpoints, resume_from, trainer, generator, loader, ctx.metrics_file, rank0)
        mllog.event("resumed_from_checkpoint", value=progress.samples, metadata={"step": progress.step})
        say(rank0, f"resumed from {resume_from} at step {progress.step} ({progress.samples:,} samples)")

    tensorboard = open_tensorboard(ctx) if rank0 and cfg.tensorboard else None
    meter = _meter(ctx, info, trainer, progress, tensorboard)
    say(rank0, _describe(ctx, info, trainer, schedule))
    return _Run(
        ctx, info, schedule, mllog, checkpoints, trainer, loader, generator, progress, meter, tensorboard
    )


def _train_blocks(run: _Run, stop: StopRequest, gc_paused: bool = False) -> str | int:
    """Train in blocks between evaluations until the target or max_steps: the status (success or
    aborted); or until a signal: checkpointed, the process exit code. ``gc_paused``: collect the young
    generations every GC_EVERY_STEPS steps (pause_gc_on_cpu)."""
    ctx, info, plan, schedule, progress = run.ctx, run.info, run.ctx.plan, run.schedule, run.progress
    cfg, trainer, mllog, meter = plan.train, run.trainer, run.mllog, run.meter
    batches = iter(run.loader)
    stop_poll = StopPoll(stop, cfg.checkpoint_every_minutes * 60 if info.rank == 0 else 0)
    saved_period = 0
    trainer.model.train()
    finished = "success" if plan.fine_tuning else "aborted"  # what reaching max_steps means
    status = None if progress.step < schedule.max_steps else finished  # resumed after the last step
    in_block = False
    while status is None:
        if not in_block:  # also right after a resume in the middle of a block
            block_samples = schedule.block_steps(progress.step) * plan.global_batch_size
            mllog.start(c.BLOCK_START, metadata={"samples_count": block_samples, "step": progress.step})
            in_block = True
        loss, grad_norm, data_wait = train_step(trainer, batches, run.generator, plan, info)
        trainer.scheduler.step()
        progress.step += 1
        progress.samples += plan.global_batch_size
        # Fine-tuning: a progress line before every evaluation too (an epoch can be shorter than
        # log_every_steps), so each epoch's throughput, time and cost are shown.
        line = ctx.tuning and schedule.evaluates_after(progress.step)
        lr = trainer.scheduler.get_last_lr()[0]
        epoch = schedule.epoch(progress.step)
        meter.record(
            progress.step,
            progress.samples,
            loss,
            lr,
            line=line,
            epoch=epoch,
            grad_norm=grad_norm,
            data_wait=data_wait,
        )
        if gc_paused and progress.step % GC_EVERY_STEPS == 0:
            gc.collect(1)

        if schedule.evaluates_after(progress.step):
            mllog.end(c.BLOCK_STOP, metadata={"samples_count": block_samples, "step": progress.step})
            in_block = False
            if _evaluate_block(run):
                status = "success"
        if status is None and progress.step >= schedule.max_steps:
            status = finished
        agreed = stop_poll.poll() if status is None else Agreed(False, False, 0)
        if agreed.requested:
            meter.flush()
            stop_poll.close()
            run.save()
            mllog.run_stop(success=False, samples=progress.samples)
            mllog.close()
            where = run.checkpoints.latest()
            say(info.rank == 0, f"stopped by a signal at step {progress.step}: checkpointed to {where}")
            return finish_interrupted(info.rank, requeue=agreed.requeue)
        every_steps = cfg.checkpoint_every_steps
        if status is None and (
            (every_steps and progress.step % every_steps == 0) or agreed.period > saved_period
        ):
            saved_period = agreed.period
            run.save()
    meter.flush()
    stop_poll.close()
    return status


GC_EVERY_STEPS = 50
"""CPU runs only: how often the loop collects Python's young generations while automatic collection is
paused (pause_gc_on_cpu)."""


def pause_gc_on_cpu(device: torch.device) -> bool:
    """CPU runs only (GPU runs are unchanged): pause Python's automatic garbage collection for the training
    loop, the set-up's objects frozen out of later collections; the loop collects the young generations
    every GC_EVERY_STEPS steps instead. On a CPU the step's Python work (FSDP hooks, DTensor dispatch) is a
    large part of the step, and the collector's own passes cost ~5% of it (2 gloo ranks, tiny model).
    Whether it paused: the caller resumes it (gc.unfreeze, gc.enable)."""
    if device.type != "cpu" or not gc.isenabled():
        return False
    gc.collect()
    gc.freeze()
    gc.disable()
    return True


def _evaluate_block(run: _Run) -> bool:
    """The evaluation that ends a block (fine-tuning keeps the best weights); whether it reached the
    target."""
    ctx, progress, meter, trainer = run.ctx, run.progress, run.meter, run.trainer
    meter.pause()
    epoch = run.schedule.epoch(progress.step)
    eval_loss = _evaluate(trainer.model, ctx, run.info, trainer.dtype, run.mllog, progress, epoch)
    better = progress.best is None or eval_loss < progress.best[1]
    if ctx.tuning and math.isfinite(eval_loss) and better:
        progress.best = (progress.step, eval_loss)
        save_weights(
            trainer.model,
            ctx,
            run.info,
            best_weights_name(ctx.exp_index),
            f"best (validation loss {eval_loss:.4f})",
        )
    meter.record_eval(progress.step, progress.samples, eval_loss, epoch)
    return run.schedule.target is not None and eval_loss <= run.schedule.target


def _log_checkpointing(trainer: Trainer, configured: str, mllog: MlperfLog, rank0: bool) -> None:
    facts: dict[str, Any] = {"configured": configured}
    if (choice := trainer.auto_choice) is not None:
        say(rank0, choice.describe())
        if not math.isnan(choice.estimate_gb):
            facts |= {"estimated_peak_gb": round(choice.estimate_gb, 1)}
    # not an MLPerf key: the mode in use, and what 'auto' estimated
    mllog.event("activation_checkpointing", value=trainer.checkpointing, metadata=facts)


def _log_micro_batch(plan: TrainingPlan, mllog: MlperfLog, rank0: bool) -> None:
    """train.micro_batch_size 'auto', as submit chose it (MLPerf's own micro_batch_size key, in the
    header, has the number)."""
    if (choice := plan.micro_batch_auto) is None:
        return
    say(rank0, choice.describe())
    facts = {"configured": "auto", "checkpointing": choice.checkpointing}
    facts |= {"estimated_peak_gb": round(choice.estimate_gb, 1), "budget_gb": round(choice.budget_gb, 1)}
    # not an MLPerf key, as activation_checkpointing's
    mllog.event("micro_batch_auto", value=choice.micro_batch, metadata=facts)


def _meter(ctx: JobContext, info: DistInfo, trainer: Trainer, progress: Progress, tb: Any) -> Meter:
    """The meter, on the clock carried from earlier attempts, with what throughput is computed from: the
    attention kernel probed at the run's shapes and the measured GEMM peak."""
    model_args = ModelArgs.of(trainer.model.config)  # a pretrained checkpoint's own shape, not the preset's
    image_tokens, text_tokens = token_counts(ctx.data_dir, model_args, ctx.plan.train.model)
    facts = measure_facts(
        ctx.system, ctx.plan, info, trainer.dtype, model_args, image_tokens, text_tokens, ctx.config_filename
    )
    gbs, peak = ctx.plan.global_batch_size, ctx.system.peak_bf16_tflops
    header = {  # what 'flux-cluster report' needs for MFU
        "flops_per_sample": facts.flops_per_sample,
        "world_size": info.world_size,
        "peak_tflops": peak,
        "measured_peak_tflops": facts.peak.tflops,
        "attention_kernel": facts.kernel,
    }
    return Meter(
        ctx,
        info,
        flops_per_step=facts.flops_per_sample * gbs,
        devices=info.world_size,
        peak_tflops=peak,
        header=header,
        carried=Totals(progress.clock, progress.clock.timed_steps * gbs),
        measured_peak_tflops=facts.peak.tflops,
        attempt=progress.attempt,
        unit="images/s" if ctx.tuning else "samples/s",  # a fine-tuning sample is one image
        tb=tb,
    )


def _describe(ctx: JobContext, info: DistInfo, trainer: Trainer, schedule: Schedule) -> str:
    cfg, plan = ctx.plan.train, ctx.plan
    return (
        f"{cfg.model} ({logical_parameter_count(trainer.model) / 1e6:.1f}M parameters, "
        f"{len(trainer.params)} trainable tensors), {info.world_size} ranks "
        f"({plan.dp_replicate} x {plan.dp_shard} HSDP), global batch {plan.global_batch_size} = "
        f"{cfg.micro_batch_size} x {info.world_size} x {plan.grad_accum_steps}, "
        f"{cfg.optimizer} lr {plan.learning_rate:g}, warmup {plan.warmup_steps}, {eval_policy(schedule)}"
    )


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
            control_tokens(None if batch.control is None else batch.control.to(info.device)),  # edit pairs
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
        velocity_predictor(model, dtype, ctx.plan.train.guidance_scale),
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
