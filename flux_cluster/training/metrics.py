"""The run's metrics, cost meter and clocks: progress lines (rank 0), the metrics file
(results/metrics_<i>.jsonl), TensorBoard scalars, and the clock a checkpoint carries so a resumed run's
time, throughput, GPU-hours and cost cover all its attempts."""

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
from torch.distributed.tensor import DTensor

from flux_cluster.rundir import tensorboard_dir
from flux_cluster.runtime.dist import DistInfo
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
    """The steps since the last progress line, what both meters' rates come from (this module's Meter and
    flux_cluster/hf/meter.py's): their training time (evaluations and checkpoint saves paused out, the
    GPU's queued work included), their count and summed loss (on the device until a line reads it: no sync
    per step), and the closed windows' totals."""

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


class Meter:
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
        self.window = ThroughputWindow(info.device)
        self.started = self.window.start
        self.window_data_wait = 0.0
        self.warmed_up = False
        """An attempt's first step (compilation, allocator and kernel warm-up) is not throughput."""
        self.pending: list[tuple[int, int, torch.Tensor, torch.Tensor, float, float]] = []
        self.last_grad_norm = math.nan
        if info.rank == 0:
            ctx.metrics_file.parent.mkdir(parents=True, exist_ok=True)
            end_partial_line(ctx.metrics_file)
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
        self.started = self.window.start = time.perf_counter()

    def train_seconds(self) -> float:
        """The whole run's training time so far, earlier attempts included."""
        return self.carried.train_seconds + time.perf_counter() - self.started

    def clock(self) -> RunClock:
        """The whole run's clock now (what a checkpoint carries), the open throughput window included. A
        collective (the peak memory of every rank): every rank calls it."""
        window = self.window.seconds() if self.window.steps else 0.0
        # on the device: NCCL reduces CUDA tensors only
        memory = torch.tensor(
            [peak_memory_gb(self.info.device)], dtype=torch.float64, device=self.info.device
        )
        dist.all_reduce(memory, op=dist.ReduceOp.MAX)
        return self.carried + RunClock(
            time.perf_counter() - self.started,
            self.window.timed_s + window,
            self.window.timed_steps + self.window.steps,
            peak_memory_gb=memory.item(),
        )

    def cost(self, seconds: float) -> tuple[float, float | None]:
        """(GPU-hours, USD) of training for seconds on every rank; USD None without the system's price."""
        return gpu_cost(seconds, self.info.world_size, self.ctx.system.price_per_gpu_hour)

    def _time_and_cost(self, seconds: float) -> tuple[str, list[tuple[str, float]]]:
        """The run's time, GPU-hours and cost so far, as progress-line text and TensorBoard scalars."""
        return time_and_cost(seconds, self.info.world_size, self.ctx.system.price_per_gpu_hour)

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
            self.window.sync()  # waits for the step's GPU work
            self._new_window()
            return
        self.window.add(loss)
        self.window_data_wait += data_wait
        if progress.step % self.ctx.plan.train.log_every_steps and not line:
            return
        self.flush()
        grad_norm = self.last_grad_norm
        mean_loss = self.window.mean_loss(self.info.world_size)
        elapsed = self.window.seconds()
        steps = self.window.steps
        step_time = elapsed / steps
        samples_per_s = self.ctx.plan.global_batch_size / step_time
        tflops = self.flops_per_sample * samples_per_s / self.info.world_size / 1e12
        mfu = tflops / self.peak_tflops if self.peak_tflops else math.nan
        mfu_measured = tflops / self.measured_peak_tflops if self.measured_peak_tflops else math.nan
        data_wait_ms = self.window_data_wait / steps * 1000
        memory = peak_memory_gb(self.info.device)
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
        self.window.close(elapsed)
        self.window_data_wait = 0.0

    def _new_window(self) -> None:
        self.window.reset()
        self.window_data_wait = 0.0

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

    def pause(self) -> None:
        """Before an evaluation: what follows until record_eval is not training time."""
        self.window.pause()

    def record_eval(self, progress: Progress, loss: float, epoch: float | None, tb: Any) -> None:
        self.window.resume()
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

    def summary(
        self, progress: Progress, epoch: float | None, optimizer: str, tb: Any, extra: dict | None = None
    ) -> None:
        """Fine-tuning: the figures the fine-tuning benchmarks report, as the metrics file's last record,
        TensorBoard's summary/ scalars and one line. Whole-run figures: a resumed run's earlier attempts
        count (their clock came with the checkpoint). ``extra``: more facts of the run (the frozen base's
        precision and bytes). Throughput counts training steps only (no
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
            "epochs": round(epoch or 0, 4),
            "steps": progress.step,
            "samples": progress.samples,
            "best_eval_loss": best_loss,
            "best_step": best_step,
            "final_eval_loss": evals[-1][1] if evals else math.nan,
            "peak_memory_gb": clock.peak_memory_gb,  # every rank's, every attempt's
            "world_size": self.info.world_size,
            "optimizer": optimizer,
            **(extra or {}),
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
        say(self.info.rank == 0, line)
        if tb is not None:
            for name, value in summary.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    tb.add_scalar(f"summary/{name}", value, progress.samples)
            tb.add_text("summary", line, progress.samples)
            tb.flush()


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
