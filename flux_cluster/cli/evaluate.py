"""flux-cluster evaluate: latency, CLIP score, validation loss and samples of a base and a fine-tuned FLUX."""

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flux_cluster.cli.console import cli_console, print_table
from flux_cluster.cli.options import RunsDirOption, SetOption
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.evaluate.run import EvalOptions


def evaluate(
    target: Annotated[
        Path,
        typer.Argument(
            help="A run directory (its results/best_<exp>/), LoRA weights (.safetensors or its folder), a "
            "fine-tuned transformer folder, or a pipeline folder alone (the base model)."
        ),
    ],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="The local FLUX pipeline folder (the base) \\[default: TARGET's pipeline, or a run's "
            "train.pretrained_path].",
            show_default=False,
        ),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts", help="Prompts, one per line \\[default: 8 built-in prompts].", show_default=False
        ),
    ] = None,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed generations per model.")] = 100,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed generations first.")] = 2,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps", min=1, help="Denoising steps \\[default: 4 schnell, 28 dev].", show_default=False
        ),
    ] = None,
    guidance: Annotated[
        float | None,
        typer.Option(
            "--guidance", min=0, help="Guidance \\[default: 0 schnell, 3.5 dev].", show_default=False
        ),
    ] = None,
    resolution: Annotated[
        int, typer.Option("--resolution", min=16, help="Square image size (pixels).")
    ] = 512,
    max_sequence_length: Annotated[
        int | None,
        typer.Option(
            "--max-sequence-length",
            min=1,
            help="T5 tokens \\[default: 256 schnell, 512 dev].",
            show_default=False,
        ),
    ] = None,
    clip: Annotated[
        Path | None,
        typer.Option(
            "--clip",
            help="A local CLIP folder (CLIPModel + CLIPProcessor) \\[default: the pipeline's clip/ or its "
            "text_encoder/ if that has a vision tower].",
            show_default=False,
        ),
    ] = None,
    exp: Annotated[int, typer.Option("--exp", min=0, help="A run's repeat: its results/best_<exp>/.")] = 0,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            help="The JSON to write outside a run \\[default: ./eval.json]; the grid goes beside it.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Prompt i is generated with seed + i.")] = 0,
    system: Annotated[
        str | None,
        typer.Option(
            "--system",
            "-s",
            help="The system it runs on, recorded in the JSON; with --submit, the Slurm system.",
        ),
    ] = None,
    submit: Annotated[
        bool, typer.Option("--submit", help="Run it as a Slurm job (one GPU) on --system.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="With --submit: write the run directory, print the job script.")
    ] = False,
    overrides: SetOption = None,
    runs_dir: RunsDirOption = None,
) -> None:
    """Inference latency (p50/p90/p99, images/s, peak memory), CLIP score, validation loss and a sample grid
    of the base model and its fine-tuned weights, in one process; results/eval_<k>.json in a run."""
    from flux_cluster.evaluate.run import EvalOptions

    if resolution % 16:
        raise FluxClusterError(
            f"--resolution {resolution}: expected a multiple of 16 (FLUX's latent patches)"
        )
    options = EvalOptions(
        target=target,
        model=model,
        prompts=prompts,
        runs=runs,
        warmup=warmup,
        steps=steps,
        guidance=guidance,
        resolution=resolution,
        max_sequence_length=max_sequence_length,
        clip=clip,
        exp=exp,
        output=output,
        seed=seed,
        system=system,
    )
    if submit:
        if system is None:
            raise FluxClusterError("--submit: name the Slurm system with --system")
        raise typer.Exit(_submit(options, system, list(overrides or []), runs_dir, dry_run))
    given = [
        flag
        for flag, value in {"--set": overrides, "--runs-dir": runs_dir, "--dry-run": dry_run or None}.items()
        if value
    ]
    if given:
        raise FluxClusterError(f"{', '.join(given)}: only with --submit (an evaluation here runs now)")
    _run_here(options)


def _run_here(options: "EvalOptions") -> None:
    from flux_cluster.evaluate.run import evaluate as run_evaluation

    console = cli_console(stderr=True)
    result = run_evaluation(options, log=lambda line: console.print(line, highlight=False, soft_wrap=True))
    print_table(cli_console(), results_table(result.document))
    if not result.document["meaningful"]:
        console.print(
            f"not meaningful: {result.document['meaningful_reason']}", highlight=False, soft_wrap=True
        )
    console.print(f"wrote {result.json_path} and {result.grid_path}", highlight=False, soft_wrap=True)


