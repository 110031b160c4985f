"""Sweeps and the Python API: a grid of throughput runs on --system local (synthetic batches, an injected
out-of-memory point), resume, the same answers from the CLI and the API, and a sweep through real Slurm."""

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flux_cluster import api
from flux_cluster.cli import app
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch import slurm
from flux_cluster.launch.sweep import SweepRequest, create_sweep, parse_grid, run_sweep
from flux_cluster.launch.sweep_state import SUMMARY_FILE, SweepState
from flux_cluster.training.throughput import OOM_EXIT_CODE, TEST_OOM_ENV

QUICK = ("--synthetic", "--warmup-steps", "1", "--steps", "2")


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / SUMMARY_FILE).open() as handle:
        return list(csv.DictReader(handle))


def test_grid_parsing_refuses_bad_items() -> None:
    assert parse_grid(["train.micro_batch_size=4, 8", "nodes=1"]) == {
        "train.micro_batch_size": ["4", "8"],
        "nodes": ["1"],
    }
    for bad, why in (
        (["train.micro_batch_size"], "expected KEY=VALUE1"),
        (["train.compile=true,"], "expected KEY=VALUE1"),
        (["a b=1"], "expected KEY=VALUE1"),
        (["nodes=1", "nodes=2"], "given twice"),
        (["nodes=1,1"], "listed twice"),
        ([], "no --grid"),
    ):
        with pytest.raises(FluxClusterError, match=why):
            parse_grid(bad)


def test_a_bad_point_is_refused_before_anything_runs(workdir: Path) -> None:
    request = SweepRequest("local", {"train.micro_batch_size": ["8", "3"]}, synthetic=True)
    with pytest.raises(FluxClusterError, match=r"sweep point 1 \(micro_batch_size=3\).*not a multiple"):
        create_sweep(request)
    assert not (workdir / "runs").exists()  # nothing written


def test_here_on_a_container_system_and_taken_names_are_refused_up_front(workdir: Path) -> None:
    here = SweepRequest("dgx_h100x8", {"train.micro_batch_size": ["4"]}, synthetic=True, here=True)
    with pytest.raises(FluxClusterError, match=r"sweep point 0 .*launcher 'local' runs on this machine"):
        create_sweep(here)
    (workdir / "runs" / "flux1").mkdir(parents=True)  # an ordinary job's runs are no sweep folder
    request = SweepRequest("local", {"train.micro_batch_size": ["8"]}, synthetic=True, name="flux1")
    with pytest.raises(FluxClusterError, match=r"runs/flux1: it exists, or choose another --name"):
        create_sweep(request)
    create_sweep(replace(request, name="twice"))
    with pytest.raises(FluxClusterError, match="a sweep of that name exists; --resume it"):
        create_sweep(replace(request, name="twice"))


