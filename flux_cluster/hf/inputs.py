"""An hf.model folder we do not control, checked before transformers reads a byte of it.

transformers trusts what a folder says: an ``auto_map`` makes it import the folder's Python (after a
"run the custom code? [y/N]" prompt a rank's stdin could answer), a nested config.json ends in a
RecursionError, a damaged model.safetensors in the safetensors library's traceback, and sizes in
config.json or preprocessor_config.json allocate whatever they say. Here every file it would open is a
regular file, every JSON file is bounded in size and depth and names no custom code, model_type is one
transformers has, the sizes are bounded, and every safetensors header is checked (the FLUX loader's
checker, training/safetensors_stream.py) before any allocation. Each failure is one FluxClusterError line
naming the file and the key.
"""

import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flux_cluster.data.prep.image_folder import MAX_DECODE_PIXELS
from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import MIB, SMALL_JSON, OutsideFileError, read_json
from flux_cluster.safe_text import printable
from flux_cluster.training.safetensors_stream import check_safetensors, index_shards

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
MODEL_JSON = {
    CONFIG: SMALL_JSON,
    "generation_config.json": SMALL_JSON,
    "preprocessor_config.json": SMALL_JSON,
    "processor_config.json": SMALL_JSON,
    "tokenizer_config.json": SMALL_JSON,
    "special_tokens_map.json": SMALL_JSON,
    "added_tokens.json": 64 * MIB,
    "tokenizer.json": 64 * MIB,
    "vocab.json": 64 * MIB,
}
"""The JSON files transformers reads from a model folder, with the largest each may be (a big
vocabulary's tokenizer.json is tens of MB; a config a few KB)."""
MAX_JSON_DEPTH = 32
"""Levels of nesting a model folder's JSON may have (real ones have 3 or 4); deeper ones end in a
RecursionError inside transformers."""
MAX_LAYERS = 512
"""Largest count of layers (or experts) a config.json may give: the biggest real models have ~130 layers;
transformers builds one module per layer before reading any weight."""
MAX_FILES = 10_000
"""Entries a model folder may have (a model on the Hub has a few dozen)."""
CUSTOM_CODE_KEYS = ("auto_map",)
"""Keys that make transformers import Python from the folder."""


@dataclass(frozen=True)
class ModelFolder:
    """A checked model folder: its config.json and the tensors its safetensors files hold."""

    path: Path
    config: dict[str, Any]
    weights: dict[str, list[int]]
    """Tensor name: shape, over every safetensors file of the weights."""
    integer: dict[str, str] = field(default_factory=dict)
    """Tensor name: dtype, of the tensors stored as integers or booleans (a model's buffers, such as
    position_ids, may be; a weight may not)."""

    @property
    def stored_parameters(self) -> int:
        return sum(math.prod(shape) for shape in self.weights.values())


def _refuse(where: Path | str, what: str) -> FluxClusterError:
    return FluxClusterError(f"hf.model: {printable(str(where))}: {what}")


def check_model_folder(path: Path) -> ModelFolder:
    """path as a ModelFolder once transformers can read it without running its code, recursing, or
    allocating past what its weights hold (see the module's docstring); else one FluxClusterError line."""
    if not (path / CONFIG).exists():
        raise _refuse(path, f"no {CONFIG}: expected a local model folder as save_pretrained writes it")
    _check_entries(path)
    documents = {name: _read_model_json(path / name, limit) for name, limit in MODEL_JSON.items()}
    config = documents[CONFIG]
    if not isinstance(config, dict):
        raise _refuse(path / CONFIG, f"expected a JSON object, found {type(config).__name__}")
    _check_model_type(path / CONFIG, config)
    _check_sizes(path / CONFIG, config)
    if isinstance(documents["preprocessor_config.json"], dict):
        _check_sizes(path / "preprocessor_config.json", documents["preprocessor_config.json"])
    return ModelFolder(path, config, *_weights(path))


def read_model_config(path: Path) -> dict[str, Any]:
    """config.json of a model folder, bounded, not nested too deeply and naming no custom code (the checks
    of check_model_folder that need no other file)."""
    config = _read_model_json(path / CONFIG, SMALL_JSON)
    if not isinstance(config, dict):
        raise _refuse(path / CONFIG, "expected a JSON object")
    return config


