"""LoRA on a quantized frozen base, end to end on CPU: the tiny pipeline fine-tuned by the real job on 2
gloo ranks as GPUs run it (bf16, every block checkpointed) with fp8 base weights quantized at load and NF4
ones from a pre-quantized checkpoint (flux-cluster models quantize), with gradient accumulation, caption
dropout and 8-bit AdamW, then the report's precision ladder over both runs."""

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.rundir import list_runs


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The run's synthetic dataset goes to a cache of this test's own."""
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME")
    else:
        os.environ["XDG_CACHE_HOME"] = previous


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "results" / "metrics_0.jsonl").read_text().splitlines()[-1])["summary"]


def test_lora_on_fp8_and_nf4_bases_trains_and_the_report_shows_the_ladder(
    cli: CliRunner, workdir: Path, tiny_pipeline: Path
) -> None:
    common = [
        "train.benchmark=finetune",
        "train.mode=lora",
        "train.synthetic_data.train=16",
        "train.synthetic_data.val=8",
        "train.epochs=1",
        "train.global_batch_size=8",
        "train.micro_batch_size=2",  # 8 = 2 x 2 ranks x 2 accumulated micro-batches
        "train.param_dtype=bfloat16",
        "train.activation_checkpointing=full",
        "train.caption_dropout=0.5",
        "train.optimizer=adamw8bit",
        "train.loader_workers=0",
    ]
    # nf4 from a pre-quantized checkpoint (flux-cluster models quantize), fp8 quantized at load
    prequantized = workdir / "flux-tiny-nf4"
    result = cli.invoke(
        app, ["models", "quantize", str(tiny_pipeline), str(prequantized), "--precision", "nf4"]
    )
    assert result.exit_code == 0, result.output
    outputs = {}
    for precision, path in (("fp8", tiny_pipeline), ("nf4", prequantized)):
        sets = [*common, f"train.pretrained_path={path}", f"train.base_precision={precision}"]
        result = cli.invoke(app, ["submit", "--system", "local", *(x for s in sets for x in ("--set", s))])
        assert result.exit_code == 0, result.output[-3000:]
        assert "run_stop success" in result.output, result.output[-3000:]
        outputs[precision] = result.output
    runs = list_runs(workdir / "runs")
    summaries = {summary_of(run)["base_precision"]: summary_of(run) for run in runs}
    assert set(summaries) == {"fp8", "nf4"}
    for precision, summary in summaries.items():
        assert f"frozen base {precision}: " in outputs[precision]
        assert summary["base_quantized_layers"] > 0 and summary["steps"] == 2
        assert math.isfinite(summary["final_eval_loss"]) and summary["images_per_s"] > 0
        assert summary["optimizer"] == "adamw8bit"
    # 4 bits a weight and a block's absmax hold less than 8 bits and a row's scale
    assert summaries["nf4"]["parameter_gb"] < summaries["fp8"]["parameter_gb"]
    report = cli.invoke(app, ["report", str(workdir / "runs")])
    assert report.exit_code == 0, report.output[-2000:]
    ladder = report.output[report.output.lower().index("precision ladder") :]
    assert ladder.count("│ no: ") == 2  # each CPU rung's row says its figures are not a GPU's
