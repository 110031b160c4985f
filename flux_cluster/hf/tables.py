"""hf.data's tables read in bounded batches: JSONL, CSV, Parquet and save_to_disk Arrow files stream
through a RowSample that keeps every row (in file order) or, with hf.max_samples, a seeded uniform
sample of that many rows, so memory holds the sample and one batch whatever the file expands to (a
1.3 MB Parquet file can hold 100M rows). Files are opened through flux_cluster/outside.py (regular files
only: a FIFO would block the open); JSON lines are checked for depth before pyarrow parses them (it
crashes on deep nesting); integer labels are bounded by the data (one label of 2**62 would size the
model's head). Every failure is one FluxClusterError line naming the file.
"""

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from flux_cluster.errors import FluxClusterError, first_line
from flux_cluster.outside import MIB, OutsideFileError, open_regular
from flux_cluster.safe_text import printable

Columns = dict[str, list[Any]]
BATCH_ROWS = 65_536
"""Rows read at a time from Parquet files."""
CHUNK_BYTES = 4 * MIB
"""JSON lines parsed at a time (whole lines: a chunk ends at a newline)."""
LINE_LIMIT = 16 * MIB
"""Longest JSON line read, and longest text cell of any format (a 28 KB Parquet file can hold a 300 MB
cell, which the tokenizer would expand ~30 times before truncating it)."""
MAX_JSON_DEPTH = 32
"""Levels of nesting a JSON line may have (pyarrow segfaults past ~100,000; a dataset needs 2 or 3)."""
MAX_ROWS = 10_000_000
"""Rows a split may have without hf.max_samples (all of them are held in memory, then tokenized)."""
LABEL_FLOOR = 1024
"""Integer labels are below the split's row count, or below this for small data (a subset of ImageNet's
1,000 classes): a larger one would make a head with more classes than the data has samples."""

_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))


def _shown(path: Path) -> str:
    return printable(str(path))


class RowSample:
    """The rows of one split as its batches stream by: all of them, in order (limit None: at most
    MAX_ROWS), or a seeded uniform sample of limit rows (the rows of the smallest random keys), in random
    order. Memory holds at most twice the sample and one batch."""

    def __init__(self, limit: int | None, seed: int, label: str | None = None) -> None:
        self.limit, self.label = limit, label
        self.rng = np.random.default_rng(seed)
        self.tables: list[pa.Table] = []
        self.keys: list[np.ndarray] = []
        self.kept = 0
        self.seen = 0

    def add(self, table: pa.Table | pa.RecordBatch, where: Path) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        _check_cells(table, where)
        self.seen += table.num_rows
        self.kept += table.num_rows
        self.tables.append(table)
        if self.limit is None:
            if self.seen > MAX_ROWS:
                raise FluxClusterError(
                    f"hf.data: {_shown(where)}: more than {MAX_ROWS:,} rows; set hf.max_samples to train on "
                    "a sample of them"
                )
            return
        self.keys.append(self.rng.random(table.num_rows))
        if self.kept >= 2 * max(self.limit, BATCH_ROWS):
            self._cut()

    def _cut(self) -> None:
        """Keep the limit rows of the smallest keys, in key order (a random order)."""
        assert self.limit is not None
        table, keys = _concat(self.tables), np.concatenate(self.keys) if self.keys else np.empty(0)
        order = np.argsort(keys, kind="stable")[: self.limit]
        self.tables, self.keys, self.kept = [table.take(order)], [keys[order]], len(order)

    def columns(self, where: Path) -> Columns:
        """The kept rows as columns, their integer labels checked against the data."""
        if self.limit is not None:
            self._cut()
        table = _concat(self.tables)
        if self.label and self.label in table.column_names and pa.types.is_integer(table[self.label].type):
            import pyarrow.compute as pc

            top = pc.max(table[self.label]).as_py()
            bound = max(LABEL_FLOOR, self.seen)
            if top is not None and top >= bound:
                raise FluxClusterError(
                    f"hf.data: {_shown(where)}: label {top} in column '{printable(self.label)}': expected "
                    f"class numbers below {bound:,} (the data has {self.seen:,} rows; labels number the "
                    "classes 0, 1, 2, ...)"
                )
        return table.to_pydict()


def _check_cells(table: pa.Table, where: Path) -> None:
    """Every text cell at most LINE_LIMIT bytes, as JSON lines are (binary cells, images, are capped by
    their pixels when decoded)."""
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            continue
        chunks = [c.dictionary if pa.types.is_dictionary(c.type) else c for c in column.chunks]
        longest = max((pc.max(pc.binary_length(c)).as_py() or 0 for c in chunks), default=0)
        if longest > LINE_LIMIT:
            raise FluxClusterError(
                f"hf.data: {_shown(where)}: a cell of {longest:,} bytes in column '{printable(name)}'; "
                f"expected text of at most {LINE_LIMIT:,} bytes a row"
            )


