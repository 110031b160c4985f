"""data synth-hf (issue 30): tiny local datasets of each hf task, in the formats hf.data reads, written whole
or not at all."""

import json
from pathlib import Path

import pytest
from PIL import Image

from flux_cluster.data.prep.synth_hf import synthesize_hf
from flux_cluster.errors import FluxClusterError
from flux_cluster.models.tiny_hf import IMAGE_LABELS, IMAGE_SIZE


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_text_datasets_are_jsonl_splits_with_balanced_labels(tmp_path: Path) -> None:
    counts = synthesize_hf(tmp_path / "cls", "text-classification", train=10, val=4)
    assert counts == {"train": 10, "val": 4} and sorted(p.name for p in (tmp_path / "cls").iterdir()) == [
        "train.jsonl",
        "val.jsonl",
    ]
    train = _records(tmp_path / "cls" / "train.jsonl")
    assert len(train) == 10 and [r["label"] for r in train] == [0, 1] * 5
    assert all(set(r) == {"text", "label"} and r["text"] for r in train)
    lm = synthesize_hf(tmp_path / "lm", "causal-lm", train=3, val=0)
    assert lm == {"train": 3, "val": 0} and not (tmp_path / "lm" / "val.jsonl").exists()
    assert all(set(r) == {"text"} for r in _records(tmp_path / "lm" / "train.jsonl"))
    again = synthesize_hf(tmp_path / "again", "text-classification", train=10, val=4)
    assert (
        again == counts
        and (tmp_path / "again" / "train.jsonl").read_bytes()
        == (tmp_path / "cls" / "train.jsonl").read_bytes()
    )  # the same seed, the same data


def test_images_are_an_imagefolder_with_a_folder_per_class(tmp_path: Path) -> None:
    synthesize_hf(tmp_path / "img", "image-classification", train=4, val=2)
    for split, count in (("train", 4), ("val", 2)):
        assert sorted(p.name for p in (tmp_path / "img" / split).iterdir()) == sorted(IMAGE_LABELS)
        files = sorted((tmp_path / "img" / split).rglob("*.png"))
        assert len(files) == count
    with Image.open(files[0]) as image:
        assert image.size == (IMAGE_SIZE, IMAGE_SIZE) and image.mode == "RGB"


def test_bad_requests_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(FluxClusterError, match="expected one of text-classification, causal-lm"):
        synthesize_hf(tmp_path / "x", "translation")  # type: ignore[arg-type]
    with pytest.raises(FluxClusterError, match="at least 1 train"):
        synthesize_hf(tmp_path / "x", "causal-lm", train=0)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FluxClusterError, match="folder is not empty"):
        synthesize_hf(tmp_path / "full", "causal-lm")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no half-written folder left
    synthesize_hf(tmp_path / "full", "causal-lm", train=2, val=1, force=True)
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["train.jsonl", "val.jsonl"]
