"""The run's meter, both workloads': progress lines every log_every_steps (rank 0), TensorBoard scalars
and the metrics file (results/metrics_<i>.jsonl: a header per attempt, the steps, evaluations and, for
fine-tuning, a summary), over the throughput window, clock and cost of flux_cluster/training/metrics.py.
The FLUX job writes every step's record; the hf workload (flux_cluster/hf/) a record per progress line
with its rates, tokens/s, FLOPs per step and an estimate of its configured epochs."""

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from flux_cluster.atomic import finite_for_json
from flux_cluster.runtime.dist import DistInfo
from flux_cluster.training.context import JobContext
from flux_cluster.training.metrics import (
    RunClock,
    ThroughputWindow,
    Totals,
    end_partial_line,
    gpu_cost,
    peak_memory_gb,
    say,
    time_and_cost,
)

NOT_MEASURED = "not measured (only the first, compiling step ran)"
"""What the summary says of the throughput of a run with no timed step (each attempt's first step,
compilation and warm-up, is not timed): its figures are null, never NaN."""


@dataclass(frozen=True)
class Rates:
    """Throughput over some timed steps; every figure None where nothing was timed, or unknown (tokens of
    images, MFU without a peak)."""

    step_seconds: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_s: float | None = None
    """Per device (GPU)."""
    mfu: float | None = None
    """Against the datasheet's peak."""
    mfu_measured: float | None = None
    """Against the peak the job measured on its own GPU."""

    @property
    def measured(self) -> bool:
        return self.step_seconds is not None


@dataclass(frozen=True)
class RunEnd:
    """What a fine-tuning run's summary reports beside the meter's own figures."""

    steps: int
    samples: int
    epochs: float
    evals: list[float]
    """Every evaluation's validation loss, in order."""
    best: tuple[int, float] | None
    """(step, validation loss) of the best evaluation."""
    optimizer: str
    extra: dict[str, Any] = field(default_factory=dict)
    """More summary keys (the frozen base's precision and bytes)."""
    name: str = ""
    """What was fine-tuned, for the last line (the hf workload's model and settings)."""
    per_epoch: int | None = None
    """Steps per epoch: the summary adds the time per epoch and the estimated time, GPU-hours and cost of
    the configured epochs at the measured rate."""
    block: dict[str, Any] | None = None
    """The hf workload's summary block: its facts, to which the whole run's rates and the estimate go."""


