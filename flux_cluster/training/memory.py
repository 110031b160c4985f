"""Per-GPU memory of training a FLUX transformer the job's way (FSDP2, bf16 compute, fp32 master weights),
estimated without a GPU. GB here is 1e9 bytes, as ``torch.cuda.max_memory_allocated() / 1e9``.

- weights and optimizer: float32 weights, float32 gradients and AdamW's two float32 states, 16 bytes per
  parameter, sharded over the FSDP group (``world_size`` ranks). A LoRA run: 16 bytes per adapter
  parameter and the frozen base at its precision, sharded in bf16, whole on every rank in fp8 or nf4.
- gathered parameters: FSDP all-gathers a block's parameters in the compute dtype just before it runs and
  prefetches the next: two blocks are unsharded at once, in the backward with their compute-dtype
  gradients, and the gradient being reduced is cast to float32 for the reduce-scatter (``reduce_dtype``;
  on one rank it is only copied, in the compute dtype).
  The root unit (embedders and head) stays gathered from the forward through the backward. A LoRA run
  gathers a bf16 base but not a quantized one, and has gradients for its adapters only.
- activations: what the autograd graph keeps when the forward is done, measured by running one
  double-stream and one single-stream block at the real shapes on the meta device (no memory, no
  compute), both plain and wrapped as the job wraps them (``wrap_for_checkpointing``); summed over the
  blocks as ``block_wrappings()`` wraps them under the mode; plus what one checkpointed block recomputes in
  its backward; plus the root (embedders, head, loss: a model with one block of each kind, less those).

How the bytes are counted: a dispatch mode holds one reference to the storage of every tensor the
forward creates; when the forward is done a storage that something else still references is kept by the
graph: autograd's saved tensors, a checkpoint's saved inputs, or its selective cache ('ops'), which
``saved_tensors_hooks`` cannot see. Storages count once each (views share them); parameters and the
block's outputs are left out. For a plain block this is what ``saved_tensors_hooks`` sees; for a whole-
block checkpointed one, its inputs. The meta device gives storages their real sizes, so the count equals
a real run's (tests/unit/training/test_memory.py checks both against the CPU). Attention is routed to the
flash kernel's autograd (it keeps q, k, v, the output and the log-sum-exp), as ``attention_backend("auto")``
picks on GPUs; the meta device would otherwise take the math kernel, which keeps the attention matrix.

- the peak: gradients are freed between steps, so the forward's activations and the full gradients are
  never held together (MemoryEstimate.total_gb), unless gradients accumulate over micro-batches.
- torch.compile: compiled blocks keep COMPILED_KEPT_FRACTION of what eager blocks keep, fitted to
  compiled peaks measured on one H200 (within 10% for every mode measured;
  tests/unit/training/test_memory.py).

Approximations: the inputs every block shares (the conditioning vector and the rotary tables) are counted
once, in the root, although FSDP casts the rotary tables per block; layer-norm statistics are float32 as
on CUDA. Not modelled: the backward's transients (activation gradients of the block in progress, kernel
workspaces), the CUDA context (~0.5 GB, outside ``max_memory_allocated``) and allocator fragmentation.
"""

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import flux_cluster.models.quiet  # noqa: F401  (before diffusers: quiets torchao's import notices)

# isort: split
import torch
import torch.nn.functional as F
from diffusers import FluxTransformer2DModel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flux_cluster.config.training import TrainConfig
from flux_cluster.config.workload import ModelArgs, TrainingPlan
from flux_cluster.training.model import parameter_count, predict_velocity
from flux_cluster.training.parallelize import block_wrappings, wrap_for_checkpointing

