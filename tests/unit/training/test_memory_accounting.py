"""benchmarks/memory_accounting.py: one training step's peak memory by category, counted under a fake
tensor mode on one fake rank (no memory allocated), on the tiny preset."""

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist

from flux_cluster.training.model import build_model, parameter_count


@pytest.fixture(scope="module")
def accounting() -> Iterator[ModuleType]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[3] / "benchmarks"))
        import memory_accounting

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
        try:
            yield memory_accounting
        finally:
            dist.destroy_process_group()
            for name in [m for m in sys.modules if m.split(".")[0] in ("throughput", "memory_accounting")]:
                del sys.modules[name]  # benchmarks' modules, not ours


def test_ours_holds_16_bytes_per_parameter_and_a_bf16_gradient_copy_on_one_rank(
    accounting: ModuleType,
) -> None:
    """Float32 weights and AdamW's two float32 states are counted whole (the peak falls in the backward,
    with some of the float32 gradients). The float32 gradient copy FSDP2 makes on one rank for a reduce
    it does not need (parallelize.reduce_dtype before) shows as a higher peak than the bf16 copy."""
    from throughput.cases import Case, Shape, model_args

    from flux_cluster.training.parallelize import make_mesh

    shape = Shape(model_args("tiny", 1, 1), latent=8, text_tokens=8)
    mesh = make_mesh(torch.device("cpu"), 1, 1)
    case = Case("ours", 1, "none", False)  # the copy is the same in every mode; none runs fewest ops
    now = accounting.account(case, shape, mesh)
    before = accounting.account(case, shape, mesh, torch.float32)
    params = parameter_count(build_model(shape.args, meta_init=True))
    assert now.peak["params"] == before.peak["params"] == 4 * params
    assert now.peak["optimizer"] == before.peak["optimizer"] >= 8 * params  # + AdamW's step counts
    assert now.peak_phase == before.peak_phase == "backward" and 0 < now.peak["grads"] <= 4 * params
    assert now.peak_total < before.peak_total
    assert now.peak_total == sum(now.peak.values()) and "| ours none |" in accounting.table([now], before)
