"""The training job's entry point on every rank:
``python -m flux_cluster.jobs.train --config RUN/config.yaml``.

The config is the run directory's resolved config (written by ``flux-cluster submit``); the job script
sets the per-repeat environment (FLUX_EXP_INDEX, FLUX_SEED, FLUX_RESULT_LOG, FLUX_DATA_DIR). Run
directly, without those, it trains repeat 0 with the run's recorded seed. The loop is in
flux_cluster/training/loop.py.
"""

import argparse
import os
import signal
import sys
from pathlib import Path

from flux_cluster.config.workload import TrainingPlan
from flux_cluster.rundir import read_run_config, result_log
from flux_cluster.runtime.dist import exit_rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux_cluster.jobs.train", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the run directory's config.yaml")
    args = parser.parse_args(argv)

    system, job = read_run_config(args.config)
    if "training" not in job:
        sys.exit(f"{args.config}: no 'training' section; render the run with 'flux-cluster submit'")
    plan = TrainingPlan.model_validate(job["training"])
    env = os.environ
    run_dir = Path(env.get("FLUX_RUN_DIR", args.config.parent))
    exp_index = int(env.get("FLUX_EXP_INDEX", "0"))
    # the hf workload reads hf.data (a local dataset or 'synthetic'), not an Energon root
    data_dir = system.hf.data if plan.kind == "hf" else env.get("FLUX_DATA_DIR") or system.paths.data_root
    if not data_dir:
        sys.exit(f"{args.config}: paths.data_root is not set: no dataset to train on")

    from flux_cluster.training.context import JobContext

    if plan.kind == "hf":
        from flux_cluster.hf.train import train  # torch and transformers load here
    else:
        from flux_cluster.training.loop import train  # torch and diffusers load here

    context = JobContext(
        system=system,
        plan=plan,
        run_dir=run_dir,
        data_dir=Path(data_dir),
        exp_index=exp_index,
        seed=int(env.get("FLUX_SEED", job["seed_base"] + exp_index)),
        result_log=Path(env.get("FLUX_RESULT_LOG", result_log(run_dir, exp_index))),
        cache_cleared=env.get("FLUX_CACHE_CLEARED") == "1",
        config_filename=args.config.name,
    )
    code = train(context)
    # The run is over: a time-limit signal arriving now (during interpreter teardown, when Python's own
    # handlers are gone) must not kill the rank and turn a finished run into a failed step.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    exit_rank(main())
