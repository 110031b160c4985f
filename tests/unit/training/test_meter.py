"""The run's one meter (flux_cluster/training/meter.py), the FLUX job's and the hf workload's: a run whose
only step was the untimed first one (a one-step epoch) has no throughput figure anywhere, NaN or made up:
its summary says NOT_MEASURED (null figures and the reason), its last line says it, TensorBoard gets no
scalar for it; a measured run's figures agree across the file, the line and TensorBoard."""

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from flux_cluster.runtime.dist import DistInfo
from flux_cluster.training.context import JobContext
from flux_cluster.training.meter import NOT_MEASURED, Meter, RunEnd

FLUX = [
    "train.benchmark=finetune",
    "train.mode=lora",
    "train.pretrained_path=/x",
    "train.global_batch_size=2",
]
HF = ["train.benchmark=hf", "hf.model=/m", "hf.task=text-classification", "hf.data=synthetic"]
HF_FACTS = {"model": "m", "task": "text-classification", "parallel": "ddp", "precision": "fp32"}
HF_FACTS |= {"mode": "finetune", "seq_len": 8}


def _context(tmp_path: Path, sets: list[str]) -> JobContext:
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.rundir import result_log

    system = load_system("local", [*sets, "train.micro_batch_size=1", "price_per_gpu_hour=2.0"]).config
    plan = resolve_training(system)
    return JobContext(system, plan, tmp_path, tmp_path, 0, 7, result_log(tmp_path, 0), False, "x")


def _strict(path: Path) -> list[dict[str, Any]]:
    """The metrics file as strict JSON: a NaN or Infinity in it fails."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{path}: {constant} in the metrics file")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


class _Board:
    """What the meter writes to TensorBoard (SummaryWriter's add_scalar, add_text, flush)."""

    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}
        self.texts: list[str] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        assert math.isfinite(value), tag
        self.scalars[tag] = value

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.texts.append(text)

    def flush(self) -> None:
        pass


def _flux_meter(ctx: JobContext, info: DistInfo, board: _Board) -> Meter:
    return Meter(
        ctx,
        info,
        flops_per_step=2e9,
        devices=info.world_size,
        peak_tflops=0.0,
        header={"flops_per_sample": 1e9, "world_size": 1},
        measured_peak_tflops=0.5,
        unit="images/s",
        tb=board,
    )


def _hf_meter(ctx: JobContext, info: DistInfo, board: _Board) -> Meter:
    from flux_cluster.hf.resume import HfProgress
    from flux_cluster.hf.train import _meter

    meter = _meter(ctx, info, 2e9, HF_FACTS, HfProgress())
    meter.tb = board
    return meter


def _flux_end(steps: int) -> RunEnd:
    return RunEnd(steps, steps * 2, 1.0, [0.5], (steps, 0.5), "adamw", {"base_precision": "bf16"})


def _hf_end(steps: int) -> RunEnd:
    from flux_cluster.hf.resume import HfProgress
    from flux_cluster.hf.train import _run_end

    return _run_end(HfProgress(steps, [0.5]), steps * 2, steps, HF_FACTS)


@pytest.mark.parametrize(("sets", "make", "end", "unit"), [
    (FLUX, _flux_meter, _flux_end, "images/s"),
    (HF, _hf_meter, _hf_end, "samples/s"),
])  # fmt: skip
def test_a_one_step_run_says_not_measured_everywhere(
    one_rank: DistInfo, tmp_path: Path, capsys: pytest.CaptureFixture, sets, make, end, unit: str
) -> None:
    ctx, board = _context(tmp_path, sets), _Board()
    meter = make(ctx, one_rank, board)
    meter.start()
    meter.record(1, 2, torch.tensor(0.7), 1e-4, line=True, epoch=1.0, tokens=16, grad_norm=torch.tensor(1.0))
    meter.pause()
    meter.record_eval(1, 2, 0.5, 1.0)
    meter.summary(end(1))
    summary = _strict(ctx.metrics_file)[-1]["summary"]
    assert summary["images_per_s"] is None and summary["step_time_ms"] is None
    assert summary["throughput_note"] == NOT_MEASURED == "not measured (only the first, compiling step ran)"
    assert summary["timed_steps"] == 0 and summary["gpu_hours"] > 0 and summary["best_eval_loss"] == 0.5
    for key in ("samples_per_s", "tokens_per_s", "tflops_per_s", "epoch_seconds", "estimated_gpu_hours"):
        assert summary.get("hf", {}).get(key) is None, key
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"{unit} {NOT_MEASURED}" in last and "nan" not in last.lower(), last
    assert board.texts == [last.removeprefix("[train] ")]
    assert not {"summary/images_per_s", "summary/step_time_ms", "summary/samples_per_s"} & set(board.scalars)
    assert board.scalars["summary/best_eval_loss"] == 0.5


@pytest.mark.parametrize(("sets", "make", "end"), [(FLUX, _flux_meter, _flux_end), (HF, _hf_meter, _hf_end)])
def test_a_measured_runs_figures_agree_in_file_line_and_tensorboard(
    one_rank: DistInfo, tmp_path: Path, capsys: pytest.CaptureFixture, sets, make, end
) -> None:
    ctx, board = _context(tmp_path, sets), _Board()
    meter = make(ctx, one_rank, board)
    meter.start()
    for step in (1, 2, 3):
        meter.record(
            step, step * 2, torch.tensor(0.7), 1e-4, epoch=step / 3, tokens=16, grad_norm=torch.ones(())
        )
    meter.summary(end(3))
    records = _strict(ctx.metrics_file)
    summary = records[-1]["summary"]
    assert "throughput_note" not in summary and summary["timed_steps"] == 2
    step_ms = summary["step_time_ms"]
    per_step = ctx.plan.global_batch_size
    assert summary["images_per_s"] == pytest.approx(per_step / (step_ms / 1000))
    assert board.scalars["summary/images_per_s"] == pytest.approx(summary["images_per_s"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"{summary['images_per_s']:,.1f}" in last and f"step {step_ms:,.1f} ms" in last
    assert "$" in last  # the system's price: the run's cost
    if "hf" in summary:  # the estimate: an epoch of 3 steps at the measured step time
        assert summary["hf"]["epoch_seconds"] == pytest.approx(3 * step_ms / 1000)
        assert summary["hf"]["tokens_per_s"] == pytest.approx(16 / (step_ms / 1000))
        assert summary["best_step"] == 3 and summary["world_size"] == 1
