"""The hf workload's figures (seed 002's): samples/s and tokens/s (or images/s), step time, FLOPs per
step (FlopCounterMode on the real model, once), TFLOP/s and MFU, peak memory, time per epoch, the
estimated total time, GPU-hours and cost (the run's and the estimate's, at system.price_per_gpu_hour:
training/metrics.py's gpu_cost). Written as the metrics file's header, step, evaluation and summary lines
(results/metrics_<i>.jsonl), progress lines and TensorBoard scalars; the throughput window and the file,
cost and time helpers are the FLUX meter's (flux_cluster/training/metrics.py)."""

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from flux_cluster.atomic import finite_for_json
from flux_cluster.config.schema import SystemConfig
from flux_cluster.runtime.dist import DistInfo
from flux_cluster.training.context import JobContext
from flux_cluster.training.metrics import (
    RunClock,
    ThroughputWindow,
    end_partial_line,
    gpu_cost,
    peak_memory_gb,
    say,
    time_and_cost,
)

FP32_TFLOPS = {"H100": 67.0, "H200": 67.0, "GB200": 80.0, "B200": 80.0, "A100": 19.5, "MI300X": 163.4}
"""Datasheet dense FP32 (non-tensor-core) peaks by GPU model name, TFLOP/s: plain fp32 training's peak."""


def peak_tflops(system: SystemConfig, precision: str, device: torch.device) -> float | None:
    """The datasheet's dense peak per GPU for the precision (AMP: the system's bf16 peak, fp16's too on
    these GPUs; fp32: FP32_TFLOPS by gpu_model); None on CPU or an unknown model."""
    if device.type != "cuda":
        return None
    if precision != "fp32":
        return system.peak_bf16_tflops or None
    known = [v for name, v in FP32_TFLOPS.items() if name in system.gpu_model.upper().replace("-", "")]
    return known[0] if known else None


def count_flops(step: Any) -> float:
    """FLOPs of step() (one forward and backward of the real model), by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def tokens_in(batch: dict[str, torch.Tensor]) -> int | None:
    """Text batches: the real (unpadded) tokens; images: None."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return None


@dataclass(frozen=True)
class HfTotals:
    """The meter's whole-run figures a checkpoint carries, so a resumed run's throughput, time, GPU-hours
    and cost cover all its attempts (up to the checkpoint resumed from)."""

    clock: RunClock = field(default_factory=RunClock)
    """The FLUX job's clock: training time (lost time of killed attempts included: RunClock.after_loss),
    the timed steps and their time, the peak memory."""
    timed_samples: int = 0
    timed_tokens: int = 0
    """Samples and tokens of the timed steps."""


