"""flux-cluster prepare-data, and the 'data' group (synth, info)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flux_cluster.cli.console import Typer, cli_console, print_table
from flux_cluster.cli.options import RunsDirOption, SetOption, SystemOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.data.prep.encode import EncodeSummary
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
    from flux_cluster import api

    done = api.prepare_data(
        system,
        stage,
        source=source,
        output=output,
        submit=submit,
        dry_run=dry_run,
        tasks=tasks,
        workers=workers,
        shard_size=shard_size,
        overrides=overrides or [],
        runs_dir=runs_dir,
        console=cli_console(stderr=True),
    )
    if submit:
        raise typer.Exit(_print_stages(done.jobs, done.title, dry_run, wait))
    for line in done.planned:
        typer.echo(line)
    raise typer.Exit(0 if done.ok else 1)


def _print_stages(started: "list[StageJob]", title: str, dry_run: bool, wait: bool) -> int:
    """A dry run: each stage's script, in order; else the jobs as a table, and with --wait their ends."""
    from rich.table import Table

    from flux_cluster.rundir import script_file

    if dry_run:
        for job in started:
            after = "" if job is started[0] else " --dependency=afterok:<job id of the stage before>"
            typer.echo(f"# ---- stage {job.stage}: sbatch{after} {script_file(job.launched.run_dir)}")
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
    from flux_cluster.data.prep.synthetic import synthesize

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
    from flux_cluster.data.prep.info import describe, load_check

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
        typer.Option(
            "--resolution",
            help="Square training size (a multiple of 16, at most 4096): short side resized, then "
            "center-cropped.",
        ),
    ] = 512,
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Share of images held out for the validation loss.")
    ] = 0.1,
    max_sequence_length: Annotated[
        int,
        typer.Option(
            "--max-sequence-length", help="T5 tokens per caption, at most 512 (schnell: up to 256, dev: 512)."
        ),
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
    from flux_cluster import api
    from flux_cluster.data.prep.commands import only_with_submit

    if not submit:
        submit_only = {"--system": system, "--tasks": tasks, "--set": overrides, "--runs-dir": runs_dir}
        only_with_submit(submit_only | {"--wait": wait or None, "--dry-run": dry_run or None}, "--submit")
    console = cli_console(stderr=True)
    done = api.encode(
        images,
        out,
        model,
        resolution=resolution,
        val_fraction=val_fraction,
        max_sequence_length=max_sequence_length,
        batch_size=batch_size,
        strict=strict,
        cache=cache,
        submit=submit,
        system=system,
        tasks=tasks,
        dry_run=dry_run,
        overrides=overrides,
        runs_dir=runs_dir,
        console=console,
    )
    if submit:
        raise typer.Exit(_print_stages(done.jobs, done.title, dry_run, wait))
    assert done.summary is not None
    _print_encoded(console, done.summary, out, model)


def _print_encoded(console: "Console", summary: "EncodeSummary", out: Path, model: Path) -> None:
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
        str,
        typer.Option(
            "--layout",
            help="metadata.json (with imgs/), metadata.jsonl, or captions.txt; edit pairs for FLUX Kontext: "
            "edit-pairs (control_images/ + training_images/) or edit-pairs.jsonl.",
        ),
    ] = "metadata.json",
) -> None:
    """Write a small folder of generated, captioned images: something to try `data encode` on."""
    from flux_cluster.data.prep.demo_images import write_image_folder

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FluxClusterError(f"{out}: exists and is not an empty folder; choose a new one")
    names = write_image_folder(out, layout, count, size=(96, 80))
    typer.echo(f"wrote {len(names)} captioned images ({layout}) to {out}")


@app.command(name="synth-hf")
def synth_hf(
    out: Annotated[Path, typer.Argument(help="Folder to write (new or empty); then --set hf.data=OUT.")],
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help="text-classification (train/val.jsonl, text+label), causal-lm (train/val.jsonl, text) or "
            "image-classification (an imagefolder: train/ and val/, a folder per class, 32x32 PNGs).",
        ),
    ],
    train: Annotated[int, typer.Option("--train", min=1, help="Train samples.")] = 256,
    val: Annotated[int, typer.Option("--val", min=0, help="Val samples (0: no val split).")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Seed: the same seed writes the same data.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT even if it is not empty.")] = False,
) -> None:
    """Write a tiny local dataset for the hf workload (--set train.benchmark=hf), learnable by the models
    of `flux-cluster models tiny --kind bert|gpt2|vit`."""
    from flux_cluster import api

    counts = api.synth_hf(out, kind, train=train, val=val, seed=seed, force=force)
    typer.echo(
        f"wrote {counts['train']} train and {counts['val']} val samples ({kind}) to {out}: "
        f"--set hf.data={out.absolute()} --set hf.task={kind}"
    )