def test_max_parallel_chains_past_refused_points_and_still_queued_ones(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-parallel 2 on Slurm: point i waits for the job submitted two before it; a point sbatch
    refused takes no place in the chain; on --resume the points still queued count first."""
    from types import SimpleNamespace

    from flux_cluster.launch import submit

    submitted: list[tuple[str, str | None]] = []

    def fake_launch(request: object, console: object) -> SimpleNamespace:
        name, dependency = request.run_name, request.dependency  # type: ignore[attr-defined]
        if name == "p001":
            raise FluxClusterError("sbatch refused the job: test")
        job_id = str(100 + len(submitted))
        submitted.append((name, dependency))
        record = SimpleNamespace(launcher="slurm", job_ids=[f"{job_id}_0"])  # an array: its base id counts
        return SimpleNamespace(run_dir=workdir / name, record=record, exit_code=None)

    monkeypatch.setattr(submit, "launch", fake_launch)
    grid = {"train.micro_batch_size": ["1", "2", "4", "8"]}
    folder, _ = create_sweep(SweepRequest("local_slurm", grid, synthetic=True, max_parallel=2, name="q"))
    state = run_sweep(folder)
    assert submitted == [("p000", None), ("p002", None), ("p003", "afterany:100")]
    assert [p.status for p in state.points] == ["running", "failed", "running", "running"]
    assert state.points[1].error == "sbatch refused the job: test" and state.points[1].run_dir is None

    state.points[1].status = "pending"  # resumed while 101 and 102 are still queued: 1 waits for 101
    state.points[0].status = "ok"
    state.points[2].run_dir = state.points[3].run_dir = None  # not re-read from disk here
    state.save(folder)
    submitted.clear()
    monkeypatch.setattr(submit, "launch", lambda r, c: fake_launch(replace(r, run_name="p009"), c))
    run_sweep(folder)
    assert submitted == [("p009", "afterany:101")]


def test_a_damaged_sweep_file_is_one_line(cli: CliRunner, workdir: Path) -> None:
    folder = workdir / "runs" / "bad"
    folder.mkdir(parents=True)
    document = {
        "name": "bad", "system": "local", "job": "throughput", "grid": {"nodes": ["1"]}, "overrides": [],
        "synthetic": True, "max_parallel": None, "here": False, "created_at": 0.0,
        "points": [{"index": 0, "values": ["nodes=1"]}],
    }  # fmt: skip
    (folder / "sweep.json").write_text(json.dumps(document))
    result = cli.invoke(app, ["sweep", "--resume", "bad"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith(f"error: {folder / 'sweep.json'}: point 0: expected values (strings)")


def test_sweep_cli_refuses_input_in_one_line(cli: CliRunner, workdir: Path) -> None:
    for args, message in (
        (["sweep", "--grid", "train.micro_batch_size"], "expected KEY=VALUE1"),
        (["sweep", "--grid", "nodes=1", "--job", "preflight"], "a sweep runs throughput or train"),
        (["sweep", "--grid", "nodes=1", "--job", "train", "--synthetic"], "only the throughput job"),
        (["sweep", "--resume", "nothing-here"], "no sweep.json"),
        (["sweep", "--grid", "nodes=1", "--resume", "x"], "give no --grid"),
        (["submit", "--job", "train", "--synthetic"], "only the throughput job takes it"),
    ):
        result = cli.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, result.output
        assert "Traceback" not in result.output


def test_the_api_imports_no_torch() -> None:
    code = "import sys, flux_cluster.api; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_local_sweep_records_oom_goes_on_resumes_and_matches_the_api(
    cli: CliRunner, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 points (micro-batch 4, 8 x no, full activation checkpointing) in bf16, as GPU systems train; the
    micro-batch 8 ones out of memory by the test hook."""
    result = cli.invoke(
        app,
        [
            "sweep",
            "--system",
            "local",
            "--grid",
            "train.micro_batch_size=4,8",
            "--grid",
            "train.activation_checkpointing=none,full",
            "--name",
            "mbs",
            "--set",
            "train.param_dtype=bfloat16",  # the GPU default, as the checkpointing points' wrapping
            "--set",
            "price_per_gpu_hour=2.5",
            *QUICK,
        ],
        env={TEST_OOM_ENV: "8", "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    folder = workdir / "runs" / "mbs"
    rows = _rows(folder)
    assert [(r["train.micro_batch_size"], r["train.activation_checkpointing"]) for r in rows] == [
        ("4", "none"),
        ("4", "full"),
        ("8", "none"),
        ("8", "full"),
    ]
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "oom"]
    for row in rows[:2]:
        assert float(row["samples_per_s"]) > 0 and float(row["step_time_ms_p50"]) > 0
        assert float(row["samples_per_s_per_gpu"]) == pytest.approx(float(row["samples_per_s"]) / 2, rel=1e-3)
        assert float(row["tflops_per_gpu"]) > 0 and float(row["peak_memory_gb"]) > 0
        assert int(row["gpus"]) == 2 and float(row["cost_usd"]) > 0
        assert float(row["usd_per_million_samples"]) == pytest.approx(
            2.5 * 2 / 3600 / float(row["samples_per_s"]) * 1e6, rel=1e-3
        )
    for row in rows[2:]:  # oom: recorded with its memory figures, no throughput
        assert row["samples_per_s"] == "" and float(row["peak_memory_gb"]) > 0
        assert "out of memory" in row["error"] and TEST_OOM_ENV in row["error"]
    run_dirs = [Path(r["run_dir"]) for r in rows]
    assert all(d.parent == folder and d.name.endswith(f"-p{i:03d}") for i, d in enumerate(run_dirs))
    for run_dir, checkpointing in zip(run_dirs[:2], ("none", "full"), strict=True):  # what really ran
        ran = json.loads((run_dir / "results" / "throughput.json").read_text())
        assert ran["param_dtype"] == "bfloat16" and ran["activation_checkpointing"] == checkpointing
    oom_record = json.loads((run_dirs[2] / "results" / "throughput.json").read_text())
    assert oom_record["status"] == "oom" and oom_record["micro_batch_size"] == 8
    state = SweepState.load(folder)
    assert state.points[2].status == "oom" and state.points[2].launcher == "local"
    assert json.loads((run_dirs[2] / "jobs.json").read_text())["exit_code"] == OOM_EXIT_CODE

    # the API reads the same sweep and gives the same answers as the CLI's report
    sweep = api.open_sweep("mbs")
    best = sweep.best()
    assert (
        best is not None
        and str(best["point"]) == max(rows[:2], key=lambda r: float(r["samples_per_s"]))["point"]
    )
    report = cli.invoke(app, ["report", str(folder), "--format", "json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout) == api.report([folder]).to_json()

    # a point that did not finish runs again on --resume (through the API); finished ones are kept
    state.points[1].status = "failed"
    state.save(folder)
    api.open_sweep(folder).resume()
    again = _rows(folder)
    assert [r["status"] for r in again] == ["ok", "ok", "oom", "oom"]
    assert [r["run_dir"] for r in again] == [
        rows[0]["run_dir"],
        again[1]["run_dir"],
        *[r["run_dir"] for r in rows[2:]],
    ]
    assert again[1]["run_dir"] != rows[1]["run_dir"]  # point 1 ran again
    nothing = cli.invoke(app, ["sweep", "--resume", "mbs"])
    assert nothing.exit_code == 0 and "every point has finished" in nothing.output


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sweep_over_node_counts_through_slurm(workdir: Path) -> None:
    """Two points, nodes 1 and 2, one after the other (--max-parallel 1), on the real dataset."""
    sweep = api.sweep(
        "local_slurm",
        {"nodes": [1, 2]},
        name="scaling",
        max_parallel=1,
        warmup_steps=1,
        steps=2,
    )
    state = sweep.wait(poll_s=2)
    assert [p.status for p in state.points] == ["ok", "ok"], [p.error for p in state.points]
    assert [p.result["world_size"] for p in state.points] == [1, 2]
    assert all(p.result["synthetic"] is False and p.launcher == "slurm" for p in state.points)
    first, second = (p.job_ids[0] for p in state.points)
    slurm.wait_until_final([first, second])  # a point's record is written before its job has ended
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", f"{first},{second}", "-o", "JobID,Start,End"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SLURM_TIME_FORMAT": "standard"},  # ISO 8601, whatever the site sets
    ).stdout
    times = {
        j: [datetime.fromisoformat(t) for t in ts] for j, *ts in (x.split("|") for x in out.splitlines())
    }
    assert times[second][0] >= times[first][1]  # the second started after the first ended
    rows = _rows(sweep.folder)
    assert [r["nodes"] for r in rows] == ["1", "2"] and all(float(r["samples_per_s"]) > 0 for r in rows)


def _finished_sweep(folder: Path, grid: dict[str, list[str]], speeds: dict[int, float | str]) -> SweepState:
    """A sweep folder as a finished sweep leaves it: speeds maps a point to samples/s, or to its status."""
    from itertools import product

    from flux_cluster.launch.sweep_state import Point

    points = []
    for i, combo in enumerate(product(*grid.values())):
        values = dict(zip(grid, combo, strict=True))
        speed = speeds[i]
        point = Point(index=i, values=values, status="ok" if isinstance(speed, float) else speed)
        nodes = int(values.get("nodes", "1"))
        point.result = {"world_size": 8 * nodes, "nodes": nodes, "wall_s": 60.0, "peak_memory_gb": 40.0}
        if isinstance(speed, float):
            point.result |= {"samples_per_s": speed, "samples_per_s_per_gpu": speed / (8 * nodes)}
        else:
            point.error = f"{speed} at point {i}"
        points.append(point)
    state = SweepState(
        name=folder.name,
        system="dgx_h100x8",
        job="throughput",
        grid=grid,
        overrides=[],
        synthetic=True,
        max_parallel=None,
        here=False,
        created_at=0.0,
        points=points,
        price_per_gpu_hour=3.0,
    )
    folder.mkdir(parents=True)
    state.save(folder)
    return state


def test_the_sweep_report_sorts_finds_the_best_per_node_count_and_plots(
    cli: CliRunner, tmp_path: Path
) -> None:
    folder = tmp_path / "scaling"
    grid = {"train.micro_batch_size": ["4", "8", "16"], "nodes": ["1", "2"]}
    # point i: mbs 4/8/16 x nodes 1/2 in product order; mbs 16 on 1 node runs out of memory
    speeds: dict[int, float | str] = {0: 100.0, 1: 180.0, 2: 150.0, 3: 290.0, 4: "oom", 5: "failed"}
    _finished_sweep(folder, grid, speeds)
    report = api.report([folder]).sweeps[0]
    assert [r["point"] for r in report.rows] == [3, 1, 2, 0, 4, 5]  # ok by samples/s, then the others
    assert [(r["nodes"], r["point"]) for r in report.best] == [(1, 2), (2, 3)]  # never the oom/failed ones
    document = api.report([folder]).to_json()
    assert document["schema_version"] == 1 and document["sweeps"][0]["grid"] == grid
    assert document["sweeps"][0]["best"][1]["usd_per_million_samples"] == pytest.approx(
        3 * 16 / 3600 / 290 * 1e6
    )

    for fmt in ("json", "csv", "md", "html", "table"):
        result = cli.invoke(app, ["report", str(folder), "--format", fmt], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (fmt, result.output)
        if fmt == "json":
            assert json.loads(result.stdout) == document
        if fmt == "csv":
            rows = list(csv.DictReader(result.stdout.splitlines()))
            assert [r["point"] for r in rows] == ["3", "1", "2", "0", "4", "5"] and rows[4]["status"] == "oom"
        if fmt == "html":
            assert result.stdout.count("<svg") == 2  # throughput vs micro-batch, and scaling
            assert (
                "Throughput per GPU vs micro-batch size" in result.stdout
                and "oom at point 4" in result.stdout
            )
        if fmt in ("md", "table"):
            assert "best point per node count" in result.stdout.lower()
    written = tmp_path / "out" / "sweep.html"
    written.parent.mkdir()
    assert cli.invoke(app, ["report", str(folder), "-f", "html", "-o", str(written)]).exit_code == 0
    assert written.read_text().startswith("<!DOCTYPE html>")

    mixed = cli.invoke(app, ["report", str(folder), str(tmp_path)])
    assert mixed.exit_code == 2 and "report sweep folders on their own" in mixed.output


def test_a_sweep_without_varied_micro_batch_or_nodes_has_no_plots(cli: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "compile"
    _finished_sweep(folder, {"train.compile": ["false", "true"]}, {0: 10.0, 1: 12.0})
    result = cli.invoke(app, ["report", str(folder), "--format", "html"])
    assert result.exit_code == 0 and "<svg" not in result.stdout and "compile" in result.stdout
    assert api.open_sweep(folder).best()["train.compile"] == "true"
