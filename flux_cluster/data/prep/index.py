"""index: the shard lists, Energon's metadata (written without prompts) and the empty encodings."""

import json
import logging
import multiprocessing
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from flux_cluster.atomic import write_atomic
from flux_cluster.data.format import EMPTY_DIR, EMPTY_FILES, INDEX_FILE, SPLITS, shard_name
from flux_cluster.data.prep.convert import ConversionPlan
from flux_cluster.data.prep.progress import StageProgress
from flux_cluster.data.prep.shards import ShardRecord, is_finished, output_lock
from flux_cluster.errors import FluxClusterError, full_disk, write_error

NV_META = ".nv-meta"
DATASET_FILE = "dataset.yaml"
"""Written last: the index's commit mark."""
DATASET_YAML = {"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}
"""What 'energon prepare' writes for sample type CrudeWebdataset (class 11 in its prompt)."""
SPLIT_PATTERNS = [("train", "train/.*"), ("val", "val/.*")]
_TEMPFILE = re.compile(r"\.[a-z0-9_]{8}")


def index(
    output: Path, source_root: Path | None, workers: int = 1, console: Console | None = None
) -> list[str]:
    """Index a fully converted output; returns the shard paths, relative to the output. Runs on one
    output at a time (others wait), and keeps an index that is complete for these shards."""
    plan = ConversionPlan.load(output)
    if plan is None:
        raise FluxClusterError(f"{output}: no conversion recorded there; run the convert stage first")
    missing = [
        f"{split}/{shard_name(shard)}"
        for split, shard in plan.work()
        if not is_finished(output, split, shard)
    ]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise FluxClusterError(
            f"{output}: conversion is not finished ({len(missing)} shard(s) missing: {shown})"
        )
    shards = [f"{split}/{shard_name(shard)}" for split, shard in plan.work()]
    try:
        with output_lock(output, "index"):  # the convert tasks' locking: a second run waits here
            if _complete(output, plan):
                console = console or Console(stderr=True)
                console.print(f"index: {output} is already indexed for these shards")
                return shards
            try:
                _index_unlocked(output, plan, shards, source_root, workers)
            except BaseException:
                _remove_partial_tar_indexes(output)
                raise
    except OSError as exc:
        raise write_error(exc.filename or output, exc) from None
    return shards


def _index_unlocked(
    output: Path, plan: ConversionPlan, shards: list[str], source_root: Path | None, workers: int
) -> None:
    commit = output / NV_META / DATASET_FILE
    commit.unlink(missing_ok=True)  # written last: until then the output is not indexed
    _remove_partial_tar_indexes(output)
    for split in SPLITS:
        names = [shard_name(shard) for shard in range(plan.shards(split))]
        _write(output / split / INDEX_FILE, "".join(f"{name}\n" for name in names))
    _copy_empty_encodings(output, Path(plan.source) if source_root is None else source_root)
    _energon_prepare(output, shards, workers)
    _write(commit, yaml.safe_dump(DATASET_YAML, sort_keys=False))


def _complete(output: Path, plan: ConversionPlan) -> bool:
    """An index finished (dataset.yaml is its commit mark) and counting every shard as converted."""
    if not is_indexed(output):
        return False
    try:
        counts = json.loads((output / NV_META / ".info.json").read_text())["shard_counts"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False  # e.g. half-written by a run that stopped
    expected = {}
    for split, shard in plan.work():
        record = ShardRecord.load(output, split, shard)
        expected[f"{split}/{shard_name(shard)}"] = record.samples if record else None
    return counts == expected


def _remove_partial_tar_indexes(output: Path) -> None:
    """Energon writes each shard's .tar.idx through temporary files (``.shard_*.tar.idx.tmp*``, and
    tempfile's ``.XXXXXXXX``); a failed or killed run leaves them behind."""
    for split in SPLITS:
        folder = output / split
        for stale in folder.iterdir() if folder.is_dir() else []:
            if ".tar.idx.tmp" in stale.name or _TEMPFILE.fullmatch(stale.name):
                stale.unlink(missing_ok=True)


def _write(path: Path, data: str | bytes) -> None:
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise write_error(path, exc) from None


def _copy_empty_encodings(output: Path, source_root: Path) -> None:
    target = output / EMPTY_DIR
    target.mkdir(exist_ok=True)
    for name in EMPTY_FILES:
        source = source_root / EMPTY_DIR / name
        if not source.is_file():
            if (target / name).is_file():
                continue  # copied by an earlier run; the source may have been reclaimed since
            raise FluxClusterError(f"{source}: missing (the empty encodings come with the download)")
        _write(target / name, source.read_bytes())


def _energon_prepare(output: Path, shards: list[str], workers: int) -> None:
    # The Python API of 'energon prepare --non-interactive --split-parts ... --sample-type CrudeWebdataset'.
    import sqlite3

    from megatron.energon.flavors.webdataset import BaseWebdatasetFactory

    meta = output / NV_META
    with (
        StageProgress("index (energon)", len(shards), unit="shards") as progress,
        _ShardFailures(output) as failures,
    ):

        def track(items: Iterator[Any], length: int | None = None) -> Iterator[Any]:
            for item in items:
                progress.advance(1, 0)
                yield item

        try:
            BaseWebdatasetFactory.prepare_dataset(
                output,
                shards,
                split_parts_patterns=SPLIT_PATTERNS,
                progress_fn=track,
                workers=max(workers, 1),
                shuffle_seed=None,
            )
        except SystemExit:  # energon exits (after printing why) on duplicate keys
            raise FluxClusterError(f"{output}: energon refused the shards (see its message above)") from None
        except Exception as exc:
            failures.raise_first()  # the cause: a shard the workers could not index
            if isinstance(exc, OSError | sqlite3.Error) or full_disk(exc):
                where = meta / "index.sqlite" if isinstance(exc, sqlite3.Error) else None
                raise write_error(where or getattr(exc, "filename", None) or meta, exc) from None
            raise
        failures.raise_first()  # energon skips such a shard, with a count it may already have taken
    if not (meta / "split.yaml").is_file():
        raise FluxClusterError(f"{meta}: energon wrote no split.yaml")


class _ShardFailures(logging.Handler):
    """Energon's index workers (forked) log each shard they fail on with a traceback, then skip it.
    Instead, the first failure's reason is kept, in shared memory, for one line."""

    _LOGGER = "megatron.energon.flavors.webdataset.prepare"

    def __init__(self, output: Path) -> None:
        super().__init__(logging.ERROR)
        self.output = output
        self.first = multiprocessing.get_context("fork").Array("c", 2048)  # energon forks its workers
        self._logger = logging.getLogger(self._LOGGER)
        self._propagate = self._logger.propagate

    def __enter__(self) -> "_ShardFailures":
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return
        named = re.search(r"'([^']+)'", record.getMessage())  # "Shard failed to load: 'train/...tar'"
        shard = self.output / named.group(1) if named else self.output
        line = str(write_error(f"{shard}.idx" if full_disk(exc) else shard, exc)).encode()
        lock = self.first.get_lock()
        if not lock.acquire(timeout=5):  # a worker the pool killed while it held the lock
            return
        try:
            if not self.first.get_obj().value:
                self.first.get_obj().value = line[: len(self.first) - 1]
        finally:
            lock.release()

    def raise_first(self) -> None:
        # Unlocked: the workers are done or gone, and one terminated while holding the lock would hang
        # this read forever (seen in CI on a full disk).
        first = self.first.get_obj().value
        if first:
            raise FluxClusterError(first.decode(errors="replace"))


def is_indexed(output: Path) -> bool:
    meta = output / NV_META
    return all((meta / name).is_file() for name in (DATASET_FILE, "split.yaml", ".info.json")) or all(
        (meta / name).is_file() for name in (DATASET_FILE, "split.yaml", ".info.yaml")
    )
