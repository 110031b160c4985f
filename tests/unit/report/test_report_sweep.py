"""flux-cluster report SWEEP_FOLDER: sweep folders written as the sweep command writes them (SweepState.save),
reported through the CLI in every format and through the functions: order by throughput, the best point
per node count (never an oom or failed one), the plots and when they are left out, hostile text."""

import csv
import io
import json
import warnings
from itertools import product
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_status import sweep_report, view
from flux_cluster.report import sweep
from flux_cluster.report.sweep import (
    MICRO_BATCH_TITLE,
    SCALING_TITLE,
    build_report,
    micro_batch_plot,
    scaling_plot,
)
from flux_cluster.sweepdir import SUMMARY_FILE, SWEEP_FILE, Point, SweepState

MBS = "train.micro_batch_size"
COMPILE = "train.compile"
OOM_ERROR = "CUDA out of memory | <script>alert(1)</script>"
FAILED_ERROR = "[bold]NCCL timeout[/bold] $x$"

Outcome = float | tuple[str, float | None]
"""A point's samples/s (status ok), or (status, the samples/s its record holds anyway, or None)."""


def make_sweep(folder: Path, grid: dict[str, list[str]], outcomes: dict[int, Outcome]) -> SweepState:
    """A finished sweep in folder: point i (the grid's product order) has outcomes[i], 8 GPUs a node."""
    points = []
    for index, combo in enumerate(product(*grid.values())):
        values = dict(zip(grid, combo, strict=True))
        outcome = outcomes[index]
        status, speed = ("ok", outcome) if isinstance(outcome, float) else outcome
        point = Point(index=index, values=values, status=status, run_dir=str(folder / f"run-p{index:03d}"))
        gpus = 8 * int(values.get("nodes", "1"))
        point.result = {"world_size": gpus, "wall_s": 90.0, "peak_memory_gb": 50.0 + index}
        if speed is not None:
            point.result |= {"samples_per_s": speed, "samples_per_s_per_gpu": speed / gpus, "mfu": 0.4}
        if status == "oom":
            point.error = OOM_ERROR
        elif status == "failed":
            point.error = FAILED_ERROR
        points.append(point)
    state = SweepState(
        name=folder.name,
        system="dgx_h100x8",
        job="throughput",
        grid=grid,
        overrides=["train.warmup_steps=1"],
        synthetic=True,
        max_parallel=None,
        here=False,
        created_at=0.0,
        points=points,
        price_per_gpu_hour=2.0,
        warmup_steps=2,
        steps=10,
    )
    folder.mkdir(parents=True)
    state.save(folder)
    return state


MBS_GRID = {MBS: ["1", "2", "4", "8"], COMPILE: ["false", "true"]}
# product order: (mbs 1, compile false), (1, true), (2, false), (2, true), ..., (8, false), (8, true)
MBS_OUTCOMES: dict[int, Outcome] = {
    0: 40.0,
    1: 50.0,
    2: 70.0,
    3: 90.0,
    4: 110.0,
    5: ("failed", 400.0),  # figures from before it failed: still never the best
    6: ("oom", None),
    7: 150.0,
}
MBS_ORDER = [7, 4, 3, 2, 1, 0, 6, 5]  # ok by samples/s, then oom before failed


@pytest.fixture
def mbs_sweep(tmp_path: Path) -> Path:
    make_sweep(tmp_path / "mbs", MBS_GRID, MBS_OUTCOMES)
    return tmp_path / "mbs"


@pytest.fixture
def nodes_sweep(tmp_path: Path) -> Path:
    # product order: (1 node, mbs 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8)
    outcomes: dict[int, Outcome] = {
        0: 100.0,
        1: 120.0,
        2: 210.0,
        3: ("failed", 500.0),
        4: 380.0,
        5: ("oom", 999.0),
    }
    make_sweep(tmp_path / "nodes", {"nodes": ["1", "2", "4"], MBS: ["4", "8"]}, outcomes)
    return tmp_path / "nodes"


