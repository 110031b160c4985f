"""A frozen FLUX base in less memory for LoRA (``train.base_precision``): bf16, fp8 or NF4 weights.

Only the frozen linear layers of the transformer change; the LoRA adapters, their float32 master weights,
their gradients and the optimizer stay as they are. Quantization happens after ``add_lora`` (so peft
wraps plain ``nn.Linear`` layers and makes its adapters in float32) and before FSDP2 shards the model.
A pretrained base is read a tensor at a time (``pretrained.load_streaming``), each linear weight quantized
as it is read and held behind a float32-typed placeholder until then, so no rank holds the float32 model:

- ``bf16``: every frozen floating-point parameter is stored in ``train.param_dtype``, the dtype FSDP2
  gathers it in anyway, so the numbers a step computes are unchanged and the float32 copy is gone.
- ``fp8``: each frozen linear weight becomes float8 e4m3 with one float32 scale per output channel
  (absmax / 448), dequantized to the compute dtype in the forward. Both are stored as uint8 bytes.
- ``nf4``: 4-bit NormalFloat (QLoRA): each row's 64-weight blocks scaled by their absmax and rounded to
  the nearest of 16 codes, two a byte, with a float32 absmax per block: 0.5625 bytes per weight. The
  bytes are those of bitsandbytes' ``quantize_4bit(..., quant_type="nf4", blocksize=64)`` exactly (a
  test compares them), but held in our own uint8 tensors like fp8's, because neither library's NF4
  tensor trains with FSDP2 here (both tried, torch 2.13, 2 gloo ranks):
  bitsandbytes' ``Params4bit`` keeps its absmax in a ``QuantState`` beside the tensor, which FSDP2's
  per-parameter sharding does not carry: its forward runs and returns wrong numbers (errors larger than
  the outputs; bitsandbytes supports FSDP1's flat parameters, via ``bnb_4bit_quant_storage``); torchao's
  ``NF4Tensor`` implements FSDP2's all-gather hooks and trains on 2 gloo ranks, but torch 2.13's FSDP2
  skips those hooks' all-gather at world size 1 (``fsdp_post_all_gather`` receives one of its three
  tensors: every one-GPU run, the 24 GB card's case, fails) and it shards only along whole 256-absmax
  scaler blocks, which small layers do not fill. A layer whose input width is not a multiple of 64 stays
  in bf16; ``quantize_base`` says how many.

The quantized bytes (fp8 and scales, nf4 codes and absmax) are non-persistent buffers of their layers,
not parameters: FSDP2 neither shards nor casts buffers (``fully_shard`` only moves them to the device),
on every torch version. As uint8 parameters FSDP2 would keep their bytes (it casts only floating-point
parameters to param_dtype), but torch before 2.13 makes each sharded parameter with requires_grad=True
first, which raises for an integer dtype ("only Tensors of floating point dtype can require gradients"):
every GPU image's torch. So the quantized base is replicated on every rank of the shard group, whole
(fp8: 1 byte a weight, nf4: 0.5625, per GPU whatever the world size), and no step all-gathers it: less
traffic, but on more than one GPU more memory than its shard would take. The bf16 base stays parameters,
sharded and gathered as before. Being non-persistent, the bytes are in no ``state_dict``:
``stored_state`` adds them where they are wanted (``models quantize``).

The forward of a quantized layer saves only the quantized weight for the backward pass (which
dequantizes it again): the bf16 weight is never kept beyond the matmul, with or without activation
checkpointing. The frozen weights are not in training checkpoints (``Checkpointer(frozen_base=True)``
leaves out frozen parameters, and the quantized buffers are in no state_dict) nor in the saved adapter,
so resuming re-quantizes the same pretrained weights the same way.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8_MAX = 448.0
"""The largest float8 e4m3 value: each row's absmax maps to it."""
NF4_BLOCK = 64
"""Weights per NF4 absmax (QLoRA's and bitsandbytes' block size)."""


@dataclass(frozen=True)
class QuantizedBase:
    """What ``quantize_base`` did: layers quantized, layers kept, and this rank's weight bytes
    (``parameter_bytes``: parameters and the quantized buffers)."""

    precision: str
    quantized: int
    kept: list[str]
    """Frozen linear layers left in param_dtype (nf4: inputs not a multiple of the block size)."""
    bytes_before: int
    bytes_after: int

    def describe(self) -> str:
        kept = f", {len(self.kept)} unquantized (inputs not a multiple of {NF4_BLOCK})" if self.kept else ""
        return (
            f"frozen base {self.precision}: {self.quantized} linear layers quantized{kept}; weights "
            f"{self.bytes_before / 1e6:,.2f} MB -> {self.bytes_after / 1e6:,.2f} MB"
        )


STORED = {"fp8": ("weight_fp8", "weight_scale"), "nf4": ("weight_nf4", "weight_absmax")}
"""Per base precision, a quantized layer's two stored tensors, (data, scale): its buffers' names, and the
ends of a pre-quantized checkpoint's keys (what ``models quantize`` writes and ``load_streaming`` reads)."""
STORED_AS = {name: (precision, i) for precision, names in STORED.items() for i, name in enumerate(names)}
"""A stored tensor's name -> (its precision, 0 for the data or 1 for the scale)."""


