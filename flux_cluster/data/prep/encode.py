"""encode: a folder of captioned images -> the flux1 sample schema -> an Energon root.

Each image goes through a local FLUX pipeline's VAE (latent mean/logvar) and its caption through CLIP
(pooled) and T5 (hidden states), as ``FluxPipeline`` itself encodes them, into exactly the columns of
MLCommons' preprocessed data. The rest is prepare-data's: convert, index and verify write the shards, so
training, ``data info`` and verify need no second format.

Work is cut into chunks of images (sorted by name, train and val apart) whose ends depend on the names,
not on positions: a chunk ends after an image whose name hash is 0 modulo ``chunk_images`` (so chunks
hold that many images on average, at most MAX_CHUNK_FACTOR times as many), and an image added to or
removed from the folder changes the chunk it falls in only. A chunk's encodings are cached as one Arrow file
named by the hash of what went into it (the model's fingerprint, the resolution, the text length, every
image's bytes, caption and val timestep): a later run over the same images reuses it, an interrupted run
resumes at the first chunk not written, and Slurm array tasks each encode their share of the chunks into
the same cache. The validation split is exactly round(val_fraction x images) of them (at least one), those
with the smallest hashes of their names (stable as the folder grows), and its samples get the timesteps
0..7 in turn, as MLPerf's val set, so the validation loss is deterministic and comparable across runs.
"""

import hashlib
import json
import math
import os
import random
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from flux_cluster.atomic import write_atomic
from flux_cluster.config.transformer_config import resolution_problem, token_problem
from flux_cluster.data.format import (
    CONTROL_COLUMN,
    EMPTY_DIR,
    KEY_COLUMN,
    SOURCE_DIRS,
    TIMESTEP_COLUMN,
    VAL_TIMESTEPS,
    Split,
    encode_tensor,
)
from flux_cluster.data.prep.edit_pairs import EditPair, load_pixels, record_files, scan_images, split_pixels
from flux_cluster.data.prep.image_folder import MAX_DECODE_BYTES, ImageFolderError, ImageRecord
from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.data.prep.synthetic import (
    ENCODED_MARKER,
    source_schema,
    source_writer,
    write_dataset_state,
    write_empty_encodings,
)
from flux_cluster.errors import FluxClusterError
from flux_cluster.models.quiet import library_warnings_off
from flux_cluster.outside import OutsideFileError, open_regular, read_json
from flux_cluster.safe_text import markup_escape, printable

ENCODING_VERSION = 1
"""Bumped when what an encoding holds changes: older cache entries are then not reused."""
DEFAULT_CHUNK_IMAGES = 256
"""Images per chunk on average (chunk ends depend on the images' names)."""
MAX_CHUNK_FACTOR = 4
"""A chunk holds at most this many times chunk_images images, whatever the names."""
SUMMARY_FILE = "flux-encoded.json"
"""In the Energon root: what was encoded, from what, with which model (read by fine-tuning and evaluate)."""


@dataclass(frozen=True)
class EncodeOptions:
    images: Path
    output: Path
    model: Path
    resolution: int = 512
    val_fraction: float = 0.1
    max_sequence_length: int = 256
    """T5 tokens per caption (FLUX.1-schnell's limit and MLPerf's: 256; FLUX.1-dev allows 512)."""
    strict: bool = False
    batch_size: int = 8
    chunk_images: int = DEFAULT_CHUNK_IMAGES
    """Images per chunk on average: the unit of caching, of re-encoding and of Slurm array tasks."""
    cache: Path | None = None
    """Where encoded chunks are kept; None: <user cache>/flux-cluster/encoded."""
    seed: int = 0
    """Seed of the val timesteps' order."""

    def __post_init__(self) -> None:
        problem = resolution_problem(self.resolution)
        if problem:
            raise FluxClusterError(f"--resolution {self.resolution}: {problem}")
        if not 0 < self.val_fraction <= 0.5:
            raise FluxClusterError(f"--val-fraction {self.val_fraction}: expected a fraction in (0, 0.5]")
        problem = token_problem(self.max_sequence_length)
        if problem:
            raise FluxClusterError(f"--max-sequence-length {self.max_sequence_length}: {problem}")
        for name in ("batch_size", "chunk_images"):
            if getattr(self, name) < 1:
                raise FluxClusterError(f"{name.replace('_', '-')}: expected a positive number")

    @property
    def cache_root(self) -> Path:
        if self.cache is not None:
            return self.cache.absolute()  # chunk links point here: a relative target would not resolve
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return base / "flux-cluster" / "encoded"


