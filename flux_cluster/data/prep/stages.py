"""The stages of prepare-data, run in this process: the same code for local runs and for Slurm tasks."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console

from flux_cluster.errors import FluxClusterError

Stage = Literal["download", "convert", "index", "verify"]
STAGES: tuple[Stage, ...] = ("download", "convert", "index", "verify")
ENCODE_STAGES = ("encode", "encode-finish")
"""data encode --submit: an array encoding the image chunks, then one job writing the Energon root."""


@dataclass(frozen=True)
class StagePaths:
    source: Path | None
    """The MLCommons preprocessed download (input)."""
    output: Path | None
    """The Energon root (output)."""

    def need_source(self, stage: str) -> Path:
        if self.source is None:
            raise FluxClusterError(f"stage {stage}: no source root; pass --input or set paths.source_root")
        return self.source

    def need_output(self, stage: str) -> Path:
        if self.output is None:
            raise FluxClusterError(f"stage {stage}: no Energon root; pass --output or set paths.data_root")
        return self.output


def run_stage(
    stage: Stage,
    paths: StagePaths,
    *,
    task: int = 0,
    tasks: int = 1,
    workers: int = 1,
    shard_size: int = 10_000,
    console: Console | None = None,
) -> bool:
    """Run one stage; False when verify found problems (every other failure raises FluxClusterError)."""
    console = console or Console(stderr=True)
    if stage == "download":
        from flux_cluster.data.prep.download import download

        fetched = download(paths.need_source(stage))
        console.print(f"download: {', '.join(fetched) if fetched else 'everything was already downloaded'}")
    elif stage == "convert":
        from flux_cluster.data.prep.convert import convert
        from flux_cluster.data.prep.source import SourceError

        try:
            convert(
                paths.need_source(stage),
                paths.need_output(stage),
                shard_size=shard_size,
                task=task,
                tasks=tasks,
                workers=workers,
            )
        except SourceError as exc:
            raise FluxClusterError(str(exc)) from None
    elif stage == "index":
        from flux_cluster.data.prep.index import index

        shards = index(paths.need_output(stage), paths.source, workers, console)
        console.print(f"index: {len(shards)} shards indexed for Energon in {paths.output}")
    elif stage == "verify":
        from flux_cluster.data.prep.verify import verify

        return verify(paths.need_output(stage), workers, console)
    else:
        raise FluxClusterError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    return True
