"""flux-cluster report on fine-tuning runs (issue 14): no olympic score; time, throughput, validation loss,
GPU-hours and cost, side by side across systems. The run directories are written here as the training
loop writes them (config.yaml, results/result_<i>.txt, metrics_<i>.jsonl with its summary line, best_<i>/)."""

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.mlperf_rules import MAX_LINE_BYTES
from flux_cluster.report.build import Options, build
from flux_cluster.report.formats import print_tables, render_csv, render_json, render_markdown
from flux_cluster.report.html import render_html
from flux_cluster.report.scoring import GroupResult

T0 = 1_795_000_000_000  # run_start, ms
EVALS = [(640, 0.5, 0.52), (1280, 1.0, 0.44), (1920, 1.5, 0.47)]  # (samples, epochs, loss): best not last


def _summary(**changes: Any) -> dict[str, Any]:
    summary = {
        "images_per_s": 100.0, "step_time_ms": 640.0, "train_seconds": 1700.0, "epochs": 1.5, "steps": 30,
        "samples": 1920, "best_eval_loss": 0.44, "best_step": 20, "final_eval_loss": 0.47,
        "peak_memory_gb": 61.5, "world_size": 8, "optimizer": "adamw",
    }  # fmt: skip
    return {**summary, **changes}


def _mllog(key: str, time_ms: int, value: Any = None, **metadata: Any) -> str:
    return ":::MLLOG " + json.dumps({"time_ms": time_ms, "key": key, "value": value, "metadata": metadata})


