"""Streaming reader for MLCommons' preprocessed flux1 datasets: HF ``save_to_disk`` folders (Arrow IPC
stream files listed in state.json) or parquet files. Rows are read in small batches from memory-mapped
files, so memory stays bounded whatever the dataset size; a row range is reached without reading what
comes before it (parquet row groups, Arrow batch lengths)."""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from flux_cluster.data.format import (
    CONTROL_COLUMN,
    KEY_COLUMN,
    SOURCE_DIRS,
    TENSOR_COLUMNS,
    TIMESTEP_COLUMN,
    Split,
    required_columns,
)


class SourceError(Exception):
    """The input is missing, unreadable or not in the MLCommons schema."""


@dataclass(frozen=True)
class Row:
    key: str
    tensors: dict[str, memoryview]
    """Source column -> the np.save bytes, zero-copy views into the Arrow buffers."""
    timestep: int | None


@dataclass(frozen=True)
class SourceFile:
    path: Path
    kind: Literal["arrow", "parquet"]
    rows: int
    batch_rows: tuple[int, ...] = ()
    """Arrow: the length of every record batch, so a row range can be found without reading data."""
    control: bool = False
    """Holds an edit pair's control latents (format.CONTROL_COLUMN) besides MLCommons' columns."""


@dataclass(frozen=True)
class Source:
    """One split's preprocessed dataset: its files in order, and the row count of each."""

    split: Split
    directory: Path
    files: tuple[SourceFile, ...]

    @property
    def total(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def nbytes(self) -> int:
        return sum(f.path.stat().st_size for f in self.files)

    def rows(self, start: int, stop: int, batch_rows: int = 16) -> Iterator[Row]:
        """Rows [start, stop) in order."""
        columns = list(required_columns(self.split))
        offset = 0
        for source_file in self.files:
            lo, hi = max(start - offset, 0), min(stop - offset, source_file.rows)
            if lo < hi:
                try:
                    wanted = columns + [CONTROL_COLUMN] * source_file.control
                    for batch in _batches(source_file, lo, hi, wanted, batch_rows):
                        yield from _rows_of(batch, self.split)
                except (pa.ArrowException, OSError) as exc:
                    raise SourceError(f"{source_file.path}: unreadable ({exc})") from None
            offset += source_file.rows
            if offset >= stop:
                return


def open_source(root: Path, split: Split) -> Source:
    """The split's dataset under the download root, checked against the MLCommons schema."""
    directory = root / SOURCE_DIRS[split]
    if not directory.is_dir():
        raise SourceError(
            f"{directory}: missing (expected the MLCommons preprocessed {split} set there: "
            "run the download stage, or point --input at the folder holding "
            f"{SOURCE_DIRS['train']}/ and {SOURCE_DIRS['val']}/)"
        )
    paths, kind = _discover(directory)
    files = tuple(_describe(path, kind, split) for path in paths)
    return Source(split=split, directory=directory, files=files)


def _discover(directory: Path) -> tuple[list[Path], Literal["arrow", "parquet"]]:
    states = sorted(directory.rglob("state.json"))
    if len(states) == 1:  # HF save_to_disk: state.json lists the Arrow files in order
        try:
            listed = json.loads(states[0].read_text())["_data_files"]
            return [states[0].parent / entry["filename"] for entry in listed], "arrow"
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise SourceError(f"{states[0]}: not a datasets state.json ({exc})") from None
    parquet = sorted(directory.rglob("*.parquet"))
    arrow = sorted(directory.rglob("*.arrow"))
    if parquet and arrow:
        raise SourceError(f"{directory}: holds both .parquet and .arrow files; keep one copy of the data")
    if parquet:
        return parquet, "parquet"
    if arrow:
        return arrow, "arrow"
    raise SourceError(
        f"{directory}: no .arrow or .parquet files (expected an HF save_to_disk folder or parquet)"
    )


def _describe(path: Path, kind: Literal["arrow", "parquet"], split: Split) -> SourceFile:
    try:
        if kind == "parquet":
            parquet = pq.ParquetFile(path)
            _check_schema(parquet.schema_arrow, path, split)
            control = CONTROL_COLUMN in parquet.schema_arrow.names
            return SourceFile(path, kind, parquet.metadata.num_rows, control=control)
        with pa.memory_map(str(path)) as mapped:
            reader = _open_arrow(mapped)
            _check_schema(reader.schema, path, split)
            lengths = tuple(batch.num_rows for batch in _arrow_batches(reader))
        return SourceFile(path, kind, sum(lengths), lengths, CONTROL_COLUMN in reader.schema.names)
    except FileNotFoundError:
        raise SourceError(f"{path}: listed in the dataset but missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path}: not a readable {kind} file ({exc})") from None


def _check_schema(schema: pa.Schema, path: Path, split: Split) -> None:
    for column in required_columns(split):
        if column not in schema.names:
            raise SourceError(
                f"{path}: column {column!r} is missing (found {', '.join(schema.names)}; "
                f"the MLCommons {split} schema has {', '.join(required_columns(split))})"
            )
    for column in TENSOR_COLUMNS:
        kind = schema.field(column).type
        if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise SourceError(f"{path}: column {column!r} is {kind}, expected binary (np.save bytes)")
    if not pa.types.is_string(schema.field(KEY_COLUMN).type) and not pa.types.is_large_string(
        schema.field(KEY_COLUMN).type
    ):
        raise SourceError(
            f"{path}: column {KEY_COLUMN!r} is {schema.field(KEY_COLUMN).type}, expected string"
        )
    if split == "val" and not pa.types.is_integer(schema.field(TIMESTEP_COLUMN).type):
        raise SourceError(
            f"{path}: column {TIMESTEP_COLUMN!r} is {schema.field(TIMESTEP_COLUMN).type}, expected int"
        )


def _open_arrow(mapped: pa.MemoryMappedFile) -> pa.ipc.RecordBatchStreamReader | pa.ipc.RecordBatchFileReader:
    try:
        return pa.ipc.open_stream(mapped)  # what datasets writes
    except pa.ArrowInvalid:
        mapped.seek(0)
        return pa.ipc.open_file(mapped)


def _arrow_batches(
    reader: pa.ipc.RecordBatchStreamReader | pa.ipc.RecordBatchFileReader,
) -> Iterator[pa.RecordBatch]:
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    else:
        yield from reader


def _batches(
    source_file: SourceFile, lo: int, hi: int, columns: list[str], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    if source_file.kind == "parquet":
        yield from _parquet_batches(source_file.path, lo, hi, columns, batch_rows)
        return
    with pa.memory_map(str(source_file.path)) as mapped:
        offset = 0
        for length, batch in zip(source_file.batch_rows, _arrow_batches(_open_arrow(mapped)), strict=True):
            a, b = max(lo - offset, 0), min(hi - offset, length)
            for start in range(a, b, batch_rows):
                yield batch.slice(start, min(batch_rows, b - start)).select(columns)
            offset += length
            if offset >= hi:
                return


def _parquet_batches(
    path: Path, lo: int, hi: int, columns: list[str], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    parquet = pq.ParquetFile(path, memory_map=True)
    groups, first_row, offset = [], None, 0
    for index in range(parquet.metadata.num_row_groups):
        rows = parquet.metadata.row_group(index).num_rows
        if offset + rows > lo and offset < hi:
            groups.append(index)
            first_row = offset if first_row is None else first_row
        offset += rows
    position = first_row or 0
    for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns):
        a, b = max(lo - position, 0), min(hi - position, batch.num_rows)
        if a < b:
            yield batch.slice(a, b - a)
        position += batch.num_rows
        if position >= hi:
            return


def _rows_of(batch: pa.RecordBatch, split: Split) -> Iterator[Row]:
    keys = batch.column(KEY_COLUMN)
    names = [*TENSOR_COLUMNS, *([CONTROL_COLUMN] if CONTROL_COLUMN in batch.schema.names else [])]
    tensors = {name: batch.column(name) for name in names}
    timesteps = batch.column(TIMESTEP_COLUMN) if split == "val" else None
    for i in range(batch.num_rows):
        key = keys[i].as_py()
        views = {}
        for name, column in tensors.items():
            value = column[i]
            if not value.is_valid:
                raise SourceError(f"sample {key!r}: column {name!r} is null")
            views[name] = memoryview(value.as_buffer())
        timestep = None
        if timesteps is not None:
            timestep = timesteps[i].as_py()
            if timestep is None:
                raise SourceError(f"sample {key!r}: column {TIMESTEP_COLUMN!r} is null")
        yield Row(key=key, tensors=views, timestep=timestep)
