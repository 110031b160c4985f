"""The hf workload's training loop on every rank (``python -m flux_cluster.jobs.train`` calls ``train``
when the run's plan is of kind 'hf'): a Hugging Face model from a local folder fine-tuned for
train.epochs on local or synthetic data, with DDP, DataParallel or FSDP, fp32 or AMP, all weights or
LoRA. It writes what a fine-tuning run writes: the MLPerf-style result log (results/result_<i>.txt,
division open) and the metrics file with seed 002's figures (flux_cluster/hf/meter.py). Checkpoints as the
FLUX job's (flux_cluster/hf/resume.py): every train.checkpoint_every_steps / _minutes and on SIGUSR1 (the
time-limit warning: checkpoint, then the job script requeues) or SIGTERM (checkpoint and exit); a restart
in the same run folder resumes from the newest intact one, its per-step losses those of a run never
stopped; a run that checkpoints saves its last step too, so a rerun of a finished one finishes at once.
Without a checkpoint a restarted repeat starts over, the earlier attempt's files set aside.
"""

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mlperf_logging.mllog import constants as c

from flux_cluster.config.hf import SYNTHETIC
from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.data import PeerSampleError, SampleError, Splits, load_data, take
from flux_cluster.hf.inputs import check_seq_len
from flux_cluster.hf.meter import count_flops, peak_tflops, tokens_in
from flux_cluster.hf.model import add_lora, load_model, load_processor, lora_targets, match_padding
from flux_cluster.hf.parallel import check_dp_gpus, devices_per_process, wrap
from flux_cluster.hf.resume import HfProgress, restore, save
from flux_cluster.models.quiet import no_progress_bars  # before transformers, peft, torchao: their notices
from flux_cluster.rundir import set_aside_interrupted_log
from flux_cluster.runtime.dist import DistInfo, init_distributed, lock_repeat_on_rank0
from flux_cluster.runtime.signals import StopRequest, die_with_parent, finish_interrupted, under_torchrun
from flux_cluster.training.checkpoint import Checkpointer, CheckpointSaveError, from_rank0, step_of
from flux_cluster.training.context import JobContext, fit_batch_at_start
from flux_cluster.training.meter import Meter, RunEnd
from flux_cluster.training.metrics import open_tensorboard, say
from flux_cluster.training.mlperf_log import GRADIENT_CLIP_NORM, MlperfLog, RunFacts
from flux_cluster.training.optimizers import build_optimizer
from flux_cluster.training.stop_poll import StopPoll

AMP_DTYPES = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}
LOG_PRECISION = {"fp32": "fp32", "amp-bf16": "bfloat16", "amp-fp16": "fp16"}
"""train.precision as the result log's lowest_numerical_precision_* values."""


def train(ctx: JobContext) -> int:
    """Run one repeat on this rank; returns the process exit code (1 with one line for bad input)."""
    if under_torchrun():
        die_with_parent()
    info = init_distributed(ctx.system.dist_backend)
    code = run(ctx, info)
    dist.destroy_process_group()
    return code


def run(ctx: JobContext, info: DistInfo) -> int:
    """One repeat in a started process group: 0; 1 with one line for bad input (a model folder, data or
    LoRA targets that do not fit, a checkpoint of another run); or, stopped by a signal and checkpointed,
    runtime.signals.finish_interrupted's code."""
    # Only SIGUSR1 asks for a requeue; SIGTERM (cancel, preemption) checkpoints and exits.
    stop = StopRequest(on_sigterm=True).install()
    lock = None
    try:
        lock = lock_repeat_on_rank0(ctx.run_dir, ctx.exp_index, info.rank)
        return _train(ctx, info, stop)
    except FluxClusterError as exc:
        # every rank reads the same files: one line is enough, but a sample only this rank met is its to say
        if isinstance(exc, PeerSampleError):  # the rank that met the sample says which
            return 1
        if info.rank == 0 or isinstance(exc, SampleError):
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except CheckpointSaveError as exc:  # a full disk: rank 0's line, the others silent
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr, flush=True)
        return 1
    finally:
        if lock is not None:
            lock.close()


