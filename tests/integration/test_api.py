"""flux_cluster.api called directly, on --system local: a system's config, a submitted throughput run followed
through Run, and one small sweep run through the API and through the CLI with the same answers (an
out-of-memory point by the test hook, so both outcomes are compared). The sweeps run once per module."""

import csv
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flux_cluster import api
from flux_cluster.cli import app
from flux_cluster.launch.sweep import LOCK_FILE
from flux_cluster.rundir import exclusive_lock
from flux_cluster.sweepdir import SUMMARY_FILE, SWEEP_FILE
from flux_cluster.training.throughput import TEST_OOM_ENV

GRID = {"train.micro_batch_size": [4, 8]}
"""Micro-batch 8 runs out of memory (TEST_OOM_ENV): a point ok, a point oom."""
STEPS = {"warmup_steps": 1, "steps": 2}
SWEEP_STEPS = {"warmup_steps": 0, "steps": 1}
"""A sweep point's one timed step is a throughput figure: what is compared is the sweep's rows."""
COMPARED = ("point", "train.micro_batch_size", "status", "gpus", "error")
"""What two runs of the same sweep must agree on: not timings, memory, or run directories (nor which rank
reported an error first)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api") / "runs"


@pytest.fixture(scope="module")
def api_sweep(runs: Path) -> api.Sweep:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TEST_OOM_ENV, "8")
        return api.sweep("local", GRID, synthetic=True, name="by-api", runs_dir=runs, **SWEEP_STEPS)


@pytest.fixture(scope="module")
def cli_sweep(runs: Path) -> Path:
    grid = ",".join(str(v) for v in GRID["train.micro_batch_size"])
    args = ["sweep", "--system", "local", "--grid", f"train.micro_batch_size={grid}", "--synthetic"]
    args += ["--name", "by-cli", "--runs-dir", str(runs), "--warmup-steps", "0", "--steps", "1"]
    result = CliRunner().invoke(app, args, env={TEST_OOM_ENV: "8", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output  # an oom point is an answer: not a failure
    return runs / "by-cli"


def compared(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        tuple(re.sub(r"rank \d+", "rank N", "" if row[key] is None else str(row[key])) for key in COMPARED)
        for row in rows
    ]


def test_load_system_applies_overrides_and_refuses_a_bad_one() -> None:
    config = api.load_system("local", ["nodes=1", "train.micro_batch_size=4"])
    assert (config.name, config.launcher, config.train.micro_batch_size) == ("local", "local", 4)
    with pytest.raises(api.FluxClusterError, match=r"train\.micro_batch_size"):
        api.load_system("local", ["train.micro_batch_size=lots"])


def test_submit_runs_a_throughput_job_followed_through_run(workdir: Path) -> None:
    run = api.submit("local", "throughput", synthetic=True, experiment="api", **STEPS)
    assert run.exit_code == 0 and run.run_dir.parent == workdir / "runs" / "api"
    assert run.status() == "COMPLETED" and run.done()
    assert run.wait(poll_s=0.1, timeout_s=5) == "COMPLETED"  # already ended: at once
    assert run.states() == {"local": "COMPLETED"}
    assert "[throughput]" in run.logs() and "samples/s" in run.logs()
    record = run.throughput()
    assert record is not None and record["status"] == "ok" and record["synthetic"] is True
    assert (record["warmup_steps"], record["steps"], record["world_size"]) == (1, 2, 2)
    assert run.script().startswith("#!/bin/bash") and str(run.run_dir) in run.script()

    again = api.open_run(f"api/{run.run_dir.name}")  # any process can follow it again by name
    assert again.run_dir == run.run_dir and again.status() == "COMPLETED"
    assert again.throughput() == record and api.open_run().run_dir == run.run_dir  # the latest
    with pytest.raises(api.FluxClusterError, match="no such run"):
        api.open_run("not-a-run")


def test_the_api_and_the_cli_sweep_give_the_same_rows(api_sweep: api.Sweep, cli_sweep: Path) -> None:
    by_api, by_cli = api_sweep.rows(), api.open_sweep(cli_sweep).rows()
    assert compared(by_api) == compared(by_cli)
    assert [row["status"] for row in by_api] == ["ok", "oom"]
    assert "out of memory" in by_api[1]["error"]
    with (cli_sweep / SUMMARY_FILE).open() as handle:  # the file the CLI wrote, as the API reads it
        assert compared(list(csv.DictReader(handle))) == compared(by_cli)
    for rows in (by_api, by_cli):
        assert rows[0]["samples_per_s"] > 0 and rows[1]["samples_per_s"] is None
    best = api_sweep.best()
    assert best is not None and best["point"] == 0 and best["train.micro_batch_size"] == "4"
    report = api_sweep.report()
    assert [row["point"] for row in report.best] == [0] and report.rows[0]["nodes"] == 1


def test_a_sweep_is_read_without_writing_and_run_by_one_process(api_sweep: api.Sweep, runs: Path) -> None:
    folder = api_sweep.folder
    before = {name: (folder / name).read_bytes() for name in (SWEEP_FILE, SUMMARY_FILE)}
    stamps = {name: os.stat(folder / name).st_mtime_ns for name in before}
    api_sweep.rows(), api_sweep.best(), api_sweep.state(), api_sweep.report()
    document = api.report([folder]).to_json()
    assert document["sweeps"][0]["name"] == "by-api"
    assert {name: (folder / name).read_bytes() for name in before} == before
    assert {name: os.stat(folder / name).st_mtime_ns for name in before} == stamps

    assert api.open_sweep("by-api", runs_dir=runs).folder == folder  # by name under the runs directory
    lock = exclusive_lock(folder / LOCK_FILE)  # as a running sweep holds it
    try:
        with pytest.raises(api.FluxClusterError, match="another process is running it"):
            api.open_sweep(folder).resume()
    finally:
        assert lock is not None
        lock.close()
    assert json.loads((folder / SWEEP_FILE).read_text())["points"][1]["status"] == "oom"


def test_evaluate_and_requeue_refuse_bad_input_before_anything_runs(workdir: Path) -> None:
    """api.evaluate checks what the CLI's option parser checks (before torch loads); api.requeue refuses a
    run that is no Slurm job, in one line naming it."""
    refused = {
        "--resolution 17: expected a multiple of 16": {"resolution": 17},
        "--runs 0: expected at least 1": {"runs": 0},
        "--set, --dry-run: only with --submit": {"overrides": ["nodes=2"], "dry_run": True},
        "--submit: name the Slurm system with --system": {"submit": True},
    }
    for line, options in refused.items():
        with pytest.raises(api.FluxClusterError, match="^" + re.escape(line)):
            api.evaluate(workdir, **options)
    run = api.submit("local", "throughput", synthetic=True, experiment="api", dry_run=True)
    with pytest.raises(api.FluxClusterError, match=f"^{re.escape(str(run.run_dir))}: only Slurm runs"):
        api.requeue(run.run_dir)
