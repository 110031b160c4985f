"""flux-cluster report on runs of the hf workload (issue 30, seed 002): each run's settings, rates, FLOPs,
time per epoch, estimated total time and cost, and the seed's comparisons (FP32 vs AMP, full vs LoRA,
DP vs DDP, micro-batch sizes) in every format. The run folders are written as session 6's interface says
the rank side writes them (tests/hf_samples.py)."""

import csv
import io
import json
import reprlib
from itertools import product
from pathlib import Path

import pytest
from hf_samples import hf_block, hf_header, hf_run, hf_summary, hf_sweep_runs, write_run_config
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_plan import SweepRequest, plan_sweep
from flux_cluster.launch.sweep_status import _train_figures, sweep_report
from flux_cluster.mlperf_rules import MAX_LINE_BYTES
from flux_cluster.report import sweep as report_sweep
from flux_cluster.report.build import Options, build
from flux_cluster.report.formats import (
    HF_COMPARISON_TITLE,
    HF_TITLE,
    print_tables,
    render_csv,
    render_json,
    render_markdown,
)
from flux_cluster.report.hf import comparisons, hf_rows
from flux_cluster.report.html import render_html
from flux_cluster.report.sweep import comparisons as sweep_comparisons
from flux_cluster.sweepdir import Point, SweepState


@pytest.fixture
def sweep(tmp_path: Path) -> dict[str, Path]:
    return hf_sweep_runs(tmp_path)


def _by_name(groups: list) -> dict:
    return {row.name: row for row in hf_rows(groups)}


def test_each_hf_run_has_its_settings_rates_flops_and_the_cost_of_its_epochs(sweep: dict[str, Path]) -> None:
    groups = build(list(sweep.values()), Options(check=True))  # hf runs never reach the checker
    rows = _by_name(groups)
    assert set(rows) == set(sweep)
    base = rows["base"]
    hf = base.hf
    assert (hf.model, hf.task, hf.parallel, hf.precision, hf.mode) == (
        "bert", "text-classification", "ddp", "fp32", "finetune",
    )  # fmt: skip
    assert hf.micro_batch_size == 8 and hf.seq_len == 128 and hf.trainable_params == 110_000_000
    assert hf.samples_per_s == 100.0 and hf.tokens_per_s == 12800.0 and hf.flops_per_step == 8e14
    assert hf.tflops_per_s == 250.0 and hf.mfu == 0.25 and hf.epoch_seconds == 4000.0 and hf.epochs == 3
    assert hf.estimated_total_seconds == pytest.approx(12000.0)
    assert hf.estimated_gpu_hours == pytest.approx(12000 * 2 / 3600)  # on the system's 2 GPUs
    assert hf.estimated_cost_usd == pytest.approx(12000 * 2 / 3600 * 2.0)  # at $2 per GPU-hour
    group, run = base.group, base.run
    assert group.fine_tuning and group.train_mode == "finetune" and run.compliance == "not applicable"
    assert run.mfu == 0.25 and group.mfu == 0.25 and group.throughput_samples_per_s == 100.0
    assert group.gpu_hours == pytest.approx(1.5 * 2 / 60) and group.cost_usd == pytest.approx(0.1)
    assert group.step_time_ms == 160.0 and group.peak_memory_gb == 18.0
    assert rows["lora"].group.train_mode == "lora" and rows["dp"].hf.parallel == "dp"
    assert not any(w for r in rows.values() for w in r.run.warnings)


def test_runs_that_differ_in_one_compared_setting_are_side_by_side(sweep: dict[str, Path]) -> None:
    pairs = {p["title"]: p for p in comparisons(hf_rows(build(list(sweep.values()), Options(check=False))))}
    assert set(pairs) == {"FP32 vs AMP-BF16", "full vs LoRA", "DP vs DDP", "mbs 8 vs mbs 16"}  # not gpt2
    dp = pairs["DP vs DDP"]
    assert dp["key"] == "train.parallel" and dp["a_name"] == "DP: dp" and dp["b_name"] == "DDP: base"
    figures = {m["name"]: m for m in dp["metrics"]}
    assert figures["samples/s"]["a"] == 40.0 and figures["samples/s"]["ratio"] == pytest.approx(2.5)
    assert figures["estimated cost USD"]["ratio"] == pytest.approx(0.4)
    lora = {m["name"]: m for m in pairs["full vs LoRA"]["metrics"]}
    assert lora["trainable params"]["ratio"] == pytest.approx(1 / 110)
    amp = {m["name"]: m for m in pairs["FP32 vs AMP-BF16"]["metrics"]}
    assert amp["samples/s"]["ratio"] == pytest.approx(2.0) and amp["estimated total seconds"]["b"] == 6000


