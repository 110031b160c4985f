"""A fine-tuning run's batch against a small train split (config/batch_fit.py): what a default batch is
fitted to, what a batch the run chose is told, which batch counts as the run's choice, and that only the
train job (and a sweep's plan of train points) fits."""

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.config import load_system
from flux_cluster.config.batch_fit import fit_batch, largest_batch
from flux_cluster.config.loader import Override
from flux_cluster.config.workload import TrainingPlan
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_plan import (
    DERIVED_ORIGIN,
    SweepRequest,
    plan_sweep,
    point_overrides,
    print_plan,
)
from flux_cluster.rundir import list_runs, read_run_config
from flux_cluster.sweepdir import Point

LOCAL_FIT = (
    "batch: the train split holds 10 samples, fewer than the default global batch 16: this run takes "
    "global batch 10 (micro-batch 5 x 2 ranks); set train.global_batch_size and train.micro_batch_size "
    "to choose"
)
"""What a default batch (local's 16 = 8 x 2 ranks) on 10 train samples becomes."""


def encoded(root: Path, train: int, val: int = 1) -> Path:
    """An Energon root as far as submit reads it: its metadata's sample count per shard."""
    counts = {"train/shard_000000.tar": train, "val/shard_000000.tar": val}
    (root / ".nv-meta").mkdir(parents=True)
    (root / ".nv-meta" / ".info.json").write_text(json.dumps({"shard_counts": counts}))
    return root


def finetune_sets(workdir: Path, train: int) -> list[str]:
    (workdir / "flux").mkdir(exist_ok=True)
    data = workdir / f"data{train}"
    if not data.exists():
        encoded(data, train)
    return [
        "train.benchmark=finetune",
        "train.mode=lora",
        f"train.pretrained_path={workdir / 'flux'}",
        f"paths.data_root={data}",
    ]


def submit(workdir: Path, train: int, *sets: str, system: str = "local", job: str = "train") -> list[str]:
    args = ["submit", "--system", system, "--job", job, "--dry-run"]
    for item in (*finetune_sets(workdir, train), *sets):
        args += ["--set", item]
    return args


def last_plan(workdir: Path) -> TrainingPlan:
    return TrainingPlan.model_validate(
        read_run_config(list_runs(workdir / "runs")[-1] / "config.yaml")[1]["training"]
    )


def test_a_small_folder_fine_tunes_at_the_largest_batch_its_train_split_holds(
    cli: CliRunner, workdir: Path
) -> None:
    # seed 004: 11 edit pairs are 10 train samples; local's batch (16 = 8 x 2 ranks) is its train section's
    result = cli.invoke(app, submit(workdir, 10))
    assert result.exit_code == 0, result.output
    assert LOCAL_FIT in result.stderr.splitlines()
    (run_dir,) = list_runs(workdir / "runs")
    system, job = read_run_config(run_dir / "config.yaml")
    plan = TrainingPlan.model_validate(job["training"])
    assert (system.train.global_batch_size, system.train.micro_batch_size) == (10, 5)
    assert (plan.global_batch_size, plan.train.micro_batch_size, plan.grad_accum_steps) == (10, 5, 1)
    assert plan.batch_fit is not None and plan.batch_fit.describe() == LOCAL_FIT and plan.batch_default
    assert (plan.batch_fit.configured_global, plan.batch_fit.train_samples) == (16, 10)
    # a split that holds the default batch keeps it, without a line
    result = cli.invoke(app, submit(workdir, 40))
    assert result.exit_code == 0 and "batch:" not in result.stderr
    plan = last_plan(workdir)
    assert plan.global_batch_size == 16 and plan.batch_fit is None


