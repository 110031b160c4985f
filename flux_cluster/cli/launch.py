"""flux-cluster submit / preflight: resolve a system, render the job script, run or submit it."""

import importlib.util
import re
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.plan import JobPlan

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
        help="Experiment name: groups runs under runs/<experiment>/ [default: the job name].",
    ),
]
DependencyOption = Annotated[
    str | None,
    typer.Option("--dependency", help="Start after other jobs, e.g. afterok:1234 or afterany:1234:1235."),
]
DryRunOption = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the job script to stdout (pipe it to sbatch) and submit nothing."),
]
WaitOption = Annotated[
    bool,
    typer.Option("--wait", help="Slurm: wait until the job ends; exit non-zero unless every job COMPLETED."),
]

# Run paths go into #SBATCH lines (not unquoted by sbatch) and bind-mount specs (',' and ':' separate).
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_@%+=./-]+$")


def submit(
    system: SystemOption = "local",
    job: Annotated[str, typer.Option("--job", help="train or preflight.")] = "train",
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
    code = _launch(
        system, job, overrides or [], nexp, seed, experiment, runs_dir, dependency, dry_run, wait, ()
    )
    raise typer.Exit(code)


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
            help="Keep all_reduce running this long and report bandwidth stability (survives requeue).",
        ),
    ] = 0.0,
) -> None:
    """Check every node: Python/torch versions, accelerators, all_reduce and its bandwidth, data/log roots."""
    args = ("--soak-seconds", f"{soak_seconds:g}") if soak_seconds > 0 else ()
    extra = int(soak_seconds // 60) + 1 if soak_seconds > 0 else 0
    code = _launch(
        system,
        "preflight",
        overrides or [],
        nexp,
        seed,
        experiment,
        runs_dir,
        dependency,
        dry_run,
        wait,
        args,
        extra_minutes=extra,
    )
    raise typer.Exit(code)


def _launch(
    system_name: str,
    job: str,
    overrides: list[str],
    nexp: int | None,
    seed: int | None,
    experiment: str | None,
    runs_dir: Path | None,
    dependency: str | None,
    dry_run: bool,
    wait: bool,
    job_args: tuple[str, ...],
    extra_minutes: int = 0,
) -> int:
    from flux_cluster.config import load_system
    from flux_cluster.plan import make_plan
    from flux_cluster.render import render_script
    from flux_cluster.rundir import create_run_dir, runs_root

    cli_overrides = list(overrides)
    if nexp is not None:
        cli_overrides.append(f"mlperf.nexp={nexp}")
    if seed is not None:
        cli_overrides.append(f"mlperf.seed_base={seed}")
    config = load_system(system_name, cli_overrides).config
    seed_base = config.mlperf.seed_base
    if seed_base is None:  # drawn once and recorded in the run's config, so the run is reproducible
        seed_base = secrets.randbelow(2**31 - config.mlperf.nexp)
        config = config.model_copy(
            update={"mlperf": config.mlperf.model_copy(update={"seed_base": seed_base})}
        )
    experiment = experiment or ("flux1" if job == "train" else job)
    if not _SAFE_PATH.match(experiment):
        raise FluxClusterError(f"--experiment {experiment!r}: use letters, digits and _@%+=./- only")
    root = runs_root(runs_dir, config)

    if dry_run:
        planned = (root / experiment).absolute() / f"{time.strftime('%Y%m%d-%H%M%S')}-{config.name}"
        plan = make_plan(config, job, planned, experiment, seed_base, job_args, dependency, extra_minutes)
        _check_run_path(plan.run_dir, config.launcher)
        sys.stdout.write(render_script(plan))
        return 0

    _check_job_available(job)
    _check_run_path((root / experiment).absolute(), config.launcher)
    run_dir = create_run_dir(root, experiment, config.name)
    plan = make_plan(config, job, run_dir, experiment, seed_base, job_args, dependency, extra_minutes)
    return _start(plan, render_script(plan), wait)


def _check_job_available(job: str) -> None:
    from flux_cluster.jobs import JOBS

    module = JOBS[job].module if job in JOBS else None
    if module and importlib.util.find_spec(module) is None:
        raise FluxClusterError(
            f"job {job!r}: its entry point {module} is not part of this version yet; "
            "'flux-cluster preflight' runs the preflight job, or use --dry-run to see the script"
        )


def _check_run_path(path: Path, launcher: str) -> None:
    # The run directory appears in #SBATCH lines, which sbatch does not unquote: keep it plain.
    if launcher == "slurm" and not _SAFE_PATH.match(str(path)):
        raise FluxClusterError(
            f"run directory {path}: Slurm needs a path of letters, digits and _@%+=./- only "
            "(no spaces); choose another with --runs-dir"
        )


def _start(plan: "JobPlan", script: str, wait: bool) -> int:
    from rich.console import Console

    from flux_cluster.atomic import write_atomic
    from flux_cluster.rundir import SCRIPT_FILE, RunRecord, write_run_config

    job_section = {
        "name": plan.job.name,
        "module": plan.job.module,
        "experiment": plan.experiment,
        "seed_base": plan.seed_base,
        "nexp": plan.nexp,
        "args": list(plan.job_args),
    }
    write_run_config(plan.run_dir, plan.system, job_section)
    script_path = plan.run_dir / SCRIPT_FILE
    write_atomic(script_path, script, mode=0o755)
    console = Console(stderr=True)

    if plan.system.launcher == "local":
        from flux_cluster.local_runner import run_local

        console.print(
            f"[bold]run[/bold] {plan.run_dir} ({plan.job.name} on {plan.system.name}, "
            f"{plan.system.gpus_per_node} local processes)"
        )
        code = run_local(script_path, plan.run_dir)
        verdict = "[green]COMPLETED[/green]" if code == 0 else f"[red]FAILED (exit {code})[/red]"
        console.print(f"[bold]run[/bold] {plan.run_dir}: {verdict}")
        return code

    from flux_cluster import slurm

    base_id = slurm.submit_script(script, plan.slurm_dir)
    job_ids = slurm.array_task_ids(base_id, plan.nexp) if plan.is_array else [base_id]
    RunRecord(launcher="slurm", job_ids=job_ids, submitted_at=time.time(), array=plan.is_array).save(
        plan.run_dir
    )
    console.print(
        f"[bold]submitted[/bold] job {base_id}"
        f"{f' (array of {plan.nexp})' if plan.is_array else ''} for {plan.job.name} on {plan.system.name}"
    )
    console.print(f"[bold]run[/bold] {plan.run_dir}")
    console.print(f"follow it: flux-cluster logs {plan.run_dir} --follow")
    typer.echo(base_id)
    if not wait:
        return 0
    states = _wait_for(job_ids)
    console.print(", ".join(f"{job_id} {state}" for job_id, state in states.items()))
    return 0 if all(state == "COMPLETED" for state in states.values()) else 1


def _wait_for(job_ids: list[str], poll_s: float = 2.0) -> dict[str, str]:
    from flux_cluster import slurm

    while True:
        states = slurm.job_states(job_ids)
        if all(state.split()[0] in slurm.FINAL_STATES for state in states.values()):
            return states
        time.sleep(poll_s)
