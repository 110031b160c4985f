"""The torchtitan case of benchmarks/train_throughput.py: PyTorch's reference trainer's own FLUX model,
built, converted and wrapped by its own code as its trainer does on one GPU, trained by the same step.

torchtitan 0.2.2 (requirements/bench.txt): the newest release that imports on the GPU image's torch 2.11
(0.3.0 imports ``DataParallelMeshDims`` and ``ShardPlacementResult`` from torch.distributed.fsdp, which
torch 2.11 lacks). What it does on one GPU, followed here step by step (its train.py and
models/flux/train.py):

- the model (``FluxModel``, ``FluxModelArgs``) built on the meta device in float32 (training.dtype);
- its model converters: ``quantize.linear.float8`` for torchtitan-fp8 (torchao Float8Linear, recipe
  tensorwise or rowwise, every linear whose dims divide by 16; SM89+ only, so the CPU passes its
  ``emulate`` switch, eager only);
- ``parallelize_flux``: full activation checkpointing (``checkpoint_wrapper`` per block) for mode 'full';
  FSDP only where the data-parallel shard degree is > 1, so one GPU trains float32 weights under
  ``maybe_enable_amp``'s bf16 autocast;
- compiled cases compile each block with ``fullgraph=True`` after that: torchtitan 0.3.0's
  ``apply_compile`` (0.2.2's FLUX ignores ``compile.enable``), so torchtitan gets its newest release's
  best setting;
- ``to_empty`` and ``init_weights``; its attention wrapper's kernel list set to ours (``auto``: cuDNN's
  SDPA backward fails at FLUX shapes on the measured stack, attention.py), the same kernels as ours and
  the peer.

The step is the shared one (step.train_step): the same batch, rectified-flow loss, clipping at 1.0 and
AdamW settings as ours; only the model call is torchtitan's (its packing, position ids and arguments).

Only what this needs is imported: torchtitan.models.flux's and torchtitan.models.llama3's package
__init__ files wire data loaders and validators (datasets, torchdata) that the case never uses, so those
two packages are registered without running them. ``import torchtitan`` itself still needs triton (its
MoE kernels), tyro (its config parser) and einops (the FLUX layers).
"""

import importlib
import importlib.util
import sys
from functools import partial
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import DeviceMesh

from flux_cluster.config.workload import ModelArgs
from flux_cluster.training.attention import allowed_backends
from throughput.cases import Case

if TYPE_CHECKING:
    from throughput.step import Trainer

TORCHTITAN_VERSION = "0.2.2"
"""The release requirements/bench.txt pins (tools/dev.sh installs it; gpu_wheels.sh carries it)."""

_PACKAGES_NOT_RUN = ("torchtitan.models.flux", "torchtitan.models.llama3")
"""Their __init__ imports data loaders and validators (datasets, torchdata) the case does not use."""


def _registered_without_init(name: str) -> ModuleType:
    """The package ``name`` in sys.modules with its search path but its __init__ not run (its parents are
    imported as usual), so its submodules import alone."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"{name}: not an installed package (torchtitan=={TORCHTITAN_VERSION})")
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return package


def torchtitan() -> SimpleNamespace:
    """torchtitan's FLUX model, its parallelize and converter code, config and helpers."""
    for name in _PACKAGES_NOT_RUN:
        _registered_without_init(name)
    modules = {
        "config": "config",
        "distributed": "distributed",
        "distributed_utils": "distributed.utils",
        "attention": "models.attention",
        "parallelize": "models.flux.infra.parallelize",
        "args": "models.flux.model.args",
        "model": "models.flux.model.model",
        "flux_utils": "models.flux.utils",
        "model_converter": "protocols.model_converter",
        "tools_utils": "tools.utils",
    }
    found = {key: importlib.import_module(f"torchtitan.{name}") for key, name in modules.items()}
    importlib.import_module("torchtitan.components.quantization.float8")  # registers its converter
    return SimpleNamespace(**found)


