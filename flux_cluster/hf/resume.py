"""Checkpoint and resume for the hf workload, the FLUX job's way (flux_cluster/training/checkpoint.py's
Checkpointer): DCP shards of the model (LoRA: the adapters and the trained head only) and the optimizer,
each rank's RNG and GradScaler state as plain data (read back with weights_only), the scheduler, the
run's evaluations and the meter's totals in train_state.json; committed atomically, checked against the
manifest before a resume, a damaged one skipped with one line. The position in the data needs no state of
its own: every epoch's order is a seeded permutation (train.shard_order), so the step says where to go on.
"""

import reprlib
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import non_negative, whole_number
from flux_cluster.safe_text import printable
from flux_cluster.training.checkpoint import STATE_FILE, Checkpointer, CheckpointError, from_rank0
from flux_cluster.training.metrics import Totals


@dataclass
class HfProgress:
    """Where an hf run is: what a checkpoint restores besides the weights and the optimizer."""

    step: int = 0
    evals: list[float] = field(default_factory=list)
    """Every evaluation's loss so far (one per epoch)."""
    attempt: int = 0
    """How many times this repeat was started (0: the first)."""
    totals: Totals = field(default_factory=Totals)
    """The meter's figures of the attempts before: the checkpoint's, plus the time attempts since it
    spent past it (RunClock.after_loss)."""

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
        # GPU only: every GPU's generator, as dp's one process drives them all (dropout on each replica)
        "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
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
    metrics_file: Path,
    rank0: bool,
) -> HfProgress:
    """Load the checkpoint at path (intact: Checkpointer.choose checked it) into the model, optimizer,
    scheduler, scaler and RNGs; a checkpoint of another model, mode or world size, or a meter that is not
    numbers, is one line. The meter's clock counts the time attempts since the checkpoint spent past it,
    from metrics_file (rank 0 reads it), as lost."""
    try:
        shared, mine = checkpoints.load(path, model, optimizer)
        totals = _numbers(Totals, shared.get("meter"), f"{path / STATE_FILE}: meter")
        scheduler.load_state_dict(shared["scheduler"])
        if scaler.is_enabled():
            scaler.load_state_dict(mine["scaler"])
        torch.set_rng_state(mine["torch_rng"])
        if device.type == "cuda" and mine.get("cuda_rng") is not None:  # GPU only
            torch.cuda.set_rng_state_all(mine["cuda_rng"])
        progress = HfProgress(
            int(shared["step"]), [float(loss) for loss in shared["evals"]], int(shared["attempt"]) + 1
        )
    except FluxClusterError:
        raise
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
    clock = totals.clock.after_loss(metrics_file) if rank0 else None
    progress.totals = Totals(from_rank0(clock), totals.timed_samples, totals.timed_tokens)
    return progress


def _numbers(cls: Any, data: Any, where: str) -> Any:
    """The dataclass cls (Totals, its RunClock) from data, every field checked: one line naming the key
    of one that is missing, unknown or not a finite number >= 0 (a whole one for counts)."""
    names = [f.name for f in fields(cls)]
    if not isinstance(data, dict) or sorted(data) != sorted(names):
        got = sorted(map(str, data)) if isinstance(data, dict) else reprlib.repr(data)
        raise FluxClusterError(f"{where}: got {got}, expected an object with the keys {', '.join(names)}")
    values = {}
    for f in fields(cls):
        value, key = data[f.name], f"{where}.{f.name}"
        if is_dataclass(f.type):
            values[f.name] = _numbers(f.type, value, key)
            continue
        whole = f.type is int
        number = whole_number(value) if whole else non_negative(value)
        if number is None:
            expected = "a whole number >= 0" if whole else "a finite number >= 0"
            raise FluxClusterError(f"{key}: got {reprlib.repr(value)}, expected {expected}")
        values[f.name] = number
    return cls(**values)
