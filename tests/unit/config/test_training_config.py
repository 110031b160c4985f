"""The train section and the workload file: presets by batch size, checks at submit time, the run's plan."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.config import load_system
from flux_cluster.config.workload import TrainingPlan, resolve_training
from flux_cluster.errors import FluxClusterError
from flux_cluster.rundir import list_runs, read_run_config


def plan_for(system: str, *sets: str) -> TrainingPlan:
    return resolve_training(load_system(system, list(sets)).config)


@pytest.mark.parametrize(
    ("gbs", "lr", "warmup", "eval_every"),
    [(512, 2e-4, 1600, 512), (1024, 2.5e-4, 800, 256), (2048, 2.5e-4, 0, 128), (4096, 4e-4, 100, 64)],
)
def test_batch_presets_carry_the_reference_lr_and_warmup(
    gbs: int, lr: float, warmup: int, eval_every: int
) -> None:
    plan = plan_for("dgx_h100x8", "nodes=4", f"train.global_batch_size={gbs}")
    assert (plan.learning_rate, plan.warmup_steps, plan.train.eval_every_steps) == (lr, warmup, eval_every)
    assert plan.grad_accum_steps == gbs // (16 * 32)
    assert (plan.dp_replicate, plan.dp_shard) == (4, 8)  # HSDP: replicate across nodes, shard within


def test_explicit_values_win_over_the_preset() -> None:
    plan = plan_for("dgx_h100x8", "train.learning_rate=1.9e-4", "train.warmup_steps=0", "train.dp_shard=8")
    assert (plan.learning_rate, plan.warmup_steps) == (1.9e-4, 0)
    assert plan.model_args.hidden == 3072 and plan.model_args.num_single_layers == 38


def test_gb200_nvl72_uses_nvidias_2304_preset() -> None:
    plan = plan_for("gb200_nvl72")
    assert plan.train.global_batch_size % plan.world_size == 0
    assert plan.learning_rate > 0


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["train.global_batch_size=768"], "no preset for 768"),
        (["train.global_batch_size=528"], "does not split over 8 ranks"),
        (["train.dp_shard=3"], "does not divide the 8 ranks"),
        (
            ["train.precision=fp8", "train.param_dtype=float32"],
            "precision 'fp8' needs param_dtype 'bfloat16'",
        ),
    ],
)
def test_bad_combinations_are_one_line_errors_before_anything_is_submitted(
    cli: CliRunner, workdir: Path, sets: list[str], message: str
) -> None:
    args = ["submit", "--system", "dgx_h100x8", "--dry-run"]
    for item in sets:
        args += ["--set", item]
    result = cli.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not list_runs(workdir / "runs")


def test_lora_needs_a_pretrained_checkpoint() -> None:
    with pytest.raises(FluxClusterError, match=r"mode 'lora' needs train.pretrained_path"):
        load_system("local", ["train.mode=lora"])


def test_the_run_config_holds_the_resolved_plan(cli: CliRunner, workdir: Path) -> None:
    result = cli.invoke(app, ["submit", "--system", "dgx_h100x8", "--dry-run", "--set", "nodes=2"])
    assert result.exit_code == 0, result.output
    (run_dir,) = list_runs(workdir / "runs")
    system, job = read_run_config(run_dir / "config.yaml")
    plan = TrainingPlan.model_validate(job["training"])
    assert plan.world_size == 16 and plan.grad_accum_steps == 2 and plan.learning_rate == 2e-4
    assert system.paths.data_root == "/lustre/mlperf/flux1/energon"


def test_missing_inputs_are_refused_at_submit(cli: CliRunner, workdir: Path) -> None:
    (workdir / "empty").mkdir()
    nowhere, empty = workdir / "nowhere", workdir / "empty"
    cases = [
        (["--set", "train.mode=lora", "--set", f"train.pretrained_path={nowhere}"], "is not a folder"),
        (["--set", "train.synthetic_data=null", "--set", f"paths.data_root={empty}"], "no Energon dataset"),
    ]
    for args, message in cases:
        result = cli.invoke(app, ["submit", "--system", "local", *args])
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert result.stderr.count("\n") == 1
    assert not list_runs(workdir / "runs")


def test_a_prepared_dataset_is_never_overwritten_by_synthetic_data(workdir: Path) -> None:
    from rich.console import Console

    from flux_cluster.config.training import SyntheticDataConfig
    from flux_cluster.data.prep.ensure import READY_FILE, ensure_synthetic_root

    root = workdir / "real"
    (root / READY_FILE).parent.mkdir(parents=True)
    (root / READY_FILE).write_text("{}")
    assert ensure_synthetic_root(SyntheticDataConfig(), root, Console(quiet=True)) == root
    assert sorted(p.name for p in root.rglob("*")) == [".info.json", ".nv-meta"]


def test_finetune_workload_resolves_epochs_and_learning_rates_by_mode_and_optimizer(tmp_path: Path) -> None:
    base = ("train.benchmark=finetune", f"train.pretrained_path={tmp_path}", "train.global_batch_size=512")
    lora = plan_for("dgx_h100x8", *base, "train.mode=lora")
    assert lora.fine_tuning and lora.mlperf is None
    assert (lora.learning_rate, lora.warmup_steps, lora.epochs) == (1e-4, 0, 10)
    # No quality target and no eval interval: the epochs end the run, an evaluation ends each epoch.
    assert lora.train.target is None and lora.train.eval_every_steps is None
    full = plan_for("dgx_h100x8", *base, "train.mode=finetune", "train.epochs=3")
    assert (full.learning_rate, full.epochs) == (1e-5, 3)
    prodigy = plan_for("dgx_h100x8", *base, "train.mode=lora", "train.optimizer=prodigy")
    assert prodigy.learning_rate == 1.0
    # flux1 still resolves its quality target from the workload file
    assert plan_for("dgx_h100x8").train.target == 0.586


def test_finetune_workload_refuses_pretraining() -> None:
    with pytest.raises(FluxClusterError, match=r"train.mode: 'pretrain' does not fine-tune"):
        plan_for("dgx_h100x8", "train.benchmark=finetune")


def test_a_systems_per_workload_values_apply_to_that_workload_only(tmp_path: Path) -> None:
    tuning = ("train.benchmark=finetune", "train.mode=lora", f"train.pretrained_path={tmp_path}")
    # local's flux1 demo: no preset at batch 16, so its own rate, warmup, eval interval and budget
    flux1 = plan_for("local")
    assert (flux1.learning_rate, flux1.warmup_steps, flux1.train.eval_every_steps) == (3e-3, 10, 50)
    assert flux1.train.max_samples == 16000 and flux1.global_batch_size == 16
    assert plan_for("local", *tuning).learning_rate == 3e-3  # local's tiny-model fine-tuning demo
    # local_gpu extends local yet fine-tunes a real checkpoint at the workload's rates, with no warmup,
    # eval interval or sample budget of flux1's
    gpu = plan_for("local_gpu", *tuning)
    assert (gpu.learning_rate, gpu.warmup_steps, gpu.train.eval_every_steps, gpu.train.max_samples) == (
        1e-4,
        0,
        None,
        None,
    )
    assert plan_for("local_gpu", *tuning[:1], "train.mode=finetune", tuning[2]).learning_rate == 1e-5
    assert plan_for("local_gpu").learning_rate == 1e-3
    # --set wins over the section, and the section itself can be set
    assert plan_for("local", "train.learning_rate=1e-2").learning_rate == 1e-2
    assert plan_for("local", "benchmarks.flux1.warmup_steps=3").warmup_steps == 3
    with pytest.raises(FluxClusterError, match="no preset for 16"):  # cleared: batch 16 has no rate then
        plan_for("local", "benchmarks={}")
    resolved = load_system("local")
    assert resolved.source_of("train.learning_rate") == "configs/systems/local.yaml (benchmarks.flux1)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("benchmarks:\n  flux1:\n    lerning_rate: 1.0e-3\n", "benchmarks.flux1.lerning_rate"),
        ("benchmarks:\n  flux2:\n    learning_rate: 1.0e-3\n", "benchmarks.flux2.learning_rate"),
        ("benchmarks:\n  flux1: 3\n", "benchmarks.flux1"),
    ],
)
def test_a_bad_per_workload_section_is_one_line_naming_file_and_key(
    text: str, problem: str, tmp_path: Path
) -> None:
    system = tmp_path / "site.yaml"
    system.write_text("extends: local\n" + text)
    with pytest.raises(FluxClusterError) as caught:
        load_system(str(system))
    message = str(caught.value)
    assert "\n" not in message and "site.yaml" in message and problem in message
    assert "expected benchmarks.<workload>.<train key> (workloads: finetune, flux1, hf)" in message


def test_gpu_systems_default_to_auto_checkpointing_resolved_by_their_gpu_memory() -> None:
    """Every GPU system states its GPU's memory and leaves activation checkpointing to 'auto', which the
    job resolves against it (training/memory.py); an explicit mode still wins; a CPU system's 'auto' is
    full (the default before 'auto'), and 'local' keeps its explicit false (none)."""
    from flux_cluster.training.memory import resolve_checkpointing

    expected = {"dgx_h100x8": 80, "dgx_h200x8": 141, "dgx_b200x8": 180, "gb200_nvl72": 186, "mi300x8": 192}
    expected |= {"mi325x8": 256, "mi355x8": 288, "local_gpu": 80, "ondemand_h100x8": 80}
    for name, gb in expected.items():
        system = load_system(name, []).config
        assert system.gpu_memory_gb == gb, name
        assert system.train.activation_checkpointing == "auto", name
    h100 = load_system("dgx_h100x8", []).config
    mode, choice = resolve_checkpointing(resolve_training(h100), h100.gpu_memory_gb)
    assert choice is not None and mode == choice.mode and choice.budget_gb == pytest.approx(72)
    assert choice.estimate_gb <= choice.budget_gb or mode == "full"
    explicit = plan_for("dgx_h100x8", "train.activation_checkpointing=ops")
    assert resolve_checkpointing(explicit, 80) == ("ops", None)
    cpu = plan_for("local_slurm", "train.activation_checkpointing=auto")
    assert resolve_checkpointing(cpu, load_system("local_slurm", []).config.gpu_memory_gb)[0] == "full"
    assert plan_for("local").train.activation_checkpointing == "none"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        *(("micro_batch_size", v, "an integer >= 1 or 'auto'") for v in ("big", 0, "true", 2.5, True)),
        *(("activation_checkpointing", v, "or ops+N (N >= 1)") for v in ("ops+0", "ops+", "ops+two", "opsx")),
    ],
)
def test_a_bad_micro_batch_or_checkpointing_is_one_line_naming_file_and_key(
    key: str, value: object, expected: str, tmp_path: Path
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(f"extends: local\ntrain:\n  {key}: {json.dumps(value)}\n")
    with pytest.raises(FluxClusterError) as caught:
        load_system(str(site))
    message = str(caught.value)
    assert "\n" not in message and "site.yaml" in message and f"train.{key}" in message
    assert expected in message


def test_ops_plus_n_is_a_mode_from_a_file_or_set_and_an_explicit_mode_wins_over_auto() -> None:
    from flux_cluster.training.memory import resolve_checkpointing

    plan = plan_for("dgx_h100x8", "train.activation_checkpointing=ops+3")
    assert plan.train.activation_checkpointing == "ops+3"
    assert resolve_checkpointing(plan, 80) == ("ops+3", None)


def test_systems_show_calls_fp8_experimental_with_its_measured_ratio(cli: CliRunner) -> None:
    from flux_cluster.config.training import FP8_STATUS

    fp8 = cli.invoke(app, ["systems", "show", "dgx_h100x8", "--set", "train.precision=fp8"])
    assert fp8.exit_code == 0 and FP8_STATUS in fp8.output and "1.16x" in FP8_STATUS
    bf16 = cli.invoke(app, ["systems", "show", "dgx_h100x8"])
    assert bf16.exit_code == 0 and "experimental" not in bf16.output


def test_the_checkpoint_modes_a_run_takes_are_one_public_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """config.training.is_checkpoint_mode: what a run trains with ('auto' only as the config's value,
    resolved before training), and what the throughput benchmark takes (--checkpointing, --cases)."""
    import sys

    from flux_cluster.config.training import is_checkpoint_mode

    taken = ("full", "alternate", "single", "ops", "none", "ops+1", "ops+12")
    refused = ("auto", "ops+0", "ops+", "ops+two", "opsx", "Full", "ops+01", "")
    assert all(is_checkpoint_mode(mode) for mode in taken)
    assert not any(is_checkpoint_mode(mode) for mode in refused)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[3] / "benchmarks"))
    from train_throughput import parse_args

    monkeypatch.setattr(sys, "argv", ["train_throughput.py", "--checkpointing", ",".join(taken)])
    assert parse_args().checkpointing == list(taken)
    for mode in refused[:-1]:
        for args in (["--checkpointing", mode], ["--cases", f"ours:{mode}"]):
            monkeypatch.setattr(sys, "argv", ["train_throughput.py", *args])
            with pytest.raises(SystemExit):
                parse_args()


def _float_fields() -> list[tuple[str, str]]:
    """(model, field) of every float setting of every config model (found, not listed: a new field or
    model is covered by the one rule and by this test)."""
    import typing

    from pydantic import BaseModel

    from flux_cluster.config import hf, schema, training, workload

    models = {
        value
        for module in (schema, training, workload, hf)
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
    }

    def has_float(annotation: object) -> bool:
        return annotation is float or any(has_float(arg) for arg in typing.get_args(annotation))

    return sorted(
        (model.__name__, name)
        for model in models
        for name, info in model.model_fields.items()
        if has_float(info.annotation)
    )


def test_every_float_setting_refuses_infinity_and_nan_by_one_rule() -> None:
    """train.learning_rate=1e400 and train.target=.inf were accepted (only NaN failed, by the bounds):
    every config model's floats are finite (config/section.py)."""
    from flux_cluster.config import hf, schema, training, workload

    fields = _float_fields()
    assert ("TrainConfig", "learning_rate") in fields and ("TrainConfig", "target") in fields
    assert ("SystemConfig", "price_per_gpu_hour") in fields and ("FinetuneFacts", "learning_rate") in fields
    for model_name, field in fields:
        model = next(vars(m)[model_name] for m in (schema, training, workload, hf) if model_name in vars(m))
        assert model.model_config.get("allow_inf_nan") is False, (model_name, field)


@pytest.mark.parametrize("value", ["1e400", ".inf", "-.inf", ".nan"])
@pytest.mark.parametrize(
    "key", ["train.learning_rate", "train.target", "price_per_gpu_hour", "hf.val_fraction"]
)
def test_an_infinite_setting_is_one_line_naming_the_key(value: str, key: str) -> None:
    with pytest.raises(FluxClusterError) as caught:
        load_system("local", [f"{key}={value}"])
    message = str(caught.value)
    assert f"{key}: got" in message and "expected a finite number" in message and "\n" not in message


def test_a_lora_rank_past_any_layers_width_is_one_line() -> None:
    with pytest.raises(FluxClusterError, match=r"train.lora_rank: got 10{20} \(int\), .*4096"):
        load_system("local", ["train.lora_rank=" + "1" + "0" * 20])
    assert load_system("local", ["train.lora_rank=4096"]).config.train.lora_rank == 4096
