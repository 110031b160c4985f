"""Launch one job: resolve the system, write the run directory, render the script, then run it here
(launcher local) or submit it to Slurm. The Python API (flux_cluster.api, under the CLI's submit and
preflight) calls :func:`launch`; sweeps call its parts (plan_launch, write_run); data and evaluate jobs
start their own plans with :func:`launch_plan`. Nothing here prints to stdout but a local job's own
output (echo)."""

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.console import cli_console
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.config.loader import Override, ResolvedSystem
    from flux_cluster.config.schema import SystemConfig
    from flux_cluster.config.workload import TrainingPlan
    from flux_cluster.launch.plan import JobPlan
    from flux_cluster.rundir import RunRecord

# Run paths go into #SBATCH lines (sbatch neither unquotes them nor leaves '%' alone) and into
# bind-mount specs (',' and ':' separate entries there): keep them to these characters.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_@+=./-]+$")


@dataclass(frozen=True)
class LaunchRequest:
    """One job to launch, as the CLI or the API asks for it."""

    system: str
    """A system name (configs/systems/<name>.yaml) or a YAML file."""
    job: str = "train"
    """A job of flux_cluster.launch.plan.JOBS: train, throughput, preflight, evaluate."""
    overrides: "list[str | Override]" = field(default_factory=list)
    """--set KEY=VALUE overrides, applied in order (an Override: a value a sweep derived)."""
    nexp: int | None = None
    seed: int | None = None
    experiment: str | None = None
    """Groups runs under runs/<experiment>/; None: the workload (train) or the job's name."""
    runs_dir: Path | None = None
    dependency: str | None = None
    dry_run: bool = False
    job_args: tuple[str, ...] = ()
    """Extra arguments for the job module (preflight --soak-seconds, throughput --steps)."""
    extra_minutes: int = 0
    synthetic: bool = False
    """throughput: synthetic in-memory batches of the real shapes; no dataset is read or made."""
    run_name: str | None = None
    """The run directory's name after its timestamp; None: the system's name."""
    echo: bool = True
    """Local runs: copy the job's output to stdout as well as to its log."""


@dataclass
class Launched:
    """What launch did: the run directory, the plan and script, and the job ids or exit code."""

    run_dir: Path
    plan: "JobPlan"
    script: str
    record: "RunRecord"
    exit_code: int | None = None
    """A local run's exit code (it ran to its end inside launch); None for Slurm and dry runs."""


def throughput_args(warmup_steps: int, steps: int) -> tuple[str, ...]:
    """The throughput job's arguments (flux_cluster/jobs/throughput.py)."""
    return ("--warmup-steps", str(warmup_steps), "--steps", str(steps))


TRAINING_JOBS = ("train", "throughput")
"""Jobs that train, so resolve the train section into a plan (and need data unless synthetic)."""


def launch(request: LaunchRequest, console: "Console | None" = None) -> Launched:
    """Launch one job. Slurm: returns once it is queued. Local: returns when it has ended."""
    console = console or cli_console(stderr=True)
    plan, training = plan_launch(request, console)
    warn_if_image_missing(plan.system, console)
    launched = launch_plan(
        plan, dry_run=request.dry_run, training=training, console=console, echo=request.echo
    )
    if launched.record.launcher == "slurm":
        ids = launched.record.job_ids
        array_note = f" (array of {plan.nexp})" if plan.is_array else ""
        console.print(
            f"[bold]submitted[/bold] job {ids[0].split('_')[0]}{array_note} for {plan.job.name} on "
            f"{plan.system.name}"
        )
        console.print(f"[bold]run[/bold] {plan.run_dir}")
        console.print(f"follow it: flux-cluster logs {plan.run_dir} --follow")
    return launched


