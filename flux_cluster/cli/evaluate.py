"""flux-cluster evaluate: latency, CLIP score, validation loss and samples of a base and a fine-tuned FLUX."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flux_cluster.cli.console import cli_console, print_table
from flux_cluster.cli.options import RunsDirOption, SetOption
from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import DEFAULT_RUNS

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
            "--prompts",
            help="Prompts, one per line (at most 256 of 4,096 characters) \\[default: 8 built-in prompts].",
            show_default=False,
        ),
    ] = None,
    runs: Annotated[
        int,
        typer.Option(
            "--runs",
            min=1,
            help="Timed generations of each prompt (in turn), for each model.",
        ),
    ] = DEFAULT_RUNS,
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
            help="A local CLIP folder (CLIPModel + CLIPProcessor) \\[default: the pipeline's clip/, its "
            "text_encoder/ if that has a vision tower, else the CLIP model its text_encoder/ names, from the "
            "local Hugging Face cache].",
            show_default=False,
        ),
    ] = None,
    exp: Annotated[int, typer.Option("--exp", min=0, help="A run's repeat: its results/best_<exp>/.")] = 0,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            help="The JSON to write outside a run \\[default: runs/evaluate/TIME-NAME/eval.json]; the grid "
            "and the full-size images go beside it.",
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
    """One Slurm job running this same command (flux_cluster.launch.evaluate_jobs); prints what it did."""
    from flux_cluster.launch.evaluate_jobs import submit_evaluation

    launched = submit_evaluation(options, _argv, system, sets, runs_dir, dry_run)
    if dry_run:
        typer.echo(f"prepared {launched.run_dir} (not submitted)", err=True)
        typer.echo(launched.script, nl=False)
        return 0
    cli_console(stderr=True).print(
        f"submitted evaluate job {launched.record.job_ids[0]} on {launched.plan.system.name} "
        f"({launched.run_dir}); follow it: flux-cluster logs {launched.run_dir} --follow",
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