def report(cli: CliRunner, *args: str) -> str:
    result = cli.invoke(app, ["report", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_points_sorted_by_throughput_and_the_best_is_never_oom_or_failed(mbs_sweep: Path) -> None:
    found = sweep_report(mbs_sweep)
    assert [r["point"] for r in found.rows] == MBS_ORDER
    assert [r["status"] for r in found.rows[-2:]] == ["oom", "failed"]
    assert [(r["nodes"], r["point"]) for r in found.best] == [(1, 7)]  # point 5 "ran" 400/s, but failed
    assert found.varied == [MBS, COMPILE] and found.grid == MBS_GRID
    assert found.rows[0]["usd_per_million_samples"] == pytest.approx(2.0 * 8 / 3600 / 150 * 1e6)


def test_best_per_node_count_from_the_grid_or_the_runs_record(nodes_sweep: Path, tmp_path: Path) -> None:
    found = sweep_report(nodes_sweep)
    assert [r["point"] for r in found.rows] == [4, 2, 1, 0, 5, 3]
    assert [(r["nodes"], r["point"]) for r in found.best] == [(1, 1), (2, 2), (4, 4)]
    assert all(isinstance(r["nodes"], int) for r in found.rows)

    # nodes not in the grid: the run's record says how many, else 1
    state = make_sweep(tmp_path / "record", {COMPILE: ["false", "true"]}, {0: 10.0, 1: 30.0})
    state.points[0].result["nodes"] = 2
    assert [(r["nodes"], r["point"]) for r in build_report(tmp_path, state).best] == [(1, 1), (2, 0)]
    state.points[0].result["nodes"] = "two"
    with pytest.raises(FluxClusterError, match=rf"{SWEEP_FILE}: point 0: nodes 'two', expected a whole"):
        build_report(tmp_path, state)


def test_json_has_the_documented_schema(cli: CliRunner, mbs_sweep: Path, nodes_sweep: Path) -> None:
    document = json.loads(report(cli, str(mbs_sweep), "--format", "json"))
    assert document["schema_version"] == 1 and len(document["sweeps"]) == 1
    (one,) = document["sweeps"]
    assert set(one) == {"folder", "name", "system", "job", "grid", "varied", "points", "best"}
    assert (one["name"], one["system"], one["job"], one["grid"]) == (
        "mbs",
        "dgx_h100x8",
        "throughput",
        MBS_GRID,
    )
    assert [p["point"] for p in one["points"]] == MBS_ORDER and one["best"] == [one["points"][0]]
    point = one["points"][0]
    assert point[MBS] == "8" and point[COMPILE] == "true" and point["nodes"] == 1 and point["gpus"] == 8
    assert point["samples_per_s"] == 150.0 and point["step_time_ms_p50"] is None
    assert point["gpu_hours"] == pytest.approx(90 * 8 / 3600)
    assert one["points"][-2]["error"] == OOM_ERROR

    both = json.loads(report(cli, str(nodes_sweep), str(mbs_sweep), "-f", "json"))
    assert [s["name"] for s in both["sweeps"]] == ["nodes", "mbs"]  # in the order given
    assert [b["nodes"] for b in both["sweeps"][0]["best"]] == [1, 2, 4]


def test_csv_is_runs_summary_sorted(cli: CliRunner, mbs_sweep: Path, nodes_sweep: Path) -> None:
    text = report(cli, str(mbs_sweep), "--format", "csv")
    summary = (mbs_sweep / SUMMARY_FILE).read_text()
    assert text.splitlines()[0] == summary.splitlines()[0]  # the same columns, nodes not added
    assert sorted(text.splitlines()[1:]) == sorted(summary.splitlines()[1:])  # the same cells
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["point"]) for r in rows] == MBS_ORDER
    assert rows[-2]["samples_per_s"] == "" and rows[-2]["error"] == OOM_ERROR

    both = list(csv.DictReader(io.StringIO(report(cli, str(mbs_sweep), str(nodes_sweep), "-f", "csv"))))
    assert [r["sweep"] for r in both] == ["mbs"] * 8 + ["nodes"] * 6
    assert [r["nodes"] for r in both[8:]] == ["4", "2", "1", "1", "4", "2"] and both[0]["nodes"] == ""


def test_table_and_markdown(cli: CliRunner, mbs_sweep: Path, tmp_path: Path) -> None:
    table = report(cli, str(mbs_sweep))
    assert "Best point per node count" in table and "points, fastest first" in table
    assert table.index("150.00") < table.index("110.00") < table.index("40.00")  # fastest first
    assert f"point 5: failed: {FAILED_ERROR}" in table  # markup shown as typed, not applied

    written = tmp_path / "out" / "sweep.txt"
    written.parent.mkdir()
    result = cli.invoke(app, ["report", str(mbs_sweep), "-o", str(written)])
    assert (
        result.exit_code == 0 and result.stdout == "" and "Best point per node count" in written.read_text()
    )

    markdown = report(cli, str(mbs_sweep), "--format", "md")
    assert (
        "## Sweep mbs on dgx_h100x8 (throughput)" in markdown and "### Best point per node count" in markdown
    )
    lines = markdown.splitlines()
    first = lines.index("### Points, fastest first") + 4  # heading, blank, header, rule
    assert [line.split(" | ")[0] for line in lines[first : first + 8]] == [f"| {i}" for i in MBS_ORDER]
    assert "<script>" not in markdown and "&lt;script&gt;" in markdown and "&#124; &lt;" in markdown

    folder = cli.invoke(app, ["report", str(mbs_sweep), "-f", "md", "-o", str(tmp_path)])
    assert folder.exit_code == 2 and "is a directory" in folder.output