def plan_launch(request: LaunchRequest, console: "Console") -> "tuple[JobPlan, dict | None]":
    """Resolve the system with the request's settings, check (and make, unless a dry run) the training
    data, create the run directory and plan the job; returns the plan and the resolved training section
    (None for jobs that do not train). Nothing is submitted or run."""
    from flux_cluster.config import load_system
    from flux_cluster.config.schema import PLAIN_NAME_PATTERN
    from flux_cluster.launch.plan import make_plan
    from flux_cluster.rundir import create_run_dir, runs_root

    overrides: list[str | tuple[str, str] | Override] = list(request.overrides)
    if request.nexp is not None:
        overrides.append((f"mlperf.nexp={request.nexp}", "--nexp"))
    if request.seed is not None:
        overrides.append((f"mlperf.seed_base={request.seed}", "--seed"))
    if request.job == "throughput":  # one measurement per run: repeats are a sweep's business
        overrides.append(("mlperf.nexp=1", "--job throughput"))
    resolved = load_system(request.system, overrides)
    config = resolved.config
    seed_base = config.mlperf.seed_base
    if seed_base is None:  # drawn once and recorded in the run's config, so the run is reproducible
        seed_base = secrets.randbelow(2**31 - config.mlperf.nexp)
        config = config.model_copy(
            update={"mlperf": config.mlperf.model_copy(update={"seed_base": seed_base})}
        )
    micro_batch_auto = None
    if config.train.micro_batch_size == "auto":  # the run's config records the number chosen
        from flux_cluster.training.batch_choice import resolve_micro_batch  # torch loads here

        config, micro_batch_auto = resolve_micro_batch(config)
        assert micro_batch_auto is not None
        console.print(micro_batch_auto.describe(), markup=False, highlight=False)
    # train runs group under their workload (flux1, finetune), other jobs under the job's name
    experiment = request.experiment or (config.train.benchmark if request.job == "train" else request.job)
    if not re.fullmatch(PLAIN_NAME_PATTERN, experiment):
        raise FluxClusterError(f"--experiment {experiment!r}: one name of letters, digits and _.- (no '/')")
    root = runs_root(request.runs_dir, config).absolute()
    if config.launcher == "slurm":
        check_slurm_path(root)
    training = None
    job_args = request.job_args
    if request.synthetic:
        if request.job != "throughput":
            raise FluxClusterError(f"--synthetic: only the throughput job takes it (got --job {request.job})")
        job_args = (*job_args, "--synthetic")
    if request.job in TRAINING_JOBS:
        from flux_cluster.config.workload import load_workload, resolve_training

        if load_workload(config.train.benchmark)[0].kind == "hf":
            if request.job != "train":
                raise FluxClusterError(
                    f"--job {request.job}: train.benchmark hf runs as --job train (it measures samples/s)"
                )
            config = _with_hf_paths(config)
            # what the workload resolved, in the run's system section too (compliance, report, sweeps)
            hf_train = resolve_training(config).train
            chosen = {key: getattr(hf_train, key) for key in ("mode", "precision", "parallel")}
            config = config.model_copy(update={"train": config.train.model_copy(update=chosen)})
        else:
            config = with_training_data(
                config, make=not request.dry_run, console=console, data=not request.synthetic
            )
        resolved_plan = resolve_training(config).model_copy(update={"micro_batch_auto": micro_batch_auto})
        if request.job == "train":  # a throughput job measures the batch as configured
            config, resolved_plan = fit_train_batch(config, resolved_plan, resolved)
            if (fit := resolved_plan.batch_fit) is not None:
                console.print(fit.describe(), markup=False, highlight=False, soft_wrap=True)
        training = resolved_plan.model_dump(mode="json")

    run_dir = create_run_dir(root, experiment, request.run_name or config.name)
    plan = make_plan(
        config,
        request.job,
        run_dir,
        experiment,
        seed_base,
        job_args,
        request.dependency,
        request.extra_minutes,
    )
    return plan, training


def write_run(
    plan: "JobPlan", training: dict | None = None, prepare: "Callable[[Path], None] | None" = None
) -> str:
    """Render the plan's script and write its run directory (config, script, log folder); prepare then
    writes what the job reads beside its config. Returns the script."""
    from flux_cluster.launch.render import render_script

    script = render_script(plan)
    prepare_run_dir(plan, script, training)
    if prepare is not None:
        prepare(plan.run_dir)
    return script