@dataclass(frozen=True)
class Item:
    record: ImageRecord
    split: Split
    timestep: int | None
    digest: str
    """sha256 of the image's bytes and its caption."""


@dataclass(frozen=True)
class Chunk:
    split: Split
    items: tuple[Item, ...]
    key: str
    """Hash of the encoding settings and every item: the cache file's name."""

    @property
    def name(self) -> str:
        return f"{self.split}-{self.key}.arrow"


@dataclass
class EncodeSummary:
    """SUMMARY_FILE: kept stable, scripts read it."""

    images: str
    model: str
    model_fingerprint: str
    resolution: int
    max_sequence_length: int
    layout: str
    samples: dict[str, int]
    skipped: list[str] = field(default_factory=list)
    """One line per image left out, naming it and why."""
    latent_size: int = 0
    t5_dim: int = 0
    clip_dim: int = 0
    dataset: str = ""
    """Hash of every encoded chunk: the same images, captions, split and settings give the same one."""


def encoding_key(options: EncodeOptions, model_fingerprint: str) -> str:
    settings = [ENCODING_VERSION, model_fingerprint, options.resolution, options.max_sequence_length]
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]


def _digest(record: ImageRecord, root: Path) -> str:
    """sha256 of the image's bytes (an edit pair's control's too) and caption, read as load_image reads
    them (regular files in root)."""
    digest = hashlib.sha256()
    for path in record_files(record):
        with open_regular(os.path.realpath(path), inside=root) as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    digest.update(b"\0" + record.caption.encode())
    return digest.hexdigest()


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def decode_threads(cpus: int | None = None, available: int | None = None) -> int:
    """Threads decoding images side by side: one per core (at most 8), and no more than half the
    available memory holds at one decode's worst case (image_folder.MAX_DECODE_BYTES) each."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    available = available if available is not None else _meminfo_available()
    by_memory = max(1, available // 2 // MAX_DECODE_BYTES) if available is not None else 8
    return max(1, min(8, cpus, by_memory))


def _name_hash(purpose: str, name: str) -> int:
    """A stable number per image name and purpose (its draw for the val split, or for a chunk end)."""
    return int.from_bytes(hashlib.sha256(f"{purpose}:{name}".encode()).digest()[:8], "big")


def val_count(images: int, fraction: float) -> int:
    """Images in the validation split: round(fraction x images), halves up, at least 1, and at least one
    image left for training."""
    return max(1, min(math.floor(fraction * images + 0.5), images - 1))


def _too_few(options: EncodeOptions, usable: int) -> FluxClusterError:
    return FluxClusterError(
        f"{options.images}: {usable} usable image(s); fine-tuning needs at least 2 (train and val)"
    )


def _skip(problems: list[str], line: str, strict: bool) -> None:
    if strict:
        raise ImageFolderError(f"{line}; strict: expected every image usable")
    problems.append(line)


def split_items(
    records: list[ImageRecord], options: EncodeOptions, problems: list[str] | None = None
) -> list[Item]:
    """Every record with its split, val timestep and content digest (train first, then val, by name).
    The val images are the val_count with the smallest name hashes: a stable choice as the folder grows
    (an added image joins val only by out-drawing one that was there, or when the count grows).

    Each val image is decoded here, once: one that cannot be used is skipped (a line in problems, naming
    it and why) and the next drawn takes its place, so a broken file never shrinks or empties val. A
    file that is no longer a regular file inside the folder (swapped since the scan) is skipped too."""
    problems = [] if problems is None else problems
    digests: dict[str, str] = {}
    for record in records:
        try:
            digests[record.name] = _digest(record, options.images)
        except OutsideFileError as exc:
            _skip(problems, f"{printable(str(record.path))}: {_reason(exc, record.path)}", options.strict)
        except OSError as exc:
            _skip(problems, f"{printable(str(record.path))}: {exc.strerror or exc}", options.strict)
    usable = [r for r in records if r.name in digests]
    if len(usable) < 2:
        raise _too_few(options, len(usable))
    wanted = val_count(len(usable), options.val_fraction)
    val_names: set[str] = set()
    broken: set[str] = set()
    for record in sorted(usable, key=lambda r: _name_hash("val", r.name)):
        if len(val_names) == wanted or len(usable) - len(broken) - len(val_names) < 2:
            break  # val is full, or one more would leave no train image
        try:
            load_pixels(record, options.resolution, options.images)
            val_names.add(record.name)
        except ImageFolderError as exc:
            _skip(problems, str(exc), options.strict)
            broken.add(record.name)
    usable = [r for r in usable if r.name not in broken]
    if not val_names:
        raise _too_few(options, len(usable))
    val = [r for r in usable if r.name in val_names]
    train = [r for r in usable if r.name not in val_names]
    # MLPerf assigns val timesteps as arange(N) % 8 after a seeded shuffle: equal counts per timestep.
    order = list(range(len(val)))
    random.Random(options.seed).shuffle(order)
    timesteps = {val[i].name: n % VAL_TIMESTEPS for n, i in enumerate(order)}
    items = [Item(r, "train", None, digests[r.name]) for r in train]
    return items + [Item(r, "val", timesteps[r.name], digests[r.name]) for r in val]


def _reason(exc: OutsideFileError, path: Path) -> str:
    """An OutsideFileError's reason, without the (resolved) path it starts with."""
    text = str(exc)
    for prefix in (os.path.realpath(path), str(path)):
        text = text.removeprefix(f"{prefix}: ")
    return printable(text)


