"""flux-cluster submit / preflight: resolve a system, render the job script, run or submit it."""

import re
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import cli_console
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.config.schema import SystemConfig
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

# Run paths go into #SBATCH lines (sbatch neither unquotes them nor leaves '%' alone) and into
# bind-mount specs (',' and ':' separate entries there): keep them to these characters.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_@+=./-]+$")


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked for on the command line."""

    system: str
    job: str
    overrides: list[str] = field(default_factory=list)
    nexp: int | None = None
    seed: int | None = None
    experiment: str | None = None
    runs_dir: Path | None = None
    dependency: str | None = None
    dry_run: bool = False
    wait: bool = False
    job_args: tuple[str, ...] = ()
    extra_minutes: int = 0


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
    request = LaunchRequest(
        system, job, overrides or [], nexp, seed, experiment, runs_dir, dependency, dry_run, wait
    )
    raise typer.Exit(launch(request))


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
        wait,
        job_args=("--soak-seconds", f"{soak_seconds:g}") if soak_seconds > 0 else (),
        extra_minutes=int(soak_seconds // 60) + 1 if soak_seconds > 0 else 0,
    )
    raise typer.Exit(launch(request))


def launch(request: LaunchRequest) -> int:
    from flux_cluster.config import load_system
    from flux_cluster.config.schema import PLAIN_NAME_PATTERN
    from flux_cluster.plan import make_plan
    from flux_cluster.render import render_script
    from flux_cluster.rundir import create_run_dir, runs_root

    overrides: list[str | tuple[str, str]] = list(request.overrides)
    if request.nexp is not None:
        overrides.append((f"mlperf.nexp={request.nexp}", "--nexp"))
    if request.seed is not None:
        overrides.append((f"mlperf.seed_base={request.seed}", "--seed"))
    config = load_system(request.system, overrides).config
    seed_base = config.mlperf.seed_base
    if seed_base is None:  # drawn once and recorded in the run's config, so the run is reproducible
        seed_base = secrets.randbelow(2**31 - config.mlperf.nexp)
        config = config.model_copy(
            update={"mlperf": config.mlperf.model_copy(update={"seed_base": seed_base})}
        )
    # train runs group under their workload (flux1, finetune), other jobs under the job's name
    experiment = request.experiment or (config.train.benchmark if request.job == "train" else request.job)
    if not re.fullmatch(PLAIN_NAME_PATTERN, experiment):
        raise FluxClusterError(f"--experiment {experiment!r}: one name of letters, digits and _.- (no '/')")
    root = runs_root(request.runs_dir, config).absolute()
    if config.launcher == "slurm":
        check_slurm_path(root)
    training = None
    if request.job == "train":
        from flux_cluster.training.workload import resolve_training

        config = _with_training_data(config, make=not request.dry_run)
        training = resolve_training(config).model_dump(mode="json")

    run_dir = create_run_dir(root, experiment, config.name)
    plan = make_plan(
        config,
        request.job,
        run_dir,
        experiment,
        seed_base,
        request.job_args,
        request.dependency,
        request.extra_minutes,
    )
    script = render_script(plan)
    prepare_run_dir(plan, script, training)
    _warn_if_image_missing(config)
    if request.dry_run:
        from flux_cluster.rundir import RunRecord

        RunRecord(launcher="dry-run", job_ids=[], submitted_at=time.time()).save(run_dir)
        typer.echo(f"prepared {run_dir} (not submitted)", err=True)
        sys.stdout.write(script)
        return 0
    if config.launcher == "local":
        return _run_here(plan)
    return _submit(plan, script, request.wait)


def _warn_if_image_missing(config: "SystemConfig") -> None:
    """A missing .sqsh fails the job only when it starts, after its wait in the queue: say so now."""
    if config.container.runtime != "pyxis":
        return  # docker/podman images live on the compute nodes, not on this login node
    from flux_cluster.image.status import image_status

    status = image_status(config.container)
    if status is not None and status.present is False:
        typer.echo(
            f"warning: {status.detail}; the job fails at start unless the compute nodes see it "
            f"(build it: flux-cluster image build --system {config.name})",
            err=True,
        )


def check_slurm_path(path: Path) -> None:
    if not _SAFE_PATH.fullmatch(str(path)):
        raise FluxClusterError(
            f"{str(path)!r}: Slurm jobs need paths of letters, digits and _@+=./- only (no spaces); "
            "choose another (--runs-dir, --input, --output)"
        )


def _with_training_data(config: "SystemConfig", make: bool) -> "SystemConfig":
    """Systems with train.synthetic_data get their dataset made here (once, on this host) when they name
    no data root (the user cache) or an existing empty one; other systems must name an existing prepared
    root. A named root that does not exist is an error, never created."""
    from data_prep.ensure import check_synthetic_root, default_root, ensure_synthetic_root

    spec, data_root = config.train.synthetic_data, config.paths.data_root
    bare_metal = config.container.runtime == "none"  # else paths may be the cluster's, not this host's
    pretrained = config.train.pretrained_path
    if bare_metal and config.train.mode != "pretrain" and pretrained and not Path(pretrained).is_dir():
        raise FluxClusterError(
            f"train.pretrained_path: {pretrained} is not a folder (a diffusers checkpoint)"
        )
    if bare_metal:  # the ranks start in the run directory: a path relative to here must not change meaning
        config = _absolute_paths(config)
        data_root = config.paths.data_root
    lora_init = config.train.lora_init
    if bare_metal and lora_init and not Path(lora_init).is_file():
        raise FluxClusterError(f"train.lora_init: {lora_init} is not a file (a LoRA .safetensors)")
    if spec is None:
        if data_root is None:
            raise FluxClusterError(
                f"system {config.name}: paths.data_root is not set; point it at a prepared Energon root "
                "(flux-cluster prepare-data) or use --set paths.data_root=PATH"
            )
        if bare_metal and make and not (Path(data_root) / ".nv-meta").is_dir():
            raise FluxClusterError(
                f"paths.data_root: {data_root} holds no Energon dataset (.nv-meta); "
                "run 'flux-cluster prepare-data' first"
            )
        return config
    root = (Path(data_root) if data_root else default_root(spec)).absolute()
    if data_root:
        check_synthetic_root(spec, root)  # a dry run too: its script would fail on the same root
    if make:
        ensure_synthetic_root(spec, root, cli_console(stderr=True), explicit=bool(data_root))
    paths = config.paths.model_copy(update={"data_root": str(root)})
    return config.model_copy(update={"paths": paths})


def _absolute_paths(config: "SystemConfig") -> "SystemConfig":
    """This host's relative paths (train.pretrained_path, train.lora_init, paths.data_root) made absolute."""
    train = {
        k: str(Path(v).absolute())
        for k in ("pretrained_path", "lora_init")
        if (v := getattr(config.train, k))
    }
    paths = {"data_root": str(Path(config.paths.data_root).absolute())} if config.paths.data_root else {}
    return config.model_copy(
        update={
            "train": config.train.model_copy(update=train),
            "paths": config.paths.model_copy(update=paths),
        }
    )


