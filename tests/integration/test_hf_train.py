"""The hf workload end to end on tiny models: one real `flux-cluster submit --system local` (DataParallel:
one process) and, in one torchrun of 2 gloo ranks, the other tasks, parallel modes, AMP and LoRA, a stop
by SIGUSR1 mid-epoch and its resume, and a mismatched LoRA target (one line, exit code 1)."""

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_finetune import tensorboard_scalars
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.data.prep.synth_hf import synthesize_hf
from flux_cluster.models.tiny_hf import write_tiny_hf
from flux_cluster.rundir import list_runs
from flux_cluster.runtime.dist import DistInfo

HEADER = {"world_size", "workload", "model", "task", "parallel", "precision", "mode", "micro_batch_size"}
HEADER |= {"seq_len", "params", "trainable_params", "flops_per_step", "peak_tflops"}
STEP = {"step", "epoch", "loss", "step_seconds", "samples_per_s", "tokens_per_s", "tflops_per_s", "mfu"}
STEP |= {"peak_memory_gb"}
SUMMARY = {"images_per_s", "step_time_ms", "train_seconds", "epochs", "steps", "samples", "world_size"}
SUMMARY |= {"peak_memory_gb", "final_eval_loss", "hf"}
HF_SUMMARY = {"samples_per_s", "tokens_per_s", "flops_per_step", "tflops_per_s", "mfu", "epoch_seconds"}
HF_SUMMARY |= {"estimated_total_seconds", "epochs", "task", "parallel", "precision", "mode", "model"}
LIBRARY_NOTICES = (
    "Failed to load",  # torchao without its GPU kernels
    "_pytree",  # torchao's enums, registered with torch.compile
    "Loading weights",  # transformers' per-weight bar
    "is_gradient_checkpointing",  # peft reading a deprecated transformers property
    "loss_type=None",  # GPT-2's config names no loss: the default one
)
"""Library lines that ask nothing of a user: an hf run prints none of them."""


@pytest.fixture(scope="module")
def hf_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    for kind in ("bert", "gpt2", "vit"):
        write_tiny_hf(root / kind, kind=kind)
    synthesize_hf(root / "text", "text-classification", train=32, val=8)
    synthesize_hf(root / "images", "image-classification", train=16, val=4)
    return root


def records(run_dir: Path, name: str = "metrics_0.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results" / name).read_text().splitlines()]


def check_metrics(
    run_dir: Path,
    task: str,
    parallel: str,
    precision: str,
    mode: str,
    set_aside: bool = False,
    epochs: int = 1,
) -> dict:
    """The interface of session 6 (header, step, eval and summary lines); returns the summary. set_aside:
    the files a later attempt moved to results/interrupted/."""
    attempt = "interrupted/{}.attempt0{}" if set_aside else "{}{}"
    lines = records(run_dir, attempt.format("metrics_0", ".jsonl"))
    header, summary = lines[0], lines[-1]["summary"]
    assert header.keys() >= HEADER and header["workload"] == "hf" and header["flops_per_step"] > 0
    assert (header["task"], header["parallel"], header["precision"], header["mode"]) == (
        task,
        parallel,
        precision,
        mode,
    )
    # CPU: no peak; the devices that trained: 2 ranks, but dp's one process drives one CPU
    assert header["peak_tflops"] is None and header["world_size"] == (1 if parallel == "dp" else 2)
    assert summary["world_size"] == header["world_size"]
    steps = [r for r in lines if "loss" in r and "step_seconds" in r]
    assert steps and all(r.keys() >= STEP and r["mfu"] is None and r["samples_per_s"] > 0 for r in steps)
    assert all((r["tokens_per_s"] is None) == (task == "image-classification") for r in steps)
    assert [r["epoch"] for r in lines if "eval_loss" in r] == list(range(1, epochs + 1))
    assert summary.keys() >= SUMMARY and summary["hf"].keys() >= HF_SUMMARY
    assert summary["hf"]["estimated_total_seconds"] == pytest.approx(summary["hf"]["epoch_seconds"] * epochs)
    assert "run_stop" in (run_dir / "results" / attempt.format("result_0", ".txt")).read_text()
    return summary