def make_chunks(items: list[Item], encoding: str, size: int) -> list[Chunk]:
    """The items in chunks of ``size`` images on average, train and val apart, each in name order. A chunk
    ends after an image whose name hash is 0 modulo size, or at MAX_CHUNK_FACTOR x size images: the ends
    depend on the names, not on positions, so an image added or removed changes only the chunk it falls
    in (split in two, or merged with the next, when the image is an end) and the other chunks stay in the
    cache. (Chunks cut at the maximum, 2% of them on average, move with their run of names.)"""
    chunks = []
    for split in ("train", "val"):
        part: list[Item] = []
        for item in (item for item in items if item.split == split):
            part.append(item)
            if _name_hash("chunk", item.record.name) % size == 0 or len(part) >= MAX_CHUNK_FACTOR * size:
                chunks.append(_chunk(split, part, encoding))  # type: ignore[arg-type]
                part = []
        if part:
            chunks.append(_chunk(split, part, encoding))  # type: ignore[arg-type]
    return chunks


def _chunk(split: Split, items: list[Item], encoding: str) -> Chunk:
    digest = hashlib.sha256(encoding.encode())
    for item in items:
        digest.update(f"\n{item.record.name}\0{item.digest}\0{item.timestep}".encode())
    return Chunk(split, tuple(items), digest.hexdigest()[:24])


