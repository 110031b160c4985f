"""The hf workload's data: local files read into columns, then tensors of the model's inputs.

Formats (hf.data): a folder saved by datasets' ``save_to_disk`` (read with pyarrow: the same Arrow
stream files, no ``datasets`` import), JSONL/JSON-lines, CSV or Parquet files (a file, or a folder whose
train*/val*/validation*/test* files name the splits), an imagefolder (class subfolders, or train/ and
val/ folders of them), or ``synthetic``: random inputs of the model's shapes. Anything unreadable is one
FluxClusterError line naming the path and what was expected.
"""

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flux_cluster.config.hf import SYNTHETIC, HfConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import OutsideFileError, read_json_object

TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
VAL_SPLITS = ("validation", "val", "valid", "test")
Columns = dict[str, list[Any]]


@dataclass(frozen=True)
class Splits:
    """The model's inputs (tensors, or LazyImages: first dimension samples); val None: no evaluation."""

    train: dict[str, Any]
    val: dict[str, Any] | None
    num_labels: int | None = None
    """Classification: the labels the data has (the model's head must have at least these)."""

    @staticmethod
    def size(split: dict[str, Any] | None) -> int:
        return 0 if not split else len(next(iter(split.values())))


# ---- reading columns


def read_splits(path: Path, hf: HfConfig) -> tuple[Columns, Columns | None]:
    """(train, val or None) columns of a local dataset."""
    if not path.exists():
        raise FluxClusterError(f"hf.data: {path} does not exist: expected a local dataset or 'synthetic'")
    try:
        if path.is_file():
            return _read_table(path), None
        if (path / "dataset_dict.json").is_file():
            return _read_dataset_dict(path)
        if (path / "state.json").is_file():
            return _read_arrow_dataset(path), None
        tables = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in TABLE_SUFFIXES)
        if tables:
            return _named_splits(path, {p.stem: p for p in tables}, _read_table)
        return _read_imagefolder(path, hf)
    except FluxClusterError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:  # pyarrow's errors are ValueErrors / OSErrors
        raise FluxClusterError(f"hf.data: {path}: cannot be read ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _named_splits(
    path: Path, named: dict[str, Path], read: Callable[[Path], Columns]
) -> tuple[Columns, Columns | None]:
    train = [p for name, p in named.items() if name.lower().startswith("train")]
    val = [p for name, p in named.items() if name.lower().startswith(VAL_SPLITS)]
    if not train:
        if len(named) != 1:
            raise FluxClusterError(
                f"hf.data: {path}: expected train* (and val*/validation*/test*) files or folders, found "
                f"{', '.join(sorted(named)) or 'none'}"
            )
        train = list(named.values())
    return _concat([read(p) for p in train]), _concat([read(p) for p in val]) if val else None


def _concat(parts: list[Columns]) -> Columns:
    out: Columns = {}
    for part in parts:
        for key, values in part.items():
            out.setdefault(key, []).extend(values)
    return out


def _read_table(path: Path) -> Columns:
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet

    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        table = pyarrow.json.read_json(path)
    elif suffix == ".csv":
        table = pyarrow.csv.read_csv(path)
    elif suffix == ".parquet":
        table = pyarrow.parquet.read_table(path)
    else:
        raise FluxClusterError(f"hf.data: {path}: expected a .jsonl, .json, .csv or .parquet file")
    return table.to_pydict()


def _read_arrow_dataset(folder: Path) -> Columns:
    """One split saved by ``Dataset.save_to_disk``: state.json lists its Arrow stream files."""
    import pyarrow as pa

    try:
        state = read_json_object(folder / "state.json")
    except OutsideFileError as exc:
        raise FluxClusterError(f"hf.data: {exc}") from None
    files = [f.get("filename") for f in state.get("_data_files", []) if isinstance(f, dict)]
    if not files or not all(isinstance(f, str) and "/" not in f for f in files):
        raise FluxClusterError(f"hf.data: {folder}/state.json: expected _data_files naming its .arrow files")
    tables = []
    for name in files:
        with pa.memory_map(str(folder / name)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables).to_pydict()


def _read_dataset_dict(folder: Path) -> tuple[Columns, Columns | None]:
    """A ``DatasetDict.save_to_disk`` folder: dataset_dict.json names the split subfolders."""
    try:
        splits = read_json_object(folder / "dataset_dict.json").get("splits")
    except OutsideFileError as exc:
        raise FluxClusterError(f"hf.data: {exc}") from None
    if not isinstance(splits, list) or not all(isinstance(s, str) and "/" not in s for s in splits):
        raise FluxClusterError(f"hf.data: {folder}/dataset_dict.json: expected 'splits': a list of names")
    return _named_splits(folder, {s: folder / s for s in splits}, _read_arrow_dataset)


def _read_imagefolder(folder: Path, hf: HfConfig) -> tuple[Columns, Columns | None]:
    subdirs = {p.name: p for p in sorted(folder.iterdir()) if p.is_dir()}
    if any(name.lower().startswith(("train", *VAL_SPLITS)) for name in subdirs):
        classes = sorted({c.name for d in subdirs.values() for c in d.iterdir() if c.is_dir()})
        return _named_splits(folder, subdirs, lambda d: _image_classes(d, classes, hf))
    classes = sorted(subdirs)
    return _image_classes(folder, classes, hf), None


def _image_classes(folder: Path, classes: list[str], hf: HfConfig) -> Columns:
    images: list[Path] = []
    labels: list[int] = []
    for index, name in enumerate(classes):
        found = sorted(p for p in (folder / name).glob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        images += found
        labels += [index] * len(found)
    if not images:
        raise FluxClusterError(
            f"hf.data: {folder}: no data found: expected a save_to_disk folder, {'/'.join(TABLE_SUFFIXES)} "
            f"files, or an imagefolder (one subfolder of {'/'.join(IMAGE_SUFFIXES)} images per class)"
        )
    return {hf.image_column: images, hf.label_column: labels}


# ---- columns to tensors


def label_ids(values: list[Any], where: str, names: dict[str, int] | None = None) -> tuple[list[int], int]:
    """Integer labels and how many there are. Names map to integers in sorted order: names, the map of
    every split (label_names), so that train and val number them alike; else these values' own."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        if any(v < 0 for v in values):
            raise FluxClusterError(f"hf.data: {where}: labels must be 0 or more")
        return list(values), (max(values) + 1 if values else 0)
    if all(isinstance(v, str) for v in values):
        index = names if names is not None else label_names([values])
        return [index[v] for v in values], len(index)
    raise FluxClusterError(f"hf.data: {where}: labels must be all integers or all names")


def label_names(splits: list[list[Any]]) -> dict[str, int]:
    """The label names of all the splits numbered in sorted order (integers among them are ignored:
    label_ids refuses a mix)."""
    names = sorted({v for values in splits for v in values if isinstance(v, str)})
    return {name: i for i, name in enumerate(names)}


def shuffled(columns: Columns, seed: int) -> Columns:
    """The rows in one seeded order: files are often sorted by label (imdb, an imagefolder), so cutting
    hf.max_samples or holding out the last rows would otherwise take one class."""
    size = len(next(iter(columns.values()), []))
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
    return {key: [values[i] for i in order] for key, values in columns.items()}


def column(columns: Columns, name: str, key: str, where: Path) -> list[Any]:
    if name not in columns:
        raise FluxClusterError(
            f"hf.{key}: {where} has no column {name!r} (columns: {', '.join(sorted(columns)) or 'none'})"
        )
    return columns[name]


def pack_blocks(token_lists: list[list[int]], seq_len: int) -> torch.Tensor:
    """Causal LM: every text's tokens one after the other, cut into blocks of seq_len (the rest dropped)."""
    flat = [t for tokens in token_lists for t in tokens]
    blocks = len(flat) // seq_len
    return torch.tensor(flat[: blocks * seq_len], dtype=torch.long).view(blocks, seq_len)


class SampleError(FluxClusterError):
    """Bad input that only the rank reading it meets (a corrupt image in its share): that rank says so."""


def _open_image(value: Any, where: Path, index: int) -> Any:
    from PIL import Image

    name = f"{where} (sample {index})"
    if isinstance(value, dict):  # datasets' Image feature: {"bytes", "path"}
        name = str(value.get("path") or name)
        value = io.BytesIO(value["bytes"]) if value.get("bytes") else value.get("path")
    elif not isinstance(value, bytes):
        name = str(value)
    try:
        with Image.open(value) as image:
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # PIL's UnidentifiedImageError too
        raise SampleError(
            f"hf.data: {name}: expected an image, cannot be read ({_first_line(exc)})"
        ) from None


class LazyImages:
    """Image files or bytes decoded and processed per batch (indexed like a tensor's first dimension), so a
    large image dataset is not held in memory as pixels; the first image is checked when made."""

    def __init__(self, sources: list[Any], processor: Any, where: Path) -> None:
        self.sources, self.processor, self.where = sources, processor, where
        if sources:
            try:
                self[torch.arange(1)]
            except SampleError as exc:  # met by every rank: a plain one-line error
                raise FluxClusterError(str(exc)) from None
            except (OSError, ValueError) as exc:
                raise FluxClusterError(
                    f"hf.data: {where}: an image cannot be read ({_first_line(exc)})"
                ) from None

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: slice | torch.Tensor) -> Any:
        if isinstance(index, slice):
            return LazyImages(self.sources[index], self.processor, self.where)
        images = [_open_image(self.sources[i], self.where, i) for i in index.tolist()]
        return self.processor(images=images, return_tensors="pt")["pixel_values"]