def companion(name: str) -> str:
    """The other stored tensor of the layer a stored tensor's name belongs to."""
    precision, index = STORED_AS[name]
    return STORED[precision][1 - index]


_Stored = tuple[torch.Tensor, torch.Tensor] | None
"""A layer's weight already quantized as it was read (``load_streaming``): (data, scale) or (packed,
absmax), typed or as their stored bytes."""


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes this process holds for the model's weights: its parameters (DTensors: their local shards) and
    buffers (a quantized base's bytes, whole on every rank)."""
    from itertools import chain

    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in chain(model.parameters(), model.buffers()):
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


# ---- fp8: e4m3 weights with per-output-channel float32 scales, stored as bytes


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight [out, in], float32 scales [out, 1]) with weight ~= e4m3 * scale."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def dequantize_fp8(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight in ``dtype`` from its stored bytes (uint8 [out, in] and [out, 4]) or typed tensors."""
    if data.dtype == torch.uint8:
        data, scale = data.view(torch.float8_e4m3fn), scale.view(torch.float32)
    return data.to(dtype) * scale.to(dtype)


class _Float8Linear(torch.autograd.Function):
    """y = x W^T + b with W dequantized from e4m3 on the fly: only the stored bytes are saved for the
    backward pass, which dequantizes W again for the input's gradient. (One Function per format, with
    fixed arguments: torch.compile traces these whole, fullgraph.)"""

    @staticmethod
    def forward(ctx, x, bias, data, scale):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(data, scale)
        return F.linear(x, dequantize_fp8(data, scale, x.dtype), bias)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        data, scale = ctx.saved_tensors  # once: checkpointing unpacks each saved tensor once
        return grad @ dequantize_fp8(data, scale, grad.dtype), None, None, None


class Float8FrozenLinear(torch.nn.Module):
    """A frozen linear layer with e4m3 weights and per-output-channel scales: uint8 non-persistent buffers
    (FSDP2 neither shards nor casts them; see the module's docstring), the bias a frozen parameter."""

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype, stored: _Stored = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        data, scale = stored or quantize_fp8(linear.weight)
        self.register_buffer(STORED["fp8"][0], data.view(torch.uint8), persistent=False)
        self.register_buffer(STORED["fp8"][1], scale.view(torch.uint8), persistent=False)
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return _Float8Linear.apply(x, bias, self.weight_fp8, self.weight_scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 per-channel"


# ---- nf4: bitsandbytes' 4-bit NormalFloat layout in plain uint8 buffers

NF4_CODE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)  # fmt: skip
"""QLoRA's NormalFloat4 code book (normal quantiles, 0 exact), as bitsandbytes has it."""


