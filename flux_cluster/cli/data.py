"""flux-cluster prepare-data, and the 'data' group (synth, info)."""

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import Typer, cli_console, print_table
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.config.schema import SystemConfig

app = Typer(help="Synthetic data and dataset inspection.", no_args_is_help=True)

StageOption = Annotated[
    str,
    typer.Option(
        "--stage", help="download, convert, index, verify, or all (download is skipped with --input)."
    ),
]


def prepare_data(
    system: SystemOption = "local",
    stage: StageOption = "all",
    source: Annotated[
        Path | None,
        typer.Option(
            "--input", help="The preprocessed source (overrides paths.source_root); nothing to download."
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="The Energon root to write (overrides paths.data_root).")
    ] = None,
    submit: Annotated[
        bool, typer.Option("--submit", help="Run the stages as chained Slurm jobs (convert as an array).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would run: the job scripts with --submit.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="With --submit: wait for the jobs and report.")
    ] = False,
    tasks: Annotated[
        int | None, typer.Option("--tasks", help="Array tasks for convert \\[default: data_prep.tasks].")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", help="Processes per task \\[default: data_prep.workers; locally: the CPU count]."
        ),
    ] = None,
    shard_size: Annotated[
        int | None, typer.Option("--shard-size", help="Samples per shard \\[default: data_prep.shard_size].")
    ] = None,
    overrides: SetOption = None,
    runs_dir: RunsDirOption = None,
) -> None:
    """Turn the MLCommons preprocessed cc12m/coco data into the Energon webdataset training reads."""
    from flux_cluster.config import load_system
    from flux_cluster.jobs import DATA_STAGES

    stages = _stages(stage, has_input=source is not None)
    sets: list[str | tuple[str, str]] = list(overrides or [])
    for value, key, flag in (
        (source, "paths.source_root", "--input"),
        (output, "paths.data_root", "--output"),
        (tasks, "data_prep.tasks", "--tasks"),
        (workers, "data_prep.workers", "--workers"),
        (shard_size, "data_prep.shard_size", "--shard-size"),
    ):
        if value is not None:
            shown = value.absolute() if isinstance(value, Path) else value
            sets.append((f"{key}={shown}", flag))
    resolved = load_system(system, sets)
    explicit_size = resolved.source_of("data_prep.shard_size") != "default"
    config = _settle_shard_size(resolved.config, explicit_size)
    assert set(stages) <= set(DATA_STAGES)
    paths = config.paths
    if (
        paths.source_root
        and paths.data_root
        and Path(paths.source_root).resolve() == Path(paths.data_root).resolve()
    ):
        raise FluxClusterError(f"--input and --output are the same folder ({paths.source_root}); use two")
    if "convert" in stages and "download" not in stages and not dry_run:
        _check_input(config)  # here, before anything runs or is submitted: bad input is a one-line error
    if submit:
        if config.launcher != "slurm":
            raise FluxClusterError(
                f"system {config.name} has no Slurm (launcher {config.launcher}); drop --submit"
            )
        raise typer.Exit(_submit_stages(config, stages, runs_dir, dry_run, wait))
    # Here, a local system uses every core unless told otherwise; a cluster system its configured workers.
    local_workers = (
        workers or (os.cpu_count() or 1) if config.launcher == "local" else config.data_prep.workers
    )
    raise typer.Exit(_run_here(config, stages, local_workers, dry_run))


def _settle_shard_size(config: "SystemConfig", explicit: bool) -> "SystemConfig":
    """Without an explicit shard size, continue an earlier conversion with the size it recorded."""
    from data_prep.convert import ConversionPlan

    if explicit or not config.paths.data_root:
        return config
    recorded = ConversionPlan.load(Path(config.paths.data_root))
    if recorded is None or recorded.shard_size == config.data_prep.shard_size:
        return config
    prep = config.data_prep.model_copy(update={"shard_size": recorded.shard_size})
    return config.model_copy(update={"data_prep": prep})


def _check_input(config: "SystemConfig") -> None:
    from data_prep.convert import ConversionPlan, check_compatible, make_plan
    from data_prep.source import SourceError
    from data_prep.stages import StagePaths

    source = StagePaths(Path(config.paths.source_root) if config.paths.source_root else None, None)
    try:
        plan = make_plan(source.need_source("convert"), config.data_prep.shard_size)
    except SourceError as exc:
        raise FluxClusterError(str(exc)) from None
    if config.paths.data_root:
        output = Path(config.paths.data_root)
        check_compatible(output, ConversionPlan.load(output), plan)


def _stages(stage: str, has_input: bool) -> list[str]:
    from flux_cluster.jobs import DATA_STAGES

    if stage == "all":
        return [s for s in DATA_STAGES if not (has_input and s == "download")]
    if stage not in DATA_STAGES:
        raise FluxClusterError(f"--stage {stage!r}: expected one of {', '.join(DATA_STAGES)} or all")
    if stage == "download" and has_input:
        raise FluxClusterError(
            "--stage download with --input: the input is already there, nothing to download"
        )
    return [stage]