def test_a_throughput_job_measures_the_batch_as_configured_on_a_small_split(
    cli: CliRunner, workdir: Path
) -> None:
    """Its figure is the configured batch's: never fitted, and a batch set for it is never refused."""
    result = cli.invoke(app, submit(workdir, 10, job="throughput"))
    assert result.exit_code == 0 and "batch:" not in result.stderr, result.output
    plan = last_plan(workdir)
    assert (plan.global_batch_size, plan.train.micro_batch_size, plan.batch_fit) == (16, 8, None)
    result = cli.invoke(app, submit(workdir, 10, "train.global_batch_size=16", job="throughput"))
    assert result.exit_code == 0, result.output
    assert last_plan(workdir).global_batch_size == 16


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            ["train.global_batch_size=16"],
            "fewer than one global batch (16 = micro-batch 8 x 2 ranks, from --set): set at most 10 "
            "(micro-batch x 2 ranks x accumulation steps), e.g. --set train.micro_batch_size=5 "
            "--set train.global_batch_size=10\n",
        ),
        (  # the most the split holds, and the most that keeps the run's micro-batch
            ["train.micro_batch_size=4"],
            "fewer than one global batch (16 = micro-batch 4 x 2 ranks x 2 accumulation steps, from --set): "
            "set at most 10 (micro-batch x 2 ranks x accumulation steps), e.g. "
            "--set train.micro_batch_size=5 --set train.global_batch_size=10; keeping micro-batch 4: "
            "--set train.micro_batch_size=4 "
            "--set train.global_batch_size=8\n",
        ),
        (["benchmarks.finetune.global_batch_size=12", "train.micro_batch_size=6"], "(12 = micro-batch 6 x 2"),
        (  # a mapping that names the batch chooses it (the path: conftest's workdir)
            ["train={benchmark: finetune, mode: lora, pretrained_path: flux, global_batch_size: 64}"],
            "(64 = micro-batch 16 x 2 ranks x 2 accumulation steps, from --set)",
        ),
    ],
)
def test_a_batch_the_run_chose_that_the_split_cannot_hold_names_values_that_work(
    cli: CliRunner, workdir: Path, sets: list[str], expected: str
) -> None:
    result = cli.invoke(app, submit(workdir, 10, *sets))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: train.global_batch_size: the train split has 10 samples")
    assert expected in result.stderr and result.stderr.count("\n") == 1
    assert not list_runs(workdir / "runs")


def test_a_mapping_without_the_batch_keys_and_a_sites_own_train_section_leave_the_batch_a_default(
    cli: CliRunner, workdir: Path
) -> None:
    """`--set train={...}` chooses only the keys it holds; a system file's train: section (a site's own, in
    a folder whose name looks like a workload section's source) is that system's default, as local's is."""
    pretrained = workdir / "flux"
    mapping = f"train={{benchmark: finetune, mode: lora, pretrained_path: {pretrained}}}"
    result = cli.invoke(app, submit(workdir, 10, mapping, "gpus_per_node=2"))
    assert result.exit_code == 0, result.output
    # local's train section went with the mapping: the schema's micro-batch 16 x 2 ranks is the default
    assert "fewer than the default global batch 32: this run takes global batch 10" in result.stderr
    folder = workdir / "site (benchmarks.finetune)"
    folder.mkdir()
    (folder / "site.yaml").write_text(
        "extends: local\ntrain:\n  global_batch_size: 12\n  micro_batch_size: 6\n"
    )
    result = cli.invoke(app, submit(workdir, 10, system=str(folder / "site.yaml")))
    assert result.exit_code == 0, result.output
    assert (
        "fewer than the default global batch 12: this run takes global batch 10 (micro-batch 5"
        in result.stderr
    )


def test_a_systems_finetune_section_is_the_runs_choice_and_fewer_samples_than_ranks_is_one_line(
    cli: CliRunner, workdir: Path
) -> None:
    site = workdir / "site.yaml"
    site.write_text("extends: local\nbenchmarks:\n  finetune:\n    global_batch_size: 16\n")
    result = cli.invoke(app, submit(workdir, 10, system=str(site)))
    assert result.exit_code == 2 and f"from {site.name} (benchmarks.finetune)" in result.stderr, result.output
    result = cli.invoke(app, submit(workdir, 3, "gpus_per_node=4", "train.micro_batch_size=4"))  # 4 ranks
    assert (
        result.exit_code == 2 and "fewer than the 4 ranks" in result.stderr and result.stderr.count("\n") == 1
    )


def test_flux1_keeps_its_batch_whatever_the_dataset(cli: CliRunner, workdir: Path) -> None:
    data = encoded(workdir / "data", 10)
    result = cli.invoke(app, ["submit", "--system", "local", "--dry-run", "--set", f"paths.data_root={data}"])
    assert result.exit_code == 0 and "batch:" not in result.stderr, result.output
    plan = last_plan(workdir)
    assert plan.global_batch_size == 16 and plan.batch_fit is None