def quantize_nf4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [out, in / 2], float32 absmax [out, in / 64]): each 64-weight block of a row divided
    by its absmax and rounded to the nearest code, two codes a byte, the first in the high nibble
    (bitsandbytes' quantize_4bit 'nf4' layout, byte for byte)."""
    rows, cols = weight.shape
    blocks = weight.detach().float().reshape(rows, cols // NF4_BLOCK, NF4_BLOCK)
    absmax = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    code = torch.tensor(NF4_CODE, device=weight.device)
    index = torch.bucketize(blocks / absmax, (code[1:] + code[:-1]) / 2).to(torch.uint8).view(rows, -1, 2)
    return index[..., 0] << 4 | index[..., 1], absmax.view(rows, -1)


def dequantize_nf4(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, dtype: torch.dtype):
    """The weight in ``dtype`` from its packed codes, absmax (float32, or its bytes) and the code book."""
    if absmax.dtype == torch.uint8:
        absmax = absmax.view(torch.float32)
    rows = packed.shape[0]
    index = torch.stack((packed >> 4, packed & 15), dim=-1).view(rows, absmax.shape[1], NF4_BLOCK)
    return (code.to(dtype)[index.int()] * absmax.to(dtype).unsqueeze(-1)).view(rows, -1)


class _NF4Linear(torch.autograd.Function):
    """_Float8Linear's NF4 twin."""

    @staticmethod
    def forward(ctx, x, bias, packed, absmax, code):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(packed, absmax, code)
        return F.linear(x, dequantize_nf4(packed, absmax, code, x.dtype), bias)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        packed, absmax, code = ctx.saved_tensors
        return grad @ dequantize_nf4(packed, absmax, code, grad.dtype), None, None, None, None


class NF4FrozenLinear(torch.nn.Module):
    """A frozen linear layer with NF4 weights: packed codes and per-block absmax bytes, uint8
    non-persistent buffers like Float8FrozenLinear's, the code book a buffer too."""

    weight_nf4: torch.Tensor
    weight_absmax: torch.Tensor
    code: torch.Tensor

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype, stored: _Stored = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed, absmax = stored or quantize_nf4(linear.weight)
        self.register_buffer(STORED["nf4"][0], packed, persistent=False)
        self.register_buffer(STORED["nf4"][1], absmax.contiguous().view(torch.uint8), persistent=False)
        self.register_buffer("code", torch.tensor(NF4_CODE, device=packed.device), persistent=False)
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return _NF4Linear.apply(x, bias, self.weight_nf4, self.weight_absmax, self.code)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4 blocks of {NF4_BLOCK}"


# ---- the model


def frozen_linears(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str, torch.nn.Linear]]:
    """(name, parent, attribute, layer) of every plain frozen nn.Linear: peft's base layers included, its
    adapters (lora_A, lora_B: frozen too when a model is served) not."""
    for parent_name, parent in list(model.named_modules()):
        if "lora_" in parent_name:
            continue
        for attribute, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and not child.weight.requires_grad:
                yield f"{parent_name}.{attribute}".lstrip("."), parent, attribute, child


AS_READ = "_flux_cluster_read"
"""A placeholder weight's attribute (pretrained.load_streaming): (precision, the weight as read)."""


def quantize_base(model: torch.nn.Module, precision: str, dtype: torch.dtype) -> QuantizedBase:
    """Store the frozen weights of ``model`` at ``precision`` in place, before FSDP2 shards it; trainable
    parameters are left alone."""
    if precision not in ("bf16", "fp8", "nf4"):
        raise ValueError(f"base precision {precision!r}: expected bf16, fp8 or nf4")
    before = parameter_bytes(model)
    quantized, kept = 0, []
    for name, parent, attribute, linear in frozen_linears(model):
        read_as, stored = getattr(linear.weight, AS_READ, (precision, None))  # load_streaming's, as read
        if read_as != precision:
            raise ValueError(f"{name}: read for base precision {read_as}, not {precision}")
        layer: torch.nn.Module
        if precision == "bf16":
            if stored is not None:
                linear.weight = torch.nn.Parameter(stored.to(dtype), requires_grad=False)
            continue
        if stored is None and linear.weight.is_meta:  # its bytes would be buffers no init ever fills
            raise ValueError(f"{name}: quantize_base needs real weights, not the meta device's")
        if precision == "fp8":
            layer = Float8FrozenLinear(linear, dtype, stored)
        elif linear.in_features % NF4_BLOCK == 0:
            layer = NF4FrozenLinear(linear, dtype, stored)
        else:
            kept.append(name)
            continue
        setattr(parent, attribute, layer)
        quantized += 1
    with torch.no_grad():  # everything else frozen: in the compute dtype
        for param in model.parameters():
            if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
    return QuantizedBase(precision, quantized, kept, before, parameter_bytes(model))


def stored_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict of an unwrapped ``model`` with its quantized layers' bytes, which it leaves out
    (non-persistent buffers, so that training checkpoints hold the adapters alone), under their module
    names as any weight: what ``models quantize`` writes and ``load_streaming`` reads."""
    state = model.state_dict()
    for name, buffer in model.named_buffers():
        if name.rpartition(".")[2] in STORED_AS:
            state[name] = buffer
    return state


def whole_base_notice(
    base: QuantizedBase, logical_params: int, itemsize: int, shard_ranks: int
) -> str | None:
    """One line where a quantized base, whole on every GPU, holds over 10% more than a base in the compute
    dtype (``itemsize`` bytes a weight) sharded over the ``shard_ranks`` GPUs of an FSDP group would (at
    FLUX's proportions: fp8 on 3 GPUs or more, nf4 on 4 or more); else None."""
    sharded = logical_params * itemsize / shard_ranks
    if base.precision == "bf16" or base.bytes_after <= 1.1 * sharded:
        return None
    return (
        f"note: the {base.precision} base is held whole on each GPU ({base.bytes_after / 1e6:,.0f} MB of "
        f"weights); train.base_precision bf16 would shard it over the {shard_ranks} GPUs of a shard group "
        f"(about {sharded / 1e6:,.0f} MB each)"
    )


def logical_parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters as weights, not as stored elements: a quantized layer counts its
    in x out weights (and bias), not its packed bytes and scales."""
    total = 0
    for module in model.modules():
        if isinstance(module, Float8FrozenLinear | NF4FrozenLinear):
            bias = 0 if module.bias is None else module.bias.numel()
            total += module.in_features * module.out_features + bias
        else:
            total += sum(p.numel() for p in module.parameters(recurse=False))
    return total


def summary_facts(base: QuantizedBase | None, parameter_bytes: int) -> dict[str, object]:
    """The fine-tuning summary's facts of the model's storage (the precision ladder's rows): this rank's
    parameter memory, and for LoRA the frozen base's precision and the layers quantized."""
    facts: dict[str, object] = {"parameter_gb": parameter_bytes / 1e9}
    if base is not None:
        facts |= {"base_precision": base.precision, "base_quantized_layers": base.quantized}
    return facts
