"""Hostile hf.data (issue 42, items 2, 3 and 5; issue 39 item 5): bounded memory whatever a file expands
to (hf.max_samples sampled as the rows stream, text tokenized in batches, images capped at data encode's
40 MP, labels bounded by the data), no crash on deep JSON, no blocking on FIFOs, one line naming the file
and field with its control characters spelled out, and hf.seq_len checked before any text is tokenized."""

import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet
import pytest
import torch

from flux_cluster.config.hf import HfConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.hf import data as hf_data
from flux_cluster.hf.data import LazyImages, load_data, read_splits

ESC = "\x1b]0;owned\x07"
"""A terminal's 'set the window title' sequence: raw in an error line, it would run."""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import BertTokenizerFast

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)})


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _one_line(call: Callable[[], Any], pattern: str) -> str:
    with pytest.raises(FluxClusterError, match=pattern) as error:
        call()
    assert "\n" not in str(error.value) and "\x1b" not in str(error.value) and "\x07" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("label", [10**9, 2**62])
def test_one_huge_label_is_one_line_not_a_head_of_that_size(
    tmp_path: Path, tokenizer: Any, label: int
) -> None:
    path = _jsonl(tmp_path / "data.jsonl", [{"text": "ab", "label": v} for v in (0, 1, label)])
    hf = HfConfig(data=str(path), seq_len=8)
    _one_line(
        lambda: load_data(hf, "text-classification", tokenizer, None, 0),
        f"^hf.data: {path}: label {label} in column 'label': expected class numbers below 1,024 "
        r"\(the data has 3 rows",
    )