def fine_tuning_run(
    root: Path,
    *,
    gpus: int = 8,
    price: float = 2.0,
    minutes: list[float] | None = None,
    summaries: list[dict[str, Any] | None] | None = None,
    metrics_extra: list[str] | None = None,
) -> Path:
    """A fine-tuning run directory: one result/metrics/best_ triple per entry of minutes."""
    minutes = minutes or [30.0]
    summaries = summaries or [_summary()] * len(minutes)
    config = {
        "system": {
            "name": root.name, "nodes": 1, "gpus_per_node": gpus, "gpu_model": "H100",
            "price_per_gpu_hour": price, "train": {"benchmark": "finetune", "mode": "lora"},
        }
    }  # fmt: skip
    results = root / "results"
    results.mkdir(parents=True)
    (root / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    for i, (length, summary) in enumerate(zip(minutes, summaries, strict=True)):
        stop = T0 + round(length * 60_000)
        log = [
            _mllog("submission_benchmark", T0 - 10, "finetune"),
            _mllog("submission_division", T0 - 9, "open"),
        ]
        log += [_mllog("run_start", T0), _mllog("block_start", T0 + 1, samples_count=1920)]
        log += [_mllog("block_stop", T0 + 1 + 24_000, samples_count=1920)]  # 80 images/s in the log
        log += [
            _mllog("eval_accuracy", T0 + 100 * s, loss, samples_count=s, epoch_num=e) for s, e, loss in EVALS
        ]
        log += [_mllog("run_stop", stop, status="success")]
        (results / f"result_{i}.txt").write_text("\n".join(log) + "\n")
        metrics = [json.dumps({"flops_per_sample": 1e12, "world_size": gpus, "peak_tflops": 989.0})]
        for step in range(1, 31):
            record = {"step": step, "samples": 64 * step, "loss": 0.6, "grad_norm": 1.0, "lr": 1e-4}
            metrics.append(json.dumps({**record, "data_wait_s": 0.01}))
            for s, e, loss in EVALS:
                if s == 64 * step:
                    metrics.append(json.dumps({"step": step, "samples": s, "eval_loss": loss, "epoch": e}))
        metrics += metrics_extra or []
        if summary is not None:
            metrics.append(json.dumps({"summary": summary}))
        (results / f"metrics_{i}.jsonl").write_text("\n".join(metrics) + "\n")
        (results / f"best_{i}").mkdir()
    return root


@pytest.fixture
def two_systems(tmp_path: Path) -> tuple[Path, Path]:
    """System a: 8 GPUs at $2/GPU-h, runs of 30 and 34 minutes; b: 4 GPUs at $3/GPU-h, one of 20."""
    a = fine_tuning_run(
        tmp_path / "a", minutes=[30.0, 34.0], summaries=[_summary(), _summary(best_eval_loss=0.40)]
    )
    b = fine_tuning_run(
        tmp_path / "b",
        gpus=4,
        price=3.0,
        minutes=[20.0],
        summaries=[_summary(images_per_s=150.0, step_time_ms=420.0, peak_memory_gb=70.25, world_size=4)],
    )
    return a, b


def test_fine_tuning_groups_side_by_side_with_their_gpu_hours_cost_and_losses(
    two_systems: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = build(list(two_systems), Options(check=True))  # check: fine-tuning logs never reach the checker
    assert a.fine_tuning and b.fine_tuning and a.olympic_minutes is None
    assert a.mean_minutes == pytest.approx(32.0) and a.minutes_basis == "measured"
    assert a.gpu_hours == pytest.approx(32 * 8 / 60) and a.cost_usd == pytest.approx(32 * 8 / 60 * 2)
    assert a.total_gpu_hours == pytest.approx(64 * 8 / 60) and a.total_cost_usd == pytest.approx(
        64 * 8 / 60 * 2
    )
    assert b.gpu_hours == pytest.approx(20 * 4 / 60) and b.cost_usd == pytest.approx(4.0)
    assert a.best_eval_loss == pytest.approx(0.42) and a.final_eval_loss == pytest.approx(0.47)  # run means
    assert a.images_per_s == pytest.approx(100.0) and a.images_per_s_per_accelerator == pytest.approx(12.5)
    assert b.images_per_s_per_accelerator == pytest.approx(37.5) and b.step_time_ms == pytest.approx(420.0)
    assert a.peak_memory_gb == pytest.approx(61.5) and b.peak_memory_gb == pytest.approx(70.25)

    run = a.runs[0].fine_tuning
    assert run is not None and run.summary and run.optimizer == "adamw" and run.epochs == 1.5
    assert run.best_weights == str(two_systems[0] / "results" / "best_0") and run.train_seconds == 1700.0
    assert [(p.samples, p.epoch, p.loss) for p in run.curve] == EVALS
    assert a.runs[1].fine_tuning and a.runs[1].fine_tuning.best_eval_loss == 0.40
    assert not any("metrics" in w for r in a.runs + b.runs for w in r.warnings)

    document = json.loads(render_json([a, b]))
    group = document["groups"][0]
    assert group["train_mode"] == "lora" and group["best_eval_loss"] == pytest.approx(0.42)
    assert group["runs"][0]["fine_tuning"]["curve"][1] == {
        "step": 20,
        "samples": 1280,
        "epoch": 1.0,
        "loss": 0.44,
    }
    assert group["runs"][0]["fine_tuning"]["best_weights"].endswith("best_0")

    markdown = render_markdown([a, b])
    side = markdown.split("## Fine-tuning, side by side")[1].split("\n\n")[1].splitlines()
    assert side[2].startswith("| b | b | lora | 4 |") and side[3].startswith(
        "| a | a | lora | 8 |"
    )  # cheapest
    assert (
        "| 32.00 | 100.0 | 12.50 | 640 | 0.4200 | 0.4700 | 61.5 | 4.27 | 8.53 | 17.07 | measured |" in side[3]
    )
    assert "olympic" not in markdown.split("## Fine-tuning, side by side")[1].split("\n\n")[1]

    rows = {row["system"]: row for row in csv.DictReader(io.StringIO(render_csv([a, b])))}
    assert rows["a"]["train_mode"] == "lora" and rows["a"]["minutes_basis"] == "measured"
    assert float(rows["a"]["total_cost_usd"]) == pytest.approx(64 * 8 / 60 * 2)
    assert float(rows["b"]["images_per_s_per_accelerator"]) == pytest.approx(37.5)

    out = io.StringIO()
    print_tables([a, b], Console(file=out, width=250), checked=True)
    terminal = out.getvalue()
    assert "Fine-tuning, side by side" in terminal and "8.53" in terminal  # USD per run
    assert "17.07" not in terminal and "best_0" not in terminal  # compact: all runs' USD, the weights
    assert "olympic scores" not in terminal  # no MLPerf group: no MLPerf table
    out = io.StringIO()
    print_tables([a, b], Console(file=out, width=250), checked=True, wide=True)
    assert "17.07" in out.getvalue() and "best_0" in out.getvalue()


def test_a_run_without_its_summary_line_is_still_reported(tmp_path: Path) -> None:
    root = fine_tuning_run(tmp_path / "cut", summaries=[None])  # killed before the summary line
    (group,) = build([root], Options(check=False))
    (run,) = group.runs
    ft = run.fine_tuning
    assert ft is not None and not ft.summary and run.minutes == 30.0
    assert ft.best_eval_loss == 0.44 and ft.best_step == 20 and ft.final_eval_loss == 0.47
    assert ft.steps == 30 and ft.samples == 1920 and ft.epochs == 1.5 and ft.peak_memory_gb is None
    assert ft.images_per_s == pytest.approx(80.0)  # the log's block_start/stop, evaluations excluded
    assert ft.step_time_ms == pytest.approx(64 / 80 * 1000)  # 64 images a step at 80 images/s
    assert any("no summary line" in w for w in run.warnings), run.warnings
    assert group.best_eval_loss == 0.44 and group.cost_usd == pytest.approx(8.0)

    (root / "results" / "metrics_0.jsonl").unlink()  # no metrics file at all: the log's evaluations
    (group,) = build([root], Options(check=False))
    ft = group.runs[0].fine_tuning
    assert (
        ft is not None
        and ft.best_eval_loss == 0.44
        and [(p.samples, p.epoch) for p in ft.curve] == [(s, e) for s, e, _ in EVALS]
    )
    assert any("metrics_0.jsonl: missing" in w for w in group.runs[0].warnings)


def test_a_hostile_metrics_file_gives_warnings_never_a_crash(tmp_path: Path, cli: CliRunner) -> None:
    hostile = [
        "x" * (MAX_LINE_BYTES + 10),  # one huge line
        "{not json",
        "[1, 2]",
        json.dumps({"step": 31, "samples": 1984, "eval_loss": float("nan"), "epoch": 1.6}),  # NaN
    ]
    bad = _summary(best_eval_loss=float("nan"), images_per_s="fast", epochs=-1, optimizer=["x"])
    root = fine_tuning_run(tmp_path / "evil", summaries=[bad], metrics_extra=hostile)
    (group,) = build([root], Options(check=False))
    (run,) = group.runs
    ft = run.fine_tuning
    assert ft is not None and run.minutes == 30.0
    metrics = root / "results" / "metrics_0.jsonl"
    for expected in (
        f"{metrics}: 1 line(s) over 256 KiB skipped",
        f"{metrics}: 2 line(s) that are no JSON object skipped",
        f"{metrics}: 1 evaluation(s) with a loss that is not a finite number skipped",
        f"{metrics}: summary.best_eval_loss: got nan, expected a finite number >= 0",
        f"{metrics}: summary.images_per_s: got 'fast', expected a finite number >= 0",
        f"{metrics}: summary.epochs: got -1, expected a finite number >= 0",
        f"{metrics}: summary.optimizer: got ['x'], expected a text",
    ):
        assert expected in run.warnings, run.warnings
    assert ft.best_eval_loss == 0.44  # the evaluation lines' fallback
    # a summary without a good images/s: no figure of the log's (80.0) in its place
    assert (
        ft.images_per_s is None
        and ft.throughput_note == "not measured"
        and run.throughput_samples_per_s is None
    )
    assert ft.epochs == 1.5 and ft.optimizer is None and ft.final_eval_loss == 0.47
    for fmt in ("table", "csv", "md", "json", "html"):
        result = cli.invoke(app, ["report", str(root), "--no-check", "--format", fmt])
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output


def test_html_has_the_fine_tuning_table_and_the_loss_curves(two_systems: tuple[Path, Path]) -> None:
    groups = build(list(two_systems), Options(check=False))
    page = render_html(groups, checked=False)
    table = page.split('id="fine-tuning"')[1].split("</table>")[0]
    assert "Fine-tuning, side by side" in page and table.index(">b (4, lora)<") < table.index(">a (8, lora)<")
    assert "17.07" in table and "olympic" not in table
    assert 'id="summary"' not in page  # no MLPerf group: no MLPerf summary table
    curves = page.split('aria-label="Fine-tuning: validation loss')[1].split("</figure>")[0]
    assert "<svg" in curves and "a (8, lora)" in curves and "b (4, lora)" in curves
    assert "Best validation loss" in page  # the fine-tuning cards' fourth answer


def test_mlperf_tables_show_mode_basis_and_all_runs_totals() -> None:
    group = GroupResult(
        path="/r/h100/flux1", benchmark="flux1", system="h100", submitter=None, accelerator_model=None,
        accelerators=8, ruleset="5.1.0", runs=[], olympic_minutes=100.0, gpu_hours=13.3333,
        cost_usd=26.6667, train_mode="pretrain", minutes_basis="olympic", total_gpu_hours=133.3333,
        total_cost_usd=266.6667,
    )  # fmt: skip
    markdown = render_markdown([group])
    header, _, row = markdown.splitlines()[2:5]
    cells = dict(zip(*(map(str.strip, line.strip("|").split("|")) for line in (header, row)), strict=True))
    assert cells["mode"] == "pretrain" and cells["basis"] == "olympic"
    assert cells["GPU-hours all runs"] == "133.33" and cells["USD all runs"] == "266.67"
    (csv_row,) = csv.DictReader(io.StringIO(render_csv([group])))
    assert csv_row["train_mode"] == "pretrain" and csv_row["minutes_basis"] == "olympic"
    assert csv_row["total_gpu_hours"] == "133.3333" and csv_row["total_cost_usd"] == "266.6667"
    out = io.StringIO()
    print_tables([group], Console(file=out, width=250), checked=True, wide=True)
    assert "basis" in out.getvalue() and "266.67" in out.getvalue()


def test_summaries_whose_mean_overflows_give_no_figure_not_a_crash(tmp_path: Path) -> None:
    huge = _summary(best_eval_loss=1e308, images_per_s=1e308)
    run = fine_tuning_run(tmp_path / "crafted", minutes=[30.0, 31.0], summaries=[huge, huge])
    (group,) = build([run], Options())
    assert group.best_eval_loss is None and group.images_per_s is None and group.final_eval_loss == 0.47


def test_one_throughput_in_every_format(tmp_path: Path) -> None:
    """The summary's images/s (measured steps alone: 100) is the run's throughput everywhere; the log's
    training blocks (80 images/s, first-step compile included) appear nowhere."""
    (group,) = build([fine_tuning_run(tmp_path / "one")], Options(check=False))
    assert group.throughput_samples_per_s == group.images_per_s == pytest.approx(100.0)
    assert group.throughput_per_accelerator == group.images_per_s_per_accelerator == pytest.approx(12.5)
    document = json.loads(render_json([group]))["groups"][0]
    assert document["throughput_samples_per_s"] == document["images_per_s"] == 100.0
    assert document["runs"][0]["throughput_samples_per_s"] == 100.0
    (row,) = csv.DictReader(io.StringIO(render_csv([group])))
    assert float(row["throughput_per_accelerator"]) == float(row["images_per_s_per_accelerator"]) == 12.5
    out = io.StringIO()
    print_tables([group], Console(file=out, width=300), checked=False, wide=True)
    page = render_html([group], checked=False)
    html_text = re.sub(r"<svg.*?</svg>", "", page, flags=re.S)  # (plot coordinates hold any digits)
    for name, text in (("table", out.getvalue()), ("md", render_markdown([group])), ("html", html_text)):
        assert "12.50" in text and "100.0" in text, name
        assert "10.00" not in text and "80.0" not in text, name  # the log's block figure, per GPU and all
    bars = page.split('aria-label="Throughput"')[1].split("</figure>")[0]
    assert "12.50" in bars


def test_several_runs_on_one_system_are_told_apart_by_their_run_name(tmp_path: Path) -> None:
    roots = [fine_tuning_run(tmp_path / name) for name in ("lora-rank4", "lora-rank16")]
    for root in roots:  # the same system for both
        config = json.loads((root / "config.yaml").read_text())
        config["system"]["name"] = "local"
        (root / "config.yaml").write_text(json.dumps(config))
    out = io.StringIO()
    print_tables(build(roots, Options(check=False)), Console(file=out, width=300), checked=False)
    side = out.getvalue().split("Fine-tuning, side by side")[1]
    assert "lora-rank4" in side and "lora-rank16" in side
