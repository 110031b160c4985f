"""Fine-tuning on a user's own images, end to end on CPU: a folder of captioned images -> `data encode`
(the tiny random-init FLUX pipeline's real VAE, CLIP and T5) -> LoRA or full fine-tuning on 2 gloo ranks
through the README's command -> the best weights reload into the pipeline and give the recorded
validation loss -> the report."""

import hashlib
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from data_helpers import write_image_folder
from test_train import finish, prepared_run, start_ranks
from typer.testing import CliRunner

from data_prep.encode import SUMMARY_FILE
from data_prep.format import decode_tensor, from_bf16_bits
from data_prep.loader import val_loader
from data_prep.source import open_source
from flux_cluster.cli import app
from flux_cluster.launch.rundir import list_runs
from flux_cluster.training import model as M
from flux_cluster.training.rectified_flow import validation_loss

RESOLUTION, TOKENS = 64, 16
"""Small enough for CPU: 8x8 latents (16 image tokens), 16 T5 tokens."""


def encode_args(images: Path, out: Path, pipeline: Path, cache: Path) -> list[str]:
    return [
        "data", "encode", str(images), str(out), "--model", str(pipeline), "--resolution", str(RESOLUTION),
        "--max-sequence-length", str(TOKENS), "--cache", str(cache), "--batch-size", "4",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def encoded(tmp_path_factory: pytest.TempPathFactory, tiny_pipeline: Path) -> dict[str, Path]:
    """24 captioned images (plus one broken and one without caption) encoded once for the module."""
    root = tmp_path_factory.mktemp("finetune")
    images = root / "images"
    write_image_folder(images, "captions.txt", 24)
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    (images / "broken.txt").write_text("a broken image")
    write_image_folder(root / "extra", "captions.txt", 1)
    (root / "extra").joinpath(next(p.name for p in (root / "extra").iterdir() if p.suffix != ".txt")).rename(
        images / "uncaptioned.png"
    )
    result = CliRunner().invoke(app, encode_args(images, root / "data", tiny_pipeline, root / "cache"))
    assert result.exit_code == 0, result.output[-3000:]
    return {
        "root": root,
        "images": images,
        "data": root / "data",
        "cache": root / "cache",
        "output": result.output,
    }  # type: ignore[dict-item]


def shard_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.tar"))
    }


