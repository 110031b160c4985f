"""Setting a run up: the model sharded with its optimizer and schedule (Trainer), this rank's loader and
generator, the measured facts throughput is computed from, and the facts the MLPerf log's header states."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flux_cluster.config.schema import SystemConfig
from flux_cluster.config.workload import ModelArgs, TrainingPlan
from flux_cluster.data.format import split_size
from flux_cluster.data.loader import train_loader, val_loader
from flux_cluster.errors import FluxClusterError
from flux_cluster.runtime.dist import DistInfo, refusal
from flux_cluster.training.attention import probe_backend
from flux_cluster.training.context import JobContext
from flux_cluster.training.flops import training_flops_per_sample
from flux_cluster.training.memory import CheckpointingChoice, resolve_checkpointing
from flux_cluster.training.metrics import say
from flux_cluster.training.mlperf_log import RunFacts
from flux_cluster.training.model import add_lora, build_model, load_lora_init
from flux_cluster.training.optimizers import build_optimizer
from flux_cluster.training.parallelize import make_mesh, parallelize
from flux_cluster.training.peak import GemmPeak, measure_gemm_peak
from flux_cluster.training.pretrained import pretrained_base
from flux_cluster.training.quantized_base import (
    QuantizedBase,
    logical_parameter_count,
    parameter_bytes,
    quantize_base,
    whole_base_notice,
)


@dataclass
class Trainer:
    """The model as it trains: sharded, compiled, with its optimizer and learning-rate schedule."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    dtype: torch.dtype
    checkpointing: str = "full"
    """The activation checkpointing mode in use ('auto' resolved)."""
    auto_choice: CheckpointingChoice | None = None
    """How 'auto' chose it (None for a configured mode)."""
    base: QuantizedBase | None = None
    """Mode 'lora': how the frozen base is stored (train.base_precision)."""
    parameter_bytes: int = 0
    """This rank's parameter bytes once sharded (frozen base, adapters, everything)."""


def build_trainer(
    plan: TrainingPlan,
    info: DistInfo,
    seed: int,
    gpu_memory_gb: float | None = None,
    data_dir: Path | None = None,
) -> Trainer:
    """The model (random init, or pretrained with LoRA adapters), sharded by FSDP2 with checkpointing and
    compile per block, its optimizer and linear warmup. The same on every rank: seeded before init.
    ``gpu_memory_gb`` (the system's) is what checkpointing 'auto' fits into, at ``data_dir``'s tokens."""
    cfg = plan.train
    dtype = getattr(torch, cfg.param_dtype)
    tokens = None  # Kontext's control tokens double the image tokens: 'auto' must count them
    if cfg.activation_checkpointing == "auto" and data_dir is not None:
        tokens = sample_tokens(first_val_batch(data_dir))
    checkpointing, choice = resolve_checkpointing(plan, gpu_memory_gb, tokens)
    torch.manual_seed(seed)  # the same initial weights on every rank
    pretrained = cfg.pretrained_path if cfg.mode != "pretrain" else None
    try:  # read a tensor at a time by the checked reader; LoRA: quantized as read, never whole in fp32
        streamed = pretrained_base(Path(pretrained), cfg.base_precision, cfg.mode) if pretrained else None
        model = streamed or build_model(plan.model_args, pretrained)
    except FluxClusterError as exc:  # every rank reads the same folder: rank 0 says it, the others exit 1
        raise refusal(info.rank, f"error: {exc}") from None
    base = None
    if cfg.mode == "lora":
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
        if cfg.lora_init:
            try:
                load_lora_init(model, Path(cfg.lora_init), cfg.lora_rank, cfg.lora_targets)
            except FluxClusterError as exc:
                raise refusal(info.rank, f"error: {exc}") from None
        base = quantize_base(model, cfg.base_precision, dtype)
        say(info.rank == 0, base.describe())
        notice = whole_base_notice(base, logical_parameter_count(model), dtype.itemsize, plan.dp_shard)
        if notice:
            say(info.rank == 0, notice)
    mesh = make_mesh(info.device, plan.dp_replicate, plan.dp_shard)
    parallelize(
        model,
        mesh,
        info.device,
        param_dtype=dtype,
        activation_checkpointing=checkpointing,
        compile_blocks=cfg.compile,
        precision=cfg.precision,
        accumulation_steps=plan.grad_accum_steps,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(cfg.optimizer, params, plan.learning_rate, info.device)
    warmup = plan.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
    )
    return Trainer(
        model, params, optimizer, scheduler, dtype, checkpointing, choice, base, parameter_bytes(model)
    )


def plan_loader(plan: TrainingPlan, data_dir: Path, info: DistInfo, seed: int) -> Any:
    """This rank's Energon loader of the train split, as the plan sets it (micro-batch, workers, CFG)."""
    cfg = plan.train
    return train_loader(
        data_dir,
        batch_size=cfg.micro_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        seed=seed,
        num_workers=cfg.loader_workers,
        cfg_dropout=cfg.caption_dropout_rate,
    )


