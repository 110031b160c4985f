"""FLUX Kontext on edit pairs, end to end on CPU: `models tiny --kind kontext` -> `data encode` of an
edit-pair folder (control and target latents) -> a LoRA run on 2 gloo ranks in bf16 with every block
checkpointed (as GPUs run it) -> `evaluate` edits the held-out control images, base and fine-tuned."""

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.data.loader import val_loader
from flux_cluster.data.prep.encode import SUMMARY_FILE
from flux_cluster.rundir import list_runs
from flux_cluster.training import model as M
from flux_cluster.training.kontext import control_tokens
from flux_cluster.training.rectified_flow import validation_loss

RESOLUTION, TOKENS = 64, 16


def test_kontext_edit_pairs_encode_train_and_evaluate(cli: CliRunner, workdir: Path) -> None:
    pipeline, pairs, data = workdir / "kontext-tiny", workdir / "pairs", workdir / "data"
    result = cli.invoke(app, ["models", "tiny", "--kind", "kontext", str(pipeline)])
    assert result.exit_code == 0, result.output[-2000:]
    from diffusers import FluxKontextPipeline

    base = FluxKontextPipeline.from_pretrained(pipeline, local_files_only=True)
    assert base.transformer.config.guidance_embeds  # Kontext is a dev model

    assert (
        cli.invoke(
            app, ["data", "demo-images", str(pairs), "--layout", "edit-pairs", "--count", "4"]
        ).exit_code
        == 0
    )
    Image.new("RGB", (16, 16)).save(pairs / "control_images" / "unpaired.png")
    encode = [
        "data", "encode", str(pairs), str(data), "--model", str(pipeline), "--resolution", str(RESOLUTION),
        "--max-sequence-length", str(TOKENS), "--cache", str(workdir / "cache"), "--batch-size", "4",
    ]  # fmt: skip
    result = cli.invoke(app, encode)
    assert result.exit_code == 0, result.output[-3000:]
    assert "skipped" in result.output and "control_images/unpaired.png: no target image" in result.output
    summary = json.loads((data / SUMMARY_FILE).read_text())
    assert summary["layout"] == "edit-pairs" and summary["samples"] == {"train": 3, "val": 1}
    batch = next(iter(val_loader(data, batch_size=1, rank=0, world_size=1)))
    assert batch.control is not None and batch.control.shape == batch.mean.shape == (1, 16, 8, 8)
    assert not torch.equal(batch.control, batch.mean)  # the control is its own image
    strict = cli.invoke(app, [*encode[:3], str(workdir / "strict"), *encode[4:], "--strict"])
    assert strict.exit_code != 0 and "unpaired.png" in strict.output and "Traceback" not in strict.output

    sets = [
        "train.benchmark=finetune", "train.mode=lora", f"train.pretrained_path={pipeline}",
        f"paths.data_root={data}", "train.epochs=2", "train.param_dtype=bfloat16",
        "train.activation_checkpointing=full",
    ]  # fmt: skip
    result = cli.invoke(app, ["submit", "--system", "local", *(x for s in sets for x in ("--set", s))])
    assert result.exit_code == 0, result.output[-3000:]
    # 3 train pairs hold no batch of local's 16: the run takes the largest they hold (issue 39)
    assert "this run takes global batch 2 (micro-batch 1 x 2 ranks)" in result.output
    assert "run_stop success" in result.output and "fine-tuned 2 epochs" in result.output
    (run_dir,) = list_runs(workdir / "runs")
    last = (run_dir / "results" / "metrics_0.jsonl").read_text().splitlines()[-1]
    best_loss = json.loads(last)["summary"]["best_eval_loss"]
    # The best adapter reloads into the Kontext pipeline and gives the recorded loss with the control
    # tokens, and the control changes it. (Whether it is closer with than without cannot be asserted: on
    # this tiny random model the control moves the loss by ~1e-4, as much as bf16 noise between the job's
    # sharded evaluation and this one; that validation hands the prediction the control is a unit test in
    # tests/unit/training/test_kontext_tokens.py.)
    base.load_lora_weights(run_dir / "results" / "best_0", weight_name=M.LORA_FILE)
    model = base.transformer.to(torch.bfloat16)

    def loss(use_control: bool) -> float:
        def predict(x_t, t, t5, clip, control=None):  # type: ignore[no-untyped-def]
            chosen = control if use_control else None
            return M.predict_velocity(model, x_t, t, t5, clip, torch.bfloat16, 3.5, control_tokens(chosen))

        return validation_loss(
            predict, val_loader(data, batch_size=1, rank=0, world_size=1), torch.device("cpu")
        )[0]

    with_control, without = loss(True), loss(False)
    assert with_control == pytest.approx(best_loss, rel=2e-3) and without != with_control

    args = ["evaluate", str(run_dir), "--runs", "2", "--warmup", "0", "--steps", "2"]
    result = cli.invoke(app, [*args, "--resolution", str(RESOLUTION), "--max-sequence-length", str(TOKENS)])
    assert result.exit_code == 0, result.output[-3000:]
    document = json.loads((run_dir / "results" / "eval_0.json").read_text())
    prompt = (
        pairs / "training_images" / Path(document["edits"]["pairs"][0]).with_suffix(".txt").name
    ).read_text()
    assert document["edits"]["pairs"][0].startswith("training_images/pair_") and "upside down" in prompt
    for model_name in ("base", "tuned"):
        latency = document["latency"][model_name]
        assert 0 < latency["p50_s"] <= latency["p90_s"] <= latency["p99_s"]
        assert isinstance(document["clip_score"][model_name], float)
    with Image.open(run_dir / "results" / "eval_0_grid.png") as grid:
        assert grid.width == 3 * RESOLUTION  # control | base edit | fine-tuned edit