def prepare_run_dir(plan: "JobPlan", script: str, training: dict | None = None) -> None:
    """The run directory: resolved config (read by every rank), the script, the Slurm log folder."""
    from flux_cluster.atomic import write_atomic
    from flux_cluster.rundir import SCRIPT_FILE, write_run_config

    job_section = {
        "name": plan.job.name,
        "module": plan.job.module,
        "experiment": plan.experiment,
        "seed_base": plan.seed_base,
        "nexp": plan.nexp,
        "args": list(plan.job_args),
    }
    if training is not None:
        job_section["training"] = training
    write_run_config(plan.run_dir, plan.system, job_section)
    write_atomic(plan.run_dir / SCRIPT_FILE, script, mode=0o755)
    if plan.system.launcher == "slurm":  # the job reads them at run time, not from Slurm (README: Secrets)
        from flux_cluster.config.secrets import store_secrets

        store_secrets(plan.system.secrets)
    plan.slurm_dir.mkdir(exist_ok=True)  # Slurm opens --output there before the script starts


def _run_here(plan: "JobPlan") -> int:
    from flux_cluster.local_runner import run_local
    from flux_cluster.rundir import SCRIPT_FILE

    console = cli_console(stderr=True)
    console.print(
        f"[bold]run[/bold] {plan.run_dir} ({plan.job.name} on {plan.system.name}, "
        f"{plan.system.gpus_per_node} local processes)"
    )
    code = run_local(plan.run_dir / SCRIPT_FILE, plan.run_dir)
    from flux_cluster.jobs import NOT_CONVERGED_EXIT_CODE

    if code == 0:
        verdict = "[green]COMPLETED[/green]"
    elif code == NOT_CONVERGED_EXIT_CODE and plan.job.writes_mlperf_log:
        verdict = f"[yellow]ENDED WITHOUT REACHING THE TARGET (exit {code})[/yellow]"
    else:
        verdict = f"[red]FAILED (exit {code})[/red]"
    console.print(f"[bold]run[/bold] {plan.run_dir}: {verdict}")
    return code


def _submit(plan: "JobPlan", script: str, wait: bool) -> int:
    from flux_cluster import slurm
    from flux_cluster.rundir import RunRecord

    console = cli_console(stderr=True)
    base_id = slurm.submit_script(script, plan.slurm_dir)
    job_ids = slurm.array_task_ids(base_id, plan.nexp) if plan.is_array else [base_id]
    RunRecord(launcher="slurm", job_ids=job_ids, submitted_at=time.time(), array=plan.is_array).save(
        plan.run_dir
    )
    array_note = f" (array of {plan.nexp})" if plan.is_array else ""
    console.print(
        f"[bold]submitted[/bold] job {base_id}{array_note} for {plan.job.name} on {plan.system.name}"
    )
    console.print(f"[bold]run[/bold] {plan.run_dir}")
    console.print(f"follow it: flux-cluster logs {plan.run_dir} --follow")
    typer.echo(base_id)
    if not wait:
        return 0
    states = slurm.wait_until_final(job_ids)
    console.print(", ".join(f"{job_id} {state}" for job_id, state in states.items()))
    return 0 if all(state == "COMPLETED" for state in states.values()) else 1
