"""The hf workload's launcher-side commands as a user runs them (issue 30): models tiny --kind, data synth-hf,
and report on hf run folders (written as the rank side writes them: tests/hf_samples.py)."""

import json
from pathlib import Path

from hf_samples import hf_sweep_runs
from typer.testing import CliRunner

from flux_cluster.cli import app


def test_models_tiny_data_synth_hf_and_the_report(tmp_path: Path, cli: CliRunner) -> None:
    model = tmp_path / "bert"
    result = cli.invoke(app, ["models", "tiny", "--kind", "bert", str(model)])
    assert result.exit_code == 0, result.output
    assert f"--set hf.model={model} --set hf.task=text-classification" in result.stdout
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= {
        p.name for p in model.iterdir()
    }
    again = cli.invoke(app, ["models", "tiny", "--kind", "bert", str(model)])
    assert again.exit_code == 2 and "folder is not empty" in again.output and "Traceback" not in again.output

    data = tmp_path / "reviews"
    result = cli.invoke(app, ["data", "synth-hf", "--kind", "text-classification", str(data), "--train", "8"])
    assert result.exit_code == 0, result.output
    assert "wrote 8 train and 32 val samples (text-classification)" in result.stdout
    assert len((data / "train.jsonl").read_text().splitlines()) == 8
    bad = cli.invoke(app, ["data", "synth-hf", "--kind", "audio", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--kind 'audio': expected one of" in bad.output

    hf_sweep_runs(tmp_path / "runs")
    result = cli.invoke(app, ["report", str(tmp_path / "runs"), "--no-check", "--format", "json"])
    assert result.exit_code == 0, result.output
    titles = {pair["title"] for pair in json.loads(result.stdout)["hf"]["comparisons"]}
    assert titles == {"FP32 vs AMP-BF16", "full vs LoRA", "DP vs DDP", "mbs 8 vs mbs 16"}
    table = cli.invoke(app, ["report", str(tmp_path / "runs"), "--no-check"])
    assert table.exit_code == 0 and "Hugging Face fine-tuning (hf), side by side" in table.stdout
