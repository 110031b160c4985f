"""Synthetic flux1 data in exactly the MLCommons preprocessed schema, learnable by a small model.

The text encodings are random; the latents are a fixed random function of them plus a little noise:
after the autoencoder shift/scale that training applies, z[c, h, w] = (A @ clip)[c] + P[c, h, w] + 0.1 * n,
with A and the spatial pattern P drawn once from the dataset seed and shared by train and val. The T5
tokens carry the same signal (B @ clip added to every token), so either conditioning path can learn it.
"""

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flux_cluster.atomic import write_atomic
from flux_cluster.data.format import (
    CONTROL_COLUMN,
    DIMS,
    EMPTY_DIR,
    EMPTY_FILES,
    KEY_COLUMN,
    SOURCE_DIRS,
    TIMESTEP_COLUMN,
    VAL_TIMESTEPS,
    Dims,
    Split,
    encode_tensor,
)
from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.errors import FluxClusterError
from flux_cluster.models.latents import LATENT_SCALE, LATENT_SHIFT

MARKER = "flux-synthetic.json"
ENCODED_MARKER = "flux-encoded.json"
"""In a source made by 'flux-cluster data encode' (flux_cluster.data.prep.encode): what encoded it."""
LOGVAR = math.log(1e-4)
NOISE = 0.1
SourceFormat = Literal["arrow", "parquet"]


def read_marker(root: Path, name: str = MARKER) -> dict[str, Any] | None:
    path = root / name
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:
        raise FluxClusterError(f"{path}: not a flux-cluster data marker ({exc})") from None


def read_encoded_marker(root: Path) -> dict[str, Any] | None:
    return read_marker(root, ENCODED_MARKER)


class _World:
    """The fixed maps that make the data learnable, drawn from the dataset seed."""

    def __init__(self, dims: Dims, seed: int) -> None:
        rng = np.random.default_rng([seed, 0])
        self.dims = dims
        self.to_latent = rng.standard_normal((dims.latent_channels, dims.clip_dim)) / math.sqrt(dims.clip_dim)
        self.to_t5 = rng.standard_normal((dims.t5_dim, dims.clip_dim)) / math.sqrt(dims.clip_dim)
        shape = (dims.latent_channels, dims.latent_size, dims.latent_size)
        self.pattern = 0.5 * rng.standard_normal(shape)

    def sample(self, rng: np.random.Generator) -> dict[str, bytes]:
        d = self.dims
        clip = rng.standard_normal(d.clip_dim)
        t5 = 0.5 * rng.standard_normal((d.t5_tokens, d.t5_dim), dtype=np.float32) + (self.to_t5 @ clip)
        z = (self.to_latent @ clip)[:, None, None] + self.pattern
        z = z + NOISE * rng.standard_normal(z.shape)
        mean = z / LATENT_SCALE + LATENT_SHIFT
        return {
            "t5_encodings": encode_tensor(t5),
            "clip_encodings": encode_tensor(clip),
            "mean": encode_tensor(mean),
            "logvar": encode_tensor(np.full(z.shape, LOGVAR)),
        }


def synthesize(
    out: Path,
    *,
    train: int,
    val: int,
    dims: str = "tiny",
    seed: int = 0,
    source_format: SourceFormat = "arrow",
    rows_per_file: int = 1000,
    force: bool = False,
) -> dict[str, Any]:
    """Write OUT/cc12m_preprocessed, OUT/coco_preprocessed, OUT/empty_encodings and the marker."""
    if dims not in DIMS:
        raise FluxClusterError(f"--dims {dims!r}: expected one of {', '.join(DIMS)}")
    if train < 1 or val < 1:
        raise FluxClusterError("--train and --val: expected at least 1 sample each")
    existing = [name for name in (*SOURCE_DIRS.values(), EMPTY_DIR, MARKER) if (out / name).exists()]
    if existing and not force:
        raise FluxClusterError(
            f"{out}: already holds {', '.join(existing)}; choose another folder or use --force"
        )
    if existing and MARKER not in existing:  # e.g. a real download: --force must never delete it
        raise FluxClusterError(
            f"{out}: holds {', '.join(existing)} but no {MARKER}, so not synthetic data; --force replaces "
            "only synthetic data: choose another folder"
        )
    world = _World(DIMS[dims], seed)
    staging = out / f".synth-partial-{os.getpid()}"
    try:
        staging.mkdir(parents=True)
    except OSError as exc:
        raise FluxClusterError(f"{out}: cannot write there ({exc.strerror})") from None
    try:
        counts: dict[Split, int] = {"train": train, "val": val}
        with StageProgress("synth", train + val) as progress:
            for split_index, (split, count) in enumerate(counts.items(), start=1):
                rows = _rows(world, split, count, np.random.default_rng([seed, split_index]))
                _write_split(
                    staging / SOURCE_DIRS[split], split, rows, count, source_format, rows_per_file, progress
                )
        _write_empty(staging / EMPTY_DIR, world.dims, np.random.default_rng([seed, 99]))
        for name in (*SOURCE_DIRS.values(), EMPTY_DIR):  # replace whole folders: never a mix of two datasets
            if (out / name).exists():
                shutil.rmtree(out / name)
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    marker = {"dims": dims, "train": train, "val": val, "seed": seed, "format": source_format}
    write_atomic(out / MARKER, json.dumps(marker, indent=1) + "\n")
    return marker