class ChunkEncoder:
    """Encodes chunks with one loaded FluxEncoders; images are decoded in threads ahead of the model."""

    def __init__(self, options: EncodeOptions, on_problem: Callable[[str], None]) -> None:
        import torch

        from flux_cluster.data.prep.encoders import FluxEncoders

        self.options = options
        self.on_problem = on_problem
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.encoders = FluxEncoders.load(options.model, self.device, dtype, options.max_sequence_length)
        self.pool = ThreadPoolExecutor(max_workers=decode_threads())

    def empty_encodings(self) -> tuple[np.ndarray, np.ndarray]:
        with library_warnings_off():
            t5, clip = self.encoders.encode_captions([""])
        return t5[0].float().cpu().numpy(), clip[0].float().cpu().numpy()

    def rows(self, chunk: Chunk, progress: StageProgress) -> Iterator[dict[str, Any]]:
        """The chunk's rows; an image that cannot be decoded is reported and left out (refused if strict)."""
        batch = self.options.batch_size
        pending: list[tuple[Item, np.ndarray]] = []
        for item, pixels in self._decoded(chunk.items, ahead=2 * batch):
            if pixels is not None:
                pending.append((item, pixels))
            if len(pending) == batch:
                yield from self._encode(pending, progress)
                pending = []
        if pending:
            yield from self._encode(pending, progress)

    def _decoded(self, items: Iterable[Item], ahead: int) -> Iterator[tuple[Item, np.ndarray | None]]:
        """(item, its pixels) in order, decoded in the pool at most ``ahead`` images in advance: memory
        stays bounded whatever the chunk's size."""
        queue: deque[tuple[Item, Future[np.ndarray | None]]] = deque()
        for item in items:
            queue.append((item, self.pool.submit(self._load, item)))
            if len(queue) > ahead:
                done, future = queue.popleft()
                yield done, future.result()
        while queue:
            done, future = queue.popleft()
            yield done, future.result()

    def _load(self, item: Item) -> np.ndarray | None:
        try:
            return load_pixels(item.record, self.options.resolution, self.options.images)
        except ImageFolderError as exc:
            if self.options.strict:
                raise
            self.on_problem(str(exc))
            return None

    def _encode(
        self, batch: list[tuple[Item, np.ndarray]], progress: StageProgress
    ) -> Iterator[dict[str, Any]]:
        import torch

        pixels = torch.from_numpy(np.stack([p for _, p in batch]))
        targets, controls = split_pixels(pixels)  # controls: edit pairs only
        mean, logvar = self.encoders.encode_images(targets)
        with library_warnings_off():  # a caption cut to max_sequence_length is what that option is for
            t5, clip = self.encoders.encode_captions([item.record.caption for item, _ in batch])
        outputs = (t5, clip, mean, logvar) + (
            () if controls is None else self.encoders.encode_images(controls)[:1]
        )
        tensors = [t.float().cpu().numpy() for t in outputs]
        for index, (item, _) in enumerate(batch):
            row: dict[str, Any] = {KEY_COLUMN: item.record.name}
            columns = ("t5_encodings", "clip_encodings", "mean", "logvar", CONTROL_COLUMN)
            for column, values in zip(columns[: len(tensors)], tensors, strict=True):
                row[column] = encode_tensor(values[index])
            if item.split == "val":
                row[TIMESTEP_COLUMN] = item.timestep
            yield row
        progress.advance(len(batch), int(pixels.numel() * 4))

    def close(self) -> None:
        self.pool.shutdown()


def _write_chunk(path: Path, chunk: Chunk, rows: Iterator[dict[str, Any]]) -> int:
    """The chunk's Arrow file, written under a temporary name and renamed; returns its rows."""
    import pyarrow as pa

    schema = source_schema(chunk.split, control=isinstance(chunk.items[0].record, EditPair))
    temporary = path.with_name(f".{path.name}.partial-{os.getpid()}")
    count = 0
    try:
        with source_writer(temporary, schema, "arrow") as writer:
            group: list[dict[str, Any]] = []
            for row in rows:
                group.append(row)
                count += 1
                if len(group) == 16:
                    writer.write_batch(pa.RecordBatch.from_pylist(group, schema=schema))
                    group = []
            if group or count == 0:
                writer.write_batch(pa.RecordBatch.from_pylist(group, schema=schema))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return count


