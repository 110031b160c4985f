"""The FLOPs formula: NVIDIA's figure for the real shape, and the parts scale as they must."""

import pytest

from flux_cluster.config.workload import ModelShape
from flux_cluster.training.flops import (
    FLUX_SCHNELL,
    NVIDIA_TFLOP_PER_SAMPLE,
    forward_macs,
    training_flops_per_sample,
)


def test_real_shape_matches_nvidia_within_one_percent() -> None:
    tflop = training_flops_per_sample(FLUX_SCHNELL) / 1e12
    assert tflop == pytest.approx(NVIDIA_TFLOP_PER_SAMPLE, rel=0.01)


def test_blocks_dominate_and_scale_with_depth_and_width() -> None:
    parts = forward_macs(FLUX_SCHNELL, 256, 256)
    assert parts["double_blocks"] + parts["single_blocks"] > 0.99 * sum(parts.values())
    deeper = ModelShape(hidden=3072, double_blocks=38, single_blocks=38)
    assert forward_macs(deeper, 256, 256)["double_blocks"] == pytest.approx(2 * parts["double_blocks"])
    wider = ModelShape(hidden=6144, double_blocks=19, single_blocks=38)
    ratio = forward_macs(wider, 256, 256)["single_blocks"] / parts["single_blocks"]
    assert 3.5 < ratio < 4.0  # d^2 terms quadruple, the L^2 d attention term only doubles


def test_attention_term_is_quadratic_in_tokens() -> None:
    shape = ModelShape(hidden=64, double_blocks=1, single_blocks=0, mlp_ratio=0.0)
    base = forward_macs(shape, 100, 0)["double_blocks"] - 12 * 64 * 64
    doubled = forward_macs(shape, 200, 0)["double_blocks"] - 12 * 64 * 64
    projections = 4 * 64 * 64
    assert (doubled - 200 * projections) == pytest.approx(4 * (base - 100 * projections))