@pytest.mark.parametrize(
    ("samples", "ranks", "micro", "accumulation", "expected"),
    [
        (10, 2, 8, 1, (10, 5)),  # each rank's share as one micro-batch
        (11, 2, 8, 1, (10, 5)),
        (10, 2, 4, 1, (8, 4)),  # the micro-batch is never larger than configured
        (30, 8, 2, 1, (16, 2)),
        (12, 1, 8, 1, (8, 8)),  # no accumulation where the configured batch had none
        (12, 1, 8, 2, (12, 6)),  # where it had some: 6 x 2 steps holds all 12
        (11, 1, 8, 4, (10, 5)),  # never micro-batch 1 x 11 steps: at most the configured 4 steps
        (16, 2, 4, 4, (16, 4)),  # equal batches: the largest micro-batch (4 x 2 x 2, not 2 x 2 x 4)
        (3, 4, 1, 1, None),
    ],
)
def test_largest_batch_is_the_largest_the_split_holds_within_the_configured_micro_batch_and_steps(
    samples: int, ranks: int, micro: int, accumulation: int, expected: tuple[int, int] | None
) -> None:
    assert largest_batch(samples, ranks, micro, accumulation) == expected


def test_a_default_batch_with_accumulation_keeps_at_most_its_steps() -> None:
    fit = fit_batch(12, 1, 32, 8, chosen=None)  # 32 = micro-batch 8 x 1 rank x 4 steps
    assert fit is not None and (fit.global_batch, fit.micro_batch) == (12, 6)
    assert "takes global batch 12 (micro-batch 6 x 1 ranks x 2 accumulation steps)" in fit.describe()


def test_a_throughput_sweeps_derived_batch_is_not_the_users_choice() -> None:
    point = Point(index=0, values={"train.micro_batch_size": "4"}, derived=["train.global_batch_size=8"])
    overrides = point_overrides(["train.benchmark=finetune"], point, here=False)
    assert Override("train.global_batch_size=8", DERIVED_ORIGIN, chosen=False) in overrides
    resolved = load_system("local", overrides)
    assert resolved.config.train.global_batch_size == 8
    assert resolved.source_of("train.global_batch_size") == DERIVED_ORIGIN
    assert resolved.chosen_for_run("train.global_batch_size") is None
    assert resolved.chosen_for_run("train.micro_batch_size") == "--set"  # the grid's value is the user's
    assert resolved.chosen_for_run("train.benchmark") == "--set"


def sweep(workdir: Path, grid: dict[str, list[str]], *sets: str) -> SweepRequest:
    overrides = [*finetune_sets(workdir, 10), *sets]
    return SweepRequest("local", grid, job="train", overrides=overrides, here=True)


def test_a_fine_tuning_sweep_plan_shows_the_batch_each_point_runs_and_refuses_a_bad_grid_up_front(
    workdir: Path,
) -> None:
    plan = plan_sweep(sweep(workdir, {"train.learning_rate": ["1e-4", "2e-4"]}))
    assert plan.global_batch == [10, 10] and plan.fits == [LOCAL_FIT]
    console = Console(width=200, record=True)
    print_plan(plan, console)
    assert LOCAL_FIT in console.export_text()
    with pytest.raises(FluxClusterError) as refused:
        plan_sweep(sweep(workdir, {"train.global_batch_size": ["8", "16"]}, "train.micro_batch_size=4"))
    assert str(refused.value).startswith(
        "sweep point 1 (global_batch_size=16): train.global_batch_size: the train split has 10 samples"
    )
    assert "set at most 10" in str(refused.value)
    assert not (workdir / "runs").exists()


def test_the_sweep_cli_dry_run_prints_the_fitted_batch(cli: CliRunner, workdir: Path) -> None:
    args = ["sweep", "--system", "local", "--job", "train", "--grid", "train.learning_rate=1e-4,2e-4"]
    for item in finetune_sets(workdir, 10):
        args += ["--set", item]
    result = cli.invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "this run takes global batch 10 (micro-batch 5 x 2 ranks)" in result.output
    assert not (workdir / "runs").exists()
