"""The throughput job: the workload's training step, untimed warm-up steps then timed ones, no evaluation
and no checkpoints; one JSON record per run (results/throughput.json) with samples/s, step time
percentiles, TFLOP/s, MFU, peak memory and data wait. An out-of-memory error (CUDA's and HIP's both raise
torch.OutOfMemoryError) is caught and recorded as status 'oom' with the memory figures, so a sweep can go on.

Batches come from the dataset (the train split, through the same Energon loader as training) or, with
--synthetic, are made once in memory with the dataset's shapes (flux1's 256 T5 tokens of 4096, CLIP 768,
16x32x32 latents; the tiny shapes for the tiny model) and reused every step: no dataset, no data wait.
"""

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from flux_cluster.atomic import write_atomic
from flux_cluster.config.schema import SystemConfig
from flux_cluster.config.workload import ModelArgs, TrainingPlan
from flux_cluster.data.format import DIMS, Dims
from flux_cluster.errors import causes
from flux_cluster.rundir import CONFIG_FILE, throughput_file
from flux_cluster.runtime.dist import DistInfo, init_distributed
from flux_cluster.runtime.signals import die_with_parent, under_torchrun
from flux_cluster.training.attention import attention_backend
from flux_cluster.training.loop import train_step
from flux_cluster.training.trainer import (
    build_trainer,
    measure_facts,
    plan_loader,
    step_generator,
    token_counts,
)

OOM_EXIT_CODE = 4
"""Exit code of a throughput run that ran out of accelerator memory (its record says status 'oom')."""
TEST_OOM_ENV = "FLUX_CLUSTER_TEST_OOM_FROM_MICRO_BATCH"
"""Test hook: a throughput run whose micro-batch size is at least this raises torch.OutOfMemoryError in
its first step, so the oom path (record, exit code, a sweep that goes on) is tested without a GPU."""


@dataclass(frozen=True)
class ThroughputJob:
    system: SystemConfig
    plan: TrainingPlan
    run_dir: Path
    data_dir: Path | None
    """None: synthetic batches."""
    seed: int
    warmup_steps: int
    steps: int
    started: float
    """time.monotonic() when the process started: the record's wall_s (GPU time) counts from there."""

    @property
    def record_path(self) -> Path:
        return throughput_file(self.run_dir)


@dataclass
class _SyntheticBatch:
    mean: torch.Tensor
    logvar: torch.Tensor
    t5: torch.Tensor
    clip: torch.Tensor
    control: torch.Tensor | None = None
    """Text-to-image: no edit-pair control latents (train_step reads the field of every batch)."""


def synthetic_dims(args: ModelArgs) -> Dims:
    """The dataset shapes that fit the model: its text widths and latent channels pick them."""
    for dims in DIMS.values():
        widths = (dims.t5_dim, dims.clip_dim, dims.latent_channels * 4)
        if widths == (args.joint_attention_dim, args.pooled_projection_dim, args.in_channels):
            return dims
    raise SystemExit(
        f"error: --synthetic: no known sample shape fits the model (T5 width {args.joint_attention_dim}, "
        f"CLIP width {args.pooled_projection_dim}); measure on a dataset instead"
    )


def _synthetic_batches(dims: Dims, micro_batch: int, device: torch.device, seed: int) -> Any:
    """One batch of the dataset's dtype (bf16) and shapes, on the device, for ever."""
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape: int, scale: float = 1.0) -> torch.Tensor:
        values = torch.randn((micro_batch, *shape), generator=generator) * scale
        return values.to(torch.bfloat16).to(device)

    latent = (dims.latent_channels, dims.latent_size, dims.latent_size)
    batch = _SyntheticBatch(
        mean=tensor(*latent),
        logvar=tensor(*latent, scale=0.1) - 4.0,
        t5=tensor(dims.t5_tokens, dims.t5_dim, scale=0.5),
        clip=tensor(dims.clip_dim, scale=0.5),
    )
    while True:
        yield batch


