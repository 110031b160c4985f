"""The hf workload's config: resolution of train.benchmark hf (defaults, one-line refusals), the FLUX
workloads left as they were, and dp's one process per node in the job scripts."""

import pytest

from flux_cluster.config import load_system
from flux_cluster.config.workload import resolve_training
from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.plan import make_plan
from flux_cluster.launch.render import render_script

HF = ["train.benchmark=hf", "hf.model=/models/bert", "hf.task=text-classification", "hf.data=synthetic"]


def _plan(*sets: str, system: str = "local"):
    return resolve_training(load_system(system, [*HF, *sets]).config)


def test_hf_defaults_are_the_seeds_basic_scenario() -> None:
    plan = _plan()
    cfg = plan.train
    assert (plan.kind, cfg.mode, cfg.precision, cfg.parallel) == ("hf", "finetune", "fp32", "ddp")
    assert cfg.lora_targets == []  # the architecture's default targets, chosen on the rank
    assert (plan.epochs, plan.learning_rate, plan.global_batch_size) == (1, 5e-5, 16)
    assert plan.fine_tuning


def test_hf_keeps_what_the_user_set() -> None:
    cfg = _plan(
        "train.mode=lora", "train.precision=amp-fp16", "train.parallel=fsdp", "train.lora_targets=[query]"
    ).train
    assert (cfg.mode, cfg.precision, cfg.parallel, cfg.lora_targets) == (
        "lora",
        "amp-fp16",
        "fsdp",
        ["query"],
    )
    assert _plan("train.mode=lora").learning_rate == 2e-4


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (
            ["train.precision=bf16"],
            "train.precision: 'bf16' is for the FLUX workloads; workload hf.yaml takes fp32",
        ),
        (["train.mode=pretrain"], "train.mode: workload hf.yaml takes 'finetune' or 'lora'"),
        (["train.optimizer=prodigy"], "train.optimizer: workload hf.yaml takes 'adamw'"),
        (["train.parallel=dp", "nodes=2", "launcher=slurm"], "train.parallel: 'dp' is one process"),
    ],
)
def test_hf_refuses_in_one_line(sets: list[str], says: str) -> None:
    with pytest.raises(FluxClusterError, match="^" + says.replace("(", r"\(")) as error:
        _plan(*sets)
    assert "\n" not in str(error.value)


def test_hf_needs_model_task_and_data() -> None:
    with pytest.raises(FluxClusterError, match=r"^hf\.model: workload hf\.yaml needs it"):
        resolve_training(load_system("local", ["train.benchmark=hf"]).config)


def test_flux_workloads_unchanged_and_refuse_hf_values() -> None:
    flux = resolve_training(load_system("local", []).config).train
    assert (flux.precision, flux.parallel, flux.mode) == ("bf16", None, "pretrain")
    assert flux.lora_targets == ["to_q", "to_k", "to_v", "to_out.0"]
    with pytest.raises(FluxClusterError, match=r"^train\.precision: 'amp-bf16' is for train\.benchmark hf"):
        resolve_training(load_system("local", ["train.precision=amp-bf16"]).config)
    with pytest.raises(FluxClusterError, match=r"^train\.parallel: 'ddp' is for train\.benchmark hf"):
        resolve_training(load_system("local", ["train.parallel=ddp"]).config)


@pytest.mark.parametrize(
    ("system", "parallel", "ranks"), [("local", "dp", 1), ("local", "ddp", 2), ("dgx_h100x8", "dp", 1)]
)
def test_dp_runs_one_process_per_node(tmp_path, system: str, parallel: str, ranks: int) -> None:
    sets = (
        [*HF, f"train.parallel={parallel}", "nodes=1"]
        if system != "local"
        else [*HF, f"train.parallel={parallel}"]
    )
    config = load_system(system, sets).config
    plan = make_plan(config, "train", tmp_path, "hf", 1)
    assert plan.ranks_per_node == ranks
    script = render_script(plan)
    if system == "local":
        assert f"--nproc-per-node={ranks} " in script
    else:
        assert f"#SBATCH --ntasks-per-node={ranks}\n" in script
        assert f"on_ranks() {{ srun --ntasks-per-node={ranks} " in script
        assert "#SBATCH --gpus-per-node=8\n" in script  # the process still drives all the node's GPUs


def test_submit_checks_the_model_folder_and_records_what_it_resolved(cli, workdir) -> None:
    from flux_cluster.cli import app
    from flux_cluster.rundir import list_runs, read_run_config

    sets = ["train.benchmark=hf", "hf.model=bert", "hf.task=text-classification", "hf.data=synthetic"]
    args = [
        "submit",
        "--system",
        "local",
        "--dry-run",
        *(x for s in [*sets, "train.parallel=dp"] for x in ("--set", s)),
    ]
    result = cli.invoke(app, args)
    assert result.exit_code != 0
    assert "hf.model: bert is not a model folder: expected config.json" in " ".join(result.output.split())
    result = cli.invoke(app, [*args, "--job", "throughput"])
    assert "--job throughput: train.benchmark hf runs as --job train" in " ".join(result.output.split())
    (workdir / "bert").mkdir()
    (workdir / "bert" / "config.json").write_text("{}")
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    (run_dir,) = list_runs(workdir / "runs")
    system, job = read_run_config(run_dir / "config.yaml")
    assert system.hf.model == str(workdir / "bert")  # absolute: the ranks start in the run folder
    assert (system.train.mode, system.train.precision, system.train.parallel) == ("finetune", "fp32", "dp")
    assert job["training"]["kind"] == "hf"
    script = (run_dir / "job.sh").read_text()
    assert "--nproc-per-node=1 " in script and "jobs.compliance" not in script  # no MLPerf result
    assert "FLUX_DATA_DIR" not in script  # no Energon dataset made or mounted