GB = 1e9
MASTER_BYTES_PER_PARAM = 16
"""float32 weights, gradients, and AdamW's exp_avg and exp_avg_sq."""
IN_FLIGHT_BLOCKS = 2
"""Blocks unsharded at once: the one running and the one FSDP prefetches."""
WRAPPINGS = ("plain", "full", "ops")
"""How a block is measured: unwrapped, whole-block checkpointed, or selectively ('ops')."""
COMPILED_KEPT_FRACTION = 0.6
"""What a compiled block keeps for its backward, as a fraction of what the eager block keeps (the meta
measurement): compiled kernels fuse element-wise chains and keep none of their intermediates. Fitted to
one H200 (flux-schnell width, 4+8 blocks, micro-batch 32, no checkpointing: 54.5 GB compiled); it then
gives full 44.3 (measured 42.9), ops 48.0 (45.1), ops+2 46.6 (43.3), alternate 46.3 (44.8), none 53.6
GB, all within 10% (tests/unit/training/test_memory.py; alternate and none measured with the float32
gradient copy of before parallelize.reduce_dtype, 0.7 GB more). Conservative for ops+N: the estimate adds
the largest block's whole recomputation (~1.45 GB at the proxy) to every block's activations; with the
whole blocks placed first, only the last block's ops recomputation (~0.9 GB) meets the peak.
It applies to plain blocks and to a checkpointed block's recomputation; what 'ops' keeps (matmul and
attention outputs) and a checkpointed block's inputs are kept whole."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights_and_optimizer_gb: float
    """Sharded float32 weights, gradients and AdamW states (16 bytes per parameter); a LoRA run's frozen
    base (a quantized one whole)."""
    gathered_params_gb: float
    activations_gb: float
    gradients_gb: float = 0.0
    """The sharded float32 gradients within weights_and_optimizer_gb that are freed between steps
    (``zero_grad(set_to_none=True)``): absent while the forward keeps its activations, back by the end of
    the backward, which has freed them. 0 when gradients stay (accumulation over micro-batches)."""
    total_gb: float = field(init=False)

    def __post_init__(self) -> None:
        # The peak is at the start of the backward (all activations, no gradients) or at its end (all
        # gradients, no activations): both fall and rise block by block, so nowhere in between is higher.
        extra = max(self.activations_gb - self.gradients_gb, 0.0)
        object.__setattr__(self, "total_gb", self.weights_and_optimizer_gb + self.gathered_params_gb + extra)


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes the autograd graph keeps after the forward of one micro-batch, by part."""

    double: dict[str, int]
    """One double-stream block, by wrapping (WRAPPINGS)."""
    single: dict[str, int]
    """One single-stream block, by wrapping."""
    root: int
    """Embedders, head, loss, and the inputs all blocks share."""


@dataclass(frozen=True)
class ParameterCounts:
    double: int
    """One double-stream block."""
    single: int
    """One single-stream block."""
    root: int
    """Embedders and head."""

    def total(self, args: ModelArgs) -> int:
        return self.root + args.num_layers * self.double + args.num_single_layers * self.single


BASE_BYTES_PER_PARAM = {"fp8": 1.0, "nf4": 0.5625}
"""A LoRA run's frozen base per weight (train.base_precision; bf16: the compute dtype's size, sharded):
fp8's per-row scales are negligible, nf4 is half a byte plus a float32 absmax per 64 weights; both held
whole on every GPU (quantized_base.py: buffers, not sharded)."""


@dataclass(frozen=True)
class LoraShape:
    """A LoRA run: only its adapters have float32 masters, gradients and AdamW states."""

    rank: int
    targets: tuple[str, ...]
    base_precision: str = "bf16"


def lora_shape(cfg: TrainConfig) -> LoraShape | None:
    """The adapters a ``train`` section trains (None unless mode 'lora')."""
    return (
        LoraShape(cfg.lora_rank, tuple(cfg.lora_targets), cfg.base_precision) if cfg.mode == "lora" else None
    )


def estimate_memory(
    args: ModelArgs,
    world_size: int,
    micro_batch: int,
    mode: str,
    *,
    image_tokens: int = 256,
    text_tokens: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    compiled: bool = True,
    gradients_held: bool = False,
    lora: LoraShape | None = None,
) -> MemoryEstimate:
    """Peak memory of one rank training ``args`` sharded over ``world_size`` ranks, with micro-batch
    ``micro_batch`` and activation checkpointing ``mode`` (parallelize.py's modes), computing in ``dtype``,
    with blocks ``compiled`` (train.compile) or eager. ``gradients_held``: the gradients live through the
    forward (accumulation over several micro-batches per step), not only from the backward on. ``lora``:
    the frozen base at its precision, 16 bytes per adapter parameter."""
    counts = parameter_counts(args)
    compute = dtype.itemsize
    gathered = _gathered_bytes(counts, compute, world_size > 1 or gradients_held, args, lora)
    kept = activation_bytes(args, micro_batch, image_tokens, text_tokens, dtype)
    fused = COMPILED_KEPT_FRACTION if compiled else 1.0
    blocks = [kept.double] * args.num_layers + [kept.single] * args.num_single_layers
    wrappings = block_wrappings(mode, args.num_layers, args.num_single_layers)
    activations, recomputed = float(kept.root), 0.0
    for block, wrapping in zip(blocks, wrappings, strict=True):
        activations += block["plain"] * fused if wrapping == "plain" else block[wrapping]
        if wrapping != "plain":  # its backward recomputes what it did not keep, one block at a time
            recomputed = max(recomputed, (block["plain"] - block[wrapping]) * fused)
    activations += recomputed
    trained, stored = counts.total(args), float(MASTER_BYTES_PER_PARAM * counts.total(args))
    if lora is not None:
        trained = adapter_counts(args, lora.rank, lora.targets).total(args)
        # a quantized base is buffers, whole on every rank (quantized_base.py): world_size copies of it
        # over the group; a bf16 one is sharded parameters
        copies = world_size if lora.base_precision in BASE_BYTES_PER_PARAM else 1
        stored = BASE_BYTES_PER_PARAM.get(lora.base_precision, compute) * counts.total(args) * copies
        stored += MASTER_BYTES_PER_PARAM * trained
    return MemoryEstimate(
        weights_and_optimizer_gb=stored / world_size / GB,
        gathered_params_gb=gathered / GB,
        activations_gb=activations / GB,
        gradients_gb=0.0 if gradients_held else 4 * trained / world_size / GB,
    )


