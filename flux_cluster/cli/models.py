"""flux-cluster models: write model folders the tool can use offline."""

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from flux_cluster.cli.console import Typer
from flux_cluster.models.tiny import VARIANTS  # the module imports torch only when it writes
from flux_cluster.models.tiny_hf import KINDS as HF_KINDS
from flux_cluster.models.tiny_hf import TASKS as HF_TASKS

app = Typer(help="Write model folders that load offline (no hub needed).", no_args_is_help=True)


VariantChoice = StrEnum("VariantChoice", {variant: variant for variant in VARIANTS})
KindChoice = StrEnum("KindChoice", {kind: kind for kind in ("flux", "kontext", *HF_KINDS)})


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
    kind: Annotated[
        KindChoice,
        typer.Option(
            "--kind",
            help="flux (FluxPipeline) or kontext (FluxKontextPipeline, for edit-pair fine-tuning); "
            "bert, gpt2, vit: a Hugging Face model for the hf workload (text-classification, causal-lm, "
            "image-classification) with its tokenizer or image processor.",
        ),
    ] = KindChoice["flux"],
) -> None:
    """A tiny random-init FLUX pipeline (diffusers layout, loads with FluxPipeline.from_pretrained) for
    trying fine-tuning and data encoding without downloading FLUX. --kind bert|gpt2|vit: a tiny Hugging
    Face model that AutoModelFor....from_pretrained(OUT, local_files_only=True) loads, for the hf workload."""
    if kind.value in HF_KINDS:
        from flux_cluster.models.tiny_hf import write_tiny_hf  # imports torch and transformers

        written = write_tiny_hf(out, kind=kind.value, seed=seed, force=force)
        typer.echo(
            f"wrote a tiny random-init {kind.value} model (seed {seed}) to {written}: "
            f"--set hf.model={written.absolute()} --set hf.task={HF_TASKS[kind.value]}"
        )
        return
    from flux_cluster.models.tiny import write_tiny_pipeline  # imports torch and diffusers

    kontext = kind.value == "kontext"
    written = write_tiny_pipeline(out, variant=variant.value, seed=seed, force=force, kontext=kontext)
    name = "Kontext-dev" if kontext else variant.value
    typer.echo(f"wrote a tiny random-init FLUX.1-{name} pipeline (seed {seed}) to {written}")


class QuantizedPrecision(StrEnum):
    fp8 = "fp8"
    nf4 = "nf4"


@app.command("quantize")
def quantize(
    source: Annotated[
        Path, typer.Argument(help="A local diffusers FLUX checkpoint (pipeline or transformer).")
    ],
    out: Annotated[Path, typer.Argument(help="New folder for the quantized transformer.")],
    precision: Annotated[
        QuantizedPrecision, typer.Option("--precision", help="fp8 (e4m3, per-channel scales) or nf4 (4-bit).")
    ],
) -> None:
    """Write SOURCE's transformer with its linear weights quantized as LoRA training on a quantized base
    stores them (train.base_precision fp8 or nf4), so a run loads a half (fp8) or quarter (nf4) of the
    bf16 bytes: --set train.pretrained_path=OUT --set train.base_precision=PRECISION."""
    from flux_cluster.training.pretrained import save_quantized  # imports torch and diffusers

    written = save_quantized(source, out, precision.value)
    typer.echo(
        f"wrote a {precision.value} transformer to {written}: --set train.pretrained_path="
        f"{written.absolute()} --set train.base_precision={precision.value}"
    )
