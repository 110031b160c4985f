"""flux-cluster sweep: a grid of short runs -> runs/<sweep>/runs_summary.csv (a thin wrapper over
flux_cluster.api.sweep / open_sweep)."""

from typing import TYPE_CHECKING, Annotated, Any

import typer

from flux_cluster.cli.console import cli_console
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.api import Sweep
    from flux_cluster.launch.sweep_plan import SweepPlan
    from flux_cluster.sweepdir import SweepState


GridOption = Annotated[
    list[str] | None,
    typer.Option(
        "--grid",
        "-g",
        help="KEY=VALUE1,VALUE2,... (repeatable): every combination is one point, e.g. "
        "--grid train.micro_batch_size=4,8,16 --grid train.compile=false,true --grid nodes=1,2.",
        show_default=False,
    ),
]

JobOption = Annotated[
    str | None,
    typer.Option(
        "--job",
        help="throughput (short timed runs) or train (whole runs) \\[default: throughput].",
        show_default=False,
    ),
]

SyntheticOption = Annotated[
    bool,
    typer.Option("--synthetic", help="throughput: synthetic batches of the real shapes, no dataset."),
]

NameOption = Annotated[
    str | None,
    typer.Option(
        "--name", help="The sweep's folder under the runs directory \\[default: sweep-SYSTEM-TIME]."
    ),
]

SubmitOption = Annotated[
    bool,
    typer.Option("--submit", help="Submit the points to Slurm (an error on a system without Slurm)."),
]

HereOption = Annotated[
    bool,
    typer.Option("--here", help="Run the points on this machine one by one, even on a Slurm system."),
]

MaxParallelOption = Annotated[
    int | None,
    typer.Option("--max-parallel", min=1, help="Slurm: at most N points queued or running at once."),
]

DependencyOption = Annotated[
    str | None,
    typer.Option(
        "--dependency",
        help="Slurm: the sweep's jobs start after these, e.g. afterok:1234 (with --resume: the points "
        "queued now).",
        show_default=False,
    ),
]

WarmupStepsOption = Annotated[
    int | None,
    typer.Option(
        "--warmup-steps", min=0, help="throughput: untimed steps \\[default: 5].", show_default=False
    ),
]

StepsOption = Annotated[
    int | None,
    typer.Option("--steps", min=1, help="throughput: timed steps \\[default: 20].", show_default=False),
]

ResumeOption = Annotated[
    str | None,
    typer.Option(
        "--resume",
        help="A sweep folder or name: run again its points that did not finish, with its own grid and "
        "options (only --system, --runs-dir, --dependency and --wait go with it).",
        show_default=False,
    ),
]

WaitOption = Annotated[bool, typer.Option("--wait", help="Slurm: wait for every point, then summarise.")]

DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Check every point and print the sweep's plan (points, ranks, global batch); write and "
        "submit nothing.",
    ),
]


def sweep(
    system: SystemOption = "local",
    grid: GridOption = None,
    job: JobOption = None,
    synthetic: SyntheticOption = False,
    overrides: SetOption = None,
    name: NameOption = None,
    runs_dir: RunsDirOption = None,
    submit: SubmitOption = False,
    here: HereOption = False,
    max_parallel: MaxParallelOption = None,
    dependency: DependencyOption = None,
    warmup_steps: WarmupStepsOption = None,
    steps: StepsOption = None,
    resume: ResumeOption = None,
    wait: WaitOption = False,
    dry_run: DryRunOption = False,
) -> None:
    """Run one short job per point of a grid and write runs_summary.csv: which configuration is fastest on
    this system, and what it costs. A point that fails or runs out of memory is recorded and the rest go on.
    On Slurm, the points that share a node count go out as one array.

    Exit codes: 0 every point ran (ok or oom), 1 some failed, 2 bad input.
    """
    from flux_cluster import api

    if resume is not None:
        _refuse_options_with_resume(
            {
                "--grid": grid,
                "--job": job,
                "--synthetic": synthetic,
                "--set": overrides,
                "--name": name,
                "--submit": submit,
                "--here": here,
                "--max-parallel": max_parallel,
                "--warmup-steps": warmup_steps,
                "--steps": steps,
                "--dry-run": dry_run,
            }
        )
        handle = api.open_sweep(resume, runs_dir, system).resume(dependency=dependency)
    else:
        optional = {"job": job, "warmup_steps": warmup_steps, "steps": steps}
        options: dict[str, Any] = {
            "overrides": overrides or [],
            "synthetic": synthetic,
            "name": name,
            "runs_dir": runs_dir,
            "here": here,
            "submit": submit,
            "max_parallel": max_parallel,
            "dependency": dependency,
            **{key: value for key, value in optional.items() if value is not None},
        }
        if dry_run:
            _print_plan(api.plan_sweep(system, grid or [], **options))
            return
        handle = api.sweep(system, grid or [], **options)
    state = handle.wait() if wait else handle.state()
    _print_summary(handle, state)
    raise typer.Exit(1 if any(p.status == "failed" for p in state.points) else 0)


def _refuse_options_with_resume(chosen: dict[str, Any]) -> None:
    """--resume keeps the sweep's own grid and options: any other given is one line naming them."""
    given = [flag for flag, value in chosen.items() if _given(value)]
    if given:
        raise FluxClusterError(
            f"--resume keeps the sweep's own grid and options: give no {', '.join(given)} "
            "(start a new sweep to change them)"
        )


def _print_plan(plan: "SweepPlan") -> None:
    """--dry-run: every point checked, the plan printed; nothing written or submitted."""
    from flux_cluster.launch.sweep_plan import print_plan

    console = cli_console()
    print_plan(plan, console)
    console.print("--dry-run: nothing written, nothing submitted")


def _given(value: object) -> bool:
    """An option set on the command line: not its default None/False/[] (0 is a value: 0 == False)."""
    return value is not None and value is not False and value != []


def _print_summary(handle: "Sweep", state: "SweepState") -> None:
    from flux_cluster.report.sweep import build_report, print_sweep
    from flux_cluster.sweepdir import SUMMARY_FILE

    print_sweep(build_report(handle.folder, state), cli_console())  # the state the exit code is from
    typer.echo(f"wrote {handle.folder / SUMMARY_FILE}", err=True)
