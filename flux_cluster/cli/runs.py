"""flux-cluster runs / status / logs / cancel: follow what was submitted, from its run directory."""

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import Typer, cli_console, print_table
from flux_cluster.cli.options import RunArgument, RunsDirOption
from flux_cluster.errors import FluxClusterError

LINE_LIMIT = 1024 * 1024

if TYPE_CHECKING:
    from flux_cluster.rundir import RunRecord

app = Typer(help="List and manage runs (run directories and their Slurm jobs).", no_args_is_help=True)


def _load(run: str | None, runs_dir: Path | None) -> "tuple[Path, RunRecord]":
    from flux_cluster.launch.track import load_run

    return load_run(run, runs_dir)


def _states(record: "RunRecord", run_dir: Path) -> dict[str, str]:
    from flux_cluster.launch.track import run_states

    return run_states(run_dir, record)


@app.command("list")
def list_runs(runs_dir: RunsDirOption = None) -> None:
    """Table of runs under the runs directory, with their live state."""
    import yaml
    from rich.table import Table

    from flux_cluster.rundir import RunRecord, config_file, list_runs, read_run_config, runs_root
    from flux_cluster.safe_text import plain

    root = runs_root(runs_dir)
    table = Table(title=plain(f"runs under {root}"))
    for column in ("run", "system", "job", "jobs", "state", "started"):
        table.add_column(column)
    skipped = []
    for run_dir in list_runs(root):
        name = plain(f"{run_dir.parent.name}/{run_dir.name}")
        try:
            system, job = read_run_config(config_file(run_dir))
            record = RunRecord.load(run_dir)
            if record is None:
                ids, state, started = "-", "not started", "-"
            else:
                states = _states(record, run_dir)
                ids = ",".join(record.job_ids) or record.launcher
                state = ", ".join(sorted(set(states.values())))
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.submitted_at))
        except (OSError, ValueError, KeyError, TypeError, FluxClusterError, yaml.YAMLError) as exc:
            # another version's or a damaged run directory: skip it with one line, list the others
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            skipped.append(plain(f"skipped {run_dir.parent.name}/{run_dir.name}: {reason}"))
            continue
        table.add_row(name, plain(system.name), plain(str(job["name"])), plain(ids), plain(state), started)
    print_table(cli_console(), table)
    errors = cli_console(stderr=True)
    for line in skipped:
        errors.print(line, soft_wrap=True, highlight=False)


@app.command("status")
def status(run: RunArgument = None, runs_dir: RunsDirOption = None) -> None:
    """Live Slurm state of every job and array task of a run (sacct)."""
    from rich.table import Table

    from flux_cluster.safe_text import plain

    run_dir, record = _load(run, runs_dir)
    table = Table(title=plain(str(run_dir)))
    if record.launcher == "dry-run":
        table.add_column("run")
        table.add_column("state")
        table.add_row(
            "a dry run (--dry-run): its job.sh was written, nothing was started; run it with "
            + ("'bash job.sh'" if _local_system(run_dir) else "'sbatch job.sh'")
            + " in the run folder, or submit again",
            _states(record, run_dir)[record.launcher],
        )
    elif record.launcher != "slurm":
        table.add_column("pid")
        table.add_column("state")
        table.add_row(str(record.pid or "-"), plain(_states(record, run_dir)[record.launcher]))
    else:
        from flux_cluster.launch import slurm

        states = slurm.job_states(record.job_ids)
        for column in ("job", "state", "elapsed", "nodes", "exit code"):
            table.add_column(column)
        for job_id in record.job_ids:
            info = slurm.job_info(job_id)
            table.add_row(
                job_id,
                plain(states[job_id]),
                plain(info.get("Elapsed", "-")),
                plain(info.get("NodeList", "-")),
                plain(info.get("ExitCode", "-")),
            )
    print_table(cli_console(), table)