def measure(job: ThroughputJob) -> int:
    """Run the measurement on this rank; returns the process exit code (0, or OOM_EXIT_CODE)."""
    if under_torchrun():
        die_with_parent()
    info = init_distributed(job.system.dist_backend)
    record = _facts(job, info)
    try:
        with attention_backend(job.plan.train.attention_backend, info.device):
            record.update(_measure(job, info))
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        # Other ranks may wait in a collective for this one: no more collectives; this rank writes the
        # record and leaves, and torchrun stops the rest.
        message = " ".join(str(exc).split())[:300]
        record.update(status="oom", error=f"out of memory on rank {info.rank}: {message}", **_memory(info))
        record["wall_s"] = time.monotonic() - job.started
        write_atomic(job.record_path, _json(record))
        print(f"[throughput] rank {info.rank}: {record['error']}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(OOM_EXIT_CODE)
    record["wall_s"] = time.monotonic() - job.started
    if info.rank == 0:
        write_atomic(job.record_path, _json(record))
        print(f"[throughput] {_line(record)}", flush=True)
        print(f"[throughput] record: {job.record_path}", flush=True)
    dist.destroy_process_group()
    return 0


def out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError, also where torch.compile (dynamo, inductor) wrapped it in its own error."""
    return any(isinstance(cause, torch.OutOfMemoryError) for cause in causes(exc))


def _facts(job: ThroughputJob, info: DistInfo) -> dict[str, Any]:
    cfg = job.plan.train
    return {
        "status": "running",
        "system": job.system.name,
        "nodes": job.system.nodes,
        "world_size": info.world_size,
        "model": cfg.model,
        "mode": cfg.mode,
        "micro_batch_size": cfg.micro_batch_size,
        # how train.micro_batch_size 'auto' chose it at submit (None: set in the config)
        "micro_batch_auto": auto.model_dump() if (auto := job.plan.micro_batch_auto) else None,
        "global_batch_size": job.plan.global_batch_size,
        "grad_accum_steps": job.plan.grad_accum_steps,
        "param_dtype": cfg.param_dtype,
        "precision": cfg.precision,
        "activation_checkpointing": cfg.activation_checkpointing,
        "compile": cfg.compile,
        "optimizer": cfg.optimizer,
        "synthetic": job.data_dir is None,
        "warmup_steps": job.warmup_steps,
        "steps": job.steps,
        "peak_tflops": job.system.peak_bf16_tflops,
        "price_per_gpu_hour": job.system.price_per_gpu_hour,
    }


def _measure(job: ThroughputJob, info: DistInfo) -> dict[str, Any]:
    plan, cfg = job.plan, job.plan.train
    trainer = build_trainer(plan, info, job.seed, job.system.gpu_memory_gb, job.data_dir)
    model_args = ModelArgs.of(trainer.model.config)
    if job.data_dir is None:
        dims = synthetic_dims(model_args)
        image_tokens, text_tokens = (dims.latent_size // 2) ** 2, dims.t5_tokens
        batches = _synthetic_batches(dims, cfg.micro_batch_size, info.device, job.seed + info.rank)
    else:
        image_tokens, text_tokens = token_counts(job.data_dir, model_args, cfg.model)
        batches = iter(plan_loader(plan, job.data_dir, info, job.seed))
    facts = measure_facts(
        job.system, plan, info, trainer.dtype, model_args, image_tokens, text_tokens, CONFIG_FILE
    )
    generator = step_generator(info, job.seed)
    injected = os.environ.get(TEST_OOM_ENV)
    times, waits, queued_s = [], [], []
    for step in range(job.warmup_steps + job.steps):
        if injected and cfg.micro_batch_size >= int(injected):
            raise torch.OutOfMemoryError(f"injected by {TEST_OOM_ENV}={injected} (a test)")
        begun, queued = time.perf_counter(), _queued_s()
        _, _, data_wait = train_step(trainer, batches, generator, plan, info)
        trainer.scheduler.step()
        if info.device.type == "cuda":  # a step's time includes its GPU work
            torch.cuda.synchronize(info.device)
        if step >= job.warmup_steps:
            times.append(time.perf_counter() - begun)
            queued_s.append(_queued_s() - queued)
            waits.append(data_wait)
    # every rank's step times: the slowest rank sets the pace
    per_rank = torch.tensor(times, dtype=torch.float64, device=info.device)
    dist.all_reduce(per_rank, op=dist.ReduceOp.MAX)
    step_s = per_rank.cpu().numpy()
    memory = _memory(info)
    peak = torch.tensor([memory["peak_memory_gb"]], dtype=torch.float64, device=info.device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    memory["peak_memory_gb"] = peak.item()
    # the waits for a CPU (a shared machine's load): a rank another rank's queueing held up waited for it
    # asleep, so the step lost between the most one rank queued and what all of them queued together
    queued = torch.tensor(queued_s, dtype=torch.float64, device=info.device)
    most, together = queued.clone(), queued.clone()
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    dist.all_reduce(together, op=dist.ReduceOp.SUM)
    wait = torch.tensor([float(np.mean(waits))], dtype=torch.float64, device=info.device)
    dist.all_reduce(wait, op=dist.ReduceOp.MAX)
    mean_s = float(step_s.mean())
    samples_per_s = plan.global_batch_size / mean_s
    tflops = facts.flops_per_sample * samples_per_s / info.world_size / 1e12
    p50, p90, p99 = np.percentile(step_s * 1000, [50, 90, 99])
    return {
        "status": "ok",
        "activation_checkpointing": trainer.checkpointing,  # the mode in use ('auto' resolved)
        "samples_per_s": samples_per_s,
        "samples_per_s_per_gpu": samples_per_s / info.world_size,
        "step_time_ms_mean": mean_s * 1000,
        "step_time_ms_p50": float(p50),
        "step_time_ms_p90": float(p90),
        "step_time_ms_p99": float(p99),
        **_unqueued(step_s, most.cpu().numpy(), "unqueued"),
        **_unqueued(step_s, together.cpu().numpy(), "unqueued_all"),
        "tflops_per_gpu": tflops,
        "mfu": tflops / job.system.peak_bf16_tflops if job.system.peak_bf16_tflops else None,
        "mfu_measured": tflops / facts.peak.tflops if facts.peak.tflops else None,
        "measured_peak_tflops": facts.peak.tflops,
        "data_wait_ms": wait.item() * 1000,  # the rank that waited longest
        "attention_kernel": facts.kernel,
        "flops_per_sample": facts.flops_per_sample,
        **memory,
    }


def _unqueued(step_s: Any, queued: Any, name: str) -> dict[str, float]:
    """p50 and p90 of the step times less the waits for a CPU."""
    p50, p90 = np.percentile((step_s - queued) * 1000, [50, 90])
    return {f"step_time_ms_p50_{name}": float(p50), f"step_time_ms_p90_{name}": float(p90)}


def _queued_s() -> float:
    """Seconds this thread has waited for a CPU (Linux schedstat's run-queue delay; 0 elsewhere): on a
    shared machine the part of a step's time that other work's load added."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _memory(info: DistInfo) -> dict[str, Any]:
    """Peak allocated and reserved memory of this rank, and the device's total (GB); a CPU: peak RSS."""
    if info.device.type == "cuda":
        return {
            "peak_memory_gb": torch.cuda.max_memory_allocated(info.device) / 1e9,
            "reserved_memory_gb": torch.cuda.max_memory_reserved(info.device) / 1e9,
            "device_memory_gb": torch.cuda.get_device_properties(info.device).total_memory / 1e9,
        }
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB
    return {"peak_memory_gb": rss, "reserved_memory_gb": None, "device_memory_gb": None}


def _json(record: dict[str, Any]) -> str:
    import json

    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    return json.dumps(clean, indent=2) + "\n"


def _line(record: dict[str, Any]) -> str:
    mfu = record.get("mfu")
    return (
        f"{record['samples_per_s']:,.2f} samples/s ({record['samples_per_s_per_gpu']:,.2f} per GPU), step "
        f"p50 {record['step_time_ms_p50']:,.1f} ms p90 {record['step_time_ms_p90']:,.1f} ms, "
        f"{record['tflops_per_gpu']:.3g} TFLOP/s/GPU, MFU {f'{mfu:.1%}' if mfu is not None else '-'}, "
        f"peak memory {record['peak_memory_gb']:.2f} GB, data wait {record['data_wait_ms']:.1f} ms "
        f"({record['steps']} timed steps after {record['warmup_steps']} warm-up)"
    )