def test_every_format_shows_the_hf_table_and_the_comparisons(sweep: dict[str, Path]) -> None:
    groups = build(list(sweep.values()), Options(check=False))
    markdown = render_markdown(groups)
    table = markdown.split(f"## {HF_TITLE}")[1].split("\n\n")[1].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    base = dict(zip(header, (c.strip() for c in table[3].strip("|").split("|")), strict=True))
    assert base["run"] == "base" and base["FLOPs/step"] == "800 TFLOP" and base["MFU"] == "25.0%"
    assert base["epoch"] == "66.7 min" and base["est. total"] == "3.33 h" and base["est. USD"] == "13.33"
    section = markdown.split(f"## {HF_COMPARISON_TITLE}")[1]
    assert "## DP: dp vs DDP: base" in section and "| samples/s | 40.00 | 100.00 | 2.500x |" in section

    document = json.loads(render_json(groups))
    assert {p["title"] for p in document["hf"]["comparisons"]} >= {"DP vs DDP", "full vs LoRA"}
    assert document["groups"][0]["runs"][0]["fine_tuning"]["hf"]["estimated_cost_usd"] is not None

    rows = {Path(r["path"]).parent.name: r for r in csv.DictReader(io.StringIO(render_csv(groups)))}
    assert rows["lora"]["hf_mode"] == "lora" and float(rows["dp"]["hf_samples_per_s"]) == 40.0
    assert float(rows["base"]["hf_estimated_cost_usd"]) == pytest.approx(13.3333, rel=1e-4)

    out = io.StringIO()
    print_tables(groups, Console(file=out, width=250), checked=False)
    terminal = out.getvalue()
    assert HF_TITLE in terminal and "A: DP: dp" in terminal and "2.500x" in terminal

    page = render_html(groups, checked=False)
    assert 'id="hf-runs"' in page and page.count('class="comparison hf-comparison"') == 4
    assert "DP vs DDP: DP: dp vs DDP: base" in page


def test_a_report_without_hf_runs_keeps_its_csv_columns(tmp_path: Path) -> None:
    root = hf_run(tmp_path / "flux")
    config = root / "config.yaml"
    config.write_text(config.read_text().replace('"benchmark": "hf"', '"benchmark": "finetune"'))
    groups = build([root], Options(check=False))
    assert not hf_rows(groups) and HF_TITLE not in render_markdown(groups)
    assert "hf_" not in render_csv(groups).splitlines()[0]
    assert "hf" not in json.loads(render_json(groups))


def test_an_interrupted_hf_run_takes_its_last_step_lines_rates(tmp_path: Path) -> None:
    (group,) = build([hf_run(tmp_path / "cut", with_summary=False)], Options(check=False))
    (row,) = hf_rows([group])
    assert row.hf.samples_per_s == 90.0 and row.hf.tokens_per_s == 11520.0 and row.hf.mfu == 0.24
    assert row.hf.model == "bert" and row.hf.flops_per_step == 8e14  # the header's
    assert row.hf.estimated_total_seconds is None and row.hf.estimated_cost_usd is None


def test_hostile_hf_metrics_give_one_warning_each_never_a_crash(tmp_path: Path, cli: CliRunner) -> None:
    header = hf_header(micro_batch_size=-1, seq_len=True, params=1.5, trainable_params=None)
    block = hf_block(mfu=float("nan"), tokens_per_s=-5, parallel=["ddp"], estimated_total_seconds=1e400)
    block["model"] = long = "m" * 300
    extra = ["x" * (MAX_LINE_BYTES + 10), "{not json", "[1]", json.dumps({"step": 1, "samples_per_s": "x"})]
    root = hf_run(tmp_path / "evil", header=header, summary=hf_summary(block), extra=extra)
    (group,) = build([root], Options(check=False))
    (run,) = group.runs
    metrics = root / "results" / "metrics_0.jsonl"
    for expected in (
        f"{metrics}: summary.hf.mfu: got nan, expected a finite number >= 0",
        f"{metrics}: summary.hf.tokens_per_s: got -5, expected a finite number >= 0",
        f"{metrics}: summary.hf.parallel: got ['ddp'], expected one of ddp, dp, fsdp",
        f"{metrics}: summary.hf.estimated_total_seconds: got inf, expected a finite number >= 0",
        f"{metrics}: summary.hf.model: got {reprlib.repr(long)}, expected a text of up to 200 characters",
        f"{metrics}: header.micro_batch_size: got -1, expected a whole number >= 0",
        f"{metrics}: header.seq_len: got True, expected a whole number >= 0",
        f"{metrics}: header.params: got 1.5, expected a whole number >= 0",
        f"{metrics}: 1 line(s) over 256 KiB skipped",  # report.finetune's, once
    ):
        assert expected in run.warnings, run.warnings
    assert len(run.warnings) == 10, run.warnings  # one line per oddity: those, and 2 lines not objects
    (row,) = hf_rows([group])
    assert row.hf.mfu is None and row.hf.tokens_per_s is None and row.hf.parallel == "ddp"  # the header's
    assert row.hf.model == "bert" and row.hf.micro_batch_size is None and row.hf.estimated_cost_usd is None

    (root / "results" / "metrics_0.jsonl").write_text(json.dumps({"summary": {"hf": "fast"}}) + "\n")
    (group,) = build([root], Options(check=False))
    assert f"{metrics}: summary.hf: got 'fast', expected an object" in group.runs[0].warnings
    for fmt in ("table", "csv", "md", "json", "html"):
        result = cli.invoke(app, ["report", str(root), "--no-check", "--format", fmt])
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output


