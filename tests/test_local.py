"""The embedded default: --system local runs the job on this machine with 2 processes (gloo), no Slurm."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.rundir import RunRecord, list_runs, read_run_config


def test_local_preflight_runs_two_ranks(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(app, ["preflight", "--system", "local", "--seed", "11"])
    assert result.exit_code == 0, result.output
    assert re.search(r"all_reduce bus bandwidth \d+\.\d+ GB/s", result.output)
    (run_dir,) = list_runs(workdir / "runs")
    assert run_dir.parent.name == "preflight" and run_dir.name.endswith("-local")
    system, job = read_run_config(run_dir / "config.yaml")
    assert system.name == "local" and job["seed_base"] == 11 and system.mlperf.seed_base == 11
    report = json.loads((run_dir / "results" / "preflight_0.json").read_text())
    assert report["passed"] and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["backend"] == "gloo" for r in report["ranks"])
    record = RunRecord.load(run_dir)
    assert record is not None and record.exit_code == 0
    status = cli.invoke(app, ["status"])
    assert status.exit_code == 0 and "COMPLETED" in status.output
    listing = cli.invoke(app, ["runs", "list"], env={"COLUMNS": "200"})
    assert "preflight" in listing.output and "COMPLETED" in listing.output


def test_local_preflight_fails_on_a_missing_data_root(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(
        app,
        [
            "preflight",
            "--system",
            "local",
            "--set",
            f"paths.data_root={workdir / 'absent'}",
            "--runs-dir",
            str(workdir / "r"),
        ],
    )
    assert result.exit_code != 0
    assert "FAILED" in result.output and "missing or not a directory" in result.output


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_cancel_stops_every_process_of_a_local_run(cli: CliRunner, workdir: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "flux_cluster",
        "preflight",
        "--system",
        "local",
        "--soak-seconds",
        "120",
    ]
    runner = subprocess.Popen(command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        runs = list_runs(workdir / "runs")
        if runs and len(_processes_mentioning(str(runs[0] / "config.yaml"))) >= 2:  # both ranks are up
            break
        assert time.monotonic() < deadline, "the local run did not start"
        time.sleep(0.2)
    result = cli.invoke(app, ["cancel"])
    assert result.exit_code == 0 and "stopped local run" in result.output
    assert runner.wait(timeout=30) != 0
    deadline = time.monotonic() + 20
    while _processes_mentioning(str(runs[0])):
        assert time.monotonic() < deadline, "ranks survived the cancel"
        time.sleep(0.2)
    status = cli.invoke(app, ["status"])
    assert "FAILED" in status.output
