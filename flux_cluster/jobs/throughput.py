"""The throughput job's entry point on every rank: ``python -m flux_cluster.jobs.throughput --config
RUN/config.yaml [--synthetic] [--warmup-steps N] [--steps N]``.
The measurement is in flux_cluster/training/throughput.py."""

import time

STARTED = time.monotonic()  # the record's wall time counts the process's start-up (imports, model build)

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from flux_cluster.config.workload import TrainingPlan  # noqa: E402
from flux_cluster.rundir import read_run_config  # noqa: E402
from flux_cluster.runtime.dist import exit_rank  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux_cluster.jobs.throughput", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run directory's config.yaml")
    parser.add_argument("--synthetic", action="store_true", help="in-memory batches, no dataset")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    args = parser.parse_args(argv)
    if args.warmup_steps < 0 or args.steps < 1:
        sys.exit("error: --warmup-steps must be >= 0 and --steps >= 1")

    system, job = read_run_config(args.config)
    if "training" not in job:
        sys.exit(f"{args.config}: no 'training' section; render the run with 'flux-cluster submit'")
    data_dir = None
    if not args.synthetic:
        data_dir = os.environ.get("FLUX_DATA_DIR") or system.paths.data_root
        if not data_dir:
            sys.exit(f"{args.config}: paths.data_root is not set: no dataset (or use --synthetic)")

    from flux_cluster.training.throughput import ThroughputJob, measure  # torch loads here

    return measure(
        ThroughputJob(
            system=system,
            plan=TrainingPlan.model_validate(job["training"]),
            run_dir=Path(os.environ.get("FLUX_RUN_DIR", args.config.parent)),
            data_dir=Path(data_dir) if data_dir else None,
            seed=int(os.environ.get("FLUX_SEED", job["seed_base"])),
            warmup_steps=args.warmup_steps,
            steps=args.steps,
            started=STARTED,
        )
    )


if __name__ == "__main__":
    exit_rank(main())
