"""The hf workload's data: local files read into columns, then tensors of the model's inputs.

Formats (hf.data): a folder saved by datasets' ``save_to_disk`` (read with pyarrow: the same Arrow
stream files, no ``datasets`` import), JSONL/JSON-lines, CSV or Parquet files (a file, or a folder whose
train*/val*/validation*/test* files name the splits), an imagefolder (class subfolders, or train/ and
val/ folders of them), or ``synthetic``: random inputs of the model's shapes. Anything unreadable is one
FluxClusterError line naming the path and what was expected.
"""

import contextlib
import io
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from flux_cluster.config.hf import SYNTHETIC, HfConfig
from flux_cluster.data.prep.image_folder import MAX_DECODE_PIXELS
from flux_cluster.errors import FluxClusterError, first_line
from flux_cluster.hf.tables import Columns, RowSample, read_arrow_stream, read_table
from flux_cluster.outside import OutsideFileError, open_regular, read_json_object
from flux_cluster.safe_text import printable

TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
VAL_SPLITS = ("validation", "val", "valid", "test")


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


def read_splits(path: Path, hf: HfConfig, seed: int = 0) -> tuple[Columns, Columns | None]:
    """(train, val or None) columns of a local dataset: every row, or (hf.max_samples) a seeded uniform
    sample of that many rows of each split, read in bounded batches (flux_cluster/hf/tables.py)."""
    if not path.exists():
        raise FluxClusterError(
            f"hf.data: {printable(str(path))} does not exist: expected a local dataset or 'synthetic'"
        )
    try:
        if path.is_file():
            return _split(path, [path], read_table, hf, seed), None
        if (path / "dataset_dict.json").is_file():
            return _read_dataset_dict(path, hf, seed)
        if (path / "state.json").is_file():
            return _split(path, [path], _read_arrow_dataset, hf, seed), None
        tables = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in TABLE_SUFFIXES)
        if tables:
            return _named_splits(path, {p.stem: p for p in tables}, read_table, hf, seed)
        return _read_imagefolder(path, hf, seed)
    except FluxClusterError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:  # pyarrow's errors are ValueErrors / OSErrors
        shown = printable(str(path))
        raise FluxClusterError(f"hf.data: {shown}: cannot be read ({first_line(exc)})") from None


Reader = Callable[[Path, RowSample], None]


def _split(where: Path, parts: list[Path], read: Reader, hf: HfConfig, seed: int) -> Columns:
    """One split's columns from its parts (files or folders), sampled to hf.max_samples as they stream."""
    sample = RowSample(hf.max_samples, seed, hf.label_column)
    for part in parts:
        read(part, sample)
    return sample.columns(where)


def _named_splits(
    path: Path, named: dict[str, Path], read: Reader, hf: HfConfig, seed: int
) -> tuple[Columns, Columns | None]:
    train = [p for name, p in named.items() if name.lower().startswith("train")]
    val = [p for name, p in named.items() if name.lower().startswith(VAL_SPLITS)]
    if not train:
        if len(named) != 1:
            found = ", ".join(printable(n) for n in sorted(named)) or "none"
            raise FluxClusterError(
                f"hf.data: {printable(str(path))}: expected train* (and val*/validation*/test*) files or "
                f"folders, found {found}"
            )
        train = list(named.values())
    return _split(path, train, read, hf, seed), _split(path, val, read, hf, seed + 1) if val else None


def _read_arrow_dataset(folder: Path, sample: RowSample) -> None:
    """One split saved by ``Dataset.save_to_disk``: state.json lists its Arrow stream files."""
    try:
        state = read_json_object(folder / "state.json")
    except OutsideFileError as exc:
        raise FluxClusterError(f"hf.data: {printable(str(exc))}") from None
    files = [f.get("filename") for f in state.get("_data_files", []) if isinstance(f, dict)]
    if not files or not all(isinstance(f, str) and "/" not in f and f not in ("", "..") for f in files):
        raise FluxClusterError(
            f"hf.data: {printable(str(folder))}/state.json: expected _data_files naming its .arrow files"
        )
    for name in files:
        read_arrow_stream(folder / name, sample)


def _read_dataset_dict(folder: Path, hf: HfConfig, seed: int) -> tuple[Columns, Columns | None]:
    """A ``DatasetDict.save_to_disk`` folder: dataset_dict.json names the split subfolders."""
    try:
        splits = read_json_object(folder / "dataset_dict.json").get("splits")
    except OutsideFileError as exc:
        raise FluxClusterError(f"hf.data: {printable(str(exc))}") from None
    if not isinstance(splits, list) or not all(isinstance(s, str) and "/" not in s for s in splits):
        raise FluxClusterError(
            f"hf.data: {printable(str(folder))}/dataset_dict.json: expected 'splits': a list of names"
        )
    return _named_splits(folder, {s: folder / s for s in splits}, _read_arrow_dataset, hf, seed)


