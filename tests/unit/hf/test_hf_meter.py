"""The throughput window both meters share (training/metrics.py's ThroughputWindow), the hf meter's totals
carried over a resume (and the report's minutes of a resumed run), a checkpoint's save paused out of
throughput, a finished run's last checkpoint, and the tiny models' size option."""

import json
import time
from pathlib import Path

import pytest
import torch

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.resume import HfProgress
from flux_cluster.hf.train import Batching, _meter, _run_end, _save, _Trainer, final_checkpoint
from flux_cluster.runtime.dist import DistInfo
from flux_cluster.training.checkpoint import Checkpointer
from flux_cluster.training.context import JobContext
from flux_cluster.training.metrics import RunClock, ThroughputWindow, Totals

CPU = torch.device("cpu")


def test_the_window_leaves_out_pauses_and_closes_into_the_totals(one_rank: DistInfo) -> None:
    began = time.perf_counter()
    window = ThroughputWindow(CPU)
    window.add(torch.tensor(1.0))
    window.add(torch.tensor(3.0, requires_grad=True))  # a loss with a graph: kept detached
    window.pause()
    time.sleep(0.2)  # an evaluation
    window.resume()
    elapsed = window.seconds()
    wall = time.perf_counter() - began  # relative to the time measured: no margin a loaded CI could pass
    assert window.paused_s >= 0.2 and 0 <= elapsed <= wall - window.paused_s
    assert window.mean_loss(1) == 2.0 and not window.loss.requires_grad
    window.close(elapsed)
    assert (window.timed_s, window.timed_steps, window.steps, float(window.loss)) == (elapsed, 2, 0, 0.0)


def _context(tmp_path: Path, *sets: str) -> JobContext:
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.rundir import result_log

    hf = ["train.benchmark=hf", f"hf.model={tmp_path}", "hf.task=text-classification", "hf.data=synthetic"]
    system = load_system("local", [*hf, *sets]).config
    return JobContext(
        system, resolve_training(system), tmp_path, tmp_path, 0, 7, result_log(tmp_path, 0), False, "x"
    )


FACTS = {"model": "m", "task": "text-classification", "parallel": "ddp", "precision": "fp32"}
FACTS |= {"mode": "finetune", "seq_len": 8}


def test_a_resumed_meter_counts_the_earlier_attempts(one_rank: DistInfo, tmp_path: Path) -> None:
    from hf_samples import hf_run

    from flux_cluster.report.build import Options, build

    ctx = _context(tmp_path, "train.log_every_steps=100")
    carried = Totals(RunClock(100.0, 80.0, 10, 7.5, 1e6), 160, 1600)
    meter = _meter(ctx, one_rank, 1e9, FACTS, HfProgress(10, [0.7], 1, carried))
    meter.start()
    for step in (11, 12, 13):  # the attempt's first step is not timed
        meter.record(step, step * 16, torch.tensor(0.5), 1e-4, epoch=1.0, tokens=160)
    totals = meter.totals()
    clock = totals.clock
    assert clock.train_seconds >= 100.0 and clock.timed_seconds >= 80.0 and clock.lost_seconds == 7.5
    assert (clock.timed_steps, totals.timed_samples, totals.timed_tokens) == (12, 192, 1920)
    assert clock.peak_memory_gb == 1e6  # the earlier attempt's peak stays the run's
    meter.summary(_run_end(HfProgress(13, [0.7], 1, carried), 208, 13, FACTS))
    summary = json.loads(ctx.metrics_file.read_text().splitlines()[-1])["summary"]
    assert summary["train_seconds"] >= 100.0 and summary["timed_steps"] == 12  # the open window's too
    assert summary["hf"]["tokens_per_s"] == pytest.approx(1920 / clock.timed_seconds, rel=0.05)
    assert summary["final_eval_loss"] == 0.7 and summary["peak_memory_gb"] == 1e6
    assert summary["attempts"] == 2 and summary["lost_seconds"] == 7.5
    # the report: a 2-attempt run's minutes (GPU-hours, cost) are the whole run's, not its last log's 1.5
    (group,) = build([hf_run(tmp_path / "report", summary=summary, minutes=1.5)], Options(check=False))
    (run,) = group.runs
    assert run.minutes == pytest.approx(summary["train_seconds"] / 60) and run.minutes > 100 / 60


def _tiny_trainer() -> _Trainer:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    model = BertForSequenceClassification(config)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return _Trainer(model, params, optimizer, scaler, Batching(2, 1, 1), "fp32", CPU)


def test_a_checkpoints_save_is_not_throughput_and_a_finished_run_saves_its_last_step(
    one_rank: DistInfo, tmp_path: Path
) -> None:
    """The save's time is paused out of the throughput window (still the run's time); a finished run that
    checkpoints saves its last step, so a rerun resumes there and finishes at once; one that never
    checkpointed saves nothing (a rerun starts over)."""
    meter = _meter(_context(tmp_path), one_rank, 1e9, FACTS, HfProgress())
    trainer = _tiny_trainer()
    scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: 1.0)
    checkpoints = Checkpointer(tmp_path / "checkpoints", 2, 0, 1)
    progress = HfProgress(step=3)
    final_checkpoint(checkpoints, progress, meter, trainer, scheduler)
    assert checkpoints.latest() is None  # checkpointing off: nothing to resume from
    meter.start()
    began = time.perf_counter()
    _save(checkpoints, progress, meter, trainer, scheduler)
    took = time.perf_counter() - began
    assert meter.window.paused_s >= took / 2 > 0  # the save's time, paused out (relative: no fixed margin)
    progress.step = 5
    final_checkpoint(checkpoints, progress, meter, trainer, scheduler)
    final_checkpoint(checkpoints, progress, meter, trainer, scheduler)  # at the last step already: no save
    assert [p.name for p in checkpoints.committed()] == ["step_00000003", "step_00000005"]


def test_an_unknown_model_size_is_one_line(tmp_path: Path) -> None:
    from flux_cluster.models.tiny_hf import SIZES, write_tiny_hf

    with pytest.raises(FluxClusterError, match="size 'huge': expected one of tiny, base"):
        write_tiny_hf(tmp_path / "m", kind="bert", size="huge")
    assert (SIZES["base"].width, SIZES["base"].layers, SIZES["base"].heads) == (768, 12, 12)
