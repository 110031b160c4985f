"""Which scaled-dot-product-attention kernel the FLUX blocks use (``train.attention_backend``).

``auto`` never picks a kernel known to fail: cuDNN's SDPA backward failed at FLUX shapes in bf16 on H100
(torch 2.11, pytorch issues 122695, 134001, 104766), so on CUDA it allows flash, then memory-efficient,
then math as the last resort; ROCm has no cuDNN and takes the same list; the CPU runs math. The choice
holds for the whole run (forward, backward and activation recomputation) because torch's SDPA flags are
process-wide, not per thread, and the backward pass runs on autograd's own threads.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

_NAMED: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
_NAMES = {backend: name for name, backend in _NAMED.items()}


def allowed_backends(choice: str, device_type: str) -> list[SDPBackend]:
    """The kernels SDPA may use, in priority order. ``auto``: flash, memory-efficient, math on GPUs (CUDA
    and ROCm; never cuDNN); math on the CPU. A named backend is the only one allowed."""
    if choice != "auto":
        return [_NAMED[choice]]
    if device_type == "cpu":
        return [SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextmanager
def attention_backend(choice: str, device: torch.device) -> Iterator[list[SDPBackend]]:
    """Restrict SDPA to the chosen kernels (and their order) inside the block."""
    backends = allowed_backends(choice, device.type)
    with sdpa_kernel(backends, set_priority=True):
        yield backends


def probe_backend(
    choice: str, device: torch.device, dtype: torch.dtype, heads: int, head_dim: int, tokens: int
) -> str:
    """The kernel SDPA picks for the model's attention shape under ``choice``, after one forward and
    backward through it: raises RuntimeError with one line naming the setting when none can run."""
    shape = (1, heads, tokens, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    with attention_backend(choice, device):
        try:
            picked = SDPBackend(torch._fused_sdp_choice(q, k, v))
            torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RuntimeError(
                f"train.attention_backend {choice!r} cannot run attention on {device.type} "
                f"({str(dtype).removeprefix('torch.')}, {heads} heads x {head_dim}): {reason}"
            ) from None
    return _NAMES.get(picked, picked.name.lower())
