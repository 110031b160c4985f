"""The achievable matmul peak of this accelerator in the compute dtype (bf16 on GPUs), measured the way
stas00's mamf-finder does: time plain ``torch.mm`` over a set of shapes and keep the best TFLOP/s. MFU
against it says how much of what this GPU can really do the training reaches; MFU against the datasheet
peak is what vendors quote."""

import time
from dataclasses import dataclass

import torch

GPU_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 3072, 12288), (16384, 3072, 3072))
"""Square sizes where matmuls peak, and the FLUX MLP and attention-projection shapes (hidden 3072)."""
CPU_SHAPES = ((256, 256, 256), (512, 512, 512))


@dataclass(frozen=True)
class GemmPeak:
    tflops: float
    shape: tuple[int, int, int]
    dtype: str


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_gemm_peak(
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    shapes: tuple[tuple[int, int, int], ...] | None = None,
    iterations: int | None = None,
) -> GemmPeak:
    """The best TFLOP/s of ``a @ b`` ([m, k] x [k, n]) over ``shapes``, each the mean of ``iterations``
    back-to-back products after one warm-up."""
    gpu = device.type == "cuda"
    shapes = shapes or (GPU_SHAPES if gpu else CPU_SHAPES)
    iterations = iterations or (20 if gpu else 2)
    best = GemmPeak(0.0, shapes[0], str(dtype).removeprefix("torch."))
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        torch.mm(a, b, out=out)
        synchronize(device)
        start = time.perf_counter()
        for _ in range(iterations):
            torch.mm(a, b, out=out)
        synchronize(device)
        seconds = (time.perf_counter() - start) / iterations
        tflops = 2 * m * n * k / seconds / 1e12
        if tflops > best.tflops:
            best = GemmPeak(tflops, (m, n, k), best.dtype)
        del a, b, out
    return best
