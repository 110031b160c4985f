"""The flux1 data formats: MLCommons' preprocessed columns and NVIDIA's webdataset shard layout.

Both hold the same tensor bytes: ``np.save`` of a bf16 tensor viewed as uint16. Conversion passes them
through unchanged; only the loader decodes them.
"""

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Split = Literal["train", "val"]
SPLITS: tuple[Split, ...] = ("train", "val")

SOURCE_DIRS: dict[Split, str] = {"train": "cc12m_preprocessed", "val": "coco_preprocessed"}
"""Folder of each split's preprocessed source under the download root (MLCommons' names)."""
EMPTY_DIR = "empty_encodings"
ENERGON_INFO = ".nv-meta/.info.json"
"""Energon's metadata: the samples of every shard."""
EMPTY_FILES = ("t5_empty.npy", "clip_empty.npy")

KEY_COLUMN = "__key__"
TENSOR_COLUMNS: dict[str, str] = {
    "t5_encodings": "t5.bytes",
    "clip_encodings": "clip.bytes",
    "mean": "mean.bytes",
    "logvar": "logvar.bytes",
}
"""Source column -> shard member suffix."""
CONTROL_COLUMN = "control_mean"
"""Edit pairs only (`data encode` of a control_images/ folder): the control image's latent mean, the same
shape as the target's; FLUX Kontext conditions on it (its mode, as FluxKontextPipeline encodes images)."""
CONTROL_MEMBER = "control.bytes"
MEMBER_SUFFIXES: dict[str, str] = {**TENSOR_COLUMNS, CONTROL_COLUMN: CONTROL_MEMBER}
"""Every tensor column a source may hold -> its shard member suffix."""
TIMESTEP_COLUMN = "timestep"
VAL_TIMESTEPS = 8


def required_columns(split: Split) -> tuple[str, ...]:
    extra = (TIMESTEP_COLUMN,) if split == "val" else ()
    return (KEY_COLUMN, *TENSOR_COLUMNS, *extra)


MLCOMMONS_TOTALS: dict[Split, int] = {"train": 1_099_776, "val": 29_696}
"""Sample counts of the MLCommons flux1 datasets (cc12m train, coco val)."""
DEFAULT_SHARD_SIZE = 10_000
SHARD_PATTERN = "shard_{:06d}.tar"
INDEX_FILE = "index.txt"
KEY_DIGITS = 8


@dataclass(frozen=True)
class Dims:
    """Tensor shapes of one sample."""

    t5_tokens: int
    t5_dim: int
    clip_dim: int
    latent_channels: int
    latent_size: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        latent = (self.latent_channels, self.latent_size, self.latent_size)
        return {
            "t5_encodings": (self.t5_tokens, self.t5_dim),
            "clip_encodings": (self.clip_dim,),
            "mean": latent,
            "logvar": latent,
        }

    def sample_bytes(self) -> int:
        return sum(2 * int(np.prod(s)) + NPY_HEADER_BYTES for s in self.shapes().values())


NPY_HEADER_BYTES = 128  # np.save's v1 header for these shapes
DIMS: dict[str, Dims] = {
    "real": Dims(t5_tokens=256, t5_dim=4096, clip_dim=768, latent_channels=16, latent_size=32),
    # Small enough for 2-process CPU training; latents stay 16 channels (64 after 2x2 packing).
    "tiny": Dims(t5_tokens=16, t5_dim=32, clip_dim=32, latent_channels=16, latent_size=16),
}


def shard_name(index: int) -> str:
    return SHARD_PATTERN.format(index)


def sample_key(index: int) -> str:
    return f"{index:0{KEY_DIGITS}d}"


def sample_json(key: str, timestep: int | None) -> bytes:
    record: dict[str, object] = {"key": key}
    if timestep is not None:
        record["timestep"] = timestep
    return json.dumps(record, separators=(",", ":")).encode()


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns as uint16, rounding to nearest even (what torch's .bfloat16() does)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    return (rounded >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode_tensor(values: np.ndarray) -> bytes:
    """The MLCommons encoding: np.save of the bf16 tensor viewed as uint16."""
    buffer = io.BytesIO()
    np.save(buffer, to_bf16_bits(values), allow_pickle=False)
    return buffer.getvalue()


class FormatError(ValueError):
    """A member's bytes are not an np.save'd uint16 tensor of the expected shape."""


def read_npy_header(data: bytes | memoryview) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, header length) of np.save bytes, checking the payload length."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"npy format version {version}")
    except (ValueError, SyntaxError, EOFError) as exc:
        raise FormatError(f"not an .npy payload ({exc})") from None
    if fortran:
        raise FormatError("Fortran-ordered array")
    offset = stream.tell()
    expected = offset + int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise FormatError(f"{len(data)} bytes, the header promises {expected}")
    return dtype, tuple(shape), offset


def decode_tensor(data: bytes | memoryview, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The uint16 bf16 bit patterns of one member (no copy), checked against an expected shape."""
    dtype, found, offset = read_npy_header(data)
    if dtype != np.dtype("<u2"):
        raise FormatError(f"dtype {dtype}, expected uint16 (bf16 bits)")
    if shape is not None and found != shape:
        raise FormatError(f"shape {list(found)}, expected {list(shape)}")
    return np.frombuffer(data, dtype="<u2", offset=offset).reshape(found)


def split_size(root: Path, split: Split) -> int | None:
    """Samples in a split, from Energon's metadata (ENERGON_INFO); None where that is missing or not what
    Energon writes (read with bounds: the folder may come from anywhere)."""
    from flux_cluster.outside import OutsideFileError, read_json_object, whole_number

    try:
        counts = read_json_object(root / ENERGON_INFO).get("shard_counts")
    except OutsideFileError:
        return None
    if not isinstance(counts, dict):
        return None
    sizes = [whole_number(n) for name, n in counts.items() if name.startswith(f"{split}/")]
    if None in sizes:
        return None
    return sum(n for n in sizes if n is not None) or None