def _gathered_bytes(
    counts: ParameterCounts, compute: int, reduce_in_float32: bool, args: ModelArgs, lora: LoraShape | None
) -> float:
    """What FSDP2 holds unsharded at once: two blocks' parameters and gradients in the compute dtype, one
    block's gradient copy for the reduce-scatter (float32 where reduced across ranks or summed over
    micro-batches, else the compute dtype: parallelize.reduce_dtype), and the root unit's parameters and
    gradients. A LoRA run gathers a bf16 base's parameters but not a quantized base's (buffers, never
    gathered), and has gradients (and their copy) for its adapters only."""
    weights = max(counts.double, counts.single)
    grads, root_grads = weights, counts.root
    if lora is not None:
        adapters = adapter_counts(args, lora.rank, lora.targets)
        base = 0 if lora.base_precision in BASE_BYTES_PER_PARAM else weights
        weights = base + max(adapters.double, adapters.single)
        grads, root_grads = max(adapters.double, adapters.single), adapters.root
    return (
        IN_FLIGHT_BLOCKS * (weights + grads) * compute
        + grads * (4 if reduce_in_float32 else compute)
        + (counts.root + root_grads) * compute
    )


@cache
def parameter_counts(args: ModelArgs) -> ParameterCounts:
    model = _one_block_each(args, torch.float32, "meta")
    double = parameter_count(model.transformer_blocks[0])
    single = parameter_count(model.single_transformer_blocks[0])
    return ParameterCounts(double=double, single=single, root=parameter_count(model) - double - single)


@cache
def adapter_counts(args: ModelArgs, rank: int, targets: tuple[str, ...]) -> ParameterCounts:
    """LoRA's adapter parameters: rank x (in + out) per linear layer peft targets (names ending so)."""
    model = _one_block_each(args, torch.float32, "meta")

    def adapters(module: torch.nn.Module) -> int:
        return sum(
            rank * (layer.in_features + layer.out_features)
            for name, layer in module.named_modules()
            if isinstance(layer, torch.nn.Linear)
            and any(name == t or name.endswith(f".{t}") for t in targets)
        )

    double, single = adapters(model.transformer_blocks[0]), adapters(model.single_transformer_blocks[0])
    return ParameterCounts(double=double, single=single, root=adapters(model) - double - single)


@cache
def activation_bytes(
    args: ModelArgs, micro_batch: int, image_tokens: int, text_tokens: int, dtype: torch.dtype
) -> ActivationBytes:
    """Measured on the meta device (cached: the shapes decide it)."""
    shape = (micro_batch, image_tokens, text_tokens)
    double = {w: block_kept_bytes(args, "double", *shape, dtype, w) for w in WRAPPINGS}
    single = {w: block_kept_bytes(args, "single", *shape, dtype, w) for w in WRAPPINGS}
    whole = model_kept_bytes(args, *shape, dtype)
    return ActivationBytes(double=double, single=single, root=whole - double["plain"] - single["plain"])


