"""What a run keeps across attempts: the lock on its repeat, the earlier attempt's result log set aside,
the state a checkpoint saves and a resume restores, and the fine-tuning weights written into place."""

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import torch

from flux_cluster.config.workload import ModelArgs
from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import results_dir
from flux_cluster.rundir import set_aside_interrupted_log as set_aside_interrupted_log  # the loop's import
from flux_cluster.runtime.dist import DistInfo, lock_repeat_on_rank0, refusal
from flux_cluster.training.checkpoint import Checkpointer, CheckpointError, from_rank0
from flux_cluster.training.context import JobContext
from flux_cluster.training.metrics import Progress, RunClock, say
from flux_cluster.training.model import build_model, lora_metadata, lora_state_dict, save_lora
from flux_cluster.training.trainer import Trainer


def lock_repeat_or_exit(ctx: JobContext, info: DistInfo) -> IO[str] | None:
    """The repeat's lock (runtime.dist.lock_repeat_on_rank0); all ranks stop (one line, exit 1) when another
    attempt holds it."""
    try:
        return lock_repeat_on_rank0(ctx.run_dir, ctx.exp_index, info.rank)
    except FluxClusterError as exc:
        raise refusal(info.rank, f"error: {exc}") from None


def save_state(
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


def save_weights(model: torch.nn.Module, ctx: JobContext, info: DistInfo, name: str, what: str) -> None:
    """Fine-tuning output in results/<name>: the LoRA adapter (diffusers format), or the full transformer
    (save_pretrained). A collective: every rank calls it; rank 0 writes, then renames into place."""
    out = results_dir(ctx.run_dir) / name
    partial = out.with_name(out.name + ".partial")
    if ctx.plan.train.mode == "lora":
        state = lora_state_dict(model)
        if info.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            path = save_lora(state, lora_metadata(model), partial)
            _commit(partial, out)
            say(True, f"{what}: LoRA adapter {out / path.name}")
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if info.rank == 0:
        plain = build_model(ModelArgs.of(model.config))
        plain.load_state_dict(full)
        shutil.rmtree(partial, ignore_errors=True)
        plain.save_pretrained(partial)
        _commit(partial, out)
        say(True, f"{what}: transformer {out}")


def _commit(partial: Path, final: Path) -> None:
    """partial replaces final; the old final is removed only after, so a crash never leaves neither."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def restore(
    checkpoints: Checkpointer,
    path: Path,
    trainer: Trainer,
    generator: torch.Generator,
    loader: Any,
    metrics_file: Path,
    rank0: bool,
) -> Progress:
    """Load the checkpoint at path into the trainer, generator and loader; where the run is, and its clock
    (the time the attempts since the checkpoint spent, from metrics_file, counted as lost)."""
    try:
        shared, mine = checkpoints.load(path, trainer.model, trainer.optimizer)
    except CheckpointError as exc:
        raise SystemExit(f"error: {exc}") from None
    trainer.scheduler.load_state_dict(shared["scheduler"])
    best = shared.get("best")
    # Checkpoints from before the clock have none. One reader of the metrics file, for every rank.
    clock = RunClock(**shared.get("clock", {})).after_loss(metrics_file) if rank0 else None
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
    return progress
