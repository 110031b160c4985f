"""Data parallelism for the FLUX transformer: per block, activation checkpointing, then torch.compile,
then FSDP2 ``fully_shard`` (torchtitan's order), on a (replicate, shard) mesh.

With one replica this is FSDP; with several it is HSDP: each group of ``dp_shard`` ranks (a node by
default) shards one copy, and the copies all-reduce gradients across groups. Parameters are gathered
in the compute dtype (bf16) and gradients reduced in float32 (on one rank only copied: reduce_dtype), so
the float32 master weights and the optimizer stay sharded. The same code runs over gloo on CPU and
NCCL/RCCL on GPUs.

Checkpointing wraps each block *inside* its FSDP unit, so what is recomputed starts from the inputs FSDP
already cast to the compute dtype. diffusers' own ``enable_gradient_checkpointing()`` checkpoints around
the FSDP unit instead, and on torch < 2.13 its recomputation sees float32 where the forward saw bf16
("Recomputed values ... have different metadata", pytorch issues 159359/148831): the vendor images ship
such a torch, so that path is never used here.
"""

import warnings
from functools import partial

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from flux_cluster.config.training import CHECKPOINT_MODES, ops_whole_blocks
from flux_cluster.training.model import init_weights, is_on_meta

_KEPT_BY_OPS_POLICY = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_mm.default,  # float8 linears
}