def test_html_has_the_tables_and_the_micro_batch_plot(
    cli: CliRunner, mbs_sweep: Path, tmp_path: Path
) -> None:
    page = tmp_path / "sweep.html"
    result = cli.invoke(app, ["report", str(mbs_sweep), "-f", "html", "--output", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 1  # one node count: no scaling plot
    assert f'aria-label="{MICRO_BATCH_TITLE}"' in html and SCALING_TITLE not in html
    svg = html[html.index("<svg") :]
    assert "compile=false" in svg and "compile=true" in svg  # one line per variant
    assert "not shown: micro-batch 8, compile=false: oom" in svg
    assert "not shown: micro-batch 4, compile=true: failed" in svg
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert html.count("<tr") == 1 + 8 + 1 + 1  # points table: header + 8; best table: header + 1


def test_html_scaling_plot_against_the_ideal(cli: CliRunner, nodes_sweep: Path) -> None:
    html = report(cli, str(nodes_sweep), "--format", "html")
    assert html.count("<svg") == 2 and f'aria-label="{SCALING_TITLE}"' in html
    scaling = html[html.index(f'aria-label="{SCALING_TITLE}"') :]
    assert "ideal: linear from 1" in scaling
    for efficiency in ("100%", f"{210 / 240:.0%}", f"{380 / 480:.0%}"):  # best of 2 and 4 nodes vs 120 x n
        assert efficiency in scaling
    mbs = html[html.index(f'aria-label="{MICRO_BATCH_TITLE}"') : html.index(f'aria-label="{SCALING_TITLE}"')]
    assert "1 node" in mbs and "4 nodes" in mbs  # per-GPU figures differ by node count: a line each


def test_plots_left_out_when_they_cannot_be_drawn(cli: CliRunner, tmp_path: Path) -> None:
    compile_only = tmp_path / "compile"
    make_sweep(compile_only, {COMPILE: ["false", "true"]}, {0: 10.0, 1: 12.0})
    html = report(cli, str(compile_only), "--format", "html")
    assert "<svg" not in html and "<table>" in html

    one_size = build_report(
        tmp_path, make_sweep(tmp_path / "one", {MBS: ["4"], COMPILE: ["false", "true"]}, {0: 1.0, 1: 2.0})
    )
    assert one_size.varied == [COMPILE] and micro_batch_plot(one_size) is None
    words = build_report(tmp_path, make_sweep(tmp_path / "words", {MBS: ["4", "big"]}, {0: 1.0, 1: 2.0}))
    assert micro_batch_plot(words) is None and scaling_plot(words) is None

    # two node counts, but only one has an ok point: nothing to scale against
    lone = build_report(
        tmp_path, make_sweep(tmp_path / "lone", {"nodes": ["1", "2"]}, {0: 5.0, 1: ("oom", None)})
    )
    assert len(lone.best) == 1 and scaling_plot(lone) is None


def test_sweep_folders_are_reported_on_their_own(cli: CliRunner, mbs_sweep: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    mixed = cli.invoke(app, ["report", str(mbs_sweep), str(logs)])
    assert mixed.exit_code == 2
    assert f"report sweep folders on their own: {logs}: no {SWEEP_FILE}" in mixed.output
    assert len(mixed.output.strip().splitlines()) == 1
    (mbs_sweep / SWEEP_FILE).write_text("{not json")
    broken = cli.invoke(app, ["report", str(mbs_sweep)])
    assert (
        broken.exit_code == 2 and f"{mbs_sweep / SWEEP_FILE}: not a flux-cluster sweep file" in broken.output
    )


def test_the_report_reads_a_running_point_as_it_stands_and_writes_nothing(
    cli: CliRunner, mbs_sweep: Path
) -> None:
    """A point still running in sweep.json whose run has since written its record: the report shows the
    record, and neither sweep.json nor runs_summary.csv changes (their writer is the sweep's runner)."""
    state = SweepState.load(mbs_sweep)
    point = state.points[6]
    point.status, point.result, point.error = "running", {}, None
    run_dir = Path(point.run_dir or "")
    (run_dir / "results").mkdir(parents=True)
    record = {"status": "ok", "samples_per_s": 500.0, "samples_per_s_per_gpu": 62.5, "world_size": 8}
    (run_dir / "results" / "throughput.json").write_text(json.dumps(record))
    state.save(mbs_sweep)
    files = {name: (mbs_sweep / name).read_bytes() for name in (SWEEP_FILE, SUMMARY_FILE)}

    assert view(mbs_sweep).points[6].status == "ok"
    found = sweep_report(mbs_sweep)
    assert found.rows[0]["point"] == 6 and found.rows[0]["samples_per_s"] == 500.0  # now the fastest
    for fmt in ("json", "csv", "table"):
        report(cli, str(mbs_sweep), "--format", fmt)
    assert {name: (mbs_sweep / name).read_bytes() for name in files} == files
    assert SweepState.load(mbs_sweep).points[6].status == "running"


def test_several_sweeps_render_a_section_each(mbs_sweep: Path, nodes_sweep: Path) -> None:
    reports = [sweep_report(mbs_sweep), sweep_report(nodes_sweep)]
    markdown = sweep.render_markdown(reports)
    assert markdown.count("### Best point per node count") == 2
    html = sweep.render_html(reports)
    assert html.count('<section class="sweep">') == 2 and html.count("<svg") == 3


def test_an_all_failed_sweep_reports_without_a_library_warning(cli: CliRunner, tmp_path: Path) -> None:
    grid = {MBS: ["4", "8", "16", "32"], COMPILE: ["false", "true"], "nodes": ["1", "2", "4"]}
    make_sweep(tmp_path / "failed", grid, {i: ("failed", None) for i in range(24)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page = report(cli, str(tmp_path / "failed"), "--format", "html")
    assert not caught, [str(w.message) for w in caught]  # matplotlib's constrained_layout, say
    assert "not shown: 16 more (see the tables)" in page


def test_csv_carries_no_control_characters(cli: CliRunner, tmp_path: Path) -> None:
    state = make_sweep(tmp_path / "esc", {MBS: ["1", "2"]}, {0: 10.0, 1: ("failed", None)})
    state.points[1].error = "NCCL \x1b[2J\x07 timeout \u202e=cmd"
    state.save(tmp_path / "esc")
    make_sweep(tmp_path / "other", {MBS: ["4"]}, {0: 5.0})
    written = (tmp_path / "esc" / SUMMARY_FILE).read_text()  # the sweep's own runs_summary.csv
    for others in ([], [str(tmp_path / "other")]):  # one sweep's CSV, and several sweeps'
        text = report(cli, str(tmp_path / "esc"), *others, "--format", "csv")
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, repr(text)
        assert "NCCL \\x1b[2J\\x07 timeout \\u202e=cmd" in text
    assert "\x1b" not in written and "NCCL \\x1b[2J\\x07 timeout \\u202e=cmd" in written


def test_every_csv_keeps_negative_numbers_and_neutralises_text(cli: CliRunner, tmp_path: Path) -> None:
    """runs_summary.csv and the report's CSV of it (one sweep and several): a negative figure or grid value
    stays a number for a spreadsheet, text that starts a formula gets its quote, once."""
    state = make_sweep(tmp_path / "neg", {"train.seed": ["-2", "=1+1"]}, {0: 10.0, 1: 20.0})
    state.points[0].result["data_wait_ms"] = -0.25  # a clock step back: a number all the same
    state.points[1].error = "@SUM(1)"
    state.save(tmp_path / "neg")
    make_sweep(tmp_path / "other", {MBS: ["4"]}, {0: 5.0})
    texts = [(tmp_path / "neg" / SUMMARY_FILE).read_text(), report(cli, str(tmp_path / "neg"), "-f", "csv")]
    texts.append(report(cli, str(tmp_path / "neg"), str(tmp_path / "other"), "-f", "csv"))
    for text in texts:
        rows = {r["point"]: r for r in csv.DictReader(io.StringIO(text)) if r.get("sweep", "neg") == "neg"}
        assert (rows["0"]["train.seed"], rows["0"]["data_wait_ms"]) == ("-2", "-0.25"), text
        assert (rows["1"]["train.seed"], rows["1"]["error"]) == ("'=1+1", "'@SUM(1)"), text


def test_every_csv_is_written_through_the_one_writer() -> None:
    """safe_text.csv_text neutralises every cell: no module writes CSV any other way."""
    import ast

    root = Path(__file__).resolve().parents[3]
    writers = []
    for path in sorted([*(root / "flux_cluster").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            from_csv = isinstance(node, ast.ImportFrom) and node.module == "csv"
            called = isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "csv"
            if (
                from_csv or (called and node.attr in ("writer", "DictWriter"))
            ) and path.name != "safe_text.py":
                writers.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not writers, "write CSV with flux_cluster.safe_text.csv_text:\n" + "\n".join(writers)
