"""The throughput window both meters share (training/metrics.py's ThroughputWindow), the hf meter's totals
carried over a resume, and the tiny models' size option."""

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.meter import HfMeter, HfTotals
from flux_cluster.runtime.dist import DistInfo
from flux_cluster.training.metrics import ThroughputWindow

CPU = torch.device("cpu")


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[DistInfo]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield DistInfo(rank=0, world_size=1, local_rank=0, backend="gloo", device=CPU)
    dist.destroy_process_group()


def test_the_window_leaves_out_pauses_and_closes_into_the_totals(one_rank: DistInfo) -> None:
    window = ThroughputWindow(CPU)
    window.add(torch.tensor(1.0))
    window.add(torch.tensor(3.0, requires_grad=True))  # a loss with a graph: kept detached
    window.pause()
    time.sleep(0.2)  # an evaluation
    window.resume()
    elapsed = window.seconds()
    assert 0 <= elapsed < 0.15 and window.mean_loss(1) == 2.0 and not window.loss.requires_grad
    window.close(elapsed)
    assert (window.timed_s, window.timed_steps, window.steps, float(window.loss)) == (elapsed, 2, 0, 0.0)


def test_a_resumed_meter_counts_the_earlier_attempts(one_rank: DistInfo, tmp_path: Path) -> None:
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.rundir import result_log
    from flux_cluster.training.context import JobContext

    sets = ["train.benchmark=hf", f"hf.model={tmp_path}", "hf.task=text-classification", "hf.data=synthetic"]
    system = load_system("local", [*sets, "train.log_every_steps=100"]).config
    ctx = JobContext(
        system, resolve_training(system), tmp_path, tmp_path, 0, 7, result_log(tmp_path, 0), False, "x"
    )
    meter = HfMeter(ctx, one_rank, 1e9, None, devices=2)
    meter.carry(HfTotals(100.0, 80.0, 10, 160, 1600, 1e6), [0.7])
    meter.start()
    for step in (11, 12, 13):  # the attempt's first step is not timed
        meter.record(step, 1.0, torch.tensor(0.5), 16, 160, 1e-4, False)
    totals = meter.totals()
    assert totals.train_seconds >= 100.0 and totals.timed_seconds >= 80.0
    assert (totals.timed_steps, totals.timed_samples, totals.timed_tokens) == (12, 192, 1920)
    assert totals.peak_memory_gb == 1e6  # the earlier attempt's peak stays the run's
    meter.header({})
    facts = {"seq_len": 8, "task": "t", "parallel": "ddp", "precision": "fp32", "mode": "finetune"}
    meter.summary(13, 208, 1.0, 13, {**facts, "model": "m"})
    summary = json.loads(ctx.metrics_file.read_text().splitlines()[-1])["summary"]
    assert summary["train_seconds"] >= 100.0 and summary["timed_steps"] == 10  # the open window is not closed
    assert summary["final_eval_loss"] == 0.7 and summary["peak_memory_gb"] == 1e6


def test_an_unknown_model_size_is_one_line(tmp_path: Path) -> None:
    from flux_cluster.models.tiny_hf import SIZES, write_tiny_hf

    with pytest.raises(FluxClusterError, match="size 'huge': expected one of tiny, base"):
        write_tiny_hf(tmp_path / "m", kind="bert", size="huge")
    assert (SIZES["base"].width, SIZES["base"].layers, SIZES["base"].heads) == (768, 12, 12)