def test_max_samples_samples_as_the_rows_stream_in_bounded_memory(tmp_path: Path) -> None:
    """1M rows sorted by label in a Parquet file of a few KB: 16 of them, of both labels, without ever
    holding the 1M rows as Python objects."""
    rows = 1_000_000
    table = pa.table(
        {"text": pa.array(["ab"]).take(pa.array([0] * rows)), "label": [0] * (rows // 2) + [1] * (rows // 2)}
    )
    path = tmp_path / "data.parquet"
    pyarrow.parquet.write_table(table, path)
    del table
    hf = HfConfig(data=str(path), max_samples=16)
    tracemalloc.start()
    try:
        train, val = read_splits(path, hf, seed=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert val is None and len(train["label"]) == 16 and set(train["label"]) == {0, 1}
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB of Python objects for 16 rows"
    assert read_splits(path, hf, seed=3) == (train, None)  # the same seed, the same sample


def test_without_max_samples_a_table_past_the_row_limit_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flux_cluster.hf import tables

    monkeypatch.setattr(tables, "MAX_ROWS", 100)
    path = _jsonl(tmp_path / "data.jsonl", [{"text": "ab", "label": 0}] * 101)
    _one_line(
        lambda: read_splits(path, HfConfig()), f"^hf.data: {path}: more than 100 rows; set hf.max_samples"
    )
    assert len(read_splits(path, HfConfig(max_samples=100))[0]["text"]) == 100


@pytest.mark.parametrize("dictionary", [False, True])
def test_a_text_cell_past_the_line_limit_is_one_line_before_tokenizing(
    tmp_path: Path, dictionary: bool
) -> None:
    """A Parquet file of a few KB whose one cell is 17 MiB of text (the tokenizer would ask for ~30 times
    that per rank, a 300 MB cell aborted both ranks with a Rust backtrace): refused as a JSON line that
    long is, plain or dictionary-encoded, and the row limit's neighbour of 16 MiB still read."""
    path = tmp_path / "train.parquet"
    text = pa.array(["good " * (17 * 2**20 // 5), "bad"])
    pyarrow.parquet.write_table(
        pa.table({"text": text.dictionary_encode() if dictionary else text, "label": [0, 1]}),
        path,
        compression="zstd",
        use_dictionary=dictionary,
    )
    assert path.stat().st_size < 2**20
    _one_line(
        lambda: read_splits(path, HfConfig()),
        rf"^hf.data: {path}: a cell of 17,825,790 bytes in column 'text'; expected text of at most "
        "16,777,216 bytes a row$",
    )
    pyarrow.parquet.write_table(pa.table({"text": ["a" * 2**24], "label": [0]}), path, compression="zstd")
    assert len(read_splits(path, HfConfig())[0]["text"][0]) == 2**24


def test_text_is_tokenized_a_batch_at_a_time(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_data, "TOKENIZE_ROWS", 4)
    seen: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer, name)

        def __call__(self, texts: list[str], **kwargs: Any) -> Any:
            seen.append(len(texts))
            return tokenizer(texts, **kwargs)

    path = _jsonl(tmp_path / "data.jsonl", [{"text": "abc" * (i + 1), "label": i % 2} for i in range(10)])
    hf = HfConfig(data=str(path), seq_len=8, val_fraction=0)
    whole = load_data(hf, "text-classification", tokenizer, None, 0)
    batched = load_data(hf, "text-classification", Counting(), None, 0)
    assert seen == [4, 4, 2]
    assert all(torch.equal(whole.train[k], batched.train[k]) for k in whole.train)
    causal = load_data(hf, "causal-lm", Counting(), None, 0)
    assert seen[3:] == [4, 4, 2] and causal.train["input_ids"].shape[1] == 8


@pytest.mark.parametrize("depth", [33, 1000])
def test_json_lines_nested_deeply_are_one_line_before_pyarrow(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ab", "label": 0}\n{"text": "ab", "x": ' + "[" * depth + "]" * depth + "}\n")
    _one_line(
        lambda: read_splits(path, HfConfig()), f"^hf.data: {path}: a record nested more than 32 levels deep"
    )


def test_brackets_inside_strings_are_not_nesting(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "data.jsonl", [{"text": "[" * 5000 + '"{' * 100, "label": 0}])
    assert read_splits(path, HfConfig())[0]["label"] == [0]


def test_json_lines_100000_deep_are_one_line_not_a_segfault(tmp_path: Path) -> None:
    """pyarrow crashes with signal 11 on these (no file named): read in a child process, so a crash fails
    the test instead of ending the suite."""
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ab", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    code = (  # the reader alone: no torch to import
        "import sys; from pathlib import Path; from flux_cluster.errors import FluxClusterError\n"
        "from flux_cluster.hf.tables import RowSample, read_table\n"
        "try: read_table(Path(sys.argv[1]), RowSample(None, 0))\n"
        "except FluxClusterError as exc: print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(f"hf.data: {path}: a record nested more than 32 levels deep")


def _save_to_disk(folder: Path, data_file: str) -> None:
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": data_file}]}))


def test_a_fifo_named_by_state_json_is_refused_not_opened(tmp_path: Path, within: Callable) -> None:
    folder = tmp_path / "saved"
    _save_to_disk(folder, "data-00000-of-00001.arrow")
    os.mkfifo(folder / "data-00000-of-00001.arrow")
    error = within(20, lambda: read_splits(folder, HfConfig()), folder / "data-00000-of-00001.arrow")
    assert isinstance(error, FluxClusterError) and "\n" not in str(error)
    assert str(error).startswith(f"hf.data: {folder}/data-00000-of-00001.arrow: not a regular file; refused")


def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG that says it is width x height (its pixel data cut short: only the header is read)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)))


def _processor() -> Any:
    from transformers import ViTImageProcessor

    return ViTImageProcessor(size={"height": 4, "width": 4})


def test_an_image_past_40_megapixels_is_one_line_from_its_header(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    _png_header(big, 7000, 7000)
    processor = _processor()  # outside the timing: the first test to build one imports transformers (~2 s)
    start = time.process_time()
    _one_line(
        lambda: LazyImages([big], processor, tmp_path),
        f"^hf.data: {big}: 7000x7000 pixels, over the 40,000,000 an image may have here",
    )
    assert time.process_time() - start < 2  # refused from the header: 147 MB never decoded


@pytest.mark.filterwarnings("error")
def test_an_image_past_pils_warning_limit_is_the_same_one_line_with_no_warning(tmp_path: Path) -> None:
    """Past PIL's 89 MP its DecompressionBombWarning printed two lines of its own before ours: the pixel
    cap is ours, said once."""
    big = tmp_path / "big.png"
    _png_header(big, 13000, 13000)
    _one_line(
        lambda: LazyImages([big], _processor(), tmp_path),
        f"^hf.data: {big}: 13000x13000 pixels, over the 40,000,000 an image may have here",
    )


def test_a_fifo_in_an_imagefolder_is_refused_not_opened(tmp_path: Path, within: Callable) -> None:
    from PIL import Image

    (tmp_path / "cat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "cat" / "0.png")  # checked when the images are made
    os.mkfifo(tmp_path / "cat" / "9.png")
    images = LazyImages(read_splits(tmp_path, HfConfig())[0]["image"], _processor(), tmp_path)
    error = within(20, lambda: images[torch.arange(2)], tmp_path / "cat" / "9.png")
    assert isinstance(error, FluxClusterError) and "\n" not in str(error)
    assert str(error).startswith(f"hf.data: {tmp_path}/cat/9.png: expected an image file, not a regular file")


def test_file_and_column_names_reach_error_lines_with_control_characters_spelled_out(
    tmp_path: Path, tokenizer: Any
) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / f"{ESC}.png").write_bytes(b"not a png")
    text = _one_line(
        lambda: LazyImages([tmp_path / "cat" / f"{ESC}.png"], _processor(), tmp_path), "^hf.data: "
    )
    assert "\\x1b]0;owned\\x07.png: expected an image" in text
    path = _jsonl(tmp_path / "data.jsonl", [{ESC: "ab", "label": 0}])
    hf = HfConfig(data=str(path), seq_len=8)
    text = _one_line(lambda: load_data(hf, "text-classification", tokenizer, None, 0), "^hf.text_column: ")
    assert "(columns: \\x1b]0;owned\\x07, label)" in text


def test_seq_len_past_the_models_positions_is_checked_before_the_data_is_read(
    tiny_hf: Path, tmp_path: Path
) -> None:
    """The data here cannot be read at all: the seq_len line comes first, as no text is tokenized (a
    1,000,000-token padding of a real table took 74 s and 9.4 GB)."""
    from flux_cluster.config import load_system
    from flux_cluster.config.workload import resolve_training
    from flux_cluster.hf.train import _prepare
    from flux_cluster.rundir import result_log
    from flux_cluster.runtime.dist import DistInfo
    from flux_cluster.training.context import JobContext

    data = tmp_path / "data.jsonl"
    data.write_text("{not json\n")
    sets = [
        "train.benchmark=hf",
        f"hf.model={tiny_hf / 'bert'}",
        "hf.task=text-classification",
        f"hf.data={data}",
        "hf.seq_len=1000000",
    ]
    system = load_system("local", sets).config
    ctx = JobContext(
        system, resolve_training(system), tmp_path, data, 0, 7, result_log(tmp_path, 0), False, "x"
    )
    one = DistInfo(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    with pytest.raises(FluxClusterError, match=r"^hf\.seq_len: 1000000 is longer than the 128 positions of "):
        _prepare(ctx, one)


def test_synthetic_inputs_past_the_memory_bound_are_one_line_before_allocating() -> None:
    """A million synthetic samples of a million tokens (8 TB) are refused, not allocated."""
    from types import SimpleNamespace

    from flux_cluster.hf.data import synthetic

    config = SimpleNamespace(vocab_size=100, num_labels=2)
    hf = HfConfig(seq_len=1_000_000)
    _one_line(
        lambda: synthetic("causal-lm", hf, config, 1_000_000, 0),
        r"^hf\.synthetic_samples: 1,000,000 sequences of 1000000 tokens would take [0-9,.]+ GiB; "
        "expected at most 16",
    )
    assert synthetic("causal-lm", hf.model_copy(update={"seq_len": 8}), config, 4, 0)["input_ids"].shape == (
        4,
        8,
    )