@dataclass
class HfMeter:
    """Rank 0 writes; every rank takes part in the collectives (loss and memory reductions)."""

    ctx: JobContext
    info: DistInfo
    flops_per_step: float
    peak: float | None
    devices: int
    """GPUs the job holds (plan.world_size): what TFLOP/s per GPU and GPU-hours count."""
    tb: Any = None
    started: float = field(default_factory=time.perf_counter)
    window: ThroughputWindow = field(init=False)
    """The steps since the last line (time, count, loss) and the closed windows' time and steps."""
    window_samples: int = 0
    window_tokens: int = 0
    timed_samples: int = 0
    timed_tokens: int = 0
    """Samples and tokens of the closed windows."""
    warmed_up: bool = False
    evals: list[float] = field(default_factory=list)
    carried: HfTotals = field(default_factory=HfTotals)
    """The attempts before this one, from the checkpoint resumed from."""
    attempt: int = 0
    """How many times this repeat was started before (0: the first attempt)."""

    def __post_init__(self) -> None:
        self.window = ThroughputWindow(self.info.device)

    def carry(self, totals: HfTotals, evals: list[float], attempt: int) -> None:
        """A resumed run: its earlier attempts' figures count in the rates, time and cost."""
        self.carried, self.evals, self.attempt = totals, list(evals), attempt
        self.window.timed_s, self.window.timed_steps = totals.clock.timed_seconds, totals.clock.timed_steps
        self.timed_samples, self.timed_tokens = totals.timed_samples, totals.timed_tokens

    def totals(self) -> HfTotals:
        """The whole run's figures now, the open window included (what a checkpoint carries). A
        collective (every rank's peak memory): every rank calls it."""
        window = self.window
        window_s = window.seconds() if window.steps else 0.0
        memory = _max_over_ranks(peak_memory_gb(self.info.device), self.info)
        carried = self.carried.clock
        clock = RunClock(
            self.train_seconds(),
            window.timed_s + window_s,
            window.timed_steps + window.steps,
            carried.lost_seconds,
            max(memory, carried.peak_memory_gb),
        )
        return HfTotals(
            clock, self.timed_samples + self.window_samples, self.timed_tokens + self.window_tokens
        )

    def write(self, record: dict[str, Any]) -> None:
        if self.info.rank == 0:
            with self.ctx.metrics_file.open("a") as out:
                # A run with no timed step has NaN rates: JSON has none, so they go out as null.
                out.write(json.dumps(finite_for_json(record)) + "\n")

    def header(self, facts: dict[str, Any]) -> None:
        if self.info.rank == 0:
            self.ctx.metrics_file.parent.mkdir(parents=True, exist_ok=True)
            end_partial_line(self.ctx.metrics_file)
        self.write({"world_size": self.devices, "workload": "hf", **facts, "peak_tflops": self.peak})

    def start(self) -> None:
        self.started = time.perf_counter()
        self._new_window()

    def _new_window(self) -> None:
        self.window.reset()
        self.window_samples = self.window_tokens = 0

    def record(
        self,
        step: int,
        epoch: float,
        loss: torch.Tensor,
        samples: int,
        tokens: int | None,
        lr: float,
        line: bool,
    ) -> None:
        """One optimizer step (samples and tokens: the global batch's); a line every log_every_steps and
        when line is set. An attempt's first step (allocator and kernel warm-up) is not timed."""
        if not self.warmed_up:
            self.warmed_up = True
            self.window.sync()  # waits for the step's GPU work
            self._new_window()
            return
        self.window.add(loss)
        self.window_samples += samples
        self.window_tokens += tokens or 0
        if step % self.ctx.plan.train.log_every_steps and not line:
            return
        elapsed, steps = self.window.seconds(), self.window.steps
        self.timed_samples += self.window_samples
        self.timed_tokens += self.window_tokens
        window_tokens = self.window_tokens if tokens is not None else None
        rates = self._rates(elapsed, steps, self.window_samples, window_tokens)
        mean_loss = self.window.mean_loss(self.info.world_size)
        memory = _max_over_ranks(peak_memory_gb(self.info.device), self.info)
        seconds = self.train_seconds()
        record = {
            "step": step,
            "epoch": round(epoch, 4),
            "loss": mean_loss,
            **rates,
            "peak_memory_gb": memory,
            "train_seconds": seconds,  # how far a killed attempt got (RunClock.after_loss)
        }
        self.write(record)
        so_far, time_scalars = time_and_cost(seconds, self.devices, self.price)
        say(self.info.rank == 0, _progress_line(record, lr, so_far))
        if self.tb is not None:
            scalars = (("train/loss", mean_loss), ("train/lr", lr), *_scalars(record), *time_scalars)
            for name, value in scalars:
                if value is not None:
                    self.tb.add_scalar(name, value, step)
        self.window.close(elapsed)
        self.window_samples = self.window_tokens = 0

    def _rates(self, seconds: float, steps: int, samples: int, tokens: int | None) -> dict[str, Any]:
        step_s = seconds / steps if steps else math.nan
        tflops = self.flops_per_step / step_s / self.devices / 1e12 if steps else math.nan
        return {
            "step_seconds": step_s,
            "samples_per_s": samples / seconds if seconds else math.nan,
            "tokens_per_s": tokens / seconds if tokens is not None and seconds else None,
            "tflops_per_s": tflops,
            "mfu": tflops / self.peak if self.peak else None,
        }

    def train_seconds(self) -> float:
        """The whole run's training time so far, earlier attempts included."""
        return self.carried.clock.train_seconds + time.perf_counter() - self.started

    @property
    def price(self) -> float:
        return self.ctx.system.price_per_gpu_hour

    def cost(self, seconds: float) -> tuple[float, float | None]:
        """(GPU-hours, USD) of seconds on the job's GPUs; USD None without the system's price."""
        return gpu_cost(seconds, self.devices, self.price)

    def pause(self) -> None:
        """Before an evaluation: its time is not training throughput."""
        self.window.pause()

    def resume(self) -> None:
        self.window.resume()

    def record_eval(self, step: int, samples: int, loss: float, epoch: float) -> None:
        self.evals.append(loss)
        seconds = self.train_seconds()
        record = {"step": step, "samples": samples, "eval_loss": loss, "epoch": round(epoch, 4)}
        self.write({**record, "train_seconds": seconds})
        say(
            self.info.rank == 0,
            f"eval step {step} | epoch {epoch:g} | validation loss {loss:.4f} | {seconds:,.1f} s",
        )
        if self.tb is not None:
            self.tb.add_scalar("eval/loss", loss, step)

    def summary(self, steps: int, samples: int, epochs: float, steps_per_epoch: int, facts: dict) -> None:
        """The metrics file's last line: finetune's summary keys plus the seed's figures under 'hf'."""
        timed = self.window.timed_steps
        rates = self._rates(
            self.window.timed_s, timed, self.timed_samples, self.timed_tokens if facts["seq_len"] else None
        )
        step_s = rates["step_seconds"]
        epoch_s = step_s * steps_per_epoch
        memory = _max_over_ranks(peak_memory_gb(self.info.device), self.info)
        memory = max(memory, self.carried.clock.peak_memory_gb)
        seconds, total_s = self.train_seconds(), epoch_s * self.ctx.plan.epochs
        lost = self.carried.clock.lost_seconds
        gpu_hours, usd = self.cost(seconds)
        total_gpu_hours, total_usd = self.cost(total_s)
        summary = {
            "images_per_s": rates["samples_per_s"],
            "step_time_ms": step_s * 1000,
            "timed_steps": timed,
            "train_seconds": seconds,
            "lost_seconds": lost,  # of train_seconds: past a killed attempt's last checkpoint
            "gpu_hours": gpu_hours,
            "price_per_gpu_hour": self.price or None,
            "cost_usd": usd,
            "attempts": self.attempt + 1,  # the report takes train_seconds as the run's time when > 1
            "epochs": round(epochs, 4),
            "steps": steps,
            "samples": samples,
            "final_eval_loss": self.evals[-1] if self.evals else None,
            "best_eval_loss": min(self.evals) if self.evals else None,
            "peak_memory_gb": memory,
            "world_size": self.devices,
            "optimizer": "adamw",
            "hf": {
                "samples_per_s": rates["samples_per_s"],
                "tokens_per_s": rates["tokens_per_s"],
                "flops_per_step": self.flops_per_step,
                "tflops_per_s": rates["tflops_per_s"],
                "mfu": rates["mfu"],
                "epoch_seconds": epoch_s,
                "estimated_total_seconds": total_s,
                "estimated_gpu_hours": total_gpu_hours,
                "estimated_cost_usd": total_usd,
                "epochs": self.ctx.plan.epochs,
                **{k: facts[k] for k in ("task", "parallel", "precision", "mode", "model")},
            },
        }
        self.write({"summary": summary})
        say(
            self.info.rank == 0,
            f"fine-tuned {facts['model']} ({facts['task']}, {facts['mode']}, {facts['parallel']}, "
            f"{facts['precision']}): {rates['samples_per_s']:,.1f} samples/s"
            + (f", {rates['tokens_per_s']:,.0f} tokens/s" if rates["tokens_per_s"] is not None else "")
            + f", step {step_s * 1000:,.1f} ms, {self.flops_per_step / 1e12:.3g} TFLOPs/step, "
            f"epoch {epoch_s:,.1f} s (estimated {total_s:,.1f} s, {total_gpu_hours:.4g} GPU-hours"
            + (f", ${total_usd:,.2f}" if total_usd is not None else "")
            + f" for {self.ctx.plan.epochs} epochs), peak memory {memory:.2f} GB; this run "
            + time_and_cost(seconds, self.devices, self.price)[0]
            + (f" ({self.attempt + 1} attempts, {lost:,.1f} s of them redone)" if self.attempt else ""),
        )
        if self.tb is not None:
            for name, value in (*summary.items(), *summary["hf"].items()):
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self.tb.add_scalar(f"summary/{name}", value, steps)
            self.tb.flush()


