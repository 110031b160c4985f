"""train.micro_batch_size 'auto' (flux_cluster/training/batch_choice.py): the largest divisor of the per-rank
share that fits, checkpointing first; the config's one-line errors; what submit, the job and
--memory-estimate show and record."""

import json
import re
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.config import load_system
from flux_cluster.config.training import TrainConfig
from flux_cluster.config.workload import TrainingPlan, load_workload, resolve_training
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_plan import one_step_batch
from flux_cluster.rundir import list_runs, read_run_config
from flux_cluster.training.batch_choice import choose_micro_batch, divisors, resolve_micro_batch
from flux_cluster.training.memory import (
    LoraShape,
    auto_order,
    budget_gb,
    estimate_memory,
    lora_shape,
    resolve_checkpointing,
)

SMALL = load_workload("flux1")[0].models["small"]
SHARD, SHARE = 8, 64  # 512 samples over 8 ranks sharding one copy


def estimate(micro_batch: int, mode: str, share: int = SHARE) -> float:
    return estimate_memory(SMALL, SHARD, micro_batch, mode, gradients_held=share > micro_batch).total_gb


@pytest.mark.parametrize(
    ("gpu_gb", "configured", "micro_batch", "mode"),
    [
        (20, "auto", 64, "none"),  # the whole share fits without recomputation
        (6, "auto", 16, "none"),  # none fits 16, not 32
        (4, "auto", 16, "ops"),  # none fits only 8 (< 16): ops, at its largest
        (2.5, "auto", 16, "ops+9"),  # 9 of 12 blocks whole fit 16: less recompute than full at 32
        (4, "ops", 16, "ops"),  # a configured mode: its largest
        (20, "full", 64, "full"),
    ],
)
def test_the_largest_divisor_that_fits_wins_and_the_next_does_not_fit(
    gpu_gb: float, configured: str, micro_batch: int, mode: str
) -> None:
    choice = choose_micro_batch(SMALL, SHARD, SHARE, configured, gpu_gb)
    budget = 0.9 * gpu_gb
    assert (choice.micro_batch, choice.checkpointing) == (micro_batch, mode)
    assert choice.budget_gb == pytest.approx(budget) and choice.floor == 16
    assert choice.estimate_gb == estimate(micro_batch, mode) <= budget
    assert all(estimate(d, mode) > budget for d in divisors(SHARE) if d > micro_batch)
    if configured == "auto":  # less recompute fits nothing of at least 16
        order = auto_order(SMALL)
        earlier = order[: order.index(mode)]
        assert all(estimate(d, m) > budget for m in earlier for d in divisors(SHARE) if d >= 16)
    line = choice.describe()
    assert f"micro-batch auto -> {micro_batch} (of 64 per rank) with checkpointing {mode}" in line
    assert "below" not in line and "within" in line


def test_below_the_default_only_when_nothing_that_large_fits_and_it_says_so() -> None:
    squeezed = choose_micro_batch(SMALL, SHARD, SHARE, "auto", 1.3)  # full fits 2, not 4
    # at 2, the least recompute that fits: 11 of the 12 blocks checkpointed whole
    assert (squeezed.micro_batch, squeezed.checkpointing) == (2, "ops+11")
    assert estimate(2, "full") <= 0.9 * 1.3 < estimate(4, "full")
    assert estimate(2, "ops+11") <= 0.9 * 1.3 < estimate(2, "ops+10")
    assert "below 16: nothing larger fits in any mode" in squeezed.describe()
    nothing = choose_micro_batch(SMALL, SHARD, SHARE, "auto", 0.5)
    assert (nothing.micro_batch, nothing.checkpointing) == (
        1,
        "full",
    ) and ", over 0.5 GB" in nothing.describe()
    # a share under 16: the floor is the share's largest divisor up to 16, the whole share here
    small_share = choose_micro_batch(SMALL, SHARD, 8, "auto", 20)
    assert (small_share.micro_batch, small_share.floor, small_share.checkpointing) == (8, 8, "none")


@pytest.mark.parametrize("value", ["8", 8.0])
def test_a_micro_batch_pydantic_converts_still_loads(tmp_path: Path, value: object) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(f"extends: local\ntrain:\n  micro_batch_size: {json.dumps(value)}\n")
    assert load_system(str(site)).config.train.micro_batch_size == 8


def test_auto_is_refused_in_one_line_where_it_cannot_serve() -> None:
    cases = [
        ("local_slurm", [], "needs the system's gpu_memory_gb (system local_slurm sets none)"),
        ("dgx_h100x8", ["train.benchmark=finetune", "train.mode=lora", "train.pretrained_path=/x"], "flux1"),
    ]
    for name, sets, message in cases:
        system = load_system(name, ["train.micro_batch_size=auto", *sets]).config
        with pytest.raises(FluxClusterError, match=re.escape(message)):
            resolve_micro_batch(system)
    # ranks that do not divide the global batch: that, not a split at a micro-batch nobody set
    for sets, source in [
        (["nodes=3"], "512, from workload flux1.yaml"),
        (["train.global_batch_size=500"], "500, from system dgx_h100x8"),
    ]:
        system = load_system("dgx_h100x8", ["train.micro_batch_size=auto", *sets]).config
        with pytest.raises(FluxClusterError) as caught:
            resolve_micro_batch(system)
        world = system.nodes * system.gpus_per_node
        assert str(caught.value) == (
            f"train.micro_batch_size: 'auto' needs train.global_batch_size ({source}) to be a multiple of "
            f"the {world} ranks"
        )
    # a throughput sweep sizes the global batch from the micro-batch unless --set or the grid gives one
    with pytest.raises(FluxClusterError) as refused:
        one_step_batch(load_system("dgx_h100x8", ["train.micro_batch_size=auto"]).config)
    assert "--set train.global_batch_size=N (a throughput sweep otherwise sizes it from the micro-batch)" in (
        str(refused.value)
    )
    # resolving the plan without the estimate (no torch in the config layer) says who resolves it
    with pytest.raises(FluxClusterError, match="'auto' is resolved by 'flux-cluster submit'"):
        resolve_training(load_system("dgx_h100x8", ["train.micro_batch_size=auto"]).config)


