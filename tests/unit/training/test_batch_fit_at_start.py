"""The job's side of the batch fit (training/context.fit_batch_at_start): a train split submit could not
read (a path only the cluster sees) gets the fit submit would have made, the same line, where the batch
was the system's default, and one line naming values that work where the run chose it."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.config.workload import TrainingPlan
from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import list_runs, read_run_config
from flux_cluster.training.context import JobContext, Schedule, fit_batch_at_start


def job_context(cli: CliRunner, workdir: Path, *sets: str, data: str = "/cluster/encoded") -> JobContext:
    """A fine-tuning run submitted (dry run) with a data root this host cannot read, as its job reads it."""
    (workdir / "flux").mkdir(exist_ok=True)
    args = ["submit", "--system", "local", "--dry-run"]
    for item in (
        "train.benchmark=finetune",
        "train.mode=lora",
        f"train.pretrained_path={workdir / 'flux'}",
        "train.synthetic_data=null",
        f"paths.data_root={data}",
        *sets,
    ):
        args += ["--set", item]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    run_dir = list_runs(workdir / "runs")[-1]
    system, job = read_run_config(run_dir / "config.yaml")
    return JobContext(
        system=system,
        plan=TrainingPlan.model_validate(job["training"]),
        run_dir=run_dir,
        data_dir=Path(data),
        exp_index=0,
        seed=1,
        result_log=run_dir / "results" / "result_0.txt",
        cache_cleared=False,
        config_filename="config.yaml",
    )


def test_the_job_fits_a_default_batch_as_submit_would(cli: CliRunner, workdir: Path) -> None:
    ctx = job_context(cli, workdir)  # submit read nothing: no line, the configured batch
    assert ctx.plan.batch_default and ctx.plan.global_batch_size == 16 and ctx.plan.batch_fit is None
    fitted = fit_batch_at_start(ctx, 10)
    plan = fitted.plan
    assert (plan.global_batch_size, plan.train.micro_batch_size, plan.grad_accum_steps) == (10, 5, 1)
    assert plan.train.eval_batch_size == 5 and plan.learning_rate == ctx.plan.learning_rate
    assert (fitted.system.train.global_batch_size, fitted.system.train.micro_batch_size) == (10, 5)
    assert plan.batch_fit is not None and plan.batch_fit.describe() == (
        "batch: the train split holds 10 samples, fewer than the default global batch 16: this run takes "
        "global batch 10 (micro-batch 5 x 2 ranks); set train.global_batch_size and train.micro_batch_size "
        "to choose"
    )
    assert Schedule.of(plan, 10).steps_per_epoch == 1
    # where submit reads the split, it makes the same fit: the same plan and system section
    data = workdir / "readable"
    (data / ".nv-meta").mkdir(parents=True)
    counts = {"train/shard_000000.tar": 10, "val/shard_000000.tar": 1}
    (data / ".nv-meta" / ".info.json").write_text(json.dumps({"shard_counts": counts}))
    at_submit = job_context(cli, workdir, data=str(data))
    assert at_submit.plan == plan and at_submit.system.train == fitted.system.train
    assert fit_batch_at_start(at_submit, 10).plan == plan  # the job keeps it (and logs its line)
    # a split that holds the batch: unchanged
    assert fit_batch_at_start(ctx, 16).plan == ctx.plan


def test_the_job_refuses_a_batch_the_run_chose_in_one_line(cli: CliRunner, workdir: Path) -> None:
    ctx = job_context(cli, workdir, "train.global_batch_size=16")
    assert not ctx.plan.batch_default
    with pytest.raises(FluxClusterError) as refused:
        fit_batch_at_start(ctx, 10)
    assert str(refused.value) == (
        "train.global_batch_size: the train split has 10 samples, fewer than one global batch (16 = "
        "micro-batch 8 x 2 ranks, from the run's config): set at most 10 (micro-batch x 2 ranks x "
        "accumulation steps), e.g. --set train.micro_batch_size=5 --set train.global_batch_size=10"
    )
