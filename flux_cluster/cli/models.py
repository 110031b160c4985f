"""flux-cluster models: write model folders the tool can use offline."""

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from flux_cluster.cli.console import Typer
from flux_cluster.models.tiny import VARIANTS  # the module imports torch only when it writes

app = Typer(help="Write model folders that load offline (no hub needed).", no_args_is_help=True)


VariantChoice = StrEnum("VariantChoice", {variant: variant for variant in VARIANTS})


@app.command("tiny")
def tiny(
    out: Annotated[Path, typer.Argument(help="Folder to write the pipeline to (new or empty).")],
    variant: Annotated[
        VariantChoice,
        typer.Option(
            "--variant", help="schnell (no guidance, shift 1.0) or dev (guidance embedding, dynamic shift)."
        ),
    ] = VariantChoice["schnell"],
    seed: Annotated[
        int, typer.Option("--seed", help="Weight seed: the same seed writes identical files.")
    ] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT even if it is not empty.")] = False,
) -> None:
    """A tiny random-init FLUX pipeline (diffusers layout, loads with FluxPipeline.from_pretrained) for
    trying fine-tuning and data encoding without downloading FLUX."""
    from flux_cluster.models.tiny import write_tiny_pipeline  # imports torch and diffusers

    written = write_tiny_pipeline(out, variant=variant.value, seed=seed, force=force)
    typer.echo(f"wrote a tiny random-init FLUX.1-{variant.value} pipeline (seed {seed}) to {written}")