def _read_imagefolder(folder: Path, hf: HfConfig, seed: int) -> tuple[Columns, Columns | None]:
    subdirs = {p.name: p for p in sorted(folder.iterdir()) if p.is_dir()}
    split_folders = any(name.lower().startswith(("train", *VAL_SPLITS)) for name in subdirs)
    if split_folders:
        classes = sorted({c.name for d in subdirs.values() for c in d.iterdir() if c.is_dir()})
    else:
        classes = sorted(subdirs)

    def read(part: Path, sample: RowSample) -> None:
        _image_classes(part, classes, hf, sample)

    if split_folders:
        return _named_splits(folder, subdirs, read, hf, seed)
    return _split(folder, [folder], read, hf, seed), None


def _image_classes(folder: Path, classes: list[str], hf: HfConfig, sample: RowSample) -> None:
    images: list[str] = []
    labels: list[int] = []
    for index, name in enumerate(classes):
        found = sorted(str(p) for p in (folder / name).glob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        images += found
        labels += [index] * len(found)
    if not images:
        raise FluxClusterError(
            f"hf.data: {printable(str(folder))}: no data found: expected a save_to_disk folder, "
            f"{'/'.join(TABLE_SUFFIXES)} files, or an imagefolder (one subfolder of "
            f"{'/'.join(IMAGE_SUFFIXES)} images per class)"
        )
    sample.add(pa.table({hf.image_column: images, hf.label_column: labels}), folder)


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
        found = ", ".join(printable(c) for c in sorted(columns)) or "none"
        raise FluxClusterError(
            f"hf.{key}: {printable(str(where))} has no column {printable(repr(name))} (columns: {found})"
        )
    return columns[name]


def pack_blocks(token_lists: list[list[int]], seq_len: int) -> torch.Tensor:
    """Causal LM: every text's tokens one after the other, cut into blocks of seq_len (the rest dropped)."""
    return _blocks(_joined(token_lists, None), seq_len)


def _joined(token_lists: list[list[int]], end: int | None) -> torch.Tensor:
    """Every text's tokens one after the other, each text followed by end when given."""
    tail = [] if end is None else [end]
    return torch.tensor([t for tokens in token_lists for t in (*tokens, *tail)], dtype=torch.long)


def _blocks(flat: torch.Tensor, seq_len: int) -> torch.Tensor:
    blocks = len(flat) // seq_len
    return flat[: blocks * seq_len].view(blocks, seq_len)


class SampleError(FluxClusterError):
    """Bad input that only the rank reading it meets (a corrupt image in its share): that rank says so."""


def _open_image(value: Any, where: Path, index: int) -> Any:
    """One image as RGB, from a file (a regular one: a FIFO would block the open) or bytes, refused from its
    header when it would decode to more than the pixels an image may have (data encode's cap)."""
    from PIL import Image, UnidentifiedImageError

    name, data, path = f"{where} (sample {index})", None, value
    if isinstance(value, dict):  # datasets' Image feature: {"bytes", "path"}
        name, data, path = str(value.get("path") or name), value.get("bytes"), value.get("path")
    elif isinstance(value, bytes):
        data = value
    else:
        name = str(value)
    shown = printable(name)
    try:
        with contextlib.ExitStack() as stack:
            source = (
                io.BytesIO(data) if data else stack.enter_context(open_regular(Path(str(path)).resolve()))
            )
            with warnings.catch_warnings():  # PIL's 89 MP warning: the cap below is ours, said once
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = stack.enter_context(Image.open(source))
            if image.width * image.height > MAX_DECODE_PIXELS:
                raise SampleError(
                    f"hf.data: {shown}: {image.width}x{image.height} pixels, over the {MAX_DECODE_PIXELS:,} "
                    "an image may have here; expected a picture of at most about 40 megapixels"
                )
            return image.convert("RGB")
    except OutsideFileError as exc:
        reason = str(exc).rsplit(": ", 1)[-1]
        raise SampleError(f"hf.data: {shown}: expected an image file, {printable(reason)}") from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # PIL's UnidentifiedImageError too
        # PIL names the open file object, not the file: its type says it all
        why = "not a format PIL reads" if isinstance(exc, UnidentifiedImageError) else first_line(exc)
        raise SampleError(f"hf.data: {shown}: expected an image, cannot be read ({why})") from None


class PeerSampleError(FluxClusterError):
    """Another rank met a SampleError in the same step: this rank stops too, quietly (that rank says why)."""


_HOST_GROUPS: dict[int, Any] = {}


def take(split: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    """The samples at index (images decoded now: LazyImages). Decoding images is a collective once
    torch.distributed is started (every rank takes as many batches): a sample one rank cannot read stops
    every rank, that rank with its SampleError line, the others with a quiet PeerSampleError, not with
    the tracebacks of a collective whose peer left. The flags go over the host (gloo), not the GPU."""
    import torch.distributed as dist

    failed, batch = None, {}
    try:
        batch = {key: value[index] for key, value in split.items()}
    except SampleError as exc:
        failed = exc
    lazy = any(isinstance(value, LazyImages) for value in split.values())
    if lazy and dist.is_available() and dist.is_initialized():
        flag = torch.tensor([int(failed is not None)])
        dist.all_reduce(flag, group=_host_group())
        if failed is None and flag.item():
            raise PeerSampleError("another rank met a sample it cannot read (its line says which)")
    if failed is not None:
        raise failed
    return batch


def _host_group() -> Any:
    """The default group when it is gloo; else (NCCL, GPU only) a gloo group of every rank, made once per
    process group (its making is a collective: the first take of every rank)."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    world = id(dist.group.WORLD)
    if world not in _HOST_GROUPS:
        _HOST_GROUPS[world] = dist.new_group(backend="gloo")
    return _HOST_GROUPS[world]


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
                    f"hf.data: {printable(str(where))}: an image cannot be read ({first_line(exc)})"
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
    """One split's columns (read_splits sampled them to hf.max_samples) as the model's input tensors,
    labels included (names: label_names of every split); text tokenized TOKENIZE_ROWS rows at a time."""
    shown = printable(str(where))
    if task == "image-classification":
        images = LazyImages(column(columns, hf.image_column, "image_column", where), processor, where)
        labels, _ = label_ids(column(columns, hf.label_column, "label_column", where), shown, names)
        return {"pixel_values": images, "labels": torch.tensor(labels, dtype=torch.long)}
    texts = [str(t) for t in column(columns, hf.text_column, "text_column", where)]
    if task == "causal-lm":
        eos = processor.eos_token_id
        flat = [_joined(ids, eos) for ids in _tokenize(processor, texts, add_special_tokens=False)]
        blocks = _blocks(torch.cat(flat) if flat else torch.empty(0, dtype=torch.long), hf.seq_len)
        if not len(blocks):
            raise FluxClusterError(f"hf.data: {shown}: fewer than hf.seq_len ({hf.seq_len}) tokens of text")
        return {"input_ids": blocks, "attention_mask": torch.ones_like(blocks), "labels": blocks.clone()}
    labels, _ = label_ids(column(columns, hf.label_column, "label_column", where), shown, names)
    if processor.pad_token is None:  # GPT-2-like tokenizers have none: pad with end-of-text
        processor.pad_token = processor.eos_token
    encoded = list(
        _tokenize(
            processor,
            texts,
            ("input_ids", "attention_mask"),
            truncation=True,
            padding="max_length",
            max_length=hf.seq_len,
            return_tensors="pt",
        )
    )
    empty = torch.empty((0, hf.seq_len), dtype=torch.long)
    return {
        "input_ids": torch.cat([e[0] for e in encoded]) if encoded else empty,
        "attention_mask": torch.cat([e[1] for e in encoded]) if encoded else empty,
        "labels": torch.tensor(labels, dtype=torch.long),
    }


TOKENIZE_ROWS = 1024
"""Texts tokenized at a time: the tokenizer's Python lists of a whole table would take GBs."""


def _tokenize(
    processor: Any, texts: list[str], keys: tuple[str, ...] = ("input_ids",), **kwargs: Any
) -> Iterator[Any]:
    """processor(...)[keys] of TOKENIZE_ROWS texts at a time (one key: its value alone)."""
    for start in range(0, len(texts), TOKENIZE_ROWS):
        encoded = processor(texts[start : start + TOKENIZE_ROWS], **kwargs)
        yield encoded[keys[0]] if len(keys) == 1 else tuple(encoded[k] for k in keys)


def synthetic(task: str, hf: HfConfig, model_config: Any, samples: int, seed: int) -> dict[str, torch.Tensor]:
    """Random inputs of the model's shapes: token ids below its vocabulary, labels below its labels,
    images of its size."""
    generator = torch.Generator().manual_seed(seed)
    if task == "image-classification":
        size = int(getattr(model_config, "image_size", 224))
        channels = int(getattr(model_config, "num_channels", 3))
        _check_synthetic(samples, channels * size * size * 4, f"images of {channels}x{size}x{size}")
        pixels = torch.randn(samples, channels, size, size, generator=generator)
        return {"pixel_values": pixels, "labels": _random_labels(model_config, samples, generator)}
    _check_synthetic(samples, hf.seq_len * 8 * 3, f"sequences of {hf.seq_len} tokens")
    ids = torch.randint(0, model_config.vocab_size, (samples, hf.seq_len), generator=generator)
    if task == "causal-lm":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": _random_labels(model_config, samples, generator),
    }


SYNTHETIC_BYTES = 16 * 2**30
"""Most memory synthetic inputs may take (they are made whole, before training)."""


def _check_synthetic(samples: int, sample_bytes: int, what: str) -> None:
    if samples * sample_bytes > SYNTHETIC_BYTES:
        raise FluxClusterError(
            f"hf.synthetic_samples: {samples:,} {what} would take {samples * sample_bytes / 2**30:,.1f} GiB; "
            f"expected at most {SYNTHETIC_BYTES // 2**30} GiB: lower hf.synthetic_samples (or hf.seq_len)"
        )


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
        train_columns, val_columns = read_splits(path, hf, seed)
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
