"""hf.task from the model (issue 39 item 3): unset, it is what the architecture in hf.model's config.json
implies, resolved with the config (systems show names the source, submit records it in config.yaml); an
explicit value wins; an architecture that implies none, several, or an unreadable config.json is one
line listing the tasks."""

import json
import os
from pathlib import Path

import pytest

from flux_cluster.config import load_system
from flux_cluster.config.workload import resolve_training
from flux_cluster.errors import FluxClusterError

TASKS = "text-classification, causal-lm, image-classification"


def _model(folder: Path, *architectures: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": list(architectures)}))
    return folder


def _system(model: Path, *sets: str):
    return load_system("local", ["train.benchmark=hf", f"hf.model={model}", "hf.data=synthetic", *sets])


@pytest.mark.parametrize(
    ("architecture", "task"),
    [
        ("BertForSequenceClassification", "text-classification"),
        ("GPT2LMHeadModel", "causal-lm"),
        ("LlamaForCausalLM", "causal-lm"),
        ("ViTForImageClassification", "image-classification"),
    ],
)
def test_the_task_is_what_the_architecture_implies(tmp_path: Path, architecture: str, task: str) -> None:
    resolved = _system(_model(tmp_path / "m", architecture))
    assert resolved.config.hf.task == task
    assert resolved.source_of("hf.task") == f"{tmp_path / 'm' / 'config.json'} ({architecture})"
    assert resolve_training(resolved.config).kind == "hf"
    explicit = _system(tmp_path / "m", "hf.task=causal-lm")  # the user's value wins
    assert (explicit.config.hf.task, explicit.source_of("hf.task")) == ("causal-lm", "--set")


def test_a_hub_snapshots_linked_config_is_followed(tmp_path: Path) -> None:
    blob = _model(tmp_path / "blobs", "ViTForImageClassification") / "config.json"
    (tmp_path / "snapshot").mkdir()
    os.symlink(blob, tmp_path / "snapshot" / "config.json")
    assert _system(tmp_path / "snapshot").config.hf.task == "image-classification"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (json.dumps({"architectures": ["BertForMaskedLM"]}), "names BertForMaskedLM, which implies no task"),
        (json.dumps({"model_type": "bert"}), "names no architecture, which implies no task"),
        (
            json.dumps({"architectures": ["GPT2LMHeadModel", "ViTForImageClassification"]}),
            "names GPT2LMHeadModel, ViTForImageClassification, which implies several tasks",
        ),
        (json.dumps({"architectures": ["X\x1b[31m\nForMaskedLM"]}), r"names X\x1b[31m\x0aForMaskedLM,"),
    ],
)
def test_no_task_implied_is_one_line_listing_the_tasks(tmp_path: Path, content: str, says: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(content)
    with pytest.raises(FluxClusterError) as error:
        _system(tmp_path / "m")
    line = str(error.value)
    assert line.startswith(f"hf.task: {tmp_path / 'm' / 'config.json'} ") and "\n" not in line
    assert line.endswith(f"set hf.task to one of {TASKS}")
    assert says in line, line
    assert _system(tmp_path / "m", "hf.task=text-classification").config.hf.task == "text-classification"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[" * 100_000, "JSON nested too deeply"),
        (b'{"architectures": ["BertForMaskedLM"], "x": "' + b"a" * (4 * 2**20) + b'"}', "over 4 MiB"),
        (b"[1, 2]", "expected a JSON object"),
        (b"\xff{", "not valid JSON"),
    ],
)
def test_an_unreadable_config_json_is_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes(content)
    with pytest.raises(FluxClusterError) as error:
        _system(tmp_path / "m")
    line = str(error.value)
    assert line.startswith(f"hf.task: not set, and {tmp_path / 'm' / 'config.json'} is not readable (")
    assert says in line and "\n" not in line


def test_without_a_config_here_the_task_is_asked_for(tmp_path: Path) -> None:
    config = _system(tmp_path / "on-the-cluster").config  # a container's path: nothing to read here
    assert config.hf.task is None
    with pytest.raises(FluxClusterError, match=r"^hf\.task: workload hf\.yaml needs it: text-classification"):
        resolve_training(config)
    flux = load_system("local", [f"hf.model={_model(tmp_path / 'm', 'BertModel')}"]).config
    assert flux.hf.task is None  # only the hf workload reads its model


def test_submit_records_the_task_and_systems_show_names_its_source(cli, workdir: Path) -> None:
    from flux_cluster.cli import app
    from flux_cluster.rundir import list_runs, read_run_config

    _model(workdir / "gpt", "GPT2LMHeadModel")
    (workdir / "gpt" / "model.safetensors").write_bytes(b"")
    sets = ["train.benchmark=hf", "hf.model=gpt", "hf.data=synthetic"]
    options = [x for s in sets for x in ("--set", s)]
    result = cli.invoke(app, ["submit", "--system", "local", "--dry-run", *options])
    assert result.exit_code == 0, result.output
    (run_dir,) = list_runs(workdir / "runs")
    system, _ = read_run_config(run_dir / "config.yaml")
    assert system.hf.task == "causal-lm"
    shown = cli.invoke(app, ["systems", "show", "local", "--format", "json", *options])
    assert json.loads(shown.output)["hf.task"] == {
        "value": "causal-lm",
        "source": "gpt/config.json (GPT2LMHeadModel)",
    }
    _model(workdir / "mlm", "BertForMaskedLM")
    refused = cli.invoke(app, ["submit", "--system", "local", "--dry-run", *options, "--set", "hf.model=mlm"])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [
        f"error: hf.task: mlm/config.json names BertForMaskedLM, which implies no task: set hf.task to one "
        f"of {TASKS}"
    ]
