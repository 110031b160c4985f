"""Fine-tuning on a user's own images, end to end on CPU: a folder of captioned images -> `data encode`
(the tiny random-init FLUX pipeline's real VAE, CLIP and T5) -> LoRA or full fine-tuning on 2 gloo ranks
through the README's command -> the best weights reload into the pipeline and give the recorded
validation loss -> the report."""

import hashlib
import json
import math
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from data_helpers import write_image_folder
from test_train import finish, prepared_run, start_ranks
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.data.format import decode_tensor, from_bf16_bits
from flux_cluster.data.loader import val_loader
from flux_cluster.data.prep.encode import SUMMARY_FILE
from flux_cluster.data.prep.source import open_source
from flux_cluster.rundir import list_runs
from flux_cluster.training import model as M
from flux_cluster.training.checkpoint import STATE_FILE
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
    """24 captioned images (plus one broken and one without caption) encoded once for the module: of the 25
    with a caption, round(0.1 x 25) = 3 form val (an odd count, split unevenly over 2 ranks), 21 train."""
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
    assert summary["samples"] == {"train": 21, "val": 3}  # broken.png was drawn for train
    assert any("broken.png" in line for line in summary["skipped"])
    assert any("uncaptioned.png" in line for line in summary["skipped"])
    # The samples are what the pipeline's own encoders give for that image and caption.
    from flux_cluster.data.prep.encoders import FluxEncoders
    from flux_cluster.data.prep.image_folder import load_image, to_pixels

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


def test_an_image_added_to_the_folder_re_encodes_only_the_chunk_it_falls_in(
    workdir: Path, tiny_pipeline: Path
) -> None:
    """Chunks of about chunk_images images end where the names say, not at fixed positions: an image added
    early in name order re-encodes its own chunk's images (its chunk split in two when it is a chunk end),
    not every later chunk; every chunk stays within the maximum."""
    import io
    import shutil

    from rich.console import Console

    from flux_cluster.data.prep.encode import MAX_CHUNK_FACTOR, EncodeOptions, Encoding

    images = workdir / "grow"
    write_image_folder(images, "captions.txt", 20)
    options = EncodeOptions(
        images=images, output=workdir / "out", model=tiny_pipeline, resolution=RESOLUTION,
        max_sequence_length=TOKENS, batch_size=4, chunk_images=3, cache=workdir / "cache",
    )  # fmt: skip
    console = Console(file=io.StringIO())
    before = Encoding(options, console)
    assert before.encode() == 20
    assert all(len(c.items) <= MAX_CHUNK_FACTOR * 3 for c in before.chunks)
    assert sum(c.split == "train" for c in before.chunks) >= 3
    val = {i.record.name for i in before.items if i.split == "val"}
    # A 21st image right after the first (round(0.1 x 21) = 2 val images, as with 20), under a name not
    # drawn for val: what val holds is another matter (test_image_folder.py).
    for k in range(100):
        added = images / f"img_000_{k}.png"
        shutil.copy(images / "img_000.png", added)
        added.with_suffix(".txt").write_text(f"a copy {k}\n")
        after = Encoding(options, console)
        if {i.record.name for i in after.items if i.split == "val"} == val:
            break
        added.unlink()
        added.with_suffix(".txt").unlink()
    changed = [c for c in after.chunks if c.key not in {c.key for c in before.chunks}]
    again = {i.record.name for c in changed for i in c.items} - {added.name}
    assert any(again == {i.record.name for i in c.items} for c in before.chunks)  # one old chunk's images
    assert after.encode() == len(again) + 1 < 20
    assert len(list((workdir / "cache").rglob("chunks/*.arrow"))) == len(before.chunks) + len(changed)


def val_loss_of(model: torch.nn.Module, data: Path, dtype: torch.dtype = torch.float32) -> float:
    model = model.to(dtype)
    loss, _ = validation_loss(
        lambda x, t, t5, clip: M.predict_velocity(model, x, t, t5, clip, dtype),
        val_loader(data, batch_size=4, rank=0, world_size=1),
        torch.device("cpu"),
    )
    return loss


