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
    from flux_cluster.launch.data_jobs import StageJob

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
        from flux_cluster.launch.data_jobs import submit_stages

        started = submit_stages(config, stages, runs_dir, dry_run)
        raise typer.Exit(_print_stages(started, f"prepare-data on {config.name}", dry_run, wait))
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


def _print_stages(started: "list[StageJob]", title: str, dry_run: bool, wait: bool) -> int:
    """A dry run: each stage's script, in order; else the jobs as a table, and with --wait their ends."""
    from rich.table import Table

    if dry_run:
        for job in started:
            after = "" if job is started[0] else " --dependency=afterok:<job id of the stage before>"
            typer.echo(f"# ---- stage {job.stage}: sbatch{after} {job.launched.run_dir / 'job.sh'}")
            typer.echo(job.launched.script, nl=False)
        return 0
    console = cli_console(stderr=True)
    table = Table(title=title)
    for column in ("stage", "job", "tasks", "run directory"):
        table.add_column(column)
    for job in started:
        ids = job.launched.record.job_ids
        table.add_row(job.stage, ids[0].split("_")[0], str(len(ids)), str(job.launched.run_dir))
    print_table(console, table)
    console.print("follow a stage: flux-cluster logs RUN_DIR --follow")
    if not wait:
        return 0
    from flux_cluster.cli.launch import wait_for_jobs

    return wait_for_jobs([job_id for job in started for job_id in job.launched.record.job_ids])


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


@app.command()
def encode(
    images: Annotated[
        Path,
        typer.Argument(
            help="Folder of captioned images (imgs/ + metadata.json, metadata.jsonl, or .txt captions)."
        ),
    ],
    out: Annotated[Path, typer.Argument(help="The Energon root to write (then: --set paths.data_root=OUT).")],
    model: Annotated[
        Path,
        typer.Option(
            "--model", help="A local diffusers FLUX pipeline folder (vae/, text_encoder*/, tokenizer*/)."
        ),
    ],
    resolution: Annotated[
        int,
        typer.Option("--resolution", help="Square training size: short side resized, then center-cropped."),
    ] = 512,
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Share of images held out for the validation loss.")
    ] = 0.1,
    max_sequence_length: Annotated[
        int,
        typer.Option("--max-sequence-length", help="T5 tokens per caption (schnell: up to 256, dev: 512)."),
    ] = 256,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per encoder forward.")] = 8,
    strict: Annotated[
        bool, typer.Option("--strict", help="Refuse the folder at the first broken image or missing caption.")
    ] = False,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache",
            help="Encoded chunks, reused by later runs; with --submit on a file system the compute nodes "
            "share \\[default: ~/.cache/flux-cluster/encoded].",
        ),
    ] = None,
    submit: Annotated[
        bool,
        typer.Option(
            "--submit",
            help="Run as Slurm jobs: an encode array (a GPU per task where the system has GPUs), then "
            "a job writing OUT.",
        ),
    ] = False,
    system: Annotated[
        str | None, typer.Option("--system", "-s", help="With --submit: the Slurm system \\[default: local].")
    ] = None,
    tasks: Annotated[
        int | None,
        typer.Option("--tasks", help="With --submit: array tasks for encode \\[default: data_prep.tasks]."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="With --submit: wait for the jobs and report.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="With --submit: write the run directories, print the job scripts."),
    ] = False,
    overrides: SetOption = None,
    runs_dir: RunsDirOption = None,
) -> None:
    """Encode a folder of captioned images once (FLUX VAE, CLIP, T5) into an Energon root for fine-tuning."""
    from data_prep.encode import EncodeOptions, encode_folder

    if out.resolve() == images.resolve() or out.resolve().is_relative_to(images.resolve()):
        raise FluxClusterError(f"OUT {out}: inside the image folder {images}; write the dataset elsewhere")
    options = EncodeOptions(
        images=images,
        output=out,
        model=model,
        resolution=resolution,
        val_fraction=val_fraction,
        max_sequence_length=max_sequence_length,
        strict=strict,
        batch_size=batch_size,
        cache=cache,
    )
    if submit:
        sets: list[str | tuple[str, str]] = list(overrides or [])
        if tasks is not None:
            sets.append((f"data_prep.tasks={tasks}", "--tasks"))
        from flux_cluster.launch.data_jobs import submit_encode

        started = submit_encode(options, system or "local", sets, runs_dir, dry_run, cli_console(stderr=True))
        title = f"data encode on {started[0].launched.plan.system.name}"
        raise typer.Exit(_print_stages(started, title, dry_run, wait))
    submit_only = {"--system": system, "--tasks": tasks, "--set": overrides, "--runs-dir": runs_dir}
    submit_only |= {"--wait": wait or None, "--dry-run": dry_run or None}
    given = [flag for flag, value in submit_only.items() if value is not None]
    if given:
        raise FluxClusterError(f"{', '.join(given)}: only with --submit (a local encode runs here, now)")
    console = cli_console(stderr=True)
    summary = encode_folder(options, console, workers=min(4, os.cpu_count() or 1))
    console.print(
        f"encoded {summary.samples['train']:,} train and {summary.samples['val']:,} val images "
        f"({summary.layout}, {summary.resolution}px, {len(summary.skipped)} skipped) into {out}",
        soft_wrap=True,
        highlight=False,
    )
    typer.echo(
        f"fine-tune: flux-cluster submit --set train.benchmark=finetune --set train.mode=lora "
        f"--set train.pretrained_path={model.absolute()} --set paths.data_root={out.absolute()}"
    )


@app.command(name="demo-images")
def demo_images(
    out: Annotated[Path, typer.Argument(help="Folder to create (must not exist or be empty).")],
    count: Annotated[int, typer.Option("--count", min=2, help="Images to write.")] = 40,
    layout: Annotated[
        str, typer.Option("--layout", help="metadata.json (with imgs/), metadata.jsonl, or captions.txt.")
    ] = "metadata.json",
) -> None:
    """Write a small folder of generated, captioned images: something to try `data encode` on."""
    from data_prep.demo_images import write_image_folder

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FluxClusterError(f"{out}: exists and is not an empty folder; choose a new one")
    names = write_image_folder(out, layout, count, size=(96, 80))
    typer.echo(f"wrote {len(names)} captioned images ({layout}) to {out}")
