"""Data: prepare the MLCommons datasets and encode image folders, here or as jobs."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.data.prep.encode import EncodeSummary
    from flux_cluster.launch.data_jobs import StageJob


@dataclass
class DataRun:
    """What prepare_data or encode did. With submit: the stage jobs, chained (a dry run: their run
    directories and scripts, nothing submitted). Here: whether every stage passed (ok) and encode's
    summary; a dry run here: one line per stage it would run (planned)."""

    title: str = ""
    jobs: "list[StageJob]" = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    ok: bool = True
    summary: "EncodeSummary | None" = None


def prepare_data(
    system: str = "local",
    stage: str = "all",
    *,
    source: Path | None = None,
    output: Path | None = None,
    submit: bool = False,
    dry_run: bool = False,
    tasks: int | None = None,
    workers: int | None = None,
    shard_size: int | None = None,
    overrides: Sequence[str | tuple[str, str]] = (),
    runs_dir: Path | None = None,
    console: "Console | None" = None,
) -> DataRun:
    """prepare-data: the MLCommons preprocessed cc12m/coco data (source, or paths.source_root) into the
    Energon webdataset training reads (output, or paths.data_root); stage is download, convert, index, verify
    or all. Here (console: the stages' progress, default stderr) or, with submit, as chained Slurm jobs."""
    from flux_cluster.config import load_system as load
    from flux_cluster.console import cli_console
    from flux_cluster.data.prep import commands

    stages = commands.stage_list(stage, has_input=source is not None)
    sets = list(overrides)
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
    resolved = load(system, sets)
    explicit_size = resolved.source_of("data_prep.shard_size") != "default"
    config = commands.settle_shard_size(resolved.config, explicit_size)
    commands.check_roots(config)
    if "convert" in stages and "download" not in stages and not dry_run:
        commands.check_input(config)  # before anything runs or is submitted: bad input is a one-line error
    if submit:
        from flux_cluster.launch.data_jobs import submit_stages

        started = submit_stages(config, stages, runs_dir, dry_run)
        return DataRun(f"prepare-data on {config.name}", jobs=started)
    workers_here = commands.local_workers(config, workers)
    if dry_run:
        return DataRun(planned=commands.planned(config, stages, workers_here))
    return DataRun(ok=commands.run_here(config, stages, workers_here, console or cli_console(stderr=True)))


def encode(
    images: Path,
    output: Path,
    model: Path,
    *,
    resolution: int = 512,
    val_fraction: float = 0.1,
    max_sequence_length: int = 256,
    batch_size: int = 8,
    strict: bool = False,
    cache: Path | None = None,
    submit: bool = False,
    system: str | None = None,
    tasks: int | None = None,
    dry_run: bool = False,
    overrides: Sequence[str] | None = None,
    runs_dir: Path | None = None,
    console: "Console | None" = None,
) -> DataRun:
    """data encode: a folder of captioned images through the FLUX VAE, CLIP and T5 of a local diffusers
    pipeline (model) into an Energon root (output) for fine-tuning, the encodings cached for later runs.
    Here (console: progress, default stderr), or with submit as Slurm jobs on system (system, tasks,
    dry_run, overrides and runs_dir only with submit)."""
    from flux_cluster.console import cli_console
    from flux_cluster.data.prep import commands
    from flux_cluster.data.prep.encode import EncodeOptions

    commands.check_encode_output(images, output)
    options = EncodeOptions(
        images=images,
        output=output,
        model=model,
        resolution=resolution,
        val_fraction=val_fraction,
        max_sequence_length=max_sequence_length,
        strict=strict,
        batch_size=batch_size,
        cache=cache,
    )
    console = console or cli_console(stderr=True)
    if submit:
        from flux_cluster.launch.data_jobs import submit_encode

        sets: list[str | tuple[str, str]] = list(overrides or [])
        if tasks is not None:
            sets.append((f"data_prep.tasks={tasks}", "--tasks"))
        started = submit_encode(options, system or "local", sets, runs_dir, dry_run, console)
        return DataRun(f"data encode on {started[0].launched.plan.system.name}", jobs=started)
    given = {"system": system, "tasks": tasks, "overrides": overrides, "runs_dir": runs_dir}
    commands.only_with_submit(given | {"dry_run": dry_run or None}, "submit=True")
    return DataRun(summary=commands.encode_here(options, console))


def synth_hf(
    out: Path,
    kind: str,
    *,
    train: int = 256,
    val: int = 32,
    seed: int = 0,
    force: bool = False,
    console: "Console | None" = None,
) -> dict[str, int]:
    """data synth-hf: a tiny local dataset for the hf workload's task kind (text-classification: JSONL
    text+label; causal-lm: JSONL text; image-classification: an imagefolder), train/val splits, at out
    (then --set hf.data=OUT). Returns the samples written per split."""
    from flux_cluster.console import cli_console
    from flux_cluster.data.prep.synth_hf import synthesize_hf

    return synthesize_hf(
        out, kind, train=train, val=val, seed=seed, force=force, console=console or cli_console(stderr=True)
    )  # type: ignore[arg-type]
