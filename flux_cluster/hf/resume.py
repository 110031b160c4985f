"""Checkpoint and resume for the hf workload, the FLUX job's way (flux_cluster/training/checkpoint.py's
Checkpointer): DCP shards of the model (LoRA: the adapters and the trained head only) and the optimizer,
each rank's RNG and GradScaler state as plain data (read back with weights_only), the scheduler, the
run's evaluations and the meter's totals in train_state.json; committed atomically, checked against the
manifest before a resume, a damaged one skipped with one line. The position in the data needs no state of
its own: every epoch's order is a seeded permutation (train.shard_order), so the step says where to go on.
"""

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.meter import HfTotals
from flux_cluster.safe_text import printable
from flux_cluster.training.checkpoint import Checkpointer, CheckpointError


@dataclass
class HfProgress:
    """Where an hf run is: what a checkpoint restores besides the weights and the optimizer."""

    step: int = 0
    evals: list[float] = field(default_factory=list)
    """Every evaluation's loss so far (one per epoch)."""
    attempt: int = 0
    """How many times this repeat was started (0: the first)."""
    totals: HfTotals = field(default_factory=HfTotals)
    """The meter's figures of the attempts before, as of the checkpoint resumed from."""

    def position(self, steps_per_epoch: int) -> tuple[int, int]:
        """(epoch, index in it) of the next step."""
        return divmod(self.step, steps_per_epoch)


def save(
    checkpoints: Checkpointer,
    progress: HfProgress,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    device: torch.device,
) -> Path:
    """A checkpoint at progress.step (progress.totals: the meter's whole-run figures now). A collective."""
    shared = {
        "evals": progress.evals,
        "attempt": progress.attempt,
        "meter": asdict(progress.totals),
        "scheduler": scheduler.state_dict(),
    }
    mine = {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "scaler": scaler.state_dict(),
    }
    return checkpoints.save(progress.step, model, optimizer, shared, mine)


def restore(
    checkpoints: Checkpointer,
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    device: torch.device,
) -> HfProgress:
    """Load the checkpoint at path (intact: Checkpointer.choose checked it) into the model, optimizer,
    scheduler, scaler and RNGs; a checkpoint of another model, mode or world size is one line."""
    try:
        shared, mine = checkpoints.load(path, model, optimizer)
        scheduler.load_state_dict(shared["scheduler"])
        if scaler.is_enabled():
            scaler.load_state_dict(mine["scaler"])
        torch.set_rng_state(mine["torch_rng"])
        if device.type == "cuda" and mine.get("cuda_rng") is not None:  # GPU only
            torch.cuda.set_rng_state(mine["cuda_rng"], device)
        progress = HfProgress(
            int(shared["step"]),
            [float(loss) for loss in shared["evals"]],
            int(shared["attempt"]) + 1,
            HfTotals(**shared["meter"]),
        )
    except CheckpointError as exc:
        raise FluxClusterError(str(exc)) from None
    except (Exception, CheckpointException) as exc:  # another model's keys or shapes: what DCP or torch raise
        if isinstance(exc, CheckpointException):  # a BaseException holding each rank's error
            failure = next(iter(exc.failures.values()))
            exc = failure[0] if isinstance(failure, tuple) else failure
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise FluxClusterError(
            f"{path}: not a checkpoint this run can resume ({printable(reason)}); expected one of the same "
            f"hf.model, train.mode and train.parallel: move it away to start over"
        ) from None
    if not math.isfinite(progress.totals.train_seconds):
        raise FluxClusterError(f"{path}: train_state.json: meter.train_seconds is not a finite number")
    return progress