@dataclass(frozen=True)
class Batching:
    """How the global batch splits: per process, per micro-batch, over the processes."""

    per_process: int
    """Samples one process takes per micro-batch (dp: micro_batch_size x its GPUs)."""
    accumulate: int
    processes: int

    @classmethod
    def of(cls, global_batch: int, accumulate: int, processes: int) -> "Batching":
        return cls(global_batch // (accumulate * processes), accumulate, processes)


def shard_order(size: int, rank: int, world: int, epoch: int, seed: int) -> torch.Tensor:
    """This rank's sample indices for an epoch: one seeded permutation shared by all ranks, dealt out
    round-robin, cut so every rank has as many."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch))
    per_rank = size // world
    return order[rank : per_rank * world : world]


def steps_per_epoch(train_samples: int, global_batch: int) -> int:
    if train_samples < global_batch:
        raise FluxClusterError(
            f"train.global_batch_size: the train split has {train_samples} samples, fewer than one global "
            f"batch ({global_batch}): lower it or use more data (hf.max_samples, hf.synthetic_samples)"
        )
    return train_samples // global_batch


def _batch(split: dict[str, Any], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """The samples at index, on the host (images decoded now: flux_cluster/hf/data.py's take, a collective
    for images)."""
    return take(split, index)


def _on(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision in AMP_DTYPES:
        return torch.autocast(device.type, dtype=AMP_DTYPES[precision])
    return contextlib.nullcontext()


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], precision: str, device: torch.device):
    with _autocast(precision, device):
        loss = model(**batch).loss
    return loss.mean() if loss.dim() else loss  # DataParallel returns one loss per GPU


@contextlib.contextmanager
def _gradient_sync(model: torch.nn.Module, sync: bool) -> Iterator[None]:
    """Gradient accumulation: only the last micro-batch reduces gradients (DDP's no_sync, FSDP2's flag)."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        yield
    elif isinstance(model, torch.nn.parallel.DistributedDataParallel) and not sync:
        with model.no_sync():
            yield
    else:
        yield


def _prepare(ctx: JobContext, info: DistInfo) -> tuple[JobContext, torch.nn.Module, Splits, dict[str, Any]]:
    """The job with a default batch fitted to the loaded train split (config/batch_fit.py), the model
    (LoRA added, not yet distributed), its data and the run's facts for the header."""
    hf = ctx.system.hf
    assert hf.model is not None and hf.task is not None
    folder, task = Path(hf.model), hf.task
    check_seq_len(folder, task, hf.seq_len)  # before any text is tokenized or made
    if hf.data == SYNTHETIC:
        with no_progress_bars():  # transformers' per-weight bar: the job's lines say what loaded
            model = load_model(folder, task)
        match_padding(model, getattr(model.config, "eos_token_id", None))
        data = load_data(hf, task, None, model.config, ctx.seed)
    else:
        processor = load_processor(folder, task)
        data = load_data(hf, task, processor, None, ctx.seed)
        with no_progress_bars():
            model = load_model(folder, task, data.num_labels)
        match_padding(model, getattr(processor, "pad_token_id", None))  # load_data may have set it
    ctx = fit_batch_at_start(ctx, Splits.size(data.train))
    cfg = ctx.plan.train
    params = sum(p.numel() for p in model.parameters())
    if cfg.mode == "lora":
        targets = lora_targets(model, list(cfg.lora_targets))
        say(info.rank == 0, f"LoRA rank {cfg.lora_rank} on {', '.join(targets)}")
        model = add_lora(model, targets, cfg.lora_rank, cfg.lora_alpha)
    facts = {
        "model": folder.name,
        "task": task,
        "parallel": cfg.parallel,
        "precision": cfg.precision,
        "mode": cfg.mode,
        "micro_batch_size": cfg.micro_batch_size,
        "seq_len": hf.seq_len if task != "image-classification" else None,
        "params": params,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    return ctx, model, data, facts


def _train(ctx: JobContext, info: DistInfo, stop: StopRequest) -> int:
    plan, cfg = ctx.plan, ctx.plan.train
    rank0, device, precision = info.rank == 0, info.device, str(cfg.precision)
    torch.manual_seed(ctx.seed)
    checkpoints, resume_from = _checkpoints(ctx, info)
    mllog = MlperfLog(ctx.result_log, enabled=rank0)
    ctx, model, data, facts = _prepare(ctx, info)
    plan = ctx.plan  # its batch fitted to the train split where that was the system's default
    batching = Batching.of(plan.global_batch_size, plan.grad_accum_steps, info.world_size)
    per_epoch = steps_per_epoch(Splits.size(data.train), plan.global_batch_size)
    mllog.header(_run_facts(ctx, data, per_epoch), ctx.system.mlperf.ruleset, ctx.cache_cleared)

    if cfg.parallel == "dp" and device.type == "cuda":  # GPU only
        check_dp_gpus(ctx.system.gpus_per_node, torch.cuda.device_count())
    model, flops = distribute_and_count(model, data.train, batching, str(cfg.parallel), info, precision)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer("adamw", params, plan.learning_rate, device)
    warmup = plan.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
    )
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "amp-fp16")
    trainer = _Trainer(model, params, optimizer, scaler, batching, precision, device)
    progress = HfProgress()
    if resume_from is not None:  # after the set-up: the RNG states it restores are those of the step
        progress = restore(
            checkpoints, resume_from, model, optimizer, scheduler, scaler, device, ctx.metrics_file, rank0
        )
        mllog.event("resumed_from_checkpoint", value=progress.step * plan.global_batch_size)
        say(rank0, f"resumed from {resume_from} at step {progress.step}")

    meter = _meter(ctx, info, flops * batching.accumulate * batching.processes, facts, progress)
    say(
        rank0,
        f"{facts['model']} ({facts['task']}, {facts['params'] / 1e6:.2f}M parameters, "
        f"{facts['trainable_params'] / 1e6:.2f}M trainable), {cfg.mode}, {cfg.parallel} over "
        f"{info.world_size} process(es), {precision}, global batch {plan.global_batch_size}, "
        f"{per_epoch} steps/epoch x {plan.epochs} epochs, lr {plan.learning_rate:g}, "
        f"{flops / 1e9:.3g} GFLOPs per micro-batch",
    )
    mllog.end(c.INIT_STOP)
    mllog.start(c.RUN_START)
    meter.start()
    stop_poll = StopPoll(stop, cfg.checkpoint_every_minutes * 60 if rank0 else 0)
    saved_period, block = 0, per_epoch * plan.global_batch_size
    first_epoch, first_index = progress.position(per_epoch)
    for epoch in range(first_epoch, plan.epochs):
        mllog.start(c.BLOCK_START, metadata={"samples_count": block, "step": progress.step})
        order = shard_order(Splits.size(data.train), info.rank, info.world_size, epoch, ctx.seed)
        model.train()
        for index in range(first_index if epoch == first_epoch else 0, per_epoch):
            total, tokens = trainer.step(data.train, order, index)
            scheduler.step()
            progress.step += 1
            step, samples = progress.step, progress.step * plan.global_batch_size
            text = facts["seq_len"] is not None
            last = index == per_epoch - 1
            meter.record(
                step,
                samples,
                total,
                scheduler.get_last_lr()[0],
                line=last,
                epoch=step / per_epoch,
                tokens=tokens * info.world_size if text else None,
            )
            if last:
                mllog.end(c.BLOCK_STOP, metadata={"samples_count": block, "step": step})
            if last and data.val is not None:
                meter.pause()
                loss = _evaluate(
                    model, data.val, batching.per_process, info, precision, mllog, step, samples, epoch + 1
                )
                meter.record_eval(step, samples, loss, float(epoch + 1))
                progress.evals.append(loss)
            # after the epoch's evaluation: a checkpoint at its end resumes into the next epoch
            if step == per_epoch * plan.epochs:
                break
            agreed = stop_poll.poll()
            every = cfg.checkpoint_every_steps
            if agreed.requested:
                stop_poll.close()
                where = _save(checkpoints, progress, meter, trainer, scheduler)
                mllog.run_stop(success=False, samples=samples)
                mllog.close()
                say(rank0, f"stopped by a signal at step {step}: checkpointed to {where}")
                return finish_interrupted(info.rank, requeue=agreed.requeue)
            if (every and step % every == 0) or agreed.period > saved_period:
                saved_period = agreed.period
                _save(checkpoints, progress, meter, trainer, scheduler)
    stop_poll.close()
    final_checkpoint(checkpoints, progress, meter, trainer, scheduler)
    samples = progress.step * plan.global_batch_size
    mllog.run_stop(success=True, samples=samples)
    mllog.close()
    meter.summary(_run_end(progress, samples, per_epoch, facts))
    if meter.tb is not None:
        meter.tb.close()
    return 0


