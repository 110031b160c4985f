"""flux-cluster submit / preflight: thin wrappers over flux_cluster.launch.submit.launch."""

import sys
from typing import Annotated

import typer

from flux_cluster.cli.console import cli_console
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.launch.submit import Launched, LaunchRequest, launch, throughput_args

NexpOption = Annotated[
    int | None,
    typer.Option(
        "--nexp",
        help="Repeats, each with its own log and seed (MLPerf flux1 needs 10). Overrides mlperf.nexp.",
    ),
]
SeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed", help="Seed of repeat 0 (repeat i: seed+i). Default: drawn at submission and recorded."
    ),
]
ExperimentOption = Annotated[
    str | None,
    typer.Option(
        "--experiment",
        "-e",
        help="Experiment name: groups runs under runs/<experiment>/ \\[default: the job name].",
    ),
]
DependencyOption = Annotated[
    str | None,
    typer.Option("--dependency", help="Start after other jobs, e.g. afterok:1234 or afterany:1234:1235."),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Prepare the run directory and print the job script to stdout, submit "
        "nothing: 'flux-cluster submit ... --dry-run | sbatch' runs it.",
    ),
]
WaitOption = Annotated[
    bool,
    typer.Option("--wait", help="Slurm: wait until the jobs end; exit non-zero unless all COMPLETED."),
]


def submit(
    system: SystemOption = "local",
    job: Annotated[
        str, typer.Option("--job", help="train, throughput (a short timed run, no evaluation) or preflight.")
    ] = "train",
    synthetic: Annotated[
        bool,
        typer.Option(
            "--synthetic",
            help="throughput: synthetic in-memory batches of the real shapes, so no dataset is needed.",
        ),
    ] = False,
    warmup_steps: Annotated[
        int, typer.Option("--warmup-steps", min=0, help="throughput: untimed steps first (compile, caches).")
    ] = 5,
    steps: Annotated[int, typer.Option("--steps", min=1, help="throughput: timed optimizer steps.")] = 20,
    overrides: SetOption = None,
    nexp: NexpOption = None,
    seed: SeedOption = None,
    experiment: ExperimentOption = None,
    runs_dir: RunsDirOption = None,
    dependency: DependencyOption = None,
    dry_run: DryRunOption = False,
    wait: WaitOption = False,
) -> None:
    """Render the job for a system and submit it to Slurm (or run it here with --system local)."""
    request = LaunchRequest(
        system,
        job,
        overrides or [],
        nexp,
        seed,
        experiment,
        runs_dir,
        dependency,
        dry_run,
        job_args=throughput_args(warmup_steps, steps) if job == "throughput" else (),
        synthetic=synthetic,
    )
    raise typer.Exit(_finish(launch(request), wait))


def preflight(
    system: SystemOption = "local",
    overrides: SetOption = None,
    nexp: NexpOption = None,
    seed: SeedOption = None,
    experiment: ExperimentOption = None,
    runs_dir: RunsDirOption = None,
    dependency: DependencyOption = None,
    dry_run: DryRunOption = False,
    wait: WaitOption = False,
    soak_seconds: Annotated[
        float,
        typer.Option(
            "--soak-seconds",
            help="Keep all_reduce running this long and report bandwidth "
            "stability (resumes after a requeue).",
        ),
    ] = 0.0,
) -> None:
    """Check every node: Python/torch versions, accelerators, all_reduce and its bandwidth, data/log roots."""
    request = LaunchRequest(
        system,
        "preflight",
        overrides or [],
        nexp,
        seed,
        experiment,
        runs_dir,
        dependency,
        dry_run,
        job_args=("--soak-seconds", f"{soak_seconds:g}") if soak_seconds > 0 else (),
        extra_minutes=int(soak_seconds // 60) + 1 if soak_seconds > 0 else 0,
    )
    raise typer.Exit(_finish(launch(request), wait))


def _finish(launched: Launched, wait: bool) -> int:
    """The exit code: a dry run prints its script; a local run's code; a Slurm job id on stdout, and with
    --wait the jobs' final states."""
    if launched.record.launcher == "dry-run":
        typer.echo(f"prepared {launched.run_dir} (not submitted)", err=True)
        sys.stdout.write(launched.script)
        return 0
    if launched.exit_code is not None:
        return launched.exit_code
    from flux_cluster.launch import slurm

    typer.echo(launched.record.job_ids[0].split("_")[0])
    if not wait:
        return 0
    states = slurm.wait_until_final(launched.record.job_ids)
    cli_console(stderr=True).print(", ".join(f"{job_id} {state}" for job_id, state in states.items()))
    return 0 if all(state == "COMPLETED" for state in states.values()) else 1
