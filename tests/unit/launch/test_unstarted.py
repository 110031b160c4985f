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
    keep = 'for a in "$@"; do [[ -f $a ]] && cat "$a" >> "$(dirname "$0")/scripts.txt"; done'  # what it got
    (tools / "sbatch").write_text(f"#!/bin/bash\n{keep}\necho 'sbatch: error: {REFUSAL}' >&2\nexit 1\n")
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


def test_an_any_of_dependency_goes_to_sbatch_as_given_and_a_window_refuses_it_first(
    workdir: Path, refusing_sbatch: Path
) -> None:
    """Without --max-parallel each array waits for a '?' (any of) list as given; sbatch refusing them
    leaves no folder. With a window, whose waits join with ',', the same list is one line before any
    folder is made."""
    import dataclasses

    from flux_cluster.errors import FluxClusterError

    grid = {"nodes": ["1", "2"], "train.micro_batch_size": ["1", "2"]}  # two arrays of two points
    any_of = "afterok:7?afternotok:8"
    request = SweepRequest("local_slurm", grid, synthetic=True, name="anyof", dependency=any_of)
    folder = start_sweep(request, Console(file=io.StringIO(), width=300))
    state = SweepState.load(folder)
    assert [p.status for p in state.points] == ["failed"] * 4 and all(p.run_dir is None for p in state.points)
    assert [p.name for p in folder.iterdir() if p.is_dir()] == []
    sent = [
        line for line in (refusing_sbatch / "scripts.txt").read_text().splitlines() if "--dependency" in line
    ]
    assert sent == [f"#SBATCH --dependency='{any_of}'"] * 2  # both arrays, nothing joined to the list
    windowed = dataclasses.replace(request, name="anyof-window", max_parallel=2)
    with pytest.raises(FluxClusterError, match="Slurm cannot join to a '\\?' \\(any of\\) list"):
        start_sweep(windowed, Console(file=io.StringIO(), width=300))
    assert sorted(p.name for p in folder.parent.iterdir()) == ["anyof"]


@pytest.mark.usefixtures("refusing_sbatch")
def test_a_refused_prepare_data_makes_no_data_folder(cli: CliRunner, workdir: Path) -> None:
    assert cli.invoke(app, ["data", "synth", "src", "--train", "20", "--val", "8"]).exit_code == 0
    (workdir / "kept").mkdir()
    args = ["prepare-data", "--system", "local_slurm", "--submit", "--input", "src"]
    line = error_line(cli.invoke(app, [*args, "--output", str(workdir / "kept" / "new" / "energon")]))
    assert REFUSAL in line and "nothing started" in line
    assert list((workdir / "kept").iterdir()) == []
    assert not (workdir / "runs").exists()  # runs/prepare-data/ and runs/ were made for it: gone too
    (workdir / "runs" / "other").mkdir(parents=True)  # what was there before stays
    error_line(cli.invoke(app, [*args, "--output", str(workdir / "kept" / "new" / "energon")]))
    assert [p.name for p in (workdir / "runs").iterdir()] == ["other"] and list(
        (workdir / "kept").iterdir()
    ) == []


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
    assert not (workdir / "runs").exists()  # nor runs/data-encode/, nor runs/


@pytest.mark.usefixtures("refusing_sbatch")
def test_a_refused_evaluate_job_leaves_no_folder(cli: CliRunner, workdir: Path, tiny_pipeline: Path) -> None:
    """evaluate --submit makes its run folder's parents and --output's folder before sbatch (a container
    mount's source must exist): refused, they go again; folders that were there stay."""
    args = ["evaluate", str(tiny_pipeline), "--system", "local_slurm", "--submit"]
    line = error_line(cli.invoke(app, [*args, "--output", "evals/a/eval.json"]))
    assert REFUSAL in line and "nothing started" in line
    assert not (workdir / "evals").exists() and not (workdir / "runs").exists()
    (workdir / "evals").mkdir()
    (workdir / "runs" / "evaluate" / "kept").mkdir(parents=True)
    error_line(cli.invoke(app, args))  # its output would have been in the job's own run folder
    error_line(cli.invoke(app, [*args, "--output", "evals/a/eval.json"]))
    assert list((workdir / "evals").iterdir()) == []
    assert [p.name for p in (workdir / "runs" / "evaluate").iterdir()] == ["kept"]


def test_an_evaluate_job_says_where_its_output_lands(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line after sbatch names the JSON the job writes: with no --output, results/eval.json in the
    job's own run folder (not runs/evaluate/TIME-NAME/eval.json, which --help names for a run here)."""
    tools = workdir / "tools"
    tools.mkdir()
    (tools / "sbatch").write_text("#!/bin/bash\necho 'Submitted batch job 4242'\n")
    (tools / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{sys.exec_prefix}/bin:/usr/bin:/bin")
    args = ["evaluate", str(tiny_pipeline), "--system", "local_slurm", "--submit"]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    (job,) = (workdir / "runs" / "evaluate").iterdir()
    said = " ".join(result.output.split())  # however the console wrapped it
    assert f"submitted evaluate job 4242 on local_slurm ({job}); it writes {job}/results/eval.json;" in said
    result = cli.invoke(app, [*args, "--output", "evals/b.json"])
    assert f"it writes {workdir / 'evals' / 'b.json'};" in " ".join(result.output.split())
    assert (workdir / "evals").is_dir()  # the job's mount source
    usage = " ".join(cli.invoke(app, ["evaluate", "--help"]).output.replace("│", " ").split())
    assert "with --submit, results/eval.json in the job's run folder" in usage


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
