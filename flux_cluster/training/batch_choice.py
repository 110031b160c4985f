"""``train.micro_batch_size: auto``: the micro-batch chosen by memory, at submit time.

Checkpointing first, micro-batch second. The mode is the configured activation checkpointing, or for
'auto' the first of memory.auto_order (least recompute first) in which a divisor of the per-rank share of at
least the floor fits; the micro-batch is then the largest divisor of the share whose estimated peak
under that mode fits the GPU's memory less AUTO_HEADROOM (what checkpointing 'auto' leaves). The floor
is the largest divisor of the share up to the default micro-batch (16). So 'auto' never trades
recomputation for a bigger micro-batch (the gains measured on one H200 are at equal mode: ops at mbs 64
113.5 samples/s against 103.3 at mbs 32, full at mbs 32 83.6 against 72.8 at 16), and never picks less
than the fixed default silently: when nothing as large as the floor fits in any mode, the largest
divisor that fits under the last mode (full, the least memory) wins and the choice says so.

The estimate is flux1's: 256 image and 256 text tokens a sample (the MLPerf shapes; the synthetic tiny
dims have fewer, so it is conservative there). At the job's start checkpointing 'auto' takes the first
mode that fits at the chosen micro-batch at the dataset's own tokens: the mode chosen here where those are
flux1's 256 and 256, less recompute where fewer (the synthetic tiny data), possibly more where more
(Kontext's control tokens).
"""

import torch

from flux_cluster.config.schema import SystemConfig
from flux_cluster.config.training import DEFAULT_MICRO_BATCH
from flux_cluster.config.workload import MicroBatchChoice, ModelArgs, load_workload, resolve_training
from flux_cluster.errors import FluxClusterError
from flux_cluster.training.memory import (
    LoraShape,
    auto_order,
    budget_gb,
    choose_checkpointing,
    estimate_memory,
    lora_shape,
)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_micro_batch(
    args: ModelArgs,
    shard: int,
    share: int,
    checkpointing: str,
    gpu_memory_gb: float,
    *,
    floor: int = DEFAULT_MICRO_BATCH,
    compiled: bool = True,
    dtype_name: str = "bfloat16",
    lora: LoraShape | None = None,
) -> MicroBatchChoice:
    """The micro-batch for a rank's ``share`` of the global batch, FSDP-sharded over ``shard`` ranks,
    under ``checkpointing`` (a mode or 'auto'), fitting ``gpu_memory_gb`` (module docstring)."""
    budget = budget_gb(gpu_memory_gb)
    candidates = divisors(share)
    least = max(d for d in candidates if d <= floor)
    modes = auto_order(args) if checkpointing == "auto" else (checkpointing,)

    def estimate(micro_batch: int, mode: str) -> float:
        return estimate_memory(
            args,
            shard,
            micro_batch,
            mode,
            compiled=compiled,
            gradients_held=share > micro_batch,  # several micro-batches a step: gradients accumulate
            dtype=getattr(torch, dtype_name),
            lora=lora,
        ).total_gb

    def largest(mode: str) -> int | None:
        # every divisor: the peak is not monotone where the share itself needs no accumulation
        return next((d for d in reversed(candidates) if estimate(d, mode) <= budget), None)

    chosen = None
    for mode in modes:
        best = largest(mode)
        if best is not None and best >= least:
            chosen = best
            break
    if chosen is None:  # nothing as large as the floor fits: the most under the least memory
        chosen = largest(modes[-1]) or 1
    # the mode checkpointing 'auto' takes at this micro-batch at flux1's tokens
    mode = checkpointing
    if checkpointing == "auto":
        mode = choose_checkpointing(
            args,
            shard,
            chosen,
            gpu_memory_gb,
            compiled=compiled,
            gradients_held=share > chosen,
            dtype=getattr(torch, dtype_name),
            lora=lora,
        ).mode
    return MicroBatchChoice(
        micro_batch=chosen,
        share=share,
        checkpointing=mode,
        estimate_gb=estimate(chosen, mode),
        budget_gb=budget,
        floor=least,
    )


def resolve_micro_batch(system: SystemConfig) -> tuple[SystemConfig, MicroBatchChoice | None]:
    """``system`` with train.micro_batch_size 'auto' replaced by the chosen micro-batch, and the choice
    (None where a number is set). One line for what 'auto' cannot serve."""
    train = system.train
    if train.micro_batch_size != "auto":
        return system, None
    workload, path = load_workload(train.benchmark)
    if workload.kind != "mlperf":
        raise FluxClusterError(
            f"train.micro_batch_size: 'auto' is for the flux1 workload (its global batch, its shapes); "
            f"workload {path.name} needs a number"
        )
    if system.gpu_memory_gb is None:
        raise FluxClusterError(
            f"train.micro_batch_size: 'auto' needs the system's gpu_memory_gb (system {system.name} sets "
            "none); set gpu_memory_gb or a number"
        )
    assert workload.mlperf is not None
    gbs = train.global_batch_size or workload.mlperf.global_batch_size
    world = system.nodes * system.gpus_per_node
    if gbs % world:  # before the split at micro-batch 1 below, which the user never set
        source = f"system {system.name}" if train.global_batch_size else f"workload {path.name}"
        raise FluxClusterError(
            f"train.micro_batch_size: 'auto' needs train.global_batch_size ({gbs}, from {source}) to be a "
            f"multiple of the {world} ranks"
        )
    # the plan at micro-batch 1 (which divides the per-rank share): the global batch, ranks, shard and model
    plan = resolve_training(_with_micro_batch(system, 1))
    cfg = plan.train
    choice = choose_micro_batch(
        plan.model_args,
        plan.dp_shard,
        plan.global_batch_size // plan.world_size,
        cfg.activation_checkpointing,
        system.gpu_memory_gb,
        compiled=cfg.compile,
        dtype_name=cfg.param_dtype,
        lora=lora_shape(cfg),
    )
    return _with_micro_batch(system, choice.micro_batch), choice


def _with_micro_batch(system: SystemConfig, micro_batch: int) -> SystemConfig:
    train = system.train.model_copy(update={"micro_batch_size": micro_batch})
    return system.model_copy(update={"train": train})
