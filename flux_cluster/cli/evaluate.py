"""flux-cluster evaluate: latency, CLIP score, validation loss and samples of a base and a fine-tuned FLUX;
a thin layer over flux_cluster.api.evaluate."""

from pathlib import Path
from typing import Annotated

import typer

from flux_cluster.cli.console import cli_console
from flux_cluster.cli.options import RunsDirOption, SetOption
from flux_cluster.evaluate import DEFAULT_RUNS

TargetArgument = Annotated[
    Path,
    typer.Argument(
        help="A run directory (its results/best_<exp>/), LoRA weights (.safetensors or its folder), a "
        "fine-tuned transformer folder, or a pipeline folder alone (the base model)."
    ),
]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        "--model",
        help="The local FLUX pipeline folder (the base) \\[default: TARGET's pipeline, or a run's "
        "train.pretrained_path].",
        show_default=False,
    ),
]
PromptsOption = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        help="Prompts, one per line (at most 256 of 4,096 characters) \\[default: 8 built-in prompts].",
        show_default=False,
    ),
]
RunsOption = Annotated[
    int,
    typer.Option(
        "--runs",
        min=1,
        help="Timed generations of each prompt (in turn), for each model.",
    ),
]
WarmupOption = Annotated[int, typer.Option("--warmup", min=0, help="Untimed generations first.")]
StepsOption = Annotated[
    int | None,
    typer.Option(
        "--steps", min=1, help="Denoising steps \\[default: 4 schnell, 28 dev].", show_default=False
    ),
]
GuidanceOption = Annotated[
    float | None,
    typer.Option("--guidance", min=0, help="Guidance \\[default: 0 schnell, 3.5 dev].", show_default=False),
]
ResolutionOption = Annotated[
    int, typer.Option("--resolution", help="Square image size (pixels: a multiple of 16, at most 4096).")
]
MaxSequenceLengthOption = Annotated[
    int | None,
    typer.Option(
        "--max-sequence-length",
        help="T5 tokens, at most 512 \\[default: 256 schnell, 512 dev].",
        show_default=False,
    ),
]
ClipOption = Annotated[
    Path | None,
    typer.Option(
        "--clip",
        help="A local CLIP folder (CLIPModel + CLIPProcessor) \\[default: the pipeline's clip/, its "
        "text_encoder/ if that has a vision tower, else the CLIP model its text_encoder/ names, from the "
        "local Hugging Face cache].",
        show_default=False,
    ),
]
ExpOption = Annotated[int, typer.Option("--exp", min=0, help="A run's repeat: its results/best_<exp>/.")]
OutputOption = Annotated[
    Path | None,
    typer.Option(
        "--output",
        help="The JSON to write when TARGET is not a run \\[default: runs/evaluate/TIME-NAME/eval.json; "
        "with --submit, results/eval.json in the job's run folder]; the grid and the full-size images go "
        "beside it.",
        show_default=False,
    ),
]
SeedOption = Annotated[
    int, typer.Option("--seed", help="Prompt i is generated with seed + i (0 to 2**63 - 1).")
]
SystemOption = Annotated[
    str | None,
    typer.Option(
        "--system",
        "-s",
        help="The system it runs on, recorded in the JSON; with --submit, the Slurm system.",
    ),
]
SubmitOption = Annotated[bool, typer.Option("--submit", help="Run it as a Slurm job (one GPU) on --system.")]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="With --submit: write the run directory, print the job script.")
]


def evaluate(
    target: TargetArgument,
    model: ModelOption = None,
    prompts: PromptsOption = None,
    runs: RunsOption = DEFAULT_RUNS,
    warmup: WarmupOption = 2,
    steps: StepsOption = None,
    guidance: GuidanceOption = None,
    resolution: ResolutionOption = 512,
    max_sequence_length: MaxSequenceLengthOption = None,
    clip: ClipOption = None,
    exp: ExpOption = 0,
    output: OutputOption = None,
    seed: SeedOption = 0,
    system: SystemOption = None,
    submit: SubmitOption = False,
    dry_run: DryRunOption = False,
    overrides: SetOption = None,
    runs_dir: RunsDirOption = None,
) -> None:
    """Inference latency (p50/p90/p99, images/s, peak memory), CLIP score, validation loss and a sample grid
    of the base model and its fine-tuned weights, in one process; results/eval_<k>.json in a run."""
    from flux_cluster import api
    from flux_cluster.evaluate.show import show_result

    console = cli_console(stderr=True)
    done = api.evaluate(
        target,
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
        submit=submit,
        overrides=overrides or [],
        runs_dir=runs_dir,
        dry_run=dry_run,
        log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
    )
    if done.result is not None:
        show_result(done.result)
        return
    assert done.run is not None
    run = done.run
    if dry_run:
        typer.echo(f"prepared {run.run_dir} (not submitted)", err=True)
        typer.echo(run.script(), nl=False)
        return
    console.print(
        f"submitted evaluate job {run.job_ids[0]} on {done.system} ({run.run_dir}); it writes {done.output}; "
        f"follow it: flux-cluster logs {run.run_dir} --follow",
        highlight=False,
        soft_wrap=True,
    )
