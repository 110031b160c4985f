"""flux-cluster runs / status / logs / cancel: follow what was submitted, from its run directory (thin:
flux_cluster.api does the work)."""

import sys
import time
from typing import Annotated

import typer

from flux_cluster.cli.console import Typer, cli_console, print_table
from flux_cluster.cli.options import RunArgument, RunsDirOption

app = Typer(help="List and manage runs (run directories and their Slurm jobs).", no_args_is_help=True)


@app.command("list")
def list_runs(runs_dir: RunsDirOption = None) -> None:
    """Table of runs under the runs directory, with their live state."""
    from rich.table import Table

    from flux_cluster import api
    from flux_cluster.safe_text import plain

    listing = api.list_runs(runs_dir)
    table = Table(title=plain(f"runs under {listing.root}"))
    for column in ("run", "system", "job", "jobs", "state", "started"):
        table.add_column(column)
    for row in listing.rows:
        started = "-"
        if row.submitted_at is not None:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.submitted_at))
        ids = ",".join(row.job_ids) or row.launcher
        table.add_row(*(plain(v) for v in (row.run, row.system, row.job, ids, row.state)), started)
    print_table(cli_console(), table)
    errors = cli_console(stderr=True)
    for line in listing.skipped:
        errors.print(plain(line), soft_wrap=True, highlight=False)


@app.command("status")
def status(run: RunArgument = None, runs_dir: RunsDirOption = None) -> None:
    """Live Slurm state of every job and array task of a run (sacct)."""
    from rich.table import Table

    from flux_cluster import api
    from flux_cluster.safe_text import plain

    opened = api.open_run(run, runs_dir)
    jobs, note = opened.jobs(), opened.dry_run_note()
    table = Table(title=plain(str(opened.run_dir)))
    if note is not None:
        table.add_column("run")
        table.add_column("state")
        table.add_row(note, plain(jobs[0].state))
    elif opened.launcher != "slurm":
        table.add_column("pid")
        table.add_column("state")
        table.add_row(plain(jobs[0].job), plain(jobs[0].state))
    else:
        for column in ("job", "state", "elapsed", "nodes", "exit code"):
            table.add_column(column)
        for job in jobs:
            table.add_row(*(plain(v) for v in (job.job, job.state, job.elapsed, job.nodes, job.exit_code)))
    print_table(cli_console(), table)


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
    from flux_cluster import api

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()  # --follow: each piece as it comes

    api.open_run(run, runs_dir).follow_logs(write, follow=follow, task=task, stderr=stderr, tail=tail)


@app.command("cancel")
def cancel(run: RunArgument = None, runs_dir: RunsDirOption = None) -> None:
    """Cancel every job of a run (scancel), or stop a local run."""
    from flux_cluster import api

    typer.echo(api.open_run(run, runs_dir).cancel())


@app.command("requeue")
def requeue(run: RunArgument = None, runs_dir: RunsDirOption = None) -> None:
    """Requeue every job of a run (scontrol requeue); it resumes from its last checkpoint."""
    from flux_cluster import api

    typer.echo(f"requeued {', '.join(api.requeue(run, runs_dir))}")