class Meter:
    """Progress lines every log_every_steps (rank 0), TensorBoard scalars and the metrics file; the run's
    clock (training time, timed steps), carried over from the attempts before a resume. Both workloads':
    the FLUX job (per_step: every step's own record, data wait, the measured GEMM peak) and the hf one
    (tokens, a record per progress line with its rates, an estimate of the configured epochs)."""

    def __init__(
        self,
        ctx: JobContext,
        info: DistInfo,
        *,
        flops_per_step: float,
        devices: int,
        peak_tflops: float | None,
        header: dict[str, Any],
        carried: Totals | None = None,
        measured_peak_tflops: float | None = None,
        attempt: int = 0,
        unit: str = "samples/s",
        tokens: bool = False,
        per_step: bool = True,
        tb: Any = None,
    ) -> None:
        self.ctx, self.info, self.flops_per_step = ctx, info, flops_per_step
        self.devices = devices
        """The devices (GPUs) the job trains on: what TFLOP/s per GPU and GPU-hours count."""
        self.peak_tflops, self.measured_peak_tflops = peak_tflops or None, measured_peak_tflops
        self.carried = carried or Totals()
        """The earlier attempts' figures, from the checkpoint resumed from."""
        self.attempt = attempt
        """How many times this repeat was started before (0: the first attempt)."""
        self.unit, self.tokens, self.per_step, self.tb = unit, tokens, per_step, tb
        """tokens: the samples are text, the rates count their tokens too."""
        self.window = ThroughputWindow(info.device)
        self.started = self.window.start
        self.window_data_wait, self.window_samples, self.window_tokens = 0.0, 0, 0
        self.timed_samples, self.timed_tokens = self.carried.timed_samples, self.carried.timed_tokens
        """Samples and tokens of the closed windows, every attempt's."""
        self.window.timed_s = self.carried.clock.timed_seconds
        self.window.timed_steps = self.carried.clock.timed_steps
        self.warmed_up = False
        """An attempt's first step (compilation, allocator and kernel warm-up) is not throughput."""
        self.pending: list[tuple[int, int, torch.Tensor, torch.Tensor, float, float]] = []
        self.last_grad_norm: float | None = None
        if info.rank == 0:
            ctx.metrics_file.parent.mkdir(parents=True, exist_ok=True)
            end_partial_line(ctx.metrics_file)
        self._write(header)  # first record of each attempt: what 'flux-cluster report' needs for MFU

    def _write(self, record: dict[str, Any]) -> None:
        if self.info.rank == 0:
            with self.ctx.metrics_file.open("a") as out:
                out.write(json.dumps(finite_for_json(record)) + "\n")  # JSON has no NaN: null

    def _print(self, line: str) -> None:
        """A progress or evaluation line, rank 0's (no [train] prefix: a column people grep)."""
        if self.info.rank == 0:
            print(line, flush=True)

    @property
    def price(self) -> float:
        return self.ctx.system.price_per_gpu_hour

    def start(self) -> None:
        """At run_start: this attempt's clock and its first throughput window start now."""
        self.started = self.window.start = time.perf_counter()

    def train_seconds(self) -> float:
        """The whole run's training time so far, earlier attempts included."""
        return self.carried.clock.train_seconds + time.perf_counter() - self.started

    def _peak_memory(self) -> float:
        """The highest peak memory of any rank (a collective), any attempt's."""
        # on the device: NCCL reduces CUDA tensors only
        memory = torch.tensor(
            [peak_memory_gb(self.info.device)], dtype=torch.float64, device=self.info.device
        )
        dist.all_reduce(memory, op=dist.ReduceOp.MAX)
        return max(memory.item(), self.carried.clock.peak_memory_gb)

    def totals(self) -> Totals:
        """The whole run's figures now (what a checkpoint carries), the open throughput window included. A
        collective (the peak memory of every rank): every rank calls it."""
        window = self.window
        clock = RunClock(
            self.train_seconds(),
            window.timed_s + (window.seconds() if window.steps else 0.0),
            window.timed_steps + window.steps,
            self.carried.clock.lost_seconds,
            self._peak_memory(),
        )
        return Totals(clock, self.timed_samples + self.window_samples, self.timed_tokens + self.window_tokens)

    def clock(self) -> RunClock:
        """totals()'s clock (a collective)."""
        return self.totals().clock

    def cost(self, seconds: float) -> tuple[float, float | None]:
        """(GPU-hours, USD) of seconds on the job's devices; USD None without the system's price."""
        return gpu_cost(seconds, self.devices, self.price)

    def rates(self, seconds: float, steps: int, samples: int, tokens: int | None) -> Rates:
        if not steps or seconds <= 0:
            return Rates()
        step_s = seconds / steps
        tflops = self.flops_per_step / step_s / self.devices / 1e12
        peak, measured = self.peak_tflops, self.measured_peak_tflops
        return Rates(
            step_s,
            samples / seconds,
            tokens / seconds if tokens is not None else None,
            tflops,
            tflops / peak if peak else None,
            tflops / measured if measured else None,
        )

    def record(
        self,
        step: int,
        samples: int,
        loss: torch.Tensor,
        lr: float,
        *,
        line: bool = False,
        epoch: float | None = None,
        tokens: int | None = None,
        grad_norm: torch.Tensor | None = None,
        data_wait: float = 0.0,
    ) -> None:
        """One optimizer step (samples: the run's so far; tokens: this step's, every rank's, text only); a
        progress line every log_every_steps, and when line is set. The first step of an attempt is
        recorded but not timed: the throughput window starts after it."""
        if self.per_step:  # kept on the device until the next line: reading them now would wait for it
            # a DTensor norm may be Partial: full_tensor is at most a collective, no host sync
            norm = grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm
            norm = torch.full((), math.nan, device=loss.device) if norm is None else norm.detach()
            self.pending.append((step, samples, loss.detach(), norm, lr, data_wait))
        if not self.warmed_up:
            self.warmed_up = True
            self.window.sync()  # waits for the step's GPU work
            self._new_window()
            return
        self.window.add(loss)
        self.window_data_wait += data_wait
        self.window_samples += self.ctx.plan.global_batch_size
        self.window_tokens += tokens or 0
        if step % self.ctx.plan.train.log_every_steps and not line:
            return
        self.flush()
        elapsed, steps = self.window.seconds(), self.window.steps
        tokens_seen = self.window_tokens if self.tokens else None
        rates = self.rates(elapsed, steps, self.window_samples, tokens_seen)
        mean_loss = self.window.mean_loss(self.info.world_size)
        memory, seconds = self._peak_memory(), self.train_seconds()
        so_far, time_scalars = time_and_cost(seconds, self.devices, self.price)
        if self.per_step:  # the steps have their records: the line adds how far a killed attempt got
            self._write({"clock": {"train_seconds": seconds}})
        else:
            where = {"step": step, "samples": samples, "epoch": None if epoch is None else round(epoch, 4)}
            figures = {"loss": mean_loss, **_rate_record(rates), "peak_memory_gb": memory}
            self._write({**where, **figures, "train_seconds": seconds})
        data_wait_ms = self.window_data_wait / steps * 1000
        texts = [f"step {step:>6}", f"samples {samples:>11,}"]
        texts += [f"epoch {epoch:.2f}"] if epoch is not None else []
        texts += [f"loss {mean_loss:.4f}", self._rates_text(rates, data_wait_ms), f"lr {lr:.3g}"]
        self._print(" | ".join([*texts, f"peak mem {memory:.2f} GB", so_far]))
        if self.tb is not None:
            scalars = [
                ("train/loss", mean_loss),
                *(("train/" + k, v) for k, v in _rate_scalars(rates)),
                ("train/lr", lr),
                ("train/peak_memory_gb", memory),
                *time_scalars,
            ]
            if self.per_step:
                scalars += [("train/data_wait_ms", data_wait_ms), ("train/grad_norm", self.last_grad_norm)]
            for name, value in scalars:
                if value is not None and math.isfinite(value):
                    self.tb.add_scalar(name, value, samples)
        self.window.close(elapsed)
        self.timed_samples += self.window_samples
        self.timed_tokens += self.window_tokens
        self._new_window()

    def _rates_text(self, rates: Rates, data_wait_ms: float) -> str:
        """A progress line's rates (a window of at least one timed step)."""
        assert rates.samples_per_s is not None and rates.step_seconds is not None
        parts = [f"{rates.samples_per_s:8,.1f} {self.unit}"]
        if rates.tokens_per_s is not None:
            parts.append(f"{rates.tokens_per_s:,.0f} tokens/s")
        parts.append(f"step {rates.step_seconds * 1000:7,.1f} ms")
        if self.per_step:  # the FLUX job's loader runs beside the step: the time blocked on it
            parts.append(f"data wait {data_wait_ms:6.1f} ms")
        mfu = f"MFU {_percent(rates.mfu)}"
        if self.measured_peak_tflops is not None:
            mfu += f" ({_percent(rates.mfu_measured)} of measured peak)"
        return " | ".join([*parts, f"{rates.tflops_per_s:.3g} TFLOP/s/GPU", mfu])

    def _new_window(self) -> None:
        self.window.reset()
        self.window_data_wait, self.window_samples, self.window_tokens = 0.0, 0, 0

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

    def record_eval(self, step: int, samples: int, loss: float, epoch: float | None) -> None:
        """An evaluation's loss (after pause: the window resumes)."""
        self.window.resume()
        self.flush()
        seconds = self.train_seconds()
        record: dict[str, Any] = {"step": step, "samples": samples, "eval_loss": loss}
        shown = ""
        if epoch is not None:
            record["epoch"] = round(epoch, 4)
            shown = f" | epoch {epoch:g}"
        self._write({**record, "train_seconds": seconds})
        where = f"eval  {step:>6} | samples {samples:>11,}{shown}"
        self._print(f"{where} | validation loss {loss:.4f} | {seconds:,.1f} s")
        if self.tb is not None:
            self.tb.add_scalar("eval/loss", loss, samples)
            if epoch is not None and epoch.is_integer():  # the per-epoch curve, by epoch
                self.tb.add_scalar("eval/loss_per_epoch", loss, int(epoch))
            self.tb.flush()

    def summary(self, end: RunEnd) -> None:
        """Fine-tuning: the figures the fine-tuning benchmarks report, as the metrics file's last record,
        TensorBoard's summary/ scalars and text, and one line. Whole-run figures: a resumed run's earlier
        attempts count (their figures came with the checkpoint). Throughput counts training steps only (no
        evaluation, no set-up); a run with none timed says NOT_MEASURED, its figures null."""
        totals = self.totals()
        clock = totals.clock
        tokens = totals.timed_tokens if self.tokens else None
        rates = self.rates(clock.timed_seconds, clock.timed_steps, totals.timed_samples, tokens)
        wall_s = clock.train_seconds
        gpu_hours, usd = self.cost(wall_s)
        best_step, best_loss = end.best or (None, None)
        summary: dict[str, Any] = {
            "images_per_s": rates.samples_per_s,
            "step_time_ms": None if rates.step_seconds is None else rates.step_seconds * 1000,
            **({} if rates.measured else {"throughput_note": NOT_MEASURED}),
            "timed_steps": clock.timed_steps,  # what those two are measured over, every attempt's
            "train_seconds": wall_s,
            "lost_seconds": clock.lost_seconds,  # of train_seconds: past a killed attempt's last checkpoint
            "gpu_hours": gpu_hours,
            "price_per_gpu_hour": self.price or None,
            "cost_usd": usd,
            "attempts": self.attempt + 1,  # the report takes train_seconds as the run's time when > 1
            "epochs": round(end.epochs, 4),
            "steps": end.steps,
            "samples": end.samples,
            "best_eval_loss": best_loss,
            "best_step": best_step,
            "final_eval_loss": end.evals[-1] if end.evals else None,
            "peak_memory_gb": clock.peak_memory_gb,  # every rank's, every attempt's
            "world_size": self.devices,
            "optimizer": end.optimizer,
            **end.extra,
        }
        estimate = self._estimate(rates, end.per_epoch)
        if end.block is not None:
            figures = {**_rate_record(rates, hf=True), "flops_per_step": self.flops_per_step, **estimate}
            summary["hf"] = {**figures, "epochs": self.ctx.plan.epochs, **end.block}
        self._write({"summary": summary})
        line = self._summary_line(end, summary, rates, estimate)
        say(self.info.rank == 0, line)
        if self.tb is not None:
            for name, value in (*summary.items(), *summary.get("hf", {}).items()):
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    self.tb.add_scalar(f"summary/{name}", value, end.samples)
            self.tb.add_text("summary", line, end.samples)
            self.tb.flush()

    def _estimate(self, rates: Rates, per_epoch: int | None) -> dict[str, Any]:
        """The time per epoch and the configured epochs' time, GPU-hours and cost at the measured rate."""
        if per_epoch is None:
            return {}
        epoch_s = None if rates.step_seconds is None else rates.step_seconds * per_epoch
        total_s = None if epoch_s is None else epoch_s * self.ctx.plan.epochs
        hours, usd = self.cost(total_s) if total_s is not None else (None, None)
        return {
            "epoch_seconds": epoch_s,
            "estimated_total_seconds": total_s,
            "estimated_gpu_hours": hours,
            "estimated_cost_usd": usd,
        }

    def _summary_line(self, end: RunEnd, summary: dict[str, Any], rates: Rates, estimate: dict) -> str:
        attempts = ""
        if summary["attempts"] > 1:
            redone = f", {summary['lost_seconds']:,.1f} s of them redone" if summary["lost_seconds"] else ""
            attempts = f" ({summary['attempts']} attempts{redone})"
        if rates.measured:
            assert rates.samples_per_s is not None and rates.step_seconds is not None
            speed = f"{rates.samples_per_s:,.1f} {self.unit}"
            speed += f", {rates.tokens_per_s:,.0f} tokens/s" if rates.tokens_per_s is not None else ""
            speed += f", step {rates.step_seconds * 1000:,.1f} ms"
        else:
            speed = f"{self.unit} {NOT_MEASURED}"
        if end.block is not None:
            speed += f", {self.flops_per_step / 1e12:.3g} TFLOPs/step"
        evals = "no validation loss"
        if end.best is not None and end.evals:
            evals = f"best validation loss {end.best[1]:.4f} (step {end.best[0]}), final {end.evals[-1]:.4f}"
        usd = summary["cost_usd"]
        cost = f", ${usd:,.2f} at ${self.price:g}/GPU-hour" if usd is not None else ""
        line = (
            f"fine-tuned {end.name + ' ' if end.name else ''}{summary['epochs']:g} epochs in "
            f"{summary['train_seconds']:,.1f} s{attempts}: {speed}, {evals}, peak memory "
            f"{summary['peak_memory_gb']:.2f} GB, {summary['gpu_hours']:.4g} GPU-hours{cost}"
        )
        if estimate.get("epoch_seconds") is not None:
            usd = estimate["estimated_cost_usd"]
            total, hours = estimate["estimated_total_seconds"], estimate["estimated_gpu_hours"]
            line += (
                f"; an epoch {estimate['epoch_seconds']:,.1f} s: {self.ctx.plan.epochs} epochs an estimated "
                f"{total:,.1f} s, {hours:.4g} GPU-hours" + (f", ${usd:,.2f}" if usd is not None else "")
            )
        return line


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _rate_record(rates: Rates, hf: bool = False) -> dict[str, Any]:
    """Rates as the metrics file's keys: a progress line's record (step_seconds), the hf summary block's."""
    record = {
        "samples_per_s": rates.samples_per_s,
        "tokens_per_s": rates.tokens_per_s,
        "tflops_per_s": rates.tflops_per_s,
        "mfu": rates.mfu,
    }
    return record if hf else {"step_seconds": rates.step_seconds, **record}


def _rate_scalars(rates: Rates) -> list[tuple[str, float | None]]:
    """Rates as TensorBoard's train/ tags."""
    step_ms = None if rates.step_seconds is None else rates.step_seconds * 1000
    return [
        ("samples_per_s", rates.samples_per_s),
        ("tokens_per_s", rates.tokens_per_s),
        ("step_time_ms", step_ms),
        ("tflops_per_gpu", rates.tflops_per_s),
        ("mfu", rates.mfu),
        ("mfu_measured_peak", rates.mfu_measured),
    ]