def _check_entries(path: Path) -> None:
    """Every entry a regular file or a folder (a FIFO named like a model file would block the open)."""
    try:
        with os.scandir(path) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_FILES:
                    raise _refuse(path, f"more than {MAX_FILES:,} entries; expected a model folder")
                mode = entry.stat().st_mode  # a symlink's target: Hugging Face snapshots link to blobs/
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise _refuse(entry.path, "not a regular file; refused (a model folder holds files)")
    except FileNotFoundError as exc:  # a dangling symlink
        raise _refuse(exc.filename or path, "a link to nothing; refused") from None
    except OSError as exc:
        raise _refuse(path, f"cannot be read ({exc.strerror or exc})") from None


def _read_model_json(file: Path, limit: int) -> Any:
    """The parsed file (None when absent), bounded, at most MAX_JSON_DEPTH deep, naming no custom code."""
    if not file.exists():
        return None
    try:
        document = read_json(file.resolve(), limit)
    except OutsideFileError as exc:
        raise _refuse(file, printable(str(exc).removeprefix(f"{file.resolve()}: "))) from None
    if _deeper_than(document, MAX_JSON_DEPTH):
        raise _refuse(file, f"JSON nested more than {MAX_JSON_DEPTH} levels deep; refused")
    if isinstance(document, dict):
        for key in CUSTOM_CODE_KEYS:
            if key in document:
                raise _refuse(
                    file,
                    f"{key}: names custom code ({printable(str(document[key])[:100])}); refused: a model "
                    "folder's code is never run. Expected a model of a type transformers has",
                )
    return document


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _check_model_type(file: Path, config: dict[str, Any]) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    kind = config.get("model_type")
    if not isinstance(kind, str) or kind not in CONFIG_MAPPING_NAMES:
        shown = printable(repr(kind)[:100])
        raise _refuse(
            file,
            f"model_type {shown}: expected one of the {len(CONFIG_MAPPING_NAMES)} model types this "
            "transformers has (bert, gpt2, vit, ...); a folder's own model code is never run",
        )


def _items(value: Any, depth: int = 0) -> list[tuple[str, Any]]:
    """Every (key, value) of a JSON object and of the objects inside it (sub-configs)."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict) and depth <= MAX_JSON_DEPTH:
        for key, item in value.items():
            found.append((key, item))
            found += _items(item, depth + 1)
    return found


def _check_sizes(file: Path, document: dict[str, Any]) -> None:
    """Layer counts under MAX_LAYERS; image sizes (a model's image_size, a processor's size/crop_size)
    at most the pixels an image may decode to (data/prep/image_folder.MAX_DECODE_PIXELS)."""
    for key, value in _items(document):
        if key.endswith(("layers", "layer", "experts")) and _number(value) and value > MAX_LAYERS:
            raise _refuse(file, f"{key}: {value}; expected at most {MAX_LAYERS}")
        if key in ("image_size", "size", "crop_size"):
            pixels = _pixels(value)
            if pixels is not None and pixels > MAX_DECODE_PIXELS:
                raise _refuse(
                    file,
                    f"{key}: {printable(str(value)[:100])} is {pixels:,} pixels an image; expected at most "
                    f"{MAX_DECODE_PIXELS:,}",
                )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pixels(value: Any) -> int | float | None:
    """An image size's pixels: a side (squared), [height, width], or {height, width} / {shortest_edge}
    / {longest_edge}; None for anything else (transformers says what it expected)."""
    if _number(value):
        return value * value
    if isinstance(value, list) and len(value) == 2 and all(_number(v) for v in value):
        return value[0] * value[1]
    if isinstance(value, dict):
        sides = [value.get(k) for k in ("height", "width")]
        if all(_number(v) for v in sides):
            return sides[0] * sides[1]
        edges = [value[k] for k in ("shortest_edge", "longest_edge") if _number(value.get(k))]
        return max(edges) ** 2 if edges else None
    return None


def _weights(path: Path) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The tensors of the folder's safetensors weights (name: shape) and those stored as integers (name:
    dtype), every header checked before transformers reads it."""
    if (path / WEIGHTS).exists():
        files = [path / WEIGHTS]
    elif (path / WEIGHTS_INDEX).exists():
        try:
            files = index_shards(path / WEIGHTS_INDEX)
        except FluxClusterError as exc:
            raise FluxClusterError(f"hf.model: {printable(str(exc))}") from None
    else:
        raise _refuse(
            path,
            f"no {WEIGHTS} (or {WEIGHTS_INDEX}): expected safetensors weights as save_pretrained writes "
            "them (pickled pytorch_model.bin weights are not read)",
        )
    tensors: dict[str, list[int]] = {}
    integer: dict[str, str] = {}
    for file in files:
        try:
            found = check_safetensors(file)
        except OutsideFileError as exc:
            raise FluxClusterError(f"hf.model: {printable(str(exc))}") from None
        except OSError as exc:
            raise _refuse(file, f"cannot be read ({exc.strerror or exc})") from None
        tensors |= {name: shape for name, (_, shape) in found.items()}
        integer |= {
            n: str(d).removeprefix("torch.") for n, (d, _) in found.items() if not d.is_floating_point
        }
    return tensors, integer


