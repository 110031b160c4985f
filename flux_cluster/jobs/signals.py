"""The job script's signal relay in each docker/podman container: ``FLUX_PID_DIR=DIR python -m
flux_cluster.jobs.signals relay`` sends SIGUSR1 to the ranks registered there
(flux_cluster/runtime/signals.py)."""

import os
import sys
from pathlib import Path

from flux_cluster.runtime.signals import PID_DIR_ENV, relay

if __name__ == "__main__":
    if sys.argv[1:] != ["relay"] or PID_DIR_ENV not in os.environ:
        sys.exit(f"usage: {PID_DIR_ENV}=DIR python -m flux_cluster.jobs.signals relay")
    print(f"signalled {relay(Path(os.environ[PID_DIR_ENV]))} rank(s)")