def _meter(
    ctx: JobContext, info: DistInfo, flops: float, facts: dict[str, Any], progress: HfProgress
) -> Meter:
    """The run's meter (flops: one optimizer step's, every process's micro-batches), its header written,
    the earlier attempts' figures carried over. Its devices are those that train: every process's (dp: the
    GPUs its one process drives; on a CPU, one), whatever system.gpus_per_node says."""
    cfg = ctx.plan.train
    peak = peak_tflops(ctx.system, str(cfg.precision), info.device)
    per_process = devices_per_process(str(cfg.parallel), info)
    devices = info.world_size * per_process
    more = {"flops_per_step": flops, "processes": info.world_size, "devices_per_process": per_process}
    text = facts["seq_len"] is not None
    return Meter(
        ctx,
        info,
        flops_per_step=flops,
        devices=devices,
        peak_tflops=peak,
        header={"world_size": devices, "workload": "hf", **facts, **more, "peak_tflops": peak},
        carried=progress.totals,
        attempt=progress.attempt,
        unit="samples/s" if text else "images/s",
        tokens=text,
        per_step=False,
        tb=open_tensorboard(ctx) if info.rank == 0 and cfg.tensorboard else None,
    )


def _run_end(progress: HfProgress, samples: int, per_epoch: int, facts: dict[str, Any]) -> RunEnd:
    """What the summary reports beside the meter's figures: one evaluation per epoch."""
    losses = progress.evals
    best = min(enumerate(losses), key=lambda pair: pair[1]) if losses else None  # the first of equals
    return RunEnd(
        progress.step,
        samples,
        progress.step / per_epoch,
        list(losses),
        None if best is None else ((best[0] + 1) * per_epoch, best[1]),
        "adamw",
        name=f"{facts['model']} ({', '.join(facts[k] for k in ('task', 'mode', 'parallel', 'precision'))})",
        per_epoch=per_epoch,
        block={k: facts[k] for k in ("task", "parallel", "precision", "mode", "model")},
    )


