"""train.parallel for the hf workload: how the model's work is spread over the devices.

- ``ddp``: DistributedDataParallel, one process per GPU (the launcher's usual ranks), gradients averaged
  by an all-reduce overlapped with the backward pass. The default, and what the seed recommends.
- ``dp``: torch.nn.DataParallel, ONE process per node (the launcher starts one: JobPlan.ranks_per_node)
  driving all the node's GPUs from Python threads. Kept only to show what it costs, which is known:
  the GIL serialises the threads that launch each GPU's kernels; every step scatters the batch from and
  gathers the outputs to GPU 0 and re-broadcasts the weights from it (replicate), so GPU 0 holds more
  memory than the others (unbalanced memory) and the copies are not overlapped with compute. On a CPU
  (no GPUs) it wraps nothing: the module's forward runs as is, in the one process.
- ``fsdp``: torch.distributed.fsdp.fully_shard on every transformer layer, then the whole model:
  parameters, gradients and optimizer state sharded over the ranks.
"""

from typing import Any

import torch

from flux_cluster.errors import FluxClusterError
from flux_cluster.runtime.dist import DistInfo


def transformer_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers model: the children of its first ModuleList with more than
    one entry (BERT's encoder.layer, GPT-2's h, ViT's encoder.layer)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            return list(module)
    return []


class Autocast(torch.nn.Module):
    """The module's forward under torch.autocast. DataParallel runs each replica's forward in a worker
    thread, and autocast's state is per thread (pytorch issue 125186): the caller's amp-bf16 would not
    reach the replicas, which would run CUDA's default fp16 with no GradScaler. So the replica enters it."""

    def __init__(self, module: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module, self.device_type, self.dtype = module, device_type, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


def check_dp_gpus(gpus_per_node: int, visible: int) -> None:
    """dp drives the GPUs this process sees; a count unlike the system's would make every figure per GPU
    (TFLOP/s, MFU, GPU-hours) wrong."""
    if visible != gpus_per_node:
        raise FluxClusterError(
            f"system.gpus_per_node: {gpus_per_node}, but train.parallel=dp's process sees {visible} GPU(s); "
            f"expected the node's GPUs to match system.gpus_per_node (or CUDA_VISIBLE_DEVICES to)"
        )


def wrap(
    model: torch.nn.Module,
    parallel: str,
    info: DistInfo,
    mesh: Any = None,
    amp_dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """The model as train.parallel distributes it (already on info.device for ddp and dp; fsdp: sharded
    over mesh, every rank's device). amp_dtype: dp's replicas enter autocast themselves (Autocast)."""
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in transformer_layers(model):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if parallel == "dp":
        gpus = torch.cuda.device_count() if info.device.type == "cuda" else 0
        if not gpus:
            return model
        inner = Autocast(model, info.device.type, amp_dtype) if amp_dtype is not None else model
        return torch.nn.DataParallel(inner, device_ids=list(range(gpus)))  # GPU only
    if info.world_size == 1:
        return model
    kwargs: dict[str, Any] = {}  # frozen (LoRA) parameters need no gradient: DDP skips them
    if info.device.type == "cuda":
        kwargs["device_ids"] = [info.device.index]
    return torch.nn.parallel.DistributedDataParallel(model, **kwargs)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP or DataParallel wrapper and its Autocast (FSDP2 wraps in place)."""
    if isinstance(model, torch.nn.DataParallel | torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model.module if isinstance(model, Autocast) else model


def devices_per_process(parallel: str, info: DistInfo) -> int:
    """The devices one process drives: dp's GPUs on this node, else one."""
    if parallel == "dp" and info.device.type == "cuda":
        return max(torch.cuda.device_count(), 1)
    return 1
