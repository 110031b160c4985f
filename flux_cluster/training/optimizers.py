"""The optimizer of ``train.optimizer``, built over the FSDP2-sharded (DTensor) parameters.

torch's AdamW steps DTensors itself. bitsandbytes' kernels have no DTensor sharding rules, and prodigyopt
flattens each parameter, which DTensor refuses for an unevenly sharded one; both step each parameter's
local shard instead (``LocalShardOptimizer``), with their state kept as DTensors shaped like the
parameters, so DCP checkpoints and reloads it like AdamW's.
"""

import contextlib
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from flux_cluster.config.training import OptimizerName
from flux_cluster.errors import FluxClusterError
from flux_cluster.training.mlperf_log import ADAMW

BNB_BLOCK = 256
"""Elements per absmax scale of bitsandbytes' blockwise 8-bit state (fixed in its AdamW8bit)."""
BNB_MIN_8BIT = 4096
"""bitsandbytes keeps 32-bit state for smaller parameters (its min_8bit_size default)."""
PRODIGY = {"betas": (0.9, 0.99), "weight_decay": 0.01, "safeguard_warmup": True, "use_bias_correction": True}
"""prodigyopt's recommended settings for training diffusion models (its README)."""


def build_optimizer(
    name: OptimizerName, params: list[torch.nn.Parameter], lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """The optimizer of train.optimizer over the trainable (possibly DTensor) parameters."""
    betas = (ADAMW["beta_1"], ADAMW["beta_2"])
    if name == "adamw":
        return torch.optim.AdamW(
            params,
            lr=lr,
            betas=betas,
            eps=ADAMW["epsilon"],
            weight_decay=ADAMW["weight_decay"],
            # Multi-tensor kernels: far fewer (DTensor) dispatches than one update per parameter.
            **({"fused": True} if device.type == "cuda" else {"foreach": True}),
        )
    if name == "adamw8bit":
        bnb = _import("bitsandbytes", name)

        class _AdamW8bit(bnb.optim.AdamW8bit):  # type: ignore[misc, name-defined]
            """8-bit or 32-bit state by the whole parameter's size, so every rank picks the same."""

            big: list[bool]  # per parameter, set below

            def get_config(self, gindex: int, pindex: int, group: dict) -> dict:
                config = super().get_config(gindex, pindex, group)
                config["min_8bit_size"] = 0 if self.big[pindex] else math.inf
                return config

        inner = _AdamW8bit(
            [_local(p) for p in params],
            lr=lr,
            betas=betas,
            eps=ADAMW["epsilon"],
            weight_decay=ADAMW["weight_decay"],
        )
        inner.big = [p.numel() >= BNB_MIN_8BIT for p in params]
        return LocalShardOptimizer(params, inner, block_keys=("absmax1", "absmax2"))
    prodigy = _import("prodigyopt", name)
    # fsdp_in_use: prodigy all-reduces its d estimate's sums over all ranks, so every rank keeps one d.
    inner = prodigy.Prodigy([_local(p) for p in params], lr=lr, fsdp_in_use=dist.is_initialized(), **PRODIGY)
    return LocalShardOptimizer(params, inner, flat_keys=("s", "p0"))


def _import(module: str, optimizer: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)  # bitsandbytes takes seconds: only when chosen
    except ImportError as exc:
        raise FluxClusterError(
            f"train.optimizer {optimizer!r} needs the Python package {module}, which is not installed "
            f"here ({exc}); pip install {module}"
        ) from None


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard, sharing the parameter's storage (the parameter itself if it is not a DTensor)."""
    return param.to_local().detach() if isinstance(param, DTensor) else param.detach()


def _padded_blocks(param: DTensor) -> int:
    """bitsandbytes' absmax length on the rank with the largest shard (torch.chunk gives it the first)."""
    shape = list(param.shape)
    for dim, placement in enumerate(param.placements):
        if isinstance(placement, Shard):
            size = param.device_mesh.size(dim)
            shape[placement.dim] = -(-shape[placement.dim] // size)
    return -(-math.prod(shape) // BNB_BLOCK)


@contextlib.contextmanager
def _cuda_is_here(device: torch.device) -> Iterator[None]:
    """prodigyopt puts its all-reduce buffer on CUDA unconditionally; elsewhere (gloo on CPU) it stays put."""
    if device.type == "cuda":
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


class LocalShardOptimizer(torch.optim.Optimizer):
    """Steps ``inner`` (built over the local shards, same order) on each DTensor parameter's local shard.

    Its own state is the checkpointable one: per parameter, tensors shaped like the local shard as
    DTensors with the parameter's placements (``flat_keys``: kept flat by the inner optimizer),
    ``block_keys`` (one value per block of the local shard: a different length per rank) padded to the
    longest rank's length and sharded, anything else (bitsandbytes' quantisation maps, step counts) as
    it is, the same on every rank. Each step hands views of these to the inner optimizer, so nothing is
    copied, and a state DCP loaded into this optimizer is what the next step uses.
    """

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        inner: torch.optim.Optimizer,
        flat_keys: tuple[str, ...] = (),
        block_keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(params, dict(inner.defaults))
        self.inner = inner
        self.flat_keys, self.block_keys = flat_keys, block_keys
        self.device = _local(params[0]).device if params else torch.device("cpu")

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("LocalShardOptimizer.step takes no closure")
        inner_state: dict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner_group.update({k: v for k, v in group.items() if k != "params"})
            inner_group["params"] = []
            for param in group["params"]:
                local = _local(param)
                local.grad = None if param.grad is None else _local(param.grad)
                inner_group["params"].append(local)
                if self.state[param]:
                    inner_state[local] = self._to_local(param, self.state[param])
        self.inner.state = inner_state
        synced = [inner_group.get("fsdp_in_use") for inner_group in self.inner.param_groups]
        if all(inner_group["lr"] == 0 for inner_group in self.inner.param_groups) and any(synced):
            # DCP's state initialisation (a step at lr 0): prodigy then only makes its state, and its
            # all-reduce path would read sums it never made.
            for inner_group in self.inner.param_groups:
                inner_group["fsdp_in_use"] = False
        try:
            with _cuda_is_here(self.device):
                self.inner.step()
        finally:
            for inner_group, flag in zip(self.inner.param_groups, synced, strict=True):
                if flag is not None:
                    inner_group["fsdp_in_use"] = flag
        for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
            for key, value in inner_group.items():
                if key != "params":  # prodigy's d estimate: a float, so the state holds no device tensors
                    group[key] = value.item() if isinstance(value, torch.Tensor) else value
            for param, local in zip(group["params"], inner_group["params"], strict=True):
                if local in self.inner.state:
                    self.state[param] = self._to_global(param, self.inner.state[local])
                local.grad = None
        self.inner.state = defaultdict(dict)  # no references to this step's views

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch casts every loaded state tensor to its parameter's dtype; bitsandbytes' 8-bit state is
        # uint8 (the round trip through float32 is exact).
        dtypes = {
            (pid, key): value.dtype
            for pid, state in state_dict["state"].items()
            for key, value in state.items()
            if isinstance(value, torch.Tensor)
        }
        super().load_state_dict(state_dict)
        ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]  # ints or (DCP) names
        params = dict(zip(ids, [p for group in self.param_groups for p in group["params"]], strict=True))
        for (pid, key), dtype in dtypes.items():
            state = self.state[params[pid]]
            state[key] = state[key].to(dtype)

    def _to_global(self, param: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(param, DTensor):
            return dict(state)
        local = _local(param)
        out: dict[str, Any] = {}
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                out[key] = value
                continue
            if key in self.flat_keys:
                if value.dim() == 0:  # prodigy's p0 of an all-zero shard: the same zeros, spelled out
                    value = value.expand(local.numel()).clone()
                value = value.view(local.shape)
            if key in self.block_keys:
                padded = value.new_zeros(_padded_blocks(param))
                padded[: value.numel()] = value
                out[key] = DTensor.from_local(padded, param.device_mesh, param.placements, run_check=False)
            elif value.shape == local.shape:
                mesh, placements = param.device_mesh, param.placements
                out[key] = DTensor.from_local(
                    value, mesh, placements, run_check=False, shape=param.shape, stride=param.stride()
                )
            else:
                out[key] = value
        return out

    def _to_local(self, param: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        local = _local(param)
        out: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, DTensor):
                value = value.to_local()
            if isinstance(value, torch.Tensor):
                if key in self.block_keys:
                    value = value[: -(-local.numel() // BNB_BLOCK)]
                elif key in self.flat_keys:
                    value = value.view(-1)
            out[key] = value
        return out
