"""Hostile hf.model folders (issue 42, items 1-4; issue 39 item 5): a folder never runs its code, even when
stdin answers transformers' "run the custom code? [y/N]"; every crafted folder is one line naming the file
and the key, before transformers allocates what it says (damaged safetensors headers through the FLUX
loader's checker, nested or oversized JSON, FIFOs, sizes, a config.json of another model); weights of
another architecture are refused, not trained at random; LoRA on the classification head is one line."""

import io
import json
import os
import re
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.model import add_lora, load_model, load_processor, lora_targets

TASKS = {"bert": "text-classification", "gpt2": "causal-lm", "vit": "image-classification"}


def _copy(tiny_hf: Path, kind: str, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_hf / kind, folder)
    return folder


def _edit(folder: Path, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / name
    document = json.loads(path.read_text()) if path.exists() else {}
    change(document)
    path.write_text(json.dumps(document))


def _one_line(exc: BaseException | None, pattern: str) -> str:
    assert isinstance(exc, FluxClusterError), repr(exc)
    text = str(exc)
    assert "\n" not in text
    assert re.search(pattern, text), text
    return text


# ---- item 1: code execution


EVIL = """
from pathlib import Path
Path({marker!r}).write_text("ran")
"""

AUTO_MAPS = {
    "config.json": (
        "bert",
        {
            "model_type": "evil-bert",
            "auto_map": {
                "AutoConfig": "evil.EvilConfig",
                "AutoModelForSequenceClassification": "evil.EvilModel",
            },
        },
    ),
    "tokenizer_config.json": (
        "bert",
        {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}},
    ),
    "preprocessor_config.json": (
        "vit",
        {"image_processor_type": "EvilProcessor", "auto_map": {"AutoImageProcessor": "evil.EvilProcessor"}},
    ),
}


@pytest.mark.parametrize("name", list(AUTO_MAPS))
def test_a_folder_with_custom_code_is_refused_and_runs_nothing_when_stdin_says_yes(
    tiny_hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    kind, fields = AUTO_MAPS[name]
    folder = _copy(tiny_hf, kind, tmp_path)
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    _edit(folder, name, lambda d: d.update(fields))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 8))  # a rank that inherited a "yes"
    load = load_model if name == "config.json" else load_processor
    with pytest.raises(FluxClusterError) as error:
        load(folder, TASKS[kind])
    assert not marker.exists(), "the folder's code ran"
    _one_line(error.value, f"^hf.model: {folder}/{name}: auto_map: names custom code .*never run")


# ---- items 2 and 3: one line, nothing allocated