def block_kept_bytes(
    args: ModelArgs,
    kind: str,
    micro_batch: int,
    image_tokens: int,
    text_tokens: int,
    dtype: torch.dtype,
    wrapping: str = "plain",
    device: str = "meta",
) -> int:
    """Bytes one block (``kind``: 'double' or 'single') keeps for its backward, leaving out its outputs
    and the inputs all blocks share. ``wrapping``: 'plain', or the checkpoint wrapping of mode 'full' or
    'ops'."""
    model = _one_block_each(args, dtype, device)
    block: torch.nn.Module = (
        model.transformer_blocks[0] if kind == "double" else model.single_transformer_blocks[0]
    )
    if wrapping != "plain":
        block = wrap_for_checkpointing(block, wrapping)
    randn = _randn(device, dtype)
    # The block's inputs are outputs of the block before it, not leaves (autograd holds leaves alive for
    # their gradients): it gets copies of leaves made before the tracker starts, so the leaves don't count.
    leaves = [
        randn(micro_batch, image_tokens, args.hidden, requires_grad=True),
        randn(micro_batch, text_tokens, args.hidden, requires_grad=True),
        randn(micro_batch, args.hidden, requires_grad=True),  # the conditioning vector
    ]
    rotary = tuple(randn(image_tokens + text_tokens, args.attention_head_dim) for _ in range(2))
    with _StorageTracker() as tracker:
        with _FlashAttention():
            image, text, temb = (leaf.clone() for leaf in leaves)
            outputs = block(image, text, temb, rotary)
        shared = _storages([temb, *rotary])  # made once for all blocks: counted in the root
        del image, text, temb
        return tracker.kept_bytes(exclude=_storages(list(model.parameters())) | _storages(outputs) | shared)


def model_kept_bytes(
    args: ModelArgs,
    micro_batch: int,
    image_tokens: int,
    text_tokens: int,
    dtype: torch.dtype,
    device: str = "meta",
) -> int:
    """Bytes a model with one block of each kind keeps for its backward, through the job's loss. The
    latent is the squarest with ``image_tokens`` 2x2 patches (Kontext's target and control tokens: one
    twice as wide, a slight overcount of the loss, which sees only the target)."""
    rows = max(d for d in range(1, math.isqrt(image_tokens) + 1) if image_tokens % d == 0)
    columns = image_tokens // rows
    model = _one_block_each(args, dtype, device)
    with _StorageTracker() as tracker:
        with _FlashAttention():
            latents = torch.randn(micro_batch, args.in_channels // 4, 2 * rows, 2 * columns, device=device)
            t = torch.rand(micro_batch, device=device)
            t5 = _randn(device, dtype)(micro_batch, text_tokens, args.joint_attention_dim)
            clip = _randn(device, dtype)(micro_batch, args.pooled_projection_dim)
            prediction = predict_velocity(model, latents, t, t5, clip, dtype)
            loss = F.mse_loss(prediction.float(), torch.randn_like(latents))
        del latents, t, t5, clip, prediction
        return tracker.kept_bytes(exclude=_storages(list(model.parameters())) | _storages(loss))


def _one_block_each(args: ModelArgs, dtype: torch.dtype, device: str) -> FluxTransformer2DModel:
    one_each = args.model_copy(update={"num_layers": 1, "num_single_layers": 1})
    with torch.device(device):
        model = FluxTransformer2DModel(**one_each.model_dump())
    # nn.Module's cast: diffusers' own .to() only adds a warning about modules kept in float32 (none here).
    return torch.nn.Module.to(model, dtype)


def _randn(device: str, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    def randn(*shape: int, requires_grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=requires_grad)

    return randn


def _storages(tensors: Any) -> set[int]:
    return {t.untyped_storage()._cdata for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)}


class _StorageTracker(TorchDispatchMode):
    """Holds one reference to the storage of every tensor an op returns. Python objects that exist on
    entry are frozen out of garbage collection meanwhile, so that collecting the forward's garbage scans
    only what the forward made (a full collection with torch and diffusers loaded takes ~0.5 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, torch.UntypedStorage] = {}

    def __enter__(self) -> "_StorageTracker":
        gc.freeze()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        gc.unfreeze()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                self.storages.setdefault(storage._cdata, storage)
        return out

    def kept_bytes(self, exclude: set[int]) -> int:
        """Bytes of the storages something besides this tracker still references."""
        gc.collect()  # reference cycles among the forward's objects
        return sum(
            storage.nbytes()
            for key, storage in self.storages.items()
            if key not in exclude and torch._C._storage_Use_Count(key) > 1
        )


class _FlashAttention(TorchFunctionMode):
    """SDPA through the flash kernel's autograd (the CPU kernel, which has meta shapes too): it keeps what
    CUDA's flash attention keeps (q, k, v, output, log-sum-exp; CUDA adds two 8-byte RNG values)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        positional = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        named = {**dict(zip(positional, args, strict=False)), **kwargs}
        if named.get("attn_mask") is not None or named.get("enable_gqa"):
            raise NotImplementedError("memory estimate: attention with a mask or GQA (FLUX uses neither)")
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            named["query"],
            named["key"],
            named["value"],
            named.get("dropout_p", 0.0),
            named.get("is_causal", False),
            scale=named.get("scale"),
        )[0]


