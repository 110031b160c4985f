"""`flux-cluster evaluate --submit` as a Slurm job: one rank on one GPU of the ordinary job template, running
``python -m flux_cluster.evaluate.job --config RUN/config.yaml``, which runs the same command as here.
Its arguments travel in ARGS_FILE beside the config, never in the rendered script."""

import argparse
import sys
from pathlib import Path

from flux_cluster.config.schema import SystemConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate import ARGS_FILE
from flux_cluster.jobs import read_job_file

JOB_MINUTES = 60
"""Walltime added to the short-job budget: 2 x 96 generations (--runs 12 of the 8 built-in prompts) of
FLUX.1-dev at 28 steps take minutes; a long prompt file at many --runs may need more."""


def evaluate_job_system(system: SystemConfig, mounts: tuple[str, ...]) -> SystemConfig:
    """The system narrowed to one node, one rank and (where the system asks Slurm for GPUs) one GPU, no
    MLPerf steps; mounts: 'SRC:DST[:ro]' for the models and outputs in a container (ignored on bare metal)."""
    slurm = system.slurm.model_copy(update={"requeue": False})
    mlperf = system.mlperf.model_copy(
        update={
            "nexp": 1,
            "clear_caches": False,
            "comm_test": False,
            "verify_mounts": False,
            "check_compliance": False,
        }
    )
    update: dict[str, object] = {"nodes": 1, "gpus_per_node": 1, "slurm": slurm, "mlperf": mlperf}
    if mounts and system.container.runtime != "none":
        update["container"] = system.container.model_copy(
            update={"mounts": [*system.container.mounts, *mounts]}
        )
    return system.model_copy(update=update)


def read_args(path: Path) -> list[str]:
    written_by = "the arguments 'flux-cluster evaluate --submit' writes ({\"args\": [...]})"
    args = read_job_file(path, written_by).get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise FluxClusterError(f"{path}: args: expected {written_by}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux_cluster.evaluate.job")
    parser.add_argument("--config", type=Path, required=True)
    options = parser.parse_args(argv)
    try:
        args = read_args(options.config.parent / ARGS_FILE)
    except FluxClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from flux_cluster.cli import app

    try:
        app(["evaluate", *args], prog_name="flux-cluster")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
