"""Run a rendered job script on this machine (launcher 'local'): no Slurm, output tee'd to the run dir."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flux_cluster.rundir import RunRecord

LOCAL_LOG = "local.log"


def run_local(script_path: Path, run_dir: Path, echo: bool = True) -> int:
    log_path = run_dir / "slurm" / LOCAL_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        log_path.open("ab") as log,
        subprocess.Popen(
            ["bash", str(script_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=run_dir,
            start_new_session=True,  # its own group: 'flux-cluster cancel' stops torchrun and the ranks too
        ) as process,
    ):
        record = RunRecord(launcher="local", job_ids=[], submitted_at=time.time(), pid=process.pid)
        record.save(run_dir)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
            code = process.wait()
        except KeyboardInterrupt:
            stop_group(process.pid)
            code = process.wait()
    record.exit_code = code
    record.save(run_dir)
    return code


def stop_group(pid: int) -> None:
    """SIGTERM the run's whole process group (bash, torchrun, the ranks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