class Encoding:
    """One encode of a folder: its items, chunks and cache paths (cheap to make: no model is loaded)."""

    def __init__(self, options: EncodeOptions, console: Console) -> None:
        from flux_cluster.data.prep.encoders import model_fingerprint

        self.options, self.console = options, console
        self.scan = scan_images(options.images, strict=options.strict)
        self.fingerprint = model_fingerprint(options.model)
        self.key = encoding_key(options, self.fingerprint)
        try:  # the images the digests and the val decode-check leave out join the scan's problems
            self.items = split_items(self.scan.records, options, self.scan.problems)
        finally:
            for problem in self.scan.problems:
                self._print_skipped(problem)
        self.chunks = make_chunks(self.items, self.key, options.chunk_images)
        self.folder = options.cache_root / self.key
        self.chunk_dir = self.folder / "chunks"

    @property
    def dataset(self) -> str:
        return hashlib.sha256("".join(c.key for c in self.chunks).encode()).hexdigest()[:16]

    def check_output(self) -> None:
        """Refuse, before any encoding, an output that holds another dataset (one output, one dataset)."""
        output = self.options.output
        if not (output / ".nv-meta").exists() and not (output / ".flux-prep").exists():
            if output.exists() and (not output.is_dir() or any(output.iterdir())):
                raise FluxClusterError(f"OUT {output}: holds other files; choose a new or empty folder")
            return
        from flux_cluster.data.prep.convert import ConversionPlan

        plan = ConversionPlan.load(output)  # an interrupted encode: its source is sources/<dataset>
        if plan is None or Path(plan.source).name != self.dataset:
            raise FluxClusterError(
                f"OUT {output}: holds another dataset (other images, captions or settings than these); "
                "remove it or choose a new folder"
            )

    def chunk_path(self, chunk: Chunk) -> Path:
        return self.chunk_dir / chunk.name

    def skipped_path(self, chunk: Chunk) -> Path:
        return self.chunk_dir / f"{chunk.name}.skipped.json"

    def cached_skips(self, chunk: Chunk) -> list[str]:
        """The images a cached chunk left out, one line each (file and why), as its encode wrote them."""
        try:
            lines = read_json(self.skipped_path(chunk), inside=self.chunk_dir)
        except OutsideFileError:
            return []
        return [printable(line) for line in lines if isinstance(line, str)] if isinstance(lines, list) else []

    def encode(self, task: int = 0, tasks: int = 1) -> int:
        """Encode this task's chunks not in the cache yet; returns the images encoded. The images the
        reused chunks left out are named again (from the cache), as on the run that encoded them, and
        refused with --strict as that run would have refused them."""
        mine = self.chunks[task::tasks]
        todo = [c for c in mine if not self.chunk_path(c).is_file()]
        for chunk in mine:
            if chunk not in todo:
                for line in self.cached_skips(chunk):  # strict: refused as the first run would have
                    _skip([], line, self.options.strict)
                    self._print_skipped(line)
        empty = self.folder / EMPTY_DIR
        if not todo and (empty.is_dir() or task):
            cached = sum(len(c.items) for c in mine)
            self.console.print(f"encode: all {cached:,} images of this task are in the cache ({self.folder})")
            return 0
        self.chunk_dir.mkdir(parents=True, exist_ok=True)
        total = sum(len(c.items) for c in todo)
        done = 0
        encoder = None
        try:
            with StageProgress("encode", total, self.console, unit="images") as progress:
                if total < sum(len(c.items) for c in mine):
                    progress.console.print(f"encode: {len(mine) - len(todo)} chunk(s) reused from the cache")
                for chunk in todo:
                    encoder = encoder or ChunkEncoder(self.options, lambda _p: None)
                    problems: list[str] = []
                    encoder.on_problem = problems.append
                    done += _write_chunk(self.chunk_path(chunk), chunk, encoder.rows(chunk, progress))
                    for problem in problems:
                        self._print_skipped(problem, progress.console)
                    write_atomic(self.skipped_path(chunk), json.dumps(problems) + "\n")
                if task == 0 and not empty.is_dir():
                    encoder = encoder or ChunkEncoder(self.options, lambda _p: None)
                    staging = empty.with_name(f".{EMPTY_DIR}.partial-{os.getpid()}")
                    write_empty_encodings(staging, *encoder.empty_encodings())
                    os.replace(staging, empty)
        finally:
            if encoder is not None:
                encoder.close()
        return done

    def missing_chunks(self) -> list[Chunk]:
        return [c for c in self.chunks if not self.chunk_path(c).is_file()]

    def assemble(self) -> Path:
        """The MLCommons-style source over the cached chunks (links, not copies), named by its content."""
        missing = self.missing_chunks()
        if missing or not (self.folder / EMPTY_DIR).is_dir():
            raise FluxClusterError(
                f"{self.folder}: {len(missing)} chunk(s) of {len(self.chunks)} not encoded yet; run the "
                "encode step (or every array task) first"
            )
        dataset = self.dataset
        source = self.folder / "sources" / dataset
        if (source / ENCODED_MARKER).is_file():
            return source
        staging = source.with_name(f".{dataset}.partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        for split in ("train", "val"):
            directory = staging / SOURCE_DIRS[split]  # type: ignore[index]
            directory.mkdir(parents=True)
            names = []
            for index, chunk in enumerate(c for c in self.chunks if c.split == split):
                name = f"data-{index:05d}.arrow"
                os.symlink(self.chunk_path(chunk), directory / name)
                names.append(name)
            control = isinstance(self.items[0].record, EditPair)
            write_dataset_state(directory, split, names, "flux-cluster-encoded", control)  # type: ignore[arg-type]
        shutil.copytree(self.folder / EMPTY_DIR, staging / EMPTY_DIR)
        marker = {"encoding": self.key, "model_fingerprint": self.fingerprint, "dataset": dataset}
        write_atomic(staging / ENCODED_MARKER, json.dumps(marker, indent=1) + "\n")
        if source.exists():  # another task assembled it meanwhile: the same content
            shutil.rmtree(staging)
        else:
            os.replace(staging, source)
        return source

    def skipped(self) -> list[str]:
        lines = list(self.scan.problems)
        for chunk in self.chunks:
            lines += self.cached_skips(chunk)
        return lines

    def _print_skipped(self, line: str, console: Console | None = None) -> None:
        (console or self.console).print(
            f"[yellow]skipped[/yellow] {markup_escape(line)}", soft_wrap=True, highlight=False
        )

    def summary(self, samples: dict[str, int]) -> EncodeSummary:
        t5 = np.load(self.folder / EMPTY_DIR / "t5_empty.npy")
        clip = np.load(self.folder / EMPTY_DIR / "clip_empty.npy")
        return EncodeSummary(
            images=str(self.options.images.absolute()),
            model=str(self.options.model.absolute()),
            model_fingerprint=self.fingerprint,
            resolution=self.options.resolution,
            max_sequence_length=self.options.max_sequence_length,
            layout=self.scan.layout,
            samples=samples,
            skipped=self.skipped(),
            latent_size=self.options.resolution // 8,
            t5_dim=int(t5.shape[-1]),
            clip_dim=int(clip.shape[-1]),
            dataset=self.dataset,
        )


def write_dataset(encoding: Encoding, workers: int = 1) -> EncodeSummary:
    """Assemble the cached chunks and convert, index and verify them into the output root."""
    from flux_cluster.data.prep.convert import ConversionPlan
    from flux_cluster.data.prep.source import open_source
    from flux_cluster.data.prep.stages import StagePaths, run_stage

    options, console = encoding.options, encoding.console
    source = encoding.assemble()
    empty = [split for split in ("train", "val") if not open_source(source, split).total]  # type: ignore[arg-type]
    if empty:
        raise FluxClusterError(
            f"{options.images}: no usable {' or '.join(empty)} image left after skipping the broken ones "
            "(see the 'skipped' lines); add images or fix them"
        )
    output = options.output
    recorded = ConversionPlan.load(output)
    shard_size = recorded.shard_size if recorded else options.chunk_images * 4
    paths = StagePaths(source=source, output=output)
    for stage in ("convert", "index", "verify"):
        if not run_stage(stage, paths, workers=workers, shard_size=shard_size, console=console):  # type: ignore[arg-type]
            raise FluxClusterError(f"{output}: the encoded dataset failed verification")
    plan = ConversionPlan.load(output)
    assert plan is not None
    summary = encoding.summary(plan.samples)
    write_atomic(output / SUMMARY_FILE, json.dumps(asdict(summary), indent=1) + "\n")
    return summary


def encode_folder(options: EncodeOptions, console: Console | None = None, workers: int = 1) -> EncodeSummary:
    """The whole local encode: scan, encode what the cache lacks, write the Energon root."""
    console = console or Console(stderr=True)
    encoding = Encoding(options, console)
    encoding.check_output()
    encoding.encode()
    return write_dataset(encoding, workers)