def results_table(document: dict[str, Any]) -> Any:
    """Base vs tuned: latency percentiles, images/s, peak memory, CLIP score, validation loss."""
    from rich.markup import escape
    from rich.table import Table

    latency, clip, val = document["latency"], document["clip_score"], document["val_loss"] or {}
    columns = ["base"] + (["tuned"] if latency["tuned"] else [])
    title = f"evaluate {document['target']} on {document['device']}"
    if not document["meaningful"]:
        title += " (figures not meaningful)"
    table = Table(title=escape(title))
    table.add_column("")
    for column in columns:
        table.add_column(column, justify="right")

    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        (f"{name} (s)", lambda c, key=key: number(latency[c][key], 3))
        for name, key in (("p50", "p50_s"), ("p90", "p90_s"), ("p99", "p99_s"), ("mean", "mean_s"))
    ]
    rows += [
        ("images/s", lambda c: number(latency[c]["images_per_s"], 2)),
        ("peak GB", lambda c: number(latency[c]["peak_memory_gb"], 2)),
        ("CLIP score", lambda c: number(clip[c], 2)),
        ("val loss", lambda c: number(val.get(c), 4)),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(c) for c in columns))
    return table


def _submit(
    options: "EvalOptions", system: str, sets: list[str], runs_dir: Path | None, dry_run: bool
) -> int:
    """One Slurm job running this same command; everything is checked here first, and the arguments go to
    the job in a file of its run directory (every path absolute), never into the script."""
    import dataclasses

    from flux_cluster.atomic import write_atomic
    from flux_cluster.cli.data import _require_slurm
    from flux_cluster.config import load_system
    from flux_cluster.evaluate import ARGS_FILE
    from flux_cluster.evaluate.clip import find_clip
    from flux_cluster.evaluate.job import JOB_MINUTES, evaluate_job_system
    from flux_cluster.evaluate.run import output_paths, pipeline_folder, read_prompts
    from flux_cluster.evaluate.target import resolve_target
    from flux_cluster.launch import slurm
    from flux_cluster.launch.plan import make_plan
    from flux_cluster.launch.render import render_script
    from flux_cluster.launch.rundir import RunRecord, create_run_dir, runs_root
    from flux_cluster.launch.submit import check_slurm_path, prepare_run_dir

    config = load_system(system, sets).config
    _require_slurm(config)
    target = resolve_target(options.target, options.exp)
    pipeline = pipeline_folder(target, options.model)
    read_prompts(options.prompts)
    clip = find_clip(pipeline, options.clip)
    output, _grid = output_paths(target, options.output)
    absolute = dataclasses.replace(
        options,
        target=options.target.absolute(),
        model=pipeline.absolute(),
        prompts=options.prompts.absolute() if options.prompts else None,
        clip=clip.absolute(),
        output=None if target.run_dir else output,
    )
    read_only = [absolute.target, absolute.model, absolute.clip, absolute.prompts, target.data_root]
    mounts = [f"{p}:{p}:ro" for p in read_only if p is not None]
    writable = (target.run_dir / "results") if target.run_dir else output.parent
    mounts.append(f"{writable.absolute()}:{writable.absolute()}")
    for mount in mounts:
        check_slurm_path(Path(mount.split(":")[0]))  # they become mount specifications: no ':' or ','
    config = evaluate_job_system(config, tuple(mounts))
    root = runs_root(runs_dir, config).absolute()
    check_slurm_path(root)
    run_dir = create_run_dir(root, "evaluate", config.name)
    plan = make_plan(config, "evaluate", run_dir, "evaluate", 0, extra_minutes=JOB_MINUTES)
    script = render_script(plan)
    prepare_run_dir(plan, script)
    write_atomic(run_dir / ARGS_FILE, json.dumps({"args": _argv(absolute)}, indent=1) + "\n")
    if dry_run:
        RunRecord(launcher="dry-run", job_ids=[], submitted_at=time.time()).save(run_dir)
        typer.echo(f"prepared {run_dir} (not submitted)", err=True)
        typer.echo(script, nl=False)
        return 0
    if not writable.exists():
        writable.mkdir(parents=True)  # a container mount's source must exist
    job_id = slurm.submit_script(script, plan.slurm_dir)
    RunRecord(launcher="slurm", job_ids=[job_id], submitted_at=time.time()).save(run_dir)
    cli_console(stderr=True).print(
        f"submitted evaluate job {job_id} on {config.name} ({run_dir}); follow it: flux-cluster logs "
        f"{run_dir} --follow",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def _argv(options: "EvalOptions") -> list[str]:
    """The command line that reproduces options (the job runs it)."""
    argv = [str(options.target)]
    flags = {
        "--model": options.model,
        "--prompts": options.prompts,
        "--runs": options.runs,
        "--warmup": options.warmup,
        "--steps": options.steps,
        "--guidance": options.guidance,
        "--resolution": options.resolution,
        "--max-sequence-length": options.max_sequence_length,
        "--clip": options.clip,
        "--exp": options.exp,
        "--output": options.output,
        "--seed": options.seed,
        "--system": options.system,
    }
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv
