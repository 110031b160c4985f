"""Run hf workload cases one after the other in one process group (tests/integration/test_hf_train.py starts
it with torchrun, 2 gloo ranks): each case is `RUN_DIR KEY=VALUE[,KEY=VALUE...]` (the --set values on the
local system), so several cases share one start-up of torch and transformers. `RUN_DIR@N` sends this
process a real SIGUSR1 (the time-limit warning) as step N is recorded. Prints each case's exit code (the
one the job would exit with)."""

import os
import signal
import sys
from pathlib import Path
from typing import Any

from flux_cluster.config import load_system
from flux_cluster.config.workload import resolve_training
from flux_cluster.hf.train import run
from flux_cluster.rundir import result_log
from flux_cluster.runtime.dist import init_distributed
from flux_cluster.training.context import JobContext
from flux_cluster.training.meter import Meter


def main(cases: list[str]) -> int:
    info = init_distributed("gloo")
    codes = []
    record = Meter.record
    for run_dir, sets in zip(cases[::2], cases[1::2], strict=True):
        run_dir, _, stop_at = run_dir.partition("@")

        def signalled(meter: Meter, step: int, *args: Any, at: str = stop_at, **kwargs: Any) -> None:
            record(meter, step, *args, **kwargs)
            if str(step) == at:
                os.kill(os.getpid(), signal.SIGUSR1)

        Meter.record = signalled  # type: ignore[method-assign]
        system = load_system("local", ["train.benchmark=hf", *sets.split(",")]).config
        plan = resolve_training(system)
        folder = Path(run_dir)
        ctx = JobContext(
            system, plan, folder, Path(str(system.hf.data)), 0, 7, result_log(folder, 0), False, "x"
        )
        codes.append(run(ctx, info))
    if info.rank == 0:
        print(f"exit codes: {codes}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