def _local_system(run_dir: Path) -> bool:
    import yaml

    from flux_cluster.rundir import config_file

    try:
        return yaml.safe_load(config_file(run_dir).read_text())["system"]["launcher"] == "local"
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return False


@app.command("logs")
def logs(
    run: RunArgument = None,
    runs_dir: RunsDirOption = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the jobs end.")] = False,
    task: Annotated[int | None, typer.Option("--task", help="Only this repeat (array task) index.")] = None,
    stderr: Annotated[
        bool, typer.Option("--stderr", help="Show the jobs' stderr instead of stdout.")
    ] = False,
    tail: Annotated[
        int | None,
        typer.Option("--tail", min=0, help="Only the last N lines of each log (read from its end)."),
    ] = None,
) -> None:
    """Print a run's job output (all repeats, or one with --task). An array run's lines start with
    their task id ('[task 3] ...'). Logs are streamed: any size prints in flat memory."""
    from flux_cluster.launch import slurm
    from flux_cluster.rundir import slurm_dir

    run_dir, record = _load(run, runs_dir)
    if record.launcher == "dry-run":  # no job, so no output and no end to wait for
        raise FluxClusterError(
            f"{run_dir}: never submitted (prepared with --dry-run): no job output to show or follow; "
            f"a job.sh submitted by hand writes its output to {slurm_dir(run_dir)}/"
        )
    from flux_cluster.launch.track import copy_log, log_files

    files = log_files(run_dir, record, stderr)
    labels = [f"[task {job_id.rsplit('_', 1)[-1]}] " if record.array else "" for job_id in record.job_ids]
    labels = labels or [""] * len(files)  # a local run: one log, no job ids
    if task is not None:
        if not 0 <= task < len(files):
            raise FluxClusterError(f"--task {task}: the run has tasks 0..{len(files) - 1}")
        files, labels = [files[task]], [""]
    offsets = dict.fromkeys(files, 0)
    pending = dict.fromkeys(files, "")  # a labelled file's last line until it is complete
    first = True
    while True:
        # the state first, then the output: once the jobs have ended, this read gets all of it
        done = not follow or all(slurm.is_final(state) for state in _states(record, run_dir).values())
        for path, label in zip(files, labels, strict=True):
            if not label:
                if len(files) > 1 and not follow and os.path.lexists(path):
                    sys.stdout.write(f"==> {path.name} <==\n")
                offsets[path] = copy_log(
                    path, run_dir, offsets[path], sys.stdout.write, tail if first else None
                )
                continue

            def labelled(text: str, path: Path = path, label: str = label) -> None:
                *lines, pending[path] = (pending[path] + text).split("\n")
                if len(pending[path]) > LINE_LIMIT:  # a line without end: show it in pieces
                    lines.append(pending[path])
                    pending[path] = ""
                sys.stdout.write("".join(f"{label}{line}\n" for line in lines))

            offsets[path] = copy_log(path, run_dir, offsets[path], labelled, tail if first else None)
            if done and pending[path]:
                sys.stdout.write(f"{label}{pending[path]}\n")
                pending[path] = ""
        first = False
        sys.stdout.flush()
        if done:
            return
        time.sleep(1.0)
        if record.launcher == "local":
            from flux_cluster.rundir import RunRecord

            record = RunRecord.load(run_dir) or record


@app.command("cancel")
def cancel(run: RunArgument = None, runs_dir: RunsDirOption = None) -> None:
    """Cancel every job of a run (scancel), or stop a local run."""
    from flux_cluster.launch.track import cancel_run

    typer.echo(cancel_run(*_load(run, runs_dir)))


@app.command("requeue")
def requeue(run: RunArgument = None, runs_dir: RunsDirOption = None) -> None:
    """Requeue every job of a run (scontrol requeue); it resumes from its last checkpoint."""
    from flux_cluster import api

    typer.echo(f"requeued {', '.join(api.requeue(run, runs_dir))}")