def _rows(world: _World, split: Split, count: int, rng: np.random.Generator) -> Iterator[dict[str, Any]]:
    # MLCommons assigns val timesteps as arange(N) % 8 after a seeded shuffle: equal counts per timestep.
    timesteps = rng.permutation(np.arange(count) % VAL_TIMESTEPS) if split == "val" else None
    for index in range(count):
        row: dict[str, Any] = {KEY_COLUMN: f"synthetic-{split}-{index:09d}", **world.sample(rng)}
        if timesteps is not None:
            row[TIMESTEP_COLUMN] = int(timesteps[index])
        yield row


def source_schema(split: Split, control: bool = False) -> pa.Schema:
    """MLCommons' columns; ``control``: with an edit pair's control latents (format.CONTROL_COLUMN)."""
    fields = [pa.field(KEY_COLUMN, pa.string())]
    fields += [pa.field(name, pa.binary()) for name in ("t5_encodings", "clip_encodings", "mean", "logvar")]
    if control:
        fields.append(pa.field(CONTROL_COLUMN, pa.binary()))
    if split == "val":
        fields.append(pa.field(TIMESTEP_COLUMN, pa.int32()))
    return pa.schema(fields)


def _write_split(
    directory: Path,
    split: Split,
    rows: Iterator[dict[str, Any]],
    count: int,
    source_format: SourceFormat,
    rows_per_file: int,
    progress: StageProgress,
) -> None:
    directory.mkdir(parents=True)
    schema = source_schema(split)
    files = math.ceil(count / rows_per_file)
    names = [
        f"data-{i:05d}-of-{files:05d}.arrow" if source_format == "arrow" else f"part-{i:05d}.parquet"
        for i in range(files)
    ]
    batch_rows = 16
    for file_index, name in enumerate(names):
        in_file = min(rows_per_file, count - file_index * rows_per_file)
        writer = source_writer(directory / name, schema, source_format)
        with writer:
            for start in range(0, in_file, batch_rows):
                chunk = [next(rows) for _ in range(min(batch_rows, in_file - start))]
                batch = pa.RecordBatch.from_pylist(chunk, schema=schema)
                writer.write_batch(batch)
                progress.advance(len(chunk), batch.nbytes)
    if source_format == "arrow":
        write_dataset_state(directory, split, names, "flux-cluster-synthetic")


def write_dataset_state(
    directory: Path, split: Split, names: list[str], origin: str, control: bool = False
) -> None:
    """The rest of an HF save_to_disk folder: state.json (the Arrow files in order) and the features."""
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": f"{origin}-{split}",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    schema = source_schema(split, control)
    features = {field.name: {"dtype": _hf_dtype(field.type), "_type": "Value"} for field in schema}
    write_atomic(directory / "state.json", json.dumps(state, indent=2) + "\n")
    write_atomic(directory / "dataset_info.json", json.dumps({"features": features}, indent=2) + "\n")


def source_writer(path: Path, schema: pa.Schema, source_format: SourceFormat) -> Any:
    if source_format == "parquet":
        # Small row groups keep a reader's memory bounded; the payload is random, so no compression.
        return pq.ParquetWriter(path, schema, compression="none", use_dictionary=False)
    return pa.ipc.new_stream(str(path), schema)


def _hf_dtype(kind: pa.DataType) -> str:
    return {pa.string(): "string", pa.binary(): "binary", pa.int32(): "int32"}[kind]


def _write_empty(directory: Path, dims: Dims, rng: np.random.Generator) -> None:
    t5 = 0.5 * rng.standard_normal((dims.t5_tokens, dims.t5_dim))
    clip = 0.5 * rng.standard_normal(dims.clip_dim)
    write_empty_encodings(directory, t5, clip)


def write_empty_encodings(directory: Path, t5: np.ndarray, clip: np.ndarray) -> None:
    """The empty-prompt encodings (t5 [tokens, dim], clip [dim]) as MLCommons ships them: float16 with a
    leading batch dim."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in zip(EMPTY_FILES, (t5, clip), strict=True):
        np.save(directory / name, value[None].astype(np.float16), allow_pickle=False)