def test_submit_dp_text_classification_writes_the_run_folder(
    cli: CliRunner, workdir: Path, hf_inputs: Path
) -> None:
    """The seed's DataParallel scenario from a JSONL folder: one process on the local system's 2 'GPUs'."""
    sets = [
        "train.benchmark=hf",
        f"hf.model={hf_inputs / 'bert'}",
        "hf.task=text-classification",
        f"hf.data={hf_inputs / 'text'}",
        "hf.seq_len=16",
        "train.parallel=dp",
        "train.log_every_steps=1",
    ]
    result = cli.invoke(app, ["submit", "--system", "local", *(x for s in sets for x in ("--set", s))])
    assert result.exit_code == 0, result.output[-3000:]
    (run_dir,) = list_runs(workdir / "runs")
    assert "--nproc-per-node=1 " in (run_dir / "job.sh").read_text()
    assert "dp over 1 process(es)" in result.output
    assert "samples/s |" in result.output and "tokens/s |" in result.output and "MFU n/a" in result.output
    assert not [notice for notice in LIBRARY_NOTICES if notice in result.output], result.output[-3000:]
    summary = check_metrics(run_dir, "text-classification", "dp", "fp32", "finetune")
    assert summary["steps"] == 2 and summary["samples"] == 32  # 32 train lines, global batch 16
    scalars = tensorboard_scalars(run_dir)
    for tag in (
        "train/samples_per_s",
        "train/tokens_per_s",
        "train/tflops_per_gpu",
        "eval/loss",
        "summary/images_per_s",
    ):
        assert scalars.get(tag), tag


def test_each_task_parallel_mode_amp_and_lora_on_two_gloo_ranks(tmp_path: Path, hf_inputs: Path) -> None:
    """causal-lm with FSDP over 2 epochs, and the same run stopped by SIGUSR1 mid-epoch (checkpointed, exit
    code 75 outside Slurm) then started again in its folder: it resumes, and its per-step and validation
    losses are the uninterrupted run's; image classification from an imagefolder with AMP bf16, text
    classification with LoRA (the architecture's default targets) and AMP fp16, then LoRA targets the model
    lacks (in image's run folder, whose earlier files move aside)."""
    m = hf_inputs
    small = "train.micro_batch_size=4,train.global_batch_size=8"
    # 4 steps per epoch, 2 micro-batches each; a checkpoint every 2 steps besides the stop's
    causal = (
        f"hf.model={m / 'gpt2'},hf.task=causal-lm,hf.data=synthetic,hf.synthetic_samples=16,"
        "hf.seq_len=16,train.parallel=fsdp,train.micro_batch_size=1,train.global_batch_size=4,"
        "train.epochs=2,train.log_every_steps=1,train.checkpoint_every_steps=2"
    )
    bad_images, bad_name = _one_bad_image(m, tmp_path)
    cases = [
        ("causal", causal),
        ("stopped@2", causal),  # the signal at step 2 is agreed (one step late) after step 3
        ("stopped", causal),
        (
            "image",
            f"hf.model={m / 'vit'},hf.task=image-classification,hf.data={m / 'images'},"
            f"train.precision=amp-bf16,{small}",
        ),
        (
            "lora",
            f"hf.model={m / 'bert'},hf.task=text-classification,hf.data=synthetic,"
            f"hf.synthetic_samples=16,hf.seq_len=16,train.mode=lora,train.precision=amp-fp16,{small}",
        ),
        # again in image's folder: a restarted repeat sets the earlier attempt's files aside
        (
            "image",
            f"hf.model={m / 'bert'},hf.task=text-classification,hf.data=synthetic,train.mode=lora,"
            f"train.lora_targets=[to_q],{small}",
        ),
        # one image only one rank reads cannot be decoded: that rank's line, the other rank quiet
        (
            "bad_image",
            f"hf.model={m / 'vit'},hf.task=image-classification,hf.data={bad_images},{small}",
        ),
    ]
    args = [x for name, sets in cases for x in (str(tmp_path / name), sets)]
    script = Path(__file__).with_name("hf_cases.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
    ]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "exit codes: [0, 75, 0, 0, 0, 1, 1]" in output, output[-4000:]
    assert not [notice for notice in LIBRARY_NOTICES if notice in output], output[-4000:]
    check_metrics(tmp_path / "causal", "causal-lm", "fsdp", "fp32", "finetune", epochs=2)
    check_metrics(tmp_path / "stopped", "causal-lm", "fsdp", "fp32", "finetune", epochs=2)
    assert "stopped by a signal at step 3" in output and "resumed from " in output
    assert "step_00000003 at step 3" in output.split("resumed from ")[1].splitlines()[0]
    whole, resumed = records(tmp_path / "causal"), records(tmp_path / "stopped")
    losses = {r["step"]: r["loss"] for r in whole if "step_seconds" in r}
    again = {r["step"]: r["loss"] for r in resumed if "step_seconds" in r}
    # each attempt's first step is not timed, so has no line: the stop's after 3, the resume's 4
    assert sorted(losses) == [2, 3, 4, 5, 6, 7, 8] and sorted(again) == [2, 3, 5, 6, 7, 8]
    assert again == {step: losses[step] for step in again}
    evals = [[r["eval_loss"] for r in lines if "eval_loss" in r] for lines in (whole, resumed)]
    assert evals[0] == evals[1] and len(evals[0]) == 2
    assert sum("workload" in r for r in resumed) == 2  # one header per attempt, in one file
    check_metrics(tmp_path / "image", "image-classification", "ddp", "amp-bf16", "finetune", set_aside=True)
    assert not (tmp_path / "image" / "results" / "metrics_0.jsonl").exists()
    lora = check_metrics(tmp_path / "lora", "text-classification", "ddp", "amp-fp16", "lora")
    header = records(tmp_path / "lora")[0]
    assert header["trainable_params"] < header["params"] / 2 and lora["final_eval_loss"] is not None
    assert "LoRA rank 16 on query, value" in output
    # anywhere on a line: another rank's progress bar (no newline) may come first
    errors = re.findall(r"error: train\.lora_targets: [^\n]*", output)
    assert len(errors) == 1 and "to_q not in the model" in errors[0] and "query" in errors[0], output[-4000:]
    bad = re.findall(r"error: hf\.data: [^\n]*", output)
    assert len(bad) == 1 and f"{bad_name}: expected an image, cannot be read" in bad[0], output[-4000:]
    assert "Traceback" not in output and "Connection closed" not in output, output[-4000:]