def launch_plan(
    plan: "JobPlan",
    *,
    dry_run: bool = False,
    training: dict | None = None,
    prepare: "Callable[[Path], None] | None" = None,
    console: "Console | None" = None,
    echo: bool = True,
) -> Launched:
    """The one way a planned job starts (submit, preflight, data stages, evaluate): its run directory
    written (write_run), then recorded as a dry run, run here (launcher local: returns when it has ended),
    or submitted to Slurm with its job ids in jobs.json. Prints nothing but a local job's own lines."""
    from flux_cluster.rundir import RunRecord

    try:
        script = write_run(plan, training, prepare)
        if dry_run:
            record = RunRecord(launcher="dry-run", job_ids=[], submitted_at=time.time())
            record.save(plan.run_dir)
            return Launched(plan.run_dir, plan, script, record)
        if plan.system.launcher == "local":
            return _run_here(plan, script, console or cli_console(stderr=True), echo)
        from flux_cluster.launch import slurm

        base_id = slurm.submit_script(script, plan.slurm_dir)
        job_ids = slurm.array_task_ids(base_id, plan.nexp) if plan.is_array else [base_id]
        record = RunRecord(launcher="slurm", job_ids=job_ids, submitted_at=time.time(), array=plan.is_array)
        record.save(plan.run_dir)
        return Launched(plan.run_dir, plan, script, record)
    except FluxClusterError as exc:
        raise FluxClusterError(f"{exc}{remove_unstarted(plan.run_dir)}") from None
    except BaseException:
        remove_unstarted(plan.run_dir)
        raise


def remove_unstarted(run_dir: Path) -> str:
    """Remove the folder of a run that never started (no jobs.json: sbatch refused it, or writing it
    failed), so it never becomes the 'latest' run; returns what to add to the error line. Atomic: the
    folder is renamed to a hidden name first (no run lists it), then removed."""
    import os
    import shutil

    from flux_cluster.rundir import jobs_file

    if not run_dir.is_dir() or jobs_file(run_dir).exists():
        return ""
    hidden = run_dir.with_name(f".{run_dir.name}.removing-{os.getpid()}")
    try:
        run_dir.rename(hidden)
    except OSError:
        hidden = run_dir
    shutil.rmtree(hidden, ignore_errors=True)
    return f" (nothing started: removed its run folder {run_dir})"


def require_slurm(config: "SystemConfig") -> None:
    """--submit on a system without Slurm is one line."""
    if config.launcher != "slurm":
        raise FluxClusterError(
            f"system {config.name} has no Slurm (launcher {config.launcher}); drop --submit"
        )


def warn_if_image_missing(config: "SystemConfig", console: "Console") -> None:
    """A missing .sqsh fails the job only when it starts, after its wait in the queue: say so now."""
    if config.container.runtime != "pyxis":
        return  # docker/podman images live on the compute nodes, not on this login node
    from flux_cluster.image.status import image_status

    status = image_status(config.container)
    if status is not None and status.present is False:
        console.print(
            f"warning: {status.detail}; the job fails at start unless the compute nodes see it "
            f"(build it: flux-cluster image build --system {config.name})",
            markup=False,
            highlight=False,
            soft_wrap=True,  # one line, whatever the width: scripts grep for it
        )


def check_slurm_path(path: Path) -> None:
    if not _SAFE_PATH.fullmatch(str(path)):
        raise FluxClusterError(
            f"{str(path)!r}: Slurm jobs need paths of letters, digits and _@+=./- only (no spaces); "
            "choose another (--runs-dir, --input, --output)"
        )


def with_training_data(
    config: "SystemConfig", make: bool, console: "Console", data: bool = True
) -> "SystemConfig":
    """Systems with train.synthetic_data get their dataset made here (once, on this host) when they name
    no data root (the user cache) or an existing empty one; other systems must name an existing prepared
    root. A named root that does not exist is an error, never created. data False (a throughput job on
    synthetic batches): no dataset at all."""
    from flux_cluster.data.prep.ensure import check_synthetic_root, default_root, ensure_synthetic_root

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
    if not data:  # no mount, no check on the nodes: a synthetic run reads no dataset
        return config.model_copy(update={"paths": config.paths.model_copy(update={"data_root": None})})
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
        ensure_synthetic_root(spec, root, console, explicit=bool(data_root))
    paths = config.paths.model_copy(update={"data_root": str(root)})
    return config.model_copy(update={"paths": paths})