def _concat(tables: list[pa.Table]) -> pa.Table:
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def read_table(path: Path, sample: RowSample) -> None:
    """The rows of a .jsonl/.json (JSON lines), .csv or .parquet file into sample."""
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".csv", ".parquet"):
        raise FluxClusterError(f"hf.data: {_shown(path)}: expected a .jsonl, .json, .csv or .parquet file")
    try:
        with open_regular(path.resolve()) as handle:
            if suffix == ".parquet":
                import pyarrow.parquet as pq

                for batch in pq.ParquetFile(handle).iter_batches(BATCH_ROWS):
                    sample.add(batch, path)
            elif suffix == ".csv":
                import pyarrow.csv

                for batch in pyarrow.csv.open_csv(handle):
                    sample.add(batch, path)
            else:
                _read_json_lines(handle, path, sample)
    except OutsideFileError as exc:
        raise FluxClusterError(f"hf.data: {printable(str(exc))}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # pyarrow's errors are ValueErrors/OSErrors
        raise FluxClusterError(f"hf.data: {_shown(path)}: cannot be read ({first_line(exc)})") from None


def read_arrow_stream(path: Path, sample: RowSample) -> None:
    """The rows of an Arrow stream file (what save_to_disk writes) into sample."""
    try:
        with open_regular(path.resolve()) as handle:
            for batch in pa.ipc.open_stream(handle):
                sample.add(batch, path)
    except OutsideFileError as exc:
        raise FluxClusterError(f"hf.data: {printable(str(exc))}") from None
    except (OSError, ValueError) as exc:
        raise FluxClusterError(f"hf.data: {_shown(path)}: cannot be read ({first_line(exc)})") from None


def _read_json_lines(handle: Any, path: Path, sample: RowSample) -> None:
    import io

    import pyarrow.json

    while chunk := handle.read(CHUNK_BYTES):
        if not chunk.endswith(b"\n"):
            rest = handle.readline(LINE_LIMIT)
            if len(rest) == LINE_LIMIT and not rest.endswith(b"\n"):
                raise FluxClusterError(
                    f"hf.data: {_shown(path)}: a line longer than {LINE_LIMIT // MIB} MiB; expected JSON "
                    "lines of one record each"
                )
            chunk += rest
        line = too_deep(chunk)
        if line is not None:
            raise FluxClusterError(
                f"hf.data: {_shown(path)}: a record nested more than {MAX_JSON_DEPTH} levels deep "
                f"(from byte {sample_offset(handle, chunk, line)}); refused"
            )
        options = pyarrow.json.ReadOptions(block_size=len(chunk) + 1)
        sample.add(pyarrow.json.read_json(io.BytesIO(chunk), read_options=options), path)


def sample_offset(handle: Any, chunk: bytes, start: int) -> int:
    """The file offset of a line that starts at start in the chunk just read."""
    return handle.tell() - len(chunk) + start


def too_deep(chunk: bytes, limit: int = MAX_JSON_DEPTH) -> int | None:
    """Where in chunk (whole JSON lines) the first line nested deeper than limit starts, else None. Lines
    with no more than limit brackets in all are passed at numpy speed; the others are measured with their
    strings taken out."""
    data = np.frombuffer(chunk, dtype=np.uint8)
    opens = np.cumsum((data == _OPEN[0]) | (data == _OPEN[1]), dtype=np.int32)
    ends = np.flatnonzero(data == ord("\n"))
    if not len(ends) or ends[-1] != len(data) - 1:
        ends = np.append(ends, len(data) - 1)
    starts = np.concatenate(([0], ends[:-1] + 1))
    before = np.where(starts > 0, opens[np.maximum(starts - 1, 0)], 0)
    many = opens[ends] - before > limit
    for start, end in zip(starts[many], ends[many], strict=True):
        if _depth(chunk[start : end + 1]) > limit:
            return int(start)
    return None


def _depth(line: bytes) -> int:
    """The deepest nesting of one JSON line, brackets inside strings aside."""
    data = np.frombuffer(_STRING.sub(b'""', line), dtype=np.uint8)
    step = np.isin(data, _OPEN).astype(np.int64) - np.isin(data, _CLOSE).astype(np.int64)
    return int(np.cumsum(step).max(initial=0))