def _checkpoints(ctx: JobContext, info: DistInfo) -> tuple[Checkpointer, Path | None]:
    """The repeat's checkpoints and the newest intact one to resume from (a collective). A restart starts
    a new result log; without a checkpoint it measures again from the start, its metrics set aside too."""
    cfg, rank0 = ctx.plan.train, info.rank == 0
    checkpoints = Checkpointer(
        ctx.checkpoint_dir, cfg.keep_checkpoints, info.rank, info.world_size, frozen_base=cfg.mode == "lora"
    )
    resume_from, skipped = checkpoints.choose()
    for line in skipped:  # a damaged checkpoint: one line, and the next older one is tried
        say(rank0, line)
    if rank0:
        for path in (ctx.result_log, *([ctx.metrics_file] if resume_from is None else [])):
            set_aside_interrupted_log(path)
    return checkpoints, resume_from


def _save(
    checkpoints: Checkpointer,
    progress: HfProgress,
    meter: Meter,
    trainer: "_Trainer",
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> Any:
    """A checkpoint of the whole state now (a collective: every rank calls it). Its time is not training
    throughput (the window is paused), though the run's time counts it."""
    with meter.window.paused():
        progress.totals = meter.totals()
        model, optimizer, scaler = trainer.model, trainer.optimizer, trainer.scaler
        return save(checkpoints, progress, model, optimizer, scheduler, scaler, trainer.device)


def final_checkpoint(
    checkpoints: Checkpointer,
    progress: HfProgress,
    meter: Meter,
    trainer: "_Trainer",
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """The finished run's state, as the FLUX job's (training/loop.py): a rerun (a requeue, a crash after
    the summary) resumes at the last step and finishes at once, not redoing the tail from the last periodic
    checkpoint. Only a run that checkpoints at all: without one a rerun starts over, its files set aside.
    A collective: every rank calls it."""
    latest = from_rank0(checkpoints.latest() if checkpoints.rank == 0 else None)
    if latest is not None and step_of(latest) != progress.step:
        _save(checkpoints, progress, meter, trainer, scheduler)


def distribute_and_count(
    model: torch.nn.Module,
    split: dict[str, Any],
    batching: Batching,
    parallel: str,
    info: DistInfo,
    precision: str,
) -> tuple[torch.nn.Module, float]:
    """The model on info.device as train.parallel distributes it, and the FLOPs of one of this process's
    micro-batches (forward and backward) counted once on that device. ddp and dp count on the bare model
    before wrapping (no collectives; dp: one GPU's micro-batch times its GPUs, not all of them on GPU 0);
    fsdp counts after fully_shard, on every rank, as its all-gathers are collectives. The count's
    gradients are dropped and its memory does not count in the run's peak."""
    device = info.device
    gpus = devices_per_process(parallel, info)
    if parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        model = wrap(model, "fsdp", info, init_device_mesh(device.type, (info.world_size,)))
    else:
        model.to(device)
    sample = _on(_batch(split, torch.arange(max(batching.per_process // gpus, 1))), device)
    flops = count_flops(lambda: _loss(model, sample, precision, device).backward()) * gpus
    model.zero_grad(set_to_none=True)
    if parallel != "fsdp":
        model = wrap(model, parallel, info, amp_dtype=AMP_DTYPES.get(precision))
    if device.type == "cuda":  # GPU only
        torch.cuda.reset_peak_memory_stats(device)
    return model, flops


@dataclass(frozen=True)
class _Trainer:
    """One optimizer step: the micro-batches of this rank's share, AMP, clipping, the (fp16) scaler."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batching: Batching
    precision: str
    device: torch.device

    def step(
        self, split: dict[str, torch.Tensor], order: torch.Tensor, index: int
    ) -> tuple[torch.Tensor, int]:
        """Step index of the epoch over the samples in order; (mean loss, this rank's tokens)."""
        b, model = self.batching, self.model
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        tokens = 0
        for micro in range(b.accumulate):
            start = (index * b.accumulate + micro) * b.per_process
            batch = _batch(split, order[start : start + b.per_process])
            tokens += tokens_in(batch) or 0  # on the host: no device sync
            batch = _on(batch, self.device)
            with _gradient_sync(model, micro == b.accumulate - 1):
                loss = _loss(model, batch, self.precision, self.device)
                self.scaler.scale(loss / b.accumulate).backward()
            total += loss.detach() / b.accumulate
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, GRADIENT_CLIP_NORM)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return total, tokens


def _evaluate(
    model: torch.nn.Module,
    val: dict[str, torch.Tensor],
    batch_size: int,
    info: DistInfo,
    precision: str,
    mllog: MlperfLog,
    step: int,
    samples: int,
    epoch: int,
) -> float:
    """The mean loss over val (every rank the same number of batches: FSDP's forward is a collective)."""
    meta = {"samples_count": samples, "step": step}
    mllog.start(c.EVAL_START, metadata=meta)
    model.eval()
    size = Splits.size(val)
    order = (
        shard_order(size, info.rank, info.world_size, 0, 0) if size >= info.world_size else torch.arange(size)
    )
    sums = torch.zeros(2, dtype=torch.float64, device=info.device)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            loss = _loss(model, _on(_batch(val, index), info.device), precision, info.device)
            sums += torch.stack(
                [
                    loss.double() * len(index),
                    torch.tensor(len(index), dtype=torch.float64, device=info.device),
                ]
            )
    dist.all_reduce(sums)
    model.train()
    loss = float(sums[0] / sums[1]) if sums[1] else float("nan")
    mllog.eval_accuracy(loss, samples, float(epoch))
    mllog.end(c.EVAL_STOP, metadata=meta)
    return loss


def _run_facts(ctx: JobContext, data: Splits, per_epoch: int) -> RunFacts:
    plan, cfg, system = ctx.plan, ctx.plan.train, ctx.system
    precision = LOG_PRECISION[str(cfg.precision)]
    return RunFacts(
        submission_org=system.mlperf.submission_org,
        submission_platform=system.name,
        global_batch_size=plan.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        learning_rate=plan.learning_rate,
        warmup_steps=plan.warmup_steps,
        train_samples=Splits.size(data.train),
        eval_samples=Splits.size(data.val),
        config_filename=ctx.config_filename,
        division="open",
        gradient_accumulation_steps=plan.grad_accum_steps,
        precision_linear=precision,  # type: ignore[arg-type]
        precision_attn=precision,  # type: ignore[arg-type]
        precision_comm="fp32",
        seed=ctx.seed,
        eval_every_steps=per_epoch,
        benchmark="hf",
        optimizer="adamw",
        batch_fit=plan.batch_fit,
    )
