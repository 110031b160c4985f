"""What the hf workload's meter needs beyond the run's meter (flux_cluster/training/meter.py, which
writes seed 002's figures: samples/s and tokens/s, step time, TFLOP/s and MFU, peak memory, time per
epoch, the estimated total time, GPU-hours and cost): the FLOPs of a step (FlopCounterMode on the real
model, once), the GPU's dense peak for the precision, the tokens of a batch."""

from typing import Any

import torch

from flux_cluster.config.schema import SystemConfig

FP32_TFLOPS = {"H100": 67.0, "H200": 67.0, "GB200": 80.0, "B200": 80.0, "A100": 19.5, "MI300X": 163.4}
"""Datasheet dense FP32 (non-tensor-core) peaks by GPU model name, TFLOP/s: plain fp32 training's peak."""


def peak_tflops(system: SystemConfig, precision: str, device: torch.device) -> float | None:
    """The datasheet's dense peak per GPU for the precision (AMP: the system's bf16 peak, fp16's too on
    these GPUs; fp32: FP32_TFLOPS by gpu_model); None on CPU or an unknown model."""
    if device.type != "cuda":
        return None
    if precision != "fp32":
        return system.peak_bf16_tflops or None
    known = [v for name, v in FP32_TFLOPS.items() if name in system.gpu_model.upper().replace("-", "")]
    return known[0] if known else None


def count_flops(step: Any) -> float:
    """FLOPs of step() (one forward and backward of the real model), by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def tokens_in(batch: dict[str, torch.Tensor]) -> int | None:
    """Text batches: the real (unpadded) tokens; images: None."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return None