def flux_model_args(tt: SimpleNamespace, args: ModelArgs) -> object:
    """Our preset's shape as torchtitan's FluxModelArgs (FLUX's MLP ratio 4, rope theta 10,000, qkv bias)."""
    return tt.args.FluxModelArgs(
        in_channels=args.in_channels,
        out_channels=args.in_channels,
        vec_in_dim=args.pooled_projection_dim,
        context_in_dim=args.joint_attention_dim,
        hidden_size=args.hidden,
        mlp_ratio=4.0,
        num_heads=args.num_attention_heads,
        depth=args.num_layers,
        depth_single_blocks=args.num_single_layers,
        axes_dim=tuple(args.axes_dims_rope),
        theta=10_000,
        qkv_bias=True,
    )


def job_config(tt: SimpleNamespace, case: Case, device: torch.device) -> object:
    """torchtitan's JobConfig for the case: its activation checkpointing (full or none), bf16 mixed
    precision, compile, and its float8 converter for torchtitan-fp8."""
    job = tt.config.JobConfig()
    job.activation_checkpoint.mode = "full" if case.checkpointing == "full" else "none"
    job.training.mixed_precision_param = "bfloat16"
    job.compile.enable = case.compile
    job.compile.components = ["model"]
    if case.impl == "torchtitan-fp8":
        job.model.converters = ["quantize.linear.float8"]
        float8 = job.quantize.linear.float8
        float8.recipe_name = case.fp8_recipe or "tensorwise"
        float8.emulate = device.type != "cuda"  # its switch for machines without SM89 (eager only)
    return job


def titan_velocity(
    tt: SimpleNamespace, model: torch.nn.Module, x_t: torch.Tensor, t: torch.Tensor, t5: torch.Tensor,
    clip: torch.Tensor, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """torchtitan's FLUX forward as its trainer calls it (models/flux/train.py), as [B, C, H, W]."""
    b, _, h, w = x_t.shape
    with torch.no_grad(), torch.device(x_t.device):
        img_ids = tt.flux_utils.create_position_encoding_for_latents(b, h, w, 3)
        txt_ids = torch.zeros(b, t5.shape[1], 3)
    tokens = tt.flux_utils.pack_latents(x_t.to(dtype))
    out = model(img=tokens, img_ids=img_ids, txt=t5.to(dtype), txt_ids=txt_ids, y=clip.to(dtype), timesteps=t)
    return tt.flux_utils.unpack_latents(out, h, w)


def build_titan(
    case: Case, args: ModelArgs, device: torch.device, mesh: DeviceMesh | None = None, as_on_gpu: bool = False
) -> "Trainer":
    """torchtitan's FLUX as its trainer builds it on one rank (``mesh`` unused: one rank shards nothing;
    ``as_on_gpu``: AdamW fused)."""
    from throughput.step import Trainer, adamw

    tt = torchtitan()
    job = job_config(tt, case, device)
    dims = tt.distributed.ParallelDims(
        dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1
    )  # fmt: skip
    # before the model: each attention wrapper copies torchtitan's default list (cuDNN first) at init
    tt.attention.ScaledDotProductAttentionWrapper.sdpa_backends = allowed_backends("auto", device.type)
    torch.manual_seed(0)
    dtype = tt.config.TORCH_DTYPE_MAP[job.training.dtype]  # float32: its default
    with torch.device("meta"), tt.tools_utils.set_default_dtype(dtype):
        model = tt.model.FluxModel(flux_model_args(tt, args))
    tt.model_converter.build_model_converters(job, dims).convert(model)
    model = tt.parallelize.parallelize_flux(model, dims, job)
    if case.compile:  # torchtitan 0.3.0's apply_compile (0.2.2's FLUX does not compile)
        for block in [*model.double_blocks, *model.single_blocks]:
            block.compile(fullgraph=True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    amp = tt.distributed_utils.maybe_enable_amp(dims, job.training.mixed_precision_param, device.type)
    params = list(model.parameters())
    return Trainer(
        model,
        adamw(params, device, as_on_gpu),
        params,
        torch.float32,
        autocast=isinstance(amp, torch.autocast),
        predict=partial(titan_velocity, tt),
    )