@pytest.mark.parametrize("model", ["small", "flux-schnell"])
def test_checkpointing_auto_at_the_job_start_takes_the_recorded_mode_at_flux1_tokens(model: str) -> None:
    system = load_system("dgx_h100x8", ["train.micro_batch_size=auto", f"train.model={model}"]).config
    assert system.train.activation_checkpointing == "auto" and system.gpu_memory_gb is not None
    resolved, choice = resolve_micro_batch(system)
    assert choice is not None
    mode, how = resolve_checkpointing(resolve_training(resolved), system.gpu_memory_gb)  # 256/256 tokens
    assert how is not None and mode == choice.checkpointing
    assert how.estimate_gb == choice.estimate_gb and how.budget_gb == choice.budget_gb
    assert choice.budget_gb == budget_gb(system.gpu_memory_gb)


def test_the_choice_and_the_job_share_the_lora_shape() -> None:
    lora = TrainConfig(mode="lora", pretrained_path="/x", lora_rank=8, base_precision="nf4")
    assert lora_shape(lora) == LoraShape(8, tuple(lora.lora_targets), "nf4")
    assert lora_shape(TrainConfig()) is None


def test_submit_resolves_auto_and_the_run_records_it(cli: CliRunner, workdir: Path) -> None:
    sets = ["--set", "train.micro_batch_size=auto", "--set", "train.model=small"]
    result = cli.invoke(app, ["submit", "--system", "dgx_h100x8", "--dry-run", *sets])
    assert result.exit_code == 0, result.output
    assert "micro-batch auto -> 64 (of 64 per rank) with checkpointing none" in result.stderr
    (run_dir,) = list_runs(workdir / "runs")
    system, job = read_run_config(run_dir / "config.yaml")
    plan = TrainingPlan.model_validate(job["training"])
    assert system.train.micro_batch_size == plan.train.micro_batch_size == 64  # the number, for everyone
    assert plan.grad_accum_steps == 1 and plan.train.eval_batch_size == 64
    assert plan.micro_batch_auto is not None and plan.micro_batch_auto.checkpointing == "none"


def test_the_job_logs_the_choice_beside_the_checkpointing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from flux_cluster.training.loop import _log_micro_batch
    from flux_cluster.training.mlperf_log import MlperfLog

    system = load_system("dgx_h100x8", ["train.micro_batch_size=auto", "train.model=small"]).config
    resolved, choice = resolve_micro_batch(system)
    plan = resolve_training(resolved).model_copy(update={"micro_batch_auto": choice})
    log = MlperfLog(tmp_path / "result.txt", enabled=True)
    _log_micro_batch(plan, log, True)
    log.close()
    assert "micro-batch auto -> 64" in capsys.readouterr().out
    (line,) = (tmp_path / "result.txt").read_text().splitlines()
    event = json.loads(line.removeprefix(":::MLLOG "))
    assert event["key"] == "micro_batch_auto" and event["value"] == 64
    assert event["metadata"]["configured"] == "auto" and event["metadata"]["checkpointing"] == "none"


def test_memory_estimate_shows_what_auto_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[3] / "benchmarks"))
    try:
        from throughput.output import print_memory_estimate

        console = Console(record=True, width=300)
        args = Namespace(world_sizes=[64], batches=[8], checkpointing=["none"], gpu_gb=80.0)
        print_memory_estimate(args, console)
        text = console.export_text()
        line = "world 64, global batch 512: micro-batch auto -> 8 (of 8 per rank) with checkpointing none"
        assert line in text
    finally:
        for name in [m for m in sys.modules if m == "throughput" or m.startswith("throughput.")]:
            del sys.modules[name]  # benchmarks' package, not ours


def test_systems_show_says_what_auto_picks_or_why_it_cannot(cli: CliRunner) -> None:
    sets = ["--set", "train.micro_batch_size=auto", "--set", "train.model=small"]
    shown = cli.invoke(app, ["systems", "show", "dgx_h100x8", *sets])
    assert shown.exit_code == 0 and "micro-batch auto -> 64 (of 64 per rank)" in shown.output, shown.output
    cpu = cli.invoke(app, ["systems", "show", "local_slurm", "--set", "train.micro_batch_size=auto"])
    assert cpu.exit_code == 0 and "needs the system's gpu_memory_gb" in cpu.output, cpu.output
    fixed = cli.invoke(app, ["systems", "show", "dgx_h100x8"])
    assert "micro-batch auto" not in fixed.output