def step_generator(info: DistInfo, seed: int) -> torch.Generator:
    """Each rank draws its own latents, noise and times (a distinct seed per data-parallel rank)."""
    return torch.Generator(info.device).manual_seed(seed * 100_003 + info.rank)


@dataclass(frozen=True)
class MeasuredFacts:
    """What throughput figures are computed from: FLOPs per sample, the attention kernel, the GEMM peak."""

    flops_per_sample: float
    kernel: str
    peak: GemmPeak
    """The measured dense-matmul TFLOP/s of this device."""


def measure_facts(
    system: SystemConfig,
    plan: TrainingPlan,
    info: DistInfo,
    dtype: torch.dtype,
    model_args: ModelArgs,
    image_tokens: int,
    text_tokens: int,
    config_filename: str,
) -> MeasuredFacts:
    """Probe the attention kernel at the run's shapes (a bad train.attention_backend is one line) and
    measure the GEMM peak; rank 0 says both."""
    cfg = plan.train
    try:
        kernel = probe_backend(
            cfg.attention_backend,
            info.device,
            dtype,
            model_args.num_attention_heads,
            model_args.attention_head_dim,
            image_tokens + text_tokens,
        )
    except RuntimeError as exc:
        raise SystemExit(f"{config_filename}: {exc}") from None
    peak = measure_gemm_peak(info.device, dtype)
    say(
        info.rank == 0,
        f"attention kernel: {kernel} (train.attention_backend {cfg.attention_backend}); measured "
        f"{peak.dtype} GEMM peak {peak.tflops:.3g} TFLOP/s at {'x'.join(map(str, peak.shape))} "
        f"(datasheet: {system.peak_bf16_tflops:g})",
    )
    flops = training_flops_per_sample(model_args.shape(), image_tokens, text_tokens)
    return MeasuredFacts(flops, kernel, peak)


def run_facts(ctx: JobContext, train_samples: int | None) -> RunFacts:
    from flux_cluster.config.workload import load_workload
    from flux_cluster.mlperf_rules import closed_division_deviations

    cfg, system, mlperf = ctx.plan.train, ctx.system, ctx.plan.mlperf
    precision = "bfloat16" if cfg.param_dtype == "bfloat16" else "fp32"
    eval_samples = split_size(ctx.data_dir, "val")
    deviations = []
    if mlperf is not None:
        train_samples = train_samples or mlperf.train_samples
        eval_samples = eval_samples or mlperf.eval_samples
        deviations = closed_division_deviations(
            cfg.model_dump(),
            mlperf.model_dump(),
            load_workload(cfg.benchmark)[0].batch_presets.keys(),
            train_samples,
            eval_samples,
        )
    return RunFacts(
        submission_org=system.mlperf.submission_org,
        submission_platform=system.name,
        global_batch_size=ctx.plan.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        learning_rate=ctx.plan.learning_rate,
        warmup_steps=ctx.plan.warmup_steps,
        train_samples=train_samples or 0,
        eval_samples=eval_samples or 0,
        config_filename=ctx.config_filename,
        division="closed" if cfg.mode == "pretrain" else "open",
        gradient_accumulation_steps=ctx.plan.grad_accum_steps,
        precision_linear="fp8" if cfg.precision == "fp8" else precision,
        precision_attn=precision,
        precision_comm=precision,
        seed=ctx.seed,
        eval_every_steps=cfg.eval_every_steps,
        deviations=tuple(deviations),
        optimizer=cfg.optimizer,
        benchmark="flux1" if mlperf is not None else cfg.benchmark,
        batch_fit=ctx.plan.batch_fit,
    )


def token_counts(data_dir: Path, args: ModelArgs, model_name: str) -> tuple[int, int]:
    """(image tokens, text tokens) of this dataset, from one val sample, checked against the model."""
    batch = first_val_batch(data_dir)
    if batch.t5.shape[-1] != args.joint_attention_dim or batch.clip.shape[-1] != args.pooled_projection_dim:
        raise SystemExit(
            f"{data_dir}: T5 width {batch.t5.shape[-1]} and CLIP width {batch.clip.shape[-1]} do not fit "
            f"model {model_name!r} (joint_attention_dim {args.joint_attention_dim}, "
            f"pooled_projection_dim {args.pooled_projection_dim}); choose another train.model or dataset"
        )
    return sample_tokens(batch)


def first_val_batch(data_dir: Path) -> Any:
    return next(iter(val_loader(data_dir, batch_size=1, rank=0, world_size=1)))


def sample_tokens(batch: Any) -> tuple[int, int]:
    """(image tokens, text tokens) of a batch's samples: 2x2 latent patches, Kontext's control ones too."""
    height, width = batch.mean.shape[-2:]
    controls = 0 if batch.control is None else batch.control[0, 0].numel() // 4  # edit pairs: Kontext's extra
    return (height // 2) * (width // 2) + controls, batch.t5.shape[1]
