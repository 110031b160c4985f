"""The logic of prepare-data and data encode run here (under flux_cluster.api.prepare_data and encode): which
stages, with which shard size, checked before anything runs or is submitted, then run in this process."""

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from flux_cluster.data.prep.stages import STAGES, StagePaths, run_stage
from flux_cluster.errors import FluxClusterError

if TYPE_CHECKING:
    from flux_cluster.config.schema import SystemConfig
    from flux_cluster.data.prep.encode import EncodeOptions, EncodeSummary


def stage_list(stage: str, has_input: bool) -> list[str]:
    """--stage S as the stages to run: all of them (download only without --input), or one."""
    if stage == "all":
        return [s for s in STAGES if not (has_input and s == "download")]
    if stage not in STAGES:
        raise FluxClusterError(f"--stage {stage!r}: expected one of {', '.join(STAGES)} or all")
    if stage == "download" and has_input:
        raise FluxClusterError(
            "--stage download with --input: the input is already there, nothing to download"
        )
    return [stage]


def settle_shard_size(config: "SystemConfig", explicit: bool) -> "SystemConfig":
    """Without an explicit shard size, continue an earlier conversion with the size it recorded."""
    from flux_cluster.data.prep.convert import ConversionPlan

    if explicit or not config.paths.data_root:
        return config
    recorded = ConversionPlan.load(Path(config.paths.data_root))
    if recorded is None or recorded.shard_size == config.data_prep.shard_size:
        return config
    prep = config.data_prep.model_copy(update={"shard_size": recorded.shard_size})
    return config.model_copy(update={"data_prep": prep})


def check_roots(config: "SystemConfig") -> None:
    paths = config.paths
    if (
        paths.source_root
        and paths.data_root
        and Path(paths.source_root).resolve() == Path(paths.data_root).resolve()
    ):
        raise FluxClusterError(f"--input and --output are the same folder ({paths.source_root}); use two")


def check_input(config: "SystemConfig") -> None:
    """The source converts, and into this output: checked before anything runs or is submitted."""
    from flux_cluster.data.prep.convert import ConversionPlan, check_compatible, make_plan
    from flux_cluster.data.prep.source import SourceError

    source = StagePaths(Path(config.paths.source_root) if config.paths.source_root else None, None)
    try:
        plan = make_plan(source.need_source("convert"), config.data_prep.shard_size)
    except SourceError as exc:
        raise FluxClusterError(str(exc)) from None
    if config.paths.data_root:
        output = Path(config.paths.data_root)
        check_compatible(output, ConversionPlan.load(output), plan)


def local_workers(config: "SystemConfig", workers: int | None) -> int:
    """Here, a local system uses every core unless told otherwise; a cluster system its configured workers."""
    return workers or (os.cpu_count() or 1) if config.launcher == "local" else config.data_prep.workers


def _paths(config: "SystemConfig") -> StagePaths:
    return StagePaths(
        Path(config.paths.source_root) if config.paths.source_root else None,
        Path(config.paths.data_root) if config.paths.data_root else None,
    )


def planned(config: "SystemConfig", stages: list[str], workers: int) -> list[str]:
    """A dry run here: one line per stage."""
    paths = _paths(config)
    return [
        f"{stage}: source {paths.source or '-'} -> output {paths.output or '-'}, "
        f"{workers} worker(s), "
        f"shard size {config.data_prep.shard_size}"
        for stage in stages
    ]


def run_here(config: "SystemConfig", stages: list[str], workers: int, console: Console) -> bool:
    """The stages in this process, in order, until one fails."""
    paths = _paths(config)
    for stage in stages:
        started = time.monotonic()
        console.rule(f"[bold]{stage}")
        ok = run_stage(stage, paths, workers=workers, shard_size=config.data_prep.shard_size, console=console)  # type: ignore[arg-type]
        console.print(f"{stage}: {'done' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
        if not ok:
            return False
    return True


def check_encode_output(images: Path, out: Path) -> None:
    if out.resolve() == images.resolve() or out.resolve().is_relative_to(images.resolve()):
        raise FluxClusterError(f"OUT {out}: inside the image folder {images}; write the dataset elsewhere")


def only_with_submit(given: Mapping[str, object], submit: str) -> None:
    """Options (named as the caller knows them) that mean nothing to an encode run here."""
    named = [name for name, value in given.items() if value is not None]
    if named:
        raise FluxClusterError(f"{', '.join(named)}: only with {submit} (a local encode runs here, now)")


def encode_here(options: "EncodeOptions", console: Console) -> "EncodeSummary":
    from flux_cluster.data.prep.encode import encode_folder

    return encode_folder(options, console, workers=min(4, os.cpu_count() or 1))
