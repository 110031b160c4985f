"""Submissions sbatch refuses leave nothing behind: no sweep point folder, no array folder, no data folder
made for the job; what was already there stays. sbatch is a stand-in that refuses (as a controller that
cannot be reached does)."""

import io
import sys
from pathlib import Path

import pytest
from cli_errors import error_line
from data_helpers import write_image_folder
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.launch.sweep import start_sweep
from flux_cluster.launch.sweep_plan import SweepRequest
from flux_cluster.rundir import list_runs
from flux_cluster.sweepdir import SweepState

REFUSAL = "Batch job submission failed: Unable to contact slurm controller"


@pytest.fixture
def refusing_sbatch(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tools = workdir / "tools"
    tools.mkdir()
    (tools / "sbatch").write_text(f"#!/bin/bash\necho 'sbatch: error: {REFUSAL}' >&2\nexit 1\n")
    (tools / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{sys.exec_prefix}/bin:/usr/bin:/bin")
    return tools


@pytest.mark.usefixtures("refusing_sbatch")
def test_a_refused_sweep_array_leaves_no_point_or_array_folder(workdir: Path) -> None:
    grid = {"nodes": ["1", "2"], "train.micro_batch_size": ["1", "2"]}  # two arrays of two points
    request = SweepRequest("local_slurm", grid, synthetic=True, name="refused", max_parallel=1)
    console = Console(file=io.StringIO(), width=300)
    folder = start_sweep(request, console)
    state = SweepState.load(folder)
    assert [p.status for p in state.points] == ["failed"] * 4
    assert all(REFUSAL in (p.error or "") and p.run_dir is None for p in state.points)
    assert [p.name for p in folder.iterdir() if p.is_dir()] == []  # no point's folder, no array's
    assert "0 points queued as 0 Slurm array(s)" in console.file.getvalue()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("refusing_sbatch")
def test_a_refused_prepare_data_makes_no_data_folder(cli: CliRunner, workdir: Path) -> None:
    assert cli.invoke(app, ["data", "synth", "src", "--train", "20", "--val", "8"]).exit_code == 0
    (workdir / "kept").mkdir()
    args = ["prepare-data", "--system", "local_slurm", "--submit", "--input", "src"]
    line = error_line(cli.invoke(app, [*args, "--output", str(workdir / "kept" / "new" / "energon")]))
    assert REFUSAL in line and "nothing started" in line
    assert list((workdir / "kept").iterdir()) == [] and list_runs(workdir / "runs") == []


@pytest.mark.usefixtures("refusing_sbatch")
def test_a_refused_data_encode_makes_no_output_or_cache_folder(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path
) -> None:
    write_image_folder(workdir / "images", "captions.txt", 4)
    args = ["data", "encode", "images", "out", "--model", str(tiny_pipeline), "--resolution", "64"]
    result = cli.invoke(app, [*args, "--cache", "cache", "--submit", "--system", "local_slurm"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("error: sbatch refused the job: ") and REFUSAL in last
    assert not (workdir / "out").exists() and not (workdir / "cache").exists()
    assert list_runs(workdir / "runs") == []


def test_an_unstarted_run_goes_at_once_and_a_folder_being_removed_is_never_a_run(tmp_path: Path) -> None:
    from flux_cluster.launch.submit import remove_unstarted

    run, started = tmp_path / "x" / "20260101-000000-a", tmp_path / "x" / "20260101-000000-b"
    for folder in (run, started):
        (folder / "slurm").mkdir(parents=True)
        (folder / "config.yaml").write_text("{}\n")
    (started / "jobs.json").write_text("{}\n")
    (tmp_path / "x" / ".20260101-000000-c.removing-7").mkdir()  # a removal cut short
    (tmp_path / "x" / ".20260101-000000-c.removing-7" / "config.yaml").write_text("{}\n")
    assert list_runs(tmp_path) == [run, started]
    assert "removed its run folder" in remove_unstarted(run) and remove_unstarted(started) == ""
    assert list_runs(tmp_path) == [started] and not run.exists()