def _scalars(record: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("train/samples_per_s", record["samples_per_s"]),
        ("train/tokens_per_s", record["tokens_per_s"]),
        ("train/step_time_ms", record["step_seconds"] * 1000),
        ("train/tflops_per_gpu", record["tflops_per_s"]),
        ("train/mfu", record["mfu"]),
        ("train/peak_memory_gb", record["peak_memory_gb"]),
    ]


def _progress_line(record: dict[str, Any], lr: float, so_far: str) -> str:
    tokens = record["tokens_per_s"]
    rate = f"{tokens:,.0f} tokens/s" if tokens is not None else f"{record['samples_per_s']:,.1f} images/s"
    mfu = "n/a" if record["mfu"] is None else f"{record['mfu']:.1%}"
    return (
        f"step {record['step']:>6} | epoch {record['epoch']:.2f} | loss {record['loss']:.4f} | "
        f"{record['samples_per_s']:,.1f} samples/s | {rate} | step {record['step_seconds'] * 1000:,.1f} ms | "
        f"{record['tflops_per_s']:.3g} TFLOP/s/GPU | MFU {mfu} | lr {lr:.3g} | "
        f"peak mem {record['peak_memory_gb']:.2f} GB | {so_far}"
    )


def _max_over_ranks(value: float, info: DistInfo) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())
