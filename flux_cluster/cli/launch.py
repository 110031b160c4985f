"""flux-cluster submit / preflight: thin wrappers over flux_cluster.api.submit / preflight."""

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import cli_console
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption

if TYPE_CHECKING:
    from flux_cluster.api import Run

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
    from flux_cluster import api

    run = api.submit(
        system,
        job,
        overrides or [],
        synthetic=synthetic,
        warmup_steps=warmup_steps,
        steps=steps,
        nexp=nexp,
        seed=seed,
        experiment=experiment,
        runs_dir=runs_dir,
        dependency=dependency,
        dry_run=dry_run,
        echo=True,
    )
    raise typer.Exit(_finish(run, wait))


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
    from flux_cluster import api

    run = api.preflight(
        system,
        overrides or [],
        soak_seconds=soak_seconds,
        nexp=nexp,
        seed=seed,
        experiment=experiment,
        runs_dir=runs_dir,
        dependency=dependency,
        dry_run=dry_run,
        echo=True,
    )
    raise typer.Exit(_finish(run, wait))


def _finish(run: "Run", wait: bool) -> int:
    """The exit code: a dry run prints its script; a local run's code; a Slurm job id on stdout, and with
    --wait the jobs' final states."""
    if run.record.launcher == "dry-run":
        typer.echo(f"prepared {run.run_dir} (not submitted)", err=True)
        sys.stdout.write(run.script())
        return 0
    if run.exit_code is not None:
        return run.exit_code
    typer.echo(run.job_ids[0].split("_")[0])
    if not wait:
        return 0
    run.wait(poll_s=2.0)
    return _final_states(run.states())


def wait_for_jobs(job_ids: list[str]) -> int:
    """--wait for jobs of several runs (prepare-data's stages): until they end; 0 if all COMPLETED."""
    from flux_cluster.launch import slurm

    return _final_states(slurm.wait_until_final(job_ids))


def _final_states(states: dict[str, str]) -> int:
    cli_console(stderr=True).print(", ".join(f"{job_id} {state}" for job_id, state in states.items()))
    return 0 if all(state == "COMPLETED" for state in states.values()) else 1
