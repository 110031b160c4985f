"""Preflight's model step: a few training steps of the system's model, cut to one double-stream and one
single-stream block at full width, on every GPU with the system's own train settings (compute dtype,
activation checkpointing, compile, attention backend, FSDP2 mixed precision, the optimizer). A stack that
cannot train (cuDNN attention failing in backward, checkpointing that breaks under FSDP on an old torch)
fails here in minutes, not at the first backward pass of a 12-hour allocation.

Each rank works alone (FSDP over a one-rank group), so the figures are per GPU and one broken GPU cannot
hang the others; the all_reduce part of the preflight checks the interconnect.
"""

import math
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from flux_cluster.config.training import ops_whole_blocks
from flux_cluster.config.workload import ModelArgs, TrainingPlan
from flux_cluster.data.format import DIMS, Dims
from flux_cluster.training.attention import attention_backend, probe_backend
from flux_cluster.training.flops import training_flops_per_sample
from flux_cluster.training.memory import resolve_checkpointing
from flux_cluster.training.model import build_model, predict_velocity
from flux_cluster.training.parallelize import parallelize
from flux_cluster.training.peak import measure_gemm_peak, synchronize


def data_dims(args: ModelArgs) -> Dims:
    """The dataset shapes a model of these widths trains on (MLPerf's real ones, or the tiny test ones)."""
    for dims in DIMS.values():
        if (dims.t5_dim, dims.clip_dim) == (args.joint_attention_dim, args.pooled_projection_dim):
            return dims
    raise ValueError(
        f"no dataset shape has T5 width {args.joint_attention_dim} "
        f"and CLIP width {args.pooled_projection_dim}"
    )


def checked_mode(checkpointing: str) -> str:
    """The mode the cut-down model (one block of each kind) runs for ``checkpointing``: an ops+N would
    wrap both of its blocks whole and never run the selective wrapper, so it runs ops+1 (one of each)."""
    return "ops+1" if ops_whole_blocks(checkpointing) is not None else checkpointing


def settings_text(plan: TrainingPlan, checkpointing: str | None = None) -> str:
    cfg = plan.train
    mode = cfg.activation_checkpointing
    if checkpointing is not None and checkpointing != mode:
        mode = f"{mode} -> {checkpointing}"
    if checkpointing is not None and checked_mode(checkpointing) != checkpointing:
        mode += f" (checked as {checked_mode(checkpointing)}: one block of each kind)"
    return (
        f"{plan.train.model} block, mbs {cfg.micro_batch_size}, {cfg.param_dtype}"
        f"{', fp8 linears' if cfg.precision == 'fp8' else ''}, activation checkpointing "
        f"{mode}, compile {'on' if cfg.compile else 'off'}, "
        f"attention {cfg.attention_backend}"
    )


def own_mesh(device: torch.device) -> DeviceMesh:
    """A one-rank mesh per rank (a collective: every rank calls it)."""
    group, _ = dist.new_subgroups(group_size=1)
    return DeviceMesh.from_group(group, device.type)


def run_model_check(
    plan: TrainingPlan,
    device: torch.device,
    mesh: DeviceMesh,
    steps: int = 3,
    gpu_memory_gb: float | None = None,
) -> dict[str, Any]:
    """Train one block of each kind for 1 + ``steps`` steps (the first compiles and warms up) with the
    checkpointing mode the job would use ('auto' resolved for the whole model and ``gpu_memory_gb``);
    report the timed steps' TFLOP/s and the GEMM peak. Never raises: a failure is ``ok: False`` and one
    line."""
    cfg = plan.train
    checkpointing, _ = resolve_checkpointing(plan, gpu_memory_gb)
    result: dict[str, Any] = {"settings": settings_text(plan, checkpointing), "ok": False, "detail": ""}
    try:
        args = plan.model_args.model_copy(update={"num_layers": 1, "num_single_layers": 1})
        dims = data_dims(args)
        image_tokens = (dims.latent_size // 2) ** 2
        dtype = getattr(torch, cfg.param_dtype)
        with attention_backend(cfg.attention_backend, device):
            result["attention_kernel"] = probe_backend(
                cfg.attention_backend,
                device,
                dtype,
                args.num_attention_heads,
                args.attention_head_dim,
                image_tokens + dims.t5_tokens,
            )
            seconds = _train_steps(plan, args, dims, device, mesh, dtype, steps, checked_mode(checkpointing))
        flops = training_flops_per_sample(args.shape(), image_tokens, dims.t5_tokens) * cfg.micro_batch_size
        result["step_ms"] = seconds * 1e3
        result["step_tflops"] = flops / seconds / 1e12
        peak = measure_gemm_peak(device, dtype)
        result["gemm_peak_tflops"] = peak.tflops
        result["gemm_peak_shape"] = list(peak.shape)
        result["ok"] = True
        result["detail"] = (
            f"{result['step_tflops']:.3g} TFLOP/s per step ({result['step_tflops'] / peak.tflops:.0%} of the "
            f"measured GEMM peak {peak.tflops:.3g})"
        )
    except Exception as exc:  # any failure of the stack is the finding, reported in one line
        message = str(exc).strip().splitlines()
        result["detail"] = f"{type(exc).__name__}: {message[0] if message else 'no message'}"[:400]
    return result


def _train_steps(
    plan: TrainingPlan,
    args: ModelArgs,
    dims: Dims,
    device: torch.device,
    mesh: DeviceMesh,
    dtype: torch.dtype,
    steps: int,
    checkpointing: str,
) -> float:
    """Median seconds per optimizer step of the cut-down model, sharded as the job shards it."""
    cfg = plan.train
    torch.manual_seed(0)
    model = build_model(args, meta_init=device.type == "cuda")
    parallelize(
        model,
        mesh,
        device,
        param_dtype=dtype,
        activation_checkpointing=checkpointing,
        compile_blocks=cfg.compile,
        precision=cfg.precision,
    )
    from flux_cluster.training.optimizers import build_optimizer

    optimizer = build_optimizer(cfg.optimizer, list(model.parameters()), 1e-4, device)
    b = cfg.micro_batch_size
    size = dims.latent_size
    x_t = torch.randn(b, dims.latent_channels, size, size, device=device)
    target = torch.randn_like(x_t)
    t = torch.rand(b, device=device)
    t5 = torch.randn(b, dims.t5_tokens, dims.t5_dim, device=device)
    clip = torch.randn(b, dims.clip_dim, device=device)
    times = []
    for _ in range(1 + steps):
        synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(predict_velocity(model, x_t, t, t5, clip, dtype).float(), target)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
        if not (math.isfinite(loss.item()) and math.isfinite(float(norm))):
            raise FloatingPointError(f"non-finite loss {loss.item()} or gradient norm {float(norm)}")
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    timed = sorted(times[1:])
    return timed[len(timed) // 2]