def check_seq_len(path: Path, task: str, seq_len: int) -> None:
    """hf.seq_len within the positions config.json gives (text tasks), checked before any text is
    tokenized or any synthetic sample made."""
    if task == "image-classification" or not (path / CONFIG).is_file():  # load_model says what is missing
        return
    config = read_model_config(path)
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    if _number(positions) and seq_len > positions:
        raise FluxClusterError(
            f"hf.seq_len: {seq_len} is longer than the {positions} positions of {path} ({CONFIG}); "
            f"expected at most {positions}"
        )


def check_fits_weights(folder: ModelFolder, auto: Any, config: Any, labels: int | None = None) -> None:
    """The model config describes (built on the meta device: nothing allocated) holds at most twice the
    weights the folder stores, so loading allocates no more than its files hold (a config.json of another,
    bigger model, or a vocabulary of 10^10, would otherwise be allocated and initialized at random).
    ``labels``: the config's head was widened to the data's label count, which the line then blames."""
    import torch

    with torch.device("meta"):
        model = auto.from_config(config)
    _check_float_weights(folder, [name for name, _ in model.named_parameters()])
    wanted = sum(p.numel() for p in model.parameters())
    stored = folder.stored_parameters
    if wanted > 2 * stored and labels is not None:
        raise FluxClusterError(
            f"hf.data: {labels:,} distinct labels make a classification head that takes the model from "
            f"{stored:,} to {wanted:,} weights; expected a label column of classes (at most {2 * stored:,} "
            "weights in all)"
        )
    if wanted > 2 * stored:
        raise _refuse(
            folder.path / CONFIG,
            f"describes a {printable(str(config.model_type))} model of {wanted:,} weights, but its "
            f"safetensors files hold {stored:,}; expected the config.json saved with the weights",
        )


def _check_float_weights(folder: ModelFolder, parameters: list[str]) -> None:
    """No weight of the model stored as integers: transformers casts them to floats (bf16 bytes read as
    int16 become values of thousands) and the run ends in 'validation loss nan', COMPLETED. A stored name
    matches a parameter's with or without the base model's prefix (bert.encoder... / encoder...)."""
    for name, dtype in folder.integer.items():
        if any(name == p or name.endswith(f".{p}") or p.endswith(f".{name}") for p in parameters):
            raise _refuse(
                folder.path / (WEIGHTS if (folder.path / WEIGHTS).exists() else WEIGHTS_INDEX),
                f"tensor '{printable(name[:100])}' is stored as {dtype}; expected floating-point weights",
            )


def check_loaded(folder: ModelFolder, model: Any, info: dict[str, Any]) -> None:
    """Most of the model's weights came from the files (transformers' loading info): weights of another
    architecture load as a model of fresh random weights, which would train to COMPLETED meaning nothing."""
    sizes = {name: tensor.numel() for name, tensor in model.state_dict().items()}
    total = sum(p.numel() for p in model.parameters())
    mismatched = {item[0] if isinstance(item, tuple) else item for item in info.get("mismatched_keys", ())}
    missing = sorted(set(info.get("missing_keys", ())) | mismatched)
    fresh = sum(sizes.get(name, 0) for name in missing)
    if total and fresh * 2 > total:
        files = WEIGHTS if (folder.path / WEIGHTS).exists() else WEIGHTS_INDEX
        raise _refuse(
            folder.path / files,
            f"{fresh / total:.0%} of the {printable(str(model.config.model_type))} model's weights are not "
            f"in it ({len(missing)} tensors, e.g. '{printable(missing[0][:100])}'); expected the weights "
            "saved with its config.json, not another architecture's",
        )
