"""Sweeps that run: a grid of throughput runs on --system local, and arrays through the real Slurm."""

import csv
import io
import json
import os
import re
import subprocess
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster import api
from flux_cluster.cli import app
from flux_cluster.launch import slurm
from flux_cluster.launch.sweep import run_sweep, start_sweep
from flux_cluster.launch.sweep_plan import SweepRequest
from flux_cluster.rundir import list_runs
from flux_cluster.sweepdir import SUMMARY_FILE, SWEEP_FILE, SweepState
from flux_cluster.training.throughput import OOM_EXIT_CODE, TEST_OOM_ENV

QUICK = ("--synthetic", "--warmup-steps", "0", "--steps", "1")
"""One timed step (about a second each on CI's cores) is a throughput figure: what is tested is the sweep."""


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / SUMMARY_FILE).open() as handle:
        return list(csv.DictReader(handle))


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


def _sacct(job_ids: list[str], fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", fields],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SLURM_TIME_FORMAT": "standard"},  # ISO 8601, whatever the site sets
    ).stdout
    return [line.split("|") for line in out.splitlines()]


def _dependency(job_id: str) -> str:
    """What a queued job (an array's base id) waits for, as scontrol shows it."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True)
    found = re.search(r"Dependency=(\S+)", out.stdout)
    assert found is not None, out.stdout
    return found.group(1)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_points_sharing_a_node_count_run_as_one_throttled_array_through_slurm(
    cli: CliRunner, workdir: Path
) -> None:
    """Two points on one node each, on the real dataset: one array of two tasks, at most one at a time
    (--max-parallel 1: %1), though the cluster's two nodes could run both at once. Each task runs its own
    point's run directory, config and logs."""
    sweep = api.sweep(
        "local_slurm",
        {"train.micro_batch_size": [1, 2]},
        overrides=["nodes=1"],
        name="array",
        max_parallel=1,
        warmup_steps=1,
        steps=2,
    )
    state = sweep.wait(poll_s=2)
    assert [p.status for p in state.points] == ["ok", "ok"], [p.error for p in state.points]
    assert [p.result["micro_batch_size"] for p in state.points] == [1, 2]  # each task ran its own point
    assert all(p.result["synthetic"] is False and p.launcher == "slurm" for p in state.points)
    first, second = (p.job_ids[0] for p in state.points)
    base = first.split("_")[0]
    assert (first, second) == (f"{base}_0", f"{base}_1")  # one array, a task per point
    (array,) = (sweep.folder / "arrays").iterdir()
    assert "#SBATCH --array=0-1%1\n" in (array / "array.sh").read_text()
    slurm.wait_until_final([first, second])  # a point's record is written before its job has ended
    times = {j: [datetime.fromisoformat(t) for t in ts] for j, *ts in _sacct([base], "JobID,Start,End")}
    assert set(times) == {first, second} and times[second][0] >= times[first][1]  # throttled to one
    for point in state.points:  # each point's own output, through its run directory
        assert point.run_dir is not None
        logs = cli.invoke(app, ["logs", point.run_dir])
        assert logs.exit_code == 0 and f"record: {point.run_dir}/results/throughput.json" in logs.output
    status = cli.invoke(app, ["status", state.points[1].run_dir or ""], env={"COLUMNS": "200"})
    assert status.exit_code == 0 and second in status.output and "COMPLETED" in status.output
    rows = _rows(sweep.folder)
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(float(r["samples_per_s"]) > 0 for r in rows)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_arrays_chain_within_max_parallel_and_respect_the_dependency_through_slurm(workdir: Path) -> None:
    """Nothing runs: every job waits for a held one. Node counts 1 and 2 x a good and a missing partition:
    the good points go out as two arrays, the second after the first (--max-parallel 1 across arrays too),
    both after --dependency (a bare job id: afterany, joined after the sweep's own waits); sbatch refuses
    the other two, which take no place in the chain and are not counted as queued. On --resume the retried
    points wait for the arrays still queued."""
    held = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--partition=debug", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    grid = {"nodes": ["1", "2"], "slurm.partition": ["debug", "nosuch"]}
    console = Console(file=io.StringIO(), width=300)
    request = SweepRequest("local_slurm", grid, synthetic=True, max_parallel=1, name="chain")
    folder = None
    try:
        folder = start_sweep(replace(request, dependency=held), console)
        state = SweepState.load(folder)
        assert [p.status for p in state.points] == ["running", "failed", "running", "failed"]
        assert all("sbatch refused the job" in (state.points[i].error or "") for i in (1, 3))
        assert state.points[1].run_dir is None and state.points[3].run_dir is None  # their folders removed
        assert len(list((folder / "arrays").iterdir())) == 2 and len(list_runs(folder.parent)) == 2
        first, second = (state.points[i].job_ids[0].split("_")[0] for i in (0, 2))
        assert _dependency(first) == f"afterany:{held}(unfulfilled)"
        assert _dependency(second) == f"afterany:{first}_*(unfulfilled),afterany:{held}(unfulfilled)"
        assert "2 points queued as 2 Slurm array(s), at most 1 at once; 2 failed to queue" in (
            console.file.getvalue()  # type: ignore[attr-defined]
        )

        document = json.loads((folder / SWEEP_FILE).read_text())  # as if the partition had been fixed
        for index in (1, 3):
            document["points"][index]["values"]["slurm.partition"] = "debug"
        (folder / SWEEP_FILE).write_text(json.dumps(document))
        run_sweep(folder, console)
        state = SweepState.load(folder)
        assert [p.status for p in state.points] == ["running"] * 4
        third, fourth = (state.points[i].job_ids[0].split("_")[0] for i in (1, 3))
        assert _dependency(third) == f"afterany:{first}_*(unfulfilled),afterany:{second}_*(unfulfilled)"
        assert _dependency(fourth) == f"afterany:{third}_*(unfulfilled)"
    finally:  # the latest first: a cancelled array would let the next one start
        points = SweepState.load(folder).points if folder else []  # start_sweep may have raised
        queued = [p.job_ids[0].split("_")[0] for p in points if p.job_ids]
        subprocess.run(["scancel", *sorted(queued, key=int, reverse=True), held], check=False)
    ids = [p.job_ids[0] for p in state.points]
    assert {final.split()[0] for final in slurm.wait_until_final(ids).values()} == {"CANCELLED"}
    assert [r["status"] for r in _rows(folder)] == ["running"] * 4  # the report reads, the runner writes
    assert [r["status"] for r in api.open_sweep(folder).rows()] == ["failed"] * 4  # as they stand now