# Blocks and the model return views; nothing changes them in place, so FSDP2's pre-backward hooks all run
# (tests/unit/training/test_parallelize.py: sharded gradients equal the unsharded model's).
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def make_mesh(device: torch.device, dp_replicate: int, dp_shard: int) -> DeviceMesh:
    """A 1-D mesh for FSDP, or a 2-D (replicate, shard) mesh for HSDP."""
    if dp_replicate == 1:
        return init_device_mesh(device.type, (dp_shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(
        device.type, (dp_replicate, dp_shard), mesh_dim_names=("dp_replicate", "dp_shard")
    )


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks, in forward order: double-stream, then single-stream."""
    return [*model.transformer_blocks, *model.single_transformer_blocks]  # type: ignore[misc]


def block_wrappings(mode: str, double_blocks: int, single_blocks: int) -> list[str]:
    """Per block, in forward order, how ``mode`` wraps it: 'plain' (keeps everything), 'full' (checkpointed
    whole: keeps its inputs) or 'ops' (keeps its matmul and attention outputs). 'ops+N' wraps N blocks
    whole and the rest by ops: the first single-stream blocks, then the first double-stream ones. Early
    blocks because their backward runs late, when the later blocks' activations are freed, so their
    recompute adds nothing to the peak (the last blocks', run first, did: measured on one H200, where the
    first two single-stream blocks saved ~0.9 GB each). A double-stream block does the same matmul work
    per token and keeps ~10% more by ops: doubles first may save a little more; not measured."""
    total = double_blocks + single_blocks
    whole = ops_whole_blocks(mode)
    if whole is not None:
        order = [*range(double_blocks, total), *range(double_blocks)]
        chosen = set(order[:whole])
        return ["full" if index in chosen else "ops" for index in range(total)]
    if mode not in CHECKPOINT_MODES:  # 'auto' is resolved before this
        expected = f"{', '.join(CHECKPOINT_MODES)} or ops+N"
        raise ValueError(f"activation checkpointing {mode!r}: expected {expected}")
    if mode == "single":
        return ["plain" if index < double_blocks else "full" for index in range(total)]
    if mode == "alternate":
        return ["full" if index % 2 == 0 else "plain" for index in range(total)]
    return [{"none": "plain"}.get(mode, mode)] * total


def _keep_matmuls_and_attention(_ctx: object, op: object, *_args: object, **_kw: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEPT_BY_OPS_POLICY else CheckpointPolicy.PREFER_RECOMPUTE


def wrap_for_checkpointing(block: torch.nn.Module, wrapping: str) -> torch.nn.Module:
    """torch's non-reentrant checkpoint wrapper, selective (``wrapping`` 'ops') or whole-block ('full')."""
    context = (
        partial(create_selective_checkpoint_contexts, _keep_matmuls_and_attention)
        if wrapping == "ops"
        else None
    )
    kwargs = {"context_fn": context} if context is not None else {}
    # FLUX blocks draw no random numbers (no dropout): nothing to replay, so no RNG state is saved.
    return checkpoint_wrapper(
        block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False, **kwargs
    )


def _float8_friendly(module: torch.nn.Module, _name: str) -> bool:
    # FP8 GEMMs need both dimensions divisible by 16.
    return (
        isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0
    )


FP8_RECIPES = ("tensorwise", "rowwise")
"""torchao's float8 training recipes: one scale per tensor (cuBLAS; a global amax reduction before each
cast), or one per row (CUTLASS; the amax fuses with the cast)."""


def convert_to_float8(model: torch.nn.Module, recipe: str = "tensorwise") -> int:
    """Swap every block's linear layers for torchao's Float8Linear (train.precision 'fp8') with ``recipe``
    (FP8_RECIPES); the embedders and the head stay bf16. Returns how many were swapped. Fast on FP8 GPUs
    only (H100, MI300 and newer): the speed path is GPU-only, the numerics are the same on CPU."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe {recipe!r}: expected one of {', '.join(FP8_RECIPES)}")
    config = Float8LinearConfig.from_recipe_name(recipe)
    before = sum(type(m) is torch.nn.Linear for m in model.modules())
    for block in transformer_blocks(model):
        convert_to_float8_training(block, config=config, module_filter_fn=_float8_friendly)
    return before - sum(type(m) is torch.nn.Linear for m in model.modules())


def prepare_blocks(model: torch.nn.Module, activation_checkpointing: str, compile_blocks: bool) -> None:
    """Checkpoint-wrap (per the mode) and compile each block in place, before sharding."""
    lists = [model.transformer_blocks, model.single_transformer_blocks]  # type: ignore[attr-defined]
    wrappings = block_wrappings(activation_checkpointing, len(lists[0]), len(lists[1]))
    index = 0
    for blocks in lists:
        for position, block in enumerate(list(blocks)):
            if wrappings[index] != "plain":
                block = wrap_for_checkpointing(block, wrappings[index])
                blocks[position] = block
            if compile_blocks:
                # In place (names unchanged); fullgraph: a graph break is an error, not a silent slowdown.
                block.compile(fullgraph=True)
            index += 1


def reduce_dtype(mesh: DeviceMesh, accumulation_steps: int) -> torch.dtype | None:
    """float32 where gradients are reduced across ranks or summed over micro-batches (FSDP2 accumulates
    unsynced gradients in the reduce dtype). One rank with one micro-batch a step reduces nothing: FSDP2
    copies the block's compute-dtype gradients into a reduce-dtype buffer that it holds until the next
    block's reduce (1.36 GB for a flux-schnell double block in float32), then casts the copy to float32. In
    the compute dtype (None) the buffer is half that and the gradient the same float32 value (no division
    on one rank)."""
    return None if mesh.size() == 1 and accumulation_steps == 1 else torch.float32


def parallelize(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    device: torch.device,
    *,
    param_dtype: torch.dtype,
    activation_checkpointing: str,
    compile_blocks: bool,
    precision: str = "bf16",
    fp8_recipe: str = "tensorwise",
    accumulation_steps: int = 1,
) -> torch.nn.Module:
    """Shard the model in place: each block is one FSDP unit (gathered just before it runs and freed
    after), the embedders and head form the root unit. Meta-device models are materialised here, shard
    by shard, and initialised. ``precision`` 'fp8' first swaps the blocks' linears for float8 ones
    (``fp8_recipe``). ``accumulation_steps``: micro-batches per optimizer step (reduce_dtype)."""
    if precision == "fp8":
        convert_to_float8(model, fp8_recipe)
    prepare_blocks(model, activation_checkpointing, compile_blocks)
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=reduce_dtype(mesh, accumulation_steps)
    )
    blocks = transformer_blocks(model)
    for index, block in enumerate(blocks):
        # The last block's parameters are needed again at once by the backward pass: keep them gathered.
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=index < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if is_on_meta(model):  # fully_shard already moved real parameters to the mesh's device
        model.to_empty(device=device)
        init_weights(model)
    return model
