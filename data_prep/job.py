"""Entry point of a prepare-data Slurm task: ``python -m data_prep.job --config RUN/config.yaml --stage S``.

The run's config holds the system (already narrowed to one data job by flux-cluster). An array task's
index comes from FLUX_EXP_INDEX, the number of tasks from mlperf.nexp."""

import argparse
import os
import sys
from pathlib import Path

from data_prep.stages import STAGES, StagePaths, run_stage
from flux_cluster.config.schema import SystemConfig
from flux_cluster.errors import FluxClusterError


def paths_in_job(system: SystemConfig) -> StagePaths:
    """Source and output as this process sees them: the mount points inside a container."""
    paths = system.paths
    inside = system.container.runtime != "none"
    source = paths.source_mount if inside and paths.source_root else paths.source_root
    output = paths.data_mount if inside and paths.data_root else paths.data_root
    return StagePaths(Path(source) if source else None, Path(output) if output else None)


def main(argv: list[str] | None = None) -> int:
    from flux_cluster.rundir import read_run_config

    parser = argparse.ArgumentParser(prog="python -m data_prep.job")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--stage", choices=STAGES, required=True)
    args = parser.parse_args(argv)
    try:
        system, _job = read_run_config(args.config)
        ok = run_stage(
            args.stage,
            paths_in_job(system),
            task=int(os.environ.get("FLUX_EXP_INDEX", "0")),
            tasks=system.mlperf.nexp,
            workers=system.data_prep.workers,
            shard_size=system.data_prep.shard_size,
        )
    except FluxClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