def run_seconds(result_log: Path) -> float:
    """run_start to run_stop of a result log, in seconds."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in result_log.read_text().splitlines()]
    times = {e["key"]: e["time_ms"] for e in events if e["key"] in ("run_start", "run_stop")}
    return (times["run_stop"] - times["run_start"]) / 1000


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
        "price_per_gpu_hour=2.5",
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


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar the run wrote to TensorBoard: tag -> [(step, value)], read from its event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / "exp_0"), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_lora_fine_tuning_keeps_the_best_weights_which_reload_into_the_pipeline(
    cli: CliRunner, workdir: Path, encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    """The README's command with a GPU system's defaults (bf16, every block checkpointed, compiled): LoRA
    with 8-bit AdamW, started from a LoRA file (train.lora_init). Evaluated one image at a time: the 3 val
    images are 2 batches on one rank and 1 on the other, which must not hang the evaluation."""
    mode = "lora"
    init = lora_file(tiny_pipeline, workdir / "init")
    gpu_defaults = ("train.param_dtype=bfloat16", "train.activation_checkpointing=full", "train.compile=true")
    extra = ("train.optimizer=adamw8bit", *gpu_defaults, f"train.lora_init={init}")
    sets = finetune_sets(mode, encoded, tiny_pipeline, *extra, "train.eval_batch_size=1")
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
    # GPU-hours and cost of the whole training time, on 2 ranks at the system's price
    assert summary["gpu_hours"] == pytest.approx(summary["train_seconds"] / 3600 * 2)
    assert summary["cost_usd"] == pytest.approx(summary["gpu_hours"] * 2.5) and summary["attempts"] == 1
    # 21 images: 2 steps of 8 an epoch; the first step (warm-up) is not timed
    assert summary["steps"] == 6 and summary["timed_steps"] == 5
    # A progress line at every epoch's end, though log_every_steps (25 on this system) is never reached.
    lines = re.findall(
        r"^step +(\d+) \|.* images/s \|.* ms \|.* GB \| [\d.,]+ s, \S+ GPU-h, \$[\d.,]+$", result.output, re.M
    )
    assert lines == ["2", "4", "6"]
    # TensorBoard: the progress lines' figures, the validation loss per epoch and the summary.
    scalars = tensorboard_scalars(run_dir)
    for tag in ("train/step_time_ms", "train/samples_per_s", "time/train_seconds", "time/cost_usd"):
        assert [step for step, _ in scalars[tag]] == [16, 32, 48], tag
    assert [step for step, _ in scalars["eval/loss_per_epoch"]] == [1, 2, 3]
    assert [v for _, v in scalars["eval/loss_per_epoch"]] == pytest.approx([r["eval_loss"] for r in evals])
    for name in ("images_per_s", "step_time_ms", "train_seconds", "gpu_hours", "cost_usd", "peak_memory_gb"):
        assert scalars[f"summary/{name}"] == [(48, pytest.approx(summary[name], rel=1e-6))], name
    # The last state is a checkpoint to resume from; the best weights load through diffusers.
    assert list((run_dir / "checkpoints" / "exp_0").glob("step_*"))
    best = run_dir / "results" / "best_0"
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_pipeline, local_files_only=True)
    pipe.load_lora_weights(init.parent, weight_name=init.name)
    init_loss = val_loss_of(pipe.transformer, encoded["data"], torch.bfloat16)
    pipe.unload_lora_weights()
    pipe.load_lora_weights(best, weight_name=M.LORA_FILE)
    loss = val_loss_of(pipe.transformer, encoded["data"], torch.bfloat16)
    # eager bf16 here, compiled bf16 in training: the same to ~1e-4 (epochs differ by ~1e-2)
    assert loss == pytest.approx(summary["best_eval_loss"], rel=2e-3)
    others = [r["eval_loss"] for r in evals if r["eval_loss"] != summary["best_eval_loss"]]
    assert all(abs(loss - summary["best_eval_loss"]) < abs(loss - other) for other in others)
    assert loss < init_loss  # the saved adapters are trained ones, better than those they started from
    # Trained from the init adapter: its B matrices (|B| ~ 0.8; a new adapter's start at 0) moved, by a
    # few optimizer steps of lr 3e-3 only.
    from safetensors.torch import load_file

    start, tuned = load_file(init), load_file(best / M.LORA_FILE)
    assert start.keys() == tuned.keys()
    moved = [(tuned[key] - start[key]).abs().max().item() for key in start if "lora_B" in key]
    assert all(start[key].abs().mean() > 0.5 for key in start if "lora_B" in key)
    assert min(moved) > 1e-4 and max(moved) < 0.1
    # The report shows the run with its figures.
    report = cli.invoke(app, ["report", str(workdir / "runs"), "--format", "json"])
    assert report.exit_code == 0, report.output[-2000:]
    (group,) = json.loads(report.output)["groups"]
    assert group["train_mode"] == mode and group["best_eval_loss"] == pytest.approx(summary["best_eval_loss"])


def test_full_fine_tuning_stopped_by_sigusr1_resumes_and_keeps_the_best_weights(
    cli: CliRunner, workdir: Path, encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    """All weights, 'ops+1' checkpointing (one block checkpointed whole, the rest by ops: a run of mixed
    wrappers checkpoints and resumes), stopped by SIGUSR1 after its first evaluation (the
    checkpoint holds the best so far) and resumed: every epoch is evaluated once, the best weights are the
    lowest evaluation's, and they load into the pipeline giving the recorded loss; the summary and the
    report count both attempts' time. (That a resume reproduces an uninterrupted run bit for bit is
    tests/integration/test_train.py's SIGUSR1 test, same code.)"""
    sets = finetune_sets("finetune", encoded, tiny_pipeline, "train.activation_checkpointing=ops+1")
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
    (stopped_at,) = (interrupted / "checkpoints" / "exp_0").glob("step_*")
    carried = json.loads((stopped_at / STATE_FILE).read_text())["clock"]  # the first attempt's time
    # The first attempt recorded its time at each progress line, none past the checkpoint it stopped with.
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    recorded = [r["clock"]["train_seconds"] for r in records if "clock" in r]
    assert recorded and recorded == sorted(recorded) and recorded[-1] <= carried["train_seconds"]
    assert carried["peak_memory_gb"] > 0 and carried["lost_seconds"] == 0
    # As if the attempt had gone on 100 s past its checkpoint and been killed mid-write (no signal, so
    # no checkpoint): the resume counts those 100 s as time paid for, not as training throughput.
    with metrics_file.open("a") as out:
        out.write(
            json.dumps({"clock": {"train_seconds": carried["train_seconds"] + 100}}) + '\n{"clock": {"tr'
        )
    resumed = finish(start_ranks(interrupted))
    assert "resumed from" in resumed and "100.0 s of them redone" in resumed

    def evals(run_dir: Path) -> dict[int, float]:
        lines = (run_dir / "results" / "metrics_0.jsonl").read_text().splitlines()
        lines = [line for line in lines if line != '{"clock": {"tr']  # the "killed" attempt's last
        return {r["step"]: r["eval_loss"] for r in map(json.loads, lines) if "eval_loss" in r}

    # The killed attempt's partial line stays a line of its own: the next attempt's records are whole.
    assert '{"clock": {"tr' in metrics_file.read_text().splitlines()

    summary = summary_of(interrupted)
    assert sorted(evals(interrupted)) == [2, 4, 6, 8] and summary["epochs"] == 4
    assert summary["best_eval_loss"] == min(evals(interrupted).values())
    assert summary["best_step"] == min(evals(interrupted), key=evals(interrupted).get)
    from diffusers import FluxPipeline, FluxTransformer2DModel

    best = FluxTransformer2DModel.from_pretrained(interrupted / "results" / "best_0", local_files_only=True)
    pipe = FluxPipeline.from_pretrained(tiny_pipeline, transformer=best, local_files_only=True)
    loss = val_loss_of(pipe.transformer, encoded["data"])
    assert loss == pytest.approx(summary["best_eval_loss"], rel=1e-5)
    # The whole run's figures: the first attempt's clock came with the checkpoint (its result log went to
    # results/interrupted/), so every step but each attempt's first (warm-up) is timed once, and the time
    # is both attempts'.
    first = run_seconds(interrupted / "results" / "interrupted" / "result_0.attempt0.txt")
    assert 0 < carried["train_seconds"] <= first + 0.01 and 0 < carried["timed_steps"] < 7
    assert summary["attempts"] == 2 and summary["steps"] == 8 and summary["timed_steps"] == 6
    last = run_seconds(interrupted / "results" / "result_0.txt")
    assert summary["lost_seconds"] == pytest.approx(100)
    assert summary["train_seconds"] >= carried["train_seconds"] + 100 + last - 0.01
    assert summary["peak_memory_gb"] >= carried["peak_memory_gb"]  # every attempt's
    assert summary["gpu_hours"] == pytest.approx(summary["train_seconds"] / 3600 * 2)
    assert summary["cost_usd"] == pytest.approx(summary["gpu_hours"] * 2.5)
    # ... and so are the report's time, GPU-hours and cost (the result log alone has the last attempt).
    report = cli.invoke(app, ["report", str(workdir / "runs"), "--format", "json"])
    assert report.exit_code == 0, report.output[-2000:]
    (group,) = json.loads(report.output)["groups"]
    assert group["runs"][0]["minutes"] == pytest.approx(summary["train_seconds"] / 60)
    assert group["gpu_hours"] == pytest.approx(summary["gpu_hours"])
    assert group["cost_usd"] == pytest.approx(summary["cost_usd"])


