"""flux-cluster sweep: a grid of short runs -> runs/<sweep>/runs_summary.csv (a wrapper over
flux_cluster.launch.sweep, which flux_cluster.api.sweep calls too)."""

from pathlib import Path
from typing import Annotated

import typer

from flux_cluster.cli.console import cli_console
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.errors import FluxClusterError


def sweep(
    system: SystemOption = "local",
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            "-g",
            help="KEY=VALUE1,VALUE2,... (repeatable): every combination is one point, e.g. "
            "--grid train.micro_batch_size=4,8,16 --grid train.compile=false,true --grid nodes=1,2.",
            show_default=False,
        ),
    ] = None,
    job: Annotated[
        str, typer.Option("--job", help="throughput (short timed runs) or train (whole runs).")
    ] = "throughput",
    synthetic: Annotated[
        bool,
        typer.Option("--synthetic", help="throughput: synthetic batches of the real shapes, no dataset."),
    ] = False,
    overrides: SetOption = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="The sweep's folder under the runs directory \\[default: sweep-SYSTEM-TIME]."
        ),
    ] = None,
    runs_dir: RunsDirOption = None,
    here: Annotated[
        bool,
        typer.Option("--here", help="Run the points on this machine one by one, even on a Slurm system."),
    ] = False,
    max_parallel: Annotated[
        int | None,
        typer.Option("--max-parallel", min=1, help="Slurm: at most N points queued or running at once."),
    ] = None,
    warmup_steps: Annotated[
        int, typer.Option("--warmup-steps", min=0, help="throughput: untimed steps.")
    ] = 5,
    steps: Annotated[int, typer.Option("--steps", min=1, help="throughput: timed steps.")] = 20,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            help="A sweep folder or name: run again its points that did not finish (its grid and options "
            "are kept; give no --grid).",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Slurm: wait for every point, then summarise.")
    ] = False,
) -> None:
    """Run one short job per point of a grid and write runs_summary.csv: which configuration is fastest on
    this system, and what it costs. A point that fails or runs out of memory is recorded and the rest go on.

    Exit codes: 0 every point ran (ok or oom), 1 some failed, 2 bad input.
    """
    from flux_cluster.launch.sweep import SweepRequest, create_sweep, find_sweep, parse_grid, run_sweep
    from flux_cluster.launch.sweep import wait as wait_for

    console = cli_console(stderr=True)
    if resume is not None:
        if grid:
            raise FluxClusterError("--resume keeps the sweep's own grid: give no --grid")
        folder = find_sweep(resume, runs_dir, system)
    else:
        request = SweepRequest(
            system=system,
            grid=parse_grid(grid or []),
            job=job,
            overrides=list(overrides or []),
            synthetic=synthetic,
            name=name,
            runs_dir=runs_dir,
            here=here,
            max_parallel=max_parallel,
            warmup_steps=warmup_steps,
            steps=steps,
        )
        folder, state = create_sweep(request)
        console.print(f"[bold]sweep[/bold] {folder}: {len(state.points)} points of {', '.join(state.grid)}")
    state = run_sweep(folder, console)
    if wait:
        state = wait_for(folder)
    _print_summary(folder)
    failed = [p for p in state.points if p.status == "failed"]
    raise typer.Exit(1 if failed else 0)


def _print_summary(folder: Path) -> None:
    from flux_cluster.launch.sweep_state import SUMMARY_FILE
    from flux_cluster.report.sweep import print_sweep, sweep_report

    print_sweep(sweep_report(folder), cli_console())
    typer.echo(f"wrote {folder / SUMMARY_FILE}", err=True)
