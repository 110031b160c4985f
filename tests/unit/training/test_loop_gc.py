"""The training loop's CPU-only garbage-collection pause (flux_cluster.training.loop.pause_gc_on_cpu)."""

import gc

import torch

from flux_cluster.training.loop import pause_gc_on_cpu


def test_a_cpu_run_pauses_automatic_collection_and_a_gpu_run_keeps_it() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        assert not pause_gc_on_cpu(torch.device("cuda", 0))  # GPU runs: unchanged
        assert gc.isenabled() and gc.get_freeze_count() == frozen
        assert pause_gc_on_cpu(torch.device("cpu"))
        assert not gc.isenabled() and gc.get_freeze_count() > frozen
        assert not pause_gc_on_cpu(torch.device("cpu"))  # already paused: the first caller resumes it
    finally:
        gc.unfreeze()
        gc.enable()