def auto_order(args: ModelArgs) -> tuple[str, ...]:
    """train.activation_checkpointing 'auto' tries these in order, least recomputation first, and takes the
    first that fits: none, ops, then ops+1, ops+2, ... (one more block recomputed whole each; measured on
    one H200, compiled, mbs 32: none 106.5, ops 103.3, full 83.6 samples/s), then full (ops+N of every
    block). 'alternate' and 'single' are left out: they recompute more than an ops+N of the same peak, by
    the estimate (alternate ~ ops+13, single ~ ops+25 at full depth) and on one H200 (proxy, mbs 32:
    alternate 93.7 samples/s at 44.8 GB, ops+2 99.6 at 43.3)."""
    blocks = args.num_layers + args.num_single_layers
    return ("none", "ops", *(f"ops+{n}" for n in range(1, blocks)), "full")


AUTO_HEADROOM = 0.10
"""The share of the GPU's memory 'auto' leaves free of the estimate: the CUDA context, the backward's
transients, allocator fragmentation, and the estimate's own error (within 10% of measured peaks)."""


def budget_gb(gpu_memory_gb: float) -> float:
    """What 'auto' fits the estimate into: the GPU's memory less AUTO_HEADROOM."""
    return gpu_memory_gb * (1 - AUTO_HEADROOM)


@dataclass(frozen=True)
class CheckpointingChoice:
    mode: str
    estimate_gb: float
    """The estimated peak under ``mode``; nan where no GPU memory is known."""
    budget_gb: float
    """The GPU's memory less the headroom; nan where unknown."""

    def describe(self) -> str:
        if math.isnan(self.budget_gb):
            return f"activation checkpointing auto -> {self.mode} (no gpu_memory_gb for this system)"
        over = self.estimate_gb > self.budget_gb
        return (
            f"activation checkpointing auto -> {self.mode}: estimated peak {self.estimate_gb:.1f} GB per "
            f"GPU, {'over' if over else 'within'} {self.budget_gb:.1f} GB ({1 - AUTO_HEADROOM:.0%} of the "
            f"GPU's memory){': no mode fits, full keeps the least' if over else ''}"
        )


def choose_checkpointing(
    args: ModelArgs,
    world_size: int,
    micro_batch: int,
    gpu_memory_gb: float | None,
    *,
    compiled: bool = True,
    gradients_held: bool = False,
    image_tokens: int = 256,
    text_tokens: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    lora: LoraShape | None = None,
) -> CheckpointingChoice:
    """The mode 'auto' resolves to: the first of auto_order(args) whose estimated peak fits ``gpu_memory_gb``
    less AUTO_HEADROOM; 'full' when none does (the least memory there is) or when the GPU's memory is not
    known (the default before 'auto' existed)."""
    if gpu_memory_gb is None:
        return CheckpointingChoice("full", math.nan, math.nan)
    budget = budget_gb(gpu_memory_gb)
    estimate = math.nan
    for mode in auto_order(args):
        estimate = estimate_memory(
            args,
            world_size,
            micro_batch,
            mode,
            image_tokens=image_tokens,
            text_tokens=text_tokens,
            dtype=dtype,
            compiled=compiled,
            gradients_held=gradients_held,
            lora=lora,
        ).total_gb
        if estimate <= budget:
            return CheckpointingChoice(mode, estimate, budget)
    return CheckpointingChoice("full", estimate, budget)


def resolve_checkpointing(
    plan: TrainingPlan, gpu_memory_gb: float | None, tokens: tuple[int, int] | None = None
) -> tuple[str, CheckpointingChoice | None]:
    """The mode a run uses, and how 'auto' chose it (None for a configured mode): estimated per rank of
    the FSDP shard group, gradients held through the forward when several micro-batches make a step.
    ``tokens``: the dataset's (image, text) tokens per sample (Kontext's control tokens included), else
    flux1's 256 and 256."""
    cfg = plan.train
    if cfg.activation_checkpointing != "auto":
        return cfg.activation_checkpointing, None
    image_tokens, text_tokens = tokens or (256, 256)
    choice = choose_checkpointing(
        plan.model_args,
        plan.dp_shard,
        cfg.micro_batch_size,
        gpu_memory_gb,
        compiled=cfg.compile,
        gradients_held=plan.grad_accum_steps > 1,
        image_tokens=image_tokens,
        text_tokens=text_tokens,
        dtype=getattr(torch, cfg.param_dtype),
        lora=lora_shape(cfg),
    )
    return choice.mode, choice