def _run_here(config: "SystemConfig", stages: list[str], workers: int, dry_run: bool) -> int:
    from data_prep.stages import StagePaths, run_stage

    paths = StagePaths(
        Path(config.paths.source_root) if config.paths.source_root else None,
        Path(config.paths.data_root) if config.paths.data_root else None,
    )
    console = cli_console(stderr=True)
    if dry_run:
        for stage in stages:
            typer.echo(
                f"{stage}: source {paths.source or '-'} -> output {paths.output or '-'}, "
                f"{workers} worker(s), "
                f"shard size {config.data_prep.shard_size}"
            )
        return 0
    for stage in stages:
        started = time.monotonic()
        console.rule(f"[bold]{stage}")
        ok = run_stage(stage, paths, workers=workers, shard_size=config.data_prep.shard_size, console=console)  # type: ignore[arg-type]
        console.print(f"{stage}: {'done' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
        if not ok:
            return 1
    return 0


def _submit_stages(
    config: "SystemConfig", stages: list[str], runs_dir: Path | None, dry_run: bool, wait: bool
) -> int:
    from rich.table import Table

    from flux_cluster import slurm
    from flux_cluster.cli.launch import check_slurm_path, prepare_run_dir
    from flux_cluster.data_jobs import data_job_plan
    from flux_cluster.render import render_script
    from flux_cluster.rundir import RunRecord, create_run_dir, runs_root

    console = cli_console(stderr=True)
    root = runs_root(runs_dir, config).absolute()
    check_slurm_path(root)
    for key in ("source_root", "data_root"):
        value = getattr(config.paths, key)
        if value is not None:
            check_slurm_path(Path(value))
            # Pyxis and docker need a mount's source to exist; the source root is made only for a download.
            if not dry_run and (key == "data_root" or "download" in stages):
                Path(value).mkdir(parents=True, exist_ok=True)
    table = Table(title=f"prepare-data on {config.name}")
    for column in ("stage", "job", "tasks", "run directory"):
        table.add_column(column)
    dependency, all_ids = None, []
    for stage in stages:
        run_dir = create_run_dir(root, "prepare-data", f"{config.name}-{stage}")
        # A dry run has no job ids to chain: the printed scripts are submitted in order by hand.
        plan = data_job_plan(config, stage, run_dir, "prepare-data", None if dry_run else dependency)
        script = render_script(plan)
        prepare_run_dir(plan, script)
        if dry_run:
            RunRecord(launcher="dry-run", job_ids=[], submitted_at=time.time()).save(run_dir)
            after = "" if stage == stages[0] else " --dependency=afterok:<job id of the stage before>"
            typer.echo(f"# ---- stage {stage}: sbatch{after} {run_dir / 'job.sh'}")
            typer.echo(script, nl=False)
            continue
        base_id = slurm.submit_script(script, plan.slurm_dir)
        ids = slurm.array_task_ids(base_id, plan.nexp) if plan.is_array else [base_id]
        RunRecord(launcher="slurm", job_ids=ids, submitted_at=time.time(), array=plan.is_array).save(run_dir)
        all_ids += ids
        table.add_row(stage, base_id, str(plan.nexp), str(run_dir))
        dependency = f"afterok:{base_id}"
    if dry_run:
        return 0
    print_table(console, table)
    console.print("follow a stage: flux-cluster logs RUN_DIR --follow")
    if not wait:
        return 0
    states = slurm.wait_until_final(all_ids)
    console.print(", ".join(f"{job_id} {state}" for job_id, state in states.items()))
    return 0 if all(state == "COMPLETED" for state in states.values()) else 1


@app.command()
def synth(
    out: Annotated[
        Path, typer.Argument(help="Folder to write (cc12m_preprocessed/, coco_preprocessed/, ...).")
    ],
    train: Annotated[int, typer.Option("--train", help="Train samples.")] = 1024,
    val: Annotated[int, typer.Option("--val", help="Val samples (timesteps balanced across 0..7).")] = 256,
    dims: Annotated[
        str, typer.Option("--dims", help="tiny (CPU tests) or real (flux1 shapes, ~2 MB/sample).")
    ] = "tiny",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the data and its learnable map.")] = 0,
    source_format: Annotated[
        str, typer.Option("--format", help="arrow (HF save_to_disk, as downloaded) or parquet.")
    ] = "arrow",
    force: Annotated[bool, typer.Option("--force", help="Replace synthetic data already in OUT.")] = False,
) -> None:
    """Write synthetic data in the MLCommons preprocessed schema, learnable by a small model."""
    from data_prep.synthetic import synthesize

    if source_format not in ("arrow", "parquet"):
        raise FluxClusterError(f"--format {source_format!r}: expected arrow or parquet")
    synthesize(out, train=train, val=val, dims=dims, seed=seed, source_format=source_format, force=force)  # type: ignore[arg-type]
    typer.echo(f"wrote {train} train and {val} val samples ({dims} dims, {source_format}) to {out}")


@app.command()
def info(
    root: Annotated[Path, typer.Argument(help="An Energon root or a preprocessed download.")],
    load: Annotated[
        int,
        typer.Option("--load", help="Also read N train batches (and all of val) through the Energon loader."),
    ] = 0,
) -> None:
    """Shards, samples, bytes and splits of a dataset, and whether it is indexed for Energon."""
    from data_prep.info import describe, load_check

    console = cli_console()
    describe(root, console)
    if load > 0:
        load_check(root, load, console)