def _sweep(folder: Path, speeds: dict[tuple[str, str], float | None]) -> SweepState:
    """A finished train sweep over train.precision x train.parallel: each point's samples/s (None: oom)."""
    grid = {"train.precision": ["fp32", "amp-bf16"], "train.parallel": ["dp", "ddp"]}
    points = []
    for index, (precision, parallel) in enumerate(product(*grid.values())):
        speed = speeds[(precision, parallel)]
        point = Point(index, {"train.precision": precision, "train.parallel": parallel}, status="ok")
        point.result = {"world_size": 2, "wall_s": 60.0, "samples_per_s": speed, "mfu": 0.2}
        if speed is None:
            point.status, point.result = "oom", {}
        points.append(point)
    state = SweepState(
        name=folder.name, system="local", job="train", grid=grid, overrides=["train.benchmark=hf"],
        synthetic=False, max_parallel=None, here=True, created_at=0.0, points=points, price_per_gpu_hour=2.0,
    )  # fmt: skip
    folder.mkdir()
    state.save(folder)
    return state


def test_a_sweep_over_the_seeds_keys_puts_its_points_side_by_side(tmp_path: Path, cli: CliRunner) -> None:
    speeds = {
        ("fp32", "dp"): 40.0,
        ("fp32", "ddp"): 100.0,
        ("amp-bf16", "dp"): 60.0,
        ("amp-bf16", "ddp"): None,  # out of memory
    }
    _sweep(tmp_path / "seed002", speeds)
    found = sweep_report(tmp_path / "seed002")
    pairs = sweep_comparisons(found)
    assert sorted((p["title"], p["a_name"], p["b_name"]) for p in pairs) == [
        ("DP vs DDP", "DP: point 0", "DDP: point 1"),  # the oom point 3 has no partner
        ("FP32 vs AMP-BF16", "FP32: point 0", "AMP-BF16: point 2"),
    ]
    dp = next(p for p in pairs if p["key"] == "train.parallel")
    assert dp["metrics"][0] == {"name": "samples/s", "a": 40.0, "b": 100.0, "ratio": 2.5}
    markdown = report_sweep.render_markdown([found])
    assert f"### {HF_COMPARISON_TITLE}" in markdown and "| samples/s | 40.00 | 100.00 | 2.500x |" in markdown
    assert len(json.loads(report_sweep.render_json([found]))["sweeps"][0]["comparisons"]) == 2
    assert report_sweep.render_html([found]).count('<table class="comparison">') == 2
    table = cli.invoke(app, ["report", str(tmp_path / "seed002")])
    assert table.exit_code == 0 and "A: DP: point 0" in table.stdout and "2.500x" in table.stdout

    mbs_only = dict(speeds)
    state = _sweep(tmp_path / "flux", mbs_only)
    state.grid = {"train.micro_batch_size": ["4", "8"]}  # a micro-batch sweep alone: its plot, no pairs
    for point, size in zip(state.points, ["4", "8", "4", "8"], strict=True):
        point.values = {"train.micro_batch_size": size}
    state.save(tmp_path / "flux")
    assert "comparisons" not in sweep_report(tmp_path / "flux").to_json()


def test_a_sweep_point_of_an_hf_run_takes_its_metrics_summary(tmp_path: Path) -> None:
    run_dir = hf_run(tmp_path / "run-p000", summary=hf_summary(images_per_s=123.0, step_time_ms=80.0))
    write_run_config(run_dir, "train.precision=amp-bf16")
    point = Point(0, {"train.precision": "amp-bf16"}, status="running", run_dir=str(run_dir))
    assert _train_figures(point, run_dir)
    assert point.status == "ok" and point.result["samples_per_s"] == 123.0  # not the log's 100/s
    assert point.result["step_time_ms_p50"] == 80.0 and point.result["tflops_per_gpu"] == 250.0
    assert point.result["mfu"] == 0.25 and point.result["peak_memory_gb"] == 18.0
    assert point.result["world_size"] == 2 and point.result["samples_per_s_per_gpu"] == 61.5


def test_a_throughput_sweep_of_the_hf_workload_is_refused_before_any_point(tmp_path: Path) -> None:
    request = SweepRequest(
        system="local", grid={"train.precision": ["fp32", "amp-bf16"]}, runs_dir=tmp_path,
        overrides=["train.benchmark=hf", "hf.model=/m", "hf.task=causal-lm", "hf.data=synthetic"],
    )  # fmt: skip
    with pytest.raises(
        FluxClusterError, match=r"--job throughput: a sweep of train\.benchmark hf runs --job train"
    ):
        plan_sweep(request)
    assert not any(tmp_path.iterdir())
