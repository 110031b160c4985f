"""Evaluation: latency, CLIP score and grids of a run, a checkpoint or a pipeline."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.api.runs import Run
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from collections.abc import Callable

    from flux_cluster.evaluate.run import EvalResult


@dataclass
class Evaluation:
    """What evaluate did: here, its result (the JSON document, the JSON and grid written); with submit, the
    job's run on the system named (a dry run: its run directory and script, nothing submitted)."""

    result: "EvalResult | None" = None
    run: Run | None = None
    system: str = ""
    output: Path | None = None
    """With submit: the JSON the job writes (a run's results/eval_<k>.json, k chosen when it is written;
    --output; else results/eval.json in the job's own run folder), its grid beside it."""


def evaluate(
    target: str | Path,
    *,
    model: str | Path | None = None,
    prompts: str | Path | None = None,
    runs: int = 12,
    warmup: int = 2,
    steps: int | None = None,
    guidance: float | None = None,
    resolution: int = 512,
    max_sequence_length: int | None = None,
    clip: str | Path | None = None,
    exp: int = 0,
    output: str | Path | None = None,
    seed: int = 0,
    system: str | None = None,
    submit: bool = False,
    overrides: Sequence[str] = (),
    runs_dir: Path | str | None = None,
    dry_run: bool = False,
    log: "Callable[[str], None]" = print,
) -> Evaluation:
    """Inference latency, CLIP score, validation loss and a sample grid of a base FLUX pipeline and its
    fine-tuned weights (TARGET: a run directory, LoRA weights, a transformer or a pipeline folder), as
    ``flux-cluster evaluate`` takes them. Here, in this process (torch loads; log: progress lines), or
    with submit as one Slurm job on system (one GPU), which runs the same library with these options
    (overrides, runs_dir and dry_run only with submit)."""
    from flux_cluster.evaluate.options import EvalOptions, check_options

    def path(value: str | Path | None) -> Path | None:
        return None if value is None else Path(value)

    options = EvalOptions(
        target=Path(target),
        model=path(model),
        prompts=path(prompts),
        runs=runs,
        warmup=warmup,
        steps=steps,
        guidance=guidance,
        resolution=resolution,
        max_sequence_length=max_sequence_length,
        clip=path(clip),
        exp=exp,
        output=path(output),
        seed=seed,
        system=system,
    )
    check_options(options)
    if submit:
        from flux_cluster.launch.evaluate_jobs import submit_evaluation

        if system is None:
            raise FluxClusterError("--submit: name the Slurm system with --system")
        launched, output = submit_evaluation(options, system, list(overrides), path(runs_dir), dry_run)
        return Evaluation(run=Run(launched.run_dir), system=launched.plan.system.name, output=output)
    given = {"--set": list(overrides), "--runs-dir": runs_dir, "--dry-run": dry_run or None}
    named = [flag for flag, value in given.items() if value]
    if named:
        raise FluxClusterError(f"{', '.join(named)}: only with --submit (an evaluation here runs now)")
    from flux_cluster.evaluate.run import evaluate as run_evaluation
    from flux_cluster.rundir import runs_root

    return Evaluation(result=run_evaluation(options, runs_root(None), log))