def fit_train_batch(
    config: "SystemConfig", plan: "TrainingPlan", resolved: "ResolvedSystem"
) -> "tuple[SystemConfig, TrainingPlan]":
    """A train job's config and plan with the batch its train split holds (config/workload.fit_to_split):
    a fine-tuning run whose split this host reads (its Energon metadata) and holds less than one global
    batch takes the largest it holds where the batch is the system's default, or is one line naming values
    that work where the run chose it (ResolvedSystem.chosen). A split only the cluster reads (and the hf
    workload's data, loaded by the job) is fitted the same way at the job's start (plan.batch_default)."""
    from flux_cluster.config.batch_fit import BATCH_KEYS
    from flux_cluster.config.workload import fit_to_split
    from flux_cluster.data.format import split_size

    chosen = next((source for key in BATCH_KEYS if (source := resolved.chosen_for_run(key))), None)
    data_root = config.paths.data_root
    readable = plan.kind == "finetune" and data_root
    samples = split_size(Path(data_root), "train") if readable else None
    return fit_to_split(config, plan, samples, chosen)


def _with_hf_paths(config: "SystemConfig") -> "SystemConfig":
    """The hf workload reads hf.model and hf.data, no Energon root: on bare metal both are checked here and
    made absolute (the ranks start in the run directory); in containers they are the cluster's paths."""
    from flux_cluster.config.hf import SYNTHETIC

    hf = config.hf
    if config.container.runtime != "none" or hf.model is None or hf.data is None:
        return config  # a missing key is resolve_training's one line
    model = Path(hf.model)
    if not (model / "config.json").is_file():
        raise FluxClusterError(
            f"hf.model: {model} is not a model folder: expected config.json and weights (save_pretrained)"
        )
    update = {"model": str(model.absolute())}
    if hf.data != SYNTHETIC:
        if not Path(hf.data).exists():
            raise FluxClusterError(
                f"hf.data: {hf.data} does not exist: expected a local dataset or 'synthetic'"
            )
        update["data"] = str(Path(hf.data).absolute())
    return config.model_copy(update={"hf": hf.model_copy(update=update)})


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
    from flux_cluster.rundir import script_file, write_run_config

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
    write_atomic(script_file(plan.run_dir), script, mode=0o755)
    if plan.system.launcher == "slurm":  # the job reads them at run time, not from Slurm (README: Secrets)
        from flux_cluster.config.secrets import store_secrets

        store_secrets(plan.system.secrets)
    plan.slurm_dir.mkdir(exist_ok=True)  # Slurm opens --output there before the script starts


def _run_here(plan: "JobPlan", script: str, console: "Console", echo: bool) -> Launched:
    from rich.markup import escape

    from flux_cluster.launch.local_runner import run_local
    from flux_cluster.rundir import RunRecord, script_file
    from flux_cluster.runtime.exit_codes import NOT_CONVERGED_EXIT_CODE

    console.print(
        f"[bold]run[/bold] {plan.run_dir} ({plan.job.name} on {plan.system.name}, "
        f"{plan.ranks_per_node} local processes)"
    )
    code = run_local(script_file(plan.run_dir), plan.run_dir, echo=echo)
    from flux_cluster.launch.local_runner import local_state

    record = RunRecord.load(plan.run_dir)
    assert record is not None  # run_local saved it
    state = local_state(plan.run_dir, record)
    if code == 0:
        verdict = "[green]COMPLETED[/green]"
    elif state.startswith("CANCELLED"):  # 'flux-cluster cancel' stopped it
        verdict = f"[yellow]{escape(state)}[/yellow]"
    elif code == NOT_CONVERGED_EXIT_CODE and plan.job.writes_mlperf_log:
        verdict = f"[yellow]ENDED WITHOUT REACHING THE TARGET (exit {code})[/yellow]"
    else:
        verdict = f"[red]FAILED (exit {code})[/red]"
    console.print(f"[bold]run[/bold] {plan.run_dir}: {verdict}")
    return Launched(plan.run_dir, plan, script, record, exit_code=code)
