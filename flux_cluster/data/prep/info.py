"""data info: what a folder holds, an Energon root or a preprocessed download, without reading the shards."""

import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flux_cluster.console import print_table
from flux_cluster.data.format import EMPTY_DIR, EMPTY_FILES, SOURCE_DIRS, SPLITS
from flux_cluster.data.prep.convert import ConversionPlan
from flux_cluster.data.prep.index import NV_META, is_indexed
from flux_cluster.data.prep.shards import ShardRecord
from flux_cluster.errors import FluxClusterError

_VERIFY = "'flux-cluster prepare-data --output {root} --stage verify' checks every shard"


def describe(root: Path, console: Console) -> None:
    if not root.is_dir():
        raise FluxClusterError(f"{root}: no such directory")
    if any((root / split).is_dir() for split in SPLITS):
        _describe_energon(root, console)
    elif any((root / name).is_dir() for name in SOURCE_DIRS.values()):
        _describe_source(root, console)
    else:
        raise FluxClusterError(
            f"{root}: neither an Energon root (train/, val/) nor a preprocessed download "
            f"({', '.join(SOURCE_DIRS.values())})"
        )


def _describe_energon(root: Path, console: Console) -> None:
    plan = ConversionPlan.load(root)
    info_path = root / NV_META / ".info.json"
    try:
        energon_counts = (
            json.loads(info_path.read_text()).get("shard_counts", {}) if info_path.is_file() else {}
        )
    except (ValueError, AttributeError, RecursionError):
        energon_counts = {}  # unreadable: fall back to conversion's records
    indexed = is_indexed(root)
    table = Table(title=f"{root} (Energon webdataset)")
    for column in ("split", "shards", "samples", "GB", "unfinished"):
        table.add_column(column, justify="left" if column == "split" else "right")
    damaged: list[str] = []
    for split in SPLITS:
        tars = sorted((root / split).glob("shard_*.tar"))
        samples = 0
        for tar in tars:
            shard = int(tar.stem.removeprefix("shard_"))
            record = ShardRecord.load(root, split, shard)
            samples += energon_counts.get(f"{split}/{tar.name}", record.samples if record else 0)
            size = tar.stat().st_size
            if record and size != record.nbytes:  # a stat, not a read: truncated or overwritten since
                damaged.append(f"{tar} has {size:,} bytes, its conversion wrote {record.nbytes:,}")
        expected = plan.shards(split) if plan else len(tars)
        unfinished = len(list((root / split).glob(".shard_*.partial-*"))) + max(expected - len(tars), 0)
        gigabytes = sum(t.stat().st_size for t in tars) / 1e9
        table.add_row(split, str(len(tars)), f"{samples:,}", f"{gigabytes:.3f}", str(unfinished))
    print_table(console, table)
    empty = all((root / EMPTY_DIR / name).is_file() for name in EMPTY_FILES)
    source = (
        f"{plan.source_kind} data from {plan.source}, shard size {plan.shard_size:,}" if plan else "unknown"
    )
    console.print(f"source: {source}")
    console.print(
        f"indexed for Energon: {'yes' if indexed else 'no'}; empty encodings: {'yes' if empty else 'no'}"
    )
    if damaged:
        more = f" (and {len(damaged) - 1} more damaged shard(s))" if len(damaged) > 1 else ""
        raise FluxClusterError(f"{damaged[0]}{more}; {_VERIFY.format(root=root)}")


def load_check(root: Path, batches: int, console: Console) -> None:
    """Read batches through the Energon loaders training uses, and report what came out and how fast."""
    import time

    from flux_cluster.data.loader import train_loader, val_loader

    if not is_indexed(root):
        raise FluxClusterError(
            f"{root}: not indexed for Energon; run 'flux-cluster prepare-data --stage index'"
        )
    started = time.perf_counter()
    samples = dropped = 0
    batch = None
    with _reading(root, "train"):
        for _, batch in zip(
            range(batches), train_loader(root, batch_size=4, rank=0, world_size=1, seed=0), strict=False
        ):
            samples += len(batch.keys)
            dropped += int(batch.caption_dropped.sum())
    elapsed = time.perf_counter() - started
    if batch is None:
        raise FluxClusterError(f"{root}: the train split yielded no batch")
    shapes = ", ".join(
        f"{name} {list(getattr(batch, name).shape[1:])}" for name in ("t5", "clip", "mean", "logvar")
    )
    console.print(f"train loader: {samples} samples in {elapsed:.2f} s ({samples / elapsed:,.1f} samples/s)")
    console.print(f"  per sample: {shapes} ({batch.t5.dtype}); captions dropped (CFG): {dropped}/{samples}")
    with _reading(root, "val"):
        val = sum(len(b.keys) for b in val_loader(root, batch_size=8, rank=0, world_size=1))
    console.print(f"val loader: {val:,} samples in one pass")


@contextmanager
def _reading(root: Path, split: str) -> Iterator[None]:
    """A damaged shard (one conversion did not record, or read past a stat's notice) as one line."""
    try:
        yield
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise FluxClusterError(
            f"{root / split}: a shard could not be read ({type(exc).__name__}: {exc}); "
            f"{_VERIFY.format(root=root)}"
        ) from None


def _describe_source(root: Path, console: Console) -> None:
    from flux_cluster.data.prep.source import SourceError, open_source

    table = Table(title=f"{root} (MLCommons preprocessed download)")
    for column in ("split", "folder", "format", "files", "samples", "GB"):
        table.add_column(column, justify="left" if column in ("split", "folder", "format") else "right")
    for split in SPLITS:
        try:
            source = open_source(root, split)
        except SourceError as exc:
            table.add_row(split, SOURCE_DIRS[split], f"[red]{exc}[/red]", "", "", "")
            continue
        kind = source.files[0].kind if source.files else "-"
        table.add_row(
            split,
            SOURCE_DIRS[split],
            kind,
            str(len(source.files)),
            f"{source.total:,}",
            f"{source.nbytes / 1e9:.3f}",
        )
    print_table(console, table)
