"""Data parallelism for the FLUX transformer: FSDP2 ``fully_shard`` per block on a (replicate, shard) mesh.

With one replica this is FSDP; with several it is HSDP: each group of ``dp_shard`` ranks (a node by
default) shards one copy, and the copies all-reduce gradients across groups. Parameters are gathered
in the compute dtype (bf16) and gradients reduced in float32, so the float32 master weights and the
optimizer stay sharded. The same code runs over gloo on CPU and NCCL/RCCL on GPUs.
"""

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from flux_cluster.training.model import init_weights, is_on_meta


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


def parallelize(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    device: torch.device,
    *,
    param_dtype: torch.dtype,
    activation_checkpointing: bool,
    compile_blocks: bool,
) -> torch.nn.Module:
    """Shard the model in place: each block is one FSDP unit (gathered just before it runs and freed
    after), the embedders and head form the root unit. Meta-device models are materialised here, shard
    by shard, and initialised."""
    if activation_checkpointing:
        # diffusers wraps each block call in torch.utils.checkpoint (non-reentrant); parameter names stay.
        model.enable_gradient_checkpointing()  # type: ignore[operator]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = transformer_blocks(model)
    for index, block in enumerate(blocks):
        if compile_blocks:
            block.compile()  # in place: the module and its parameter names are unchanged
        # The last block's parameters are needed again at once by the backward pass: keep them gathered.
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=index < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if is_on_meta(model):  # fully_shard already moved real parameters to the mesh's device
        model.to_empty(device=device)
        init_weights(model)
    return model