def _one_bad_image(inputs: Path, tmp_path: Path) -> tuple[Path, str]:
    """The tiny imagefolder with its last train image (after the job's shuffle, seed 7) not an image: one
    rank alone meets it, in a step (not among the first samples every rank decodes to count FLOPs)."""
    from flux_cluster.config.hf import HfConfig
    from flux_cluster.hf.data import read_splits, shuffled

    folder = tmp_path / "bad_images"
    shutil.copytree(inputs / "images", folder)
    train, _ = read_splits(folder, HfConfig())  # every row, in file order
    last = Path(shuffled(train, 7)["image"][-1])
    last.write_bytes(b"not a png")
    return folder, f"{last.parent.name}/{last.name}"


def test_the_readme_bert_example_learns(tmp_path: Path, one_rank: DistInfo) -> None:
    """README.md's hf scenario 1 as printed (its --set values, 3 epochs) on the README's model and data
    (models tiny --kind bert, data synth-hf's defaults), trained in this process on one gloo rank with the
    2 ranks' global batch: the validation loss falls well below ln 2, a coin toss (it stayed there)."""
    from test_readme import readme_commands

    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.hf.train import run
    from flux_cluster.rundir import result_log
    from flux_cluster.training.context import JobContext

    bert = [c.text for c in readme_commands() if "--set hf.model=work/hf/bert" in c.text]
    words = shlex.split(bert[0])  # scenario 1, the first bert run
    assert words[:4] == ["flux-cluster", "submit", "--system", "local"] and "train.epochs=3" in words
    sets = [value for option, value in itertools.pairwise(words) if option == "--set"]
    model, data = write_tiny_hf(tmp_path / "bert", kind="bert"), tmp_path / "reviews"
    synthesize_hf(data, "text-classification")
    sets = [s.replace("work/hf/bert", str(model)).replace("work/hf/reviews", str(data)) for s in sets]
    system = load_system("local", sets).config
    plan = resolve_training(system)
    assert plan.global_batch_size == 16  # 8 a micro-batch on each of the local system's 2 ranks
    folder = tmp_path / "run"
    ctx = JobContext(system, plan, folder, data, 0, 7, result_log(folder, 0), False, "x")
    assert run(ctx, one_rank) == 0
    lines = records(folder)
    losses = [r["eval_loss"] for r in lines if "eval_loss" in r]
    assert len(losses) == 3 and losses[-1] < 0.2, losses  # ln 2 = 0.693: a coin toss
    assert lines[-1]["summary"]["best_eval_loss"] == min(losses)
