"""The hf workload's pure parts: reading local data in each format, labels, packing, sharding, LoRA
targets checked against the model, the peak for MFU; bad input is one line naming the path."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet
import pytest
import torch

from flux_cluster.config.hf import HfConfig
from flux_cluster.config.schema import SystemConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.data import hold_out, label_ids, pack_blocks, read_splits
from flux_cluster.hf.meter import peak_tflops
from flux_cluster.hf.model import load_model, lora_targets
from flux_cluster.hf.train import Batching, shard_order, steps_per_epoch

HF = HfConfig()
ROWS = {"text": ["a b", "c d", "e f"], "label": [0, 1, 0]}


def _save_to_disk(folder: Path, rows: dict) -> None:
    """The layout datasets' Dataset.save_to_disk writes: Arrow stream files named by state.json."""
    folder.mkdir(parents=True)
    table = pa.table(rows)
    with (
        pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as w,
    ):
        w.write_table(table)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (folder / "dataset_info.json").write_text("{}")


def test_reads_each_format(tmp_path: Path) -> None:
    _save_to_disk(tmp_path / "one", ROWS)
    assert read_splits(tmp_path / "one", HF) == (ROWS, None)

    _save_to_disk(tmp_path / "dict" / "train", ROWS)
    _save_to_disk(tmp_path / "dict" / "test", {"text": ["x"], "label": [1]})
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert read_splits(tmp_path / "dict", HF) == (ROWS, {"text": ["x"], "label": [1]})

    files = tmp_path / "files"
    files.mkdir()
    (files / "train.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": v}) + "\n" for t, v in zip(*ROWS.values(), strict=True))
    )
    (files / "val.csv").write_text("text,label\nx,1\n")
    assert read_splits(files, HF) == (ROWS, {"text": ["x"], "label": [1]})

    pyarrow.parquet.write_table(pa.table(ROWS), tmp_path / "data.parquet")
    assert read_splits(tmp_path / "data.parquet", HF) == (ROWS, None)


def test_reads_an_imagefolder(tmp_path: Path) -> None:
    from PIL import Image

    for split, name in (("train", "cat"), ("train", "dog"), ("val", "dog")):
        (tmp_path / split / name).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp_path / split / name / "0.png")
    train, val = read_splits(tmp_path, HF)
    assert (
        train["label"] == [0, 1] and val is not None and val["label"] == [1]
    )  # classes named over both splits


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text("{not json"), "cannot be read"),
        (lambda p: p.mkdir(), "no data found: expected a save_to_disk folder"),
    ],
)
def test_bad_data_is_one_line_naming_the_path(tmp_path: Path, make, says: str) -> None:
    path = tmp_path / "data.jsonl"
    make(path)
    with pytest.raises(FluxClusterError, match=f"^hf.data: {path}.*{says}") as error:
        read_splits(path, HF)
    assert "\n" not in str(error.value)


def test_labels_packing_and_splits() -> None:
    assert label_ids(["pos", "neg", "pos"], "x") == ([1, 0, 1], 2)
    with pytest.raises(FluxClusterError, match="all integers or all names"):
        label_ids([1, "a"], "x")
    assert pack_blocks([[1, 2, 3], [4, 5]], 2).tolist() == [[1, 2], [3, 4]]
    train, val = hold_out({"x": torch.arange(10)}, 0.25)
    assert train["x"].tolist() == list(range(7)) and val is not None and val["x"].tolist() == [7, 8, 9]
    assert hold_out({"x": torch.arange(10)}, 0)[1] is None


def test_sharding_and_batching() -> None:
    shards = [set(shard_order(11, rank, 2, epoch=0, seed=3).tolist()) for rank in range(2)]
    assert len(shards[0]) == len(shards[1]) == 5 and not shards[0] & shards[1]
    assert Batching.of(16, 1, 1).per_process == 16  # dp: one process takes the micro-batches of all its GPUs
    assert Batching.of(16, 2, 2).per_process == 4
    assert steps_per_epoch(33, 16) == 2
    with pytest.raises(FluxClusterError, match="fewer than one global batch"):
        steps_per_epoch(8, 16)


def test_lora_targets_checked_against_the_model() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    model = BertForSequenceClassification(config)
    assert lora_targets(model, []) == ["query", "value"]  # peft's default for BERT
    with pytest.raises(
        FluxClusterError, match=r"^train\.lora_targets: to_q, to_k not in the model .*: .*query"
    ) as error:
        lora_targets(model, ["to_q", "to_k", "value"])
    assert "\n" not in str(error.value)


def test_bad_model_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        FluxClusterError, match=f"^hf.model: {tmp_path}: expected a local AutoModelForCausalLM folder"
    ):
        load_model(tmp_path, "causal-lm")
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(
        FluxClusterError, match=f"^hf.model: {tmp_path}: no model.safetensors .*expected"
    ) as error:
        load_model(tmp_path, "causal-lm")  # no weights
    assert "\n" not in str(error.value)


def test_peak_for_mfu() -> None:
    h100 = SystemConfig(
        name="x", nodes=1, gpus_per_node=8, gpu_model="H100-SXM5-80GB", vendor="nvidia", peak_bf16_tflops=989
    )
    cuda = torch.device("cuda", 0)
    assert peak_tflops(h100, "amp-bf16", cuda) == 989
    assert peak_tflops(h100, "fp32", cuda) == 67.0
    assert peak_tflops(h100, "fp32", torch.device("cpu")) is None
