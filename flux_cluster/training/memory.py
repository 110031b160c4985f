"""Per-GPU memory of training a FLUX transformer the job's way (FSDP2, bf16 compute, fp32 master weights),
estimated without a GPU. GB here is 1e9 bytes, as ``torch.cuda.max_memory_allocated() / 1e9``.

- weights and optimizer: float32 weights, float32 gradients and AdamW's two float32 states, 16 bytes per
  parameter, sharded over the FSDP group (``world_size`` ranks).
- gathered parameters: FSDP all-gathers a block's parameters in the compute dtype just before it runs and
  prefetches the next: two blocks are unsharded at once, in the backward with their compute-dtype
  gradients, and the gradient being reduced is cast to float32 for the reduce-scatter (``reduce_dtype``).
  The root unit (embedders and head) stays gathered from the forward through the backward.
- activations: what the autograd graph keeps when the forward is done, measured by running one
  double-stream and one single-stream block at the real shapes on the meta device (no memory, no
  compute), both plain and wrapped as the job wraps them (``wrap_for_checkpointing``); summed over the
  blocks as ``checkpointed()`` wraps them under the mode; plus what one checkpointed block recomputes in
  its backward; plus the root (embedders, head, loss: a model with one block of each kind, less those).

How the bytes are counted: a dispatch mode holds one reference to the storage of every tensor the
forward creates; when the forward is done a storage that something else still references is kept by the
graph: autograd's saved tensors, a checkpoint's saved inputs, or its selective cache ('ops'), which
``saved_tensors_hooks`` cannot see. Storages count once each (views share them); parameters and the
block's outputs are left out. For a plain block this is what ``saved_tensors_hooks`` sees; for a whole-
block checkpointed one, its inputs. The meta device gives storages their real sizes, so the count equals
a real run's (tests/test_memory.py checks both against the CPU). Attention is routed to the flash
kernel's autograd (it keeps q, k, v, the output and the log-sum-exp), as ``attention_backend("auto")``
picks on GPUs; the meta device would otherwise take the math kernel, which keeps the attention matrix.

Approximations: the inputs every block shares (the conditioning vector and the rotary tables) are counted
once, in the root, although FSDP casts the rotary tables per block; layer-norm statistics are float32 as
on CUDA. Not modelled: torch.compile (fused kernels keep fewer intermediates, so compiled runs peak
lower), the backward's transients (activation gradients of the block in progress, kernel workspaces),
the CUDA context (~0.5 GB, outside ``max_memory_allocated``) and allocator fragmentation.
"""

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from diffusers import FluxTransformer2DModel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flux_cluster.training.model import parameter_count, predict_velocity
from flux_cluster.training.parallelize import checkpointed, wrap_for_checkpointing
from flux_cluster.training.workload import ModelArgs

GB = 1e9
MASTER_BYTES_PER_PARAM = 16
"""float32 weights, gradients, and AdamW's exp_avg and exp_avg_sq."""
IN_FLIGHT_BLOCKS = 2
"""Blocks unsharded at once: the one running and the one FSDP prefetches."""
WRAPPINGS = ("plain", "full", "ops")
"""How a block is measured: unwrapped, whole-block checkpointed, or selectively ('ops')."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights_and_optimizer_gb: float
    gathered_params_gb: float
    activations_gb: float
    total_gb: float = field(init=False)

    def __post_init__(self) -> None:
        total = self.weights_and_optimizer_gb + self.gathered_params_gb + self.activations_gb
        object.__setattr__(self, "total_gb", total)


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


def estimate_memory(
    args: ModelArgs,
    world_size: int,
    micro_batch: int,
    mode: str,
    *,
    image_tokens: int = 256,
    text_tokens: int = 256,
    dtype: torch.dtype = torch.bfloat16,
) -> MemoryEstimate:
    """Peak memory of one rank training ``args`` sharded over ``world_size`` ranks, with micro-batch
    ``micro_batch`` and activation checkpointing ``mode`` (parallelize.py's modes), computing in ``dtype``."""
    counts = parameter_counts(args)
    largest_block = max(counts.double, counts.single)
    compute = dtype.itemsize
    gathered = (
        IN_FLIGHT_BLOCKS * largest_block * 2 * compute  # parameters and gradients of two blocks
        + largest_block * 4  # the float32 copy of one block's gradients for the reduce-scatter
        + counts.root * 2 * compute  # the root unit's parameters and gradients
    )
    kept = activation_bytes(args, micro_batch, image_tokens, text_tokens, dtype)
    wrapping = "ops" if mode == "ops" else "full"
    blocks = [kept.double] * args.num_layers + [kept.single] * args.num_single_layers
    activations, recomputed = kept.root, 0
    for block, wrap in zip(blocks, checkpointed(mode, args.num_layers, args.num_single_layers), strict=True):
        activations += block[wrapping] if wrap else block["plain"]
        if wrap:  # its backward recomputes what it did not keep, one block at a time
            recomputed = max(recomputed, block["plain"] - block[wrapping])
    activations += recomputed
    return MemoryEstimate(
        weights_and_optimizer_gb=MASTER_BYTES_PER_PARAM * counts.total(args) / world_size / GB,
        gathered_params_gb=gathered / GB,
        activations_gb=activations / GB,
    )


@cache
def parameter_counts(args: ModelArgs) -> ParameterCounts:
    model = _one_block_each(args, torch.float32, "meta")
    double = parameter_count(model.transformer_blocks[0])
    single = parameter_count(model.single_transformer_blocks[0])
    return ParameterCounts(double=double, single=single, root=parameter_count(model) - double - single)


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
    """Bytes a model with one block of each kind keeps for its backward, through the job's loss."""
    side = math.isqrt(image_tokens)
    if side * side != image_tokens:
        raise ValueError(f"image_tokens {image_tokens} is not a square (2x2-packed square latents)")
    model = _one_block_each(args, dtype, device)
    with _StorageTracker() as tracker:
        with _FlashAttention():
            latents = torch.randn(micro_batch, args.in_channels // 4, 2 * side, 2 * side, device=device)
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