def _safetensors(folder: Path) -> tuple[dict[str, Any], bytes]:
    raw = (folder / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _write_safetensors(folder: Path, header: Any, data: bytes, length: int | None = None) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", length or len(text)) + text + data)


def _damage(how: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        header, data = _safetensors(folder)
        names = [k for k in header if k != "__metadata__"]
        first, second = header[names[0]], header[names[1]]
        if how == "huge length":
            _write_safetensors(folder, header, data, length=2**62)
        elif how == "zero length":
            (folder / "model.safetensors").write_bytes(
                struct.pack("<Q", 0) + json.dumps(header).encode() + data
            )
        elif how == "over-long length":
            _write_safetensors(folder, header, data, length=len(json.dumps(header)) + len(data) + 1)
        elif how == "not JSON":
            _write_safetensors(folder, b"not json!!", data)
        elif how == "deep nesting":
            _write_safetensors(folder, b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", data)
        elif how == "out of the file":
            first["data_offsets"] = [0, 10**12]
            _write_safetensors(folder, header, data)
        elif how == "overlapping":
            second["data_offsets"] = first["data_offsets"]
            _write_safetensors(folder, header, data)
        elif how == "shape unlike its bytes":
            first["shape"] = [10**6, 10**6]
            _write_safetensors(folder, header, data)
        elif how == "../ names":
            _write_safetensors(
                folder, {("../" + k if k != "__metadata__" else k): v for k, v in header.items()}, data
            )
        elif how == "index naming ../":
            (folder / "model.safetensors").rename(folder / "shard.safetensors")
            (folder / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": dict.fromkeys(names, "../model/shard.safetensors")})
            )

    return damage


SAFETENSORS = {
    "huge length": "model.safetensors: safetensors header length 4611686018427387904 in a file of",
    "zero length": "model.safetensors: safetensors header length 0 ",
    "over-long length": "model.safetensors: safetensors header length .*; expected 2 to",
    "not JSON": "model.safetensors: not valid JSON",
    "deep nesting": "model.safetensors: JSON nested too deeply",
    "out of the file": "model.safetensors: header entry 'bert.*': 1000000000000 bytes for shape",
    "overlapping": "model.safetensors: header entry .* starts at byte .* \\(tensors overlap",
    "shape unlike its bytes": "model.safetensors: header entry .* bytes for shape \\[1000000, 1000000\\]",
    "../ names": "model.safetensors: 100% of the bert model's weights are not in it",
    "index naming ../": "model.safetensors.index.json: weight_map: expected an object of tensor names",
}


def _nested(depth: int) -> Callable[[Path], None]:
    def nest(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        text = json.dumps(config)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
        (folder / "config.json").write_text(text)

    return nest


def _set(name: str, **fields: Any) -> Callable[[Path], None]:
    return lambda folder: _edit(folder, name, lambda d: d.update(fields))


def _other_architecture(tiny_hf: Path) -> Callable[[Path], None]:
    return lambda folder: shutil.copy(tiny_hf / "gpt2" / "config.json", folder / "config.json")


FOLDERS: dict[str, tuple[str, Callable[..., Callable[[Path], None]], str]] = {
    **{
        f"safetensors {how}": ("bert", lambda _, how=how: _damage(how), says)
        for how, says in SAFETENSORS.items()
    },
    "config.json 100 levels deep": (
        "bert",
        lambda _: _nested(100),
        "config.json: JSON nested more than 32 levels",
    ),
    "config.json 100,000 levels deep": (
        "bert",
        lambda _: _nested(100_000),
        "config.json: JSON nested too deeply",
    ),
    "unknown model_type": (
        "bert",
        lambda _: _set("config.json", model_type="nonesuch"),
        "config.json: model_type 'nonesuch': expected one of the",
    ),
    "a million layers": (
        "bert",
        lambda _: _set("config.json", num_hidden_layers=1_000_000),
        "config.json: num_hidden_layers: 1000000; expected at most 512",
    ),
    "a vocabulary past the weights": (
        "bert",
        lambda _: _set("config.json", vocab_size=100_000),
        "config.json: describes a bert model of 3,[0-9,]+ weights, but its safetensors files hold",
    ),
    "an image of 64 MP": (
        "vit",
        lambda _: _set("config.json", image_size=8000),
        "config.json: image_size: 8000 is",
    ),
    "weights of another architecture": (
        "bert",
        _other_architecture,
        "model.safetensors: 100% of the gpt2 model's weights are not in it .* not another architecture's",
    ),
}


@pytest.mark.parametrize("case", list(FOLDERS))
def test_a_damaged_model_folder_is_one_line_naming_the_file_and_key(
    tiny_hf: Path, tmp_path: Path, case: str
) -> None:
    kind, make, says = FOLDERS[case]
    folder = _copy(tiny_hf, kind, tmp_path)
    make(tiny_hf)(folder)
    with pytest.raises(BaseException) as error:
        load_model(folder, TASKS[kind], 3 if kind != "gpt2" else None)
    _one_line(error.value, f"^hf.model: {folder}/{says}")


@pytest.mark.parametrize(
    ("kind", "name", "fields", "says"),
    [
        (
            "vit",
            "preprocessor_config.json",
            {"size": {"height": 40000, "width": 40000}},
            "size: .* is 1,600,000,000",
        ),
        ("vit", "preprocessor_config.json", {"crop_size": 9000}, "crop_size: 9000 is 81,000,000 pixels"),
        (
            "bert",
            "tokenizer_config.json",
            {"x": json.loads("[" * 40 + "]" * 40)},
            "JSON nested more than 32 levels",
        ),
    ],
)
def test_a_processor_config_past_its_bounds_is_one_line(
    tiny_hf: Path, tmp_path: Path, kind: str, name: str, fields: dict, says: str
) -> None:
    folder = _copy(tiny_hf, kind, tmp_path)
    _edit(folder, name, lambda d: d.update(fields))
    with pytest.raises(BaseException) as error:
        load_processor(folder, TASKS[kind])
    _one_line(error.value, f"^hf.model: {folder}/{name}: {says}")


@pytest.mark.parametrize(("name", "load"), [("config.json", load_model), ("tokenizer.json", load_processor)])
def test_a_fifo_in_the_model_folder_is_refused_not_opened(
    tiny_hf: Path, tmp_path: Path, within: Callable, name: str, load: Callable
) -> None:
    folder = _copy(tiny_hf, "bert", tmp_path)
    (folder / name).unlink()
    os.mkfifo(folder / name)
    error = within(20, lambda: load(folder, "text-classification"), folder / name)
    _one_line(error, f"^hf.model: {folder}/{name}: not a regular file; refused")


def test_lora_on_the_classification_head_is_one_line_naming_the_other_targets(tiny_hf: Path) -> None:
    model = load_model(tiny_hf / "bert", "text-classification")
    with pytest.raises(BaseException) as error:
        add_lora(model, lora_targets(model, ["classifier"]), 4, 8.0)
    _one_line(
        error.value,
        r"^train\.lora_targets: classifier is the classification head .* its other linear modules: "
        r"dense, key, query, value$",
    )


@pytest.mark.parametrize(("kind", "dtype"), [("bert", "int32"), ("gpt2", "int16")])
def test_integer_weights_are_one_line_but_integer_buffers_load(
    tiny_hf: Path, tmp_path: Path, kind: str, dtype: str
) -> None:
    """Weights stored as integers were cast to floats and trained to COMPLETED with 'validation loss nan';
    a buffer stored as integers (old BERT checkpoints' position_ids) is no weight and still loads."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny_hf, kind, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    first = sorted(tensors)[0]
    buffers = {"extra.position_ids": torch.arange(8, dtype=torch.int64)[None]}
    save_file(tensors | buffers, folder / "model.safetensors")
    load_model(folder, TASKS[kind], 3 if kind != "gpt2" else None)
    save_file(tensors | {first: tensors[first].to(getattr(torch, dtype))}, folder / "model.safetensors")
    with pytest.raises(BaseException) as error:
        load_model(folder, TASKS[kind], 3 if kind != "gpt2" else None)
    _one_line(
        error.value,
        f"^hf.model: {folder}/model.safetensors: tensor '{re.escape(first)}' is stored as {dtype}; "
        "expected floating-point weights$",
    )