def test_encode_writes_the_training_schema_skips_bad_images_and_reuses_its_cache(
    encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    output = str(encoded["output"])
    assert "skipped" in output and "uncaptioned.png" in output and "broken.png" in output
    summary = json.loads((encoded["data"] / SUMMARY_FILE).read_text())
    assert summary["layout"] == "captions.txt" and summary["resolution"] == RESOLUTION
    assert sum(summary["samples"].values()) == 24 and summary["samples"]["val"] >= 1
    assert any("broken.png" in line for line in summary["skipped"])
    assert any("uncaptioned.png" in line for line in summary["skipped"])
    # The samples are what the pipeline's own encoders give for that image and caption.
    from data_prep.encoders import FluxEncoders
    from data_prep.image_folder import load_image, to_pixels

    batch = next(iter(val_loader(encoded["data"], batch_size=1, rank=0, world_size=1)))
    encoders = FluxEncoders.load(tiny_pipeline, torch.device("cpu"), max_sequence_length=TOKENS)
    assert batch.t5.shape[1:] == (TOKENS, encoders.t5_dim) and batch.mean.shape[-1] == RESOLUTION // 8
    # The source rows the shards were converted from carry the image's name.
    (source,) = encoded["cache"].glob("*/sources/*")
    row = next(open_source(source, "val").rows(0, 1))
    image = encoded["images"] / row.key
    mean, _ = encoders.encode_images(torch.from_numpy(to_pixels(load_image(image, RESOLUTION)))[None])
    t5, _ = encoders.encode_captions([image.with_suffix(".txt").read_text().strip()])
    for column, direct in (("mean", mean[0]), ("t5_encodings", t5[0])):
        stored = torch.from_numpy(from_bf16_bits(decode_tensor(row.tensors[column])))
        # stored in bf16 (MLCommons' format); batched and single encodes differ in the last bits
        torch.testing.assert_close(stored, direct, rtol=8e-3, atol=1e-3)
    # A second encode of the same folder into another root: every chunk comes from the cache, and the
    # dataset is the same bytes.
    chunks = {p: p.stat().st_mtime_ns for p in encoded["cache"].rglob("*.arrow")}
    again = encoded["root"] / "again"
    result = CliRunner().invoke(app, encode_args(encoded["images"], again, tiny_pipeline, encoded["cache"]))
    assert result.exit_code == 0, result.output[-3000:]
    assert "in the cache" in result.output
    assert {p: p.stat().st_mtime_ns for p in encoded["cache"].rglob("*.arrow")} == chunks
    assert shard_digests(again) == shard_digests(encoded["data"])


def test_encode_strict_refuses_the_first_bad_image_in_one_line(
    encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    args = encode_args(encoded["images"], encoded["root"] / "strict", tiny_pipeline, encoded["cache"])
    result = CliRunner().invoke(app, [*args, "--strict"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output and "uncaptioned.png" in result.output
    assert not (encoded["root"] / "strict" / SUMMARY_FILE).exists()


def val_loss_of(model: torch.nn.Module, data: Path) -> float:
    loss, _ = validation_loss(
        lambda x, t, t5, clip: M.predict_velocity(model, x, t, t5, clip, torch.float32),
        val_loader(data, batch_size=4, rank=0, world_size=1),
        torch.device("cpu"),
    )
    return loss


def summary_of(run_dir: Path) -> dict[str, Any]:
    last = (run_dir / "results" / "metrics_0.jsonl").read_text().splitlines()[-1]
    return json.loads(last)["summary"]


def finetune_sets(mode: str, encoded: dict[str, Path], pipeline: Path, *extra: str) -> list[str]:
    return [
        "train.benchmark=finetune",
        f"train.mode={mode}",
        f"train.pretrained_path={pipeline}",
        f"paths.data_root={encoded['data']}",
        "train.epochs=3",
        "train.global_batch_size=8",
        "train.micro_batch_size=4",
        "train.log_every_steps=2",
        *extra,
    ]


def lora_file(pipeline: Path, folder: Path) -> Path:
    """A LoRA adapter file for the pipeline's transformer with the default rank and targets, B not zero."""
    torch.manual_seed(3)
    model = M.load_pretrained(pipeline)
    M.add_lora(model, 16, 16.0, ["to_q", "to_k", "to_v", "to_out.0"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 1.0)
    return M.save_lora(M.lora_state_dict(model), M.lora_metadata(model), folder)


def test_lora_fine_tuning_keeps_the_best_weights_which_reload_into_the_pipeline(
    cli: CliRunner, workdir: Path, encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    """The README's command: LoRA with 8-bit AdamW, every block checkpointed (the GPU default's wrapping),
    started from a LoRA file (train.lora_init)."""
    mode = "lora"
    init = lora_file(tiny_pipeline, workdir / "init")
    extra = ("train.optimizer=adamw8bit", "train.activation_checkpointing=full", f"train.lora_init={init}")
    sets = finetune_sets(mode, encoded, tiny_pipeline, *extra)
    result = cli.invoke(app, ["submit", "--system", "local", *(x for s in sets for x in ("--set", s))])
    assert result.exit_code == 0, result.output[-3000:]
    assert "run_stop success" in result.output and "fine-tuned 3 epochs" in result.output
    (run_dir,) = list_runs(workdir / "runs")
    assert run_dir.parent.name == "finetune"
    summary = summary_of(run_dir)
    evals = [json.loads(line) for line in (run_dir / "results" / "metrics_0.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_loss" in r]
    assert [r["epoch"] for r in evals] == [1, 2, 3]
    assert summary["best_eval_loss"] == min(r["eval_loss"] for r in evals)
    assert (
        summary["images_per_s"] > 0
        and summary["step_time_ms"] > 0
        and summary["optimizer"] == ("adamw8bit" if mode == "lora" else "adamw")
    )
    assert math.isfinite(summary["peak_memory_gb"])
    # The last state is a checkpoint to resume from; the best weights load through diffusers.
    assert list((run_dir / "checkpoints" / "exp_0").glob("step_*"))
    best = run_dir / "results" / "best_0"
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_pipeline, local_files_only=True)
    base_loss = val_loss_of(pipe.transformer, encoded["data"])
    pipe.load_lora_weights(best, weight_name=M.LORA_FILE)
    loss = val_loss_of(pipe.transformer, encoded["data"])
    assert loss == pytest.approx(summary["best_eval_loss"], rel=1e-5)
    assert loss < base_loss  # the saved weights are the trained ones
    # Trained from the init adapter: its B matrices (|B| ~ 0.8; a new adapter's start at 0) moved by a
    # few optimizer steps of lr 3e-3 only.
    from safetensors.torch import load_file

    start, tuned = load_file(init), load_file(best / M.LORA_FILE)
    assert start.keys() == tuned.keys()
    for key in (k for k in start if "lora_B" in k):
        assert start[key].abs().mean() > 0.5 and (tuned[key] - start[key]).abs().max() < 0.1
    # The report shows the run with its figures.
    report = cli.invoke(app, ["report", str(workdir / "runs"), "--format", "json"])
    assert report.exit_code == 0, report.output[-2000:]
    (group,) = json.loads(report.output)["groups"]
    assert group["train_mode"] == mode and group["best_eval_loss"] == pytest.approx(summary["best_eval_loss"])


def test_full_fine_tuning_stopped_by_sigusr1_resumes_and_keeps_the_best_weights(
    cli: CliRunner, workdir: Path, encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    """All weights, 'ops' checkpointing, stopped by SIGUSR1 after its first evaluation (the
    checkpoint holds the best so far) and resumed: every epoch is evaluated once, the best weights are the
    lowest evaluation's, and they load as a diffusers transformer giving the recorded loss. (That a resume
    reproduces an uninterrupted run bit for bit is tests/test_train.py's SIGUSR1 test, same code.)"""
    sets = finetune_sets("finetune", encoded, tiny_pipeline, "train.activation_checkpointing=ops")
    sets += ["train.learning_rate=3e-3", "train.epochs=4"]
    interrupted = prepared_run(cli, *sets)
    pids = workdir / "pids"
    process = start_ranks(interrupted, FLUX_PID_DIR=str(pids))
    metrics_file = interrupted / "results" / "metrics_0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "eval_loss" not in (
        metrics_file.read_text() if metrics_file.exists() else ""
    ):
        time.sleep(0.05)
    for pid_file in pids.glob("*.pid"):
        os.kill(int(pid_file.read_text()), signal.SIGUSR1)
    assert "stopped by a signal" in finish(process)
    assert (interrupted / "results" / "best_0").is_dir()  # the first evaluation's, before the stop
    assert "resumed from" in finish(start_ranks(interrupted))

    def evals(run_dir: Path) -> dict[int, float]:
        lines = (run_dir / "results" / "metrics_0.jsonl").read_text().splitlines()
        return {r["step"]: r["eval_loss"] for r in map(json.loads, lines) if "eval_loss" in r}

    summary = summary_of(interrupted)
    assert sorted(evals(interrupted)) == [2, 4, 6, 8] and summary["epochs"] == 4
    assert summary["best_eval_loss"] == min(evals(interrupted).values())
    assert summary["best_step"] == min(evals(interrupted), key=evals(interrupted).get)
    loss = val_loss_of(M.load_pretrained(interrupted / "results" / "best_0"), encoded["data"])
    assert loss == pytest.approx(summary_of(interrupted)["best_eval_loss"], rel=1e-5)


def test_the_schedule_evaluates_every_epoch_and_every_n_steps_and_ends_after_the_epochs(
    tmp_path: Path,
) -> None:
    from flux_cluster.config import load_system
    from flux_cluster.training.loop import Schedule
    from flux_cluster.training.workload import TrainingPlan, resolve_training

    def plan(*sets: str) -> "TrainingPlan":
        return resolve_training(load_system("dgx_h100x8", list(sets)).config)

    tuning = ("train.benchmark=finetune", "train.mode=lora", f"train.pretrained_path={tmp_path}")
    # 1,000 images at a global batch of 128: 7 steps an epoch (the rest of the images wait for the next)
    epochs = Schedule.of(plan(*tuning, "train.global_batch_size=128", "train.epochs=3"), 1000)
    assert (epochs.steps_per_epoch, epochs.max_steps, epochs.target) == (7, 21, None)
    assert [s for s in range(1, 22) if epochs.evaluates_after(s)] == [7, 14, 21]
    assert epochs.block_steps(0) == 7 and epochs.block_steps(9) == 5 and epochs.epoch(14) == 2
    both = Schedule.of(plan(*tuning, "train.global_batch_size=128", "train.eval_every_steps=3"), 1000)
    assert [s for s in range(1, 15) if both.evaluates_after(s)] == [3, 6, 7, 9, 12, 14]
    assert both.block_steps(6) == 1 and both.block_steps(7) == 2
    tiny = Schedule.of(plan(*tuning, "train.global_batch_size=128"), 10)  # fewer images than a batch
    assert tiny.steps_per_epoch == 1 and tiny.max_steps == 10
    with pytest.raises(SystemExit, match="no train samples"):
        Schedule.of(plan(*tuning), None)
    # flux1: every eval_every_steps, blocks of that size, the sample budget ends it
    flux1 = Schedule.of(plan("train.global_batch_size=1024"), None)
    assert (flux1.eval_every_steps, flux1.steps_per_epoch, flux1.target) == (256, None, 0.586)
    assert flux1.max_steps == 40_000_000 // 1024 + 1 and flux1.block_steps(300) == 256


def test_a_missing_lora_init_or_pretraining_on_the_finetune_workload_is_one_line(
    cli: CliRunner, workdir: Path, encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    sets = finetune_sets("lora", encoded, tiny_pipeline, f"train.lora_init={workdir / 'nope.safetensors'}")
    result = cli.invoke(
        app, ["submit", "--system", "local", "--dry-run", *(x for s in sets for x in ("--set", s))]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"error: train.lora_init: {workdir / 'nope.safetensors'} is not a file" in result.output
    result = cli.invoke(
        app, ["submit", "--system", "local", "--dry-run", "--set", "train.benchmark=finetune"]
    )
    assert result.exit_code == 2 and "train.mode: 'pretrain' does not fine-tune" in result.output


def test_encode_refuses_an_output_holding_another_dataset_before_encoding(
    encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    other = encoded["root"] / "other-images"
    write_image_folder(other, "metadata.jsonl", 3)
    before = shard_digests(encoded["data"])
    result = CliRunner().invoke(app, encode_args(other, encoded["data"], tiny_pipeline, encoded["cache"]))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "holds another dataset" in result.output and "encode:" not in result.output  # nothing encoded
    assert shard_digests(encoded["data"]) == before


def test_encode_with_its_only_val_image_broken_is_one_line_and_a_relative_cache_works(
    workdir: Path, tiny_pipeline: Path
) -> None:
    from data_prep.encode import EncodeOptions, split_items
    from data_prep.image_folder import scan_folder

    write_image_folder(images := workdir / "few", "captions.txt", 4)
    options = EncodeOptions(images=images, output=workdir / "out", model=tiny_pipeline, val_fraction=0.01)
    (val,) = [
        item.record.path for item in split_items(scan_folder(images).records, options) if item.split == "val"
    ]
    val.write_bytes(val.read_bytes()[:30])  # truncated: skipped when decoded
    args = [
        "data",
        "encode",
        "few",
        "out",
        "--model",
        str(tiny_pipeline),
        "--resolution",
        "64",
        "--val-fraction",
        "0.01",
    ]
    result = CliRunner().invoke(app, [*args, "--max-sequence-length", str(TOKENS), "--cache", "cache"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        f"skipped few/{val.name}: cannot decode" in result.output
        and "no usable val image left" in result.output
    )
    assert not (workdir / "out" / SUMMARY_FILE).exists()
    # the train chunk went into the relative cache, linked where the source can reach it
    (source,) = (workdir / "cache").glob("*/sources/*")
    assert open_source(source, "train").total == 3