def encode(
    columns: Columns,
    task: str,
    hf: HfConfig,
    processor: Any,
    where: Path,
    names: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One split's columns (shuffled: the cut to hf.max_samples takes every class) as the model's input
    tensors, labels included (names: label_names of every split)."""
    if hf.max_samples is not None:
        columns = {k: v[: hf.max_samples] for k, v in columns.items()}
    if task == "image-classification":
        images = LazyImages(column(columns, hf.image_column, "image_column", where), processor, where)
        labels, _ = label_ids(column(columns, hf.label_column, "label_column", where), str(where), names)
        return {"pixel_values": images, "labels": torch.tensor(labels, dtype=torch.long)}
    texts = [str(t) for t in column(columns, hf.text_column, "text_column", where)]
    if task == "causal-lm":
        ids = processor(texts, add_special_tokens=False)["input_ids"]
        eos = processor.eos_token_id
        blocks = pack_blocks([[*t, eos] if eos is not None else t for t in ids], hf.seq_len)
        if not len(blocks):
            raise FluxClusterError(f"hf.data: {where}: fewer than hf.seq_len ({hf.seq_len}) tokens of text")
        return {"input_ids": blocks, "attention_mask": torch.ones_like(blocks), "labels": blocks.clone()}
    labels, _ = label_ids(column(columns, hf.label_column, "label_column", where), str(where), names)
    if processor.pad_token is None:  # GPT-2-like tokenizers have none: pad with end-of-text
        processor.pad_token = processor.eos_token
    encoded = processor(
        texts, truncation=True, padding="max_length", max_length=hf.seq_len, return_tensors="pt"
    )
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": torch.tensor(labels, dtype=torch.long),
    }


def synthetic(task: str, hf: HfConfig, model_config: Any, samples: int, seed: int) -> dict[str, torch.Tensor]:
    """Random inputs of the model's shapes: token ids below its vocabulary, labels below its labels,
    images of its size."""
    generator = torch.Generator().manual_seed(seed)
    if task == "image-classification":
        size = int(getattr(model_config, "image_size", 224))
        channels = int(getattr(model_config, "num_channels", 3))
        pixels = torch.randn(samples, channels, size, size, generator=generator)
        return {"pixel_values": pixels, "labels": _random_labels(model_config, samples, generator)}
    ids = torch.randint(0, model_config.vocab_size, (samples, hf.seq_len), generator=generator)
    if task == "causal-lm":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": _random_labels(model_config, samples, generator),
    }


def _random_labels(model_config: Any, samples: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, model_config.num_labels, (samples,), generator=generator)


def hold_out(split: dict[str, torch.Tensor], fraction: float) -> tuple[dict, dict | None]:
    """(train, val): the last fraction of the samples held out (at least one), or no val for 0. The
    samples come shuffled (load_data), so the last ones are not one class."""
    size = Splits.size(split)
    held = math.ceil(size * fraction) if fraction else 0
    if not held or held >= size:
        return split, None
    return {k: v[:-held] for k, v in split.items()}, {k: v[-held:] for k, v in split.items()}


def load_data(hf: HfConfig, task: str, processor: Any, model_config: Any, seed: int) -> Splits:
    """The run's train and val tensors (val: the data's own split, else hf.val_fraction of train)."""
    assert hf.data is not None
    if hf.data == SYNTHETIC:
        train = synthetic(task, hf, model_config, hf.synthetic_samples, seed)
        val = synthetic(task, hf, model_config, max(hf.synthetic_samples // 8, 1), seed + 1)
    else:
        path = Path(hf.data)
        train_columns, val_columns = read_splits(path, hf)
        train_columns = shuffled(train_columns, seed)
        val_columns = shuffled(val_columns, seed + 1) if val_columns else None
        names = None
        if task != "causal-lm":
            names = label_names([c.get(hf.label_column, []) for c in (train_columns, val_columns or {})])
        train = encode(train_columns, task, hf, processor, path, names)
        val = encode(val_columns, task, hf, processor, path, names) if val_columns else None
        if val is None:
            train, val = hold_out(train, hf.val_fraction)
    return Splits(train, val, None if task == "causal-lm" else count_labels(train, val))


def count_labels(train: dict[str, Any], val: dict[str, Any] | None) -> int | None:
    """The labels the model's head needs: the largest in train and val, plus one."""
    found = [int(s["labels"].max()) + 1 for s in (train, val) if s is not None and Splits.size(s)]
    return max(found) if found else None
