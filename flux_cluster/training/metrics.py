"""What the run's meter (flux_cluster/training/meter.py) measures with: the clock and totals a checkpoint
carries so a resumed run's time, throughput, GPU-hours and cost cover all its attempts, the throughput
window, GPU-hours and cost, peak memory, the metrics file's partial last line, TensorBoard, rank 0's
lines."""

import contextlib
import json
import math
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from flux_cluster.rundir import tensorboard_dir
from flux_cluster.training.context import JobContext


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


class ThroughputWindow:
    """The steps since the last progress line, what the meter's rates come from: their training time
    (evaluations and checkpoint saves paused out, the GPU's queued work included), their count and summed
    loss (on the device until a line reads it: no sync per step), and the closed windows' totals."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.timed_s, self.timed_steps = 0.0, 0
        """Training time and steps of the closed windows: the run's throughput."""
        self.paused_at = 0.0
        self.reset()

    def reset(self) -> None:
        """A new window from now."""
        self.start, self.steps, self.paused_s = time.perf_counter(), 0, 0.0
        self.loss.zero_()

    def add(self, loss: torch.Tensor) -> None:
        self.steps += 1
        self.loss += loss.detach().double()

    def sync(self) -> float:
        """Now, once the device's queued work is done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def seconds(self) -> float:
        """Training seconds in the window so far, the device's work included."""
        return self.sync() - self.start - self.paused_s

    def pause(self) -> None:
        """Before an evaluation: what follows until resume is not training time."""
        self.paused_at = self.sync()

    def resume(self) -> None:
        self.paused_s += time.perf_counter() - self.paused_at

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Around a checkpoint's save: its time is the run's (GPU-hours), not training throughput."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def mean_loss(self, world_size: int) -> float:
        """The window's mean loss over every rank's steps (a collective)."""
        total = self.loss.clone()
        dist.all_reduce(total)
        return total.item() / self.steps / world_size

    def close(self, elapsed: float) -> None:
        """After a progress line: the window's seconds (as seconds() gave them) join the totals; a new
        window starts."""
        self.timed_s += elapsed
        self.timed_steps += self.steps
        self.reset()


@dataclass(frozen=True)
class Totals:
    """The meter's whole-run figures a checkpoint carries, so a resumed run's throughput, time, GPU-hours
    and cost cover all its attempts (up to the checkpoint resumed from)."""

    clock: RunClock = field(default_factory=RunClock)
    """Training time (lost time of killed attempts included: RunClock.after_loss), the timed steps and
    their time, the peak memory."""
    timed_samples: int = 0
    timed_tokens: int = 0
    """Samples and tokens of the timed steps."""


def gpu_cost(seconds: float, gpus: int, price: float) -> tuple[float, float | None]:
    """(GPU-hours, USD) of seconds on gpus GPUs; USD None without a price per GPU-hour (0: not set)."""
    gpu_hours = seconds / 3600 * gpus
    return gpu_hours, gpu_hours * price if price else None


def time_and_cost(seconds: float, gpus: int, price: float) -> tuple[str, list[tuple[str, float]]]:
    """A run's time, GPU-hours and cost so far, as progress-line text and TensorBoard scalars."""
    gpu_hours, usd = gpu_cost(seconds, gpus, price)
    text = f"{seconds:,.1f} s, {gpu_hours:.3g} GPU-h" + (f", ${usd:,.2f}" if usd is not None else "")
    scalars = [("time/train_seconds", seconds), ("time/gpu_hours", gpu_hours)]
    return text, scalars + ([("time/cost_usd", usd)] if usd is not None else [])


def end_partial_line(path: Path) -> None:
    """An attempt killed mid-write left a partial last line: end it, so the next record is a line."""
    if not path.is_file():
        return
    with path.open("rb+") as file:
        if file.seek(0, 2) == 0:
            return
        file.seek(-1, 2)
        if file.read(1) != b"\n":
            file.write(b"\n")


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB: process peak RSS


def open_tensorboard(ctx: JobContext) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(tensorboard_dir(ctx.run_dir, ctx.exp_index)))


def say(enabled: bool, message: str) -> None:
    if enabled:
        print(f"[train] {message}", flush=True)
