"""index: the shard lists, Energon's metadata (written without prompts) and the empty encodings."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from data_prep.convert import ConversionPlan
from data_prep.format import EMPTY_DIR, EMPTY_FILES, INDEX_FILE, SPLITS, shard_name
from data_prep.progress import StageProgress
from data_prep.shards import is_finished
from flux_cluster.atomic import write_atomic
from flux_cluster.errors import FluxClusterError

NV_META = ".nv-meta"
DATASET_YAML = {"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}
"""What 'energon prepare' writes for sample type CrudeWebdataset (class 11 in its prompt)."""
SPLIT_PATTERNS = [("train", "train/.*"), ("val", "val/.*")]


def index(output: Path, source_root: Path | None, workers: int = 1) -> list[str]:
    """Index a fully converted output; returns the shard paths, relative to the output."""
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
    shards: list[str] = []
    for split in SPLITS:
        names = [shard_name(shard) for shard in range(plan.shards(split))]
        write_atomic(output / split / INDEX_FILE, "".join(f"{name}\n" for name in names))
        shards += [f"{split}/{name}" for name in names]
    _copy_empty_encodings(output, Path(plan.source) if source_root is None else source_root)
    _energon_prepare(output, shards, workers)
    return shards


def _copy_empty_encodings(output: Path, source_root: Path) -> None:
    target = output / EMPTY_DIR
    target.mkdir(exist_ok=True)
    for name in EMPTY_FILES:
        source = source_root / EMPTY_DIR / name
        if not source.is_file():
            if (target / name).is_file():
                continue  # copied by an earlier run; the source may have been reclaimed since
            raise FluxClusterError(f"{source}: missing (the empty encodings come with the download)")
        write_atomic(target / name, source.read_bytes())


def _energon_prepare(output: Path, shards: list[str], workers: int) -> None:
    # The Python API of 'energon prepare --non-interactive --split-parts ... --sample-type CrudeWebdataset'.
    from megatron.energon.flavors.webdataset import BaseWebdatasetFactory

    with StageProgress("index (energon)", len(shards), unit="shards") as progress:

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
    meta = output / NV_META
    if not (meta / "split.yaml").is_file():
        raise FluxClusterError(f"{meta}: energon wrote no split.yaml")
    write_atomic(meta / "dataset.yaml", yaml.safe_dump(DATASET_YAML, sort_keys=False))


def is_indexed(output: Path) -> bool:
    meta = output / NV_META
    return all((meta / name).is_file() for name in ("dataset.yaml", "split.yaml", ".info.json")) or all(
        (meta / name).is_file() for name in ("dataset.yaml", "split.yaml", ".info.yaml")
    )
