"""The operator counter the throughput benchmark reports per step (a CPU-measurable host cost)."""

import torch
from torch._dynamo.utils import counters

from flux_cluster.training.dispatch_count import DispatchCounter, count_dispatched


def test_it_counts_each_dispatched_operator_by_name() -> None:
    x = torch.ones(4)
    counter = count_dispatched(lambda: ((x + 1) * 2).sum())
    assert counter.counts == {"aten.add.Tensor": 1, "aten.mul.Tensor": 1, "aten.sum.default": 1}
    assert counter.total == 3


def test_torch_compile_still_compiles_under_it() -> None:
    """A plain dispatch mode makes torch.compile skip every frame (the count would be eager's); this one
    leaves compilation alone, so a compiled step is counted as it runs."""
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    compiled = torch.compile(lambda x: (x.sin() + 1).cos(), backend="eager", fullgraph=True)
    with DispatchCounter() as counter:
        out = compiled(torch.ones(3))
    assert counters["stats"]["unique_graphs"] == before + 1
    assert torch.allclose(out, (torch.ones(3).sin() + 1).cos())
    assert counter.total >= 1
    torch._dynamo.reset()
