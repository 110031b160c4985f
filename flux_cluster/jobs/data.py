"""Entry point of a prepare-data or data encode Slurm task:
``python -m flux_cluster.jobs.data --config RUN/config.yaml --stage S``.

The run's config holds the system (already narrowed to one data job by flux-cluster). An array task's
index comes from FLUX_EXP_INDEX, the number of tasks from mlperf.nexp. The encode stages read their
options from ENCODE_OPTIONS_FILE beside the config (never from the command line, which is rendered into
the script). Progress goes to stdout (the job's --output, as for every other job); errors to stderr."""

import argparse
import contextlib
import dataclasses
import os
import sys
from pathlib import Path

from rich.console import Console

from flux_cluster.config.schema import SystemConfig
from flux_cluster.data.prep.job_options import ENCODE_OPTIONS_FILE, read_encode_options
from flux_cluster.data.prep.stages import ENCODE_STAGES, STAGES, StagePaths, run_stage
from flux_cluster.errors import FluxClusterError


def paths_in_job(system: SystemConfig) -> StagePaths:
    """Source and output as this process sees them: the mount points inside a container."""
    paths = system.paths
    inside = system.container.runtime != "none"
    source = paths.source_mount if inside and paths.source_root else paths.source_root
    output = paths.data_mount if inside and paths.data_root else paths.data_root
    return StagePaths(Path(source) if source else None, Path(output) if output else None)


def task_title(stage: str, task: int, tasks: int) -> str:
    """What a data job does, e.g. 'convert task 2 of 4' (not a training repeat with a seed)."""
    return f"{stage} task {task + 1} of {tasks}" if tasks > 1 else stage


def run_encode_stage(stage: str, config: Path, system: SystemConfig, task: int, tasks: int) -> None:
    """encode: this task's share of the chunks into the cache; encode-finish: the Energon root from it."""
    from flux_cluster.data.prep.encode import Encoding, write_dataset

    options = read_encode_options(config.parent / ENCODE_OPTIONS_FILE)
    # The data root is the output; in a container it is mounted at paths.data_mount.
    output = paths_in_job(system).need_output(stage)
    options = dataclasses.replace(options, output=output)
    target = options.cache_root if stage == "encode" else output
    print(f"[data] {task_title(stage, task, tasks)}: {options.images} -> {target}", flush=True)
    console = Console(emoji=False)
    encoding = Encoding(options, console)
    if stage == "encode":
        mine = encoding.chunks[task::tasks]
        encoded = encoding.encode(task, tasks)
        console.print(
            f"encode task {task + 1} of {tasks}: {len(mine)} chunk(s) of {len(encoding.chunks)}, "
            f"{sum(len(c.items) for c in mine)} image(s), {encoded} encoded now (key {encoding.key})",
            soft_wrap=True,
            highlight=False,
        )
        return
    summary = write_dataset(encoding, system.data_prep.workers)
    console.print(
        f"encoded {summary.samples['train']:,} train and {summary.samples['val']:,} val images "
        f"({len(summary.skipped)} skipped) into {output}",
        soft_wrap=True,
        highlight=False,
    )


def main(argv: list[str] | None = None) -> int:
    from flux_cluster.rundir import read_run_config

    parser = argparse.ArgumentParser(prog="python -m flux_cluster.jobs.data")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--stage", choices=(*STAGES, *ENCODE_STAGES), required=True)
    args = parser.parse_args(argv)
    try:
        system, _job = read_run_config(args.config)
        task, tasks = int(os.environ.get("FLUX_EXP_INDEX", "0")), system.mlperf.nexp
        if args.stage in ENCODE_STAGES:
            with contextlib.redirect_stderr(sys.stdout):
                run_encode_stage(args.stage, args.config, system, task, tasks)
            return 0
        paths = paths_in_job(system)
        print(
            f"[data] {task_title(args.stage, task, tasks)}: {paths.source or '-'} -> {paths.output or '-'}",
            flush=True,
        )
        # The stages report progress on stderr (a terminal's place for it); in a job it is the output.
        with contextlib.redirect_stderr(sys.stdout):
            ok = run_stage(
                args.stage,
                paths,
                task=task,
                tasks=tasks,
                workers=system.data_prep.workers,
                shard_size=system.data_prep.shard_size,
                console=Console(emoji=False),
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