def test_a_resume_counts_the_time_a_killed_attempt_spent_past_its_checkpoint(tmp_path: Path) -> None:
    from flux_cluster.training.metrics import RunClock

    checkpoint = RunClock(train_seconds=50.0, timed_seconds=40.0, timed_steps=10, peak_memory_gb=3.0)
    metrics = tmp_path / "metrics_0.jsonl"
    assert checkpoint.after_loss(metrics) == checkpoint  # no file: nothing to add
    lines = [
        {"flops_per_sample": 1.0, "world_size": 2},
        {"step": 1, "samples": 8, "loss": 1.0},
        {"clock": {"train_seconds": 30.0}},  # before the checkpoint: its time is in the clock already
        {"step": 4, "samples": 32, "eval_loss": 0.9, "train_seconds": 61.5},  # evaluations record it too
        {"clock": {"train_seconds": 60.0}},
        {"clock": {"train_seconds": float("nan")}},
        {"clock": {"train_seconds": "soon"}},
    ]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"clock": {"train_sec')
    resumed = checkpoint.after_loss(metrics)
    assert resumed.train_seconds == 61.5 and resumed.lost_seconds == pytest.approx(11.5)
    assert (resumed.timed_seconds, resumed.timed_steps, resumed.peak_memory_gb) == (40.0, 10, 3.0)
    # An attempt stopped by a signal checkpointed after its last record: nothing lost. Losses add up, and
    # the peak memory is the highest attempt's.
    assert RunClock(train_seconds=70.0).after_loss(metrics).lost_seconds == 0
    both = resumed + RunClock(1.0, 1.0, 1, 2.0, 5.0)
    assert (both.train_seconds, both.lost_seconds, both.peak_memory_gb) == (62.5, pytest.approx(13.5), 5.0)


def test_the_schedule_evaluates_every_epoch_and_every_n_steps_and_ends_after_the_epochs(
    tmp_path: Path,
) -> None:
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import TrainingPlan, resolve_training
    from flux_cluster.training.context import Schedule

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
    too_small = r"10 samples, fewer than one global batch \(128 = .* e.g. --set train.micro_batch_size=1 "
    with pytest.raises(SystemExit, match=too_small):  # submit fits it where it reads the split (not here)
        Schedule.of(plan(*tuning, "train.global_batch_size=128"), 10)
    # no global batch set: one micro-batch per rank (16 x 8 GPUs on this system), no accumulation
    default = plan(*tuning)
    assert (default.global_batch_size, default.grad_accum_steps) == (128, 1)
    assert default.learning_rate == 1e-4 and default.warmup_steps == 0  # the workload's, not flux1's
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


def test_encode_with_its_only_val_image_broken_skips_it_by_name_and_a_relative_cache_works(
    workdir: Path, tiny_pipeline: Path
) -> None:
    """The image drawn for val is decoded at the split: a broken one is skipped, named, and the next
    drawn takes its place (a broken file never empties val, nor aborts fine-tuning later)."""
    from flux_cluster.data.prep.encode import EncodeOptions, split_items
    from flux_cluster.data.prep.image_folder import scan_folder

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
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert f"skipped few/{val.name}: cannot decode" in result.output
    summary = json.loads((workdir / "out" / SUMMARY_FILE).read_text())
    assert summary["samples"] == {"train": 2, "val": 1}
    assert any(val.name in line for line in summary["skipped"])
    # the chunks went into the relative cache, linked where the source can reach them
    (source,) = (workdir / "cache").glob("*/sources/*")
    assert open_source(source, "train").total == 2 and open_source(source, "val").total == 1


def test_a_damaged_pretrained_folder_is_one_line_from_rank_0_not_one_per_rank(
    cli: CliRunner, workdir: Path, encoded: dict[str, Path], tiny_pipeline: Path
) -> None:
    """Every rank reads the same folder and meets the same fault: its line is said once (rank 0's), as the
    hf workload says it, not once per rank."""
    pipeline = workdir / "flux-wide"
    shutil.copytree(tiny_pipeline, pipeline)
    config = pipeline / "transformer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"num_layers": 1_000_000}))
    sets = finetune_sets("finetune", encoded, pipeline)
    result = cli.invoke(app, ["submit", "--system", "local", *(x for s in sets for x in ("--set", s))])
    assert result.exit_code != 0 and "Traceback" not in result.output
    line = f"error: {config}: num_layers 1000000: expected a whole number from 0 to 1,024 (FLUX.1: 19)"
    assert result.output.count(line) == 1, result.output[-3000:]
