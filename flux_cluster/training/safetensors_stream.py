"""Reading safetensors files we do not control, one tensor at a time (a LoRA base streams through this).

Not the safetensors library: its loaders memory-map the file, whose pages then count in the process's memory
until it is closed, and it would trust a header's offsets; here every entry is checked against the file's
size before a byte is allocated.
"""

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import torch

from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import MIB, OutsideFileError, open_regular, parse_json, read_json_object
from flux_cluster.safe_text import printable

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
"""safetensors' dtype names."""


_HEADER_LIMIT = 100_000_000
"""The largest safetensors header read (the safetensors library's own cap)."""


def _header_entries(
    file: Path, size: int, header: object
) -> list[tuple[str, torch.dtype, list[int], int, int]]:
    """(name, dtype, shape, begin, end) of each tensor of a parsed safetensors header, in file order,
    once every entry is well formed and the entries tile the data from 0 to ``size`` (its bytes) exactly,
    as the safetensors library requires: checked before anything is allocated."""
    if not isinstance(header, dict):
        raise OutsideFileError(f"{file}: safetensors header is not a JSON object")
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shown = printable(name[:200])
        fields = entry if isinstance(entry, dict) else {}
        kind, shape, offsets = fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")
        dtype = _DTYPES.get(kind) if isinstance(kind, str) else None
        if (
            dtype is None
            or not isinstance(shape, list)
            or not all(type(n) is int and 0 <= n < 1 << 62 for n in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(n) is int for n in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise OutsideFileError(
                f"{file}: header entry '{shown}': expected a dtype of {', '.join(_DTYPES)}, a shape of "
                "non-negative integers and data_offsets [begin, end] of integers with 0 <= begin <= end"
            )
        begin, end = offsets
        if math.prod(shape) * dtype.itemsize != end - begin:
            raise OutsideFileError(
                f"{file}: header entry '{shown}': {end - begin} bytes for shape {shape} of {kind}"
            )
        entries.append((name, dtype, shape, begin, end))
    entries.sort(key=lambda e: (e[3], e[4]))
    at = 0
    for name, _, _, begin, end in entries:
        if begin != at:
            raise OutsideFileError(
                f"{file}: header entry '{printable(name[:200])}' starts at byte {begin} of the data, "
                f"expected {at} (tensors overlap or leave a gap)"
            )
        at = end
    if at != size:
        raise OutsideFileError(
            f"{file}: the header's tensors end at byte {at} of the data, but the file holds {size} "
            "(truncated or padded)"
        )
    return entries


def _checked_header(
    f: BinaryIO, file: Path
) -> tuple[int, list[tuple[str, torch.dtype, list[int], int, int]]]:
    """(header length, entries) of the safetensors file open as f: its length, JSON, dtypes, shapes and
    offsets checked against the file's size; nothing allocated but the header's bytes."""
    total = os.fstat(f.fileno()).st_size
    length = int.from_bytes(f.read(8), "little") if total >= 8 else -1
    if not 2 <= length <= min(_HEADER_LIMIT, total - 8):
        raise OutsideFileError(
            f"{file}: safetensors header length {length} in a file of {total} bytes; expected 2 to "
            f"{min(_HEADER_LIMIT, max(total - 8, 0))}"
        )
    header = parse_json(f.read(length), file)
    return length, _header_entries(file, total - 8 - length, header)


def check_safetensors(file: Path) -> dict[str, tuple[torch.dtype, list[int]]]:
    """The tensors of a safetensors file we do not control (name: dtype, shape), once its header is checked
    as read_safetensors checks it (OutsideFileError, one line naming the file, otherwise); no tensor is
    read. For a file another library then loads (transformers): its own reader trusts less of the header."""
    with open_regular(file.resolve()) as f:
        _, entries = _checked_header(f, file)
    return {name: (dtype, shape) for name, dtype, shape, _, _ in entries}


def read_safetensors(
    file: Path, wanted: Callable[[str, torch.dtype, list[int]], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of a safetensors file in its stored dtype, one at a time in file order, read into its own
    memory (not memory-mapped, unlike safetensors' loaders: a mapped file's pages count in the process's
    memory until it is closed). A symlink is followed (a Hugging Face cache snapshot's files point into
    its blobs/); what it names must be a regular file.

    Raises OutsideFileError (a FluxClusterError, one line naming the file) when the file is missing, not a
    regular file, or not what a safetensors file is: its header's length, JSON, dtypes, shapes and offsets
    are all checked against the file's size before any tensor is allocated. OSError when reading fails.
    ``wanted(name, dtype, shape)``, called for every entry before any tensor is allocated, says which to
    read (others are skipped, never allocated) and may raise: a caller checks the header against what it
    expects (the shapes a config gives) before a byte of tensor data is held."""
    with open_regular(file.resolve()) as f:
        length, entries = _checked_header(f, file)
        if wanted is not None:
            entries = [entry for entry in entries if wanted(*entry[:3])]
        for name, dtype, shape, begin, end in entries:
            tensor = torch.empty(shape, dtype=dtype)
            f.seek(8 + length + begin)
            if f.readinto(tensor.reshape(-1).view(torch.uint8).numpy()) != end - begin:
                raise OutsideFileError(f"{file}: the file ends inside '{printable(name[:200])}' (truncated)")
            yield name, tensor
            del tensor  # not held here while the next one is read


def transformer_files(path: Path) -> tuple[Path, list[Path]] | None:
    """(transformer folder, its safetensors files) of a diffusers checkpoint, or None when it has none
    (other formats load the old way: whole, in float32)."""
    from diffusers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFETENSORS_WEIGHTS_NAME

    folder = path / "transformer" if (path / "transformer" / "config.json").is_file() else path
    if (folder / SAFETENSORS_WEIGHTS_NAME).is_file():
        return folder, [folder / SAFETENSORS_WEIGHTS_NAME]
    index = folder / SAFE_WEIGHTS_INDEX_NAME
    return (folder, index_shards(index)) if index.is_file() else None


def index_shards(index: Path) -> list[Path]:
    """The safetensors files a ``model.safetensors.index.json`` names (its weight_map's values), each a plain
    file name beside it (no folder, no '..'); anything else is one FluxClusterError line naming index."""
    folder = index.parent
    try:  # resolved: a Hugging Face cache snapshot's files are symlinks into its blobs/
        shards = read_json_object(index.resolve(), limit=64 * MIB).get("weight_map")
    except OutsideFileError as exc:
        raise FluxClusterError(str(exc)) from None
    if not isinstance(shards, dict) or not all(
        isinstance(v, str) and v not in ("", ".", "..") and not {"/", "\\", "\0"} & set(v)
        for v in shards.values()
    ):
        raise FluxClusterError(
            f"{index}: weight_map: expected an object of tensor names to file names in {folder}"
        )
    if not shards:
        raise FluxClusterError(f"{index}: weight_map is empty; expected the tensor names and their files")
    return [folder / name for name in sorted(set(shards.values()))]
